// Background notifications (opt-in): while the tab is hidden, a desktop notification when
// a thread's turn ends or a permission request starts waiting, from the change stream
// (every thread, not only the open one). Uses the browser's Notification API only after
// the user turned it on (the button asks the browser's permission); the choice is kept in
// localStorage.

const KEY = "agent-bridge.notify";

export class Notifier {
  constructor(button, { onOpen }) {
    this.button = button;
    this.onOpen = onOpen;
    this.supported = typeof Notification === "function";
    button.hidden = !this.supported;
    button.addEventListener("click", () => this.toggle());
    this.render();
  }

  get on() {
    return this.supported && Notification.permission === "granted" && localStorage.getItem(KEY) === "on";
  }

  async toggle() {
    if (this.on) {
      localStorage.setItem(KEY, "off");
    } else {
      const answer = Notification.permission === "granted" ? "granted" : await Notification.requestPermission();
      localStorage.setItem(KEY, answer === "granted" ? "on" : "off");
    }
    this.render();
  }

  render() {
    const on = this.on;
    this.button.setAttribute("aria-pressed", String(on));
    this.button.textContent = on ? "Notifications on" : "Notify me";
    this.button.title = !this.supported
      ? ""
      : Notification.permission === "denied"
        ? "The browser blocks notifications for this page"
        : on
          ? "Turn background notifications off"
          : "Notify me when a turn ends or a permission waits while this tab is hidden";
  }

  /** A thread changed from `before` to `after` (thread objects of the change stream).
   * The stream tells a thread's newest state, so a turn shorter than its batching (about
   * half a second) may never show as active: such a turn is not announced, except in the
   * open thread, whose own events tell every turn's end (turnEnded). */
  changed(before, after, openId) {
    if (!before || !this.on || !document.hidden) return;
    if ((after.pending_permissions || 0) > (before.pending_permissions || 0)) {
      this.show(after.id, `Permission waiting — ${after.title || "Untitled"}`, `The agent (${after.agent}) asks to use a tool.`, "perm");
    } else if (before.turn_active && !after.turn_active && after.id !== openId) this.turnEnded(after);
  }

  turnEnded(t) {
    if (this.on && document.hidden) this.show(t.id, `Turn ended — ${t.title || "Untitled"}`, `${t.agent} · ${t.cwd}`, "turn");
  }

  show(threadId, title, body, what) {
    try {
      const n = new Notification(title, { body, tag: `${what}-${threadId}` });
      n.onclick = () => {
        window.focus();
        this.onOpen(threadId);
        n.close();
      };
    } catch {
      /* some browsers allow notifications from a service worker only */
    }
  }
}
