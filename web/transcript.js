// The conversation of one thread, built from its events (docs/api.md §6.3 kinds). Pure DOM:
// every piece of agent or user text goes through textContent or the Markdown renderer,
// which does the same.
import { renderMarkdown } from "./markdown.js";
import { ToolCard } from "./toolcards.js";

// permission.resolved's `by` when no client answered, in words (docs/api.md §6.4).
const RESOLVED_BY = {
  timeout: "no answer in time",
  agent: "the agent withdrew it",
  interrupt: "interrupted",
  agent_exited: "the agent exited",
  policy: "by policy",
  owner_lost: "the replica running the agent was lost",
  daemon_stopped: "the daemon stopped",
};

const MAX_PREVIEW = 20000; // characters of a tool input/output shown before "…"
const CATCH_UP_RENDER_MS = 400; // while replaying history, render at most this often

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function pretty(value) {
  if (value === undefined || value === null) return "";
  let text;
  if (typeof value === "string") text = value;
  else if (Array.isArray(value) && value.every((b) => b && typeof b === "object" && typeof b.text === "string")) {
    text = value.map((b) => b.text).join("\n"); // content blocks, as tool results carry them
  } else {
    try {
      text = JSON.stringify(value, null, 2);
    } catch {
      text = String(value);
    }
  }
  return text.length > MAX_PREVIEW ? `${text.slice(0, MAX_PREVIEW)}\n… (${text.length - MAX_PREVIEW} more characters)` : text;
}

export function usageText(usage) {
  if (!usage || typeof usage !== "object") return "";
  const parts = [];
  const n = (v) => (typeof v === "number" && v > 0 ? v.toLocaleString() : null);
  if (n(usage.input_tokens)) parts.push(`${n(usage.input_tokens)} in`);
  if (n(usage.output_tokens)) parts.push(`${n(usage.output_tokens)} out`);
  if (n(usage.cache_read_input_tokens)) parts.push(`${n(usage.cache_read_input_tokens)} cached`);
  if (n(usage.total_tokens) && !parts.length) parts.push(`${n(usage.total_tokens)} tokens`);
  return parts.length ? `${parts.join(" · ")} tokens`.replace("tokens tokens", "tokens") : "";
}

// A code block in a reply gets a "Copy" button; what it copies is the code's text, exactly.
function addCopyButton(pre) {
  const wrap = el("div", "code-wrap");
  pre.before(wrap);
  const button = el("button", "code-copy small", "Copy");
  button.type = "button";
  button.title = pre.dataset.lang ? `Copy the ${pre.dataset.lang} code` : "Copy the code";
  button.setAttribute("aria-live", "polite"); // "Copied" is read out
  pre.tabIndex = 0; // a long block scrolls: reachable by keyboard
  wrap.append(button, pre);
}

async function copyCode(button) {
  const code = button.parentElement && button.parentElement.querySelector("pre code");
  if (!code) return;
  const text = code.textContent;
  const say = (msg) => {
    button.textContent = msg;
    clearTimeout(button.resetTimer);
    button.resetTimer = setTimeout(() => {
      button.textContent = "Copy";
    }, 2000);
  };
  try {
    // Only in a secure context (https, or this machine); elsewhere: select it for Ctrl+C.
    if (!navigator.clipboard) throw new Error("no clipboard");
    await navigator.clipboard.writeText(text);
    say("Copied");
  } catch {
    const range = document.createRange();
    range.selectNodeContents(code);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    say("Selected: press Ctrl+C");
  }
}

// Every message can be forked from (web/fork.js answers the button's click): a prompt
// forks the conversation before it, a reply the conversation to the end of its turn.
function forkButton(what) {
  const b = el("button", "msg-fork small", "Fork");
  b.type = "button";
  b.setAttribute("aria-label", what === "user" ? "Fork before this message" : "Fork after this reply's turn");
  b.title =
    what === "user"
      ? "A new thread with the conversation before this message, the message in its box to edit"
      : "A new thread with the conversation up to the end of this reply's turn";
  return b;
}

