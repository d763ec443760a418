// agent-bridge web page: the reference client of docs/api.md. Plain ES modules, no build step,
// nothing fetched from anywhere but the daemon that served it.
import { ThreadStream } from "./stream.js";
import { TranscriptView, pretty, usageText } from "./transcript.js";

const $ = (sel) => document.querySelector(sel);
const LIST_REFRESH_MS = 5000;
const DIAG_LIMIT = 500;
// What the API takes as content blocks (bridge/api/content.py): these media types, at most
// 64 blocks, and one request body (or WebSocket frame) of at most 8 MiB.
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
const DOCUMENT_TYPES = ["application/pdf", "text/plain"];
const MAX_BLOCKS = 64;
// How a turn's end status reads in the status line ("cancelled" is an interrupt).
const TURN_STATUS = { cancelled: "interrupted" };
const MAX_BODY_BYTES = 8 * 1024 * 1024;
const BODY_SLACK = 16 * 1024; // JSON punctuation, the client_id, the block wrappers

function sizeText(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(n < 10240 ? 1 : 0)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

// The media type the API knows a file by, or null. Browsers give text files without a
// known extension no type; a .txt file is text/plain whatever the browser says.
function mediaType(file) {
  const t = (file.type || "").toLowerCase();
  if (IMAGE_TYPES.includes(t) || DOCUMENT_TYPES.includes(t)) return t;
  if (/\.txt$/i.test(file.name || "") && (!t || t.startsWith("text/"))) return "text/plain";
  return null;
}

function readBase64(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => {
      const url = String(r.result);
      resolve(url.slice(url.indexOf(",") + 1)); // data:<type>;base64,<data>
    };
    r.onerror = () => reject(r.error || new Error("cannot read the file"));
    r.readAsDataURL(file);
  });
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body, headers = {}) {
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
    if (r.status === 401 && path !== "/v1/session") app.showLogin();
    throw new ApiError(r.status, err.code, err.message);
  }
  return data;
}

function ago(iso) {
  const t = Date.parse(iso);
  if (!t) return "";
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(t).toLocaleDateString();
}

