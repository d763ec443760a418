"""The wire envelope of transcript events: the events-mode frame, built from a record or
joined straight from stored rows, and the ephemeral frames sent to one client only
(docs/api.md §6.1)."""

from __future__ import annotations

import json
import re
from typing import Any

from bridge.protocols.jsonline import dumps

_SAFE_TS = re.compile(r"[0-9A-Za-z:.+-]*")
_JSON_STR: dict[str, str] = {}  # source and kind names, already as JSON strings


def _json_str(value: str) -> str:
    out = _JSON_STR.get(value)
    if out is None:
        out = json.dumps(value)
        if len(_JSON_STR) < 1024:  # kinds are a small set; never let agent input grow this
            _JSON_STR[value] = out
    return out


def record_envelope(seq: int, ts: str, source: str, kind: str, data_json: str, raw: str | None) -> str:
    """The events-mode frame of one record. ``raw`` is the exact line the agent wrote,
    embedded as-is (it is already one JSON object), never re-serialised."""
    tsj = f'"{ts}"' if _SAFE_TS.fullmatch(ts) else json.dumps(ts)
    return (
        f'{{"seq":{seq},"ts":{tsj},"source":{_json_str(source)},'
        f'"kind":{_json_str(kind)},"data":{data_json},'
        f'"raw":{raw if raw is not None else "null"}}}'
    )


class Frames:
    """A page of the transcript as ready-to-send frame payloads (a replay, issue #8).

    ``count`` rows were read, the last of them ``last`` (the ``after`` of the read when
    none); ``texts`` holds their frames as UTF-8: every envelope in events mode, the
    relayed agent lines in raw mode (so it may be shorter than ``count``). No
    :class:`Record` is built for a replayed row and no text is decoded: the frames are
    joined straight from the stored bytes."""

    __slots__ = ("count", "last", "texts")

    def __init__(self, texts: list[bytes], count: int, last: int) -> None:
        self.texts = texts
        self.count = count
        self.last = last


_SAFE_TS_BYTES = re.compile(rb"[0-9A-Za-z:.+-]*")
_JSON_BYTES: dict[bytes, bytes] = {}  # source and kind names as JSON strings, UTF-8


def _json_bytes(value: bytes) -> bytes:
    out = _JSON_BYTES.get(value)
    if out is None:
        out = _json_str(value.decode()).encode()
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


def ephemeral(kind: str, ts: str, **data: Any) -> str:
    """A bridge frame for one client only (``client.accepted``/``client.rejected``): it is
    not part of the transcript, so its ``seq`` is null."""
    return dumps({"seq": None, "ts": ts, "source": "bridge", "kind": kind, "data": data, "raw": None})
