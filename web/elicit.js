// The agent's questions to the user (elicitations, docs/api.md §6.10): a card above the
// prompt with the agent's message and either a form built from the checked schema the
// bridge passes on (text, number, yes/no, one choice, several choices) or a link the user
// may open. Accept, Decline and Cancel answer it over REST; the first answer from any
// client wins and every tab drops the card on `elicitation.resolved`. Text is only ever
// placed with textContent, and a URL only as a link's href once the bridge checked it is
// http(s): nothing here opens it without the user's click.

import { el } from "./dom.js";
import { api } from "./net.js";

const INPUT_TYPES = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" };

function options(prop) {
  const source = prop.type === "array" ? prop.items || {} : prop;
  if (Array.isArray(source.enum)) return source.enum.map((v) => ({ const: v, title: v }));
  const titled = source.oneOf || source.anyOf;
  return Array.isArray(titled) ? titled : null;
}

// One field: its element, and how to read its value (undefined: left empty).
function field(name, prop, required, id) {
  const label = el("label", null, prop.title || name);
  label.htmlFor = id;
  const wrap = el("div", "elicit-field");
  wrap.append(label);
  if (prop.description) wrap.append(el("p", "hint", prop.description));
  const choices = options(prop);
  if (prop.type === "boolean") {
    const box = el("input");
    box.type = "checkbox";
    box.id = id;
    box.checked = prop.default === true;
    label.prepend(box);
    label.htmlFor = "";
    return { node: wrap, read: () => box.checked };
  }
  if (prop.type === "array") {
    const group = el("fieldset", "elicit-choices");
    group.id = id;
    const boxes = (choices || []).map((o) => {
      const row = el("label", null, String(o.title ?? o.const));
      const box = el("input");
      box.type = "checkbox";
      box.value = String(o.const);
      box.checked = Array.isArray(prop.default) && prop.default.includes(o.const);
      row.prepend(box);
      group.append(row);
      return box;
    });
    wrap.append(group);
    return { node: wrap, read: () => boxes.filter((b) => b.checked).map((b) => b.value) };
  }
  if (choices) {
    const select = el("select");
    select.id = id;
    if (!required || prop.default === undefined) select.append(el("option", null, ""));
    for (const o of choices) {
      const opt = el("option", null, String(o.title ?? o.const));
      opt.value = String(o.const);
      select.append(opt);
    }
    select.value = prop.default !== undefined ? String(prop.default) : "";
    select.required = required;
    wrap.append(select);
    return { node: wrap, read: () => (select.value === "" ? undefined : select.value) };
  }
  const input = el("input");
  input.id = id;
  input.required = required;
  input.autocomplete = "off";
  if (prop.type === "number" || prop.type === "integer") {
    input.type = "number";
    input.step = prop.type === "integer" ? "1" : "any";
    if (prop.minimum !== undefined) input.min = String(prop.minimum);
    if (prop.maximum !== undefined) input.max = String(prop.maximum);
  } else {
    input.type = INPUT_TYPES[prop.format] || "text";
    if (prop.minLength !== undefined) input.minLength = prop.minLength;
    if (prop.maxLength !== undefined) input.maxLength = prop.maxLength;
  }
  if (prop.default !== undefined) input.value = String(prop.default);
  wrap.append(input);
  const read = () => {
    if (input.value === "") return undefined;
    return input.type === "number" ? Number(input.value) : input.value;
  };
  return { node: wrap, read };
}

export class ElicitCard {
  constructor(anchor) {
    this.box = el("section", "elicit-card");
    this.box.id = "elicit";
    this.box.hidden = true;
    this.box.setAttribute("aria-label", "The agent asks you");
    anchor.after(this.box);
    this.cur = null;
    this.shown = null; // the request the card shows
  }

