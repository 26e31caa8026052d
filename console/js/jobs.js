// The jobs list: filters (status, function, provider, created after), server-side pages
// (keyset: `cursor` from the page's own next/previous links, so page 50,000 of a long history
// costs the gateway what the first does; an old `offset` link still opens its page), and
// statuses kept current by re-reading the page shown every few seconds while the tab is visible.

import * as api from "./api.js";
import { h, fill, field, notice, when, route, statusBadge, functionName, poll, freshness, uid, STATUSES } from "./dom.js";

const PAGE_SIZES = [10, 25, 50, 100];
const REFRESH_MS = 3000;

/** `2024-05-01T10:00:00.000Z` → the `datetime-local` text of that moment here. */
function toLocalInput(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  const local = new Date(date.getTime() - date.getTimezoneOffset() * 60000);
  return local.toISOString().slice(0, 16);
}

export async function jobsView(root, { query, scope }) {
  document.title = "Jobs · Gantry";
  const limit = PAGE_SIZES.includes(Number(query.limit)) ? Number(query.limit) : 10;
  // Where the page is: a cursor the gateway gave (none: the first page), or an old link's
  // `offset`. `at` is the position of the page's first job, carried in the route only to show
  // the range (a cursor does not say it); the first and last pages set it right again.
  const byOffset = !query.cursor && query.offset !== undefined;
  const offset = Math.max(0, Number.parseInt(query.offset, 10) || 0);
  const at = byOffset ? offset : Math.max(0, Number.parseInt(query.at, 10) || 0);

  const status = h("select", { name: "status" }, h("option", { value: "" }, "Any"), STATUSES.map((s) => h("option", { value: s }, s)));
  status.value = query.status || "";
  // The function picker: any name may be typed; the caller's functions are offered as
  // `provider/title` or `title`, filled in once the list has loaded.
  const choices = h("datalist", { id: uid("functions") });
  const typed = query.provider && query.function ? `${query.provider}/${query.function}` : query.function || "";
  const fnInput = h("input", { name: "function", type: "text", autocomplete: "off", list: choices.id, value: typed, placeholder: "Any function" });
  const provider = h("input", { name: "provider", type: "text", autocomplete: "off", value: query.provider || "" });
  const after = h("input", { name: "created_after", type: "datetime-local", value: query.created_after ? toLocalInput(query.created_after) : "" });
  const size = h("select", { name: "limit" }, PAGE_SIZES.map((n) => h("option", { value: String(n) }, String(n))));
  size.value = String(limit);
  const form = h(
    "form",
    { class: "filters", role: "search" },
    field("Status", status),
    field("Function", fnInput),
    choices,
    field("Provider", provider),
    field("Created after", after),
    field("Per page", size),
    h(
      "div",
      { class: "actions" },
      h("button", { type: "submit" }, "Apply"),
      h("a", { class: "button quiet", href: "#/jobs" }, "Clear"),
    ),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const afterDate = after.value ? new Date(after.value) : null;
    // `provider/title` in the function field names the provider unless the provider field does.
    let fnName = fnInput.value.trim();
    let providerName = provider.value.trim();
    const slash = fnName.indexOf("/");
    if (slash > 0) {
      if (!providerName) providerName = fnName.slice(0, slash);
      fnName = fnName.slice(slash + 1);
    }
    location.hash = route("jobs", {
      status: status.value,
      function: fnName,
      provider: providerName,
      created_after: afterDate && !Number.isNaN(afterDate.getTime()) ? afterDate.toISOString() : "",
      limit: size.value === "10" ? "" : size.value,
    });
  });

  const queueLine = h("p", { class: "queue-line muted", "aria-live": "off" });
  const list = h("div", { class: "table-wrap" });
  const pager = h("nav", { class: "pager", "aria-label": "Pages" });
  const live = h("p", { class: "visually-hidden", "aria-live": "polite" });
  const health = freshness(list);
  fill(root, h("h1", {}, "Jobs"), form, health.element, queueLine, list, pager, live);
  fill(list, h("p", { class: "muted" }, "Loading…"));
  api
    .get("programs/")
    .then((functions) => {
      if (!scope.alive || !Array.isArray(functions)) return;
      const names = [...new Set(functions.map((fn) => functionName(fn.title, fn.provider)))].sort();
      fill(choices, names.map((name) => h("option", { value: name })));
    })
    .catch(() => {});

  const filters = {
    status: query.status,
    function: query.function,
    provider: query.provider,
    created_after: query.created_after,
  };
  const rows = new Map(); // job id → its row's cells that change
  let rendered = false;

  const load = async () => {
    let page;
    const queueRead = api.get("jobs/queue/", { limit: 0 }).catch(() => null);
    try {
      const where = byOffset ? { offset } : { cursor: query.cursor || api.BLANK };
      page = await api.get("jobs/", { ...filters, limit, ...where });
    } catch (error) {
      // A function (or provider) that does not exist matches no job: not an error of the page.
      if (error.status === 404 && (filters.function || filters.provider)) {
        if (!scope.alive) return;
        rendered = false;
        rows.clear();
        fill(list, h("p", { class: "muted", id: "no-jobs" }, `No jobs match. ${error.message}`));
        fill(pager);
        return;
      }
      throw error;
    }
    const queue = await queueRead;
    if (!scope.alive) return;
    if (queue) {
      fill(
        queueLine,
        `Active slots: ${queue.active} of ${queue.active_limit} used (${queue.queued} queued, ${queue.running} running). `,
        h("a", { href: "#/queue" }, "Queue"),
      );
    }
    showPage(page);
  };

  const showPage = (page) => {
    const ids = page.results.map((job) => job.id);
    const same = rendered && ids.length === rows.size && ids.every((id) => rows.has(id));
    rendered = true;
    if (same) {
      // Same jobs: only what changed, so focus and selection stay where they are.
      for (const job of page.results) {
        const cells = rows.get(job.id);
        if (cells.status.dataset.value !== `${job.status}/${job.sub_status}`) {
          fill(cells.status, statusCellContent(job));
          cells.status.dataset.value = `${job.status}/${job.sub_status}`;
          live.textContent = `Job ${job.id.slice(0, 8)} is ${job.status}.`;
        }
        fill(cells.updated, when(job.updated));
      }
    } else {
      rows.clear();
      if (!page.results.length) {
        fill(list, h("p", { class: "muted", id: "no-jobs" }, page.count ? "No jobs on this page: it is past the last one." : "No jobs match."));
      } else {
        fill(
          list,
          h(
            "table",
            { class: "jobs" },
            h("caption", { class: "visually-hidden" }, "Jobs, newest first"),
            h("thead", {}, h("tr", {}, ["Job", "Function", "Status", "Created", "Updated"].map((n) => h("th", { scope: "col" }, n)))),
            h("tbody", {}, page.results.map(row)),
          ),
        );
      }
    }
    // The position of the page's first job: 0 on the first page, count - shown on the last.
    const start = !page.previous ? 0 : !page.next && page.results.length ? Math.max(0, page.count - page.results.length) : at;
    const first = page.results.length ? start + 1 : 0;
    const last = start + page.results.length;
    const base = { ...filters, limit: limit === 10 ? "" : limit };
    const offsetHref = (to) => route("jobs", { ...base, offset: to || "" });
    // A link of the page's own: its cursor, and where that page starts.
    const linkHref = (link, position) => {
      const cursor = link ? new URL(link, location.href).searchParams.get("cursor") : null;
      return cursor ? route("jobs", { ...base, cursor, at: position || "" }) : offsetHref(position);
    };
    const pageLink = (link, position, label) =>
      link
        ? h("a", { class: "button quiet", href: linkHref(link, position), rel: label === "Next" ? "next" : "prev" }, label)
        : h("span", { class: "button quiet disabled", "aria-disabled": "true" }, label);
    // A page past the end (an old link, or jobs deleted since) says so and leads back.
    const lastPage = page.count ? Math.floor((page.count - 1) / limit) * limit : 0;
    const pastEnd = !page.results.length && (byOffset ? offset > 0 : Boolean(query.cursor));
    const back = byOffset
      ? page.count
        ? h("a", { class: "button quiet", href: offsetHref(lastPage) }, "Go to the last page")
        : h("a", { class: "button quiet", href: offsetHref(0) }, "Go to the first page")
      : h("a", { class: "button quiet", href: route("jobs", base) }, "Go to the first page");
    fill(
      pager,
      pastEnd
        ? [h("span", { class: "range" }, `${page.count} ${page.count === 1 ? "job" : "jobs"} in all`), back]
        : [
            pageLink(page.previous, Math.max(0, start - limit), "Previous"),
            h("span", { class: "range" }, `${first}–${last} of ${page.count}`),
            pageLink(page.next, start + page.results.length, "Next"),
          ],
    );
  };

  // The badge, and under it why an ended job did not succeed (`status_reason`).
  const statusCellContent = (job) => [
    statusBadge(job.status, job.sub_status),
    job.status_reason ? h("div", { class: "row-reason", title: job.status_reason }, job.status_reason) : null,
  ];

  const row = (job) => {
    const statusCell = h("td", { class: "status" }, statusCellContent(job));
    statusCell.dataset.value = `${job.status}/${job.sub_status}`;
    const updated = h("td", {}, when(job.updated));
    rows.set(job.id, { status: statusCell, updated });
    const program = job.program || {};
    return h(
      "tr",
      { "data-job": job.id },
      h("td", {}, h("a", { href: `#/job/${encodeURIComponent(job.id)}`, class: "mono", title: job.id }, job.id.slice(0, 8))),
      h("td", {}, program.title ? functionName(program.title, program.provider) : h("span", { class: "muted" }, "(deleted)")),
      statusCell,
      h("td", {}, when(job.created)),
      updated,
    );
  };

  // A first read that fails (the gateway down) shows why and keeps trying: the page fills in by
  // itself once the gateway answers.
  try {
    await load();
    health.ok();
  } catch (error) {
    if (!scope.alive) return;
    fill(list, notice("error", error.message));
    health.failed(error, REFRESH_MS);
  }
  scope.add(poll(load, REFRESH_MS, health));
}
