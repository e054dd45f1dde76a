// Server-sent events read from a fetch() body, counting bytes.
//
// The resumable-stream routes replay a response from a byte offset of its body. Only whole
// events are handed on, each with its length in bytes (of the UTF-8 body as it came), so the
// caller can keep the offset of the last complete event together with what it has built
// from the events so far. Comment events (": ping" heartbeats) belong to one connection, not
// to the stored body: they are flagged, and the caller does not count them.

const NL = 10;

function boundary(buf, from) {
  // the index just after the next "\n\n" at or after `from`, or -1
  for (let i = Math.max(from, 1); i < buf.length; i++) {
    if (buf[i] === NL && buf[i - 1] === NL) return i + 1;
  }
  return -1;
}

export function parseEvent(text) {
  const ev = { event: "message", data: null, comment: true };
  const data = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    ev.comment = false;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") data.push(value);
    else if (field === "event") ev.event = value;
  }
  ev.data = data.length ? data.join("\n") : null;
  return ev;
}

// Calls onEvent(event, byteLength) for each complete event until the body ends; resolves then.
// Rejects when reading fails (a cut connection, an abort).
export async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = new Uint8Array(0);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      if (!value || value.length === 0) continue;
      const joined = new Uint8Array(buf.length + value.length);
      joined.set(buf);
      joined.set(value, buf.length);
      buf = joined;
      let start = 0;
      let scanned = Math.max(0, joined.length - value.length - 1);
      for (;;) {
        const end = boundary(buf, Math.max(start, scanned));
        if (end < 0) break;
        const raw = buf.subarray(start, end);
        start = end;
        scanned = end;
        const stop = onEvent(parseEvent(decoder.decode(raw)), raw.length);
        if (stop === false) return;
      }
      buf = buf.slice(start);
    }
  } finally {
    reader.releaseLock?.();
  }
}
