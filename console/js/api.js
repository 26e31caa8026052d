// The gateway's public API, as any client calls it. The token lives in this tab's
// sessionStorage only and leaves the page only in the `Authorization: Bearer` header: never in a
// URL, never in a cookie, never in localStorage.

const TOKEN_KEY = "gantry.token";
export const API = "/api/v1/";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function saveToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** An answer the gateway refused, with its message as sent (`message`, or `detail` for 401). */
export class ApiError extends Error {
  constructor(status, body, fallback) {
    const text = (body && (body.message ?? body.detail)) || fallback || `HTTP ${status}`;
    super(typeof text === "string" ? text : JSON.stringify(text));
    this.status = status;
    // The status's reason phrase (`Bad Request`), for an answer; none when nothing answered.
    this.statusText = status > 0 ? fallback || "" : "";
    this.body = body;
    this.path = body && Array.isArray(body.path) ? body.path : null;
  }
}

const listeners = new Set();
/** Called with the error whenever the gateway answers 401 (the token is no longer accepted). */
export function onUnauthorized(listener) {
  listeners.add(listener);
}

/** A query value sent as the empty text (`name=`), which other empty values are not. */
export const BLANK = Symbol("blank");

/** `path` below /api/v1/ with `query` (an object; empty values left out, `BLANK` sent empty). */
export function url(path, query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query || {})) {
    if (value === BLANK) params.set(name, "");
    else if (value !== undefined && value !== null && value !== "") params.set(name, String(value));
  }
  const text = params.toString();
  return API + path + (text ? `?${text}` : "");
}

/** Headers of every API call. */
export function headers(extra, bearer = token()) {
  const all = new Headers(extra || {});
  if (bearer) all.set("Authorization", `Bearer ${bearer}`);
  return all;
}

/**
 * Sends one request and returns the raw Response once it is a success; a refusal becomes an
 * ApiError carrying the gateway's message. `body` may be a plain object (sent as JSON) or
 * FormData.
 */
export async function send(method, path, { query, body, signal, bearer, extraHeaders } = {}) {
  const init = { method, signal, headers: headers(extraHeaders, bearer), cache: "no-store" };
  if (body instanceof FormData) {
    init.body = body;
  } else if (body !== undefined) {
    init.headers.set("Content-Type", "application/json");
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url(path, query), init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    if (error instanceof TypeError && /header/i.test(error.message)) {
      throw new ApiError(0, null, "The token has characters that cannot be sent in a header.");
    }
    throw new ApiError(0, null, `The gateway could not be reached (${error.message}).`);
  }
  if (response.ok) return response;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  const error = new ApiError(response.status, data, response.statusText);
  if (response.status === 401) for (const listener of listeners) listener(error);
  throw error;
}

/** Like `send`, then the JSON body (null for 204). */
export async function call(method, path, options) {
  const response = await send(method, path, options);
  if (response.status === 204) return null;
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

export const get = (path, query, options) => call("GET", path, { ...options, query });

/** Downloads an API answer as a file: fetched with the header, saved from a blob URL. */
export async function download(path, query, fileName) {
  const response = await send("GET", path, { query });
  saveBlob(await response.blob(), fileName);
}

export function saveBlob(blob, fileName) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = fileName;
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}
