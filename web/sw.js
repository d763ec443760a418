// The page's service worker (docs/web.md "Install and push"), served as /sw.js with scope /.
// It caches nothing (the page needs the daemon anyway) and does three things: shows a Web
// Push as a notification, opens or focuses the thread when one is clicked, and answers a
// permission from the notification's Allow/Deny buttons where the browser shows them. The
// answer is a same-origin fetch: it carries the page's session cookie (SameSite=Strict still
// applies: the worker's requests are first-party), so the worker holds no credential of its
// own; a signed-out browser's answer is refused (401) and the thread is opened instead.

const TAGS = { permission: "perm", elicitation: "elicit", turn_ended: "turn", turn_failed: "turn" };

/** The daemon's payload (bridge/push/rules.py Notice.payload), or null if it is not one. */
function parse(text) {
  try {
    const p = JSON.parse(text);
    if (p && p.v === 1 && typeof p.thread_id === "string" && typeof p.kind === "string") return p;
  } catch {
    /* not JSON */
  }
  return null;
}

function notificationFor(p) {
  const opts = {
    body: String(p.line || ""),
    // The same tag as the page's own notifications (notify.js): one replaces the other.
    tag: `${TAGS[p.kind] || "turn"}-${p.thread_id}`,
    icon: "/assets/icon-192.png",
    data: { thread_id: p.thread_id, kind: p.kind, request_id: typeof p.request_id === "string" ? p.request_id : null },
    requireInteraction: p.kind === "permission" || p.kind === "elicitation",
  };
  if (p.kind === "permission" && opts.data.request_id) {
    opts.actions = [
      { action: "allow", title: "Allow" },
      { action: "deny", title: "Deny" },
    ];
  }
  return [String(p.title || "agent-bridge"), opts];
}

async function showPush(text) {
  const p = parse(text);
  // A push must show something (userVisibleOnly); one the worker cannot read says so.
  if (!p) return self.registration.showNotification("agent-bridge", { body: "A thread needs you.", tag: "unknown" });
  const [title, opts] = notificationFor(p);
  return self.registration.showNotification(title, opts);
}

async function answer(threadId, requestId, decision) {
  try {
    const r = await fetch(`/v1/threads/${encodeURIComponent(threadId)}/permissions/${encodeURIComponent(requestId)}`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ decision }),
    });
    return r.ok;
  } catch {
    return false;
  }
}

async function openThread(threadId) {
  const url = new URL(`/#t=${encodeURIComponent(threadId)}`, self.location.origin).href;
  const pages = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  const page = pages.find((c) => new URL(c.url).origin === self.location.origin);
  // focus() and openWindow() are allowed only while a notification click is being
  // handled; the message opens the thread either way.
  try {
    if (page) {
      page.postMessage({ type: "open-thread", thread_id: threadId });
      await page.focus();
    } else {
      await self.clients.openWindow(url);
    }
  } catch {
    /* not from a click: nothing to focus */
  }
}

/** A click on the notification (action "") or one of its buttons. */
async function clicked(notification, action) {
  const data = notification.data || {};
  notification.close();
  if ((action === "allow" || action === "deny") && data.request_id) {
    // Answered: nothing to open. Refused (already answered, signed out): open the thread.
    if (await answer(data.thread_id, data.request_id, action)) return "answered";
  }
  if (typeof data.thread_id === "string") await openThread(data.thread_id);
  return "opened";
}

// For tests (tests/web/test_page_push.py): the handlers, callable without a real push.
self.agentBridge = { parse, notificationFor, showPush, clicked, answer };

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));
self.addEventListener("push", (event) => event.waitUntil(showPush(event.data ? event.data.text() : "")));
self.addEventListener("notificationclick", (event) => event.waitUntil(clicked(event.notification, event.action)));
