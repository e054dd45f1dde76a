// Everything the page keeps lives in this browser's localStorage, under "vgguf.":
// the conversation index, one entry per conversation, the settings, and the API key.
// Writes are synchronous, so a reply's state saved from a "pagehide" handler is on disk
// before the page goes away (what lets a reload reattach to a stream).

const P = "vgguf.";

function read(key, fallback) {
  try {
    const raw = localStorage.getItem(P + key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

function write(key, value) {
  try {
    localStorage.setItem(P + key, JSON.stringify(value));
    return true;
  } catch (err) {
    console.warn("could not save", key, err); // quota full: the page goes on in memory
    return false;
  }
}

export function newId() {
  if (globalThis.crypto?.randomUUID) return crypto.randomUUID();
  // plain http on another host is not a secure context: no randomUUID, but random values
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

export const DEFAULT_SETTINGS = {
  system: "",
  temperature: 0.7,
  max_tokens: 1024,
  reasoning_budget: "", // "" = none
  tools: "",            // JSON array of OpenAI tools, "" = none
  tool_choice: "auto",
  extra: "",            // JSON object merged into every request body
};

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read("settings", {}) };
}

export function saveSettings(s) {
  write("settings", s);
}

export function getKey() {
  return read("key", "");
}

export function setKey(key) {
  if (key) write("key", key);
  else localStorage.removeItem(P + "key");
}

// the index: [{id, title, updated}], newest first
export function listConversations() {
  const list = read("index", []);
  return Array.isArray(list) ? list : [];
}

export function loadConversation(id) {
  const c = read("conv." + id, null);
  return c && Array.isArray(c.messages) ? c : null;
}

export function saveConversation(conv) {
  conv.updated = Date.now();
  write("conv." + conv.id, conv);
  const list = listConversations().filter((c) => c.id !== conv.id);
  list.unshift({ id: conv.id, title: conv.title, updated: conv.updated });
  write("index", list);
}

// a streaming reply's state only: the index and the order stay as they are
export function saveQuietly(conv) {
  write("conv." + conv.id, conv);
}

export function deleteConversation(id) {
  localStorage.removeItem(P + "conv." + id);
  write("index", listConversations().filter((c) => c.id !== id));
}
