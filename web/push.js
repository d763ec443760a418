// Web Push (opt-in): the "Push" button subscribes this browser so that the daemon notifies it
// while no page has the thread open, even with every tab closed (docs/web.md "Install and
// push"). It registers the service worker (/sw.js); without one (an old browser, plain http
// on another host, a private window) the button stays hidden and the page works as before.
// Subscribing asks the browser's notification permission, subscribes with the daemon's VAPID
// key and sends the subscription to /v1/me/push-subscriptions; the row's id is kept in
// localStorage so that unsubscribing removes it.

import { api } from "./net.js";

const KEY = "agent-bridge.push-subscription";

function keyBytes(b64url) {
  const b64 = b64url.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (b64url.length % 4)) % 4);
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}

export class PushControl {
  constructor(button, { onOpen }) {
    this.button = button;
    this.onOpen = onOpen;
    this.reg = null;
    this.vapidKey = null;
    this.subscribed = false;
    button.hidden = true;
    button.addEventListener("click", () => this.toggle());
  }

  /** Registers the worker and shows the button when push can work here. */
  async start() {
    if (!("serviceWorker" in navigator) || !window.isSecureContext) return;
    try {
      this.reg = await navigator.serviceWorker.register("/sw.js", { scope: "/" });
    } catch {
      return; // no worker: the page works without one
    }
    if (!this.reg) return; // a browser that blocks workers may resolve with nothing
    navigator.serviceWorker.addEventListener("message", (e) => {
      if (e.data && e.data.type === "open-thread" && typeof e.data.thread_id === "string") this.onOpen(e.data.thread_id);
    });
    if (!("PushManager" in window) || !this.reg.pushManager) return;
    try {
      this.vapidKey = (await api("GET", "/v1/me/push-subscriptions")).vapid_public_key;
    } catch {
      return; // push off on this daemon (409 push_disabled)
    }
    this.subscribed = Boolean(localStorage.getItem(KEY)) && Boolean(await this.reg.pushManager.getSubscription());
    this.button.hidden = false;
    this.render();
  }

  async toggle() {
    this.button.disabled = true;
    try {
      if (this.subscribed) await this.unsubscribe();
      else await this.subscribe();
    } catch (err) {
      this.button.title = `Push: ${err.message || err}`;
    } finally {
      this.button.disabled = false;
      this.render();
    }
  }

  async subscribe() {
    if (Notification.permission !== "granted" && (await Notification.requestPermission()) !== "granted") {
      throw new Error("the browser blocks notifications for this page");
    }
    const sub = await this.reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: keyBytes(this.vapidKey) });
    const row = await api("POST", "/v1/me/push-subscriptions", sub.toJSON());
    localStorage.setItem(KEY, row.id);
    this.subscribed = true;
  }

  async unsubscribe() {
    const sub = await this.reg.pushManager.getSubscription();
    if (sub) await sub.unsubscribe();
    const id = localStorage.getItem(KEY);
    localStorage.removeItem(KEY);
    this.subscribed = false;
    if (id) {
      try {
        await api("DELETE", `/v1/me/push-subscriptions/${encodeURIComponent(id)}`);
      } catch {
        /* gone already */
      }
    }
  }

  render() {
    this.button.setAttribute("aria-pressed", String(this.subscribed));
    this.button.textContent = this.subscribed ? "Push on" : "Push";
    this.button.title = this.subscribed
      ? "This browser is told of permissions and finished turns even with the page closed; click to stop"
      : "Notify this browser of permissions and finished turns even with the page closed";
  }
}
