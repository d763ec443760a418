// The task panel (right): sub-agents and workflows of the open thread, with status,
// usage and a workflow's phases and agents. Pure rendering (textContent only).

import { el } from "./dom.js";

export function renderTasks(list, count, tasks) {
  count.textContent = tasks.length ? `(${tasks.filter((t) => t.status === "running").length} running / ${tasks.length})` : "";
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
    if (Array.isArray(t.workflow_progress) && t.workflow_progress.length) li.append(workflow(t.workflow_progress));
    list.append(li);
  }
}

// workflow_progress is a snapshot: phases ({type: "workflow_phase", index, title}) and
// agents ({type: "workflow_agent", phaseIndex, label, state, …}); other shapes are shown
// by whatever label and state they carry.
function workflow(entries) {
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
