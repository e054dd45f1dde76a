// The playground page: conversations in a sidebar, a chat with streamed replies (Markdown,
// thoughts apart, tool calls), settings, the API key, and the model's load progress.

import * as store from "./store.js";
import { render } from "./markdown.js";
import { api, errorOf, Generation, lookup, newReply, page } from "./chat.js";
import { readEvents } from "./sse.js";

const $ = (sel) => document.querySelector(sel);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const state = {
  conv: null,             // the open conversation
  open: new Map(),        // id -> conversation object, for those with a reply streaming
  running: new Map(),     // stream id -> {gen, conv, reply}
  model: null,
  ready: false,
  settings: store.loadSettings(),
};

// ---- conversations ---------------------------------------------------------------------

function newConversation() {
  return { id: store.newId(), title: "", created: Date.now(), messages: [] };
}

function getConversation(id) {
  return state.open.get(id) || store.loadConversation(id);
}

function generating(convId) {
  for (const r of state.running.values()) if (r.conv.id === convId) return r;
  return null;
}

function renderSidebar() {
  const list = $("#conversations");
  list.replaceChildren();
  for (const c of store.listConversations()) {
    const li = el("li");
    li.dataset.id = c.id;
    if (state.conv && state.conv.id === c.id) li.classList.add("active");
    const open = el("button", "conv-open", c.title || "New chat");
    open.type = "button";
    open.title = c.title || "";
    open.addEventListener("click", () => { openConversation(c.id); closeSidebar(); });
    li.append(open);
    if (generating(c.id)) {
      li.classList.add("generating");
      const spin = el("span", "spinner");
      spin.setAttribute("role", "status");
      spin.setAttribute("aria-label", "generating");
      li.append(spin);
    }
    const del = el("button", "conv-del", "\u00d7");
    del.type = "button";
    del.setAttribute("aria-label", "Delete conversation");
    del.addEventListener("click", () => removeConversation(c.id));
    li.append(del);
    list.append(li);
  }
}

function openConversation(id) {
  const conv = getConversation(id);
  if (!conv) return;
  state.conv = conv;
  renderSidebar();
  renderConversation();
}

function startNewChat() {
  state.conv = null;
  renderSidebar();
  renderConversation();
  closeSidebar();
  $("#input").focus();
}

async function removeConversation(id) {
  const run = generating(id);
  if (run) await run.gen.stop();
  store.deleteConversation(id);
  state.open.delete(id);
  if (state.conv && state.conv.id === id) state.conv = null;
  renderSidebar();
  renderConversation();
}

// ---- messages ------------------------------------------------------------------------------

const views = new Map(); // reply object -> its element refs (the open conversation only)

function renderConversation() {
  const box = $("#messages");
  box.replaceChildren();
  views.clear();
  const conv = state.conv;
  if (!conv || conv.messages.length === 0) {
    const empty = el("div", "empty");
    empty.append(el("h2", null, "Talk to the model"));
    empty.append(el("p", null, "Replies stream as they are generated. Thoughts show apart " +
      "from the answer; define tools in Settings to see tool calls."));
    box.append(empty);
  } else {
    for (const msg of conv.messages) box.append(messageView(msg));
  }
  updateComposer();
  scrollDown(true);
}

function messageView(msg) {
  if (msg.role === "user") {
    const art = el("article", "msg user");
    art.append(el("div", "bubble", msg.content));
    return art;
  }
  const art = el("article", "msg assistant");
  const thoughtWrap = el("div", "thought-wrap");
  const details = el("details", "thought");
  const summary = el("summary");
  const label = el("span", "thought-label");
  summary.append(label);
  const body = el("div", "thought-body");
  details.append(summary, body);
  details.open = msg.status === "streaming" && !msg.content && !msg.tool_calls.length;
  const stop = el("button", "stop-thinking", "Stop thinking");
  stop.type = "button";
  stop.addEventListener("click", async () => {
    stop.disabled = true;
    const run = msg.stream && state.running.get(msg.stream.id);
    const ok = run ? await run.gen.stopThinking().catch(() => false) : false;
    if (!ok) stop.disabled = false;
  });
  thoughtWrap.append(details, stop);
  const answer = el("div", "answer md");
  const tools = el("div", "tools");
  const error = el("div", "error");
  const stats = el("div", "stats");
  art.append(thoughtWrap, answer, tools, error, stats);
  const v = { art, thoughtWrap, details, label, body, stop, answer, tools, error, stats,
              shown: { content: null, reasoning: null, tools: null }, autoClosed: false };
  views.set(msg, v);
  updateView(msg, v);
  return art;
}

