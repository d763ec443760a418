// The Changes panel of a thread that works in its own git worktree (docs/api.md §4.27; the
// thread's `worktree`): what the agent changed against the worktree's base — the files with
// their status and +/- counts, and the diff with old and new line numbers (diff.js) — asked
// for when the thread opens and again after each of its turns ends (GET …/changes), and the
// three things to do with it: Commit (with a message) on the thread's branch, Merge the
// branch into the base in the original repository (409 merge_conflict names the files, and
// nothing was changed), Discard the worktree and its branch (after a confirmation). The
// header's "Changes" button opens and closes it and counts the changed files. Every path,
// line and message is placed as text.

import { api } from "./net.js";
import { el } from "./dom.js";
import { parseUnified, renderFile } from "./diff.js";

const STATUS_WORDS = { added: "added", deleted: "deleted", modified: "modified", type_changed: "type changed" };
const $ = (id) => document.getElementById(id);

/** The thread's worktree, unless it has none or it was discarded. */
export function liveWorktree(thread) {
  const wt = thread && thread.worktree;
  return wt && typeof wt === "object" && !wt.discarded ? wt : null;
}

export class ChangesPanel {
  constructor() {
    this.toggle = $("changes-toggle");
    this.root = $("changes");
    this.thread = null;
    this.asked = 0;
    this.toggle.addEventListener("click", () => this.show(this.root.hidden));
    $("changes-refresh").addEventListener("click", () => this.refresh());
    $("changes-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.commit();
    });
    $("changes-merge").addEventListener("click", () => this.merge());
    $("changes-discard").addEventListener("click", () => this.confirmDiscard());
    $("discard-no").addEventListener("click", () => $("discard-dialog").close());
    $("discard-yes").addEventListener("click", () => {
      $("discard-dialog").close();
      this.discard();
    });
  }

  /** A thread opened: the panel is offered when it has a worktree, closed to begin with. */
  open(thread) {
    this.thread = thread;
    this.asked++;
    this.say("", "");
    $("changes-files").replaceChildren();
    $("changes-diff").replaceChildren();
    $("changes-summary").textContent = "";
    $("changes-count").textContent = "";
    this.show(false);
    this.render();
    if (liveWorktree(thread)) this.refresh();
  }

  /** The thread changed (elsewhere too: a discard in another tab). */
  update(thread) {
    if (!this.thread || thread.id !== this.thread.id) return;
    const was = liveWorktree(this.thread);
    this.thread = thread;
    this.render();
    if (was && !liveWorktree(thread)) $("changes-summary").textContent = "The worktree and its branch were discarded.";
  }

  /** A turn of the open thread ended: its agent may have changed files. */
  turnEnded() {
    if (liveWorktree(this.thread)) this.refresh();
  }

  show(open) {
    const able = Boolean(this.thread && this.thread.worktree);
    this.root.hidden = !(open && able);
    this.toggle.setAttribute("aria-expanded", String(!this.root.hidden));
  }

  render() {
    const t = this.thread;
    const wt = t && t.worktree;
    this.toggle.hidden = !wt;
    if (!wt) this.show(false);
    const live = Boolean(liveWorktree(t));
    for (const id of ["changes-message", "changes-commit", "changes-merge", "changes-discard", "changes-refresh"]) $(id).disabled = !live;
    $("changes-form").hidden = !live;
  }

  say(status, error) {
    $("changes-status").textContent = status;
    $("changes-error").textContent = error;
  }

  async refresh() {
    const t = this.thread;
    if (!liveWorktree(t)) return;
    const n = ++this.asked;
    let res;
    try {
      res = await api("GET", `/v1/threads/${encodeURIComponent(t.id)}/changes`);
    } catch (err) {
      if (n === this.asked) this.say("", `Changes not read: ${err.message}`);
      return;
    }
    if (n !== this.asked) return;
    this.renderChanges(res);
  }

  renderChanges(res) {
    const files = Array.isArray(res.files) ? res.files : [];
    $("changes-count").textContent = files.length ? String(files.length) : "";
    const plus = files.reduce((a, f) => a + (f.additions || 0), 0);
    const minus = files.reduce((a, f) => a + (f.deletions || 0), 0);
    const what = files.length
      ? `${files.length} file${files.length === 1 ? "" : "s"} changed · +${plus} −${minus}`
      : "No changes";
    const extra = [];
    if (res.uncommitted) extra.push("some not committed yet");
    if (res.files_truncated) extra.push(`${res.files_truncated} files in all, the first ${files.length} listed`);
    $("changes-summary").textContent = `${what} on ${res.branch} against ${res.base}${extra.length ? ` (${extra.join("; ")})` : ""}`;
    const box = el("div", "diff");
    const heads = new Map(); // path → its part of the diff, for the list's links to it
    for (const file of parseUnified(res.diff)) {
      heads.set(file.path, renderFile(box, { ...file, empty: file.binary ? "(binary: not shown)" : "(no lines changed)" }));
    }
    if (res.truncated) box.append(el("p", "hint", "The diff is longer than the daemon sends at once: the rest is not shown."));
    $("changes-diff").replaceChildren(box);
    const list = $("changes-files");
    list.replaceChildren();
    for (const f of files) {
      const li = el("li", `changed changed-${String(f.status).replace(/\W/g, "")}`);
      const head = heads.get(String(f.path));
      const path = el(head ? "button" : "span", "changed-path", String(f.path));
      if (head) {
        // The file's name goes to its diff (a name git quoted in the diff has no link).
        path.type = "button";
        path.title = "Show this file's diff";
        path.addEventListener("click", () => {
          head.tabIndex = -1;
          head.scrollIntoView({ block: "start" });
          head.focus({ preventScroll: true });
        });
      }
      li.append(
        el("span", "badge", STATUS_WORDS[f.status] || String(f.status)),
        path,
        el("span", "diff-stat", f.binary ? "binary" : `+${f.additions ?? 0} −${f.deletions ?? 0}`),
      );
      list.append(li);
    }
  }

  /** Runs one operation of the panel; `done(answer)` says how it went. Whether it did. */
  async act(path, body, done, { refresh = true } = {}) {
    const t = this.thread;
    if (!liveWorktree(t)) return false;
    const here = () => this.thread && this.thread.id === t.id;
    this.say("Working…", "");
    try {
      const res = await api("POST", `/v1/threads/${encodeURIComponent(t.id)}/changes/${path}`, body);
      if (!here()) return false;
      this.say(done(res), "");
    } catch (err) {
      if (!here()) return false;
      // A merge that conflicts names the files (its error's `files`); nothing was changed.
      const files = err.details && Array.isArray(err.details.files) ? err.details.files.map(String) : [];
      const list = files.length ? ` Conflicting files: ${files.slice(0, 50).join(", ")}${files.length > 50 ? ", …" : ""}.` : "";
      this.say("", `${err.message}${list}`);
      return false;
    }
    if (refresh) await this.refresh();
    return true;
  }

  commit() {
    const message = $("changes-message").value.trim();
    if (!message) {
      this.say("", "Write a commit message first.");
      $("changes-message").focus();
      return;
    }
    return this.act("commit", { message }, (res) => {
      $("changes-message").value = "";
      return `Committed ${String(res.commit || "").slice(0, 12)} on ${res.branch}.`;
    });
  }

  merge() {
    return this.act("merge", undefined, (res) => {
      const how = res.fast_forward ? "fast-forward" : "a merge commit";
      return `Merged into ${res.base} (${how}, ${String(res.commit || "").slice(0, 12)}).`;
    });
  }

  confirmDiscard() {
    const wt = liveWorktree(this.thread);
    if (!wt) return;
    $("discard-text").textContent = `Remove this thread's worktree (${wt.path}) and its branch ${wt.branch}, with every change not merged? The agent stops and cannot work here again. This cannot be undone.`;
    $("discard-dialog").showModal();
    $("discard-no").focus();
  }

  async discard() {
    const t = this.thread;
    const done = await this.act("discard", undefined, () => "Discarded: the worktree and its branch were removed.", { refresh: false });
    if (done && this.thread && this.thread.id === t.id) {
      // The thread object says so too (its worktree's `discarded`), by the change stream;
      // the panel need not wait for it.
      this.thread = { ...this.thread, worktree: { ...t.worktree, discarded: true } };
      this.render();
      $("changes-files").replaceChildren();
      $("changes-diff").replaceChildren();
      $("changes-count").textContent = "";
    }
  }
}
