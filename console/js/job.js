// One job: status and sub-status, the timeline of its events (followed live on
// `events/stream/`), its log followed live on `logs/stream/` (resumed after a dropped
// connection from the byte it stopped at), the result, stop, and the provider log for those
// who may read it.

import * as api from "./api.js";
import { h, fill, notice, when, route, statusBadge, functionName, pretty, poll, freshness, failure, answered, bounded, retryDelay, TERMINAL } from "./dom.js";
import { follow } from "./stream.js";
import { waitingText, backfillBadge } from "./queue.js";

const FALLBACK_POLL_MS = 3000;
const RETRY_MS = 3000;
const QUEUE_POLL_MS = 3000;
const USAGE_POLL_MS = 5000;
// What the gateway's stop answer says of runtime jobs, said of a job that reported none only
// because no runtime service came with the request (the console sends none).
const RUNTIME_NOTES = [
  "QiskitRuntimeService not found, cannot stop runtime jobs.",
  "QiskitRuntimeService could not be read (not a serialized service), cannot stop runtime jobs.",
  "No active runtime job ID associated with this serverless job ID.",
];

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const backToJobs = () => h("p", {}, h("a", { href: "#/jobs", class: "button quiet" }, "Back to the jobs"));
// The page read again from the start (the router renders the route shown again).
const reopen = () => window.dispatchEvent(new HashChangeEvent("hashchange"));

