// Syntax colouring for fenced code blocks: a small lexer (comments, strings, numbers,
// keywords) for common languages. It only wraps slices of the code in <span>s whose text
// is set with textContent, so it cannot turn code into markup. Unknown languages stay
// plain monospaced text.

const C_LIKE = { line: ["//"], block: [["/*", "*/"]], strings: ["\"", "'", "`"] };
const HASH = { line: ["#"], block: [], strings: ["\"", "'"] };
const LANGS = {
  js: C_LIKE, javascript: C_LIKE, ts: C_LIKE, typescript: C_LIKE, jsx: C_LIKE, tsx: C_LIKE, json: C_LIKE,
  c: C_LIKE, h: C_LIKE, cpp: C_LIKE, "c++": C_LIKE, cs: C_LIKE, java: C_LIKE, kotlin: C_LIKE, swift: C_LIKE,
  go: C_LIKE, rust: C_LIKE, rs: C_LIKE, css: { line: [], block: [["/*", "*/"]], strings: ["\"", "'"] },
  py: HASH, python: HASH, sh: HASH, bash: HASH, shell: HASH, zsh: HASH, console: HASH, rb: HASH, ruby: HASH,
  yaml: HASH, yml: HASH, toml: HASH, dockerfile: HASH, make: HASH, makefile: HASH, r: HASH, perl: HASH,
  sql: { line: ["--"], block: [["/*", "*/"]], strings: ["'", "\""] },
  lua: { line: ["--"], block: [], strings: ["\"", "'"] },
};
const KEYWORDS = new Set(
  ("if else elif for while do return def class function const let var import from export default async await " +
    "true false null undefined None True False nil try except catch finally raise throw new in of with as " +
    "fn pub struct impl enum match use mod mut package func go type interface break continue switch case " +
    "yield lambda pass not and or is this self super static public private protected void int float bool " +
    "string select where insert update delete create table into values set begin end then local echo fi done esac")
    .split(" "),
);
const MAX_HIGHLIGHT = 100000; // longer blocks stay plain: colouring is a nicety

function span(cls, text) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = text;
  return s;
}

/** Fill ``code`` (a <code> element) with ``text``, coloured for ``lang`` if known. */
export function highlightInto(code, text, lang) {
  const rules = LANGS[String(lang).toLowerCase()];
  if (!rules || text.length > MAX_HIGHLIGHT) {
    code.textContent = text;
    return;
  }
  let plain = "";
  const out = [];
  const flush = () => {
    if (plain) out.push(document.createTextNode(plain));
    plain = "";
  };
  let i = 0;
  const n = text.length;
  outer: while (i < n) {
    for (const start of rules.line) {
      if (text.startsWith(start, i)) {
        let end = text.indexOf("\n", i);
        if (end < 0) end = n;
        flush();
        out.push(span("hl-comment", text.slice(i, end)));
        i = end;
        continue outer;
      }
    }
    for (const [open, close] of rules.block) {
      if (text.startsWith(open, i)) {
        let end = text.indexOf(close, i + open.length);
        end = end < 0 ? n : end + close.length;
        flush();
        out.push(span("hl-comment", text.slice(i, end)));
        i = end;
        continue outer;
      }
    }
    const c = text[i];
    if (rules.strings.includes(c)) {
      let j = i + 1;
      while (j < n && text[j] !== c && !(text[j] === "\n" && c !== "`")) j += text[j] === "\\" ? 2 : 1;
      j = Math.min(n, j + 1);
      flush();
      out.push(span("hl-string", text.slice(i, j)));
      i = j;
      continue;
    }
    if (/[0-9]/.test(c) && (i === 0 || !/[\w$]/.test(text[i - 1]))) {
      const m = /^(0x[0-9a-f_]+|[0-9][0-9_]*(\.[0-9_]+)?(e[+-]?[0-9]+)?)/i.exec(text.slice(i, i + 64));
      flush();
      out.push(span("hl-number", m[0]));
      i += m[0].length;
      continue;
    }
    if (/[A-Za-z_$]/.test(c) && (i === 0 || !/[\w$]/.test(text[i - 1]))) {
      const m = /^[A-Za-z_$][\w$]*/.exec(text.slice(i, i + 256));
      if (KEYWORDS.has(m[0])) {
        flush();
        out.push(span("hl-keyword", m[0]));
      } else plain += m[0];
      i += m[0].length;
      continue;
    }
    plain += c;
    i++;
  }
  flush();
  code.replaceChildren(...out);
}
