// Talking to the server: the API key on every call, a streamed chat reply that survives a
// reload (resumable streams), reattaching, stopping, and ending a thought.

import { readEvents } from "./sse.js";
import { getKey } from "./store.js";

// set when the page is going away (a reload, a close): the browser then cuts every open
// stream, which must not be recorded as the reply having been interrupted
export const page = { leaving: false };
addEventListener("pagehide", () => { page.leaving = true; });
addEventListener("pageshow", () => { page.leaving = false; });

export class HttpError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

export function headers(extra = {}) {
  const h = { ...extra };
  const key = getKey();
  // x-api-key, not Authorization: behind Cloud Run's IAM (or `gcloud run services proxy`)
  // Authorization carries the caller's Google token
  if (key) h["x-api-key"] = key;
  return h;
}

export async function api(path, { method = "GET", body, signal, extraHeaders } = {}) {
  const init = { method, headers: headers(extraHeaders), signal, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  return fetch(path, init);
}

export async function errorOf(resp) {
  let body = null;
  let message = `HTTP ${resp.status}`;
  try {
    body = await resp.json();
    const e = body?.error;
    if (e) message = typeof e === "string" ? e : e.message || message;
  } catch {
    // not JSON
  }
  return new HttpError(resp.status, message, body);
}

// One assistant message being written: the fields the page shows and keeps.
export function newReply() {
  return {
    role: "assistant",
    content: "",
    reasoning: "",
    tool_calls: [],
    status: "streaming", // streaming | done | stopped | error | interrupted
    stream: null,        // {id, offset}: the resumable stream and the bytes applied so far
    chatId: null,        // the chatcmpl id (for reasoning control)
    usage: null,
    finish: null,
    error: null,
    thoughtEnded: false,
    t: { sent: Date.now(), first: null, last: null },
  };
}

// Apply one SSE event's data to a reply; true once the stream said it is over.
export function applyEvent(reply, data) {
  if (data === "[DONE]") return true;
  let obj;
  try {
    obj = JSON.parse(data);
  } catch {
    return false;
  }
  if (obj.error) {
    reply.error = typeof obj.error === "string" ? obj.error : obj.error.message || "error";
    return false;
  }
  if (obj.id && !reply.chatId) reply.chatId = obj.id;
  if (obj.usage) reply.usage = obj.usage;
  const choice = obj.choices?.[0];
  if (!choice) return false;
  const d = choice.delta || {};
  let wrote = false;
  const thought = d.reasoning_content ?? d.reasoning;
  if (thought) {
    reply.reasoning += thought;
    wrote = true;
  }
  if (d.content) {
    reply.content += d.content;
    if (reply.reasoning) reply.thoughtEnded = true;
    wrote = true;
  }
  for (const tc of d.tool_calls || []) {
    const i = tc.index ?? reply.tool_calls.length;
    const call = reply.tool_calls[i] || (reply.tool_calls[i] = { id: "", name: "", arguments: "" });
    if (tc.id) call.id = tc.id;
    if (tc.function?.name) call.name += tc.function.name;
    if (tc.function?.arguments) call.arguments += tc.function.arguments;
    if (reply.reasoning) reply.thoughtEnded = true;
    wrote = true;
  }
  if (wrote) {
    reply.pieces = (reply.pieces || 0) + 1; // one delta a token: the count until usage comes
    const now = Date.now();
    if (!reply.t.first) reply.t.first = now;
    reply.t.last = now;
  }
  if (choice.finish_reason) reply.finish = choice.finish_reason;
  return false;
}

// Drives one reply's stream. `changed()` is called after every applied event, `save()` when
// the reply's state should be kept (the caller throttles), `ended()` once it is over.
export class Generation {
  constructor(reply, { changed, save, ended }) {
    this.reply = reply;
    this.changed = changed;
    this.save = save;
    this.ended = ended;
    this.abort = new AbortController();
    this.stopping = false;
    this.retries = 0;
  }

  get streamId() {
    return this.reply.stream.id;
  }

  // POST the request with X-Conversation-Id: the server keeps the stream's bytes
  async start(path, body) {
    const resp = await api(path, {
      method: "POST",
      body,
      signal: this.abort.signal,
      extraHeaders: { "X-Conversation-Id": this.streamId },
    }).catch((err) => err);
    return this.follow(resp);
  }

  // GET /v1/stream from the last complete event applied
  async resume() {
    const { id, offset } = this.reply.stream;
    const q = `conv_id=${encodeURIComponent(id)}&from=${offset}`;
    let resp = await api(`/v1/stream?${q}`, { signal: this.abort.signal }).catch((err) => err);
    if (resp instanceof Response && resp.status === 400 && offset > 0) {
      // the server no longer holds that offset: start over from its first byte
      Object.assign(this.reply, { content: "", reasoning: "", tool_calls: [], usage: null,
                                  thoughtEnded: false, error: null });
      this.reply.stream.offset = 0;
      resp = await api(`/v1/stream?conv_id=${encodeURIComponent(id)}&from=0`,
                       { signal: this.abort.signal }).catch((err) => err);
    }
    return this.follow(resp, true);
  }

  async follow(resp, resuming = false) {
    const reply = this.reply;
    if (page.leaving) return null;
    if (!(resp instanceof Response)) {
      return this.finish(this.stopping ? "stopped" : "interrupted",
                         this.stopping ? null : `connection failed: ${resp?.message || resp}`);
    }
    if (!resp.ok) {
      const err = await errorOf(resp);
      if (resuming && resp.status === 404) {
        return this.finish("interrupted", "the server no longer holds this reply's stream");
      }
      return this.finish("error", err.message, err);
    }
    let over = false;
    try {
      await readEvents(resp.body, (ev, bytes) => {
        if (ev.comment) return; // a heartbeat: not part of the stored body
        reply.stream.offset += bytes;
        if (ev.data !== null && applyEvent(reply, ev.data)) over = true;
        this.changed();
        this.save(false);
      });
    } catch (err) {
      if (this.stopping) return this.finish("stopped");
      if (page.leaving) return null; // a reload: the next page reattaches
      if (this.retries < 3 && reply.stream.offset > 0) {
        // a cut connection: the server still holds the stream, reattach from the last event
        this.retries++;
        await new Promise((r) => setTimeout(r, 500 * this.retries));
        return this.resume();
      }
      return this.finish("interrupted", `the connection broke: ${err?.message || err}`);
    }
    if (page.leaving) return null;
    if (this.stopping) return this.finish("stopped");
    if (over || reply.finish || reply.error) return this.finish(reply.error ? "error" : "done", reply.error);
    // ended without a finish: the strict profile ends without [DONE]; the finish chunk tells
    return this.finish("interrupted", "the stream ended before the reply was complete");
  }

  finish(status, error = null, exc = null) {
    const reply = this.reply;
    if (reply.status !== "streaming" || page.leaving) return status;
    reply.status = status;
    if (error && !reply.error) reply.error = error;
    if (!reply.t.last) reply.t.last = Date.now();
    this.changed();
    this.save(true);
    this.ended(status, exc);
    return status;
  }

  // Stop: the server ends the generation (DELETE); the open response is dropped too
  async stop() {
    this.stopping = true;
    try {
      await api(`/v1/stream?conv_id=${encodeURIComponent(this.streamId)}`, { method: "DELETE" });
    } catch {
      // the abort below still ends it when the server does not keep streams
    }
    this.abort.abort();
  }

  // "Stop thinking": the server injects the end of the thought
  async stopThinking() {
    if (!this.reply.chatId) return false;
    const resp = await api("/v1/chat/completions/control", {
      method: "POST",
      body: { id: this.reply.chatId, action: "reasoning_end" },
    });
    if (!resp.ok) return false;
    const ok = (await resp.json()).success === true;
    if (ok) {
      this.reply.thoughtStopped = true;
      this.changed();
    }
    return ok;
  }
}

// POST /v1/streams/lookup: which of these streams the server still holds
export async function lookup(ids) {
  if (!ids.length) return new Map();
  const resp = await api("/v1/streams/lookup", { method: "POST", body: { conversation_ids: ids } });
  if (!resp.ok) throw await errorOf(resp);
  const list = await resp.json();
  return new Map((Array.isArray(list) ? list : []).map((s) => [s.conversation_id, s]));
}
