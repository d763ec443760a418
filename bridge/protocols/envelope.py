"""The wire envelope of transcript events: the events-mode frame, built from a record or
joined straight from stored rows, and the ephemeral frames sent to one client only
(docs/api.md §6.1)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from itertools import repeat
from typing import TYPE_CHECKING, Any

from bridge.protocols.jsonline import dumps

if TYPE_CHECKING:
    from bridge.protocols.events import Record

_SAFE_TS = re.compile(r"[0-9A-Za-z:.+-]*")
_JSON_STR: dict[str, str] = {}  # source and kind names, already as JSON strings


def json_name(value: str) -> str:
    """A source or kind name as JSON text (ASCII), cached."""
    out = _JSON_STR.get(value)
    if out is None:
        out = json.dumps(value)
        if len(_JSON_STR) < 1024:  # kinds are a small set; never let agent input grow this
            _JSON_STR[value] = out
    return out


def json_ts(ts: str) -> str:
    """A record's ``ts`` as JSON text (ASCII)."""
    return f'"{ts}"' if _SAFE_TS.fullmatch(ts) else json.dumps(ts)


def record_envelope(seq: int, ts: str, source: str, kind: str, data_json: str, raw: str | None) -> str:
    """The events-mode frame of one record. ``raw`` is the exact line the agent wrote,
    embedded as-is (it is already one JSON object), never re-serialised."""
    return (
        f'{{"seq":{seq},"ts":{json_ts(ts)},"source":{json_name(source)},'
        f'"kind":{json_name(kind)},"data":{data_json},'
        f'"raw":{raw if raw is not None else "null"}}}'
    )


class Frames:
    """A page of the transcript as ready-to-send frame payloads (a replay, issue #8).

    ``count`` rows were read, the last of them ``last`` (the ``after`` of the read when
    none); ``texts`` holds their frames as UTF-8: every envelope in events mode, the
    relayed agent lines in raw mode (so it may be shorter than ``count``). No
    :class:`Record` is built for a replayed row and no text is decoded: the frames are
    joined straight from the stored bytes. ``more`` as for :class:`Page`."""

    __slots__ = ("count", "last", "more", "texts")

    def __init__(self, texts: list[bytes], count: int, last: int, *, more: bool) -> None:
        self.texts = texts
        self.count = count
        self.last = last
        self.more = more


class Page(list["Record"]):
    """A page of the transcript's records, as a store reads it.

    ``more``: the read stopped at one of its bounds (the count asked for, or the store's
    byte bound), so events may follow it: read on after its last. False only when the
    read found the end of the transcript. A page shorter than the count asked for is not
    the end by itself: a page also stops at a few MiB (issue #34: a replay that took a
    short page for the end stopped after the first 8 MiB prompt)."""

    __slots__ = ("more",)

    def __init__(self, records: Iterable[Record] = (), *, more: bool = False) -> None:
        super().__init__(records)
        self.more = more


_SAFE_TS_BYTES = re.compile(rb"[0-9A-Za-z:.+-]*")
_JSON_BYTES: dict[bytes, bytes] = {}  # source and kind names as JSON strings, UTF-8


def _json_bytes(value: bytes) -> bytes:
    out = _JSON_BYTES.get(value)
    if out is None:
        out = json_name(value.decode()).encode()
        if len(_JSON_BYTES) < 1024:  # kinds are a small set; never let agent input grow this
            _JSON_BYTES[value] = out
    return out


def stored_envelopes(rows: list[tuple[int, bytes, bytes, bytes, bytes, bytes | None]]) -> list[bytes]:
    """The events-mode frames of stored rows ``(seq, ts, source, kind, data_json, raw)``
    read as UTF-8 bytes, byte-identical to :meth:`Record.envelope` of the same records,
    encoded (tests/sessions/test_replay_envelope.py)."""
    safe = _SAFE_TS_BYTES.fullmatch
    js = _JSON_BYTES
    out: list[bytes] = []
    append = out.append
    for seq, ts, source, kind, data, raw in rows:
        src = js.get(source) or _json_bytes(source)
        knd = js.get(kind) or _json_bytes(kind)
        tsj = b'"%b"' % ts if safe(ts) else json.dumps(ts.decode()).encode()
        append(
            b'{"seq":%d,"ts":%b,"source":%b,"kind":%b,"data":%b,"raw":%b}'
            % (seq, tsj, src, knd, data, raw if raw is not None else b"null")
        )
    return out


