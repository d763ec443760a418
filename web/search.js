// Search over what was said in the caller's threads (GET /v1/search, docs/api.md §4.22):
// the words of the thread box, looked for in prompts, answers and tools when asked (the
// button, or Enter in the box). Each hit names its thread and shows its snippet with the
// matched words marked; the snippet is built as text, never as markup (it is the agent's
// or the user's words). A click opens the thread at the event found (web/jump.js).

import { api } from "./net.js";
import { el } from "./dom.js";

const LIMIT = 50;

export class MessageSearch {
  /** title(id): the thread's title as the list knows it; onOpen(id, seq): open that thread
   * at that event. */
  constructor({ title, onOpen }) {
    this.input = document.getElementById("thread-search");
    this.root = document.getElementById("search-results");
    this.status = document.getElementById("search-status");
    this.hits = document.getElementById("search-hits");
    this.title = title;
    this.onOpen = onOpen;
    this.asked = 0; // the newest search's number: an older answer that comes late is dropped
  }

  bind() {
    document.getElementById("search-messages").addEventListener("click", () => this.run());
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        e.preventDefault();
        this.run();
      }
    });
    this.input.addEventListener("input", () => {
      if (!this.input.value.trim()) this.clear();
    });
    return this;
  }

  clear() {
    this.asked++;
    this.root.hidden = true;
    this.hits.replaceChildren();
    this.status.textContent = "";
  }

  async run() {
    const q = this.input.value.trim();
    if (!q) return this.clear();
    const n = ++this.asked;
    this.root.hidden = false;
    this.status.textContent = "Searching…";
    let res;
    try {
      res = await api("GET", `/v1/search?${new URLSearchParams({ q, limit: String(LIMIT) })}`);
    } catch (err) {
      if (n !== this.asked) return;
      this.hits.replaceChildren();
      this.status.textContent = err.message;
      return;
    }
    if (n !== this.asked) return;
    this.render(res.hits);
  }

  render(hits) {
    this.hits.replaceChildren();
    this.status.textContent = hits.length
      ? `${hits.length}${hits.length === LIMIT ? "+" : ""} found in messages`
      : "Nothing found in messages.";
    for (const h of hits) {
      const b = el("button", "search-hit");
      b.type = "button";
      b.dataset.threadId = h.thread;
      b.dataset.seq = String(h.seq);
      b.append(el("span", "hit-thread", this.title(h.thread)), snippet(h));
      b.addEventListener("click", () => this.onOpen(h.thread, h.seq));
      const li = el("li");
      li.append(b);
      this.hits.append(li);
    }
  }
}

/** The snippet as text with <mark>s where the words matched (marks count code points). */
function snippet(hit) {
  const out = el("span", "hit-snippet");
  const chars = Array.from(hit.snippet);
  let at = 0;
  for (const [start, length] of hit.marks) {
    if (start < at) continue;
    out.append(chars.slice(at, start).join(""), el("mark", "", chars.slice(start, start + length).join("")));
    at = start + length;
  }
  out.append(chars.slice(at).join(""));
  return out;
}