export class TranscriptView {
  constructor(container) {
    this.root = container;
    this.root.replaceChildren();
    this.blocks = { text: null, thought: null }; // the assistant blocks being streamed
    this.recent = { text: null, thought: null }; // closed by the other channel, final text pending
    this.tools = new Map(); // tool_call_id → card
    this.dirty = new Set();
    this.renderQueued = false;
    this.turnActive = false;
    // Follow the conversation while the reader is at the bottom; stop when they scroll up.
    // (Tracked on scroll, so adding events never forces a layout.) Only a move up lets go:
    // a scroll event is dispatched a frame after the scroll that caused it, and blocks added
    // meanwhile (a prompt, a tool card, a reply's first lines: several wrapped lines on a
    // phone) would otherwise read as the reader having scrolled away.
    this.pinned = true;
    this.lastTop = 0;
    this.catchUpTo = 0; // the thread's last_seq when it was opened: below it, we replay
    this.lastRender = 0;
    this.catchUpTimer = null;
    this.root.onscroll = () => {
      const top = this.root.scrollTop;
      if (this.atBottom()) this.pinned = true;
      else if (top < this.lastTop - 1) this.pinned = false;
      this.lastTop = top;
    };
    // The view resized (a rotated phone, the composer growing, a panel opened): a reader
    // who was at the bottom stays there.
    // (One observer per element: the view of the thread opened before is let go.)
    if (this.root.followResize) this.root.followResize.disconnect();
    if (typeof ResizeObserver === "function") {
      this.root.followResize = new ResizeObserver(() => {
        if (this.pinned) this.toBottom();
      });
      this.root.followResize.observe(this.root);
    }
    // One listener for every code block's copy button (they are rebuilt as text streams).
    this.root.addEventListener("click", (e) => {
      const button = e.target instanceof Element ? e.target.closest(".code-copy") : null;
      if (button) copyCode(button);
    });
  }

  // Keep the view pinned to the bottom while the user is there.
  atBottom() {
    const r = this.root;
    return r.scrollHeight - r.scrollTop - r.clientHeight < 40;
  }

  add(node) {
    this.root.append(node);
    this.touch(node);
    return node;
  }

  /** Marks `node` as showing the event being applied: data-seq the first event's seq (an
   * item of the history starts at its `from`), data-to the last. A search hit's seq is then
   * found in the conversation (web/jump.js). */
  touch(node) {
    const at = this.at;
    if (!at || !node) return;
    if (!node.dataset.seq) node.dataset.seq = String(at.from);
    if (!(Number(node.dataset.to) >= at.seq)) node.dataset.to = String(at.seq);
  }

  apply(events) {
    for (const ev of events) {
      try {
        this.at = typeof ev.seq === "number" ? { seq: ev.seq, from: typeof ev.from === "number" ? ev.from : ev.seq } : null;
        this.one(ev);
      } catch (err) {
        console.warn("event not shown", ev && ev.seq, err);
      }
    }
    this.at = null;
    // Streamed text is re-rendered at most once a frame, however many deltas arrive; while
    // a reload replays history (seq below catchUpTo) at most every CATCH_UP_RENDER_MS, so a
    // long reply is laid out a few times rather than once per frame.
    const last = events.length ? events[events.length - 1].seq : 0;
    const catchingUp = typeof last === "number" && last < this.catchUpTo;
    if (catchingUp && performance.now() - this.lastRender < CATCH_UP_RENDER_MS) {
      if (!this.catchUpTimer) {
        this.catchUpTimer = setTimeout(() => {
          this.catchUpTimer = null;
          this.scheduleRender();
        }, CATCH_UP_RENDER_MS);
      }
      return;
    }
    this.scheduleRender();
  }

