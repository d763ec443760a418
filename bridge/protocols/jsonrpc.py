"""JSON-RPC 2.0, written once: what a message is, which ids are ids, the requests waiting
for an answer, the error codes, and the four envelopes.

Every place the bridge speaks JSON-RPC — the ACP client codec and session lister (the
bridge as a client of an agent), the ACP gateway (the bridge as an agent), the stdio relay
in front of the gateway — goes through this module, so the rules cannot drift between them
again. Sans-I/O: values in, values out; serialising a message is the caller's (each writes
JSON its own way: one line on a pipe, one frame on a socket).

Strict where JSON-RPC 2.0 is strict about the *envelope*: ``"jsonrpc": "2.0"``; an id is a
string or an integer, never a boolean, a float or null (null only in an error answering a
message whose id could not be read); a response carries exactly one of ``result`` and
``error``, and an error is an object with an integer ``code`` and a string ``message``.
A batch (a JSON array) is not a message here: no peer of ours sends one, so it is refused
as an invalid request. ``params`` is handed over as it came: its shape is the method's
business (ACP wants an object; the gateway answers anything else "invalid params").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeGuard, TypeVar

VERSION = "2.0"

Id = int | str

# -- error codes. The five of JSON-RPC 2.0 §5.1, then those of the server-error range and
# beyond that ACP gives a meaning (or the bridge already answers with; docs/api.md §7.3, §11).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# -32000 is ACP's "authentication required" when an agent says it; the gateway has answered
# "too many" (a connection's limit reached) with the same first server-error code since it
# was written, and clients may match on it, so both names stay on one number.
AUTH_REQUIRED = -32000
TOO_MANY = -32000
ACCESS_DENIED = -32001  # the bridge's: an fs/* path outside the thread's working directory
RESOURCE_NOT_FOUND = -32002  # ACP
REQUEST_CANCELLED = -32800  # ACP ($/cancel_request), as in LSP


def is_id(value: Any) -> TypeGuard[Id]:
    """A request id JSON-RPC allows: a string or an integer (``true`` is not ``1``)."""
    return isinstance(value, str | int) and not isinstance(value, bool)


def id_key(value: Id) -> tuple[str, Id]:
    """A key under which ``1`` and ``"1"`` stay two ids (they are equal as dict keys in
    no language but differ on the wire)."""
    return (type(value).__name__, value)


class RpcError(Exception):
    """A JSON-RPC error object, raisable. Build it with the constructor named after its code,
    so the code table lives here and nowhere else."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def body(self) -> dict[str, Any]:
        """The ``error`` member of a response."""
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err

    def __repr__(self) -> str:
        return f"RpcError({self.code}, {self.message!r}, {self.data!r})"

    @classmethod
    def parse_error(cls, message: str = "Parse error") -> RpcError:
        return cls(PARSE_ERROR, message)

    @classmethod
    def invalid_request(cls, message: str, data: Any = None) -> RpcError:
        return cls(INVALID_REQUEST, message, data)

    @classmethod
    def method_not_found(cls, message: str = "Method not found", data: Any = None) -> RpcError:
        return cls(METHOD_NOT_FOUND, message, data)

    @classmethod
    def invalid_params(cls, message: str, data: Any = None) -> RpcError:
        return cls(INVALID_PARAMS, message, data)

    @classmethod
    def internal(cls, message: str, data: Any = None) -> RpcError:
        return cls(INTERNAL_ERROR, message, data)

    @classmethod
    def auth_required(cls, message: str, data: Any = None) -> RpcError:
        return cls(AUTH_REQUIRED, message, data)

    @classmethod
    def too_many(cls, message: str, data: Any = None) -> RpcError:
        return cls(TOO_MANY, message, data)

    @classmethod
    def access_denied(cls, message: str, data: Any = None) -> RpcError:
        return cls(ACCESS_DENIED, message, data)

    @classmethod
    def not_found(cls, message: str, data: Any = None) -> RpcError:
        return cls(RESOURCE_NOT_FOUND, message, data)

    @classmethod
    def cancelled(cls, message: str = "Request cancelled") -> RpcError:
        return cls(REQUEST_CANCELLED, message)


# ---------------------------------------------------------------------- messages


# Messages are values: never changed once made. Not frozen only because a frozen
# dataclass's __init__ costs about twice as much, and one is made for every line an agent
# writes (measured: 500 ns against 270 ns).


@dataclass(slots=True)
class Request:
    id: Id
    method: str
    params: Any  # as sent; None when absent


@dataclass(slots=True)
class Notification:
    method: str
    params: Any


@dataclass(slots=True)
class Response:
    """An answer: ``error`` is None on success. ``id`` is None only in an error answering a
    message whose id could not be read."""

    id: Id | None
    result: Any = None
    error: RpcError | None = None


@dataclass(slots=True)
class Invalid:
    """Not a JSON-RPC 2.0 message, and why. ``answer_id`` is the id an error answering it
    may carry: the message's id when it was a request with a readable id, else None (an id
    in a broken *response* is the peer's answer to one of ours: echoing it back would look
    like an answer to one of theirs). ``response``: it has an id and no method, so it meant
    to answer, and is never answered back (two peers would argue forever); ``reply_to`` is
    its id when readable, so the request it was meant to answer can be failed instead of
    waiting forever."""

    reason: str
    answer_id: Id | None = None
    reply_to: Id | None = None
    response: bool = False

    def error(self) -> RpcError:
        return RpcError.invalid_request(self.reason)


Message = Request | Notification | Response | Invalid

