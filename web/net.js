// Reaching the daemon: the JSON API, the /healthz probe, and a backoff for reconnecting.

export class ApiError extends Error {
  constructor(status, code, message, retryAfter = null) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter; // seconds, from a Retry-After header (503 memory_budget)
  }
}

let onUnauthorized = () => {};
/** What to do when a request (other than signing in) is answered 401. */
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

export async function api(method, path, body, headers = {}) {
  const opts = { method, headers: { ...headers }, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 204) return null;
  let data = null;
  try {
    data = await r.json();
  } catch {
    data = null;
  }
  if (!r.ok) {
    const err = data && data.error ? data.error : {};
    if (r.status === 401 && path !== "/v1/session") onUnauthorized();
    const error = new ApiError(r.status, err.code, err.message, Number(r.headers.get("Retry-After")) || null);
    error.details = err; // the whole error object: some name more (a merge conflict's files)
    throw error;
  }
  return data;
}

const PROBE_TIMEOUT_MS = 2000;

/** Whether the daemon answers at all (GET /healthz, no auth): tells "the daemon is down or
 * restarting" from "this connection was refused or broken on the way". */
export async function daemonUp() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), PROBE_TIMEOUT_MS);
  try {
    const r = await fetch("/healthz", { cache: "no-store", signal: abort.signal });
    return r.ok;
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

/** Doubling delays from `min` to `max`, back to `min` after a success (reset()). The cap is
 * low on purpose: while the daemon is down the page only probes /healthz, so after a
 * restart it is back within about `max`. */
export class Backoff {
  constructor(min = 250, max = 1000) {
    this.min = min;
    this.max = max;
    this.ms = min;
  }

  next() {
    const ms = this.ms;
    this.ms = Math.min(this.ms * 2, this.max);
    return ms;
  }

  reset() {
    this.ms = this.min;
  }
}

export const sleep = (ms, handle = {}) =>
  new Promise((res) => {
    handle.timer = setTimeout(res, ms);
  });

/** Waits, probing /healthz with the backoff, until the daemon answers (or `stopped()`). */
export async function untilDaemonUp(backoff, stopped, handle = {}) {
  while (!stopped()) {
    if (await daemonUp()) return;
    if (stopped()) return;
    await sleep(backoff.next(), handle);
  }
}
