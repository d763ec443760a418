// The model picker in the open thread's header (docs/api.md §4.4, §4.5): the models the
// thread may run, its own model chosen, the profile's default marked; picking another sends
// PATCH /v1/threads/{id} {"model"}, and the next turn runs on it with the conversation kept
// (a stream-json agent restarts and resumes at the turn's end; an ACP agent switches its
// own model option). The choices are the thread's own agent's, when it reported a model
// option (agent_info.config_options, category "model"), else GET /v1/agents/{name}/models:
// its answer is {"models": [{id, name?}], "current"?}, and a plain list of ids is taken too.
// A refusal (a model the agent does not offer, an agent that cannot switch) is said under
// the picker in the daemon's words, and the picker goes back to the thread's model.

import { api } from "./net.js";
import { el } from "./dom.js";

const DEFAULT = ""; // the option for a thread that runs the agent's own default

/** [{id, name?}] from what an answer or an agent gives: ids, or objects with id or value. */
export function modelList(raw) {
  const list = Array.isArray(raw) ? raw : raw && Array.isArray(raw.models) ? raw.models : [];
  const out = [];
  const seen = new Set();
  for (const m of list) {
    const id = typeof m === "string" ? m : m && typeof m === "object" ? (m.id ?? m.value) : null;
    if (typeof id !== "string" || !id || seen.has(id)) continue;
    seen.add(id);
    out.push(m && typeof m === "object" && typeof m.name === "string" && m.name && m.name !== id ? { id, name: m.name } : { id });
  }
  return out;
}

/** The thread's own agent's model option, as {models, current}, or null. */
export function agentModels(thread) {
  const options = thread && thread.agent_info && Array.isArray(thread.agent_info.config_options) ? thread.agent_info.config_options : [];
  const option = options.find((o) => o && o.category === "model" && o.type === "select");
  if (!option) return null;
  const flat = (option.options || []).flatMap((o) => (o && Array.isArray(o.options) ? o.options : [o]));
  return { models: modelList(flat), current: typeof option.currentValue === "string" ? option.currentValue : null };
}

export class ModelPicker {
  /** onThread(t): the thread as the daemon answered a switch. */
  constructor({ onThread }) {
    this.box = document.getElementById("t-model-box");
    this.select = document.getElementById("t-model");
    this.error = document.getElementById("t-model-error");
    this.onThread = onThread;
    this.thread = null;
    this.profile = { models: [], current: null }; // the profile's list, for this.thread's agent
    this.asked = 0;
    this.select.addEventListener("change", () => this.pick(this.select.value));
  }

  /** A thread opened: its profile's models are asked for once. */
  async open(thread) {
    this.thread = thread;
    this.error.textContent = "";
    this.profile = { models: [], current: null };
    this.render();
    const n = ++this.asked;
    try {
      const res = await api("GET", `/v1/agents/${encodeURIComponent(thread.agent)}/models`);
      if (n !== this.asked) return;
      this.profile = { models: modelList(res), current: res && typeof res.current === "string" ? res.current : null };
    } catch {
      /* the thread's own model (and its agent's) are still offered */
    }
    if (n === this.asked) this.render();
  }

  /** The thread changed (its model, its agent's options): the picker follows. */
  update(thread) {
    if (!this.thread || thread.id !== this.thread.id) return;
    this.thread = thread;
    if (!this.busy) this.render();
  }

  close() {
    this.asked++;
    this.thread = null;
    this.box.hidden = true;
  }

  /** The models offered, and the one the thread runs: its own, else what its agent says
   * it runs (an ACP thread created without a model), else null (the agent's default). */
  choices() {
    const t = this.thread;
    const own = agentModels(t);
    const models = own && own.models.length ? own.models : this.profile.models;
    const list = [...models];
    const current = t.model || (own && own.current) || null;
    if (current && !list.some((m) => m.id === current)) list.unshift({ id: current });
    return { list, current };
  }

  render() {
    const t = this.thread;
    if (!t) return;
    const { list, current } = this.choices();
    // Nothing to choose between: the header's line already names the model.
    this.box.hidden = list.length < 2 && !(list.length === 1 && !current);
    const options = [];
    if (!current) {
      const o = el("option", null, "the agent's default");
      o.value = DEFAULT;
      o.disabled = true;
      options.push(o);
    }
    for (const m of list) {
      const marks = m.id === this.profile.current ? " (profile default)" : "";
      const o = el("option", null, `${m.name || m.id}${marks}`);
      o.value = m.id;
      if (m.name) o.title = m.id;
      options.push(o);
    }
    this.select.replaceChildren(...options);
    this.select.value = current || DEFAULT;
    this.select.title = `This thread's model: ${current || "the agent's default"}`;
  }

  async pick(model) {
    const t = this.thread;
    if (!t || !model || model === this.choices().current) return;
    this.error.textContent = "";
    this.busy = true;
    this.select.disabled = true;
    try {
      const thread = await api("PATCH", `/v1/threads/${encodeURIComponent(t.id)}`, { model });
      if (this.thread && this.thread.id === t.id) this.thread = thread;
      this.onThread(thread);
    } catch (err) {
      if (this.thread && this.thread.id === t.id) this.error.textContent = `Model not changed: ${err.message}`;
    } finally {
      this.busy = false;
      this.select.disabled = false;
      this.render();
    }
  }
}