/** `1` → `1st`, `22` → `22nd`. */
function ordinal(n) {
  const tens = n % 100;
  const suffix = tens >= 11 && tens <= 13 ? "th" : { 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th";
  return `${n}${suffix}`;
}

/** The stop answer without its runtime notes (for a job that reported no runtime job). */
export function withoutRuntimeNotes(message) {
  let text = message;
  for (const note of RUNTIME_NOTES) text = text.replace(note, "");
  return text.replace(/\s{2,}/g, " ").trim();
}

export async function jobView(root, { args, scope }) {
  const id = args[0] || "";
  document.title = `Job ${id.slice(0, 8)} · Gantry`;
  const health = freshness();
  fill(root, h("h1", {}, "Job ", h("span", { class: "mono" }, id)), health.element, h("p", { class: "muted" }, "Loading…"));
  // The first read: a job that does not exist (or is not the caller's) says so with a way back;
  // a gateway that cannot be reached is asked again until it answers; an error answer is
  // shown with its status and asked again a few times at most, then offers Retry.
  let job;
  let failures = 0;
  for (;;) {
    try {
      job = await api.get(`jobs/${encodeURIComponent(id)}/`, { with_result: "false" });
      break;
    } catch (error) {
      if (!scope.alive) return;
      if (error.status >= 400 && error.status < 500 && error.status !== 408 && error.status !== 429) {
        fill(root, h("h1", {}, "Job ", h("span", { class: "mono" }, id)), notice("error", error.message), backToJobs());
        return;
      }
      failures += 1;
      const delay = retryDelay(error, failures, RETRY_MS);
      if (delay === null) health.gaveUp(error, reopen);
      else health.failed(error, delay, bounded(error) ? failures : null);
      fill(root, h("h1", {}, "Job ", h("span", { class: "mono" }, id)), health.element, notice("error", error.message));
      if (delay === null) return;
      await sleep(delay);
      if (!scope.alive) return;
    }
  }
  if (!scope.alive) return;
  health.ok();
  const path = `jobs/${encodeURIComponent(id)}/`;
  const program = job.program || {};

  // The arguments it ran with: its author's to read (others are answered 404 and see none).
  const argumentsTerm = h("dt", { hidden: true }, "Arguments");
  const argumentsBox = h("dd", { hidden: true });
  api
    .get(`jobs/${encodeURIComponent(id)}/arguments/`)
    .then((answer) => {
      if (!scope.alive || !answer) return;
      fill(argumentsBox, h("pre", { class: "code arguments", id: "job-arguments", tabindex: "0", "aria-label": "Arguments" }, pretty(answer.arguments)));
      argumentsTerm.hidden = false;
      argumentsBox.hidden = false;
    })
    .catch(() => {});
  // Its trace in the tracing UI the gateway names (`--trace-link`), when it has one.
  const traceTerm = h("dt", { hidden: true }, "Trace");
  const traceBox = h("dd", { hidden: true });
  api
    .get(`${path}trace/`)
    .then((answer) => {
      if (!scope.alive || !answer || !answer.link) return;
      fill(traceBox, h("a", { href: answer.link, id: "trace-link", target: "_blank", rel: "noopener noreferrer" }, answer.trace_id));
      traceTerm.hidden = false;
      traceBox.hidden = false;
    })
    .catch(() => {});
  const statusBox = h("span", { id: "job-status", "aria-live": "polite" });
  const reasonBox = h("div", { id: "job-reason", "aria-live": "polite" });
  const updated = h("dd", {});
  // Where the job's time went, from its status moves: queued until RUNNING, then running.
  const timingBox = h("dd", { id: "job-timing" }, "—");
  // A queued job's place in the queue and what holds it back (`jobs/queue/`), while it waits.
  const queueTerm = h("dt", { hidden: true }, "Queue");
  const queueBox = h("dd", { id: "job-queue", hidden: true, "aria-live": "polite" });
  // The tenant it counts against and whether it runs as backfill (docs/scheduling.md): the
  // queue lists them for the caller's jobs that have not ended.
  const tenantTerm = h("dt", { hidden: true }, "Tenant");
  const tenantBox = h("dd", { id: "job-tenant", hidden: true });
  const backfillTerm = h("dt", { hidden: true }, "Backfill");
  const backfillBox = h("dd", { id: "job-backfill", hidden: true });
  const times = { created: job.created, started: null, finished: null };
  const showTiming = () => fill(timingBox, timing(times));
  const stopButton = h("button", { type: "button", class: "danger", id: "stop-button" }, "Stop");
  const confirmStop = h("button", { type: "button", class: "danger", id: "confirm-stop" }, "Yes, stop the job");
  const keepRunning = h("button", { type: "button", class: "quiet" }, "No, let it run");
  const stopConfirm = h("div", { class: "confirm", id: "stop-confirm", role: "group", "aria-label": "Stop the job?", hidden: true }, h("p", {}, "Stop this job? What it has not saved is lost."), confirmStop, keepRunning);
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
  // Its own usage (`usage/`): what it waited, ran and was given, and its allocation over the
  // run; read again every few seconds until it has ended (then once more: the final record).
  const usageNote = h("span", { class: "stream-state", id: "job-usage-state" });
  const usageBox = h("div", { id: "job-usage-facts" }, h("p", { class: "muted" }, "Loading…"));
  const usageSection = h(
    "section",
    { class: "card", id: "job-usage", "aria-labelledby": "job-usage-heading" },
    h("h2", { id: "job-usage-heading" }, "Usage ", usageNote),
    usageBox,
    h("p", { class: "muted hint" }, "CPU-hours are the cores its runner gave it × its run time. ", h("a", { href: "#/usage" }, "All your usage")),
  );
  const providerLog = h("pre", { class: "log", id: "provider-log", tabindex: "0", "aria-label": "Provider log" });
  providerSection.append(providerLog);

  fill(
    root,
    h("div", { class: "title-row" }, h("h1", {}, "Job ", h("span", { class: "mono" }, id)), statusBox),
    health.element,
    reasonBox,
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
        h("dt", {}, "Time"),
        timingBox,
        queueTerm,
        queueBox,
        tenantTerm,
        tenantBox,
        backfillTerm,
        backfillBox,
        traceTerm,
        traceBox,
        job.function_size ? [h("dt", {}, "Size"), h("dd", {}, job.function_size)] : null,
        job.gpu ? [h("dt", {}, "GPU"), h("dd", {}, "yes")] : null,
        argumentsTerm,
        argumentsBox,
      ),
      h("div", { class: "actions" }, stopButton),
      stopConfirm,
      stopAnswer,
    ),
    h("div", { class: "columns" }, h("section", { class: "card" }, h("h2", {}, "Events"), timelineNote, timeline), h("section", { class: "card" }, h("h2", {}, "Result"), resultBox)),
    h("section", { class: "card" }, h("h2", {}, "Log ", logState), logBox),
    usageSection,
    providerSection,
  );

  let current = { status: job.status, sub_status: job.sub_status, reason: job.status_reason };
  // Why it ended as the job's record last said (a terminal move's event may not repeat it).
  let recordReason = job.status_reason;
  let resultShown = false;
  let stopping = false; // a stop was confirmed and the job has not ended since
  let stopMessage = null; // the gateway's answer to it, as sent
  const stopNote = () => {
    const said = stopMessage ? `${stopMessage} ` : "";
    if (!TERMINAL.has(current.status)) {
      fill(stopAnswer, notice("info", `${said}Stopping…`));
    } else {
      const how = current.status === "STOPPED" ? "The job has stopped." : `The job ended ${current.status} before it could be stopped.`;
      fill(stopAnswer, notice("ok", `${said}${how}`));
    }
  };
  // While the job is queued, its place is read every few seconds; it goes when the job moves on.
  let stopQueueWatch = null;
  let placeAsked = false; // its tenant and backfill mark were asked for (or shown)
  const showPlaceFacts = (place) => {
    placeAsked = true;
    if (place.tenant) {
      fill(tenantBox, place.tenant);
      tenantTerm.hidden = false;
      tenantBox.hidden = false;
    }
    if (place.backfill) {
      fill(backfillBox, backfillBadge(), " It runs as backfill: only on slots no tenant needs now (lent out, or guaranteed to no one), and it is stopped if a tenant takes its guarantee back.");
      backfillTerm.hidden = false;
      backfillBox.hidden = false;
    }
  };
  const watchQueue = (queued) => {
    if (queued && !stopQueueWatch) {
      stopQueueWatch = poll(readPlace, QUEUE_POLL_MS, null, { now: true });
      scope.add(() => stopQueueWatch && stopQueueWatch());
    } else if (!queued && stopQueueWatch) {
      stopQueueWatch();
      stopQueueWatch = null;
      queueTerm.hidden = true;
      queueBox.hidden = true;
    }
    // Pending or running (the page opened after it left the queue): its tenant and backfill
    // mark, read once.
    if (!queued && !placeAsked && !TERMINAL.has(job.status) && !TERMINAL.has(current.status)) {
      placeAsked = true;
      api
        .get("jobs/queue/")
        .then((queue) => {
          const place = scope.alive && (queue.jobs || []).find((item) => item.id === id);
          if (place) showPlaceFacts(place);
        })
        .catch(() => {});
    }
  };
  const readPlace = async () => {
    const queue = await api.get("jobs/queue/");
    if (!scope.alive) return;
    const place = (queue.jobs || []).find((item) => item.id === id);
    if (place) showPlaceFacts(place);
    if (!stopQueueWatch) return;
    // Not the caller's job (a provider's admin reads it), or it has just left the queue.
    if (!place || place.status !== "QUEUED") {
      queueTerm.hidden = true;
      queueBox.hidden = true;
      return;
    }
    const why =
      place.waiting_for === "next_admission"
        ? "Nothing holds it back: it starts at the next admission."
        : place.waiting_for
          ? `Held back by: ${waitingText(place, queue)}.`
          : null;
    fill(
      queueBox,
      h("p", { class: "queue-place" }, h("strong", { class: "position" }, place.position ? `${ordinal(place.position)} in the queue` : "In the queue"), place.position ? ` (${place.ahead} queued ${place.ahead === 1 ? "job" : "jobs"} of any user ahead of it).` : "."),
      why ? h("p", { class: "queue-place waiting-for", "data-waiting-for": place.waiting_for }, why) : null,
      h("p", { class: "queue-place" }, h("a", { href: "#/queue", id: "job-queue-link" }, "See the whole queue")),
    );
    queueTerm.hidden = false;
    queueBox.hidden = false;
  };
  let usageEnded = false;
  let usageFinal = false; // the job has ended: its usage is read to its final record, then no more
  let stopUsage = () => {};
  const readUsage = async () => {
    if (usageEnded) return;
    let usage;
    try {
      usage = await api.get(`${path}usage/`);
    } catch (error) {
      if (!scope.alive) return;
      // A job that ended before the usage ledger was kept has no record.
      const text = error.status === 404 && TERMINAL.has(current.status) ? "No usage was recorded for this job (it ended before usage was kept)." : `${failure(error)}.`;
      fill(usageBox, notice(error.status === 404 ? "info" : "error", text));
      throw error;
    }
    if (!scope.alive) return;
    usageEnded = Boolean(usage.ended);
    fill(usageNote, usage.ended ? "final" : "so far");
    usageNote.dataset.state = usage.ended ? "ended" : "live";
    fill(usageBox, jobUsageFacts(usage));
  };
  const finalUsage = async () => {
    // The record is written with the job's last move, so one read finds it; a few more if not.
    for (let attempt = 0; attempt < 4 && scope.alive && !usageEnded; attempt += 1) {
      if (attempt) await sleep(RETRY_MS);
      try {
        await readUsage();
      } catch (error) {
        if (!bounded(error) && answered(error)) return;
      }
    }
  };
  const showStatus = () => {
    fill(statusBox, statusBadge(current.status, current.sub_status));
    const finished = TERMINAL.has(current.status);
    // Once it has ended, its usage is read to the final record and no more.
    if (finished && !usageFinal) {
      usageFinal = true;
      stopUsage();
      finalUsage();
    }
    watchQueue(current.status === "QUEUED");
    // An ended job's page is final: it says so instead of "Live".
    if (finished) health.ended(current.status, times.finished || lastUpdate);
    // A finished job has nothing to stop; a job being stopped is not offered Stop again.
    stopButton.hidden = finished || stopping;
    if (finished) stopConfirm.hidden = true;
    if (finished && stopping) {
      stopping = false;
      stopNote();
    }
    // Why it ended, at the top of the page (absent for a success).
    fill(reasonBox, finished && current.reason ? notice(current.status === "FAILED" ? "error" : "info", `${current.status}: ${current.reason}`) : null);
    if (finished && !resultShown) {
      resultShown = true;
      showResult();
    }
  };
  const refresh = async () => {
    const fresh = await api.get(path, { with_result: "false" });
    health.ok();
    current = { status: fresh.status, sub_status: fresh.sub_status, reason: fresh.status_reason };
    recordReason = fresh.status_reason;
    lastUpdate = fresh.updated;
    fill(updated, when(fresh.updated));
    if (scope.alive) showStatus();
    return TERMINAL.has(fresh.status);
  };
  fill(updated, when(job.updated));
  let lastUpdate = job.updated;
  if (!TERMINAL.has(job.status)) {
    stopUsage = poll(readUsage, USAGE_POLL_MS, null, { now: true });
    scope.add(() => stopUsage());
  }
  showStatus();

  async function showResult() {
    fill(resultBox, h("p", { class: "muted" }, "Loading the result…"));
    let answer;
    // Asked again while the gateway cannot be reached, so an outage's error never stays; an
    // error answer a few times at most, then a Retry button.
    let failures = 0;
    for (;;) {
      try {
        answer = await api.get(`${path}result/`);
        break;
      } catch (error) {
        if (!scope.alive) return;
        failures += 1;
        const delay = retryDelay(error, failures, RETRY_MS);
        if (delay === null) {
          const again = h("button", { type: "button", class: "quiet" }, "Retry");
          again.addEventListener("click", () => showResult());
          fill(resultBox, notice("error", `${failure(error)}.`), again);
          return;
        }
        fill(resultBox, notice("error", `${failure(error)}. Asking again in ${Math.round(delay / 1000)} s…`));
        await sleep(delay);
        if (!scope.alive) return;
      }
    }
    if (!scope.alive) return;
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

  // Stop asks first; once asked, the note follows the job until it has ended.
  stopButton.addEventListener("click", () => {
    stopConfirm.hidden = false;
    stopButton.hidden = true;
    confirmStop.focus();
  });
  keepRunning.addEventListener("click", () => {
    stopConfirm.hidden = true;
    showStatus();
    stopButton.focus();
  });
  confirmStop.addEventListener("click", async () => {
    stopConfirm.hidden = true;
    stopping = true;
    stopMessage = null;
    showStatus();
    fill(stopAnswer, notice("info", "Asking the gateway to stop the job…"));
    try {
      const answer = await api.call("POST", `${path}stop/`, { body: {} });
      // The gateway's answer, then what became of the job. Its notes on runtime jobs are left
      // out for a job that reported none (they are about the runtime service the console does
      // not send); the API's message itself is as the reference words it.
      let said = answer && answer.message !== undefined ? String(answer.message) : JSON.stringify(answer);
      if (RUNTIME_NOTES.some((note) => said.includes(note))) {
        const reported = await api.get(`${path}runtime_jobs/`).catch(() => null);
        if (reported && Array.isArray(reported.runtime_jobs) && !reported.runtime_jobs.length) {
          said = withoutRuntimeNotes(said);
        }
      }
      if (!scope.alive) return;
      stopMessage = said;
      stopNote();
    } catch (error) {
      stopping = false;
      fill(stopAnswer, notice("error", error.message));
      showStatus();
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
        // Heard from the gateway: the line says so as each event arrives.
        health.ok();
        const data = event.data || {};
        // A status move's data names the new status (`status`; `new_status` in published events).
        const moved = event.event_type === "STATUS_CHANGE" ? data.status ?? data.new_status : null;
        timeline.append(eventItem(event, moved ? data.old_status ?? lastMove : null, moved));
        if (moved) {
          lastMove = moved;
          if (moved === "RUNNING" && !times.started) times.started = event.created;
          if (TERMINAL.has(moved)) times.finished = event.created;
          showTiming();
          // Only an end's reason is the job's: the reason of another move (an admission's, a
          // retry's) is the move's, shown in the timeline.
          const ended = TERMINAL.has(moved);
          current = { status: moved, sub_status: ended ? null : current.sub_status, reason: ended ? (data.reason ?? data.status_reason ?? recordReason) : null };
          showStatus();
          // The answer carries the reason as the job keeps it.
          if (TERMINAL.has(moved)) refresh().catch(() => {});
        } else if (event.event_type === "SUB_STATUS_CHANGE" && data.sub_status !== undefined) {
          current = { ...current, sub_status: data.sub_status };
          showStatus();
        }
        lastUpdate = event.created;
        fill(updated, when(event.created));
      },
      finished: refresh,
      onState: (state, error) => {
        if (state === "live") health.ok();
        if (state === "reconnecting") health.failed(error, null);
        if (state === "ended" && !eventCount) fill(timelineNote, "No events.");
        if (state === "failed") {
          // Events are the author's; others (a provider's admins) see the status polled instead.
          fill(timelineNote, error.message);
          timelineNote.hidden = false;
          if (!TERMINAL.has(current.status)) {
            const stop = poll(async () => {
              if (await refresh()) stop();
            }, FALLBACK_POLL_MS, health);
            scope.add(stop);
          }
        }
      },
    }),
  );

  followLog(scope, `${path}logs/stream/`, logBox, logState, refresh, (error) => {
    fill(logBox, error.message);
    // An error answer the gateway kept giving (not a refusal): said, with a way to ask again.
    if (error.status >= 500) health.gaveUp(error, reopen);
  }, () => {}, () => health.ok());
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
function followLog(scope, path, box, stateLabel, finished, onRefused, onLive = () => {}, onLines = () => {}) {
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
      onLines();
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

/** Hours as people read them: `12.5`, `0.25`, `0.00056` (two significant digits when small). */
export function hours(value) {
  if (!value) return "0";
  if (value < 0.0001) return "< 0.0001";
  if (value >= 10) return String(Number(value.toFixed(1)));
  if (value >= 0.1) return String(Number(value.toFixed(2)));
  return String(Number(value.toPrecision(2)));
}

/** A duration in seconds as people read it: `4.2 s`, `3 min 12 s`, `2 h 5 min`. */
export function duration(seconds) {
  if (!(seconds >= 0)) return "?";
  if (seconds < 60) return `${seconds < 10 ? seconds.toFixed(1) : Math.round(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.round(seconds - minutes * 60)} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/** The job's time from created to started to finished (timestamps as the API writes them). */
export function timing({ created, started, finished }) {
  const at = (text) => Date.parse(text) / 1000;
  if (!started) return finished ? `ended after ${duration(at(finished) - at(created))} without running` : "not started yet";
  const waited = `waited ${duration(at(started) - at(created))}`;
  return finished ? `${waited}, ran ${duration(at(finished) - at(started))}` : `${waited}, running`;
}

/** One timeline entry; a status move shows where it came from (`from`) and went (`to`). */
function eventItem(event, from, to) {
  const data = event.data || {};
  const parts = [];
  const type = event.event_type;
  if (type === "STATUS_CHANGE") {
    parts.push(h("strong", {}, from ? `${from} → ${to}` : String(to ?? "status")));
    // Why it moved, where the move says (an admission within a tenant's guarantee, a retry, an end).
    if (data.reason) parts.push(h("p", { class: "event-reason" }, data.reason));
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

/** A job's own usage (`jobs/{id}/usage/`) as the facts the job's page shows. */
export function jobUsageFacts(usage) {
  const soFar = usage.ended ? "" : " so far";
  const given = [];
  if (usage.cpu_cores !== null && usage.cpu_cores !== undefined) given.push(`${usage.cpu_cores} ${usage.cpu_cores === 1 ? "core" : "cores"}`);
  if (usage.memory_gib !== null && usage.memory_gib !== undefined) given.push(`${hours(usage.memory_gib)} GiB memory`);
  if (usage.gpus) given.push(`${usage.gpus} GPU${usage.gpus === 1 ? "" : "s"}${usage.gpu_model ? ` (${usage.gpu_model})` : ""}`);
  const fact = (label, key, value, hint) => [h("dt", {}, label), h("dd", { "data-usage": key, title: hint || null }, value)];
  return h(
    "dl",
    { class: "facts" },
    fact("Waited", "wait", duration(usage.wait_seconds) + (usage.run_seconds || usage.ended ? "" : soFar), `${usage.wait_seconds} s`),
    fact("Ran", "run", duration(usage.run_seconds) + (usage.run_seconds ? soFar : usage.ended ? " (never ran)" : " (not started)"), `${usage.run_seconds} s`),
    fact("Given", "given", given.length ? given.join(", ") : "— (not started)", usage.profile ? `compute profile ${usage.profile}` : null),
    usage.profile ? fact("Profile", "profile", usage.profile) : null,
    fact("CPU-hours", "cpu-hours", hours(usage.cpu_core_seconds / 3600) + soFar, `${usage.cpu_core_seconds} core-seconds`),
    fact("Memory GiB-hours", "gib-hours", hours(usage.gib_seconds / 3600) + soFar, `${usage.gib_seconds} GiB-seconds`),
    usage.gpus || usage.gpu_seconds ? fact("GPU-hours", "gpu-hours", hours(usage.gpu_seconds / 3600) + soFar, `${usage.gpu_seconds} GPU-seconds`) : null,
    usage.attempts > 1 ? fact("Attempts", "attempts", String(usage.attempts)) : null,
  );
}
