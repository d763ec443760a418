"""A thread as a readable Markdown document (docs/api.md §4.23). PURE: records in, text
out; the route (bridge/api/export.py) reads the transcript page by page and sends each
piece as it is made, so a thread of any length is never held whole.

The document is the compacted history's items (sessions/history.py) rendered in order:
prompts, answers (a thinking block as a quote), tool calls with their input and output,
permission requests with their decision, plans, and each turn's end. The compaction
is fed one record at a time; an item is final once the compaction has forgotten it (at
a ``turn.started`` or a window edge, history.TURN_WINDOW), and is rendered then, so
what is held is at most one turn (or window) of items.

Text from the agent or the user is written as it is (it is usually Markdown already);
tool input and output go in code fences longer than any run of backticks inside them, so
nothing in them can close the fence. A block longer than ``MAX_BLOCK`` characters is cut
with a note (the JSONL export has every byte).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from bridge.protocols.events import Record
from bridge.sessions.history import TURN_WINDOW, Compactor, Item, edge_after

MAX_BLOCK = 64 * 1024  # characters of one text, input or output in the document
_TICKS = re.compile(r"`{3,}")


def _cut(text: str) -> str:
    if len(text) <= MAX_BLOCK:
        return text
    return text[:MAX_BLOCK] + f"\n… ({len(text) - MAX_BLOCK} more characters: see the JSONL export)"


def _fence(value: Any, lang: str = "") -> str:
    """A code block holding ``value`` (text as it is, anything else as indented JSON)."""
    if isinstance(value, str):
        text = value
    else:
        text, lang = json.dumps(value, indent=2, ensure_ascii=False), lang or "json"
    text = _cut(text)
    longest = max((len(m) for m in _TICKS.findall(text)), default=2)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}\n"


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in _cut(text).splitlines()) + "\n"


def _when(item: Item) -> str:
    ts = item.get("_ts")
    return f" · {ts}" if isinstance(ts, str) else ""


def _message(item: Item) -> str:
    raw = item.get("text")
    text = raw if isinstance(raw, str) else ""
    if item.get("role") == "user":
        who = "Agent's own user line" if item.get("by_agent") else "User"
        return f"## {who}{_when(item)}\n\n{_cut(text)}\n"
    if item.get("channel") == "thought":
        return f"#### Thinking\n\n{_quote(text)}"
    error = f"\n\n**Error:** {item['error']}" if item.get("error") else ""
    return f"## Assistant{_when(item)}\n\n{_cut(text)}{error}\n"


def _tool(item: Item) -> str:
    name = item.get("name") or item.get("title") or "tool"
    title = f" — {item['title']}" if item.get("title") and item.get("title") != name else ""
    out = [f"### Tool: {name}{title} ({item.get('status') or 'pending'})\n"]
    if item.get("input") is not None:
        out.append("Input:\n\n" + _fence(item["input"]))
    if "output" in item:
        label = "Error output" if item.get("is_error") else "Output"
        out.append(f"{label}:\n\n" + _fence(item["output"] if item["output"] is not None else ""))
    return "\n".join(out)


def _permission(item: Item) -> str:
    decision = item.get("decision") or "no answer"
    by = f" (by {item['by']})" if item.get("by") else ""
    text = f"### Permission asked: {item.get('tool') or 'tool'} — {decision}{by}\n"
    if item.get("input") is not None:
        text += "\n" + _fence(item["input"])
    return text


def _plan(item: Item) -> str:
    lines = ["### Plan\n"]
    for entry in item.get("entries") or []:
        if isinstance(entry, dict):
            done = "x" if entry.get("status") == "completed" else " "
            lines.append(f"- [{done}] {entry.get('content', '')}")
    return "\n".join(lines) + "\n"


def _turn(item: Item) -> str:
    status = item.get("status") or "ended"
    reason = f", {item['reason']}" if item.get("reason") else ""
    error = f": {item['error']}" if item.get("error") else ""
    return f"*Turn ended: {status}{reason}{error}*\n\n---\n"


_RENDER = {"message": _message, "tool": _tool, "permission": _permission, "plan": _plan, "turn": _turn}


def render(item: Item) -> str:
    fn = _RENDER.get(str(item.get("type")))
    return fn(item) + "\n" if fn is not None else ""


def header(thread: dict[str, Any]) -> str:
    """The document's title and what thread it is."""
    title = thread.get("title") or "Untitled thread"
    facts = [f"thread `{thread.get('id')}`", f"agent `{thread.get('agent')}`"]
    if thread.get("model"):
        facts.append(f"model `{thread['model']}`")
    facts.append(f"created {thread.get('created_at')}")
    return f"# {title}\n\n{' · '.join(facts)}\n\n---\n\n"


class MarkdownExport:
    """Fed a thread's records in seq order; gives back the document's pieces as the items
    they hold become final."""

    def __init__(self) -> None:
        self._comp = Compactor()
        self._edge = TURN_WINDOW
        self._turn = 0

    def feed(self, records: Iterable[Record]) -> str:
        out: list[str] = []
        comp = self._comp
        for rec in records:
            before = len(comp.items)
            crossing = rec.kind == "turn.started" or rec.seq >= self._edge
            comp.feed((rec,))
            for item in comp.items[before:]:
                item["_ts"] = rec.ts
            if rec.kind == "turn.started":
                self._turn = rec.seq
                self._edge = rec.seq + TURN_WINDOW
            elif rec.seq >= self._edge:
                self._edge = edge_after(self._turn, rec.seq)
            if crossing and before:
                # The compaction forgot these items (and closed their streams): final.
                out += map(render, comp.items[:before])
                del comp.items[:before]
        return "".join(out)

    def finish(self) -> str:
        """What is left once the last record was fed (a message still streaming with its
        text so far)."""
        items = self._comp.snapshot()
        self._comp.items.clear()
        return "".join(map(render, items))
