"""The pipe between the SQLite store and its writer process (bridge/store/writer.py).

Both ways a message is one frame: a 4-byte big-endian length, then that many bytes.

* daemon → writer: ``(kind, id, ...)`` — ``("b", id, again, items, generation)`` a batch
  of appends (``sqlite_sql.wire_item``), ``("c", id, op, args)`` one of
  ``sqlite_sql.OPS``, ``("s", id)`` the writer's statistics — as ``M`` and a ``marshal``
  of it (a batch's rows are plain tuples of text and numbers: marshal writes them about
  2.5 times as fast as pickle, on the event loop) or, for what marshal cannot write, a
  pickle (:func:`request`, :func:`parse_request`). The writer trusts its parent (it was
  started by it, and exits when the pipe closes).
* writer → daemon: UTF-8 JSON objects, read with :func:`parse_reply`, which checks every
  field: a writer that died mid-write leaves a truncated frame (the daemon sees EOF with
  bytes buffered), and nothing a dying or broken writer sent can make the daemon do more
  than give up on it (``WireError``). ``{"i": id, "r": value}`` a result,
  ``{"i": id, "f": {"2": reason}}`` a committed batch and the appends it refused,
  ``{"i": id, "e": message, "c": code}`` a failure (nothing of it was committed). Id 0 is
  the writer's first word: ready (``"r"``) or why it could not open the database.
"""

from __future__ import annotations

import json
import marshal
import pickle
import struct
from dataclasses import dataclass, field
from typing import Any

MAX_FRAME = 64 * 1024 * 1024  # a reply is at most a few MiB (live_threads); a batch 512 appends
_LEN = struct.Struct(">I")


class WireError(Exception):
    """The other side sent something that is not this protocol: give up on it."""


def frame(*parts: bytes) -> bytes:
    """One frame whose payload is ``parts`` joined (copied once)."""
    return b"".join(frame_parts(*parts))


def frame_parts(*parts: bytes) -> tuple[bytes, ...]:
    """One frame as its length and ``parts``, not joined (for a gathering send)."""
    size = sum(map(len, parts))
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes is over the {MAX_FRAME} limit")
    return (_LEN.pack(size), *parts)


class FrameReader:
    """Bytes in, whole frames out; what is left of a frame stays buffered."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > self._max:
                raise WireError(f"frame of {n} bytes announced, over the {self._max} limit")
            if len(buf) - pos - 4 < n:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        del buf[:pos]
        return out


_MARSHAL = b"M"  # a pickle (protocol 2 and later) starts with 0x80


def request_parts(msg: tuple[Any, ...]) -> tuple[bytes, ...]:
    """A daemon → writer frame in parts: a batch's is a few hundred KiB, sent as it is
    (``socket.sendmsg``) rather than copied into one buffer first."""
    try:
        body = marshal.dumps(msg)
    except ValueError:  # a type marshal does not write (a subclass, say)
        return frame_parts(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
    return frame_parts(_MARSHAL, body)


def parse_request(payload: bytes) -> Any:
    """The writer's side of :func:`request` (its parent's: trusted)."""
    if payload[:1] == _MARSHAL:
        return marshal.loads(memoryview(payload)[1:])  # noqa: S302 (our parent's)
    return pickle.loads(payload)  # noqa: S301 (our parent's)


@dataclass(frozen=True, slots=True)
class Reply:
    id: int
    result: Any = None
    refused: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    code: str | None = None


def _refused(value: Any) -> dict[int, str]:
    if not isinstance(value, dict):
        raise WireError("refusals are not an object")
    out: dict[int, str] = {}
    for k, v in value.items():
        if not (isinstance(k, str) and k.isdigit() and len(k) < 7 and isinstance(v, str)):
            raise WireError("a refusal is not index → reason")
        out[int(k)] = v
    return out


def parse_reply(payload: bytes) -> Reply:
    """One writer → daemon frame, checked field by field (WireError otherwise)."""
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise WireError(f"reply is not JSON: {exc}") from None
    if not isinstance(obj, dict) or not obj.keys() <= {"i", "r", "f", "e", "c"}:
        raise WireError("reply is not an object of known fields")
    rid = obj.get("i")
    if not isinstance(rid, int) or isinstance(rid, bool) or rid < 0:
        raise WireError("reply has no valid id")
    error, code = _error(obj)
    refused = _refused(obj["f"]) if "f" in obj else {}
    return Reply(rid, obj.get("r"), refused, error, code)


def _error(obj: dict[str, Any]) -> tuple[str | None, str | None]:
    error, code = obj.get("e"), obj.get("c")
    if error is not None and not isinstance(error, str):
        raise WireError("error is not text")
    if code is not None and not (isinstance(code, str) and error is not None):
        raise WireError("code without an error")
    if error is not None and ("r" in obj or "f" in obj):
        raise WireError("an error with a result")
    return error, code


def reply(rid: int, **fields: Any) -> bytes:
    """A writer → daemon frame (the writer's side)."""
    return frame(json.dumps({"i": rid, **fields}, separators=(",", ":")).encode())
