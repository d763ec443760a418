// What turns used (docs/api.md §4.25): one line for a thread's totals (its header) and for
// everything the signed-in user may see (the sidebar, from GET /v1/usage). Text only.
import { api } from "./net.js";

// The sidebar's total is asked again at most this often while turns keep ending.
const REFRESH_MS = 2000;

function count(n) {
  if (n < 1000) return String(n);
  if (n < 1_000_000) return `${(n / 1000).toFixed(n < 10_000 ? 1 : 0)}k`;
  return `${(n / 1_000_000).toFixed(1)}M`;
}

function money(amount, currency) {
  const digits = amount !== 0 && amount < 0.01 ? 4 : 2;
  return currency === "USD" ? `$${amount.toFixed(digits)}` : `${amount.toFixed(digits)} ${currency}`;
}

// "3 turns · 1.2k in · 340 out · $0.75" (cache reads and writes counted as input where the
// agent reported them apart); "" when no turn has ended.
export function usageText(u) {
  if (!u || !u.turns) return "";
  const input = (u.input_tokens || 0) + (u.cache_read_input_tokens || 0) + (u.cache_creation_input_tokens || 0);
  const parts = [`${u.turns} turn${u.turns === 1 ? "" : "s"}`, `${count(input)} in`, `${count(u.output_tokens || 0)} out`];
  for (const [currency, amount] of Object.entries(u.cost || {})) parts.push(money(amount, currency));
  return parts.join(" · ");
}

export class UsageTotal {
  constructor(node) {
    this.node = node;
    this.timer = null;
  }

  // Asked now, or (while a request is due) once the last ask is REFRESH_MS old.
  refresh() {
    if (this.timer !== null) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.load();
    }, this.loaded ? REFRESH_MS : 0);
  }

  async load() {
    this.loaded = true;
    try {
      const r = await api("GET", "/v1/usage?limit=1");
      const text = usageText(r.total);
      this.node.textContent = text ? `Used: ${text}` : "";
      this.node.title = "What every turn of your threads used, in all";
    } catch {
      this.node.textContent = "";
    }
  }
}