function updateView(msg, v) {
  const streaming = msg.status === "streaming";
  v.art.dataset.status = msg.status;
  // the thought
  const thinking = streaming && msg.reasoning && !msg.thoughtEnded && !msg.content &&
    !msg.tool_calls.length;
  v.thoughtWrap.hidden = !msg.reasoning;
  v.thoughtWrap.classList.toggle("live", Boolean(thinking));
  v.label.textContent = thinking ? "Thinking\u2026" : "Thought";
  if (v.shown.reasoning !== msg.reasoning) {
    v.body.textContent = msg.reasoning.replace(/^\s+/, "");
    v.shown.reasoning = msg.reasoning;
    if (v.details.open) v.body.scrollTop = v.body.scrollHeight;
  }
  v.stop.hidden = !thinking || msg.thoughtStopped;
  if (!thinking && streaming && !v.autoClosed && (msg.content || msg.tool_calls.length)) {
    v.details.open = false; // the answer started: fold the thought away (a click opens it)
    v.autoClosed = true;
  }
  // the answer
  if (v.shown.content !== msg.content) {
    v.answer.replaceChildren(render(msg.content));
    v.shown.content = msg.content;
  }
  v.answer.hidden = !msg.content;
  if (streaming && !msg.content && !msg.reasoning && !msg.tool_calls.length) {
    v.answer.hidden = false;
    v.answer.replaceChildren(el("span", "typing"));
    v.shown.content = null;
  }
  // tool calls, as they stream
  const sig = JSON.stringify(msg.tool_calls.map((c) => [c.name, c.arguments])) + msg.status;
  if (v.shown.tools !== sig) {
    v.tools.replaceChildren(...msg.tool_calls.map((c) => toolView(msg, c)));
    v.shown.tools = sig;
  }
  // errors and numbers
  v.error.hidden = !msg.error;
  v.error.textContent = msg.error ? errorText(msg) : "";
  v.stats.textContent = statsText(msg);
}

function errorText(msg) {
  const what = { stopped: "Stopped", interrupted: "Interrupted", error: "Error" }[msg.status] ||
    "Error";
  return `${what}: ${msg.error}`;
}

function toolView(msg, call) {
  const box = el("div", "tool-call");
  const head = el("div", "tool-head");
  head.append(el("span", "tool-badge", "tool call"), el("span", "tool-name", call.name || "\u2026"));
  box.append(head);
  let args = call.arguments;
  if (msg.status !== "streaming") {
    try { args = JSON.stringify(JSON.parse(call.arguments), null, 2); } catch { /* as sent */ }
  }
  box.append(el("pre", "tool-args", args));
  if (msg.status !== "streaming" && call.id) {
    const result = el("input", "tool-result");
    result.placeholder = "Tool result (sent with your next message)";
    result.value = call.result || "";
    result.addEventListener("change", () => {
      call.result = result.value;
      if (state.conv) store.saveQuietly(state.conv);
    });
    box.append(result);
  }
  return box;
}

function statsText(msg) {
  const parts = [];
  const u = msg.usage;
  // while it streams: one delta a token; at the end: the server's usage
  const tokens = u ? u.completion_tokens : msg.pieces || 0;
  if (tokens) parts.push(tokens === 1 ? "1 token" : `${tokens} tokens`);
  if (u?.prompt_tokens !== undefined) parts.push(`prompt ${u.prompt_tokens}`);
  const cached = u?.prompt_tokens_details?.cached_tokens;
  if (cached) parts.push(`cached ${cached}`);
  const secs = msg.t.first && msg.t.last ? (msg.t.last - msg.t.first) / 1000 : 0;
  if (tokens > 1 && secs > 0) parts.push(`${((tokens - 1) / secs).toFixed(1)} tokens/s`);
  if (msg.status === "streaming") parts.push(tokens ? "streaming" : "waiting");
  else if (msg.status === "stopped") parts.push("stopped");
  else if (msg.finish) parts.push(msg.finish);
  return parts.join(" \u00b7 ");
}

const pendingRender = new Set();

function scheduleRender(reply) {
  if (pendingRender.size === 0) requestAnimationFrame(flushRenders);
  pendingRender.add(reply);
}

function flushRenders() {
  const near = nearBottom();
  for (const reply of pendingRender) {
    const v = views.get(reply);
    if (v) updateView(reply, v);
  }
  pendingRender.clear();
  if (near) scrollDown(true);
}

