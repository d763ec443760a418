// Keyboard shortcuts of the page (the list behind "?"). Single keys act only when the focus
// is not in a field, so typing is never taken for a shortcut.

export const SHORTCUTS = [
  ["?", "Show this list"],
  ["n", "New thread"],
  ["/", "Search the threads"],
  ["j / k", "Next / previous thread"],
  ["i", "Go to the message box"],
  ["Enter", "Send (Shift+Enter: a new line)"],
  ["↑", "In an empty message box: the last prompt again"],
  ["/ in the message box", "The agent's slash commands"],
  ["Esc", "Interrupt the agent's turn; close a dialog or panel"],
];

const typing = (t) => t instanceof HTMLElement && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));

/** Calls actions[name] for a shortcut key; returns whether it did. */
export function shortcut(e, actions) {
  if (e.ctrlKey || e.metaKey || e.altKey || e.isComposing || typing(e.target)) return false;
  if (document.querySelector("dialog[open]")) return false;
  const name = { "?": "help", n: "newThread", "/": "search", j: "next", k: "previous", i: "compose" }[e.key];
  if (!name || !actions[name]) return false;
  e.preventDefault();
  actions[name]();
  return true;
}
