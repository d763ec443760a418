// Slash commands: the ones the agent advertises, offered in a menu when the message box
// starts with "/". stream-json agents list them in `system/init` (`slash_commands`, names),
// ACP agents in an `available_commands_update` (`availableCommands`: name, description);
// the normalized events (session.started, agent.other) do not carry them, so they are read
// from the event's `raw` line — untrusted text, shown with textContent only.

import { el } from "./dom.js";

const MAX_COMMANDS = 500;
const MAX_SHOWN = 12;
const NAME = /^[\w:.\-]{1,100}$/u;

/** The commands an event advertises: [{name, description}], or null if it says nothing. */
export function advertised(ev) {
  const raw = ev && ev.raw && typeof ev.raw === "object" ? ev.raw : null;
  if (!raw) return null;
  let list = null;
  if (ev.kind === "session.started" && Array.isArray(raw.slash_commands)) {
    list = raw.slash_commands.map((c) => (typeof c === "string" ? { name: c } : c));
  } else if (ev.kind === "agent.other" && ev.data && ev.data.session_update === "available_commands_update") {
    const u = raw.params && raw.params.update;
    list = u && Array.isArray(u.availableCommands) ? u.availableCommands : [];
  }
  if (!list) return null;
  const out = [];
  for (const c of list.slice(0, MAX_COMMANDS)) {
    if (!c || typeof c !== "object") continue;
    const name = String(c.name ?? "").replace(/^\//, "");
    if (!NAME.test(name)) continue;
    out.push({ name, description: typeof c.description === "string" ? c.description.slice(0, 300) : "" });
  }
  return out;
}

/** The menu above the message box; the box keeps the focus (arrows move, Enter or Tab
 * completes, Escape closes). */
export class SlashMenu {
  constructor(box, menu) {
    this.box = box;
    this.menu = menu;
    this.commands = [];
    this.shown = [];
    this.active = 0;
    box.setAttribute("aria-controls", menu.id);
    box.addEventListener("input", () => this.update());
    box.addEventListener("blur", () => setTimeout(() => this.close(), 150));
  }

  setCommands(commands) {
    this.commands = commands || [];
    this.update();
  }

  get open() {
    return !this.menu.hidden;
  }

  update() {
    const m = /^\/([^\s]*)$/.exec(this.box.value);
    if (!m || !this.commands.length || document.activeElement !== this.box) {
      this.close();
      return;
    }
    const q = m[1].toLowerCase();
    const starts = this.commands.filter((c) => c.name.toLowerCase().startsWith(q));
    const inside = this.commands.filter((c) => !c.name.toLowerCase().startsWith(q) && c.name.toLowerCase().includes(q));
    this.shown = [...starts, ...inside].slice(0, MAX_SHOWN);
    if (!this.shown.length) {
      this.close();
      return;
    }
    this.active = Math.min(this.active, this.shown.length - 1);
    this.render();
  }

  render() {
    this.menu.replaceChildren();
    this.shown.forEach((c, i) => {
      const li = el("li", "slash-item");
      li.id = `slash-${i}`;
      li.setAttribute("role", "option");
      li.setAttribute("aria-selected", String(i === this.active));
      li.append(el("span", "slash-name", `/${c.name}`));
      if (c.description) li.append(el("span", "slash-desc", c.description));
      li.addEventListener("mousedown", (e) => {
        e.preventDefault(); // keep the focus in the box
        this.choose(i);
      });
      this.menu.append(li);
    });
    this.menu.hidden = false;
  }

  close() {
    this.menu.hidden = true;
    this.active = 0;
  }

  choose(i) {
    const c = this.shown[i];
    if (!c) return;
    this.box.value = `/${c.name} `;
    this.close();
    this.box.focus();
  }

  /** A key pressed in the box: true when the menu took it. */
  key(e) {
    if (!this.open) return false;
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      const n = this.shown.length;
      this.active = (this.active + (e.key === "ArrowDown" ? 1 : n - 1)) % n;
      this.render();
    } else if (e.key === "Enter" || e.key === "Tab") {
      if (e.shiftKey) return false;
      this.choose(this.active);
    } else if (e.key === "Escape") {
      this.close();
    } else return false;
    e.preventDefault();
    e.stopPropagation();
    return true;
  }
}