function nearBottom() {
  const box = $("#messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function scrollDown(force) {
  const box = $("#messages");
  if (force) box.scrollTop = box.scrollHeight;
}

// ---- sending -------------------------------------------------------------------------------

function requestBody(conv) {
  const s = state.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of conv.messages) {
    if (m.role === "user") {
      messages.push({ role: "user", content: m.content });
    } else if (m.tool_calls?.length) {
      messages.push({
        role: "assistant",
        content: m.content || null,
        tool_calls: m.tool_calls.map((c) => ({ id: c.id, type: "function",
                                               function: { name: c.name, arguments: c.arguments } })),
      });
      for (const c of m.tool_calls) {
        messages.push({ role: "tool", tool_call_id: c.id, content: c.result || "" });
      }
    } else if (m.content) {
      messages.push({ role: "assistant", content: m.content });
    }
  }
  const body = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
    reasoning_control: true,
    temperature: Number(s.temperature),
    max_tokens: Number(s.max_tokens),
  };
  if (state.model) body.model = state.model;
  if (String(s.reasoning_budget).trim() !== "") body.reasoning_budget = Number(s.reasoning_budget);
  const tools = parseJson(s.tools, null);
  if (Array.isArray(tools) && tools.length) {
    body.tools = tools;
    body.tool_choice = s.tool_choice;
  }
  Object.assign(body, parseJson(s.extra, {}));
  return body;
}

function parseJson(text, fallback) {
  if (!text || !String(text).trim()) return fallback;
  try {
    return JSON.parse(text);
  } catch {
    return fallback;
  }
}

function send() {
  const input = $("#input");
  const text = input.value.trim();
  if (!text || !state.ready) return;
  if (state.conv && generating(state.conv.id)) return;
  if (!state.conv) state.conv = newConversation();
  const conv = state.conv;
  if (!conv.title) conv.title = text.replace(/\s+/g, " ").slice(0, 60);
  conv.messages.push({ role: "user", content: text });
  const body = requestBody(conv);
  const reply = newReply();
  reply.stream = { id: store.newId(), offset: 0 };
  conv.messages.push(reply);
  input.value = "";
  store.saveConversation(conv);
  run(conv, reply, (gen) => gen.start("/v1/chat/completions", body));
  renderSidebar();
  renderConversation();
}

function run(conv, reply, how) {
  let last = 0;
  let timer = null;
  const save = (force) => {
    clearTimeout(timer);
    const now = Date.now();
    if (force || now - last > 250) {
      last = now;
      store.saveQuietly(conv);
    } else {
      timer = setTimeout(() => save(true), 250);
    }
  };
  const gen = new Generation(reply, {
    changed: () => scheduleRender(reply),
    save,
    ended: (status, exc) => {
      clearTimeout(timer);
      state.running.delete(reply.stream.id);
      const v = views.get(reply);
      if (v) updateView(reply, v); // its end shows together with the composer's and sidebar's
      if (![...state.running.values()].some((r) => r.conv === conv)) state.open.delete(conv.id);
      store.saveQuietly(conv);
      renderSidebar();
      updateComposer();
      if (exc?.status === 401) askForKey(true);
      else if (exc?.status === 503) connect();
    },
  });
  state.open.set(conv.id, conv);
  state.running.set(reply.stream.id, { gen, conv, reply });
  how(gen);
}

// a reload: everything the running replies hold goes to storage now
addEventListener("pagehide", () => {
  for (const { conv } of state.running.values()) store.saveQuietly(conv);
});

// Replies that were streaming when the page went away: reattach to those the server holds
async function reattach() {
  const pending = [];
  for (const { id } of store.listConversations()) {
    const conv = store.loadConversation(id);
    if (!conv) continue;
    for (const m of conv.messages) {
      if (m.role === "assistant" && m.status === "streaming" && m.stream) pending.push({ conv, m });
    }
  }
  if (!pending.length) return;
  let found = new Map();
  try {
    found = await lookup(pending.map((p) => p.m.stream.id));
  } catch (err) {
    console.warn("stream lookup failed", err);
  }
  for (const { conv, m } of pending) {
    const live = state.conv && state.conv.id === conv.id ? state.conv : (state.open.get(conv.id) || conv);
    const reply = live.messages.find((x) => x.stream && x.stream.id === m.stream.id) || m;
    if (found.has(reply.stream.id)) {
      run(live, reply, (gen) => gen.resume());
    } else {
      reply.status = "interrupted";
      reply.error = "the page was reloaded and the server no longer holds this reply";
      store.saveQuietly(live);
    }
  }
  if (state.conv) {
    const fresh = state.open.get(state.conv.id);
    if (fresh) state.conv = fresh;
  }
  renderSidebar();
  renderConversation();
}

