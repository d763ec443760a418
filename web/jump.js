// A search hit opens its thread at the event it found (docs/api.md §4.22: a hit's `seq`).
// Every block of the conversation says which events it shows (data-seq, the first; data-to,
// the last: transcript.js), so the hit's block is found once the events up to it are in the
// view: the replay of a thread that opened from its first event has passed it, or, for a long
// thread that opened from its history's newest page (history.js), older pages were put on
// top until one reaches back to it. The block is then scrolled to the middle of the view,
// marked, and given the focus, so a keyboard or screen-reader user lands on it too.

const WAIT_MS = 30000; // the replay of a very long thread may take this long to reach a hit
const POLL_MS = 50;

const blocks = (root) => root.querySelectorAll(":scope > [data-seq]");
const span = (node) => [Number(node.dataset.seq), Number(node.dataset.to || node.dataset.seq)];

/** The block of `root` that shows event `seq`: the one that begins there, else the
 * narrowest one whose events reach over it, else the last one before it (an event the
 * conversation has no block for, a status line say, is shown where it happened). */
export function blockAt(root, seq) {
  let around = null;
  let before = null;
  for (const node of blocks(root)) {
    const [from, to] = span(node);
    if (from === seq) return node;
    if (from < seq && seq <= to && (!around || to - from < span(around)[1] - span(around)[0])) around = node;
    if (from < seq && (!before || from >= span(before)[0])) before = node;
  }
  return around || before;
}

function firstSeq(root) {
  const first = root.querySelector(":scope > [data-seq]");
  return first ? Number(first.dataset.seq) : Infinity;
}

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

/**
 * Shows event `seq` of the open thread. `view`: its TranscriptView; `older`: its OlderPages
 * (or null: the view replays from the first event); `shown()`: the newest seq the view has
 * applied; `isCurrent()`: still the open thread. Returns the block, or null (the thread was
 * left, or the event never came).
 */
export async function jumpTo({ view, older, seq, shown, isCurrent }) {
  const until = performance.now() + WAIT_MS;
  while (shown() < seq) {
    if (!isCurrent() || performance.now() > until) return null;
    await sleep(POLL_MS);
  }
  while (older && older.before && firstSeq(view.root) > seq) {
    const before = older.before;
    await older.load();
    if (!isCurrent()) return null;
    if (older.before === before) break; // the page could not be read: show what is there
  }
  if (!isCurrent()) return null;
  view.render(); // every block laid out with its text before one is scrolled to
  const node = blockAt(view.root, seq);
  if (!node) return null;
  for (const old of view.root.querySelectorAll(".jump-target")) old.classList.remove("jump-target");
  if (node.tagName === "DETAILS") node.open = true; // a tool's input or output, a thought
  node.classList.add("jump-target");
  view.pinned = false; // the reader is here now, not at the bottom
  node.scrollIntoView({ block: "center" });
  view.lastTop = view.root.scrollTop;
  if (!node.hasAttribute("tabindex")) node.tabIndex = -1; // focusable by the page alone
  node.focus({ preventScroll: true });
  return node;
}
