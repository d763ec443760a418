// agent-bridge web page: the reference client of docs/api.md. Plain ES modules, no build step,
// nothing fetched from anywhere but the daemon that served it.
import { Attachments, BODY_SLACK, MAX_BODY_BYTES } from "./attachments.js";
import { ChangesPanel } from "./changes.js";
import { $, THREAD_STATES, el, sizeText, threadState } from "./dom.js";
import { ApiError, api, setUnauthorizedHandler } from "./net.js";
import { ThreadStream } from "./stream.js";
import { OlderPages, fetchPage, historyFrom, pageEvents } from "./history.js";
import { SlashMenu, advertised } from "./commands.js";
import { ElicitCard } from "./elicit.js";
import { Forks } from "./fork.js";
import { jumpTo } from "./jump.js";
import { NewThreadDialog } from "./newthread.js";
import { Notifier } from "./notify.js";
import { PairDialog } from "./pair.js";
import { followVisualViewport } from "./phone.js";
import { PushControl } from "./push.js";
import { ModelPicker } from "./models.js";
import { MessageSearch } from "./search.js";
import { SecretsPanel } from "./secrets.js";
import { SHORTCUTS, shortcut } from "./shortcuts.js";
import { renderTasks } from "./tasks.js";
import { ThreadList } from "./threads.js";
import { TranscriptView, pretty } from "./transcript.js";
import { UsageTotal, usageText } from "./usage.js";

const DIAG_LIMIT = 500;
// A prompt refused for want of memory (503 memory_budget) is sent again for up to this long.
const MEMORY_WAIT_MS = 10 * 60 * 1000;
// The side panel (tasks, diagnostics, secrets) opens by itself when the thread has tasks,
// where it has room to sit beside the conversation; elsewhere it waits for its button.
const SIDE_ROOM = "(min-width: 901px)";
// An agent's own status words (agent.status, docs/api.md §6.3), as a person would say them.
const AGENT_DOING = {
  requesting: "waiting for the model",
  compacting: "compacting the conversation",
  retrying: "retrying",
  requires_action: "waiting for you",
  idle: null,
};

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
  offline: "Daemon unreachable — reconnecting…",
  gone: "Thread gone",
};

