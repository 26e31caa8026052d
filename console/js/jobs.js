// The jobs list: filters (status, function, provider, created after), server-side pages
// (keyset: `cursor` from the page's own next/previous links, so page 50,000 of a long history
// costs the gateway what the first does; an old `offset` link still opens its page), and
// statuses kept current by re-reading the page shown every few seconds while the tab is visible.
//
// The function filter is the console's: what was typed is looked for, in any case, in the names
// of the functions the caller can see (`programs/`), and the jobs of those it names are listed
// (the API's own `function=` is exact, and stays so). One function: the gateway's keyset pages
// of its jobs. Several: each one's jobs read by offset and merged, newest first (`offsets` in the
// route says where each one's page starts).

import * as api from "./api.js";
import { h, fill, field, notice, when, route, statusBadge, functionName, poll, freshness, failure, uid, STATUSES } from "./dom.js";

const PAGE_SIZES = [10, 25, 50, 100];
const REFRESH_MS = 3000;
/** At most this many functions' jobs are merged into one list. */
const MAX_MERGED = 10;

/** `2024-05-01T10:00:00.000Z` → the `datetime-local` text of that moment here. */
function toLocalInput(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  const local = new Date(date.getTime() - date.getTimezoneOffset() * 60000);
  return local.toISOString().slice(0, 16);
}

/**
 * The functions `text` names, of those listed (`programs/`), narrowed to `provider` (any case)
 * when one is given: those whose title or `provider/title` is exactly `text`, else every one
 * whose `provider/title` contains it, in any case. Sorted by name, each once.
 */
export function matchFunctions(functions, text, provider) {
  const seen = new Map();
  for (const fn of functions) {
    if (!fn || !fn.title) continue;
    const name = functionName(fn.title, fn.provider);
    if (!seen.has(name)) seen.set(name, fn);
  }
  const all = [...seen.values()].filter((fn) => !provider || (fn.provider || "").toLowerCase() === provider.toLowerCase());
  const exact = all.filter((fn) => fn.title === text || functionName(fn.title, fn.provider) === text);
  const needle = text.toLowerCase();
  const found = exact.length ? exact : all.filter((fn) => functionName(fn.title, fn.provider).toLowerCase().includes(needle));
  return found.sort((a, b) => functionName(a.title, a.provider).localeCompare(functionName(b.title, b.provider)));
}

