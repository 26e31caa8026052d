// Usage (`usage/`, not part of the reference API): the caller's totals for a period (this month
// by default, UTC days as the ledger keeps them), a table of them by function, size or day, and a
// bar chart per day by function drawn as inline SVG (the numbers are in tables too). Where a
// monthly budget is set (`jobs/queue/`'s `budgets`), its use against its limit, and the month's
// running total drawn against the budget as a line: a budget is per month, so it is compared
// with the month so far, not with one day's bar. Re-read every few seconds while visible (a
// running job counts up to now, on today's row).
//
// `provider=` in the route reads a provider's functions' jobs of every user, for its admins
// (others get the gateway's 403, shown as sent).

import * as api from "./api.js";
import { h, fill, field, notice, route, poll, freshness, uid } from "./dom.js";
import { duration, hours } from "./job.js";

const REFRESH_MS = 10000;
const GROUPINGS = { function: "Function", size: "Size", day: "Day" };
/** Functions drawn in a colour of their own; the rest share one, as "Other functions". */
const SERIES = 8;
const SVG = "http://www.w3.org/2000/svg";
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];

/** What the bars show: each a group's value and how it is written. */
const METRICS = {
  cpu: { label: "CPU-hours", value: (g) => g.cpu_core_seconds / 3600, format: (v) => hours(v) },
  gpu: { label: "GPU-hours", value: (g) => g.gpu_seconds / 3600, format: (v) => hours(v) },
  run: { label: "Run time", value: (g) => g.run_seconds, format: (v) => duration(v) },
  jobs: { label: "Jobs", value: (g) => g.jobs, format: (v) => String(Math.round(v * 100) / 100) },
};

