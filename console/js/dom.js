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

const DATE_TIME = { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" };
const TIME = { hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" };

/**
 * A moment as the reader's local time with its zone (`May 1, 2024, 12:00:00 PM GMT+2`); the
 * full ISO time, in UTC, in the tooltip and the `datetime` attribute.
 */
export function when(text) {
  if (!text) return "";
  const date = new Date(text);
  if (Number.isNaN(date.getTime())) return text;
  return h("time", { datetime: date.toISOString(), title: date.toISOString() }, date.toLocaleString(undefined, DATE_TIME));
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

/** How many times an error answer that may pass (a 500) is asked again before the page stops. */
export const ANSWER_RETRIES = 3;

/** Whether the gateway answered at all (an ApiError with an HTTP status), or could not be reached. */
export function answered(error) {
  return Boolean(error && error.status > 0);
}

/**
 * When to ask again after the `failures`-th failure in a row, or null to stop asking:
 * - no answer (the gateway stopped, restarting, the network gone), or an answer that says "not
 *   now" (408, 429, 502, 503, 504): every `ms`, for as long as it lasts, so a page recovers by
 *   itself when the gateway is back;
 * - any other server error (500 …): `ms`, then twice, then four times as long, `ANSWER_RETRIES`
 *   times, then stop (the page offers Retry);
 * - a refusal (400, 403, 404 …): never; asking again would get the same answer.
 */
export function retryDelay(error, failures, ms) {
  if (!answered(error) || NOT_NOW.includes(error.status)) return ms;
  if (bounded(error) && failures <= ANSWER_RETRIES) return ms * 2 ** (failures - 1);
  return null;
}

/** Answers that say "not now": asked again at the same pace for as long as they last. */
const NOT_NOW = [408, 429, 502, 503, 504];

/** Whether an error is an answer that is asked again only a few times (a 500 …). */
export function bounded(error) {
  return answered(error) && error.status >= 500 && !NOT_NOW.includes(error.status);
}

/**
 * Calls `task` every `ms` while the page is visible, one call at a time (the next waits for the
 * previous to finish), until the returned stop function is called. Hidden pages are not polled;
 * becoming visible again polls at once. A failed call is asked again as `retryDelay` says (so a
 * view recovers by itself when the gateway is back, and an error answer is not asked forever);
 * `health` (a `freshness()`) hears each outcome and, when the poll stops asking, gets a Retry
 * that starts it again. With `now`, the first call is made at once.
 */
export function poll(task, ms, health = null, { now = false } = {}) {
  let timer = null;
  let stopped = false;
  let running = false;
  let failures = 0;
  let gaveUp = false;
  const tick = async () => {
    timer = null;
    if (stopped || running || gaveUp) return;
    if (document.hidden) return;
    running = true;
    let delay = ms;
    try {
      await task();
      failures = 0;
      if (health && !stopped) health.ok();
    } catch (error) {
      failures += 1;
      delay = retryDelay(error, failures, ms);
      if (delay === null) gaveUp = true;
      if (stopped) {
        // Nothing to say: the page is gone.
      } else if (!health) {
        console.warn("poll failed", error);
      } else if (gaveUp) {
        health.gaveUp(error, retry);
      } else {
        health.failed(error, delay, bounded(error) ? failures : null);
      }
    } finally {
      running = false;
    }
    if (!stopped && !gaveUp && !document.hidden) timer = setTimeout(tick, delay);
  };
  const retry = () => {
    if (stopped || running) return;
    gaveUp = false;
    failures = 0;
    if (timer) clearTimeout(timer);
    tick();
  };
  const onVisible = () => {
    if (!document.hidden && !timer && !running && !stopped && !gaveUp) tick();
  };
  document.addEventListener("visibilitychange", onVisible);
  timer = setTimeout(tick, now ? 0 : ms);
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    document.removeEventListener("visibilitychange", onVisible);
  };
}

function clock(date) {
  return h("time", { datetime: date.toISOString(), title: date.toISOString() }, date.toLocaleTimeString(undefined, TIME));
}

/** What went wrong, in words: the gateway's answer (status and message), or that none came. */
export function failure(error) {
  const message = error && error.message ? String(error.message).replace(/\.$/, "") : "no answer";
  if (!answered(error)) return message;
  const status = `${error.status}${error.statusText ? ` ${error.statusText}` : ""}`;
  return message === error.statusText || message === `HTTP ${error.status}` ? `The gateway answered ${status}` : `The gateway answered ${status}: ${message}`;
}

/**
 * The line a live view shows about its connection: when it last heard from the gateway, and,
 * while its reads fail, what failed (the gateway's status and message, or that it could not be
 * reached) and whether it is asked again. Views whose data may be stale carry `data-stale` on
 * `dims` (styled dimmed). Only changes of state are read out. States: "waiting", "live",
 * "retrying", "stopped" (it is no longer asked: a Retry button), "ended" (a job that ended:
 * nothing more will come; final).
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
      if (next === "retrying" || next === "stopped") dims.dataset.stale = "true";
      else delete dims.dataset.stale;
    }
  };
  return {
    element,
    get state() {
      return state;
    },
    /** Heard from the gateway just now. */
    ok() {
      if (state === "ended") return;
      last = new Date();
      fill(text, "Live · updated ", clock(last));
      move("live", "Connected to the gateway again.");
    },
    /** A read failed and is asked again in `ms` (`attempt`: the how-manieth of a bounded few). */
    failed(error, ms, attempt = null) {
      if (state === "ended") return;
      const why = failure(error);
      const retry = attempt
        ? ` Asking again in ${Math.round(ms / 1000)} s (${attempt} of ${ANSWER_RETRIES})…`
        : ms
          ? ` Retrying every ${Math.round(ms / 1000)} s…`
          : " Retrying…";
      const before = last
        ? ["Last heard from the gateway at ", clock(last), ", so what is shown may be out of date."]
        : answered(error)
          ? null
          : "Nothing has been heard from the gateway yet.";
      fill(text, `${why}. `, before, retry);
      move("retrying", `${why}. Retrying.`);
    },
    /** A read failed and is not asked again by itself; `retry` (if any) asks again. */
    gaveUp(error, retry = null) {
      if (state === "ended") return;
      const why = failure(error);
      const button = retry ? h("button", { type: "button", class: "quiet small retry" }, "Retry") : null;
      if (button) {
        button.addEventListener("click", () => {
          fill(text, "Asking the gateway again…");
          retry();
        });
      }
      const note =
        answered(error) && error.status < 500
          ? " Asking again would get the same answer, so the page stopped asking."
          : bounded(error)
            ? ` Asked ${ANSWER_RETRIES + 1} times; the page stopped asking.`
            : " The page stopped asking.";
      fill(text, `${why}.`, note, last ? [" Last heard from the gateway at ", clock(last), "."] : null, button ? " " : null, button);
      move("stopped", `${why}. Stopped asking.`);
    },
    /** The job ended (`what`: its last status, `at`: when, if known); nothing more will come. Final. */
    ended(what, at = null) {
      const moment = at ? new Date(at) : null;
      const known = moment && !Number.isNaN(moment.getTime());
      fill(text, `Ended · ${what}`, known ? [" at ", clock(moment)] : null, ". Nothing more will come: what is shown is final.");
      move("ended", `The job ended: ${what}.`);
    },
  };
}