function newClientId() {
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes);
  return `web-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

const CONN_TEXT = {
  idle: "No thread open",
  connecting: "Connecting…",
  live: "Live",
  reconnecting: "Reconnecting…",
  polling: "Live (long-polling)",
  offline: "Offline — retrying",
  gone: "Thread gone",
};

class App {
  constructor() {
    this.threads = [];
    this.agents = [];
    this.current = null; // {id, thread, stream, view, pending: Map, tasks: Map, turnActive}
    this.listTimer = null;
    this.dismissed = new Set(); // permission requests whose dialog the user closed
    this.forcePolling = new URLSearchParams(location.search).get("transport") === "poll";
    this.attachments = []; // {id, name, size, block, mediaType, data}: sent with the next prompt
    this.attachSeq = 0;
  }

  // ------------------------------------------------------------------ start, login

  async start() {
    this.bind();
    const frag = new URLSearchParams(location.hash.slice(1));
    const code = frag.get("login");
    if (code) {
      // The one-time code from the daemon's start-up link: trade it for the session
      // cookie, then drop it from the address bar and history.
      frag.delete("login");
      history.replaceState(null, "", `${location.pathname}${location.search}${frag.toString() ? `#${frag}` : ""}`);
      try {
        await api("POST", "/v1/session", { code });
      } catch (err) {
        this.showLogin("That login link was already used or has expired. Paste the token instead.");
        return;
      }
    }
    try {
      this.agents = await api("GET", "/v1/agents");
    } catch (err) {
      if (err.status !== 401) this.showLogin(`Cannot reach the daemon: ${err.message}`);
      return;
    }
    await this.enter();
  }

  showLogin(message) {
    this.leaveThread();
    clearInterval(this.listTimer);
    $("#thread").hidden = true;
    $("#empty").hidden = false;
    this.setConn("idle");
    $("#app").hidden = true;
    $("#login").hidden = false;
    $("#login-error").textContent = message || "";
    $("#token").focus();
  }

  async login(token) {
    try {
      await api("POST", "/v1/session", undefined, { Authorization: `Bearer ${token}` });
    } catch (err) {
      $("#login-error").textContent = err.status === 401 ? "That token is not right." : `Sign-in failed: ${err.message}`;
      return;
    }
    $("#token").value = "";
    this.agents = await api("GET", "/v1/agents");
    await this.enter();
  }

  async logout() {
    try {
      await api("DELETE", "/v1/session");
    } catch {
      /* already logged out */
    }
    this.showLogin("Signed out.");
  }

  async enter() {
    $("#login").hidden = true;
    $("#app").hidden = false;
    // Who is signed in (GET /v1/me, docs/api.md §4.17); an admin of users mode sees owners.
    this.me = await api("GET", "/v1/me").catch(() => null);
    $("#whoami").textContent = this.me ? `${this.me.name}${this.me.admin && this.me.mode === "users" ? " (admin)" : ""}` : "";
    await this.refreshThreads();
    clearInterval(this.listTimer);
    this.listTimer = setInterval(() => {
      if (!document.hidden) this.refreshThreads().catch(() => {});
    }, LIST_REFRESH_MS);
    const want = new URLSearchParams(location.hash.slice(1)).get("t");
    if (want && !(await this.openThread(want))) this.setHash(null);
  }

  // ------------------------------------------------------------------ wiring

  bind() {
    $("#login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const token = $("#token").value.trim();
      if (token) this.login(token);
    });
    $("#logout").addEventListener("click", () => this.logout());
    $("#new-thread").addEventListener("click", () => this.openNewDialog());
    $("#new-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.createThread();
    });
    $("#new-cancel").addEventListener("click", () => $("#new-dialog").close());
    $("#new-agent").addEventListener("change", () => this.loadNativeSessions());
    $("#new-cwd").addEventListener("change", () => this.loadNativeSessions());
    $("#new-session-more").addEventListener("click", () => this.loadNativeSessions(this.nativeCursor));
    $("#rename").addEventListener("click", () => this.openRename());
    $("#rename-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.rename();
    });
    $("#rename-cancel").addEventListener("click", () => $("#rename-dialog").close());
    $("#stop").addEventListener("click", () => this.threadAction("stop"));
    $("#resume").addEventListener("click", () => this.threadAction("resume"));
    $("#delete").addEventListener("click", () => this.confirmDelete());
    $("#confirm-yes").addEventListener("click", () => {
      $("#confirm-dialog").close();
      this.deleteThread();
    });
    $("#confirm-no").addEventListener("click", () => $("#confirm-dialog").close());
    $("#composer").addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    $("#prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.send();
      } else if (e.key === "ArrowUp" && !e.target.value && this.lastPrompt) {
        // Up in an empty box brings back the last prompt, to edit and send again.
        e.preventDefault();
        e.target.value = this.lastPrompt;
      }
    });
    $("#interrupt").addEventListener("click", () => this.interrupt());
    $("#attach").addEventListener("click", () => $("#attach-input").click());
    $("#attach-input").addEventListener("change", (e) => {
      const files = [...e.target.files];
      e.target.value = ""; // the same file can be picked again
      this.addFiles(files);
    });
    $("#prompt").addEventListener("paste", (e) => {
      const files = e.clipboardData ? [...e.clipboardData.files] : [];
      if (!files.length) return;
      e.preventDefault();
      this.addFiles(files);
    });
    const composer = $("#composer");
    composer.addEventListener("dragover", (e) => {
      if (!e.dataTransfer || ![...e.dataTransfer.types].includes("Files")) return;
      e.preventDefault();
      composer.classList.add("dropping");
    });
    composer.addEventListener("dragleave", (e) => {
      if (!composer.contains(e.relatedTarget)) composer.classList.remove("dropping");
    });
    composer.addEventListener("drop", (e) => {
      composer.classList.remove("dropping");
      if (!e.dataTransfer || !e.dataTransfer.files.length) return;
      e.preventDefault();
      this.addFiles([...e.dataTransfer.files]);
    });
    document.addEventListener("keydown", (e) => {
      if (e.key !== "Escape" || document.querySelector("dialog[open]")) return;
      // On a narrow screen, Escape first closes a slide-over panel.
      for (const [panel, button] of [["sidebar", "#toggle-threads"], ["side", "#toggle-side"]]) {
        if (document.body.classList.contains(`show-${panel}`) && getComputedStyle($(button)).display !== "none") {
          e.preventDefault();
          this.togglePanel(`#${panel}`, button);
          $(button).focus();
          return;
        }
      }
      if (this.current && this.current.turnActive) {
        e.preventDefault();
        this.interrupt();
      }
    });
    $("#perm-dialog").addEventListener("close", () => {
      // Escape (or answering) closes it; an unanswered request stays pending and the
      // banner offers to reopen it.
      const rid = $("#perm-dialog").dataset.requestId;
      if (this.current && this.current.pending.has(rid)) this.dismissed.add(rid);
      this.updatePermissionUi();
    });
    $("#perm-review").addEventListener("click", () => this.showPermission());
    $("#toggle-threads").addEventListener("click", () => this.togglePanel("#sidebar", "#toggle-threads"));
    $("#toggle-side").addEventListener("click", () => this.togglePanel("#side", "#toggle-side"));
    $("#diag-clear").addEventListener("click", () => {
      $("#diagnostics").replaceChildren();
      this.countDiagnostics();
    });
    window.addEventListener("online", () => this.current && this.current.stream.nudge());
    window.addEventListener("hashchange", () => {
      const want = new URLSearchParams(location.hash.slice(1)).get("t");
      if (want && (!this.current || this.current.id !== want)) this.openThread(want);
    });
  }

  togglePanel(panel, button) {
    const open = !document.body.classList.contains(`show-${panel.slice(1)}`);
    document.body.classList.toggle(`show-${panel.slice(1)}`, open);
    $(button).setAttribute("aria-expanded", String(open));
    if (open) {
      const first = $(panel).querySelector("button, summary, [tabindex]");
      if (first) first.focus();
    }
  }

  setHash(id) {
    const url = `${location.pathname}${location.search}${id ? `#t=${encodeURIComponent(id)}` : ""}`;
    history.replaceState(null, "", url);
  }

  // ------------------------------------------------------------------ thread list

  async refreshThreads() {
    const all = [];
    let cursor = null;
    for (let page = 0; page < 5; page++) {
      const q = new URLSearchParams({ limit: "200" });
      if (cursor) q.set("cursor", cursor);
      const res = await api("GET", `/v1/threads?${q}`);
      all.push(...res.threads);
      cursor = res.next_cursor;
      if (!cursor) break;
    }
    this.threads = all;
    this.renderThreadList();
    if (this.current) {
      const t = all.find((x) => x.id === this.current.id);
      if (t) {
        this.current.thread = t;
        this.renderThreadHead();
      }
    }
  }

  renderThreadList() {
    const list = $("#thread-list");
    const focusedId = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.threadId : null;
    list.replaceChildren();
    if (!this.threads.length) list.append(el("li", "empty-list", "No threads yet."));
    for (const t of this.threads) {
      const li = el("li");
      const b = el("button", "thread-item");
      b.type = "button";
      b.dataset.threadId = t.id;
      if (this.current && this.current.id === t.id) b.setAttribute("aria-current", "true");
      const title = el("span", "t-title", t.title || "Untitled");
      const meta = el("span", "t-meta", `${t.agent} · ${t.cwd}`);
      if (this.me && this.me.admin && this.me.mode === "users") meta.prepend(el("span", "t-owner", `${t.owner || "no owner"} · `));
      const foot = el("span", "t-foot");
      const state = el("span", `badge state-${t.state}`, t.turn_active ? "working" : t.state);
      foot.append(state, el("span", "t-when", ago(t.updated_at)));
      b.append(title, meta, foot);
      b.addEventListener("click", () => {
        this.openThread(t.id);
        document.body.classList.remove("show-sidebar");
        $("#toggle-threads").setAttribute("aria-expanded", "false");
      });
      li.append(b);
      list.append(li);
      if (focusedId === t.id) b.focus();
    }
  }

  openNewDialog() {
    const sel = $("#new-agent");
    sel.replaceChildren();
    for (const a of this.agents) {
      const o = el("option", null, `${a.name} (${a.protocol}${a.model ? `, ${a.model}` : ""})${a.available ? "" : " — unavailable"}`);
      o.value = a.name;
      o.disabled = !a.available;
      if (a.default && a.available) o.selected = true;
      sel.append(o);
    }
    $("#new-error").textContent = "";
    $("#new-dialog").showModal();
    sel.focus();
    this.loadNativeSessions();
  }

  // "Resume an existing session": what the chosen agent itself keeps for the directory
  // (GET /v1/agents/{name}/sessions, docs/api.md §4.13); a page at a time, newest first.
  async loadNativeSessions(cursor = null) {
    const pick = $("#new-session");
    const status = $("#new-session-status");
    const more = $("#new-session-more");
    const agent = $("#new-agent").value;
    const cwd = $("#new-cwd").value.trim();
    const ask = (this.nativeAsk = (this.nativeAsk || 0) + 1);
    if (!cursor) {
      pick.replaceChildren(el("option", null, "Start a new session"));
      pick.firstChild.value = "";
      pick.disabled = true;
    }
    more.hidden = true;
    this.nativeCursor = null;
    if (!agent || !cwd) {
      status.textContent = agent ? "Enter a working directory to see the agent's sessions there." : "";
      return;
    }
    status.textContent = "Looking for sessions…";
    let page;
    try {
      const q = new URLSearchParams({ cwd, limit: "50" });
      if (cursor) q.set("cursor", cursor);
      page = await api("GET", `/v1/agents/${encodeURIComponent(agent)}/sessions?${q}`);
    } catch (err) {
      if (ask === this.nativeAsk) status.textContent = err.message;
      return;
    }
    if (ask !== this.nativeAsk) return; // the agent or directory changed meanwhile
    for (const s of page.sessions) {
      const when = s.last_activity ? ` · ${ago(s.last_activity)}` : "";
      const o = el("option", null, `${s.title || s.id}${when}`);
      o.value = s.id;
      o.dataset.title = s.title || "";
      o.title = s.id;
      pick.append(o);
    }
    const count = pick.options.length - 1;
    pick.disabled = count === 0;
    this.nativeCursor = page.next_cursor;
    more.hidden = !page.next_cursor;
    status.textContent = count
      ? `${count} session${count === 1 ? "" : "s"} found`
      : page.detail || "No sessions of this agent for this directory.";
  }

  async createThread() {
    const body = { agent: $("#new-agent").value };
    const cwd = $("#new-cwd").value.trim();
    const title = $("#new-title").value.trim();
    if (cwd) body.cwd = cwd;
    if (title) body.title = title;
    const pick = $("#new-session");
    if (pick.value) {
      body.native_session_id = pick.value;
      if (!title) body.title = pick.selectedOptions[0].dataset.title || "";
    }
    try {
      const t = await api("POST", "/v1/threads", body);
      $("#new-dialog").close();
      $("#new-title").value = "";
      await this.refreshThreads();
      await this.openThread(t.id);
      $("#prompt").focus();
    } catch (err) {
      $("#new-error").textContent = err.message;
    }
  }

  // ------------------------------------------------------------------ one thread

  leaveThread() {
    if (!this.current) return;
    this.current.stream.close();
    this.current = null;
  }

  async openThread(id) {
    this.leaveThread();
    document.body.classList.remove("show-sidebar");
    $("#toggle-threads").setAttribute("aria-expanded", "false");
    const ticket = (this.opening = (this.opening || 0) + 1);
    let thread;
    try {
      thread = await api("GET", `/v1/threads/${encodeURIComponent(id)}`);
    } catch {
      return false;
    }
    if (ticket !== this.opening) return false; // another thread was picked meanwhile
    this.leaveThread();
    const view = new TranscriptView($("#transcript"));
    view.catchUpTo = typeof thread.last_seq === "number" ? thread.last_seq : 0;
    const cur = { id, thread, view, pending: new Map(), tasks: new Map(), turnActive: false, stream: null };
    this.current = cur;
    this.setHash(id);
    $("#empty").hidden = true;
    $("#thread").hidden = false;
    $("#tasks").replaceChildren();
    $("#diagnostics").replaceChildren();
    this.countDiagnostics();
    this.renderTasks();
    this.renderThreadHead();
    this.renderThreadList();
    this.updatePermissionUi();
    this.updateTurnUi();
    cur.stream = new ThreadStream(id, {
      forcePolling: this.forcePolling,
      onEvents: (batch) => this.current === cur && this.onEvents(cur, batch),
      onState: (state) => this.current === cur && this.setConn(state),
      onGone: (why) => this.current === cur && this.threadGone(why),
      onUnauthorized: () => this.current === cur && this.showLogin("Your session ended; sign in again."),
    });
    cur.stream.start();
    return true;
  }

  threadGone(why) {
    this.leaveThread();
    this.setHash(null);
    $("#thread").hidden = true;
    $("#empty").hidden = false;
    $("#empty").textContent = why === "deleted" ? "That thread was deleted." : "That thread does not exist.";
    this.setConn("idle");
    this.refreshThreads().catch(() => {});
  }

  setConn(state) {
    const c = $("#conn");
    c.dataset.state = state;
    c.querySelector(".conn-text").textContent = CONN_TEXT[state] || state;
  }

  renderThreadHead() {
    const cur = this.current;
    if (!cur) return;
    const t = cur.thread;
    $("#t-title").textContent = t.title || "Untitled";
    this.updateTitle();
    $("#t-meta").textContent = `${t.agent}${t.model ? ` · ${t.model}` : ""} · ${t.cwd}`;
    const st = $("#t-state");
    st.textContent = t.state;
    st.className = `badge state-${t.state}`;
    $("#stop").disabled = !["starting", "running"].includes(t.state);
    $("#resume").disabled = ["starting", "running", "stopping"].includes(t.state);
  }

  onEvents(cur, batch) {
    cur.view.apply(batch);
    let threadChanged = false;
    for (const ev of batch) {
      const d = ev.data && typeof ev.data === "object" ? ev.data : {};
      switch (ev.kind) {
        case "turn.started":
          cur.turnActive = true;
          cur.usage = null;
          break;
        case "turn.ended":
          cur.turnActive = cur.view.turnActive;
          cur.lastEnd = d;
          threadChanged = true;
          break;
        case "permission.requested":
          cur.pending.set(String(d.request_id), d);
          break;
        case "permission.resolved":
          cur.pending.delete(String(d.request_id));
          break;
        case "task.updated":
          this.taskUpdated(cur, d);
          break;
        case "process.started":
          cur.thread = { ...cur.thread, state: "running" };
          this.diagnostic(ev, `process started (pid ${d.pid ?? "?"}${d.resume ? ", resuming" : ""})`);
          threadChanged = true;
          break;
        case "process.exited":
          cur.thread = { ...cur.thread, state: "exited" };
          cur.turnActive = false;
          this.diagnostic(ev, `process exited: ${d.reason ?? "?"} (code ${d.code ?? "–"}${d.signal ? `, signal ${d.signal}` : ""})`);
          threadChanged = true;
          break;
        case "diagnostic":
          this.diagnostic(ev, `${d.stream ?? "diagnostic"}: ${d.text ?? ""}`);
          break;
        case "notice":
          this.diagnostic(ev, `notice ${d.code ?? ""}: ${d.text ?? ""}`);
          break;
        case "rate_limit":
          this.diagnostic(ev, `rate limit: ${d.status ?? "?"}${d.resets_at ? `, resets ${d.resets_at}` : ""}${typeof d.utilization === "number" ? `, ${Math.round(d.utilization * 100)} % used` : ""}`);
          break;
        case "session.started":
          if (d.model) cur.thread = { ...cur.thread, model: d.model };
          break;
        case "agent.status":
          // Only a line that says a status or state changes it (not a keep-alive, say).
          if ("status" in d || "state" in d) cur.agentStatus = d.status || d.state || null;
          break;
        default:
          break;
      }
    }
    if (batch.some((ev) => ev.kind === "task.updated")) {
      this.renderTasks();
      this.syncTasks(cur);
    }
    this.updateTurnUi();
    if (threadChanged) this.renderThreadHead();
    // A reload replays the transcript frame by frame: the dialog and the thread list
    // follow the state once things settle, not every request and turn on the way.
    this.soon("perm", 30, () => this.updatePermissionUi());
    if (threadChanged) this.soon("list", 300, () => this.refreshThreads().catch(() => {}));
  }

  soon(key, ms, fn) {
    this.timers = this.timers || {};
    if (this.timers[key]) return;
    this.timers[key] = setTimeout(() => {
      this.timers[key] = null;
      fn();
    }, ms);
  }

  updateTurnUi() {
    const cur = this.current;
    const active = !!(cur && cur.turnActive);
    $("#interrupt").disabled = !active;
    const status = $("#turn-status-text");
    if (!cur) status.textContent = "";
    else if (active) status.textContent = cur.agentStatus && cur.agentStatus !== "running" ? `Agent is working (${cur.agentStatus})…` : "Agent is working… (Esc to interrupt)";
    else if (cur.lastEnd) {
      const u = usageText(cur.lastEnd.usage);
      status.textContent = `Last turn: ${TURN_STATUS[cur.lastEnd.status] ?? cur.lastEnd.status ?? "ended"}${u ? ` · ${u}` : ""}`;
    } else status.textContent = "Ready";
    $("#turn-status").dataset.active = String(active);
  }

  // ------------------------------------------------------------------ actions

  // ------------------------------------------------------------------ attachments

  // Bytes the attachments add to the request body (base64 is 4/3 of the file).
  attachedBytes(list = this.attachments) {
    return list.reduce((n, a) => n + a.data.length, 0);
  }

  async addFiles(files) {
    const problems = [];
    for (const file of files) {
      const type = mediaType(file);
      const name = file.name || "pasted file";
      if (!type) {
        problems.push(`${name}: this type of file cannot be sent (images: PNG, JPEG, GIF, WebP; documents: PDF, plain text)`);
        continue;
      }
      if (this.attachments.length + 1 >= MAX_BLOCKS) {
        problems.push(`${name}: at most ${MAX_BLOCKS - 1} attachments in one message`);
        continue;
      }
      const encoded = 4 * Math.ceil(file.size / 3);
      const text = $("#prompt").value;
      if (this.attachedBytes() + encoded + text.length * 3 + BODY_SLACK > MAX_BODY_BYTES) {
        problems.push(`${name} (${sizeText(file.size)}): too large — one message can carry about ${sizeText(Math.floor(((MAX_BODY_BYTES - BODY_SLACK) * 3) / 4))} of attachments`);
        continue;
      }
      let data;
      try {
        data = await readBase64(file);
      } catch (err) {
        problems.push(`${name}: ${err.message}`);
        continue;
      }
      this.attachments.push({
        id: `att-${++this.attachSeq}`,
        name,
        size: file.size,
        mediaType: type,
        block: IMAGE_TYPES.includes(type) ? "image" : "document",
        data,
      });
    }
    $("#send-error").textContent = problems.length ? `Not attached: ${problems.join("; ")}` : "";
    this.renderAttachments();
  }

  removeAttachment(id) {
    const i = this.attachments.findIndex((a) => a.id === id);
    if (i < 0) return;
    this.attachments.splice(i, 1);
    this.renderAttachments();
    // Keep the keyboard where it was: on the next chip's remove button, else the box.
    const buttons = document.querySelectorAll("#attachments .att-remove");
    (buttons[Math.min(i, buttons.length - 1)] || $("#prompt")).focus();
  }

  renderAttachments() {
    const list = $("#attachments");
    list.replaceChildren();
    list.hidden = !this.attachments.length;
    for (const a of this.attachments) {
      const li = el("li", "att-chip");
      li.dataset.mediaType = a.mediaType;
      if (a.block === "image") {
        const img = el("img", "att-thumb");
        img.alt = "";
        img.src = `data:${a.mediaType};base64,${a.data}`;
        li.append(img);
      }
      li.append(el("span", "att-name", a.name), el("span", "att-size", sizeText(a.size)));
      const rm = el("button", "att-remove small", "×");
      rm.type = "button";
      rm.setAttribute("aria-label", `Remove ${a.name}`);
      rm.addEventListener("click", () => this.removeAttachment(a.id));
      li.append(rm);
      list.append(li);
    }
    $("#attach").textContent = this.attachments.length ? `Attach (${this.attachments.length})` : "Attach";
  }

  async send() {
    const cur = this.current;
    const box = $("#prompt");
    const text = box.value;
    const files = this.attachments;
    if (!cur || (!text.trim() && !files.length)) return;
    if (files.length && this.attachedBytes(files) + new TextEncoder().encode(JSON.stringify(text)).length + BODY_SLACK > MAX_BODY_BYTES) {
      $("#send-error").textContent = `Not sent: the message and its attachments are over the daemon's limit of ${sizeText(MAX_BODY_BYTES)}; remove an attachment.`;
      return;
    }
    const clientId = newClientId();
    let body;
    if (files.length) {
      const content = text.trim() ? [{ type: "text", text }] : [];
      for (const a of files) content.push({ type: a.block, source: { type: "base64", media_type: a.mediaType, data: a.data } });
      body = { content, client_id: clientId };
    } else body = { text, client_id: clientId };
    if (text.trim()) this.lastPrompt = text;
    box.value = "";
    this.attachments = [];
    this.renderAttachments();
    $("#send-error").textContent = "";
    const restore = () => {
      if (!box.value) box.value = text;
      if (!this.attachments.length) {
        this.attachments = files;
        this.renderAttachments();
      }
    };
    // client_id makes the send idempotent: after a network error, the same request is
    // sent again and the daemon answers with the original seq (docs/api.md §4.6).
    for (let attempt = 0; attempt < 4; attempt++) {
      try {
        await api("POST", `/v1/threads/${encodeURIComponent(cur.id)}/messages`, body);
        return;
      } catch (err) {
        if (err instanceof ApiError) {
          const why = err.code === "unsupported_content" ? `this agent cannot take these attachments — ${err.message}` : err.message;
          $("#send-error").textContent = `Not sent: ${why}`;
          restore();
          return;
        }
        await new Promise((res) => setTimeout(res, 500 * (attempt + 1)));
      }
    }
    $("#send-error").textContent = "Not sent: the daemon cannot be reached.";
    restore();
  }

  async interrupt() {
    const cur = this.current;
    if (!cur) return;
    try {
      await api("POST", `/v1/threads/${encodeURIComponent(cur.id)}/interrupt`);
      $("#turn-status-text").textContent = "Interrupting…";
    } catch (err) {
      $("#send-error").textContent = `Interrupt failed: ${err.message}`;
    }
  }

  async threadAction(action) {
    const cur = this.current;
    if (!cur) return;
    try {
      cur.thread = await api("POST", `/v1/threads/${encodeURIComponent(cur.id)}/${action}`);
      this.renderThreadHead();
      await this.refreshThreads();
    } catch (err) {
      $("#send-error").textContent = `${action} failed: ${err.message}`;
    }
  }

  openRename() {
    if (!this.current) return;
    $("#rename-input").value = this.current.thread.title || "";
    $("#rename-dialog").showModal();
    $("#rename-input").select();
  }

  async rename() {
    const cur = this.current;
    if (!cur) return;
    try {
      cur.thread = await api("PATCH", `/v1/threads/${encodeURIComponent(cur.id)}`, { title: $("#rename-input").value.trim() });
      $("#rename-dialog").close();
      this.renderThreadHead();
      await this.refreshThreads();
    } catch (err) {
      $("#rename-error").textContent = err.message;
    }
  }

  confirmDelete() {
    if (!this.current) return;
    $("#confirm-text").textContent = `Delete “${this.current.thread.title || "Untitled"}” and its whole transcript? This cannot be undone.`;
    $("#confirm-dialog").showModal();
    $("#confirm-no").focus();
  }

  async deleteThread() {
    const cur = this.current;
    if (!cur) return;
    try {
      await api("DELETE", `/v1/threads/${encodeURIComponent(cur.id)}`);
    } catch (err) {
      if (err.status !== 404) {
        $("#send-error").textContent = `Delete failed: ${err.message}`;
        return;
      }
    }
    this.threadGone("deleted");
    $("#new-thread").focus();
  }

  // ------------------------------------------------------------------ permissions

  firstPending() {
    const cur = this.current;
    if (!cur) return null;
    for (const p of cur.pending.values()) return p;
    return null;
  }

  updateTitle() {
    const cur = this.current;
    const waiting = cur ? cur.pending.size : 0;
    const name = cur ? cur.thread.title || "Untitled" : "";
    document.title = `${waiting ? `(${waiting}) ` : ""}${name ? `${name} — ` : ""}agent-bridge`;
  }

  updatePermissionUi() {
    this.updateTitle();
    const p = this.firstPending();
    const dialog = $("#perm-dialog");
    const banner = $("#perm-banner");
    if (!p) {
      banner.hidden = true;
      if (dialog.open) dialog.close();
      return;
    }
    banner.hidden = false;
    $("#perm-banner-text").textContent = `The agent asks to use ${p.tool ?? "a tool"}.`;
    if (dialog.open && dialog.dataset.requestId !== String(p.request_id)) this.fillPermission(p);
    if (!dialog.open && !this.dismissed.has(String(p.request_id))) this.showPermission();
  }

  fillPermission(p) {
    const dialog = $("#perm-dialog");
    if (dialog.dataset.requestId !== String(p.request_id)) $("#perm-message").value = ""; // kept on a reopen
    dialog.dataset.requestId = String(p.request_id);
    $("#perm-tool").textContent = String(p.tool ?? "tool");
    $("#perm-input").textContent = pretty(p.input);
    const more = this.current ? this.current.pending.size - 1 : 0;
    $("#perm-more").textContent = more > 0 ? `${more} more request(s) waiting.` : "";
    $("#perm-error").textContent = "";
    // ACP agents offer named options (allow once / always, reject once / always); the
    // answer names the chosen one. Otherwise: Deny and Allow.
    const box = $("#perm-actions");
    box.replaceChildren();
    const options = (Array.isArray(p.options) ? p.options : []).filter(
      (o) => o && typeof o === "object" && typeof o.optionId === "string" && typeof o.kind === "string",
    );
    const choices = options.length
      ? options.map((o) => ({
          label: typeof o.name === "string" && o.name ? o.name : o.optionId,
          decision: o.kind.startsWith("allow") ? "allow" : "deny",
          optionId: o.optionId,
        }))
      : [
          { label: "Deny", decision: "deny", id: "perm-deny" },
          { label: "Allow", decision: "allow", id: "perm-allow" },
        ];
    // An ACP answer is an option id and nothing else: no message to offer.
    $("#perm-message-box").hidden = options.length > 0;
    choices.sort((a, b) => (a.decision === b.decision ? 0 : a.decision === "deny" ? -1 : 1));
    for (const c of choices) {
      const b = el("button", c.decision === "allow" ? "primary" : "danger", c.label);
      b.type = "button";
      if (c.id) b.id = c.id;
      b.dataset.decision = c.decision;
      if (c.optionId) b.dataset.optionId = c.optionId;
      b.addEventListener("click", () => this.answerPermission(c.decision, c.optionId));
      box.append(b);
    }
  }

  showPermission() {
    const p = this.firstPending();
    if (!p) return;
    const dialog = $("#perm-dialog");
    this.fillPermission(p);
    this.dismissed.delete(String(p.request_id));
    if (!dialog.open) dialog.showModal();
    // The safe choice has the focus: Enter denies.
    $("#perm-actions button").focus();
  }

  async answerPermission(decision, optionId) {
    const cur = this.current;
    const dialog = $("#perm-dialog");
    const rid = dialog.dataset.requestId;
    if (!cur || !rid) return;
    const body = optionId ? { decision, option_id: optionId } : { decision };
    // A deny can tell the agent why, or what to do instead ("message", docs/api.md §4.8).
    const message = $("#perm-message").value.trim();
    if (decision === "deny" && message && !$("#perm-message-box").hidden) body.message = message;
    try {
      await api("POST", `/v1/threads/${encodeURIComponent(cur.id)}/permissions/${encodeURIComponent(rid)}`, body);
    } catch (err) {
      if (err.status !== 409 && err.status !== 404) {
        $("#perm-error").textContent = `Could not answer: ${err.message}`;
        return;
      }
    }
    // The resolution arrives as permission.resolved, in every tab; until then, close here.
    cur.pending.delete(rid);
    dialog.close();
    this.updatePermissionUi();
    $("#prompt").focus();
  }

  // ------------------------------------------------------------------ tasks

  taskUpdated(cur, d) {
    const id = String(d.task_id ?? "");
    if (!id) return;
    const t = cur.tasks.get(id) || { task_id: id };
    for (const [k, v] of Object.entries(d)) if (v !== undefined && v !== null) t[k] = v;
    cur.tasks.set(id, t);
  }

  // task.updated events update the panel at once; the thread's task table
  // (GET /v1/threads/{id}/tasks) then fills in what events do not carry (usage, workflow
  // name, sub-agent type) and is authoritative (patches, late and duplicate updates).
  syncTasks(cur) {
    if (cur.taskSync) {
      cur.taskSyncAgain = true;
      return;
    }
    cur.taskSync = (async () => {
      try {
        do {
          cur.taskSyncAgain = false;
          const res = await api("GET", `/v1/threads/${encodeURIComponent(cur.id)}/tasks`);
          if (this.current !== cur) return;
          for (const t of res.tasks || []) {
            const id = String(t.task_id ?? "");
            if (id) cur.tasks.set(id, { ...(cur.tasks.get(id) || {}), ...t });
          }
          this.renderTasks();
        } while (cur.taskSyncAgain);
      } catch {
        /* the events still show the essentials */
      } finally {
        cur.taskSync = null;
      }
    })();
  }

  renderTasks() {
    const cur = this.current;
    const list = $("#tasks");
    const tasks = cur ? [...cur.tasks.values()] : [];
    $("#task-count").textContent = tasks.length ? `(${tasks.filter((t) => t.status === "running").length} running / ${tasks.length})` : "";
    list.replaceChildren();
    if (!tasks.length) {
      list.append(el("li", "empty-list", "No sub-agents or workflows in this thread."));
      return;
    }
    for (const t of tasks) {
      const li = el("li", "task");
      li.dataset.taskId = t.task_id;
      li.dataset.status = String(t.status ?? "");
      const head = el("div", "task-head");
      head.append(
        el("span", "task-name", String(t.description || t.workflow_name || t.task_id)),
        el("span", `badge status-${String(t.status).replace(/\W/g, "")}`, String(t.status ?? "?")),
      );
      li.append(head);
      const kind = [t.task_type, t.subagent_type, t.workflow_name].filter((x) => typeof x === "string" && x).join(" · ");
      if (kind) li.append(el("div", "task-kind", kind));
      if (t.summary) li.append(el("div", "task-summary", String(t.summary)));
      if (t.usage && typeof t.usage === "object") {
        const u = [];
        if (typeof t.usage.total_tokens === "number") u.push(`${t.usage.total_tokens} tokens`);
        if (typeof t.usage.tool_uses === "number") u.push(`${t.usage.tool_uses} tool uses`);
        if (typeof t.usage.duration_ms === "number") u.push(`${(t.usage.duration_ms / 1000).toFixed(1)} s`);
        if (u.length) li.append(el("div", "task-usage", u.join(" · ")));
      }
      if (Array.isArray(t.workflow_progress) && t.workflow_progress.length) li.append(this.workflow(t.workflow_progress));
      list.append(li);
    }
  }

  // workflow_progress is a snapshot: phases ({type: "workflow_phase", index, title}) and
  // agents ({type: "workflow_agent", phaseIndex, label, state, …}); other shapes are shown
  // by whatever label and state they carry.
  workflow(entries) {
    const box = el("ol", "workflow");
    const phases = new Map();
    const loose = [];
    for (const e of entries) {
      if (!e || typeof e !== "object") continue;
      if (e.type === "workflow_phase") {
        const li = el("li", "phase");
        li.append(el("span", "phase-title", String(e.title ?? `Phase ${e.index ?? ""}`)));
        const agents = el("ul", "agents");
        li.append(agents);
        phases.set(e.index, agents);
        box.append(li);
      } else loose.push(e);
    }
    for (const e of loose) {
      const label = e.label ?? e.step ?? e.title ?? e.name ?? e.agentId ?? e.type ?? "step";
      const state = e.state ?? e.status ?? "";
      const li = el("li", "step");
      li.dataset.state = String(state);
      li.append(el("span", "step-label", String(label)));
      if (state) li.append(el("span", `badge state-${String(state).replace(/\W/g, "")}`, String(state)));
      const extra = e.error ?? e.resultPreview;
      if (extra) li.append(el("div", "step-extra", String(extra)));
      const home = e.type === "workflow_agent" ? phases.get(e.phaseIndex) : null;
      (home || box).append(li);
    }
    return box;
  }

  // ------------------------------------------------------------------ diagnostics

  diagnostic(ev, text) {
    const list = $("#diagnostics");
    const li = el("li", `diag diag-${ev.kind.replace(/\W/g, "-")}`);
    const when = el("time", "diag-time", (ev.ts || "").slice(11, 19));
    when.dateTime = ev.ts || "";
    li.append(when, el("span", "diag-text", text));
    list.append(li);
    while (list.childElementCount > DIAG_LIMIT) list.firstElementChild.remove();
    this.countDiagnostics();
  }

  countDiagnostics() {
    const n = $("#diagnostics").childElementCount;
    $("#diag-count").textContent = n ? `(${n})` : "";
  }
}

const app = new App();
// A 401 from any request has already put the sign-in form up (see api()); a request
// still in flight when the user signs out is answered 401 too and is not an error.
window.addEventListener("unhandledrejection", (e) => {
  if (e.reason instanceof ApiError && e.reason.status === 401) e.preventDefault();
});
app.start();
window.agentBridge = app; // for the console (and the browser tests)