# Why a message is invalid (Invalid.reason): named, so that a caller whose answer depends on
# the reason compares with a name, not a sentence.
BATCH = "batches are not supported"
NOT_JSONRPC = "not a JSON-RPC 2.0 message"
BAD_METHOD = "method must be a string"
BAD_REQUEST_ID = "id must be a string or an integer"
NEITHER = "neither a request nor a response"
RESULT_XOR_ERROR = "a response has exactly one of result and error"
BAD_RESPONSE_ID = "a response's id must be a string, an integer or (in an error) null"
BAD_ERROR = "error must be an object with an integer code and a string message"


def classify(obj: Any) -> Message:
    """What one decoded JSON value is, as JSON-RPC 2.0 (JSON that did not parse is the
    caller's: :meth:`RpcError.parse_error`). On every line an agent writes, so the common
    case (a well-formed notification or request) is tested first."""
    if isinstance(obj, dict) and obj.get("jsonrpc") == VERSION:
        method = obj.get("method")
        if isinstance(method, str):
            if "id" not in obj:
                return Notification(method, obj.get("params"))
            rid = obj["id"]
            return Request(rid, method, obj.get("params")) if is_id(rid) else Invalid(BAD_REQUEST_ID)
        if "method" not in obj:
            return _response(obj)
        rid = obj.get("id")
        return Invalid(BAD_METHOD, rid if is_id(rid) else None)
    if isinstance(obj, list):
        return Invalid(BATCH)
    request_id = obj.get("id") if isinstance(obj, dict) and "method" in obj else None
    return Invalid(NOT_JSONRPC, request_id if is_id(request_id) else None)


def _response(obj: dict[str, Any]) -> Message:
    if "id" not in obj:
        return Invalid(NEITHER)
    rid = obj["id"]
    readable = rid if is_id(rid) else None
    if ("result" in obj) == ("error" in obj):
        return Invalid(RESULT_XOR_ERROR, reply_to=readable, response=True)
    if "result" in obj:
        if readable is None:
            return Invalid(BAD_RESPONSE_ID, response=True)
        return Response(readable, result=obj["result"])
    if readable is None and rid is not None:
        return Invalid(BAD_RESPONSE_ID, response=True)
    err = _error_object(obj["error"])
    if err is None:
        return Invalid(BAD_ERROR, reply_to=readable, response=True)
    return Response(readable, error=err)


def _error_object(err: Any) -> RpcError | None:
    """A response's ``error`` member, when it is one: an integer code, a string message."""
    if not isinstance(err, dict):
        return None
    code, message = err.get("code"), err.get("message")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
        return None
    return RpcError(code, message, err.get("data"))


# ---------------------------------------------------------------------- envelopes


def request(rid: Id, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": VERSION, "id": rid, "method": method, "params": params}


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": VERSION, "method": method, "params": params}


def result(rid: Id, value: Any) -> dict[str, Any]:
    return {"jsonrpc": VERSION, "id": rid, "result": value}


def error(rid: Id | None, err: RpcError) -> dict[str, Any]:
    return {"jsonrpc": VERSION, "id": rid, "error": err.body()}


# ---------------------------------------------------------------------- requests in flight

T = TypeVar("T")


class Pending(Generic[T]):
    """Our requests waiting for an answer: each id allocated here, once, with what the
    caller needs when the answer comes (``T``).

    Ids are integers counting from ``first``, or, with a ``prefix``, strings (``prefix``
    then the number) for a peer that relays someone else's ids on the same stream and must
    never mistake one of ours for one of theirs. An answer is matched by exact id: the
    string ``"1"`` never settles the integer ``1``, nor ``true`` it.
    """

    def __init__(self, *, first: int = 0, prefix: str | None = None) -> None:
        self._next = first
        self._prefix = prefix
        self._waiting: dict[tuple[str, Id], tuple[Id, T]] = {}

    def add(self, ctx: T) -> Id:
        """A fresh id, remembered with ``ctx`` until it is answered, dropped or failed."""
        n = self._next
        self._next += 1
        rid: Id = n if self._prefix is None else f"{self._prefix}{n}"
        self._waiting[id_key(rid)] = (rid, ctx)
        return rid

    def take(self, rid: Any) -> T | None:
        """The context of the request ``rid`` answers, forgotten now; None when ``rid`` is
        none of ours, or was answered, dropped or failed already."""
        if not is_id(rid):
            return None
        entry = self._waiting.pop(id_key(rid), None)
        return None if entry is None else entry[1]

    def drop(self, rid: Any) -> None:
        """Forget a request whose answer no longer matters (it was withdrawn)."""
        self.take(rid)

    def fail_all(self) -> list[tuple[Id, T]]:
        """Every request still waiting, forgotten: the caller fails them (the peer is gone)."""
        out = list(self._waiting.values())
        self._waiting.clear()
        return out

    def contexts(self) -> Iterator[T]:
        return (ctx for _, ctx in self._waiting.values())

    def find(self, match: Callable[[T], bool]) -> Id | None:
        """The id of a request still waiting whose context ``match``es (the oldest), else None."""
        return next((rid for rid, ctx in self._waiting.values() if match(ctx)), None)

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, rid: Any) -> bool:
        return is_id(rid) and id_key(rid) in self._waiting


__all__ = [
    "ACCESS_DENIED",
    "AUTH_REQUIRED",
    "BAD_ERROR",
    "BAD_METHOD",
    "BAD_REQUEST_ID",
    "BAD_RESPONSE_ID",
    "BATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "NEITHER",
    "NOT_JSONRPC",
    "PARSE_ERROR",
    "REQUEST_CANCELLED",
    "RESOURCE_NOT_FOUND",
    "RESULT_XOR_ERROR",
    "TOO_MANY",
    "VERSION",
    "Id",
    "Invalid",
    "Message",
    "Notification",
    "Pending",
    "Request",
    "Response",
    "RpcError",
    "classify",
    "error",
    "id_key",
    "is_id",
    "notification",
    "request",
    "result",
]
