// A tool call in the conversation: a card, collapsed to one line — tool, main argument,
// status, exit status (Bash), duration — that opens to the details: a shell command, an
// edit as a unified diff (diff.js), or the input as JSON; then the result, cut to its first
// lines with "Show all", and any images it returned.

import { acpDiffs, changesOf, renderChanges } from "./diff.js";
import { el } from "./dom.js";

const PREVIEW_LINES = 30;
const PREVIEW_CHARS = 4000;
const MAX_OUTPUT = 1_000_000; // characters kept of one result (the page must stay usable)
const MAX_ARG = 120;
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
const ARG_KEYS = ["command", "file_path", "notebook_path", "path", "pattern", "url", "query", "description", "prompt"];

/** A value as text: a string as it is; text content blocks joined; anything else as JSON. */
export function asText(value, cap = MAX_OUTPUT) {
  if (value === undefined || value === null) return "";
  let text;
  if (typeof value === "string") text = value;
  else if (Array.isArray(value) && value.every((b) => b && typeof b === "object" && b.type !== undefined)) {
    text = value.filter((b) => typeof b.text === "string").map((b) => b.text).join("\n");
  } else {
    try {
      text = JSON.stringify(value, null, 2);
    } catch {
      text = String(value);
    }
  }
  return text.length > cap ? `${text.slice(0, cap)}\n… (${text.length - cap} more characters not kept)` : text;
}

function mainArgument(input) {
  if (!input || typeof input !== "object") return "";
  for (const k of ARG_KEYS) {
    if (typeof input[k] === "string" && input[k].trim()) {
      const one = input[k].trim().split("\n")[0];
      return one.length > MAX_ARG ? `${one.slice(0, MAX_ARG)}…` : one;
    }
  }
  return "";
}