class App {
  constructor() {
    this.threads = [];
    this.agents = [];
    this.current = null; // {id, thread, stream, view, pending: Map, tasks: Map, turnActive}
    this.usageTotal = new UsageTotal($("#usage-total"));
    this.list = new ThreadList($("#thread-list"), {
      currentId: () => (this.current ? this.current.id : null),
      onPick: (id) => {
        this.openThread(id);
        document.body.classList.remove("show-sidebar");
        $("#toggle-threads").setAttribute("aria-expanded", "false");
      },
      onThread: (t) => {
        if (!this.current || this.current.id !== t.id) return;
        this.current.thread = t;
        this.renderThreadHead();
      },
      onDeleted: (id) => {
        this.usageTotal.refresh();
        if (this.current && this.current.id === id) this.threadGone("deleted");
      },
      onLive: () => {
        this.usageTotal.refresh();
        this.renderThreadHead();
        this.updateTitle();
      },
      onUnauthorized: () => this.showLogin("Your session ended; sign in again."),
      onChange: (before, after) => {
        this.notifier.changed(before, after, this.current ? this.current.id : null);
        if (!before || (before.usage && before.usage.turns) !== (after.usage && after.usage.turns)) this.usageTotal.refresh();
        if ((before && before.pending_permissions) !== after.pending_permissions) this.updateTitle();
      },
    });
    this.notifier = new Notifier($("#notify"), { onOpen: (id) => this.openThread(id) });
    this.push = new PushControl($("#push"), { onOpen: (id) => this.openThread(id) });
    this.newThread = new NewThreadDialog({
      onCreated: async (t) => {
        this.list.upsert(t);
        await this.openThread(t.id);
        $("#prompt").focus();
      },
    });
    this.slash = new SlashMenu($("#prompt"), $("#slash-menu"));
    this.models = new ModelPicker({ onThread: (t) => this.threadChangedHere(t) });
    this.changes = new ChangesPanel();
    this.dismissed = new Set(); // permission requests whose dialog the user closed
    this.elicit = new ElicitCard($("#perm-banner")); // the agent's questions (elicit.js)
    this.forcePolling = new URLSearchParams(location.search).get("transport") === "poll";
    this.att = new Attachments();
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
    this.list.stop();
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
    // Who is signed in (GET /v1/me, docs/api.md §4.18); an admin of users mode sees owners.
    this.me = await api("GET", "/v1/me").catch(() => null);
    $("#whoami").textContent = this.me ? `${this.me.name}${this.me.admin && this.me.mode === "users" ? " (admin)" : ""}` : "";
    this.list.showOwners = Boolean(this.me && this.me.admin && this.me.mode === "users");
    // An agent's own sessions are offered to everyone: in users mode each user's are in
    // their own home (docs/api.md §3.6).
    this.newThread.setAdopting(true);
    (this.secrets ||= new SecretsPanel()).setAgents(this.agents);
    this.list.start();
    this.push.start(); // (not awaited: the worker and the push check never hold the page up)
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
    this.pair = new PairDialog().bind(); // "Sign in another device" (pair.js)
    followVisualViewport($("#prompt")); // the composer above a phone's keyboard (phone.js)
    $("#new-thread").addEventListener("click", () => this.newThread.open(this.agents));
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
      if (this.slash.key(e)) return;
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
      this.att.add(files);
    });
    $("#prompt").addEventListener("paste", (e) => {
      const files = e.clipboardData ? [...e.clipboardData.files] : [];
      if (!files.length) return;
      e.preventDefault();
      this.att.add(files);
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
      this.att.add([...e.dataTransfer.files]);
    });
    $("#show-keys").addEventListener("click", () => this.showKeys());
    $("#keys-close").addEventListener("click", () => $("#keys-dialog").close());
    $("#thread-search").addEventListener("input", (e) => this.list.setFilter({ text: e.target.value }));
    $("#thread-state").addEventListener("change", (e) => this.list.setFilter({ state: e.target.value }));
    this.search = new MessageSearch({
      title: (id) => (this.list.threads.get(id) || {}).title || "Untitled",
      onOpen: (id, seq) => this.openAt(id, seq),
    }).bind();
    $("#archive").addEventListener("click", () => this.toggleArchived());
    this.forks = new Forks({
      current: () => this.current,
      onForked: (t, prompt) => this.openFork(t, prompt),
      say: (text) => {
        $("#send-error").textContent = text;
      },
    }).bind($("#transcript"));
    document.addEventListener("keydown", (e) => {
      if (shortcut(e, this.shortcuts())) return;
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
    $("#toggle-side").addEventListener("click", () => {
      this.sideAuto = false; // the reader's choice stands until they change it
      this.togglePanel("#side", "#toggle-side");
    });
    $("#diag-clear").addEventListener("click", () => {
      $("#diagnostics").replaceChildren();
      this.countDiagnostics();
    });
    window.addEventListener("online", () => this.current && this.current.stream.nudge());
    // A window narrowed below the room for the side column turns an open panel into a
    // slide-over: one the page opened by itself closes instead.
    window.matchMedia(SIDE_ROOM).addEventListener("change", () => this.renderTasks());
    window.addEventListener("hashchange", () => {
      const want = new URLSearchParams(location.hash.slice(1)).get("t");
      if (want && (!this.current || this.current.id !== want)) this.openThread(want);
    });
  }

  shortcuts() {
    const go = (step) => {
      const id = this.list.neighbour(this.current ? this.current.id : null, step);
      if (id) this.openThread(id).then(() => this.list.focus(id));
    };
    return {
      help: () => this.showKeys(),
      newThread: () => this.newThread.open(this.agents),
      search: () => {
        if (getComputedStyle($("#toggle-threads")).display !== "none" && !document.body.classList.contains("show-sidebar")) {
          this.togglePanel("#sidebar", "#toggle-threads");
        }
        $("#thread-search").focus();
      },
      next: () => go(1),
      previous: () => go(-1),
      compose: () => this.current && $("#prompt").focus(),
    };
  }

  showKeys() {
    const body = $("#keys tbody");
    body.replaceChildren();
    for (const [keys, what] of SHORTCUTS) {
      const tr = el("tr");
      const k = el("td");
      k.append(el("kbd", null, keys));
      tr.append(k, el("td", null, what));
      body.append(tr);
    }
    $("#keys-dialog").showModal();
    $("#keys-close").focus();
  }

  setPanel(name, button, open) {
    document.body.classList.toggle(`show-${name}`, open);
    $(button).setAttribute("aria-expanded", String(open));
  }

  togglePanel(panel, button) {
    const open = !document.body.classList.contains(`show-${panel.slice(1)}`);
    this.setPanel(panel.slice(1), button, open);
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
    this.models.open(thread);
    this.changes.open(thread);
    this.list.render();
    this.updatePermissionUi();
    this.elicit.open(cur);
    this.updateTurnUi();
    this.slash.setCommands([]);
    cur.stream = new ThreadStream(id, {
      forcePolling: this.forcePolling,
      onEvents: (batch) => this.current === cur && this.onEvents(cur, batch),
      onState: (state) => this.current === cur && this.setConn(state),
      onGone: (why) => this.current === cur && this.threadGone(why),
      onUnauthorized: () => this.current === cur && this.showLogin("Your session ended; sign in again."),
    });
    // A long thread opens from its history's newest page (web/history.js), then goes on live.
    if ((thread.last_seq || 0) > historyFrom()) {
      try {
        const page = await fetchPage(id);
        if (this.current !== cur) return false;
        this.onEvents(cur, pageEvents(page));
        if (thread.turn_active) this.onEvents(cur, [{ seq: page.last_seq, kind: "turn.started", source: "bridge", data: {} }]);
        cur.stream.lastSeq = page.last_seq;
        cur.shown = page.last_seq;
        if (page.more) cur.older = new OlderPages(id, view, page.before, () => this.current === cur);
      } catch {
        /* replayed from its first event instead */
      }
    }
    cur.stream.start();
    return true;
  }

  /** Thread `t` as the daemon answered an operation on it (a model switch, say). */
  threadChangedHere(t) {
    if (this.current && this.current.id === t.id) {
      this.current.thread = t;
      this.renderThreadHead();
    }
    this.list.upsert(t);
  }

  /** A fork made from a message (web/fork.js): opened, a prompt it was made before in its box. */
  async openFork(t, prompt) {
    this.list.upsert(t);
    if (!(await this.openThread(t.id))) return;
    if (prompt) $("#prompt").value = prompt;
    $("#prompt").focus();
  }

  /** Opens thread `id` (unless it is open) at event `seq`: a search hit (web/jump.js). */
  async openAt(id, seq) {
    this.setPanel("sidebar", "#toggle-threads", false); // on a phone, the conversation comes forward
    if (!(this.current && this.current.id === id) && !(await this.openThread(id))) return;
    const cur = this.current;
    const found = await jumpTo({ view: cur.view, older: cur.older, seq, shown: () => cur.shown || 0, isCurrent: () => this.current === cur });
    if (!found && this.current === cur) $("#send-error").textContent = "That message is not in the conversation any more.";
  }

  threadGone(why) {
    if (this.current) this.list.remove(this.current.id);
    this.leaveThread();
    this.setHash(null);
    $("#thread").hidden = true;
    $("#empty").hidden = false;
    $("#empty").textContent = why === "deleted" ? "That thread was deleted." : "That thread does not exist.";
    this.setConn("idle");
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
    $("#t-meta").title = $("#t-meta").textContent;
    $("#t-usage").textContent = usageText(t.usage);
    $("#t-usage").title = "What this thread's turns used, in all";
    $("#archive").textContent = t.archived ? "Unarchive" : "Archive";
    const from = t.forked_from && typeof t.forked_from.thread === "string" ? t.forked_from : null;
    $("#t-fork").hidden = !from;
    $("#t-fork").textContent = "";
    if (from) {
      $("#t-fork").textContent = `Forked from “${(this.list.threads.get(from.thread) || {}).title || from.thread}”`;
      $("#t-fork").href = `#t=${encodeURIComponent(from.thread)}`;
    }
    this.models.update(t);
    this.changes.update(t);
    $("#export").href = `/v1/threads/${encodeURIComponent(t.id)}/export?format=markdown`;
    $("#export").download = `${t.id}.md`;
    // Known while the change stream is live; otherwise not pretended. The open thread's
    // own events say sooner than the stream whether a turn runs or a request waits.
    const key = threadState(t, { live: this.list.live, turnActive: cur.turnActive, pending: cur.pending.size });
    const [word, meaning] = THREAD_STATES[key];
    const st = $("#t-state");
    st.textContent = word;
    st.className = `badge tstate-${key}`;
    st.title = meaning;
    st.dataset.state = key;
    // Only the action that applies is offered: Stop while the agent runs, Resume (Start,
    // for a thread never started) while it does not.
    const running = ["starting", "running"].includes(t.state);
    $("#stop").hidden = !running;
    $("#resume").hidden = running || t.state === "stopping";
    $("#resume").textContent = t.state === "idle" ? "Start" : "Resume";
    this.updateTurnUi();
  }

  onEvents(cur, batch) {
    cur.view.apply(batch);
    if (batch.length) cur.shown = Math.max(cur.shown || 0, batch[batch.length - 1].seq || 0);
    let threadChanged = false;
    for (const ev of batch) {
      const commands = advertised(ev);
      if (commands) this.slash.setCommands((cur.commands = commands));
      const d = ev.data && typeof ev.data === "object" ? ev.data : {};
      switch (ev.kind) {
        case "turn.started":
          cur.turnActive = true;
          cur.usage = null;
          threadChanged = true;
          break;
        case "turn.ended":
          cur.turnActive = cur.view.turnActive;
          if (ev.seq > cur.view.catchUpTo) {
            // live, not a replay
            this.notifier.turnEnded(cur.thread);
            this.changes.turnEnded();
          }
          threadChanged = true;
          break;
        case "permission.requested":
          cur.pending.set(String(d.request_id), d);
          threadChanged = true;
          break;
        case "permission.resolved":
          cur.pending.delete(String(d.request_id));
          threadChanged = true;
          break;
        case "elicitation.requested":
        case "elicitation.resolved":
          this.elicit.event(cur, ev);
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
    this.soon("elicit", 30, () => this.elicit.render());
  }

  soon(key, ms, fn) {
    this.timers = this.timers || {};
    if (this.timers[key]) return;
    this.timers[key] = setTimeout(() => {
      this.timers[key] = null;
      fn();
    }, ms);
  }

  // The one status line under the conversation says what is going on now: a turn at work,
  // or a stopped agent and how to wake it. How each turn ended is said once, at its end in
  // the conversation; a ready thread needs no line at all.
  updateTurnUi() {
    const cur = this.current;
    const active = !!(cur && cur.turnActive);
    $("#interrupt").disabled = !active;
    const status = $("#turn-status-text");
    const stopped = cur && !active && cur.thread.state === "exited" && this.list.live;
    if (active && status.textContent === "Interrupting…") return;
    if (active) {
      const what = cur.agentStatus in AGENT_DOING ? AGENT_DOING[cur.agentStatus] : cur.agentStatus;
      const doing = what && cur.agentStatus !== "running" ? `Working (${what})…` : "Working…";
      status.textContent = `${doing} Esc interrupts.`;
    } else status.textContent = stopped ? "Stopped: your next message starts the agent again, or press Resume." : "";
    $("#turn-status").dataset.active = String(active);
    $("#turn-status").dataset.shown = String(active || Boolean(stopped));
  }

  // ------------------------------------------------------------------ actions

  async send() {
    const cur = this.current;
    const box = $("#prompt");
    const text = box.value;
    const files = this.att.items;
    if (!cur || (!text.trim() && !files.length)) return;
    if (files.length && this.att.bytes(files) + new TextEncoder().encode(JSON.stringify(text)).length + BODY_SLACK > MAX_BODY_BYTES) {
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
    this.att.take();
    $("#send-error").textContent = "";
    const restore = () => {
      if (!box.value) box.value = text;
      this.att.restore(files);
    };
    // client_id makes the send idempotent: after a network error, the same request is
    // sent again and the daemon answers with the original seq (docs/api.md §4.6).
    const waitUntil = Date.now() + MEMORY_WAIT_MS;
    for (let attempt = 0; attempt < 4; attempt++) {
      try {
        await api("POST", `/v1/threads/${encodeURIComponent(cur.id)}/messages`, body);
        if (this.current === cur) $("#send-error").textContent = "";
        return;
      } catch (err) {
        if (err instanceof ApiError && err.code === "memory_budget" && Date.now() < waitUntil) {
          // The host's agents fill the memory budget and none is idle: nothing was recorded,
          // so the same prompt (same client_id) is sent again when the daemon says.
          const wait = err.retryAfter || 5;
          if (this.current === cur) $("#send-error").textContent = `Waiting for memory: ${err.message} Trying again in ${wait} s…`;
          await new Promise((res) => setTimeout(res, wait * 1000));
          attempt--; // waiting for room is no failure to reach the daemon
          continue;
        }
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
      // The answer can come after the WebSocket already brought the turn's end: only a
      // turn still running is "interrupting" (else the end's status would be overwritten).
      if (this.current === cur && cur.turnActive) $("#turn-status-text").textContent = "Interrupting…";
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
      this.list.upsert(cur.thread);
    } catch (err) {
      $("#send-error").textContent = `${action} failed: ${err.message}`;
    }
  }

  /** Archive the open thread, or bring it back (docs/api.md §4.24). */
  async toggleArchived() {
    const cur = this.current;
    if (!cur) return;
    try {
      const path = `/v1/threads/${encodeURIComponent(cur.id)}`;
      cur.thread = await api("PATCH", path, { archived: !cur.thread.archived });
      this.renderThreadHead();
      this.list.upsert(cur.thread);
    } catch (err) {
      $("#send-error").textContent = `archive failed: ${err.message}`;
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
      this.list.upsert(cur.thread);
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
    // This thread's requests as its own stream tells them; the others' from the list.
    const waiting = (cur ? cur.pending.size : 0) + this.list.waitingElsewhere(cur ? cur.id : null);
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
    const tasks = this.current ? [...this.current.tasks.values()] : [];
    renderTasks($("#tasks"), $("#task-count"), tasks);
    const running = tasks.filter((t) => t.status === "running").length;
    $("#side-count").textContent = tasks.length ? String(running || tasks.length) : "";
    // No empty column: the panel opens by itself for a thread with tasks (where it fits
    // beside the conversation), and closes again for one without, unless the reader
    // opened or closed it themselves.
    const want = tasks.length > 0 && window.matchMedia(SIDE_ROOM).matches;
    if (this.sideAuto !== false && want !== document.body.classList.contains("show-side")) {
      this.sideAuto = true;
      this.setPanel("side", "#toggle-side", want);
    }
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
setUnauthorizedHandler(() => app.showLogin());
// A 401 from any request has already put the sign-in form up (see api()); a request
// still in flight when the user signs out is answered 401 too and is not an error.
window.addEventListener("unhandledrejection", (e) => {
  if (e.reason instanceof ApiError && e.reason.status === 401) e.preventDefault();
});
app.start();
window.agentBridge = app; // for the console (and the browser tests)
