// The caller's queue (`jobs/queue/`): active slots used of the limit, and for each queued job
// how many queued jobs (of anyone) are ahead of it. Re-read every few seconds while visible.

import * as api from "./api.js";
import { h, fill, notice, when, statusBadge, poll } from "./dom.js";

const REFRESH_MS = 3000;

export async function queueView(root, { scope }) {
  document.title = "Queue · Gantry";
  const summary = h("div", { class: "card queue-summary", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
  const list = h("div", { class: "table-wrap" });
  fill(root, h("h1", {}, "Queue"), summary, list);

  const load = async () => {
    const queue = await api.get("jobs/queue/", { limit: 100 });
    if (!scope.alive) return;
    const used = queue.active_limit > 0 ? Math.min(100, Math.round((queue.active / queue.active_limit) * 100)) : 0;
    fill(
      summary,
      h("p", { class: "big" }, h("strong", { id: "slots-used" }, `${queue.active} of ${queue.active_limit}`), " active slots used"),
      h("meter", { min: 0, max: queue.active_limit || 1, value: queue.active, "aria-label": "Active slots used" }, `${used}%`),
      h("p", {}, `${queue.queued} queued, ${queue.running} pending or running.`),
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
        h("thead", {}, h("tr", {}, ["Job", "Status", "Created", "Queued jobs ahead"].map((n) => h("th", { scope: "col" }, n)))),
        h(
          "tbody",
          {},
          queue.jobs.map((job) =>
            h(
              "tr",
              { "data-job": job.id },
              h("td", {}, h("a", { href: `#/job/${encodeURIComponent(job.id)}`, class: "mono", title: job.id }, job.id.slice(0, 8))),
              h("td", {}, statusBadge(job.status)),
              h("td", {}, when(job.created)),
              h("td", {}, job.ahead === null || job.ahead === undefined ? "—" : String(job.ahead)),
            ),
          ),
        ),
      ),
    );
  };
  try {
    await load();
  } catch (error) {
    fill(summary, notice("error", error.message));
    return;
  }
  scope.add(poll(load, REFRESH_MS));
}
