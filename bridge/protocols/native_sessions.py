"""Sessions an agent CLI keeps itself (issue #17 item 4), read from its own files: PURE.

Which store a profile's agent keeps (:func:`store_of`), where a directory's sessions lie in
it (:func:`claude_project_dir`, :func:`qwen_project_dir`), and what one session file says
about itself (:func:`claude_title`, :func:`qwen_title`) from the bounded ``head`` and
``tail`` bytes the caller read (sessions/native.py does the I/O). Also the listing's
order and cursor (:func:`page`). The formats, as the CLIs write them (docs/agents.md):

* Claude Code: ``$CLAUDE_CONFIG_DIR`` or ``$HOME/.claude``, then
  ``projects/<cwd encoded>/<session id>.jsonl``; the cwd (its real path) with every UTF-16
  code unit that is not an ASCII letter or digit replaced by ``-``, and past 200
  characters the first 200, ``-`` and a base-36 hash of the path. A title is the last
  ``custom-title`` (``customTitle``) or ``ai-title`` (``aiTitle``) line; else the first
  user prompt that is not a tool result, meta line, compaction summary or command.
* Qwen Code: ``$QWEN_RUNTIME_DIR``, ``$QWEN_HOME`` or ``$HOME/.qwen``, then
  ``projects/<cwd encoded>/chats/<session id>.jsonl`` (the same encoding, never hashed);
  a title is the last ``system``/``custom_title`` line's ``systemPayload.customTitle``,
  else the first ``user`` line's ``systemPayload.displayText`` or ``message.parts`` text.

Every byte here is untrusted: a line that does not parse is skipped, a title is bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bridge.protocols.stream_json import stream_json_cli

CLAUDE = "claude-code"
QWEN = "qwen-code"
ACP = "acp"

HEAD_BYTES = 64 * 1024  # the CLIs' own listings read the same windows (64 KiB)
TAIL_BYTES = 64 * 1024
MAX_TITLE = 200  # code points; longer titles end in "…"
_CLAUDE_DIR_MAX = 200
# Claude Code's own filter for prompts that are not what the user typed: a leading tag
# (<command-name>, <system-reminder>, …) or its interruption marker.
_NOT_A_PROMPT = re.compile(r"^(?:\s*<[a-z][\w-]*[\s>]|\[Request interrupted by user[^\]]*\])")


@dataclass(frozen=True, slots=True)
class NativeSession:
    id: str
    title: str | None
    last_activity: str | None
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "last_activity": self.last_activity, "source": self.source}


def store_of(protocol: str, executable: str, args: Sequence[str] = ()) -> str | None:
    """The session store a profile's agent keeps: its files (Claude Code, Qwen Code in
    stream-json), ACP ``session/list``, or None (unknown to the bridge)."""
    if protocol == "acp":
        return ACP
    if protocol != "stream-json":
        return None
    return {"claude": CLAUDE, "qwen": QWEN}.get(stream_json_cli(executable, args) or "")


def _js_hash(text: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit integer."""
    units = text.encode("utf-16-le", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (h * 31 + int.from_bytes(units[i : i + 2], "little")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def _dashed(cwd: str) -> str:
    # Per UTF-16 code unit, as the CLIs' JavaScript replace() sees the string.
    units = cwd.encode("utf-16-le", "surrogatepass")
    out = []
    for i in range(0, len(units), 2):
        u = int.from_bytes(units[i : i + 2], "little")
        out.append(chr(u) if u < 128 and chr(u).isalnum() else "-")
    return "".join(out)


def claude_project_dir(cwd: str) -> str:
    """The directory name Claude Code keeps ``cwd``'s sessions under."""
    name = _dashed(cwd)
    if len(name) <= _CLAUDE_DIR_MAX:
        return name
    return f"{name[:_CLAUDE_DIR_MAX]}-{_base36(abs(_js_hash(cwd)))}"


def qwen_project_dir(cwd: str) -> str:
    """The directory name Qwen Code keeps ``cwd``'s sessions under (``…/chats``)."""
    return _dashed(cwd)


def iso_from_ns(mtime_ns: int) -> str:
    dt = datetime.fromtimestamp(mtime_ns // 1_000_000_000, UTC)
    return f"{dt.strftime('%Y-%m-%dT%H:%M:%S')}.{(mtime_ns // 1_000_000) % 1000:03d}Z"


def bounded_title(value: Any) -> str | None:
    """One line of at most :data:`MAX_TITLE` code points, or None."""
    text = " ".join(value.split()) if isinstance(value, str) else ""
    if not text:
        return None
    return text if len(text) <= MAX_TITLE else text[:MAX_TITLE] + "…"


def _lines(head: bytes, tail: bytes, tail_is_whole: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The JSON objects on the complete lines of each window. A tail window that does not
    start the file starts one byte early, so it holds its first line whole only after a
    newline; a head window is whole up to its last newline."""
    if not head.endswith(b"\n"):
        head = head[: head.rfind(b"\n") + 1]
    if not tail_is_whole:
        tail = tail[tail.find(b"\n") + 1 :] if b"\n" in tail else b""
    return _objects(head), _objects(tail)


def _objects(chunk: bytes) -> list[dict[str, Any]]:
    out = []
    for part in chunk.split(b"\n"):
        try:
            obj = json.loads(part)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _texts(blocks: Any) -> list[str]:
    return [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]


def _claude_texts(content: Any) -> list[str]:
    """A user line's texts; none when it carries a tool result (not something typed)."""
    if isinstance(content, str):
        return [content]
    blocks = content if isinstance(content, list) else []
    return [] if any(_d(b).get("type") == "tool_result" for b in blocks) else _texts(blocks)


def _claude_prompt(obj: dict[str, Any]) -> str | None:
    if obj.get("type") != "user" or any(obj.get(k) for k in ("isMeta", "isCompactSummary")):
        return None
    texts = _claude_texts(_d(obj.get("message")).get("content"))
    return next((t for t in texts if t.strip() and not _NOT_A_PROMPT.match(t)), None)


def claude_title(head: bytes, tail: bytes, *, tail_is_whole: bool = False) -> str | None:
    """A Claude Code session's title: its newest custom or AI title, else its first prompt.
    ``tail_is_whole``: the tail window starts at the file's first byte (else one byte
    before the last :data:`TAIL_BYTES`)."""
    first, last = _lines(head, tail, tail_is_whole)
    for key, field in (("custom-title", "customTitle"), ("ai-title", "aiTitle")):
        for obj in reversed([*first, *last]):
            if obj.get("type") == key and (title := bounded_title(obj.get(field))):
                return title
    for obj in first:
        if (prompt := _claude_prompt(obj)) is not None:
            return bounded_title(prompt)
    return None


def _qwen_prompt(obj: dict[str, Any]) -> str | None:
    if obj.get("type") != "user" or "subtype" in obj:
        return None
    shown = _d(obj.get("systemPayload")).get("displayText")
    if isinstance(shown, str):
        return shown or None
    parts = _d(obj.get("message")).get("parts")
    return "".join(_texts(parts if isinstance(parts, list) else [])) or None


def qwen_title(head: bytes, tail: bytes, *, tail_is_whole: bool = False) -> str | None:
    """A Qwen Code session's title: its newest custom title, else its first prompt."""
    first, last = _lines(head, tail, tail_is_whole)
    for obj in reversed([*first, *last]):
        if obj.get("type") == "system" and obj.get("subtype") == "custom_title":
            if title := bounded_title(_d(obj.get("systemPayload")).get("customTitle")):
                return title
    for obj in first:
        if (prompt := _qwen_prompt(obj)) is not None:
            return bounded_title(prompt)
    return None


# ------------------------------------------------------------------ order and cursor


class BadCursor(ValueError):
    """A cursor this listing never gave out."""


def file_cursor(mtime_ns: int, sid: str) -> str:
    return f"t{mtime_ns}/{sid}"


def parse_file_cursor(cursor: str) -> tuple[int, str]:
    stamp, sep, sid = cursor[1:].partition("/")
    if not cursor.startswith("t") or not sep or not stamp.isascii() or not stamp.isdigit() or len(stamp) > 20:
        raise BadCursor("not a cursor of this listing")
    return int(stamp), sid


def page(files: Sequence[tuple[int, str]], limit: int, cursor: str | None) -> tuple[list[tuple[int, str]], str | None]:
    """``files`` (mtime_ns, id) newest first (ties by id), the page after ``cursor``, and
    the cursor of the next page (None on the last). Stable: a file that changes between
    pages moves, the others keep their places."""
    ordered = sorted(files, key=lambda f: (-f[0], f[1]))
    if cursor is not None:
        after = parse_file_cursor(cursor)
        key = (-after[0], after[1])
        ordered = [f for f in ordered if (-f[0], f[1]) > key]
    chosen = ordered[:limit]
    more = len(ordered) > limit
    return chosen, (file_cursor(*chosen[-1]) if more and chosen else None)


def acp_cursor(agent_cursor: str | None, skip: int) -> str:
    """Our cursor over an ACP agent's pages: how many of the page at ``agent_cursor``
    were already shown, then the agent's own cursor (opaque)."""
    return f"a{skip}/{agent_cursor or ''}"


def parse_acp_cursor(cursor: str) -> tuple[str | None, int]:
    skip, sep, agent = cursor[1:].partition("/")
    if not cursor.startswith("a") or not sep or not skip.isascii() or not skip.isdigit() or len(skip) > 6:
        raise BadCursor("not a cursor of this listing")
    return agent or None, int(skip)


__all__ = [
    "ACP",
    "CLAUDE",
    "HEAD_BYTES",
    "MAX_TITLE",
    "QWEN",
    "TAIL_BYTES",
    "BadCursor",
    "NativeSession",
    "acp_cursor",
    "bounded_title",
    "claude_project_dir",
    "claude_title",
    "file_cursor",
    "iso_from_ns",
    "page",
    "parse_acp_cursor",
    "parse_file_cursor",
    "qwen_project_dir",
    "qwen_title",
    "store_of",
]
