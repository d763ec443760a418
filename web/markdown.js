// A small Markdown renderer that builds DOM nodes and sets only textContent: agent text
// is never parsed as HTML, so `<img onerror=…>` or `<script>` stay visible text. Links
// keep only http:, https: and mailto: targets (anything else, `javascript:` included,
// becomes plain text) and open in a new tab without a referrer or an opener.
//
// Supported: fenced code blocks (``` or ~~~, with the language as a class and a label,
// coloured by highlight.js for common languages),
// indented code, ATX headings, paragraphs with hard line breaks, block quotes, ordered
// and unordered lists (nested by indentation), horizontal rules, tables (GFM pipes), and
// inline code, links, autolinks, bare URLs, **strong**, *emphasis*, ~~strike~~.
// Images are shown as links (the page never loads a remote resource).

import { highlightInto } from "./highlight.js";

const SAFE_SCHEMES = new Set(["http:", "https:", "mailto:"]);
const MAX_DEPTH = 12;

function el(tag, cls) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  return node;
}

export function safeHref(raw) {
  const text = String(raw).trim();
  if (!/^(https?:\/\/|mailto:)/i.test(text)) return null;
  let url;
  try {
    url = new URL(text);
  } catch {
    return null;
  }
  return SAFE_SCHEMES.has(url.protocol) ? url.href : null;
}

export function makeLink(label, href) {
  const safe = safeHref(href);
  if (safe === null) {
    const span = el("span", "md-inert-link");
    span.textContent = label;
    return span;
  }
  const a = el("a");
  a.href = safe;
  a.rel = "noopener noreferrer";
  a.target = "_blank";
  a.textContent = label;
  return a;
}

// ------------------------------------------------------------------ blocks

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:\s+(.*?))?\s*#*\s*$/;
const HR = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:\s+(.*))?$/;
const TABLE_SEP = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;

export function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), frag, 0);
  return frag;
}

function blocks(lines, parent, depth) {
  if (depth > MAX_DEPTH) {
    const p = el("p");
    p.textContent = lines.join("\n");
    parent.append(p);
    return;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i++;
      continue;
    }
    let m;
    if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) body.push(lines[i++]);
      i++; // the closing fence (or the end, while a reply is still streaming)
      parent.append(codeBlock(body.join("\n"), m[2]));
      continue;
    }
    if (/^ {4}/.test(line)) {
      const body = [];
      while (i < lines.length && (/^ {4}/.test(lines[i]) || !lines[i].trim())) body.push(lines[i++].slice(4));
      while (body.length && !body[body.length - 1].trim()) body.pop();
      parent.append(codeBlock(body.join("\n"), ""));
      continue;
    }
    if ((m = HEADING.exec(line))) {
      const h = el(`h${Math.min(6, m[1].length + 2)}`, "md-h");
      inline(m[2] || "", h, depth);
      parent.append(h);
      i++;
      continue;
    }
    if (HR.test(line)) {
      parent.append(el("hr"));
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && lines[i].trim() && (m = QUOTE.exec(lines[i]) || [null, lines[i]])) {
        body.push(m[1]);
        i++;
      }
      const q = el("blockquote");
      blocks(body, q, depth + 1);
      parent.append(q);
      continue;
    }
    if (ITEM.test(line) && !HR.test(line)) {
      i = list(lines, i, parent, depth);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      i = table(lines, i, parent, depth);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) para.push(lines[i++]);
    if (!para.length) para.push(lines[i++]);
    const p = el("p");
    para.forEach((l, n) => {
      if (n) p.append(el("br"));
      inline(l.trim(), p, depth);
    });
    parent.append(p);
  }
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || HR.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function codeBlock(text, lang) {
  const pre = el("pre", "md-code");
  const code = el("code");
  if (lang) {
    const clean = lang.replace(/[^\w+-]/g, "").slice(0, 32);
    code.className = `language-${clean}`;
    pre.dataset.lang = clean;
  }
  highlightInto(code, text, lang);
  pre.append(code);
  return pre;
}

function list(lines, i, parent, depth) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered) {
    const start = parseInt(first[2], 10);
    if (start !== 1) node.start = start;
  }
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const body = [m[3] || ""];
    i++;
    // Continuation: indented deeper than the marker, or blank lines followed by such.
    while (i < lines.length) {
      const l = lines[i];
      if (!l.trim()) {
        const next = lines[i + 1];
        if (next !== undefined && /^\s+/.test(next) && next.search(/\S/) > indent) {
          body.push("");
          i++;
          continue;
        }
        break;
      }
      const lead = l.search(/\S/);
      if (lead > indent) {
        body.push(l.slice(Math.min(lead, indent + 2)));
        i++;
      } else if (!startsBlock(l) && lead <= indent && body.length === 1 && !ITEM.test(l)) {
        body.push(l.trim()); // a lazy continuation of the item's first paragraph
        i++;
      } else break;
    }
    const li = el("li");
    if (body.length === 1) inline(body[0], li, depth);
    else blocks(body, li, depth + 1);
    node.append(li);
    while (i < lines.length && !lines[i].trim()) {
      const next = lines[i + 1];
      const nm = next === undefined ? null : ITEM.exec(next);
      if (nm && nm[1].length === indent) i++;
      else break;
    }
  }
  parent.append(node);
  return i;
}

