// The caller's queue (`jobs/queue/`): active slots used of the limit, the caller's own limit of
// running jobs and the slots every user shares, for each queued job its position, its tenant,
// whether it runs as backfill and which of those limits holds it back, and the tenants the
// caller's jobs count against with their guarantees, use, borrowing and lending
// (docs/scheduling.md). Re-read every few seconds while visible.

import * as api from "./api.js";
import { h, fill, notice, when, statusBadge, functionName, poll, freshness } from "./dom.js";

const REFRESH_MS = 3000;

export async function queueView(root, { scope }) {
  document.title = "Queue · Gantry";
  const summary = h("div", { class: "card queue-summary", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
  const list = h("div", { class: "table-wrap" });
  const tenantsBox = h("section", { class: "card tenants", id: "queue-tenants", "aria-labelledby": "tenants-heading", hidden: true });
  // The jobs and the tenants are dimmed together while what they show may be stale.
  const body = h("div", { class: "queue-body" }, list, tenantsBox);
  const health = freshness(body);
  fill(root, h("h1", {}, "Queue"), health.element, summary, body);

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
    const tenants = queue.tenants || [];
    tenantsBox.hidden = !tenants.length;
    fill(tenantsBox, tenants.length ? tenantsSection(tenants) : null);
    if (!queue.jobs.length) {
      fill(list, h("p", { class: "muted" }, "None of your jobs is waiting or running."));
      return;
    }
    // A tenant column where a tenant is declared for any of them.
    const withTenants = tenants.length > 0 || queue.jobs.some((job) => job.tenant);
    const columns = ["Job", "Function", withTenants ? "Tenant" : null, "Status", "Created", "Position", "Waiting for"].filter(Boolean);
    fill(
      list,
      h(
        "table",
        { class: withTenants ? "queue with-tenants" : "queue" },
        h("caption", { class: "visually-hidden" }, "My unfinished jobs, oldest first"),
        h("thead", {}, h("tr", {}, columns.map((n) => h("th", { scope: "col" }, n)))),
        h(
          "tbody",
          {},
          queue.jobs.map((job) => {
            const program = job.program || {};
            return h(
              "tr",
              { "data-job": job.id, "data-backfill": job.backfill ? "true" : null },
              h("td", { "data-label": "Job" }, h("a", { href: `#/job/${encodeURIComponent(job.id)}`, class: "mono", title: job.id }, job.id.slice(0, 8))),
              h("td", { "data-label": "Function" }, program.title ? functionName(program.title, program.provider) : h("span", { class: "muted" }, "(deleted)")),
              withTenants ? h("td", { class: "tenant", "data-label": "Tenant" }, job.tenant || h("span", { class: "muted", title: "It counts against no tenant" }, "none")) : null,
              h("td", { class: "status", "data-label": "Status" }, statusBadge(job.status), job.backfill ? [" ", backfillBadge()] : null),
              h("td", { class: "created", "data-label": "Created" }, when(job.created)),
              h("td", { class: "position", "data-label": "Position" }, job.position ? `${job.position} (${job.ahead} ahead)` : "—"),
              h("td", { class: "waiting-for wrap", "data-label": "Waiting for", "data-waiting-for": job.waiting_for || "" }, waitingText(job, queue)),
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

/** The mark of a job that runs as backfill. */
export function backfillBadge() {
  return h("span", { class: "badge backfill", title: "Runs as backfill: on capacity no tenant needs now; stopped if a tenant takes its guarantee back" }, "backfill");
}

/** `1 CPU slot`, `2 GPU slots`. */
function slotCount(n, kind) {
  return `${n} ${kind} slot${n === 1 ? "" : "s"}`;
}

// The figures of a tenant's slots of one kind, as the section's rows show them.
const FIGURES = [
  ["Guaranteed", "guaranteed", (s) => String(s.guaranteed)],
  ["In use", "used", (s) => (s.backfill ? `${s.used}, of which ${s.backfill} backfill` : String(s.used))],
  ["Borrowed", "borrowed", (s) => String(s.borrowed)],
  ["Lent", "lent", (s) => String(s.lent)],
  ["Waiting", "waiting", (s) => String(s.waiting)],
  ["Borrowing cap", "borrow-cap", (s) => (s.borrow_cap === null || s.borrow_cap === undefined ? "no cap" : String(s.borrow_cap))],
];

/** The tenants the caller's jobs count against: per tenant its weight and, for CPU and GPU slots, its figures. */
function tenantsSection(tenants) {
  return [
    h("h2", { id: "tenants-heading" }, "Tenants"),
    h(
      "p",
      { class: "muted intro" },
      "Your jobs count against these tenants. A tenant's guaranteed slots are its first; what its own jobs leave free is lent to others, ",
      "in shares by weight, up to each one's borrowing cap. Backfill jobs run only on slots lent out or guaranteed to no one, and are stopped when a tenant takes its guarantee back.",
    ),
    h("div", { class: "tenant-list" }, tenants.map(tenantCard)),
    h(
      "p",
      { class: "muted hint" },
      "In use: its jobs pending or running. Borrowed: in use beyond its guarantee. Lent: guaranteed slots its jobs that are not backfill leave free. Waiting: its jobs waiting to start.",
    ),
  ];
}

function tenantCard(tenant) {
  return h(
    "div",
    { class: "tenant-card", "data-tenant": tenant.name },
    h("h3", {}, h("span", { class: "tenant-name" }, tenant.name), " ", h("span", { class: "muted tenant-weight" }, `weight ${tenant.weight}`)),
    h(
      "table",
      { class: "tenant-slots" },
      h("caption", { class: "visually-hidden" }, `Slots of ${tenant.name}`),
      h("thead", {}, h("tr", {}, h("td", {}), h("th", { scope: "col" }, "CPU"), h("th", { scope: "col" }, "GPU"))),
      h(
        "tbody",
        {},
        FIGURES.map(([label, key, show]) =>
          h(
            "tr",
            { "data-figure": key },
            h("th", { scope: "row" }, label),
            h("td", { "data-kind": "cpu" }, show(tenant.cpu)),
            h("td", { "data-kind": "gpu" }, show(tenant.gpu)),
          ),
        ),
      ),
    ),
    h("p", { class: "muted hint seen" }, tenant.seen ? ["As the admission pass saw them at ", when(tenant.seen), "."] : "No admission pass has counted its jobs yet."),
  );
}

/** Why a queued job waits, in words. */
export function waitingText(job, queue) {
  const kind = job.gpu ? "GPU" : "CPU";
  const tenant = (queue.tenants || []).find((t) => t.name === job.tenant);
  const slots = tenant ? (job.gpu ? tenant.gpu : tenant.cpu) : null;
  const name = job.tenant || "its tenant";
  switch (job.waiting_for) {
    case "running_limit":
      return `Your limit of ${queue.running_limit} jobs running at once`;
    case "cpu_slots":
      return queue.cpu_slots ? `A CPU slot (all ${queue.cpu_slots.limit} are in use)` : "A CPU slot";
    case "gpu_slots":
      return queue.gpu_slots ? `A GPU slot (all ${queue.gpu_slots.limit} are in use)` : "A GPU slot";
    case "tenant_quota":
      return (
        `Its tenant's guarantee, lent out for now: ${name} ` +
        (slots ? `runs ${slots.used - slots.backfill} of its ${slots.guaranteed} guaranteed ${kind} ${slots.guaranteed === 1 ? "slot" : "slots"} (backfill not counted)` : `is below its guaranteed ${kind} slots`) +
        "; the slots come back as jobs end, or when backfill jobs on them are stopped after a grace period"
      );
    case "borrowing_cap":
      return (
        `Its tenant's borrowing cap: ${name} ` +
        (slots && slots.borrow_cap !== null && slots.borrow_cap !== undefined
          ? `uses ${slotCount(slots.used, kind)} and may use at most ${slots.guaranteed + slots.borrow_cap} (${slots.guaranteed} guaranteed + a borrowing cap of ${slots.borrow_cap})`
          : `uses its guaranteed ${kind} slots and all it may borrow`) +
        "; it waits until its jobs use fewer"
      );
    case "next_admission":
      return "Nothing: it starts at the next admission";
    default:
      return job.status === "QUEUED" ? "—" : "Started";
  }
}
