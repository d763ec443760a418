"""A thread's compacted history (docs/api.md §4.16): the conversation as a reader sees it,
not as it streamed. PURE: records in, items out; no I/O.

* a streamed message is one item: its deltas merged, replaced by the complete message
  when the agent sends one (the complete text is the agent's own word for it);
* a tool call is one item, joined with its later updates and its result;
* a permission request is one item, with its resolution;
* a prompt, a plan (the latest replaces the one before within a turn) and a turn's end
  are items;
* everything else (stream structure, status lines, diagnostics, process life, tasks,
  notices) is left out: the exact transcript still holds it, from ``after=`` any seq.

Each item carries ``from`` and ``to``: the seqs of the first and last records it covers,
so a client shows the items and continues live from the history's ``last_seq``.

Paging (issue #36): an item never spans a turn start. At each ``turn.started`` the
compaction forgets the tool calls, permissions, plan and streams of the turns before (an
update to an earlier turn's tool call that arrives after the next turn started is an item
of its own), so the items from a turn start on are the same whether the compaction began
at the thread's first event or at that turn start. A page of the history is therefore
built from the last turns only (sessions/history_read.py): each compacted on its own.

A turn longer than ``TURN_WINDOW`` events (an agent that streams for hours, or floods) is
cut the same way every ``TURN_WINDOW`` events from its start: an item that crosses such an
edge shows as two (a message in two parts, a tool result as an item of its own), and a
page never reads more than a window or so of one turn.

A loaded conversation keeps its compaction up to date as it commits (:func:`committed`):
for a thread it created, from its first event, and for one it loaded, from the first
history read on. A commit that does not follow on from what the compaction has seen (it
was read from the store meanwhile, or another replica appended) is left to the next read,
which catches up from the store: the compaction may lag, never skip.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bridge.protocols.events import Record

Item = dict[str, Any]

TURN_WINDOW = 20_000  # events: within one turn, an edge every this many events (see above)


def edge_after(turn_start: int, seq: int) -> int:
    """The first window edge after ``seq`` in the turn that starts at ``turn_start``."""
    return turn_start + ((seq - turn_start) // TURN_WINDOW + 1) * TURN_WINDOW


class Compactor:
    """Fed a thread's records in seq order (possibly over several calls), keeps the items."""

    __slots__ = ("_edge", "_open", "_perms", "_plan", "_tools", "_turn", "items", "last_seq")

    def __init__(self, turn_start: int = 0) -> None:
        """``turn_start``: the seq of the ``turn.started`` the first record fed belongs to
        (0: before any), so that the window edges fall where a whole compaction puts them."""
        self.items: list[Item] = []
        self.last_seq = 0
        self._turn = turn_start
        self._edge = turn_start + TURN_WINDOW
        self._open: dict[str, Item] = {}  # channel → the message being streamed
        self._tools: dict[str, Item] = {}
        self._perms: dict[str, Item] = {}
        self._plan: Item | None = None

    def feed(self, records: Iterable[Record]) -> None:
        opened = self._open
        for rec in records:
            seq = rec.seq
            if seq <= self.last_seq:
                continue  # seen (a page read twice)
            self.last_seq = seq
            if seq >= self._edge:
                self._forget()
                self._edge = edge_after(self._turn, seq)
            kind = rec.kind
            if kind == "message.delta":
                # Most of a stream (issue #22): a delta that goes on the message open on its
                # channel, without a message id, is _delta's last two lines.
                data = rec.data
                if type(data) is dict and type(text := data.get("text")) is str and "message_id" not in data:
                    item = opened.get("thought" if data.get("channel") == "thought" else "text")
                    if item is not None:
                        item["_parts"].append(text)
                        item["to"] = seq
                        continue
            handler = _HANDLERS.get(kind)
            if handler is not None and isinstance(data := rec.data, dict):
                handler(self, rec, data)

    def _item(self, rec: Record, **fields: Any) -> Item:
        item: Item = {"from": rec.seq, "to": rec.seq, **fields}
        self.items.append(item)
        return item

    # -------------------------------------------------------------- messages

    def _delta(self, rec: Record, data: dict[str, Any]) -> None:
        text = data.get("text")
        if not isinstance(text, str):
            return
        channel = "thought" if data.get("channel") == "thought" else "text"
        item = self._open.get(channel)
        message_id = data.get("message_id")
        if item is None or (message_id is not None and item.get("message_id") not in (None, message_id)):
            item = self._item(rec, type="message", role="assistant", text="", channel=channel)
            if message_id is not None:
                item["message_id"] = message_id
            item["_parts"] = []
            self._open[channel] = item
        item["_parts"].append(text)
        item["to"] = rec.seq

    def _message(self, rec: Record, data: dict[str, Any]) -> None:
        raw_text = data.get("text")
        text = raw_text if isinstance(raw_text, str) else ""
        if rec.source == "client" or data.get("role") == "user":
            self._user(rec, data, text)
            return
        channel = "thought" if data.get("channel") == "thought" else "text"
        item = self._open.pop(channel, None)
        if item is None:
            role = data.get("role")
            item = self._item(rec, type="message", role=role if isinstance(role, str) else "assistant", channel=channel)
        item.pop("_parts", None)
        item["text"], item["to"] = text, rec.seq
        for key in ("message_id", "error"):
            if data.get(key) is not None:
                item[key] = data[key]

    def _user(self, rec: Record, data: dict[str, Any], text: str) -> None:
        self._close_open()
        item = self._item(rec, type="message", role="user", text=text)
        for key in ("turn_id", "client_id", "content", "origin"):
            if data.get(key) is not None:
                item[key] = data[key]
        if rec.source != "client":
            item["by_agent"] = True  # the CLI's own user-role line, not the user speaking

    def _close_open(self) -> None:
        for item in self._open.values():
            item["text"] = "".join(item.pop("_parts", ()))
        self._open.clear()

    # -------------------------------------------------------------- tools, permissions, plans

    def _tool_call(self, rec: Record, data: dict[str, Any]) -> None:
        tid = data.get("tool_call_id")
        item = self._tools.get(tid) if isinstance(tid, str) else None
        if item is None:
            item = self._item(rec, type="tool", tool_call_id=tid, status="pending")
            if isinstance(tid, str):
                self._tools[tid] = item
        for key in ("name", "input", "title", "kind", "status", "content", "locations", "parent_tool_use_id"):
            if data.get(key) is not None:
                item[key] = data[key]
        item["to"] = rec.seq

    def _tool_result(self, rec: Record, data: dict[str, Any]) -> None:
        tid = data.get("tool_call_id")
        item = self._tools.get(tid) if isinstance(tid, str) else None
        if item is None:
            item = self._item(rec, type="tool", tool_call_id=tid)
        item["output"] = data.get("output")
        item["is_error"] = data.get("is_error") is True
        item["status"] = "failed" if item["is_error"] else "completed"
        item["to"] = rec.seq

    def _permission(self, rec: Record, data: dict[str, Any]) -> None:
        rid = data.get("request_id")
        item = self._item(rec, type="permission", request_id=rid, tool=data.get("tool"), input=data.get("input"))
        if data.get("tool_call_id") is not None:
            item["tool_call_id"] = data["tool_call_id"]
        if isinstance(rid, str):
            self._perms[rid] = item

    def _resolved(self, rec: Record, data: dict[str, Any]) -> None:
        rid = data.get("request_id")
        item = self._perms.pop(rid, None) if isinstance(rid, str) else None
        if item is not None:
            item["decision"], item["by"], item["to"] = data.get("decision"), data.get("by"), rec.seq

    def _plan_update(self, rec: Record, data: dict[str, Any]) -> None:
        if self._plan is not None:
            self._plan["entries"], self._plan["to"] = data.get("entries"), rec.seq
            return
        self._plan = self._item(rec, type="plan", entries=data.get("entries"))

    def _turn_started(self, rec: Record, _data: dict[str, Any]) -> None:
        # A page boundary (see the module's doc): nothing before it is joined with after.
        self._turn, self._edge = rec.seq, rec.seq + TURN_WINDOW
        self._forget()

    def _forget(self) -> None:
        self._close_open()
        self._tools.clear()
        self._perms.clear()
        self._plan = None

    def _turn_ended(self, rec: Record, data: dict[str, Any]) -> None:
        self._close_open()
        self._plan = None
        item = self._item(rec, type="turn", turn_id=data.get("turn_id"), status=data.get("status"))
        for key in ("reason", "error", "usage"):
            if data.get(key) is not None:
                item[key] = data[key]

    def snapshot(self, start: int = 0, stop: int | None = None) -> list[Item]:
        """The items as they stand (a message still streaming has its text so far): copies,
        so that later records, fed while the answer is written, do not change them.
        ``start``/``stop``: a slice of them (only those are copied)."""
        return [
            {**{k: v for k, v in item.items() if k != "_parts"}, "text": "".join(item["_parts"])}
            if "_parts" in item
            else dict(item)
            for item in self.items[start:stop]
        ]


def older_than(items: list[Item], before: int | None) -> int:
    """How many of ``items`` (in ``from`` order, as a compaction makes them) begin before
    seq ``before`` (all of them when None)."""
    if before is None:
        return len(items)
    lo, hi = 0, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid]["from"] < before:
            lo = mid + 1
        else:
            hi = mid
    return lo


def committed(comp: Compactor, records: list[Record], keep_items: int) -> Compactor | None:
    """``records`` were just committed: fed to ``comp`` when they follow on from what it
    has seen (else it is left to catch up from the store); None once it holds more than
    ``keep_items`` items (too large to keep: rebuilt per request)."""
    if records and records[0].seq == comp.last_seq + 1:
        comp.feed(records)
        if len(comp.items) > keep_items:
            return None
    return comp


_HANDLERS = {
    "message.delta": Compactor._delta,
    "message": Compactor._message,
    "tool.call": Compactor._tool_call,
    "tool.result": Compactor._tool_result,
    "permission.requested": Compactor._permission,
    "permission.resolved": Compactor._resolved,
    "plan": Compactor._plan_update,
    "turn.started": Compactor._turn_started,
    "turn.ended": Compactor._turn_ended,
}