function duration(ms) {
  if (!(ms >= 0)) return "";
  return ms < 1000 ? `${Math.round(ms)} ms` : ms < 60000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

const isShell = (name, input) => /^(bash|shell|execute|terminal)$/i.test(String(name || "")) && input && typeof input.command === "string";

/** How a shell command ended, from the result (Claude Code says "Exit code N" on failure). */
function exitStatus(d, raw) {
  const extra = raw && raw.tool_use_result && typeof raw.tool_use_result === "object" ? raw.tool_use_result : {};
  if (extra.interrupted === true) return "interrupted";
  if (!d.is_error) return "exit 0";
  const m = /\bexit(?:ed with)?(?: code| status)?[: ]+(\d+)/i.exec(asText(d.output, 400));
  return m ? `exit ${m[1]}` : "failed";
}

function images(output) {
  const out = [];
  for (const b of Array.isArray(output) ? output : []) {
    if (!b || typeof b !== "object" || b.type !== "image") continue;
    const src = b.source && typeof b.source === "object" ? b.source : b; // Anthropic block, or ACP {data, mimeType}
    const type = String(src.media_type ?? src.mimeType ?? "").toLowerCase();
    const data = src.data;
    if (IMAGE_TYPES.includes(type) && typeof data === "string" && /^[A-Za-z0-9+/=\s]+$/.test(data)) out.push({ type, data });
  }
  return out;
}

/** A box that may scroll is reachable by keyboard (Tab, then the arrows). */
export function scrollable(node) {
  node.tabIndex = 0;
  return node;
}

export class ToolCard {
  constructor(id) {
    this.data = {};
    this.done = false;
    this.started = null;
    const node = el("details", "tool");
    node.dataset.toolCallId = id;
    const sum = el("summary");
    this.name = el("span", "tool-name");
    this.arg = el("span", "tool-arg");
    this.title = el("span", "tool-title");
    this.status = el("span", "badge tool-status", "running");
    this.exit = el("span", "badge tool-exit");
    this.time = el("span", "tool-time");
    this.exit.hidden = true;
    sum.append(this.name, this.arg, this.title, this.status, this.exit, this.time);
    this.command = scrollable(el("pre", "tool-command"));
    this.command.hidden = true;
    this.diff = el("div", "tool-diff");
    this.diff.hidden = true;
    this.inputBox = el("details", "tool-raw");
    this.inputBox.append(el("summary", "label", "Input"));
    this.input = scrollable(el("pre", "tool-input"));
    this.inputBox.append(this.input);
    this.outputLabel = el("div", "label", "Result");
    this.output = scrollable(el("pre", "tool-output"));
    this.more = el("button", "tool-more small");
    this.more.type = "button";
    this.more.addEventListener("click", () => this.showAll());
    this.pictures = el("div", "tool-images");
    this.outputLabel.hidden = this.output.hidden = this.more.hidden = this.pictures.hidden = true;
    node.append(sum, this.command, this.diff, this.inputBox, this.outputLabel, this.output, this.more, this.pictures);
    this.node = node;
  }

  call(d, ev) {
    if (this.started === null && ev && ev.ts) this.started = Date.parse(ev.ts);
    Object.assign(this.data, d);
    const { name, input, title } = this.data;
    this.name.textContent = name || "tool";
    this.title.textContent = title && title !== name ? title : "";
    this.arg.textContent = this.title.textContent ? "" : mainArgument(input);
    if (d.input !== undefined) this.showInput(name, input);
    const diffs = ev ? acpDiffs(ev.raw) : [];
    if (diffs.length) this.showDiff(diffs);
    if (d.status && !this.done) this.status.textContent = String(d.status);
  }

  showInput(name, input) {
    this.input.textContent = asText(input, 20000);
    const shell = isShell(name, input);
    this.command.hidden = !shell;
    if (shell) this.command.textContent = `$ ${input.command}`;
    const changes = changesOf(name, input);
    if (changes && changes.length) this.showDiff(changes);
    // Shown another way: the raw input stays one click away.
    this.inputBox.open = !shell && !(changes && changes.length);
  }

  showDiff(changes) {
    this.diff.replaceChildren(renderChanges(changes));
    this.diff.hidden = false;
    this.inputBox.open = false;
  }

  progress(elapsed) {
    if (!this.done) this.status.textContent = `running · ${Math.round(elapsed)} s`;
  }

  result(d, ev) {
    this.done = true;
    this.full = asText(d.output) || (images(d.output).length ? "" : "(no output)");
    const lines = this.full.split("\n");
    const cut = lines.length > PREVIEW_LINES || this.full.length > PREVIEW_CHARS;
    this.output.textContent = cut ? lines.slice(0, PREVIEW_LINES).join("\n").slice(0, PREVIEW_CHARS) : this.full;
    this.more.textContent = `Show all (${lines.length} lines, ${this.full.length.toLocaleString()} characters)`;
    this.more.hidden = !cut;
    this.output.classList.toggle("cut", cut);
    this.output.hidden = this.outputLabel.hidden = !this.full;
    this.status.textContent = d.is_error ? "error" : "done";
    this.node.classList.toggle("error", !!d.is_error);
    if (isShell(this.data.name, this.data.input)) {
      this.exit.textContent = exitStatus(d, ev && ev.raw);
      this.exit.hidden = false;
      this.exit.classList.toggle("bad", this.exit.textContent !== "exit 0");
    }
    const took = ev && ev.ts && this.started !== null ? Date.parse(ev.ts) - this.started : NaN;
    this.time.textContent = duration(took);
    const pics = images(d.output);
    this.pictures.replaceChildren();
    for (const p of pics) {
      const img = el("img", "tool-image");
      img.alt = `Image returned by ${this.data.name || "the tool"}`;
      img.src = `data:${p.type};base64,${p.data.replace(/\s/g, "")}`;
      this.pictures.append(img);
    }
    this.pictures.hidden = !pics.length;
  }

  showAll() {
    this.output.textContent = this.full;
    this.output.classList.remove("cut");
    this.more.hidden = true;
  }
}
