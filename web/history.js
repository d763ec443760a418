// A long thread opens from its compacted history (docs/api.md §4.16), not by replaying
// every event: the newest page of items is shown, the stream continues live from the
// page's last_seq, and older pages are put on top as the reader scrolls up to them. A
// thread of a million events then opens as fast as a short one. What the history leaves
// out (diagnostics, tasks, status lines) is not shown for the part of such a thread before
// it was opened: the exact transcript still holds it.
import { api } from "./net.js";
import { el } from "./dom.js";
import { TranscriptView } from "./transcript.js";

export const HISTORY_FROM_EVENTS = 5000; // a thread with more events than this opens from its history
const PAGE_ITEMS = 200;

/** The events threshold (a test lowers it through localStorage). */
export function historyFrom() {
  const set = Number(globalThis.localStorage?.getItem("agent-bridge.history-from"));
  return Number.isFinite(set) && set > 0 ? set : HISTORY_FROM_EVENTS;
}

export function fetchPage(threadId, before) {
  const q = `limit=${PAGE_ITEMS}${before ? `&before=${before}` : ""}`;
  return api("GET", `/v1/threads/${encodeURIComponent(threadId)}/history?${q}`);
}

const TOOL_KEYS = ["tool_call_id", "name", "input", "title", "kind", "status", "content", "locations", "parent_tool_use_id"];

/** The events that show an item as the view shows the events it was compacted from. */
export function itemEvents(item) {
  // `from`: where the item begins, so that the view knows every seq the item covers.
  const ev = (kind, source, data, seq = item.from) => ({ seq, from: item.from, kind, source, data });
  switch (item.type) {
    case "message":
      if (item.role === "user") {
        if (item.by_agent) return []; // the agent's own user-role line: not shown either
        return [ev("message", "client", { role: "user", text: item.text, content: item.content, turn_id: item.turn_id })];
      }
      return [ev("message", "agent", { role: item.role, text: item.text, channel: item.channel }, item.to)];
    case "tool": {
      const call = {};
      for (const k of TOOL_KEYS) if (item[k] !== undefined) call[k] = item[k];
      const out = [ev("tool.call", "agent", call)];
      if (item.output !== undefined) {
        out.push(ev("tool.result", "agent", { tool_call_id: item.tool_call_id, output: item.output, is_error: item.is_error }, item.to));
      }
      return out;
    }
    case "permission": {
      const out = [ev("permission.requested", "agent", { request_id: item.request_id, tool: item.tool, input: item.input })];
      if (item.decision !== undefined) {
        out.push(ev("permission.resolved", "bridge", { request_id: item.request_id, decision: item.decision, by: item.by }, item.to));
      }
      return out;
    }
    case "plan":
      return [ev("plan", "agent", { entries: item.entries }, item.to)];
    case "turn":
      return [ev("turn.ended", "bridge", { turn_id: item.turn_id, status: item.status, reason: item.reason, error: item.error, usage: item.usage })];
    default:
      return [];
  }
}

export function pageEvents(page) {
  return (page.items || []).flatMap(itemEvents);
}

/**
 * Older pages on top of `view`, loaded when the reader reaches the top (or presses the
 * button there). Each page is laid out in a view of its own, off the page, then put
 * before what is shown, the scroll position kept on what the reader was looking at.
 */
export class OlderPages {
  constructor(threadId, view, before, isCurrent) {
    this.threadId = threadId;
    this.view = view;
    this.before = before;
    this.isCurrent = isCurrent;
    this.loading = null; // the page being fetched (a promise)
    this.button = el("button", "older-history", "Show older messages");
    this.button.type = "button";
    this.button.onclick = () => this.load();
    view.root.prepend(this.button);
    this.onScroll = () => {
      if (view.root.scrollTop < 80) this.load();
    };
    view.root.addEventListener("scroll", this.onScroll, { passive: true });
  }

  /** The next older page put on top; a load already under way is the one waited for. */
  load() {
    if (!this.before) return Promise.resolve();
    if (!this.loading) this.loading = this.loadPage();
    return this.loading;
  }

  async loadPage() {
    this.button.disabled = true;
    try {
      const page = await fetchPage(this.threadId, this.before);
      if (!this.isCurrent()) return;
      const shelf = new TranscriptView(document.createElement("div"));
      shelf.apply(pageEvents(page));
      shelf.endBlocks();
      shelf.render();
      const root = this.view.root;
      const fromBottom = root.scrollHeight - root.scrollTop;
      this.button.after(...shelf.root.childNodes);
      root.scrollTop = root.scrollHeight - fromBottom;
      this.before = page.more ? page.before : null;
    } catch {
      /* left as it is: the button tries again */
    } finally {
      this.loading = null;
      this.button.disabled = false;
      if (!this.before) {
        this.button.remove();
        this.view.root.removeEventListener("scroll", this.onScroll);
      }
    }
  }
}