function updateComposer() {
  const busy = state.conv && generating(state.conv.id);
  $("#send").hidden = Boolean(busy);
  $("#stop").hidden = !busy;
  $("#send").disabled = !state.ready;
  $("#input").placeholder = state.ready ? "Message the model" : "The model is not ready yet\u2026";
}

async function stopCurrent() {
  const run = state.conv && generating(state.conv.id);
  if (run) await run.gen.stop();
}

// ---- settings --------------------------------------------------------------------------------

const FIELDS = ["system", "temperature", "max_tokens", "reasoning_budget", "tools", "tool_choice",
                "extra"];

function openSettings() {
  for (const f of FIELDS) $(`#set-${f}`).value = state.settings[f];
  $("#settings-error").textContent = "";
  $("#key-state").textContent = store.getKey() ? "An API key is saved in this browser."
    : "No API key saved.";
  $("#settings").showModal();
}

function saveSettings() {
  const s = {};
  for (const f of FIELDS) s[f] = $(`#set-${f}`).value;
  const problems = [];
  if (s.tools.trim()) {
    const t = parseJson(s.tools, undefined);
    if (!Array.isArray(t)) problems.push("Tools must be a JSON array of tool objects.");
  }
  if (s.extra.trim()) {
    const x = parseJson(s.extra, undefined);
    if (!x || typeof x !== "object" || Array.isArray(x)) problems.push("Extra fields must be a JSON object.");
  }
  if (!(Number(s.max_tokens) >= 1)) problems.push("Max tokens must be at least 1.");
  if (s.reasoning_budget.trim() !== "" && !(Number(s.reasoning_budget) >= 0)) {
    problems.push("The reasoning budget is a number of tokens (or empty).");
  }
  if (problems.length) {
    $("#settings-error").textContent = problems.join(" ");
    return;
  }
  state.settings = { ...state.settings, ...s };
  store.saveSettings(state.settings);
  $("#settings").close();
}

const EXAMPLE_TOOLS = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

// ---- the API key ---------------------------------------------------------------------------

let keyWaiters = [];