/** Newest first, as the gateway lists jobs (created, then id, both descending). */
const newestFirst = (a, b) => (b.created || "").localeCompare(a.created || "") || String(b.id).localeCompare(String(a.id));

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
  // The function picker: any part of a name may be typed, in any case; the caller's functions
  // are offered as `provider/title` or `title`, filled in once the list has loaded.
  const choices = h("datalist", { id: uid("functions") });
  const fnInput = h("input", { name: "function", type: "text", autocomplete: "off", list: choices.id, value: query.function || "", placeholder: "Any function" });
  const provider = h("input", { name: "provider", type: "text", autocomplete: "off", value: query.provider || "" });
  const after = h("input", { name: "created_after", type: "datetime-local", value: query.created_after ? toLocalInput(query.created_after) : "" });
  const size = h("select", { name: "limit" }, PAGE_SIZES.map((n) => h("option", { value: String(n) }, String(n))));
  size.value = String(limit);
  const form = h(
    "form",
    { class: "filters", role: "search", id: uid("filters"), "aria-label": "Filters" },
    field("Status", status, null),
    field("Function", fnInput, "Any part of a name, in any case."),
    choices,
    field("Provider", provider),
    field("Created after", after, `Your local time (${localZone()}).`),
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
    location.hash = route("jobs", {
      status: status.value,
      function: fnInput.value.trim(),
      provider: provider.value.trim(),
      created_after: afterDate && !Number.isNaN(afterDate.getTime()) ? afterDate.toISOString() : "",
      limit: size.value === "10" ? "" : size.value,
    });
  });
  // On a narrow screen the filters fold behind a toggle (styled away on wide ones), so the jobs
  // come first; the toggle says how many filters are set.
  const active = [query.status, query.function, query.provider, query.created_after].filter(Boolean).length;
  const toggle = h(
    "button",
    { type: "button", class: "quiet filters-toggle", "aria-expanded": "false", "aria-controls": form.id },
    active ? `Filters (${active})` : "Filters",
  );
  form.dataset.collapsed = "true";
  toggle.addEventListener("click", () => {
    const open = form.dataset.collapsed === "true";
    form.dataset.collapsed = open ? "false" : "true";
    toggle.setAttribute("aria-expanded", String(open));
    if (open) status.focus();
  });

  const queueLine = h("p", { class: "queue-line muted", "aria-live": "off" });
  const matchLine = h("p", { class: "match-line", id: "function-match" });
  matchLine.hidden = true;
  const list = h("div", { class: "table-wrap" });
  const pager = h("nav", { class: "pager", "aria-label": "Pages" });
  const live = h("p", { class: "visually-hidden", "aria-live": "polite" });
  const health = freshness(list);
  fill(root, h("div", { class: "title-row" }, h("h1", {}, "Jobs"), toggle), form, health.element, queueLine, matchLine, list, pager, live);
  fill(list, h("p", { class: "muted" }, "Loading…"));
  const functionsRead = api
    .get("programs/")
    .then((functions) => (Array.isArray(functions) ? functions : null))
    .catch(() => null);
  functionsRead.then((functions) => {
    if (!scope.alive || !functions) return;
    const names = [...new Set(functions.map((fn) => functionName(fn.title, fn.provider)))].sort();
    fill(choices, names.map((name) => h("option", { value: name })));
  });

  const filters = {
    status: query.status,
    function: query.function,
    provider: query.provider,
    created_after: query.created_after,
  };
  const anyFilter = Object.values(filters).some(Boolean);
  // What the function filter names: null (no function typed, or the functions could not be
  // read: the gateway's exact filter then), or the functions to list the jobs of.
  let sources = null;
  if (query.function) {
    const functions = await functionsRead;
    if (!scope.alive) return;
    if (functions) {
      const found = matchFunctions(functions, query.function, query.provider);
      sources = found.slice(0, MAX_MERGED);
      showMatch(matchLine, query, found, sources);
    }
  }
  // A function without a provider is asked for by title alone, which also finds the
  // provider functions of that title: those are not asked for again.
  const asked = sources
    ? sources.filter((fn) => !fn.provider || !sources.some((other) => !other.provider && other.title === fn.title))
    : null;
  const merged = asked !== null && asked.length > 1;
  const offsets = merged ? parseOffsets(query.offsets, asked.length) : null;
  const base = { ...filters, limit: limit === 10 ? "" : limit };
  const others = { status: filters.status, created_after: filters.created_after };

  const rows = new Map(); // job id → its row's cells that change
  let rendered = false;

  const noJobs = (...content) => {
    rendered = false;
    rows.clear();
    fill(list, h("p", { class: "muted", id: "no-jobs" }, content));
    fill(pager);
    pager.hidden = true;
  };

  const readQueue = async () => {
    const queue = await api.get("jobs/queue/", { limit: 0 }).catch(() => null);
    if (!scope.alive || !queue) return;
    fill(
      queueLine,
      `Active slots: ${queue.active} of ${queue.active_limit} used (${queue.queued} queued, ${queue.running} running). `,
      h("a", { href: "#/queue" }, "Queue"),
    );
  };

  const load = async () => {
    const queueRead = readQueue();
    if (asked !== null && !asked.length) {
      await queueRead;
      if (!scope.alive) return;
      noJobs(
        noMatchText(query.function, query.provider),
        " ",
        h("a", { href: "#/functions" }, "See the functions you can run"),
        ", or ",
        h("a", { href: route("jobs", { ...base, function: "" }) }, "show the jobs of every function"),
        ".",
      );
      return;
    }
    let page;
    try {
      if (merged) {
        page = await mergedPage(asked, offsets, others, limit);
      } else {
        const one = asked ? { function: asked[0].title, provider: asked[0].provider || query.provider } : {};
        const where = byOffset ? { offset } : { cursor: query.cursor || api.BLANK };
        page = await api.get("jobs/", { ...filters, ...one, limit, ...where });
      }
    } catch (error) {
      // The gateway's exact filter (when the functions could not be read): a name no function
      // has matches no job, which is not an error of the page.
      if (error.status === 404 && (filters.function || filters.provider) && !asked) {
        if (!scope.alive) return;
        noJobs(
          filters.function ? `No function is named “${functionName(filters.function, filters.provider)}”.` : `No provider is named “${filters.provider}”.`,
          " ",
          h("a", { href: "#/functions" }, "See the functions you can run."),
        );
        return;
      }
      if (!rendered) fill(list, notice("error", error.message));
      throw error;
    }
    await queueRead;
    if (!scope.alive) return;
    showPage(page);
  };

  const showPage = (page) => {
    const ids = page.results.map((job) => job.id);
    const same = rendered && ids.length === rows.size && ids.every((id) => rows.has(id));
    if (!page.results.length) {
      const pastEnd = merged ? offsets.some((n) => n > 0) : byOffset ? offset > 0 : Boolean(query.cursor);
      if (pastEnd) {
        noJobs("No jobs on this page: it is past the last one.");
        pager.hidden = false;
        const back = byOffset && page.count
          ? h("a", { class: "button quiet", href: route("jobs", { ...base, offset: lastPageOffset(page.count, limit) || "" }) }, "Go to the last page")
          : h("a", { class: "button quiet", href: route("jobs", base) }, "Go to the first page");
        fill(pager, h("span", { class: "range" }, `${page.count} ${page.count === 1 ? "job" : "jobs"} in all`), back);
      } else if (anyFilter) {
        noJobs("No jobs match. ", h("a", { href: "#/jobs" }, "Show all your jobs"), ".");
      } else {
        // A new user's first visit: where jobs come from.
        noJobs(
          "You have no jobs yet. A job is one run of a function: open ",
          h("a", { href: "#/functions", id: "go-to-functions" }, "Functions"),
          ", choose one and press Run on its page (or upload your own first). Its job then shows here, with its status, log and result.",
        );
      }
      return;
    }
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
    pager.hidden = false;
    if (merged) showMergedPager(page);
    else showPager(page);
  };

  const pageLink = (href, label) =>
    href
      ? h("a", { class: "button quiet", href, rel: label === "Next" ? "next" : "prev" }, label)
      : h("span", { class: "button quiet disabled", "aria-disabled": "true" }, label);
  // One page of jobs and no other: the range alone, no buttons that lead nowhere.
  const range = (first, last, count) => h("span", { class: "range" }, `${first}–${last} of ${count}`);

  const showPager = (page) => {
    // The position of the page's first job: 0 on the first page, count - shown on the last.
    const start = !page.previous ? 0 : !page.next && page.results.length ? Math.max(0, page.count - page.results.length) : at;
    const first = start + 1;
    const last = start + page.results.length;
    const offsetHref = (to) => route("jobs", { ...base, offset: to || "" });
    // A link of the page's own: its cursor, and where that page starts.
    const linkHref = (link, position) => {
      if (!link) return null;
      const cursor = new URL(link, location.href).searchParams.get("cursor");
      return cursor ? route("jobs", { ...base, cursor, at: position || "" }) : offsetHref(position);
    };
    if (!page.previous && !page.next) {
      fill(pager, range(first, last, page.count));
      return;
    }
    fill(
      pager,
      pageLink(linkHref(page.previous, Math.max(0, start - limit)), "Previous"),
      range(first, last, page.count),
      pageLink(linkHref(page.next, start + page.results.length), "Next"),
    );
  };

  const showMergedPager = (page) => {
    const start = offsets.reduce((sum, n) => sum + n, 0);
    const next = page.hasNext ? route("jobs", { ...base, offsets: page.nextOffsets.join(".") }) : null;
    const hasPrevious = offsets.some((n) => n > 0);
    if (!hasPrevious && !next) {
      fill(pager, range(start + 1, start + page.results.length, page.count));
      return;
    }
    // The page before is found when asked for: the newest jobs just before each one's start.
    const previous = hasPrevious
      ? h("button", { type: "button", class: "quiet" }, "Previous")
      : pageLink(null, "Previous");
    if (hasPrevious) {
      previous.addEventListener("click", async () => {
        previous.disabled = true;
        try {
          const before = await previousOffsets(asked, offsets, others, limit);
          location.hash = route("jobs", { ...base, offsets: before.some((n) => n > 0) ? before.join(".") : "" });
        } catch (error) {
          previous.disabled = false;
          pager.append(notice("error", `${failure(error)}.`));
        }
      });
    }
    fill(pager, previous, range(start + 1, start + page.results.length, page.count), pageLink(next, "Next"));
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

  // Read at once, then every few seconds. A read the gateway cannot answer (it is down) is
  // asked again until it does, and the page fills in by itself; an error answer is shown with
  // its status and message, and asked again a few times at most (a refusal: not at all), then
  // the line above the list offers Retry.
  scope.add(poll(load, REFRESH_MS, health, { now: true }));
}

