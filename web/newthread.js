// The new-thread dialog: agent profile, model (the profile's default, editable), working
// directory (typed, or browsed within the daemon's workspace roots: GET /v1/workspace/dirs,
// docs/api.md §4.17), a git worktree of its own (§4.27), "resume an existing session"
// (§4.13) and a title.

import { $, ago, el } from "./dom.js";
import { api } from "./net.js";

export class NewThreadDialog {
  /** onCreated(thread): the thread was created (POST /v1/threads answered). */
  constructor({ onCreated }) {
    this.onCreated = onCreated;
    this.agents = [];
    this.modelEdited = false;
    this.nativeCursor = null;
    this.adopting = true;
    $("#new-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.create();
    });
    $("#new-cancel").addEventListener("click", () => $("#new-dialog").close());
    $("#new-agent").addEventListener("change", () => {
      this.fillModel();
      this.showSandbox();
      this.loadNativeSessions();
    });
    $("#new-model").addEventListener("input", () => {
      this.modelEdited = true;
    });
    $("#new-cwd").addEventListener("change", () => this.loadNativeSessions());
    $("#new-worktree").addEventListener("change", (e) => {
      $("#new-base-box").hidden = !e.target.checked;
    });
    $("#new-session-more").addEventListener("click", () => this.loadNativeSessions(this.nativeCursor));
    $("#new-browse").addEventListener("click", () => {
      const box = $("#new-dirs-box");
      if (!box.hidden) {
        box.hidden = true;
        $("#new-browse").setAttribute("aria-expanded", "false");
        return;
      }
      const typed = $("#new-cwd").value.trim();
      // "<data-dir>/…": how the daemon shows a non-admin the paths in its data dir (users mode).
      this.browse(typed.startsWith("/") || typed.startsWith("<data-dir>") ? typed : null);
    });
  }

  profile() {
    return this.agents.find((a) => a.name === $("#new-agent").value) || null;
  }

  open(agents) {
    this.agents = agents;
    const sel = $("#new-agent");
    sel.replaceChildren();
    for (const a of agents) {
      const o = el("option", null, `${a.name} (${a.protocol}${a.model ? `, ${a.model}` : ""})${a.available ? "" : " — cannot run"}`);
      o.value = a.name;
      o.disabled = !a.available;
      if (!a.available && a.problem) o.title = String(a.problem);
      if (a.default && a.available) o.selected = true;
      sel.append(o);
    }
    // A profile that cannot run is listed, disabled, and why is said in words under the
    // menu (GET /v1/agents "problem": a missing executable, a launch rule it breaks, …).
    const unusable = agents.filter((a) => !a.available);
    const why = $("#new-unusable");
    why.replaceChildren();
    why.hidden = !unusable.length;
    for (const a of unusable) {
      const line = el("span", "unusable");
      line.dataset.agent = a.name;
      line.append(el("strong", null, a.name), ` cannot run: ${a.problem || "the daemon gives no reason"}`);
      why.append(line);
    }
    this.modelEdited = false;
    this.fillModel();
    this.showSandbox();
    $("#new-error").textContent = "";
    $("#new-dirs-box").hidden = true;
    $("#new-browse").setAttribute("aria-expanded", "false");
    $("#new-dialog").showModal();
    sel.focus();
    this.loadNativeSessions();
    this.checkRoots();
  }

  // What the agent will be able to reach (GET /v1/agents "sandbox", docs/security.md §6).
  showSandbox() {
    const p = this.profile();
    const box = $("#new-sandbox");
    if (!p || !p.sandbox) {
      box.textContent = "";
      return;
    }
    box.textContent =
      p.sandbox === "none"
        ? "Unconfined: this agent can read and change everything the daemon's user can."
        : `Confined (${p.sandbox}): the agent reaches its working directory, its home and a temp dir of its own.`;
    box.classList.toggle("warn", p.sandbox === "none");
  }

  // The model field shows the profile's default until the user types their own.
  fillModel() {
    if (this.modelEdited) return;
    const p = this.profile();
    $("#new-model").value = (p && p.model) || "";
    $("#new-model").placeholder = p && p.model ? "" : "the agent's default";
  }

  // "Browse…" is offered only when the daemon has workspace roots to browse.
  async checkRoots() {
    try {
      const res = await api("GET", "/v1/workspace/dirs");
      $("#new-browse").hidden = !res.dirs.length;
    } catch {
      $("#new-browse").hidden = true;
    }
  }

  async browse(path) {
    const box = $("#new-dirs-box");
    const list = $("#new-dirs");
    const status = $("#new-dirs-status");
    const ask = (this.browseAsk = (this.browseAsk || 0) + 1);
    box.hidden = false;
    $("#new-browse").setAttribute("aria-expanded", "true");
    let res;
    try {
      res = await api("GET", `/v1/workspace/dirs${path ? `?${new URLSearchParams({ path })}` : ""}`);
    } catch (err) {
      if (ask !== this.browseAsk) return;
      if (path) return this.browse(null); // a typed path outside the roots: start from them
      status.textContent = err.message;
      return;
    }
    if (ask !== this.browseAsk) return;
    $("#new-dirs-path").textContent = res.path || "Workspace roots";
    list.replaceChildren();
    const item = (label, target, cls) => {
      const li = el("li");
      const b = el("button", `small ${cls}`, label);
      b.type = "button";
      b.dataset.path = target || "";
      b.addEventListener("click", () => {
        if (target) $("#new-cwd").value = target;
        this.loadNativeSessions();
        this.browse(target).then(() => {
          const first = list.querySelector("button");
          if (first) first.focus();
        });
      });
      li.append(b);
      list.append(li);
    };
    if (res.path) item(res.parent ? "↑ Up" : "↑ Roots", res.parent, "dir-up");
    for (const d of res.dirs) item(d.name, d.path, "dir");
    if (res.path) $("#new-cwd").value = res.path;
    status.textContent = res.dirs.length
      ? `${res.dirs.length}${res.truncated ? "+" : ""} folder${res.dirs.length === 1 ? "" : "s"}`
      : "No folders here.";
  }

  // "Resume an existing session": what the chosen agent itself keeps for the directory
  // (GET /v1/agents/{name}/sessions, docs/api.md §4.13); a page at a time, newest first.
  setAdopting(on) {
    this.adopting = on;
    for (const id of ["#new-session", "#new-session-status"]) $(id).hidden = !on;
    $('label[for="new-session"]').hidden = !on;
    if (!on) {
      $("#new-session").value = "";
      $("#new-session-more").hidden = true;
    }
  }

  async loadNativeSessions(cursor = null) {
    if (!this.adopting) return;
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

  async create() {
    const body = { agent: $("#new-agent").value };
    const cwd = $("#new-cwd").value.trim();
    const title = $("#new-title").value.trim();
    const model = $("#new-model").value.trim();
    const p = this.profile();
    if (cwd) body.cwd = cwd;
    if (title) body.title = title;
    if (model && model !== ((p && p.model) || "")) body.model = model;
    // Its own git worktree (docs/api.md §4.27): the Changes panel (changes.js) then offers it.
    if ($("#new-worktree").checked) {
      body.worktree = true;
      const base = $("#new-base").value.trim();
      if (base) body.base = base;
    }
    const pick = $("#new-session");
    if (pick.value) {
      body.native_session_id = pick.value;
      if (!title) body.title = pick.selectedOptions[0].dataset.title || "";
    }
    let t;
    try {
      t = await api("POST", "/v1/threads", body);
    } catch (err) {
      $("#new-error").textContent = err.message;
      return;
    }
    $("#new-dialog").close();
    $("#new-title").value = "";
    $("#new-worktree").checked = false;
    $("#new-base").value = "";
    $("#new-base-box").hidden = true;
    await this.onCreated(t);
  }
}
