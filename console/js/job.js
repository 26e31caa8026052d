// One job: status and sub-status, the timeline of its events (followed live on
// `events/stream/`), its log followed live on `logs/stream/` (resumed after a dropped
// connection from the byte it stopped at), the result, stop, and the provider log for those
// who may read it.

import * as api from "./api.js";
import { h, fill, notice, when, route, statusBadge, functionName, pretty, poll, TERMINAL } from "./dom.js";
import { follow } from "./stream.js";

const FALLBACK_POLL_MS = 3000;

export async function jobView(root, { args, scope }) {
  const id = args[0] || "";
  document.title = `Job ${id.slice(0, 8)} · Gantry`;
  fill(root, h("h1", {}, "Job ", h("span", { class: "mono" }, id)), h("p", { class: "muted" }, "Loading…"));
  let job;
  try {
    job = await api.get(`jobs/${encodeURIComponent(id)}/`, { with_result: "false" });
  } catch (error) {
    fill(root, h("h1", {}, "Job ", h("span", { class: "mono" }, id)), notice("error", error.message));
    return;
  }
  if (!scope.alive) return;
  const path = `jobs/${encodeURIComponent(id)}/`;
  const program = job.program || {};

  const statusBox = h("span", { id: "job-status", "aria-live": "polite" });
  const updated = h("dd", {});
  const stopButton = h("button", { type: "button", class: "danger" }, "Stop");
  const stopAnswer = h("div", { id: "stop-answer", "aria-live": "polite" });
  const timeline = h("ol", { class: "timeline", id: "events" });
  const timelineNote = h("p", { class: "muted" }, "Loading events…");
  const logBox = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "Job log" });
  const logState = h("span", { class: "stream-state", id: "log-state" }, "connecting…");
  const resultBox = h("div", { id: "result" }, h("p", { class: "muted" }, "The result shows here when the job has finished."));
  const providerSection = h(
    "section",
    { class: "card", id: "provider-log-section", hidden: true },
    h("h2", {}, "Provider log ", h("span", { class: "stream-state", id: "provider-log-state" })),
  );
  const providerLog = h("pre", { class: "log", id: "provider-log", tabindex: "0", "aria-label": "Provider log" });
  providerSection.append(providerLog);

  fill(
    root,
    h("div", { class: "title-row" }, h("h1", {}, "Job ", h("span", { class: "mono" }, id)), statusBox),
    h(
      "section",
      { class: "card" },
      h(
        "dl",
        { class: "facts" },
        h("dt", {}, "Function"),
        h(
          "dd",
          {},
          program.title
            ? h("a", { href: route("function", { title: program.title, provider: program.provider }) }, functionName(program.title, program.provider))
            : "(deleted function)",
        ),
        h("dt", {}, "Created"),
        h("dd", {}, when(job.created)),
        h("dt", {}, "Updated"),
        updated,
        job.function_size ? [h("dt", {}, "Size"), h("dd", {}, job.function_size)] : null,
        job.gpu ? [h("dt", {}, "GPU"), h("dd", {}, "yes")] : null,
      ),
      h("div", { class: "actions" }, stopButton),
      stopAnswer,
    ),
    h("div", { class: "columns" }, h("section", { class: "card" }, h("h2", {}, "Events"), timelineNote, timeline), h("section", { class: "card" }, h("h2", {}, "Result"), resultBox)),
    h("section", { class: "card" }, h("h2", {}, "Log ", logState), logBox),
    providerSection,
  );

  let current = { status: job.status, sub_status: job.sub_status };
  let resultShown = false;
  const showStatus = () => {
    fill(statusBox, statusBadge(current.status, current.sub_status));
    stopButton.disabled = TERMINAL.has(current.status);
    if (TERMINAL.has(current.status) && !resultShown) {
      resultShown = true;
      showResult();
    }
  };
  const refresh = async () => {
    const fresh = await api.get(path, { with_result: "false" });
    current = { status: fresh.status, sub_status: fresh.sub_status };
    fill(updated, when(fresh.updated));
    if (scope.alive) showStatus();
    return TERMINAL.has(fresh.status);
  };
  fill(updated, when(job.updated));
  showStatus();

  async function showResult() {
    fill(resultBox, h("p", { class: "muted" }, "Loading the result…"));
    let answer;
    try {
      answer = await api.get(`${path}result/`);
    } catch (error) {
      fill(resultBox, notice("error", error.message));
      return;
    }
    if (!answer || answer.result === null || answer.result === undefined) {
      fill(resultBox, h("p", { class: "muted" }, "This job saved no result."));
      return;
    }
    const text = pretty(answer.result);
    const download = h("button", { type: "button", class: "quiet" }, "Download result");
    download.addEventListener("click", () => {
      api.saveBlob(new Blob([answer.result], { type: "application/json" }), `job-${id}-result.json`);
    });
    fill(resultBox, h("pre", { class: "code result", tabindex: "0", "aria-label": "Result" }, text), download);
  }

  stopButton.addEventListener("click", async () => {
    stopButton.disabled = true;
    fill(stopAnswer, notice("info", "Asking the gateway to stop the job…"));
    try {
      const answer = await api.call("POST", `${path}stop/`, { body: {} });
      // The gateway's answer, as sent.
      fill(stopAnswer, notice("ok", answer && answer.message !== undefined ? answer.message : JSON.stringify(answer)));
    } catch (error) {
      fill(stopAnswer, notice("error", error.message));
    } finally {
      stopButton.disabled = TERMINAL.has(current.status);
    }
  });

  // Events: the whole timeline from the first event, then each new one as it is recorded.
  let eventCount = 0;
  let lastMove = null;
  scope.add(
    follow(`${path}events/stream/`, {
      kind: "sse",
      onEvent: (message) => {
        let event;
        try {
          event = JSON.parse(message.data);
        } catch {
          return;
        }
        eventCount += 1;
        timelineNote.hidden = true;
        const data = event.data || {};
        // A status move's data names the new status (`status`; `new_status` in published events).
        const moved = event.event_type === "STATUS_CHANGE" ? data.status ?? data.new_status : null;
        timeline.append(eventItem(event, moved ? data.old_status ?? lastMove : null, moved));
        if (moved) {
          lastMove = moved;
          current = { status: moved, sub_status: TERMINAL.has(moved) ? null : current.sub_status };
          showStatus();
        } else if (event.event_type === "SUB_STATUS_CHANGE" && data.sub_status !== undefined) {
          current = { ...current, sub_status: data.sub_status };
          showStatus();
        }
        fill(updated, when(event.created));
      },
      finished: refresh,
      onState: (state, error) => {
        if (state === "ended" && !eventCount) fill(timelineNote, "No events.");
        if (state === "failed") {
          // Events are the author's; others (a provider's admins) see the status polled instead.
          fill(timelineNote, error.message);
          timelineNote.hidden = false;
          if (!TERMINAL.has(current.status)) {
            const stop = poll(async () => {
              if (await refresh()) stop();
            }, FALLBACK_POLL_MS);
            scope.add(stop);
          }
        }
      },
    }),
  );

  followLog(scope, `${path}logs/stream/`, logBox, logState, refresh, (error) => {
    fill(logBox, error.message);
  });
  if (program.provider) {
    const providerState = providerSection.querySelector(".stream-state");
    followLog(scope, `${path}provider-logs/stream/`, providerLog, providerState, refresh, () => {
      // Not one of the provider's admins: no provider log section.
      providerSection.remove();
    }, () => {
      providerSection.hidden = false;
    });
  }
}