/** The reader's time zone as a short name (`UTC`, `GMT+2`, `CEST`). */
function localZone() {
  const part = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(new Date()).find((p) => p.type === "timeZoneName");
  return part ? part.value : "local";
}

function lastPageOffset(count, limit) {
  return count ? Math.floor((count - 1) / limit) * limit : 0;
}

/** `3.0.12` → [3, 0, 12], `n` numbers (zeros for what is missing or not a number). */
function parseOffsets(text, n) {
  const parts = String(text || "").split(".");
  return Array.from({ length: n }, (_, i) => Math.max(0, Number.parseInt(parts[i], 10) || 0));
}

/** Says which functions the typed text named (nothing when it named one exactly). */
function showMatch(line, query, found, sources) {
  const text = query.function;
  const exactly = found.length === 1 && (found[0].title === text || functionName(found[0].title, found[0].provider) === text);
  if (!found.length || exactly) {
    line.hidden = true;
    return;
  }
  const names = sources.map((fn) => h("strong", {}, functionName(fn.title, fn.provider)));
  const joined = names.flatMap((name, i) => (i ? [i === names.length - 1 ? " and " : ", ", name] : [name]));
  fill(
    line,
    found.length === 1 ? ["Jobs of ", joined, `, the function whose name contains “${text}”.`] : ["Jobs of ", joined, `: the ${found.length} functions whose names contain “${text}”.`],
    found.length > sources.length ? ` Only the first ${sources.length} are listed: type more of the name to narrow it.` : "",
  );
  line.hidden = false;
}

