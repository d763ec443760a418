// One thread's event stream: the WebSocket (`/v1/threads/{id}/ws?after=SEQ`), and
// long-polling (`/events?after=&wait=`) when WebSockets cannot connect. Every event is
// delivered once, in seq order: the stream remembers the last seq it delivered,
// reconnects with `after=` it, and drops anything at or below it (docs/api.md §5.2, §4.10).
//
// States reported to onState: "connecting", "live" (WebSocket open), "reconnecting",
// "polling" (the fallback), "offline" (the daemon does not answer; retrying), "gone".
//
// A WebSocket that fails is not taken for a proxy that breaks WebSockets until /healthz
// says the daemon is there: while it is down (a restart) the stream only probes /healthz,
// with a backoff of at most 1 s that resets on success, and goes straight back to the
// WebSocket when the daemon answers.

import { Backoff, daemonUp, untilDaemonUp } from "./net.js";

// Close code 1013 (reason store_unavailable): the daemon's store is down for now.
const STORE_UNAVAILABLE = 1013;
const STORE_RETRY_MS = 2000;

const WS_FAILURES_BEFORE_POLLING = 3; // consecutive WebSockets that never opened
const RETRY_WS_AFTER_MS = 30000; // while polling, try a WebSocket again this often
const POLL_WAIT_S = 25;
const POLL_LIMIT = 500;
const FLUSH_MS = 15;
const CATCH_UP_PAGE = 1000; // the API's largest page

export class ThreadStream {
  constructor(threadId, { onEvents, onEphemeral, onState, onGone, onUnauthorized, forcePolling = false }) {
    this.threadId = threadId;
    this.onEvents = onEvents;
    this.onEphemeral = onEphemeral || (() => {});
    this.onState = onState || (() => {});
    this.onGone = onGone || (() => {});
    this.onUnauthorized = onUnauthorized || (() => {});
    this.lastSeq = 0;
    this.closed = false;
    this.ws = null;
    this.wsFailures = 0;
    this.backoff = new Backoff();
    this.forcePolling = forcePolling;
    this.mode = "ws";
    this.pollAbort = null;
    this.timer = null;
    this.pending = [];
    this.flushQueued = false;
    this.state = "";
  }

  /** Waits until the daemon answers /healthz again (closing ends the wait). */
  async untilUp() {
    this.setState("offline");
    this.probing = true;
    try {
      await untilDaemonUp(this.backoff, () => this.closed, this);
    } finally {
      this.probing = false;
    }
  }

  async start() {
    this.setState("connecting");
    // History first, in pages of CATCH_UP_PAGE over REST: one response per thousand events
    // is far cheaper for a browser than a WebSocket frame per event. Then live, from there.
    try {
      await this.catchUp();
    } catch {
      /* the WebSocket (or long-polling) replays whatever is left */
    }
    if (this.closed) return;
    if (this.forcePolling) this.startPolling();
    else this.connectWs();
  }

