// Following a live answer with fetch() (EventSource cannot send the Authorization header):
// the body is read as it arrives, and a dropped connection is resumed where it stopped, so
// nothing is shown twice and nothing is missed.
//
// - Logs (`logs/stream/`, `provider-logs/stream/`) are read as plain text; the bytes received
//   so far are the `offset` of the next connection (the gateway's byte offsets are exact).
// - Events (`events/stream/`) are Server-Sent Events; the last `id:` seen goes back as
//   `Last-Event-ID`. A server that is shutting down sends `event: restarting` and closes: the
//   stream is opened again (on the next server) instead of waiting on a dead connection.
//
// Retries back off to at most RETRY_MOST_MS, so a page is live again within seconds of the
// gateway coming back.

import { send } from "./api.js";
import { retryDelay } from "./dom.js";

const RETRY_FIRST_MS = 500;
const RETRY_MOST_MS = 4000;

/**
 * Follows `path`. `kind` is "text" (calls `onText(text)`) or "sse" (calls
 * `onEvent({event, id, data})`). When the gateway ends the answer, `finished()` says whether
 * that was the end (the job ended) or the connection should be opened again. `onState(state,
 * error)` hears "live", "reconnecting" (with the error, if any), "ended", "failed". Returns a
 * stop function.
 */
export function follow(path, { kind, onText, onEvent, onState = () => {}, finished = async () => true }) {
  let stopped = false;
  let controller = null;
  let failures = 0;
  let timer = null;
  let offset = 0; // text: bytes received
  let lastId = null; // sse: last event id
  let decoder = new TextDecoder();
  let pending = ""; // sse: text not yet ending an event
  let restarting = false; // the server said it is shutting down
  let lastError = null;

  const deliverSse = (text) => {
    pending += text.replace(/\r\n?/g, "\n");
    let end;
    while ((end = pending.indexOf("\n\n")) >= 0) {
      const block = pending.slice(0, end);
      pending = pending.slice(end + 2);
      const message = { event: "message", id: null, data: [] };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (name === "event") message.event = value;
        else if (name === "id") message.id = value;
        else if (name === "data") message.data.push(value);
      }
      if (message.id !== null) lastId = message.id;
      if (message.event === "restarting") {
        restarting = true;
        continue;
      }
      if (message.data.length || message.event !== "message") {
        onEvent({ ...message, data: message.data.join("\n") });
      }
    }
  };

  const connect = async () => {
    timer = null;
    if (stopped) return;
    controller = new AbortController();
    try {
      const options = { signal: controller.signal };
      if (kind === "text") {
        options.query = { format: "text", offset: offset || undefined };
      } else {
        options.extraHeaders = { Accept: "text/event-stream" };
        if (lastId !== null) options.extraHeaders["Last-Event-ID"] = lastId;
        pending = "";
        decoder = new TextDecoder();
      }
      const response = await send("GET", path, options);
      onState("live");
      const reader = response.body.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        failures = 0;
        if (kind === "text") {
          offset += value.byteLength;
          const text = decoder.decode(value, { stream: true });
          if (text) onText(text);
        } else {
          deliverSse(decoder.decode(value, { stream: true }));
        }
      }
      if (stopped) return;
      if (restarting) {
        restarting = false;
        throw new Error("The gateway is restarting");
      }
      if (await finished()) {
        stopped = true;
        onState("ended");
        return;
      }
    } catch (error) {
      if (stopped || error.name === "AbortError") return;
      lastError = error;
      // A refusal (403, 404 …) will not change by asking again; another error answer (a 500)
      // is asked again a few times at most. No answer, or "not now" (502-504), is asked until
      // the gateway answers.
      const retry = retryDelay(error, failures + 1, RETRY_FIRST_MS);
      if (retry === null) {
        stopped = true;
        onState("failed", error);
        return;
      }
    }
    if (stopped) return;
    failures += 1;
    onState("reconnecting", lastError);
    lastError = null;
    timer = setTimeout(connect, Math.min(RETRY_FIRST_MS * 2 ** (failures - 1), RETRY_MOST_MS));
  };

  connect();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    if (controller) controller.abort();
  };
}