/** What a name that no function has is told. */
function noMatchText(text, provider) {
  return provider ? `No function of provider “${provider}” has a name containing “${text}”.` : `No function's name contains “${text}”.`;
}

const askFor = (fn) => ({ function: fn.title, provider: fn.provider || undefined });

/**
 * A page of the jobs of several functions, newest first: each one's jobs from its offset, merged;
 * `nextOffsets` says where each one's next page starts.
 */
async function mergedPage(functions, offsets, filters, limit) {
  const answers = await Promise.all(functions.map((fn, i) => api.get("jobs/", { ...filters, ...askFor(fn), limit, offset: offsets[i] })));
  const all = answers.flatMap((answer, i) => answer.results.map((job) => ({ job, i })));
  all.sort((a, b) => newestFirst(a.job, b.job));
  const shown = all.slice(0, limit);
  const nextOffsets = [...offsets];
  for (const { i } of shown) nextOffsets[i] += 1;
  return {
    results: shown.map(({ job }) => job),
    count: answers.reduce((sum, answer) => sum + (answer.count || 0), 0),
    nextOffsets,
    hasNext: answers.some((answer, i) => nextOffsets[i] < (answer.count || 0)),
  };
}

/** Where each function's jobs start on the page before: the `limit` jobs just newer than these. */
async function previousOffsets(functions, offsets, filters, limit) {
  const answers = await Promise.all(
    functions.map((fn, i) =>
      offsets[i] > 0 ? api.get("jobs/", { ...filters, ...askFor(fn), offset: Math.max(0, offsets[i] - limit), limit: Math.min(limit, offsets[i]) }) : null,
    ),
  );
  const all = answers.flatMap((answer, i) => (answer ? answer.results.map((job) => ({ job, i })) : []));
  all.sort((a, b) => newestFirst(a.job, b.job));
  const before = [...offsets];
  for (const { i } of all.slice(Math.max(0, all.length - limit))) before[i] -= 1;
  return before;
}