  scheduleRender() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      this.lastRender = performance.now();
      this.render();
      if (this.pinned) this.toBottom();
    });
  }

  toBottom() {
    this.root.scrollTop = this.root.scrollHeight;
    this.lastTop = this.root.scrollTop;
  }

  one(ev) {
    const d = ev.data && typeof ev.data === "object" ? ev.data : {};
    switch (ev.kind) {
      case "message":
        if (ev.source === "client") this.userMessage(ev, d);
        // The agent's own user-role lines (its replay of the prompt, its interrupt marker,
        // a sub-agent's prompt) are not the user speaking: only the prompt shows as "You".
        else if (d.role !== "user") this.assistantMessage(d);
        break;
      case "message.delta":
        this.delta(d);
        break;
      case "tool.call":
        this.endBlocks();
        this.toolCall(d, ev);
        break;
      case "tool.result":
        this.toolResult(d, ev);
        break;
      case "tool.progress": {
        const card = this.tools.get(String(d.tool_call_id));
        if (card && typeof d.elapsed_s === "number") card.progress(d.elapsed_s);
        break;
      }
      case "permission.requested":
        this.endBlocks();
        this.note(`Permission requested: ${d.tool ?? "tool"}`, "perm", `perm-${d.request_id}`);
        break;
      case "permission.resolved": {
        const n = this.root.querySelector(`[data-key="perm-${CSS.escape(String(d.request_id))}"]`);
        // A client's answer (rest, websocket, a client_id…) needs no words; the others say why.
        const why = RESOLVED_BY[d.by];
        const text = `Permission ${d.decision === "allow" ? "allowed" : d.decision === "deny" ? "denied" : d.decision ?? "resolved"}${why ? ` (${why})` : ""}`;
        if (n) {
          n.textContent = `${n.textContent} — ${text}`;
          this.touch(n);
        }
        else this.note(text, "perm");
        break;
      }
      case "turn.started":
        this.turnActive = true;
        break;
      case "turn.ended":
        this.turnActive = false;
        this.endBlocks();
        this.turnEnd(d);
        break;
      case "plan":
        this.endBlocks();
        this.plan(d);
        break;
      default:
        break; // diagnostics, tasks and the rest live in the side panels
    }
  }

  userMessage(ev, d) {
    this.endBlocks();
    const box = this.add(el("div", "msg user"));
    if (ev.ts) box.title = `Sent ${ev.ts.replace("T", " ").slice(0, 19)} UTC`;
    // Who speaks is read out, and shown by the message's look (a bubble on the right).
    const who = el("div", "who sr-only", "You:");
    const body = el("div", "body plain");
    body.textContent = typeof d.text === "string" ? d.text : pretty(d.content);
    box.append(who, body);
    if (Array.isArray(d.content)) {
      // The event carries a summary of each attachment (type, media_type), not its data.
      const extra = d.content.filter((b) => b && typeof b === "object" && b.type !== "text");
      if (extra.length) {
        const list = el("ul", "msg-attachments");
        list.setAttribute("aria-label", `${extra.length} attachment${extra.length === 1 ? "" : "s"}`);
        for (const b of extra) {
          const li = el("li", "att-chip", `${b.type === "image" ? "Image" : b.type === "document" ? "Document" : String(b.type)} · ${String(b.media_type ?? "?")}`);
          li.dataset.type = String(b.type);
          li.dataset.mediaType = String(b.media_type ?? "");
          list.append(li);
        }
        box.append(list);
      }
    }
    box.append(forkButton("user"));
  }

  block(channel) {
    let b = this.blocks[channel];
    if (!b) {
      if (channel === "thought") {
        const node = this.add(el("details", "msg thought"));
        const sum = el("summary", null, "Thinking…");
        const body = el("div", "body md");
        node.append(sum, body);
        b = { node, body, text: "", channel };
      } else {
        const node = this.add(el("div", "msg assistant"));
        const who = el("div", "who sr-only", "Agent:");
        const body = el("div", "body md");
        node.append(who, body, forkButton("reply"));
        b = { node, body, text: "", channel };
      }
      this.blocks[channel] = b;
    }
    return b;
  }

  delta(d) {
    if (typeof d.text !== "string") return;
    const channel = d.channel === "thought" ? "thought" : "text";
    if (channel === "text" && this.blocks.thought) {
      this.recent.thought = this.blocks.thought;
      this.finishThought();
    } else if (channel === "thought" && this.blocks.text) {
      this.recent.text = this.blocks.text;
      this.endText();
    }
    const b = this.block(channel);
    this.touch(b.node);
    b.text += d.text;
    b.node.classList.add("streaming");
    this.dirty.add(b);
  }

  assistantMessage(d) {
    if (typeof d.text !== "string") return;
    const channel = d.channel === "thought" ? "thought" : "text";
    // The complete message replaces what its deltas built up: the block being streamed,
    // or the one just closed by deltas of the other channel (thinking, then text).
    if (!this.blocks[channel] && this.recent[channel]) this.blocks[channel] = this.recent[channel];
    this.recent[channel] = null;
    const b = this.block(channel);
    this.touch(b.node);
    b.text = d.text;
    this.dirty.add(b);
    this.render();
    b.node.classList.remove("streaming");
    if (channel === "thought") this.finishThought();
    else this.blocks.text = null;
  }

  finishThought() {
    const b = this.blocks.thought;
    if (!b) return;
    this.render();
    b.node.classList.remove("streaming");
    b.node.querySelector("summary").textContent = "Thought";
    this.blocks.thought = null;
  }

  endText() {
    this.render();
    if (this.blocks.text) this.blocks.text.node.classList.remove("streaming");
    this.blocks.text = null;
  }

  endBlocks() {
    this.finishThought();
    this.endText();
    this.recent = { text: null, thought: null };
  }

  render() {
    for (const b of this.dirty) {
      b.body.replaceChildren(renderMarkdown(b.text));
      for (const pre of b.body.querySelectorAll("pre.md-code")) addCopyButton(pre);
    }
    this.dirty.clear();
  }

  toolCall(d, ev) {
    const id = String(d.tool_call_id ?? "");
    let card = this.tools.get(id);
    if (!card) {
      card = new ToolCard(id);
      this.add(card.node);
      this.tools.set(id, card);
    }
    this.touch(card.node);
    card.call(d, ev);
    return card;
  }

  toolResult(d, ev) {
    const id = String(d.tool_call_id ?? "");
    const card = this.tools.get(id) || this.toolCall({ tool_call_id: id, name: d.name || "tool" });
    this.touch(card.node);
    card.result(d, ev);
  }

  plan(d) {
    const box = this.add(el("div", "plan"));
    box.append(el("div", "label", "Plan"));
    const ol = el("ol");
    for (const e of Array.isArray(d.entries) ? d.entries : []) {
      const li = el("li", `plan-${String(e && e.status ? e.status : "pending").replace(/\W/g, "")}`);
      li.textContent = e && typeof e.content === "string" ? e.content : pretty(e);
      ol.append(li);
    }
    box.append(ol);
  }

  turnEnd(d) {
    const status = String(d.status || "success");
    const parts = [status === "success" ? "Done" : status === "cancelled" ? "Interrupted" : "Turn failed"];
    const usage = usageText(d.usage);
    if (usage) parts.push(usage);
    // An interrupted turn says so and nothing more (what the agent said about it is in the
    // diagnostics); an agent's internal diagnostic is never shown as the reason.
    if (d.error && status !== "cancelled" && !String(d.error).startsWith("[ede_diagnostic]")) {
      parts.push(typeof d.error === "string" ? d.error : pretty(d.error));
    }
    const n = this.add(el("div", `turn-end turn-${status.replace(/\W/g, "")}`, parts.join(" · ")));
    n.dataset.status = status;
  }

  note(text, cls, key) {
    const n = this.add(el("div", `note ${cls || ""}`, text));
    if (key) n.dataset.key = key;
    return n;
  }
}