function askForKey(refused) {
  const dlg = $("#key-dialog");
  $("#key-error").textContent = refused && store.getKey() ? "The saved key was refused." : "";
  if (!dlg.open) dlg.showModal();
  $("#key-input").focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

async function submitKey() {
  const key = $("#key-input").value.trim();
  if (!key) return;
  const resp = await fetch("/v1/models", { headers: { "x-api-key": key }, cache: "no-store" })
    .catch(() => null);
  if (resp === null) {
    $("#key-error").textContent = "The server cannot be reached.";
    return;
  }
  if (resp.status === 401) {
    $("#key-error").textContent = "That key was refused.";
    return;
  }
  store.setKey(key);
  $("#key-input").value = "";
  $("#key-dialog").close();
  const waiting = keyWaiters;
  keyWaiters = [];
  waiting.forEach((r) => r());
}

// ---- the server: health, key, model, load progress ------------------------------------------

let connecting = null;

function connect() {
  if (!connecting) connecting = doConnect().finally(() => { connecting = null; });
  return connecting;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function doConnect() {
  state.ready = false;
  updateComposer();
  for (let attempt = 0; ; attempt++) {
    let health;
    try {
      health = await fetch("/health", { cache: "no-store" });
    } catch {
      setStatus("offline", "The server cannot be reached; retrying\u2026");
      await sleep(Math.min(5000, 1000 + attempt * 500));
      continue;
    }
    // the key: any route but health says 401 without one
    const probe = await api("/v1/models").catch(() => null);
    if (probe && probe.status === 401) {
      setStatus("locked", "This server needs an API key.");
      if (health.ok) {
        await askForKey(true);
        continue;
      }
      // loading and no key yet: show the progress (health needs none) while asking
      askForKey(true);
    }
    if (health.ok) {
      if (probe && probe.ok) {
        const models = await probe.json().catch(() => null);
        state.model = models?.data?.[0]?.id || null;
      }
      $("#model-name").textContent = state.model || "model";
      hideLoading();
      setStatus("ready", "ready");
      state.ready = true;
      updateComposer();
      return;
    }
    const body = await health.json().catch(() => ({}));
    showLoading(body);
    await watchLoad();
  }
}

function setStatus(kind, text) {
  const s = $("#server-status");
  s.dataset.kind = kind;
  s.textContent = text;
}

// /models/sse while the model loads (it needs the key when keys are set); /health otherwise
async function watchLoad() {
  setStatus("loading", "loading");
  try {
    const resp = await api("/models/sse");
    if (resp.ok) {
      let loaded = false;
      await readEvents(resp.body, (ev) => {
        if (ev.comment || ev.data === null) return;
        const data = JSON.parse(ev.data);
        if (ev.event === "download_progress") showDownload(data);
        if (ev.event === "model_status") {
          showLoading(data);
          if (data.status === "loaded") loaded = true;
          if (data.status === "failed") showLoadFailure(data);
        }
      });
      if (loaded) return;
    }
  } catch (err) {
    console.warn("load events", err);
  }
  // poll health until it answers 200 (or the server goes away: connect retries)
  for (;;) {
    await sleep(1000);
    let health;
    try {
      health = await fetch("/health", { cache: "no-store" });
    } catch {
      return;
    }
    if (health.ok) return;
    const body = await health.json().catch(() => ({}));
    showLoading(body);
    if (body.download) showDownload(body.download);
  }
}

const STAGES = {
  starting: "Starting",
  downloading: "Downloading the model",
  loading: "Loading the model",
  warming_up: "Warming up",
  ready: "Ready",
  failed: "Failed",
};

function showLoading(snap) {
  $("#loading").hidden = false;
  document.body.classList.add("loading");
  const stage = snap.stage || "starting";
  $("#load-stage").textContent = STAGES[stage] || stage;
  $("#load-stage").dataset.stage = stage;
  const bar = $("#load-progress");
  if (typeof snap.progress === "number") bar.value = snap.progress;
  else bar.removeAttribute("value");
  $("#load-detail").textContent = snap.detail || "";
  if (stage !== "downloading") $("#load-download").textContent = "";
}

function showDownload(d) {
  const mb = (n) => (n / 1e6).toFixed(1);
  let text = `${mb(d.downloaded_bytes)} MB of ${mb(d.total_bytes)} MB`;
  if (d.mb_per_s) text += ` \u00b7 ${d.mb_per_s} MB/s`;
  if (d.eta_s !== null && d.eta_s !== undefined) text += ` \u00b7 about ${Math.ceil(d.eta_s)} s left`;
  $("#load-download").textContent = text;
  if (d.total_bytes) $("#load-progress").value = d.downloaded_bytes / d.total_bytes;
}

function showLoadFailure(data) {
  $("#load-stage").textContent = "The model failed to load";
  $("#load-detail").textContent = data.error || "";
}

function hideLoading() {
  $("#loading").hidden = true;
  document.body.classList.remove("loading");
}

// ---- the page ------------------------------------------------------------------------------

function closeSidebar() {
  document.body.classList.remove("side-open");
}

function bind() {
  $("#new-chat").addEventListener("click", startNewChat);
  $("#menu").addEventListener("click", () => document.body.classList.toggle("side-open"));
  $("#scrim").addEventListener("click", closeSidebar);
  $("#composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("#input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("#stop").addEventListener("click", stopCurrent);
  $("#open-settings").addEventListener("click", openSettings);
  $("#settings-save").addEventListener("click", saveSettings);
  $("#settings-cancel").addEventListener("click", () => $("#settings").close());
  $("#tools-example").addEventListener("click", () => {
    $("#set-tools").value = JSON.stringify(EXAMPLE_TOOLS, null, 2);
  });
  $("#key-change").addEventListener("click", () => { $("#settings").close(); askForKey(false); });
  $("#key-forget").addEventListener("click", () => {
    store.setKey("");
    $("#key-state").textContent = "No API key saved.";
  });
  $("#key-form").addEventListener("submit", (e) => { e.preventDefault(); submitKey(); });
  $("#key-dialog").addEventListener("cancel", (e) => {
    if (!store.getKey()) e.preventDefault(); // no way on without a key
  });
}

async function boot() {
  bind();
  const recent = store.listConversations()[0];
  if (recent) state.conv = store.loadConversation(recent.id);
  renderSidebar();
  renderConversation();
  await connect();
  await reattach();
}

if (!page.leaving) boot();