# The stored form of an event (issue #22): its events-mode envelope as UTF-8 bytes, exactly
# what a client is sent for it, and two byte offsets into it, so that ``data`` and ``raw``
# are not stored a second time: ``data`` is ``env[data_at:end]`` where ``end`` is ``raw_at
# - len(RAW_KEY)`` (``len(env) - len(NO_RAW)`` when ``raw_at`` is None), ``raw`` is
# ``env[raw_at:-1]`` (None when ``raw_at`` is None).
RAW_KEY = b',"raw":'
NO_RAW = b',"raw":null}'


def stored_envelope(envelope: str, data_json: str, raw: str | None) -> tuple[bytes, int, int | None]:
    """``(env, data_at, raw_at)`` of an event whose envelope (:func:`record_envelope`) is
    ``envelope``. The head before ``data`` is ASCII (its text is JSON-escaped with
    ``ensure_ascii``), so its length in characters is its length in bytes."""
    env = envelope.encode()
    ascii_only = len(env) == len(envelope)
    data_len = len(data_json) if ascii_only else len(data_json.encode())
    if raw is None:
        return env, len(env) - len(NO_RAW) - data_len, None
    raw_at = len(env) - 1 - (len(raw) if ascii_only else len(raw.encode()))
    return env, raw_at - len(RAW_KEY) - data_len, raw_at


class CorruptEvent(ValueError):
    """A stored envelope that is not one for its row (written by another replica, or
    damaged): it is never sent to a client."""

    def __init__(self, seq: int) -> None:
        super().__init__(f"stored event {seq} is not a well-formed envelope for seq {seq}")
        self.seq = seq


_SEQ_PREFIX = b'{"seq":%d,'


def checked_envelopes(rows: list[tuple[int, bytes]]) -> list[bytes]:
    """The stored envelopes of rows ``(seq, env)``, each checked before it can reach a
    client: it starts with ``{"seq":<its seq>,``, ends with ``}`` and holds no newline
    (with ``coalesce=1`` a frame is one NDJSON line). :class:`CorruptEvent` otherwise.
    The three checks iterate in C (``map``: half the cost of a Python loop over the rows;
    the newline by memchr, one row at a time: counting over the joined page was slower)."""
    if not rows:
        return []
    seqs, envs = zip(*rows, strict=True)
    if (
        all(map(bytes.startswith, envs, map(_SEQ_PREFIX.__mod__, seqs)))
        and all(map(bytes.endswith, envs, repeat(b"}")))
        and not any(map(bytes.__contains__, envs, repeat(b"\n")))
    ):
        return list(envs)
    for seq, env in rows:  # which one (a corrupt row: rare)
        if not env.startswith(_SEQ_PREFIX % seq) or not env.endswith(b"}") or b"\n" in env:
            raise CorruptEvent(seq)
    raise AssertionError("unreachable")  # pragma: no cover


def checked_lines(rows: list[tuple[int, bytes | None]]) -> list[bytes]:
    """Raw mode's relayed agent lines of rows ``(seq, line or None)``: the lines, each
    checked to hold no newline (:class:`CorruptEvent` otherwise)."""
    out = [line for _, line in rows if line is not None]
    for line in out:
        if b"\n" in line:
            raise CorruptEvent(next(seq for seq, text in rows if text is line))
    return out


def ephemeral(kind: str, ts: str, **data: Any) -> str:
    """A bridge frame for one client only (``client.accepted``/``client.rejected``): it is
    not part of the transcript, so its ``seq`` is null."""
    return dumps({"seq": None, "ts": ts, "source": "bridge", "kind": kind, "data": data, "raw": None})