/** Follows a log into `box`, keeping it scrolled to the end while the reader is there. */
function followLog(scope, path, box, stateLabel, finished, onRefused, onLive = () => {}) {
  let received = 0;
  const empty = h("span", { class: "muted" }, "(nothing logged yet)");
  box.append(empty);
  const stop = follow(path, {
    kind: "text",
    finished,
    onText: (text) => {
      const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 24;
      if (!received) empty.remove();
      received += text.length;
      box.append(text);
      if (atEnd) box.scrollTop = box.scrollHeight;
    },
    onState: (state, error) => {
      const labels = { live: "following live", reconnecting: "connection lost, reconnecting…", ended: "complete", failed: "" };
      stateLabel.textContent = labels[state] ?? state;
      stateLabel.dataset.state = state;
      if (state === "live") onLive();
      if (state === "ended" && !received) empty.textContent = "(empty log)";
      if (state === "failed") onRefused(error);
    },
  });
  scope.add(stop);
}

/** One timeline entry; a status move shows where it came from (`from`) and went (`to`). */
function eventItem(event, from, to) {
  const data = event.data || {};
  const parts = [];
  const type = event.event_type;
  if (type === "STATUS_CHANGE") {
    parts.push(h("strong", {}, from ? `${from} → ${to}` : String(to ?? "status")));
  } else if (type === "SUB_STATUS_CHANGE") {
    parts.push(h("strong", {}, `Sub-status ${data.sub_status ?? "cleared"}`));
  } else if (type === "ERROR") {
    parts.push(
      h("strong", {}, "Error", data.code ? [" ", h("code", { class: "error-code" }, data.code)] : null),
      h(
        "dl",
        { class: "error-facts" },
        h("dt", {}, "Message"),
        h("dd", {}, h("pre", { class: "wrap error-message" }, data.message ?? "")),
        h("dt", {}, "Exception"),
        h("dd", {}, h("code", { class: "error-exception" }, data.exception ?? "")),
        data.args !== undefined && data.args !== null ? [h("dt", {}, "Arguments"), h("dd", {}, h("code", {}, JSON.stringify(data.args)))] : null,
      ),
    );
  } else if (type === "LOG_LOST") {
    parts.push(h("strong", {}, "Log lost"), " ", data.message ?? "");
  } else {
    parts.push(h("strong", {}, type), " ", JSON.stringify(data));
  }
  const origin = [event.origin, event.context].filter(Boolean).join(" · ");
  return h(
    "li",
    { class: `event event-${String(type).toLowerCase()}`, "data-type": type },
    h("div", { class: "event-head" }, parts.slice(0, 1), h("span", { class: "muted" }, " ", when(event.created), origin ? ` · ${origin}` : "")),
    parts.slice(1),
  );
}
