"""The Markdown export (bridge/sessions/export.py, docs/api.md §4.23): fed a transcript in
pages of any size, it writes the same document as the whole compacted history rendered at
once, holds no more than one turn's (or window's) items, and keeps tool text inside its
fences."""

from __future__ import annotations

from typing import Any

from bridge.protocols.events import Record
from bridge.sessions import history
from bridge.sessions.export import MAX_BLOCK, MarkdownExport, render

TS = "2026-12-01T00:00:00.000Z"


def ev(seq: int, kind: str, source: str = "agent", **data: Any) -> Record:
    return Record(seq, TS, source, kind, data, None, False)


def transcript(turns: int, deltas: int) -> list[Record]:
    out: list[Record] = []
    seq = 1
    for t in range(turns):
        out.append(ev(seq, "message", "client", role="user", text=f"prompt {t}", turn_id=f"t{t}"))
        out.append(ev(seq + 1, "turn.started", "bridge", turn_id=f"t{t}", prompt_seq=seq))
        out.append(ev(seq + 2, "tool.call", tool_call_id=f"c{t}", name="Bash", input={"command": "echo ```"}))
        out.append(ev(seq + 3, "tool.result", tool_call_id=f"c{t}", output="x" * (MAX_BLOCK + 10), is_error=False))
        seq += 4
        for i in range(deltas):
            out.append(ev(seq, "message.delta", text=f"{i} ", channel="text"))
            seq += 1
        out.append(ev(seq, "turn.ended", turn_id=f"t{t}", status="success"))
        seq += 1
    return out


def whole(records: list[Record]) -> str:
    comp = history.Compactor()
    comp.feed(records)
    return "".join(render({**item, "_ts": TS}) for item in comp.snapshot())  # (every event at TS)


def test_pages_make_the_same_document_and_hold_one_turn_at_most() -> None:
    records = transcript(turns=5, deltas=30)
    for page in (1, 7, 1000):
        doc = MarkdownExport()
        parts: list[str] = []
        held = 0
        for at in range(0, len(records), page):
            parts.append(doc.feed(records[at : at + page]))
            held = max(held, len(doc._comp.items))
        parts.append(doc.finish())
        text = "".join(parts)
        assert text == whole(records)
        assert held <= 4, held  # a prompt, a tool, an answer, a turn end
    assert text.count("## User") == 5 and text.count("*Turn ended: success*") == 5
    assert "0 1 2 3" in text and "more characters: see the JSONL export" in text
    assert "````json\n{\n" in text  # a fence longer than the ``` inside


def test_a_flood_in_one_turn_is_let_go_at_each_window_edge(monkeypatch: Any) -> None:
    monkeypatch.setattr(history, "TURN_WINDOW", 50)
    monkeypatch.setattr("bridge.sessions.export.TURN_WINDOW", 50)
    records = [ev(1, "message", "client", role="user", text="go"), ev(2, "turn.started", "bridge", turn_id="t")]
    records += [ev(s, "tool.call", tool_call_id=f"c{s}", name="Read", input={"n": s}) for s in range(3, 400)]
    doc = MarkdownExport()
    held = 0
    text = ""
    for r in records:
        text += doc.feed([r])
        held = max(held, len(doc._comp.items))
    text += doc.finish()
    assert held <= 51 and text.count("### Tool: Read") == 397
