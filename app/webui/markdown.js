// A small Markdown renderer for model output: builds DOM nodes, never HTML strings, so
// whatever the model writes ends up as text (no markup of its own reaches the page).
// Blocks: fenced code (an unclosed fence renders as code, as it streams), headings, lists
// (nested by indentation), block quotes, tables, rules, paragraphs (a newline is a line
// break). Inline: code spans, bold, italics, strike-through, links (http, https, mailto only).

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;

function isBlank(line) {
  return line.trim() === "";
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
    ITEM.test(line);
}

function cells(row) {
  let s = row.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

export function codeBlock(text, lang) {
  const wrap = el("div", "code-block");
  const bar = el("div", "code-bar");
  bar.append(el("span", "code-lang", lang || "text"));
  const copy = el("button", "copy", "Copy");
  copy.type = "button";
  copy.addEventListener("click", () => copyText(text, copy));
  bar.append(copy);
  const pre = el("pre");
  const code = el("code", null, text);
  if (lang) code.dataset.lang = lang;
  pre.append(code);
  wrap.append(bar, pre);
  return wrap;
}

function copyText(text, button) {
  const done = () => {
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = "Copy"; }, 1200);
  };
  if (navigator.clipboard?.writeText) {
    navigator.clipboard.writeText(text).then(done, () => {});
  }
}

function renderBlocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) { i++; continue; }
    let m = FENCE.exec(line);
    if (m) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length) {
        const t = lines[i].trim();
        if (t.startsWith(fence[0].repeat(fence.length)) && t.replace(/[`~]/g, "") === "") break;
        body.push(lines[i]);
        i++;
      }
      i++; // the closing fence (or the end, while it streams)
      parent.append(codeBlock(body.join("\n"), m[2]));
      continue;
    }
    m = HEADING.exec(line);
    if (m) {
      const h = el("h" + Math.min(6, m[1].length + 2)); // h3..h6 inside a reply
      h.append(inline(m[2]));
      parent.append(h);
      i++;
      continue;
    }
    if (RULE.test(line)) { parent.append(el("hr")); i++; continue; }
    if (QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && QUOTE.test(lines[i])) {
        inner.push(QUOTE.exec(lines[i])[1]);
        i++;
      }
      const q = el("blockquote");
      renderBlocks(inner, q);
      parent.append(q);
      continue;
    }
    m = ITEM.exec(line);
    if (m) { i = renderList(lines, i, parent); continue; }
    if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) &&
        lines[i + 1].includes("-")) {
      i = renderTable(lines, i, parent);
      continue;
    }
    const para = [];
    while (i < lines.length && !isBlank(lines[i]) && (para.length === 0 || !startsBlock(lines[i]))) {
      para.push(lines[i]);
      i++;
    }
    const p = el("p");
    para.forEach((text, k) => {
      if (k) p.append(el("br"));
      p.append(inline(text.trim()));
    });
    parent.append(p);
  }
}

function renderList(lines, i, parent) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const body = [m[3]];
    i++;
    // the item's own lines: indented deeper, or a plain continuation right after it
    while (i < lines.length) {
      const next = lines[i];
      if (isBlank(next)) {
        const after = lines[i + 1];
        if (after !== undefined && !isBlank(after) && after.search(/\S/) > indent) {
          body.push("");
          i++;
          continue;
        }
        break;
      }
      const lead = next.search(/\S/);
      if (lead > indent) { body.push(next.slice(Math.min(lead, indent + 2))); i++; continue; }
      if (!startsBlock(next) && lead === indent && !ITEM.test(next)) { body.push(next); i++; continue; }
      break;
    }
    const li = el("li");
    if (body.length === 1) li.append(inline(body[0]));
    else renderBlocks(body, li);
    list.append(li);
    while (i < lines.length && isBlank(lines[i]) && lines[i + 1] !== undefined &&
           ITEM.test(lines[i + 1]) && ITEM.exec(lines[i + 1])[1].length === indent) i++;
  }
  parent.append(list);
  return i;
}

function renderTable(lines, i, parent) {
  const head = cells(lines[i]);
  const aligns = cells(lines[i + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : "");
  const wrap = el("div", "table-wrap");
  const table = el("table");
  const tr = el("tr");
  head.forEach((c, k) => {
    const th = el("th");
    if (aligns[k]) th.className = "align-" + aligns[k];
    th.append(inline(c));
    tr.append(th);
  });
  const thead = el("thead");
  thead.append(tr);
  table.append(thead);
  const tbody = el("tbody");
  i += 2;
  while (i < lines.length && lines[i].includes("|") && !isBlank(lines[i])) {
    const row = el("tr");
    cells(lines[i]).forEach((c, k) => {
      const td = el("td");
      if (aligns[k]) td.className = "align-" + aligns[k];
      td.append(inline(c));
      row.append(td);
    });
    tbody.append(row);
    i++;
  }
  table.append(tbody);
  wrap.append(table);
  parent.append(wrap);
  return i;
}

const SAFE_URL = /^(https?:\/\/|mailto:)/i;

// each: a regex (global, searched from a position) and how to build its node
const INLINE = [
  { re: /(`+)([\s\S]*?[^`])\1(?!`)/g, make: (m) => el("code", null, m[2].replace(/^ (.*) $/, "$1")) },
  { re: /!?\[([^\]\n]*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)/g, make: link },
  { re: /\bhttps?:\/\/[^\s<>()"'`]*[^\s<>()"'`.,;:!?*_~]/g, make: (m) => link([m[0], m[0], m[0]]) },
  { re: /\*\*(?=\S)([\s\S]*?\S)\*\*/g, make: (m) => wrapInline("strong", m[1]) },
  { re: /(?<![\w_])__(?=\S)([\s\S]*?\S)__(?![\w_])/g, make: (m) => wrapInline("strong", m[1]) },
  { re: /~~(?=\S)([\s\S]*?\S)~~/g, make: (m) => wrapInline("del", m[1]) },
  { re: /(?<![*\w])\*(?=[^\s*])([\s\S]*?[^\s*])\*(?![*\w])/g, make: (m) => wrapInline("em", m[1]) },
  { re: /(?<![\w_])_(?=[^\s_])([\s\S]*?[^\s_])_(?![\w_])/g, make: (m) => wrapInline("em", m[1]) },
];

function wrapInline(tag, text) {
  const e = el(tag);
  e.append(inline(text));
  return e;
}

function link(m) {
  const url = m[2];
  if (!SAFE_URL.test(url) || m[0].startsWith("!")) {
    return document.createTextNode(m[0].startsWith("!") ? m[1] || url : m[1] || url);
  }
  const a = el("a");
  a.href = url;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  a.append(m[1] === url ? document.createTextNode(url) : inline(m[1] || url));
  return a;
}

export function inline(text) {
  const frag = document.createDocumentFragment();
  let pos = 0;
  while (pos < text.length) {
    let best = null;
    for (const rule of INLINE) {
      rule.re.lastIndex = pos;
      const m = rule.re.exec(text);
      if (m && (best === null || m.index < best.m.index)) best = { m, rule };
    }
    if (best === null) break;
    if (best.m.index > pos) frag.append(text.slice(pos, best.m.index));
    frag.append(best.rule.make(best.m));
    pos = best.m.index + best.m[0].length;
  }
  if (pos < text.length) frag.append(text.slice(pos));
  return frag;
}

// The rendered Markdown of `text`, as a fragment.
export function render(text) {
  const frag = document.createDocumentFragment();
  renderBlocks(String(text).replace(/\r\n?/g, "\n").split("\n"), frag);
  return frag;
}