/** An SVG element (`h` makes HTML ones). */
function s(tag, attrs, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null && value !== false) element.setAttribute(name, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

/** `YYYY-MM-DD` ↔ days since the epoch (UTC, as the ledger counts days). */
const dayNumber = (text) => Math.round(Date.parse(`${text}T00:00:00Z`) / 86400000);
const dateOf = (day) => new Date(day * 86400000).toISOString().slice(0, 10);
const today = () => dateOf(Math.floor(Date.now() / 86400000));

/** The first of the month `shift` months from the month of `date` (`YYYY-MM-DD`). */
function monthStart(date, shift = 0) {
  const [year, month] = date.split("-").map(Number);
  return new Date(Date.UTC(year, month - 1 + shift, 1)).toISOString().slice(0, 10);
}

/** `2026-11-01`…`2026-12-01` → "November 2026"; another period → its first and last day. */
export function periodName(from, to) {
  if (from === monthStart(from) && to === monthStart(from, 1)) {
    const [year, month] = from.split("-").map(Number);
    return `${MONTHS[month - 1]} ${year}`;
  }
  const last = dateOf(dayNumber(to) - 1);
  return from === last ? from : `${from} to ${last}`;
}

/** Nice tick step (1, 2 or 5 × 10ⁿ) for about `count` ticks up to `max`. */
function tickStep(max, count, integer) {
  const raw = max / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((candidate) => candidate >= raw) || raw;
  return integer ? Math.max(1, Math.ceil(step)) : step;
}

export async function usageView(root, { query, scope }) {
  document.title = "Usage · Gantry";
  const groupBy = GROUPINGS[query.group_by] ? query.group_by : "function";
  const metricName = METRICS[query.metric] ? query.metric : "cpu";
  const metric = METRICS[metricName];
  const provider = query.provider || "";

  const fromInput = h("input", { type: "date", name: "from", value: query.from || "" });
  const lastInput = h("input", { type: "date", name: "last", value: query.to ? dateOf(dayNumber(query.to) - 1) : "" });
  const groupSelect = h("select", { name: "group_by" }, Object.entries(GROUPINGS).map(([value, label]) => h("option", { value }, label)));
  groupSelect.value = groupBy;
  const metricSelect = h("select", { name: "metric" }, Object.entries(METRICS).map(([value, m]) => h("option", { value }, m.label)));
  metricSelect.value = metricName;
  const form = h(
    "form",
    { class: "filters usage-period", "aria-label": "Period and grouping" },
    field("From", fromInput, "First day (UTC)."),
    field("To", lastInput, "Last day, included (UTC)."),
    field("Group the table by", groupSelect),
    field("Bars show", metricSelect),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Show")),
  );
  const go = (changes) => {
    location.hash = route("usage", { from: query.from, to: query.to, group_by: groupBy, metric: metricName, provider, ...changes });
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const last = lastInput.value;
    go({ from: fromInput.value, to: last && dayNumber(last) ? dateOf(dayNumber(last) + 1) : "", group_by: groupSelect.value, metric: metricSelect.value });
  });
  // A choice of grouping or bars applies at once; dates wait for Show.
  groupSelect.addEventListener("change", () => go({ group_by: groupSelect.value }));
  metricSelect.addEventListener("change", () => go({ metric: metricSelect.value }));

  const months = h("nav", { class: "usage-months", "aria-label": "Months" });
  const summary = h("div", { class: "card usage-summary", id: "usage-totals", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
  const budgetBox = h("div", { class: "card usage-budgets", id: "usage-budgets", hidden: true });
  const chartBox = h("div", { class: "chart-wrap", id: "usage-chart" });
  const legend = h("ul", { class: "legend", id: "usage-legend" });
  const chartTable = h("div", { class: "table-wrap" });
  const chartDetails = h("details", { class: "chart-numbers" }, h("summary", {}, "The chart's numbers as a table"), chartTable);
  const chartCard = h(
    "section",
    { class: "card usage-chart-card", "aria-labelledby": "usage-chart-heading" },
    h("h2", { id: "usage-chart-heading" }, `${metric.label} per day, by function`),
    chartBox,
    legend,
    chartDetails,
  );
  const tableBox = h("div", { class: "table-wrap", id: "usage-table" });
  const health = freshness(tableBox);
  fill(
    root,
    h("h1", {}, provider ? `Usage of provider ${provider}` : "Usage"),
    h(
      "p",
      { class: "muted intro" },
      provider ? `Every user's jobs of provider ${provider}'s functions. ` : "Your jobs. ",
      "A job counts on the day it ended (UTC); a running job counts up to now, on today's row. CPU-hours are the cores its runner gave it × its run time (GPU-hours the same with GPUs).",
    ),
    health.element,
    months,
    form,
    summary,
    chartCard,
    budgetBox,
    h("section", { "aria-labelledby": "usage-table-heading" }, h("h2", { id: "usage-table-heading" }, `By ${GROUPINGS[groupBy].toLowerCase()}`), tableBox),
  );

  let last = null; // the last answers, drawn again when the width changes
  const load = async () => {
    const period = { from: query.from, to: query.to, provider };
    const [totals, days, queue] = await Promise.all([
      api.get("usage/", { ...period, group_by: groupBy }),
      api.get("usage/", { ...period, group_by: "day,function" }),
      provider ? Promise.resolve(null) : api.get("jobs/queue/", { limit: 0 }),
    ]);
    if (!scope.alive) return;
    last = { totals, days, budgets: (queue && queue.budgets) || [] };
    if (!fromInput.value) fromInput.value = totals.from;
    if (!lastInput.value) lastInput.value = dateOf(dayNumber(totals.to) - 1);
    showMonths(totals);
    showTotals(totals);
    showTable(totals);
    draw();
  };

  const showMonths = (totals) => {
    const link = (date, text, rel) => h("a", { href: route("usage", { from: date, to: monthStart(date, 1), group_by: groupBy, metric: metricName, provider }), class: "button quiet small", rel }, text);
    const previous = monthStart(totals.from, -1);
    const next = monthStart(totals.from, 1);
    const name = (date) => periodName(date, monthStart(date, 1));
    fill(
      months,
      h("h2", { id: "usage-period" }, periodName(totals.from, totals.to)),
      h(
        "div",
        { class: "actions" },
        link(previous, `← ${name(previous)}`, "prev"),
        query.from || query.to ? h("a", { href: route("usage", { group_by: groupBy, metric: metricName, provider }), class: "button quiet small" }, "This month") : null,
        link(next, `${name(next)} →`, "next"),
      ),
    );
  };

  const showTotals = (totals) => {
    const t = totals.total;
    const item = (label, value, key, hint) => h("div", { class: "stat", "data-total": key }, h("dt", {}, label), h("dd", { title: hint || null }, value));
    fill(
      summary,
      h(
        "dl",
        { class: "stats" },
        item("Jobs ended", String(t.jobs), "jobs"),
        item("Running now", String(t.running), "running"),
        item("Run time", duration(t.run_seconds), "run", `${t.run_seconds} s`),
        item("Waiting time", duration(t.wait_seconds), "wait", `${t.wait_seconds} s`),
        item("CPU-hours", hours(t.cpu_core_seconds / 3600), "cpu-hours", `${t.cpu_core_seconds} core-seconds`),
        item("Memory GiB-hours", hours(t.gib_seconds / 3600), "gib-hours", `${t.gib_seconds} GiB-seconds`),
        item("GPU-hours", hours(t.gpu_seconds / 3600), "gpu-hours", `${t.gpu_seconds} GPU-seconds`),
      ),
    );
  };

  const showTable = (totals) => {
    if (!totals.groups.length) {
      fill(tableBox, h("p", { class: "muted" }, "No jobs ended or ran in this period."));
      return;
    }
    const label = (group) => {
      if (groupBy === "size") return group.key || "(no size asked)";
      if (groupBy === "day") return group.key;
      return group.name || "(deleted function)";
    };
    const cells = (g) => [
      h("td", { class: "num" }, String(g.jobs)),
      h("td", { class: "num" }, String(g.running)),
      h("td", { class: "num", title: `${g.run_seconds} s` }, duration(g.run_seconds)),
      h("td", { class: "num", title: `${g.wait_seconds} s` }, duration(g.wait_seconds)),
      h("td", { class: "num" }, hours(g.cpu_core_seconds / 3600)),
      h("td", { class: "num" }, hours(g.gib_seconds / 3600)),
      h("td", { class: "num" }, hours(g.gpu_seconds / 3600)),
    ];
    const groups = [...totals.groups].sort((a, b) => (groupBy === "function" ? label(a).localeCompare(label(b)) : a.key.localeCompare(b.key)));
    fill(
      tableBox,
      h(
        "table",
        { class: "usage" },
        h("caption", { class: "visually-hidden" }, `Usage in ${periodName(totals.from, totals.to)} by ${GROUPINGS[groupBy].toLowerCase()}`),
        h("thead", {}, h("tr", {}, [GROUPINGS[groupBy], "Jobs ended", "Running", "Run time", "Waiting", "CPU-hours", "GiB-hours", "GPU-hours"].map((n) => h("th", { scope: "col" }, n)))),
        h("tbody", {}, groups.map((g) => h("tr", { "data-key": g.key }, h("th", { scope: "row", title: groupBy === "function" ? g.key : null }, label(g)), cells(g)))),
        h("tfoot", {}, h("tr", {}, h("th", { scope: "row" }, "Total"), cells(totals.total))),
      ),
    );
  };

  const draw = () => {
    if (!last || !scope.alive) return;
    const width = Math.max(300, Math.min(1100, Math.round(chartBox.clientWidth || 700)));
    const chart = dayChart(last.days, metric, width);
    fill(chartBox, chart.svg);
    fill(legend, chart.legend);
    fill(chartTable, chart.table);
    showBudgets(last.budgets, last.days, width);
  };

  const showBudgets = (budgets, days, width) => {
    const limited = budgets.filter((b) => b.cpu_hours !== null || b.gpu_hours !== null);
    budgetBox.hidden = !limited.length;
    if (!limited.length) return;
    const bars = [];
    for (const b of limited) {
      for (const [kind, limit, used] of [["CPU", b.cpu_hours, b.cpu_hours_used], ["GPU", b.gpu_hours, b.gpu_hours_used]]) {
        if (limit === null || limit === undefined) continue;
        bars.push(
          h(
            "li",
            { class: "budget", "data-budget": `${b.kind} ${b.name} ${kind}` },
            h("strong", {}, `${kind}-hours budget of ${b.kind} ${b.name}: `),
            `${hours(used)} of ${hours(limit)} used in ${b.period}`,
            used >= limit ? " (spent: new runs are refused until it resets)" : "",
            `; it resets on ${b.resets}.`,
            h("meter", { min: 0, max: limit || 1, value: Math.min(used, limit || 1), high: (limit || 1) * 0.9, "aria-label": `${kind}-hours of the ${b.kind} ${b.name} budget used` }),
          ),
        );
      }
    }
    // The month so far against the budget: only when the period shown is the budget's month.
    const month = limited[0].period;
    const shown = days.from === `${month}-01` && days.to === limited[0].resets;
    const charts = [];
    if (shown) {
      for (const kind of ["CPU", "GPU"]) {
        const lines = limited.filter((b) => (kind === "CPU" ? b.cpu_hours : b.gpu_hours) !== null && (kind === "CPU" ? b.cpu_hours : b.gpu_hours) !== undefined);
        if (lines.length) charts.push(budgetChart(days, kind, lines, width, Boolean(provider)));
      }
    }
    fill(
      budgetBox,
      h("h2", {}, "Budgets"),
      h("ul", { class: "budgets" }, bars),
      h(
        "p",
        { class: "muted" },
        "A budget is a calendar month's (UTC), so the line below is the month's running total against it, not a day's bar. ",
        "A group's budget counts all its members' jobs and a function's every user's: the figures above are the budget's own use; the line is your jobs only.",
      ),
      shown ? charts : h("p", { class: "muted", id: "budget-elsewhere" }, `The running total is drawn against the budget when the period shown is its month: `, h("a", { href: route("usage", { from: `${month}-01`, to: limited[0].resets, group_by: groupBy, metric: metricName }) }, periodName(`${month}-01`, limited[0].resets)), "."),
    );
  };

  const onResize = () => {
    if (last) draw();
  };
  window.addEventListener("resize", onResize);
  scope.add(() => window.removeEventListener("resize", onResize));

  // Read at once, then every few seconds; an error answer is shown with its status and message
  // and asked again a few times at most (a refusal: not at all), then Retry.
  let shownOnce = false;
  const read = async () => {
    try {
      await load();
      shownOnce = true;
    } catch (error) {
      if (scope.alive && !shownOnce) fill(summary, notice("error", error.message));
      throw error;
    }
  };
  scope.add(poll(read, REFRESH_MS, health, { now: true }));
}

/** The days of a `day,function` answer's period, and each function's value per day. */
function perDay(answer, value) {
  const first = dayNumber(answer.from);
  const count = Math.max(0, dayNumber(answer.to) - first);
  const days = Array.from({ length: count }, (_, i) => dateOf(first + i));
  const functions = new Map(); // key → {key, name, total, byDay: Map}
  for (const group of answer.groups) {
    const at = group.key.indexOf(" ");
    const day = at < 0 ? group.key : group.key.slice(0, at);
    const key = at < 0 ? "" : group.key.slice(at + 1);
    if (!functions.has(key)) functions.set(key, { key, name: group.name || "(deleted function)", total: 0, byDay: new Map() });
    const fn = functions.get(key);
    const v = value(group);
    fn.total += v;
    fn.byDay.set(day, (fn.byDay.get(day) || 0) + v);
  }
  return { days, functions: [...functions.values()] };
}

/** A day's label on the axis: its day of the month, with the month when the period spans more than one. */
function dayLabel(date, manyMonths) {
  return manyMonths ? date.slice(5) : String(Number(date.slice(8)));
}

/** The bar chart per day, stacked by function; its legend and its numbers as a table. */
function dayChart(answer, metric, width) {
  const { days, functions } = perDay(answer, metric.value);
  // Largest first; beyond the palette, the rest share "Other functions".
  const ranked = functions.filter((f) => f.total > 0).sort((a, b) => b.total - a.total || a.name.localeCompare(b.name));
  let series = ranked;
  if (ranked.length > SERIES) {
    const other = { key: "*other", name: `Other functions (${ranked.length - SERIES + 1})`, total: 0, byDay: new Map() };
    for (const fn of ranked.slice(SERIES - 1)) {
      other.total += fn.total;
      for (const [day, v] of fn.byDay) other.byDay.set(day, (other.byDay.get(day) || 0) + v);
    }
    series = [...ranked.slice(0, SERIES - 1), other];
  }
  const totals = days.map((day) => series.reduce((sum, fn) => sum + (fn.byDay.get(day) || 0), 0));
  const max = Math.max(0, ...totals);
  const height = 240;
  const margin = { top: 12, right: 10, bottom: 30, left: 72 };
  const plotW = width - margin.left - margin.right;
  const plotH = height - margin.top - margin.bottom;
  const integer = metric === METRICS.jobs;
  const step = max > 0 ? tickStep(max, 4, integer) : 1;
  const top = max > 0 ? Math.ceil(max / step) * step : step * 4;
  const y = (v) => margin.top + plotH - (v / top) * plotH;
  const band = days.length ? plotW / days.length : plotW;
  const barW = Math.max(1, band * 0.72);
  const period = periodName(answer.from, answer.to);
  const titleId = uid("chart-title");
  const descId = uid("chart-desc");
  const busiest = totals.indexOf(max);
  const usedDays = totals.filter((v) => v > 0).length;
  const description = max > 0
    ? `${metric.label} per day from ${answer.from} to ${dateOf(dayNumber(answer.to) - 1)}, one bar per day stacked by function (${series.map((f) => f.name).join(", ")}). ${usedDays} of ${days.length} days had use; the most was ${metric.format(max)} on ${days[busiest]}. The same numbers are in the table below the chart.`
    : `No ${metric.label.toLowerCase()} in ${period}: every day is empty.`;
  const svg = s(
    "svg",
    { class: "chart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-labelledby": `${titleId} ${descId}`, preserveAspectRatio: "xMinYMin meet" },
    s("title", { id: titleId }, `${metric.label} per day in ${period}, by function`),
    s("desc", { id: descId }, description),
  );
  // The value axis: gridlines with their values.
  const axis = s("g", { class: "axis" });
  for (let v = 0; v <= top + step / 2; v += step) {
    axis.append(
      s("line", { x1: margin.left, x2: width - margin.right, y1: y(v), y2: y(v), class: v === 0 ? "baseline" : "grid" }),
      s("text", { x: margin.left - 6, y: y(v) + 4, "text-anchor": "end" }, metric.format(v)),
    );
  }
  // The days: every one has its place (an empty day, no bar); a label every few days.
  const manyMonths = answer.from.slice(0, 7) !== dateOf(dayNumber(answer.to) - 1).slice(0, 7);
  const labelEvery = Math.max(1, Math.ceil(days.length / Math.max(2, Math.floor(plotW / (manyMonths ? 44 : 26)))));
  days.forEach((day, i) => {
    if (i % labelEvery === 0) axis.append(s("text", { x: margin.left + band * i + band / 2, y: height - margin.bottom + 16, "text-anchor": "middle", class: "day" }, dayLabel(day, manyMonths)));
  });
  svg.append(axis);
  const bars = s("g", { class: "bars" });
  days.forEach((day, i) => {
    let base = 0;
    series.forEach((fn, index) => {
      const v = fn.byDay.get(day) || 0;
      if (!(v > 0)) return;
      const y0 = y(base);
      const y1 = y(base + v);
      base += v;
      bars.append(
        s(
          "rect",
          { class: `bar series-${index}`, x: margin.left + band * i + (band - barW) / 2, y: y1, width: barW, height: Math.max(0.5, y0 - y1), "data-day": day, "data-function": fn.name },
          s("title", {}, `${day} · ${fn.name}: ${metric.format(v)}`),
        ),
      );
    });
  });
  svg.append(bars);
  const legend = series.length
    ? series.map((fn, index) => h("li", { "data-function": fn.name }, h("span", { class: `swatch series-${index}`, "aria-hidden": "true" }), `${fn.name} (${metric.format(fn.total)})`))
    : [h("li", { class: "muted" }, "No function used any in this period.")];
  const usedDaysList = days.filter((_, i) => totals[i] > 0);
  const table = usedDaysList.length
    ? h(
        "table",
        { class: "usage chart-table" },
        h("caption", { class: "visually-hidden" }, `${metric.label} per day and function`),
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Day"), series.map((fn) => h("th", { scope: "col" }, fn.name)), h("th", { scope: "col" }, "Total"))),
        h(
          "tbody",
          {},
          usedDaysList.map((day) => h("tr", {}, h("th", { scope: "row" }, day), series.map((fn) => h("td", { class: "num" }, metric.format(fn.byDay.get(day) || 0))), h("td", { class: "num" }, metric.format(totals[days.indexOf(day)])))),
        ),
      )
    : h("p", { class: "muted" }, "No day had any.");
  return { svg, legend, table };
}

/**
 * The month so far, day by day (the running total of the caller's `kind`-hours, up to today), with
 * each budget's limit as a horizontal line.
 */
function budgetChart(answer, kind, budgets, width, provider) {
  const seconds = kind === "CPU" ? (g) => g.cpu_core_seconds : (g) => g.gpu_seconds;
  const { days, functions } = perDay(answer, (g) => seconds(g) / 3600);
  const end = today();
  let sum = 0;
  const running = [];
  for (const day of days) {
    if (day > end) break;
    sum += functions.reduce((total, fn) => total + (fn.byDay.get(day) || 0), 0);
    running.push(sum);
  }
  const limits = budgets.map((b) => ({ budget: b, limit: kind === "CPU" ? b.cpu_hours : b.gpu_hours }));
  const max = Math.max(sum, ...limits.map((l) => l.limit));
  const height = 200;
  const margin = { top: 22, right: 10, bottom: 30, left: 72 };
  const plotW = width - margin.left - margin.right;
  const plotH = height - margin.top - margin.bottom;
  const step = max > 0 ? tickStep(max, 4, false) : 1;
  const top = max > 0 ? Math.ceil((max * 1.05) / step) * step : step * 4;
  const y = (v) => margin.top + plotH - (v / top) * plotH;
  const band = days.length ? plotW / days.length : plotW;
  const x = (i) => margin.left + band * i + band / 2;
  const titleId = uid("budget-title");
  const descId = uid("budget-desc");
  const whose = provider ? "these jobs'" : "your jobs'";
  const svg = s(
    "svg",
    { class: "chart budget-chart", "data-kind": kind, viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-labelledby": `${titleId} ${descId}` },
    s("title", { id: titleId }, `${kind}-hours used so far this month against the budget`),
    s(
      "desc",
      { id: descId },
      `The running total of ${whose} ${kind}-hours from ${answer.from} to ${running.length ? days[running.length - 1] : answer.from}: ${hours(sum)}. `,
      limits.map((l) => `The ${l.budget.kind} ${l.budget.name} budget is ${hours(l.limit)} ${kind}-hours a month. `),
    ),
  );
  const axis = s("g", { class: "axis" });
  for (let v = 0; v <= top + step / 2; v += step) {
    axis.append(
      s("line", { x1: margin.left, x2: width - margin.right, y1: y(v), y2: y(v), class: v === 0 ? "baseline" : "grid" }),
      s("text", { x: margin.left - 6, y: y(v) + 4, "text-anchor": "end" }, hours(v)),
    );
  }
  const labelEvery = Math.max(1, Math.ceil(days.length / Math.max(2, Math.floor(plotW / 26))));
  days.forEach((day, i) => {
    if (i % labelEvery === 0) axis.append(s("text", { x: x(i), y: height - margin.bottom + 16, "text-anchor": "middle", class: "day" }, String(Number(day.slice(8)))));
  });
  svg.append(axis);
  for (const { budget, limit } of limits) {
    // Whose it is goes in the line's label only when there are several (the list above names them).
    const whoseLine = `${budget.kind} ${budget.name}`;
    const short = whoseLine.length > 24 ? `${whoseLine.slice(0, 23)}…` : whoseLine;
    svg.append(
      s(
        "g",
        { class: "budget-line", "data-limit": limit, "data-budget": whoseLine },
        s("line", { x1: margin.left, x2: width - margin.right, y1: y(limit), y2: y(limit) }, s("title", {}, `Budget of ${whoseLine}: ${hours(limit)} ${kind}-hours a month`)),
        s("text", { x: width - margin.right, y: y(limit) - 5, "text-anchor": "end" }, `Budget: ${hours(limit)} ${kind}-hours${limits.length > 1 ? ` (${short})` : ""}`),
      ),
    );
  }
  if (running.length) {
    const points = running.map((v, i) => `${x(i)},${y(v)}`).join(" ");
    svg.append(
      s(
        "g",
        { class: "used-line" },
        s("polyline", { points }, s("title", {}, `Used so far: ${hours(sum)} ${kind}-hours`)),
        s("circle", { cx: x(running.length - 1), cy: y(sum), r: 3.5 }),
      ),
    );
  }
  return h("figure", { class: "budget-figure" }, svg, h("figcaption", { class: "muted" }, `${kind}-hours used this month, day by day (${whose} running total: ${hours(sum)}), and the budget as a line.`));
}
