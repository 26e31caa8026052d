// Small DOM helpers. Text always goes in as text (never parsed as HTML), so nothing the gateway
// returns can inject markup; and no inline style is ever set, as the page's policy wants.

/** `h("a", {href: "#/jobs", class: "x", onclick: f}, "text", child)` */
export function h(tag, props, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      element.className = value;
    } else if (name in element && typeof value !== "string") {
      element[name] = value;
    } else {
      element.setAttribute(name, value === true ? "" : value);
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
}

/** Replaces an element's children. */
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

let counter = 0;
/** A unique id for a label's `for`. */
export function uid(prefix = "f") {
  counter += 1;
  return `${prefix}-${counter}`;
}

/** A labelled control: returns [wrapper, control]. */
export function field(labelText, control, hint) {
  control.id ||= uid();
  const parts = [h("label", { for: control.id }, labelText), control];
  if (hint) {
    const hintId = uid("hint");
    control.setAttribute("aria-describedby", hintId);
    parts.push(h("small", { id: hintId, class: "hint" }, hint));
  }
  return h("div", { class: "field" }, parts);
}

export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "STOPPED"]);
export const STATUSES = ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"];

export function statusBadge(status, subStatus) {
  const label = subStatus && status === "RUNNING" ? `${status}: ${subStatus}` : status || "?";
  return h("span", { class: `badge status-${String(status || "unknown").toLowerCase()}`, "data-status": status }, label);
}

export function when(text) {
  if (!text) return "";
  const date = new Date(text);
  if (Number.isNaN(date.getTime())) return text;
  return h("time", { datetime: text, title: text }, date.toLocaleString());
}

/** A message line: kind is "error", "ok" or "info"; role=alert for errors so it is read out. */
export function notice(kind, text) {
  return h("p", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

/** JSON text pretty-printed when it parses, else as is. */
export function pretty(text) {
  if (typeof text !== "string") return JSON.stringify(text, null, 2);
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** The route's query (after `?` in the hash) as an object. */
export function routeQuery() {
  const hash = location.hash.slice(1);
  const at = hash.indexOf("?");
  return Object.fromEntries(new URLSearchParams(at < 0 ? "" : hash.slice(at + 1)));
}

/** A hash route with query; empty values left out. */
export function route(path, query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") params.set(name, String(value));
  }
  const text = params.toString();
  return `#/${path}${text ? `?${text}` : ""}`;
}

/** A function's name as users write it: `provider/title` or `title`. */
export function functionName(title, provider) {
  return provider ? `${provider}/${title}` : title || "(deleted function)";
}

/**
 * Calls `task` every `ms` while the page is visible, one call at a time (the next waits for the
 * previous to finish), until the returned stop function is called. Hidden pages are not polled;
 * becoming visible again polls at once. A failed call is tried again at the same pace (so a view
 * recovers by itself when the gateway is back); `health` (a `freshness()`) hears each outcome.
 */
export function poll(task, ms, health = null) {
  let timer = null;
  let stopped = false;
  let running = false;
  const tick = async () => {
    timer = null;
    if (stopped || running) return;
    if (document.hidden) return;
    running = true;
    try {
      await task();
      if (health && !stopped) health.ok();
    } catch (error) {
      if (health && !stopped) health.failed(error, ms);
      else console.warn("poll failed", error);
    } finally {
      running = false;
    }
    if (!stopped && !document.hidden) timer = setTimeout(tick, ms);
  };
  const onVisible = () => {
    if (!document.hidden && !timer && !running && !stopped) tick();
  };
  document.addEventListener("visibilitychange", onVisible);
  timer = setTimeout(tick, ms);
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    document.removeEventListener("visibilitychange", onVisible);
  };
}

function clock(date) {
  return h("time", { datetime: date.toISOString() }, date.toLocaleTimeString());
}

/**
 * The line a live view shows about its connection: when it last heard from the gateway, and,
 * while its reads fail, that they fail and are being retried. Views whose data may be stale
 * carry `data-stale` on `dims` (styled dimmed). Only changes of state are read out.
 */
export function freshness(dims = null) {
  const text = h("span", { class: "freshness-text" });
  const said = h("span", { class: "visually-hidden", "aria-live": "polite" });
  const element = h("p", { class: "freshness", "data-state": "waiting" }, text, said);
  let last = null;
  let state = "waiting";
  const move = (next, announcement) => {
    if (state !== next) said.textContent = announcement;
    state = next;
    element.dataset.state = next;
    if (dims) {
      if (next === "retrying") dims.dataset.stale = "true";
      else delete dims.dataset.stale;
    }
  };
  return {
    element,
    get state() {
      return state;
    },
    ok() {
      last = new Date();
      fill(text, "Live · updated ", clock(last));
      move("live", "Connected to the gateway again.");
    },
    failed(error, ms) {
      const why = error && error.message ? error.message.replace(/\.$/, "") : "no answer";
      const retry = ms ? ` Retrying every ${Math.round(ms / 1000)} s…` : " Retrying…";
      fill(
        text,
        `${why}. `,
        last ? ["Last heard from the gateway at ", clock(last), ", so what is shown may be out of date."] : "Nothing has been heard from the gateway yet.",
        retry,
      );
      move("retrying", `${why}. Retrying.`);
    },
  };
}
