// "My secrets" (docs/web.md): the signed-in user's secrets for agent profiles, given to
// their own agents of that profile as environment variables (docs/api.md §4.19). The page
// lists names only (the daemon never returns a value), stores a value from a write-only
// field that is cleared once sent, and deletes.
import { $, ago, el } from "./dom.js";
import { api } from "./net.js";

const NAME_RE = /^[A-Z_][A-Z0-9_]{0,127}$/;

export class SecretsPanel {
  constructor() {
    this.form = $("#secret-form");
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.save();
    });
    $("#secret-panel").addEventListener("toggle", () => {
      if ($("#secret-panel").open) this.refresh();
    });
  }

  /** The profiles a secret can be for (GET /v1/agents), and the list when it is open. */
  setAgents(agents) {
    const select = $("#secret-profile");
    const keep = select.value;
    select.replaceChildren(...(agents || []).map((a) => el("option", "", a.name)));
    if (keep) select.value = keep;
    if ($("#secret-panel").open) this.refresh();
  }

  say(text) {
    $("#secret-error").textContent = text;
  }

  async refresh() {
    let secrets;
    try {
      secrets = (await api("GET", "/v1/me/secrets")).secrets;
    } catch (err) {
      this.say(`Could not list secrets: ${err.message}`);
      return;
    }
    const list = $("#secret-list");
    list.replaceChildren(
      ...secrets.map((s) => {
        const li = el("li", "secret");
        li.append(el("code", "secret-name", s.key), el("span", "hint", ` ${s.profile} · ${ago(s.updated_at)} `));
        const del = el("button", "small danger", "Delete");
        del.type = "button";
        del.setAttribute("aria-label", `Delete ${s.key} for ${s.profile}`);
        del.addEventListener("click", () => this.remove(s.profile, s.key));
        li.append(del);
        return li;
      }),
    );
    $("#secret-count").textContent = secrets.length ? `(${secrets.length})` : "";
    $("#secret-empty").hidden = secrets.length > 0;
  }

  async save() {
    const profile = $("#secret-profile").value;
    const key = $("#secret-key").value.trim();
    const value = $("#secret-value");
    if (!NAME_RE.test(key)) {
      this.say("A name is an environment variable's: A-Z, 0-9 and _, not starting with a digit.");
      return;
    }
    try {
      await api("PUT", `/v1/me/secrets/${encodeURIComponent(profile)}/${encodeURIComponent(key)}`, { value: value.value });
    } catch (err) {
      this.say(`Not stored: ${err.message}`);
      return;
    }
    value.value = ""; // write-only: the page keeps no copy
    $("#secret-key").value = "";
    this.say(`${key} stored for ${profile}; its agents get it from their next start.`);
    await this.refresh();
  }

  async remove(profile, key) {
    try {
      await api("DELETE", `/v1/me/secrets/${encodeURIComponent(profile)}/${encodeURIComponent(key)}`);
      this.say(`${key} deleted for ${profile}.`);
    } catch (err) {
      this.say(`Not deleted: ${err.message}`);
    }
    await this.refresh();
  }
}
