// The server-wide change stream, GET /v1/events (Server-Sent Events, docs/api.md §4.12),
// read with fetch so that a 401 is told from a dropped connection. Every change of every
// thread arrives as a frame; the list is fetched once (and after a `resync`), never polled.
//
// While the stream is down the feed says so (onLive(false)): the page then shows thread
// states as unknown rather than stale. It probes /healthz with a short backoff and opens
// the stream again, from the last cursor, as soon as the daemon answers.

import { Backoff, sleep, untilDaemonUp } from "./net.js";

const SILENCE_MS = 40000; // the daemon sends a comment every 15 s of silence
const MAX_BUFFER = 4 * 1024 * 1024; // one SSE event larger than this is not a thread change

export class ThreadFeed {
  /**
   * onList(): re-list the threads (GET /v1/threads); awaited before the frames after it.
   * onFrame(frame): a thread.created / thread.updated / thread.deleted frame.
   * onLive(bool): the feed is (not) following the daemon.
   */
  constructor({ onList, onFrame, onLive, onUnauthorized }) {
    this.onList = onList;
    this.onFrame = onFrame;
    this.onLive = onLive || (() => {});
    this.onUnauthorized = onUnauthorized || (() => {});
    this.cursor = null; // the last cursor received; null: list again
    this.closed = false;
    this.live = false;
    this.abort = null;
    this.backoff = new Backoff();
    this.wait = {};
  }

  start() {
    this.run();
    return this;
  }

  close() {
    this.closed = true;
    clearTimeout(this.wait.timer);
    if (this.abort) this.abort.abort();
  }

  setLive(live) {
    if (live === this.live) return;
    this.live = live;
    this.onLive(live);
  }

  async run() {
    while (!this.closed) {
      const end = await this.once();
      if (this.closed) return;
      this.setLive(false);
      if (end === "unauthorized") {
        this.onUnauthorized();
        return;
      }
      if (end === "refused") await sleep(this.backoff.next(), this.wait);
      await untilDaemonUp(this.backoff, () => this.closed, this.wait);
    }
  }

  /** One stream, until it ends: "unauthorized", "refused" (an HTTP error) or "ended". */
  async once() {
    this.abort = new AbortController();
    const q = this.cursor === null ? "" : `?since=${encodeURIComponent(this.cursor)}`;
    let r;
    try {
      r = await fetch(`/v1/events${q}`, {
        credentials: "same-origin",
        cache: "no-store",
        signal: this.abort.signal,
        headers: { Accept: "text/event-stream" },
      });
    } catch {
      return "ended";
    }
    if (r.status === 401) return "unauthorized";
    if (!r.ok || !r.body) {
      if (r.status === 400) this.cursor = null; // a cursor the daemon cannot read: list again
      return "refused";
    }
    let silence;
    const watchdog = () => {
      clearTimeout(silence);
      silence = setTimeout(() => this.abort.abort(), SILENCE_MS);
    };
    try {
      watchdog();
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done || this.closed) return "ended";
        watchdog();
        buf += value.replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          if ((await this.event(block)) === "close") return "ended";
        }
        if (buf.length > MAX_BUFFER) return "ended";
      }
    } catch {
      return "ended";
    } finally {
      clearTimeout(silence);
    }
  }

  /** One SSE event block: `event:` and `data:` lines (comments and `id:` ignored; the
   * frame carries its cursor). */
  async event(block) {
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (name === "close") return "close";
    if (!data.length) return null;
    let frame;
    try {
      frame = JSON.parse(data.join("\n"));
    } catch {
      return null;
    }
    if (!frame || typeof frame !== "object" || typeof frame.cursor !== "number") return null;
    if (frame.kind === "ready" || frame.kind === "resync") {
      const relist = this.cursor === null || frame.kind === "resync";
      this.cursor = frame.cursor;
      if (relist) {
        try {
          await this.onList();
        } catch {
          this.cursor = null;
          throw new Error("cannot list the threads"); // ends this stream; listed again next time
        }
      }
      this.backoff.reset();
      this.setLive(true);
      return null;
    }
    this.cursor = frame.cursor;
    if (frame.thread && typeof frame.thread === "object" && typeof frame.thread.id === "string") this.onFrame(frame);
    return null;
  }
}