  // The thread shown changed: its pending questions, as the thread says now.
  async open(cur) {
    this.cur = cur;
    cur.elicits = cur.elicits || new Map();
    this.render();
    try {
      const body = await api("GET", `/v1/threads/${encodeURIComponent(cur.id)}/elicitations`);
      if (this.cur !== cur) return;
      for (const e of body.elicitations || []) cur.elicits.set(String(e.request_id), e);
      this.render();
    } catch {
      // the stream's events fill the card anyway
    }
  }

  event(cur, ev) {
    const d = ev.data && typeof ev.data === "object" ? ev.data : {};
    cur.elicits = cur.elicits || new Map();
    if (ev.kind === "elicitation.requested") cur.elicits.set(String(d.request_id), d);
    else if (ev.kind === "elicitation.resolved") cur.elicits.delete(String(d.request_id));
  }

  render() {
    const cur = this.cur;
    const first = cur && cur.elicits ? cur.elicits.values().next().value : undefined;
    if (!first) {
      this.box.hidden = true;
      this.box.replaceChildren();
      this.shown = null;
      return;
    }
    if (this.shown === String(first.request_id) && !this.box.hidden) return; // keep what is typed
    this.shown = String(first.request_id);
    this.box.hidden = false;
    this.box.replaceChildren(this.card(first, cur.elicits.size - 1));
  }

  card(e, more) {
    const form = el("form");
    form.noValidate = false;
    form.append(el("h2", null, "The agent asks you"));
    form.append(el("p", "elicit-message", String(e.message ?? "")));
    const fields = [];
    if (e.mode === "url") {
      form.append(this.link(e));
    } else {
      const schema = e.requested_schema || {};
      const required = new Set(Array.isArray(schema.required) ? schema.required : []);
      for (const [name, prop] of Object.entries(schema.properties || {})) {
        const f = field(name, prop, required.has(name), `elicit-f-${fields.length}`);
        fields.push([name, f]);
        form.append(f.node);
      }
    }
    if (more > 0) form.append(el("p", "hint", `${more} more question(s) waiting.`));
    const error = el("p", "elicit-error");
    error.setAttribute("role", "alert");
    form.append(error);
    const actions = el("div", "actions");
    const accept = el("button", "primary", e.mode === "url" ? "Open and accept" : "Accept");
    accept.type = "submit";
    const decline = el("button", "danger", "Decline");
    decline.type = "button";
    const cancel = el("button", null, "Cancel");
    cancel.type = "button";
    actions.append(cancel, decline, accept);
    form.append(actions);
    form.addEventListener("submit", (evt) => {
      evt.preventDefault();
      const content = {};
      for (const [name, f] of fields) {
        const v = f.read();
        if (v !== undefined) content[name] = v;
      }
      if (e.mode === "url") window.open(e.url, "_blank", "noopener,noreferrer");
      this.answer(e, "accept", e.mode === "url" ? undefined : content, error);
    });
    decline.addEventListener("click", () => this.answer(e, "decline", undefined, error));
    cancel.addEventListener("click", () => this.answer(e, "cancel", undefined, error));
    return form;
  }

  link(e) {
    const box = el("div", "elicit-url");
    const warn = el("p", "elicit-warning");
    warn.append(
      "This opens a page outside agent-bridge, on ",
      el("strong", null, String(e.url_host ?? "")),
      ". Continue only if you trust it and expected this request.",
    );
    box.append(warn);
    if (e.url_warning) box.append(el("p", "elicit-warning", String(e.url_warning)));
    const a = el("a", "elicit-link", String(e.url));
    a.href = String(e.url);
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    box.append(a);
    return box;
  }

  async answer(e, action, content, error) {
    const cur = this.cur;
    if (!cur) return;
    const rid = String(e.request_id);
    const body = content === undefined ? { action } : { action, content };
    try {
      await api("POST", `/v1/threads/${encodeURIComponent(cur.id)}/elicitations/${encodeURIComponent(rid)}`, body);
    } catch (err) {
      if (err.status !== 409 && err.status !== 404) {
        error.textContent = `Could not answer: ${err.message}`;
        return;
      }
    }
    cur.elicits.delete(rid); // elicitation.resolved confirms it, in every tab
    this.render();
  }
}