function cells(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

function table(lines, i, parent, depth) {
  const wrap = el("div", "md-table");
  const t = el("table");
  const head = el("thead");
  const tr = el("tr");
  for (const c of cells(lines[i])) {
    const th = el("th");
    inline(c, th, depth);
    tr.append(th);
  }
  head.append(tr);
  t.append(head);
  const body = el("tbody");
  i += 2;
  while (i < lines.length && lines[i].trim() && lines[i].includes("|")) {
    const row = el("tr");
    for (const c of cells(lines[i])) {
      const td = el("td");
      inline(c, td, depth);
      row.append(td);
    }
    body.append(row);
    i++;
  }
  t.append(body);
  wrap.append(t);
  parent.append(wrap);
  return i;
}

// ------------------------------------------------------------------ inline

const ESCAPABLE = /[\\`*_{}[\]()#+\-.!~<>|]/;
const BARE_URL = /^https?:\/\/[^\s<>"'`]+/i;

function matchLink(text, i) {
  // [label](url "title") with balanced brackets in the label and parens in the url.
  let depth = 0;
  let j = i;
  for (; j < text.length; j++) {
    const c = text[j];
    if (c === "\\") {
      j++;
      continue;
    }
    if (c === "[") depth++;
    else if (c === "]" && --depth === 0) break;
  }
  if (j >= text.length || text[j + 1] !== "(") return null;
  let k = j + 2;
  let parens = 1;
  for (; k < text.length; k++) {
    const c = text[k];
    if (c === "(") parens++;
    else if (c === ")" && --parens === 0) break;
  }
  if (k >= text.length) return null;
  let target = text.slice(j + 2, k).trim();
  const titled = /^(\S+)\s+["'(].*$/.exec(target);
  if (titled) target = titled[1];
  if (target.startsWith("<") && target.endsWith(">")) target = target.slice(1, -1);
  return { label: text.slice(i + 1, j), url: target, end: k + 1 };
}

function inline(text, parent, depth) {
  if (depth > MAX_DEPTH) {
    parent.append(document.createTextNode(text));
    return;
  }
  let buf = "";
  const flush = () => {
    if (buf) parent.append(document.createTextNode(buf));
    buf = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === "\\" && i + 1 < text.length && ESCAPABLE.test(text[i + 1])) {
      buf += text[i + 1];
      i += 2;
      continue;
    }
    if (c === "`") {
      let n = 1;
      while (text[i + n] === "`") n++;
      const fence = "`".repeat(n);
      const end = text.indexOf(fence, i + n);
      if (end > 0) {
        flush();
        const code = el("code");
        let body = text.slice(i + n, end);
        if (/^ .* $/.test(body)) body = body.slice(1, -1);
        code.textContent = body;
        parent.append(code);
        i = end + n;
        continue;
      }
      buf += fence;
      i += n;
      continue;
    }
    if (c === "!" && text[i + 1] === "[") {
      const m = matchLink(text, i + 1);
      if (m) {
        flush();
        parent.append(makeLink(m.label ? `image: ${m.label}` : "image", m.url));
        i = m.end;
        continue;
      }
    }
    if (c === "[") {
      const m = matchLink(text, i);
      if (m) {
        flush();
        const safe = safeHref(m.url);
        if (safe === null) {
          const span = el("span", "md-inert-link");
          inline(m.label, span, depth + 1);
          parent.append(span);
        } else {
          const a = makeLink("", safe);
          inline(m.label, a, depth + 1);
          parent.append(a);
        }
        i = m.end;
        continue;
      }
    }
    if (c === "<") {
      const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(text.slice(i, i + 2048));
      if (m) {
        flush();
        parent.append(makeLink(m[1], m[1]));
        i += m[0].length;
        continue;
      }
    }
    if ((c === "h" || c === "H") && (i === 0 || /[\s(]/.test(text[i - 1]))) {
      const m = BARE_URL.exec(text.slice(i, i + 4096));
      if (m) {
        let url = m[0];
        while (/[.,;:!?)\]]$/.test(url)) url = url.slice(0, -1);
        flush();
        parent.append(makeLink(url, url));
        i += url.length;
        continue;
      }
    }
    if (c === "*" || c === "_" || c === "~") {
      const double = text[i + 1] === c;
      const wordy = c === "_" && i > 0 && /\w/.test(text[i - 1]);
      if (double && !wordy) {
        const end = text.indexOf(c + c, i + 2);
        if (end > i + 2 && text[i + 2] !== " ") {
          flush();
          const node = el(c === "~" ? "del" : "strong");
          inline(text.slice(i + 2, end), node, depth + 1);
          parent.append(node);
          i = end + 2;
          continue;
        }
      } else if (c !== "~" && !wordy && text[i + 1] && text[i + 1] !== " ") {
        let end = text.indexOf(c, i + 1);
        while (end > 0 && text[end + 1] === c) end = text.indexOf(c, end + 2);
        if (end > i + 1 && text[end - 1] !== " " && !(c === "_" && /\w/.test(text[end + 1] || ""))) {
          flush();
          const node = el("em");
          inline(text.slice(i + 1, end), node, depth + 1);
          parent.append(node);
          i = end + 1;
          continue;
        }
      }
    }
    buf += c;
    i++;
  }
  flush();
}