  async catchUp() {
    for (;;) {
      const r = await fetch(
        `/v1/threads/${encodeURIComponent(this.threadId)}/events?after=${this.lastSeq}&limit=${CATCH_UP_PAGE}`,
        { credentials: "same-origin", cache: "no-store" },
      );
      if (this.closed || !r.ok) return;
      const page = await r.json();
      const events = page.events || [];
      for (const ev of events) this.accept(ev);
      this.flush();
      if (events.length < CATCH_UP_PAGE) return;
    }
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) {
      this.ws.onclose = null;
      this.ws.close(1000);
      this.ws = null;
    }
    if (this.pollAbort) this.pollAbort.abort();
  }

  /** Reconnect now (the browser says the network is back, or the tab became visible). */
  nudge() {
    if (this.closed) return;
    if (this.mode === "ws" && !this.ws && !this.probing) {
      clearTimeout(this.timer);
      this.backoff.reset();
      this.connectWs();
    }
  }

  setState(state) {
    if (state === this.state) return;
    this.state = state;
    this.onState(state);
  }

  // Events arrive one frame at a time; the view gets them in batches (at most one every
  // FLUSH_MS), so a burst of deltas — or a reload replaying a long transcript — costs one
  // layout and one render per batch, not per event.
  accept(ev) {
    if (typeof ev.seq !== "number") {
      this.onEphemeral(ev);
      return;
    }
    if (ev.seq <= this.lastSeq) return; // already delivered (a resend after reconnecting)
    this.lastSeq = ev.seq;
    this.pending.push(ev);
    if (!this.flushQueued) {
      this.flushQueued = true;
      setTimeout(() => this.flush(), FLUSH_MS);
    }
  }

  flush() {
    // (Also called directly after a page of events; a timer still pending finds nothing.)
    this.flushQueued = false;
    const batch = this.pending;
    this.pending = [];
    if (batch.length && !this.closed) this.onEvents(batch);
  }

  // ---------------------------------------------------------------- WebSocket

  connectWs() {
    if (this.closed) return;
    this.mode = "ws";
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${proto}//${location.host}/v1/threads/${encodeURIComponent(this.threadId)}/ws?after=${this.lastSeq}`;
    let opened = false;
    let ws;
    try {
      // The session cookie authenticates; the subprotocol names the API version.
      ws = new WebSocket(url, ["agent-bridge.v1"]);
    } catch {
      this.wsFailed(false);
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      opened = true;
      this.wsFailures = 0;
      this.backoff.reset();
      this.setState("live");
    };
    ws.onmessage = (msg) => {
      let ev;
      try {
        ev = JSON.parse(msg.data);
      } catch {
        return;
      }
      if (ev && typeof ev === "object") this.accept(ev);
    };
    ws.onclose = (e) => {
      this.ws = null;
      if (this.closed) return;
      if (e.code === 4404 || e.code === 4410) {
        this.setState("gone");
        this.onGone(e.code === 4410 ? "deleted" : "not_found");
        return;
      }
      if (e.code === STORE_UNAVAILABLE) {
        // The daemon is up but cannot read the transcript (its notice said why): try
        // again later, not at once, and not by long-polling (which would be refused too).
        this.setState("reconnecting");
        this.timer = setTimeout(() => this.connectWs(), STORE_RETRY_MS);
        return;
      }
      this.wsFailed(opened);
    };
  }

  async wsFailed(hadOpened) {
    if (hadOpened) {
      // It was working: try again at once (a daemon going down fails that one, below).
      this.setState("reconnecting");
      this.timer = setTimeout(() => this.connectWs(), 100);
      return;
    }
    const wait = this.backoff.next();
    if (!(await daemonUp())) {
      await this.untilUp(); // a restart, not a broken WebSocket
      this.connectWs();
      return;
    }
    if (this.closed) return;
    if (++this.wsFailures >= WS_FAILURES_BEFORE_POLLING) {
      this.startPolling();
      return;
    }
    this.setState("reconnecting");
    this.timer = setTimeout(() => this.connectWs(), wait);
  }

  // ---------------------------------------------------------------- long-polling

  async startPolling() {
    if (this.closed) return;
    this.mode = "poll";
    this.setState("polling");
    const until = Date.now() + RETRY_WS_AFTER_MS;
    let backoff = 250;
    while (!this.closed && (this.forcePolling || Date.now() < until)) {
      this.pollAbort = new AbortController();
      try {
        const r = await fetch(
          `/v1/threads/${encodeURIComponent(this.threadId)}/events?after=${this.lastSeq}&limit=${POLL_LIMIT}&wait=${POLL_WAIT_S}`,
          { credentials: "same-origin", signal: this.pollAbort.signal, cache: "no-store" },
        );
        if (r.status === 404) {
          this.setState("gone");
          this.onGone("not_found");
          return;
        }
        if (r.status === 401) {
          // The session ended (logout, expiry, a daemon restart): sign in again.
          this.setState("idle");
          this.onUnauthorized();
          return;
        }
        if (!r.ok) throw new Error(`HTTP ${r.status}`);
        const page = await r.json();
        this.setState("polling");
        backoff = 250;
        for (const ev of page.events || []) this.accept(ev);
        this.flush();
      } catch (err) {
        if (this.closed) return;
        if (!(await daemonUp())) {
          // The daemon went away: once it is back, the WebSocket is worth a try at once.
          await this.untilUp();
          if (!this.forcePolling) break;
          continue;
        }
        this.setState("polling");
        await new Promise((res) => {
          this.timer = setTimeout(res, backoff);
        });
        backoff = Math.min(backoff * 2, 5000);
      }
    }
    if (this.closed) return;
    // Time to see whether WebSockets work again; one failure brings us back here.
    this.wsFailures = WS_FAILURES_BEFORE_POLLING - 1;
    this.connectWs();
  }
}
