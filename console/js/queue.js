// The caller's queue (`jobs/queue/`): active slots used of the limit, the caller's own limit of
// running jobs and the slots every user shares, and for each queued job its position and which
// of those limits holds it back. Re-read every few seconds while visible.

import * as api from "./api.js";
import { h, fill, notice, when, statusBadge, functionName, poll, freshness } from "./dom.js";

const REFRESH_MS = 3000;

export async function queueView(root, { scope }) {
  document.title = "Queue · Gantry";
  const summary = h("div", { class: "card queue-summary", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
  const list = h("div", { class: "table-wrap" });
  const health = freshness(list);
  fill(root, h("h1", {}, "Queue"), health.element, summary, list);

  const load = async () => {
    const queue = await api.get("jobs/queue/", { limit: 100 });
    if (!scope.alive) return;
    const used = queue.active_limit > 0 ? Math.min(100, Math.round((queue.active / queue.active_limit) * 100)) : 0;
    const slotLine = (label, slots) => (slots ? h("li", {}, `${label}: ${slots.used} of ${slots.limit} in use (every user's jobs)`) : null);
    fill(
      summary,
      h("p", { class: "big" }, h("strong", { id: "slots-used" }, `${queue.active} of ${queue.active_limit}`), " active slots used"),
      h("meter", { min: 0, max: queue.active_limit || 1, value: queue.active, "aria-label": "Active slots used" }, `${used}%`),
      h("p", {}, `${queue.queued} queued, ${queue.running} pending or running.`),
      h(
        "ul",
        { class: "limits", id: "queue-limits" },
        queue.running_limit !== null && queue.running_limit !== undefined
          ? h("li", { id: "running-limit" }, `Your jobs running at once: ${queue.running} of ${queue.running_limit}`, queue.running >= queue.running_limit ? " (your limit: more wait queued)" : "")
          : null,
        slotLine("CPU slots", queue.cpu_slots),
        slotLine("GPU slots", queue.gpu_slots),
      ),
    );
    if (!queue.jobs.length) {
      fill(list, h("p", { class: "muted" }, "None of your jobs is waiting or running."));
      return;
    }
    fill(
      list,
      h(
        "table",
        { class: "queue" },
        h("caption", { class: "visually-hidden" }, "My unfinished jobs, oldest first"),
        h("thead", {}, h("tr", {}, ["Job", "Function", "Status", "Created", "Position", "Waiting for"].map((n) => h("th", { scope: "col" }, n)))),
        h(
          "tbody",
          {},
          queue.jobs.map((job) => {
            const program = job.program || {};
            return h(
              "tr",
              { "data-job": job.id },
              h("td", {}, h("a", { href: `#/job/${encodeURIComponent(job.id)}`, class: "mono", title: job.id }, job.id.slice(0, 8))),
              h("td", {}, program.title ? functionName(program.title, program.provider) : h("span", { class: "muted" }, "(deleted)")),
              h("td", {}, statusBadge(job.status)),
              h("td", {}, when(job.created)),
              h("td", { class: "position" }, job.position ? `${job.position} (${job.ahead} ahead)` : "—"),
              h("td", { class: "waiting-for wrap", "data-waiting-for": job.waiting_for || "" }, waitingText(job, queue)),
            );
          }),
        ),
      ),
    );
  };
  // Read at once, then every few seconds; an error answer is shown with its status and
  // message and asked again a few times at most (a refusal: not at all), then Retry.
  let shown = false;
  const read = async () => {
    try {
      await load();
      shown = true;
    } catch (error) {
      if (scope.alive && !shown) fill(summary, notice("error", error.message));
      throw error;
    }
  };
  scope.add(poll(read, REFRESH_MS, health, { now: true }));
}

/** Why a queued job waits, in words. */
export function waitingText(job, queue) {
  switch (job.waiting_for) {
    case "running_limit":
      return `Your limit of ${queue.running_limit} jobs running at once`;
    case "cpu_slots":
      return queue.cpu_slots ? `A CPU slot (all ${queue.cpu_slots.limit} are in use)` : "A CPU slot";
    case "gpu_slots":
      return queue.gpu_slots ? `A GPU slot (all ${queue.gpu_slots.limit} are in use)` : "A GPU slot";
    case "next_admission":
      return "Nothing: it starts at the next admission";
    default:
      return job.status === "QUEUED" ? "—" : "Started";
  }
}
