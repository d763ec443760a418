// Small DOM and text helpers shared by the page's modules. Text is only ever placed with
// textContent.

export const $ = (sel) => document.querySelector(sel);

export function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function ago(iso) {
  const t = Date.parse(iso);
  if (!t) return "";
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(t).toLocaleDateString();
}

export function sizeText(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(n < 10240 ? 1 : 0)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

// What a thread is doing, in the words the page uses everywhere (the list, the thread's
// header, the state filter, the status line; docs/web.md "Thread states"): the API's
// state (idle, starting, running, stopping, exited) with whether a turn runs and whether
// a permission request waits for an answer.
export const THREAD_STATES = {
  new: ["not started", "No agent process yet: the first message starts it."],
  starting: ["starting…", "The agent is starting."],
  ready: ["ready", "The agent is running and waits for a message."],
  working: ["working…", "The agent is on a turn: replying or using tools."],
  asking: ["needs approval", "The agent waits for an answer to a permission request."],
  stopping: ["stopping…", "The agent is being stopped."],
  stopped: ["stopped", "The agent is not running; the next message, or Resume, starts it again with the conversation."],
  unknown: ["unknown", "Not known while the page is reconnecting."],
};

/** The key of THREAD_STATES for thread `t` (turnActive and pending, when given, are the
 * open thread's own, fresher than the thread object's). */
export function threadState(t, { live = true, turnActive, pending } = {}) {
  if (!live) return "unknown";
  const active = turnActive ?? Boolean(t.turn_active);
  const waiting = pending ?? (t.pending_permissions || 0);
  switch (t.state) {
    case "idle":
      return "new";
    case "starting":
    case "stopping":
      return t.state;
    case "exited":
      return "stopped";
    case "running":
      return waiting > 0 ? "asking" : active ? "working" : "ready";
    default:
      return "unknown";
  }
}

/** A badge naming thread `t`'s state (see threadState for the options). */
export function stateBadge(t, options) {
  const key = threadState(t, options);
  const [word, meaning] = THREAD_STATES[key];
  const badge = el("span", `badge tstate-${key}`, word);
  badge.title = meaning;
  badge.dataset.state = key;
  return badge;
}
