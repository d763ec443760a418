// The thread list (left): every thread, newest first, kept current by the change stream
// (feed.js) — listed once, then one frame per change. While the stream is down, states
// show as "unknown": the page does not know them, and a stale "running" would mislead.

import { ThreadFeed } from "./feed.js";
import { api } from "./net.js";
import { THREAD_STATES, ago, el, stateBadge, threadState } from "./dom.js";

const LIST_PAGES = 5; // at most this many pages of 200 threads are listed
const AGO_REFRESH_MS = 60000; // "3 min ago" is re-rendered this often (no request)

const newestFirst = (a, b) => (a.updated_at < b.updated_at ? 1 : a.updated_at > b.updated_at ? -1 : a.id < b.id ? 1 : -1);

export class ThreadList {
  /** onPick(id): a thread was clicked; onThread(thread): a thread object changed;
   * onDeleted(id); onLive(bool); onUnauthorized(). currentId() is the open thread's id. */
  constructor(root, { onPick, onThread, onDeleted, onLive, onUnauthorized, onChange, currentId }) {
    this.root = root;
    this.onPick = onPick;
    this.onThread = onThread;
    this.onDeleted = onDeleted;
    this.onLive = onLive || (() => {});
    this.onUnauthorized = onUnauthorized;
    this.onChange = onChange || (() => {}); // (before, after): a thread the stream changed
    this.currentId = currentId;
    this.threads = new Map();
    this.live = false;
    this.feed = null;
    this.renderQueued = false;
    this.agoTimer = null;
    this.filter = { text: "", state: "" };
    this.showOwners = false; // an admin of users mode sees whose each thread is
  }

  setFilter(change) {
    Object.assign(this.filter, change);
    this.render();
  }

  /** Whether a thread passes the search box (title, agent, folder, model, the state's
   * word) and the state filter (a key of THREAD_STATES; "working" takes in a turn that
   * waits for approval). */
  matches(t) {
    const { text, state } = this.filter;
    const key = threadState(t);
    // Archived threads show only under "Archived" (docs/api.md §4.24), and only they do.
    if ((state === "archived") !== Boolean(t.archived)) return false;
    if (state && state !== "archived" && key !== state && !(state === "working" && key === "asking")) return false;
    const words = text.toLowerCase().split(/\s+/).filter(Boolean);
    const hay = `${t.title || "untitled"} ${t.agent} ${t.cwd} ${THREAD_STATES[key][0]} ${t.state} ${t.model || ""}`;
    return words.every((w) => hay.toLowerCase().includes(w));
  }

  visible() {
    return [...this.threads.values()].filter((t) => this.matches(t)).sort(newestFirst);
  }

  /** The id of the thread `step` places after `id` among those shown (the first without one). */
  neighbour(id, step) {
    const shown = this.visible();
    if (!shown.length) return null;
    const i = shown.findIndex((t) => t.id === id);
    if (i < 0) return shown[step > 0 ? 0 : shown.length - 1].id;
    return shown[Math.max(0, Math.min(shown.length - 1, i + step))].id;
  }

  focus(id) {
    const b = this.root.querySelector(`[data-thread-id="${CSS.escape(id)}"]`);
    if (b) b.focus();
  }

  start() {
    this.stop();
    this.live = false;
    this.feed = new ThreadFeed({
      onList: () => this.list(),
      onFrame: (frame) => this.change(frame),
      onLive: (live) => {
        this.live = live;
        this.render();
        this.onLive(live);
      },
      onUnauthorized: this.onUnauthorized,
    }).start();
    this.agoTimer = setInterval(() => this.render(), AGO_REFRESH_MS);
    this.render();
  }

  stop() {
    if (this.feed) this.feed.close();
    this.feed = null;
    clearInterval(this.agoTimer);
    this.live = false;
  }

  async list() {
    const all = [];
    let cursor = null;
    for (let page = 0; page < LIST_PAGES; page++) {
      const q = new URLSearchParams({ limit: "200", archived: "all" }); // (matches() sorts them out)
      if (cursor) q.set("cursor", cursor);
      const res = await api("GET", `/v1/threads?${q}`);
      all.push(...res.threads);
      cursor = res.next_cursor;
      if (!cursor) break;
    }
    this.threads = new Map(all.map((t) => [t.id, t]));
    this.render();
    const cur = this.threads.get(this.currentId());
    if (cur) this.onThread(cur);
  }

  change(frame) {
    const t = frame.thread;
    if (frame.kind === "thread.deleted") {
      if (!this.threads.delete(t.id)) return;
      this.onDeleted(t.id);
    } else {
      const before = this.threads.get(t.id);
      this.threads.set(t.id, t);
      if (t.id === this.currentId()) this.onThread(t);
      this.onChange(before, t);
    }
    this.scheduleRender();
  }

  /** A thread object the page got from an answer (create, rename, stop, …). */
  upsert(t) {
    if (!t || typeof t.id !== "string") return;
    const known = this.threads.get(t.id);
    if (known && known.updated_at > t.updated_at) return; // the stream already told newer
    this.threads.set(t.id, t);
    this.render();
  }

  remove(id) {
    if (this.threads.delete(id)) this.render();
  }

  /** Permission requests waiting in threads other than `exceptId`. */
  waitingElsewhere(exceptId) {
    let n = 0;
    for (const t of this.threads.values()) if (t.id !== exceptId) n += t.pending_permissions || 0;
    return n;
  }

  scheduleRender() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      this.render();
    });
  }

  render() {
    const list = this.root;
    const active = document.activeElement;
    const focusedId = active && list.contains(active) && active.dataset ? active.dataset.threadId : null;
    const threads = this.visible();
    list.dataset.live = String(this.live);
    list.replaceChildren();
    const filtered = threads.length !== this.threads.size;
    const count = document.getElementById("thread-count");
    if (count) count.textContent = filtered ? `${threads.length} of ${this.threads.size} threads` : "";
    if (!threads.length) {
      const why = filtered ? "No thread matches." : this.live ? "No threads yet." : "Loading threads…";
      list.append(el("li", "empty-list", why));
    }
    for (const t of threads) {
      const li = el("li");
      const b = el("button", "thread-item");
      b.type = "button";
      b.dataset.threadId = t.id;
      if (this.currentId() === t.id) b.setAttribute("aria-current", "true");
      const title = el("span", "t-title", t.title || "Untitled");
      const meta = el("span", "t-meta", `${t.agent} · ${t.cwd}`);
      if (this.showOwners) meta.prepend(el("span", "t-owner", `${t.owner || "no owner"} · `));
      const foot = el("span", "t-foot");
      foot.append(stateBadge(t, { live: this.live }), el("span", "t-when", ago(t.updated_at)));
      b.append(title, meta, foot);
      b.addEventListener("click", () => this.onPick(t.id));
      li.append(b);
      list.append(li);
      if (focusedId === t.id) b.focus();
    }
  }
}
