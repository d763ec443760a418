// Line diffs for the tool cards: what an Edit / MultiEdit / Write (or an ACP `diff`
// content item) changes, as a unified diff with line numbers; and git's own unified diff
// (a worktree's changes, changes.js) read into the same rows. Pure functions and DOM.

import { el } from "./dom.js";

const MAX_CELLS = 4_000_000; // beyond old × new lines, no alignment: all removed, all added
const CONTEXT = 3;

const lines = (text) => {
  if (typeof text !== "string" || text === "") return [];
  const out = text.split("\n");
  if (out[out.length - 1] === "") out.pop(); // a final newline ends the last line
  return out;
};

/** The edit script from `a` to `b` (arrays of lines): [{op: " "|"-"|"+", text, o, n}],
 * o and n the 1-based line numbers in a and b (0 where the line is not there). */
export function diffLines(a, b) {
  const ops = [];
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA--;
    endB--;
  }
  for (let i = 0; i < start; i++) ops.push({ op: " ", text: a[i], o: i + 1, n: i + 1 });
  const m = endA - start;
  const k = endB - start;
  if (m * k > MAX_CELLS) {
    for (let i = start; i < endA; i++) ops.push({ op: "-", text: a[i], o: i + 1, n: 0 });
    for (let j = start; j < endB; j++) ops.push({ op: "+", text: b[j], o: 0, n: j + 1 });
  } else {
    // Longest common subsequence of the middle, then walk it.
    const w = k + 1;
    const len = new Uint32Array((m + 1) * w);
    for (let i = m - 1; i >= 0; i--) {
      for (let j = k - 1; j >= 0; j--) {
        len[i * w + j] = a[start + i] === b[start + j] ? len[(i + 1) * w + j + 1] + 1 : Math.max(len[(i + 1) * w + j], len[i * w + j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < m || j < k) {
      if (i < m && j < k && a[start + i] === b[start + j]) {
        ops.push({ op: " ", text: a[start + i], o: start + i + 1, n: start + j + 1 });
        i++;
        j++;
      } else if (i < m && (j === k || len[(i + 1) * w + j] >= len[i * w + j + 1])) {
        ops.push({ op: "-", text: a[start + i], o: start + i + 1, n: 0 }); // removals first
        i++;
      } else {
        ops.push({ op: "+", text: b[start + j], o: 0, n: start + j + 1 });
        j++;
      }
    }
  }
  for (let i = endA, j = endB; i < a.length; i++, j++) ops.push({ op: " ", text: a[i], o: i + 1, n: j + 1 });
  return ops;
}

/** Hunks of a script: runs of changes with CONTEXT unchanged lines around them. */
export function hunks(ops, context = CONTEXT) {
  const keep = new Uint8Array(ops.length);
  ops.forEach((x, i) => {
    if (x.op === " ") return;
    for (let d = Math.max(0, i - context); d <= Math.min(ops.length - 1, i + context); d++) keep[d] = 1;
  });
  const out = [];
  let cur = null;
  ops.forEach((x, i) => {
    if (!keep[i]) {
      cur = null;
      return;
    }
    if (!cur) out.push((cur = []));
    cur.push(x);
  });
  return out;
}

/** One change to a file: old and new text (null old: a new file), with line numbers
 * shifted by `offset` (where the snippet starts in the file, when known). */
export function fileChange(path, oldText, newText, offset = 0) {
  const ops = diffLines(lines(oldText ?? ""), lines(newText ?? "")).map((x) => ({
    ...x,
    o: x.o && x.o + offset,
    n: x.n && x.n + offset,
  }));
  return { path, ops, created: oldText === null || oldText === undefined };
}

/** The changes an edit tool's input describes, or null for other tools. */
export function changesOf(name, input) {
  if (!input || typeof input !== "object") return null;
  const path = String(input.file_path ?? input.path ?? input.filePath ?? "");
  const tool = String(name || "").toLowerCase();
  if (tool === "edit" && typeof input.old_string === "string" && typeof input.new_string === "string") {
    return [fileChange(path, input.old_string, input.new_string)];
  }
  if (tool === "multiedit" && Array.isArray(input.edits)) {
    return input.edits
      .filter((e) => e && typeof e.old_string === "string" && typeof e.new_string === "string")
      .map((e) => fileChange(path, e.old_string, e.new_string));
  }
  if (tool === "write" && typeof input.content === "string") return [fileChange(path, null, input.content)];
  return null;
}

/** ACP `diff` content items ({type: "diff", path, oldText, newText}) of a raw update. */
export function acpDiffs(raw) {
  const u = raw && raw.params && raw.params.update;
  const content = u && Array.isArray(u.content) ? u.content : [];
  return content
    .filter((c) => c && c.type === "diff" && typeof c.newText === "string")
    .map((c) => fileChange(String(c.path ?? ""), typeof c.oldText === "string" ? c.oldText : null, c.newText));
}

/** A unified diff: per file a header, then its hunks, each line with the old and the new
 * line number, its sign and its text. */
export function renderChanges(changes) {
  const box = el("div", "diff");
  for (const c of changes) {
    const added = c.ops.filter((x) => x.op === "+").length;
    const removed = c.ops.filter((x) => x.op === "-").length;
    renderFile(box, { path: c.path, note: c.created ? "new file" : "", added, removed, parts: hunks(c.ops) });
  }
  return box;
}

/** One file of a diff into `box`: its header (path, what happened to it, +added −removed)
 * and its hunks (lists of {op, text, o, n}); `empty` is said when it has none. */
export function renderFile(box, { path, note = "", added, removed, parts, empty = "(no change)" }) {
  const head = el("div", "diff-file", `${path || "file"}${note ? ` (${note})` : ""}`);
  head.append(el("span", "diff-stat", ` +${added ?? "?"} −${removed ?? "?"}`));
  box.append(head);
  if (!parts.length) box.append(el("div", "diff-same", empty));
  for (const h of parts) {
    const pre = el("pre", "diff-hunk");
    pre.tabIndex = 0; // it may scroll: reachable by keyboard
    for (const x of h) {
      const row = el("span", `diff-line diff-${x.op === "+" ? "add" : x.op === "-" ? "del" : "ctx"}`);
      row.append(el("span", "ln", x.o ? String(x.o) : ""), el("span", "ln", x.n ? String(x.n) : ""), el("span", "sign", x.op), el("span", "code", x.text));
      pre.append(row, "\n");
    }
    box.append(pre);
  }
  return head;
}

const HUNK = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@/;

/** git's unified diff text (`diff --git` sections) as files: [{path, note, added, removed,
 * parts}], `parts` the hunks with each line's old and new line number, as renderFile takes
 * them. Text only: nothing in it is ever markup. A section cut short (a diff bounded by the
 * daemon) keeps the lines it has. */
export function parseUnified(text) {
  const files = [];
  let file = null;
  let hunk = null;
  let o = 0;
  let n = 0;
  for (const line of String(text || "").split("\n")) {
    if (line.startsWith("diff --git ")) {
      const m = / b\/(.*)$/.exec(line);
      file = { path: m ? m[1] : line.slice(11), note: "", added: 0, removed: 0, parts: [], binary: false };
      files.push(file);
      hunk = null;
    } else if (!file) {
      continue;
    } else if (!hunk && line.startsWith("+++ ")) {
      if (line !== "+++ /dev/null") file.path = line.slice(4).replace(/^b\//, "");
    } else if (!hunk && line.startsWith("--- ")) {
      continue;
    } else if (!hunk && line.startsWith("new file mode")) {
      file.note = "new file";
    } else if (!hunk && line.startsWith("deleted file mode")) {
      file.note = "deleted";
    } else if (!hunk && line.startsWith("Binary files ")) {
      file.binary = true;
      file.note = file.note ? `${file.note}, binary` : "binary";
    } else if (HUNK.test(line)) {
      const m = HUNK.exec(line);
      o = Number(m[1]);
      n = Number(m[2]);
      hunk = [];
      file.parts.push(hunk);
    } else if (hunk && (line.startsWith("+") || line.startsWith("-") || line.startsWith(" "))) {
      const op = line[0];
      hunk.push({ op, text: line.slice(1), o: op === "+" ? 0 : o, n: op === "-" ? 0 : n });
      if (op !== "+") o++;
      if (op !== "-") n++;
      if (op === "+") file.added++;
      if (op === "-") file.removed++;
    }
  }
  return files;
}
