// Forking the open thread from one of its messages (POST /v1/threads/{id}/fork, docs/api.md
// §4.26). Every message of the conversation carries a "Fork" button (transcript.js); one
// listener on the conversation answers them all, older history pages included. The daemon
// forks at a turn boundary (it rounds `after_seq` down to the newest turn end at or before
// it), so:
// - from a reply: the conversation up to the end of that reply's turn (after_seq = the seq
//   of the turn end that follows it; a turn still running has none yet, and says so);
// - from a prompt of yours: the conversation before it (after_seq = its seq - 1), the
//   prompt put in the new thread's message box to edit and send there — a way to try a
//   different question from the same point.
// The new thread opens. An agent that cannot fork (409 fork_not_supported) is said so.

import { api } from "./net.js";

/** The turn end that follows `msg` in the conversation, or null while its turn runs. */
export function turnEndAfter(msg) {
  for (let n = msg.nextElementSibling; n; n = n.nextElementSibling) {
    if (n.classList.contains("turn-end")) return n;
  }
  return null;
}

/** What POST …/fork is given for a fork from message block `msg`: {after_seq, prompt} (the
 * prompt to put in the new thread's box), or {wait} when the reply's turn has not ended. */
export function forkPoint(msg) {
  if (msg.classList.contains("user")) {
    const body = msg.querySelector(".body");
    return { after_seq: Math.max(0, Number(msg.dataset.seq) - 1), prompt: body ? body.textContent : "" };
  }
  const end = turnEndAfter(msg);
  if (!end || !end.dataset.seq) return { wait: true };
  return { after_seq: Number(end.dataset.seq), prompt: "" };
}

export class Forks {
  /** current(): the open thread ({id}) or null; onForked(thread, prompt): open the fork;
   * say(text): tell the reader (the composer's error line). */
  constructor({ current, onForked, say }) {
    this.current = current;
    this.onForked = onForked;
    this.say = say;
    this.busy = false;
  }

  bind(root) {
    root.addEventListener("click", (e) => {
      const button = e.target instanceof Element ? e.target.closest(".msg-fork") : null;
      const msg = button && button.closest(".msg");
      if (msg) this.fork(msg, button);
    });
    return this;
  }

  async fork(msg, button) {
    const cur = this.current();
    if (!cur || this.busy) return;
    const point = forkPoint(msg);
    if (point.wait) {
      this.say("This reply's turn has not ended yet: fork from it once it has, or from the prompt before it.");
      return;
    }
    this.busy = true;
    button.disabled = true;
    try {
      const thread = await api("POST", `/v1/threads/${encodeURIComponent(cur.id)}/fork`, { after_seq: point.after_seq });
      await this.onForked(thread, point.prompt);
    } catch (err) {
      if (this.current() !== cur) return;
      const why =
        err.code === "fork_not_supported"
          ? `This thread's agent cannot fork here: ${err.message}`
          : err.code === "turn_active"
            ? `Not forked while the turn runs: ${err.message}`
            : `Fork failed: ${err.message}`;
      this.say(why);
    } finally {
      this.busy = false;
      button.disabled = false;
    }
  }
}
