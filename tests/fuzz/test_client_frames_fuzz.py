"""Property test (issue #6 item 8): whatever a WebSocket client sends, the daemon answers
each events-mode frame with exactly one ``client.accepted`` / ``client.rejected`` (or a
documented close), never closes with 1011, never logs a traceback or an error, and
``/healthz`` stays ok. Raw-mode frames either go to the agent or close with 1003/1009.

One daemon (stream-json fake agent) serves every example; a frame that legitimately
closed the socket just makes the next example reconnect. Bounded for CI: a few hundred
examples, well under a minute.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fuzz_daemon import SyncDaemon, running_daemon
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

REPLY_KINDS = ("client.accepted", "client.rejected")
MAX_FRAME = 8 * 1024 * 1024  # the bridge's limit on a client frame (docs/configuration.md)
UVICORN_MAX = 16 * 1024 * 1024  # beyond this uvicorn closes with 1009 before the bridge sees it
STEP = 15.0

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


# --------------------------------------------------------------------------- the daemon


class Link:
    """One WebSocket to the fuzzed thread, reopened whenever a frame closed it."""

    def __init__(self, daemon: SyncDaemon, thread_id: str, mode: str) -> None:
        self.daemon = daemon
        self.url = f"{daemon.ws_url}/v1/threads/{thread_id}/ws?mode={mode}"
        self.conn: ClientConnection | None = None
        self.sentinels = 0
        self.opened = 0

    def open(self) -> ClientConnection:
        if self.conn is None:
            # Entered as a context manager (websockets >= 17.1 warns otherwise); closed in drop().
            self.conn = connect(
                self.url,
                additional_headers=self.daemon.headers,
                max_size=None,
                max_queue=None,
                open_timeout=STEP,
                close_timeout=5,
            ).__enter__()
            self.opened += 1
        return self.conn

    def drain(self) -> None:
        """Discard whatever the server sent that nobody read (raw mode relays agent lines)."""
        if self.conn is None:
            return
        try:
            while True:
                self.conn.recv(timeout=0)
        except TimeoutError:
            pass
        except ConnectionClosed:
            self.drop()

    def drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncDaemon]:
    # Small idle timeout so agents a fuzz frame started do not pile up; enough pending
    # prompts that "busy" stays rare but still reachable.
    with running_daemon(
        tmp_path_factory.mktemp("frames-fuzz"), "idle_timeout_s = 5\nmax_pending_prompts = 8\ninterrupt_timeout_s = 2\n"
    ) as d:
        yield d


@pytest.fixture(scope="module")
def thread_id(daemon: SyncDaemon) -> str:
    with daemon.http() as http:
        r = http.post("/v1/threads", json={"agent": "stream-json", "title": "fuzz"})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


# --------------------------------------------------------------------------- strategies

# Directives of the fake agent that would make a turn last (or the agent misbehave) for
# longer than a fuzz example should wait; prompts never start with them.
_SLOW_DIRECTIVES = ("hang", "slow", "huge", "spawnchild", "flood", "ask", "big")

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63, max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=25,
)
unicode_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=60)
huge_text = st.sampled_from([64 * 1024, 512 * 1024, 2 * 1024 * 1024]).map(lambda n: "é" * (n // 2))


def _prompt_text(s: str) -> str:
    return ("fuzz " + s) if s.split()[:1] and s.split()[0].lower() in _SLOW_DIRECTIVES else s


texts = (unicode_text | huge_text).map(_prompt_text)
b64 = st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())
media_types = st.sampled_from(
    [
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "application/pdf",
        "text/plain",
        "image/svg+xml",
        "text/html",
        "IMAGE/PNG",
        "",
    ]
) | st.text(max_size=12)
sources = st.fixed_dictionaries(
    {"type": st.sampled_from(["base64", "url", "file"]) | json_values},
    optional={
        "media_type": media_types | json_values,
        "data": b64 | st.text(max_size=20) | json_values,
        "url": st.just("http://example.invalid/x.png"),
    },
)
blocks = (
    st.fixed_dictionaries({"type": st.just("text"), "text": texts})
    | st.fixed_dictionaries({"type": st.sampled_from(["image", "document"]), "source": sources})
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["video", "tool_use", "thinking", "", "TEXT"]) | json_values},
        optional={"text": json_values, "source": json_values},
    )
    | json_values
)
contents = (
    st.lists(blocks, max_size=6)
    | st.lists(st.just({"type": "text", "text": "x"}), min_size=63, max_size=66)
    | json_values
)
ids = st.text(max_size=140) | json_values

frames = st.fixed_dictionaries(
    {"op": st.sampled_from(["prompt", "interrupt", "permission", "raw", "junk"]) | json_values},
    optional={
        "text": texts | json_values,
        "content": contents,
        "client_id": ids,
        "request_id": ids,
        "decision": st.sampled_from(["allow", "deny"]) | json_values,
        "option_id": ids,
        "message": json_values | st.dictionaries(st.text(max_size=8), json_values),
        "extra": json_values,
    },
)


def _nest(depth: int, frame: dict[str, Any]) -> str:
    """A frame whose one field is ``depth`` levels of lists (beyond any recursion limit)."""
    key = "content" if frame.get("op") == "prompt" else "message"
    head = json.dumps({k: v for k, v in frame.items() if k != key})[:-1]
    sep = ", " if len(head) > 1 else ""
    return f'{head}{sep}"{key}": {"[" * depth}{"]" * depth}}}'


def _dumps_unescaped(frame: dict[str, Any]) -> str:
    """Non-ASCII as itself, where it can be UTF-8 (a lone surrogate cannot: escaped then)."""
    text = json.dumps(frame, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(frame)
    return text


Payload = str | bytes
payloads: st.SearchStrategy[Payload] = st.one_of(
    frames.map(json.dumps),
    frames.map(_dumps_unescaped),
    st.tuples(st.integers(1, 200_000), frames).map(lambda t: _nest(*t)),
    st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 50_000).map(lambda n: '{"op":' * n + "1" + "}" * n),
    json_values.map(json.dumps),  # valid JSON that is not an object, or an object without op
    st.text(max_size=200),  # mostly not JSON
    st.binary(max_size=2048),
)


# --------------------------------------------------------------------------- the property


def _replies_until_sentinel(link: Link, conn: ClientConnection, sentinel: str) -> list[dict[str, Any]]:
    """Every reply frame (seq null, client.*) up to and including the sentinel's."""
    replies = []
    deadline = time.monotonic() + STEP
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no reply to the sentinel within {STEP}s; replies so far {replies}")
        text = conn.recv(timeout=left)
        assert isinstance(text, str), f"the server sent a binary frame: {text[:80]!r}"
        frame = json.loads(text)
        if frame.get("kind") in REPLY_KINDS:
            assert frame.get("seq") is None, frame
            if frame.get("data", {}).get("op") == sentinel:
                return replies
            replies.append(frame)


@pytest.mark.timeout(120)
@FUZZ
@given(payload=payloads)
@example(payload="x" * (MAX_FRAME + 1))
@example(payload=json.dumps({"op": "prompt", "text": "y" * (MAX_FRAME + 16)}))
@example(payload=b"\x00" * (MAX_FRAME + 1))
@example(payload='{"op":"prompt","text":"\\ud800 lone surrogate"}')
@example(payload='{"op":"prompt","text":NaN}')
@example(payload='{"op":"raw","message":{"type":"shutdown"}}')
@example(payload='{"op":"raw","message":{"a":' + "[" * 970 + "]" * 970 + "}}")
@example(payload='{"op":"prompt","content":[' + "[" * 970 + "]" * 970 + "]}")
@example(payload='{"op":"permission","request_id":"r","decision":"allow","option_id":"' + "o" * 5000 + '"}')
def test_every_events_frame_gets_exactly_one_reply(
    daemon: SyncDaemon, thread_id: str, events_link: Link, payload: Payload
) -> None:
    link = events_link
    conn = link.open()
    link.sentinels += 1
    sentinel = f"fuzz-sentinel-{link.sentinels}"
    try:
        conn.send(payload)
        conn.send(json.dumps({"op": sentinel}))
        replies = _replies_until_sentinel(link, conn, sentinel)
    except ConnectionClosed as exc:
        link.drop()
        code = exc.rcvd.code if exc.rcvd is not None else None
        assert code != 1011, f"internal error closing the socket after {payload[:200]!r}"
        # Only a frame uvicorn cannot take at all (> 16 MiB) may close an events socket.
        assert code == 1009 and len(payload) > UVICORN_MAX, (
            f"socket closed ({code}, {exc.rcvd.reason if exc.rcvd else ''!r}) without a reply after {payload[:200]!r}"
        )
        replies = None
    if replies is not None:
        assert len(replies) == 1, f"{len(replies)} replies to {payload[:200]!r}: {replies}"
        reply = replies[0]
        data = reply["data"]
        if reply["kind"] == "client.rejected":
            assert isinstance(data.get("code"), str) and data["code"], reply
            assert isinstance(data.get("message"), str), reply
        if isinstance(payload, bytes):
            assert reply["kind"] == "client.rejected", reply
        elif len(payload) > MAX_FRAME:
            assert (reply["kind"], data.get("code")) == ("client.rejected", "frame_too_large"), reply
    problems = daemon.new_log_problems()
    assert not problems, f"daemon logged after {payload[:200]!r}:\n" + "\n".join(problems)
    assert daemon.healthy(), f"daemon unhealthy after {payload[:200]!r}"


@pytest.fixture(scope="module")
def events_link(daemon: SyncDaemon, thread_id: str) -> Iterator[Link]:
    link = Link(daemon, thread_id, "events")
    yield link
    link.drop()


raw_payloads: st.SearchStrategy[Payload] = st.one_of(
    json_values.map(json.dumps),
    st.dictionaries(st.text(max_size=8), json_values, max_size=5).map(json.dumps),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["keep_alive", "control_request", "user_x", "shutdown"]) | json_values}
    ).map(json.dumps),
    st.integers(1, 100_000).map(lambda n: "[" * n + "]" * n),
    st.text(max_size=100),
    st.binary(max_size=256),
)


MAX_DEPTH = 128  # JSON nesting the bridge takes (docs/configuration.md, Limits)


def _depth(value: object) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d + 1)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _is_object(payload: Payload) -> bool:
    """What raw mode relays: one JSON object no deeper than the limit. (Whether Python's own
    parser manages a 970-deep frame depends on the stack depth at the call: a RecursionError
    is not an answer, so such frames are judged by their brackets.)"""
    if isinstance(payload, bytes):
        return False
    try:
        value = json.loads(payload)
    except RecursionError:
        return False  # far deeper than the limit, whatever else it is
    except ValueError:
        return False
    return isinstance(value, dict) and _depth(value) <= MAX_DEPTH


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=60)
@given(payload=raw_payloads)
@example(payload="{" + '"a":' * 0 + "}")
@example(payload='{"a":' + "[" * 970 + "]" * 970 + "}")
@example(payload="z" * (MAX_FRAME + 1))
def test_raw_mode_frames_are_relayed_or_close_the_socket(
    daemon: SyncDaemon, raw_thread_id: str, raw_link: Link, payload: Payload
) -> None:
    link = raw_link
    link.drain()
    conn = link.open()
    expect_close = (not _is_object(payload)) or len(payload) > MAX_FRAME
    conn.send(payload)
    if expect_close:
        code: int | None = None
        try:
            while True:  # agent output may still arrive before the close, which is immediate
                conn.recv(timeout=5)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
        except TimeoutError:
            link.drop()
            raise AssertionError(f"no close within 5 s of the raw frame {payload[:200]!r}") from None
        link.drop()
        assert code in (1003, 1009), f"closed with {code} after {payload[:200]!r}"
        if len(payload) > MAX_FRAME:
            assert code == 1009, f"closed with {code} after an oversized frame"
    else:
        # Nothing is answered in raw mode; a ping round trip proves the socket still stands.
        assert conn.ping().wait(STEP), f"no pong after {payload[:200]!r}"
    problems = daemon.new_log_problems()
    assert not problems, f"daemon logged after {payload[:200]!r}:\n" + "\n".join(problems)
    assert daemon.healthy(), f"daemon unhealthy after {payload[:200]!r}"


@pytest.fixture(scope="module")
def raw_thread_id(daemon: SyncDaemon) -> str:
    with daemon.http() as http:
        r = http.post("/v1/threads", json={"agent": "stream-json", "title": "raw fuzz"})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


@pytest.fixture(scope="module")
def raw_link(daemon: SyncDaemon, raw_thread_id: str) -> Iterator[Link]:
    link = Link(daemon, raw_thread_id, "raw")
    yield link
    link.drop()


def test_the_fuzzed_thread_is_still_consistent(daemon: SyncDaemon, thread_id: str) -> None:
    """After the fuzzing: the transcript pages without gaps, and once the agent is stopped
    (a fuzzed raw frame may have left it mid-turn) a plain prompt still gets its turn."""
    with daemon.http() as http:
        assert http.post(f"/v1/threads/{thread_id}/stop").status_code == 202
        seqs: list[int] = []
        after = 0
        while True:
            page = http.get(f"/v1/threads/{thread_id}/events", params={"after": after, "limit": 1000})
            assert page.status_code == 200, page.text
            events = page.json()["events"]
            if not events:
                break
            seqs += [e["seq"] for e in events]
            after = events[-1]["seq"]
        assert seqs == list(range(1, len(seqs) + 1))
    with connect(
        f"{daemon.ws_url}/v1/threads/{thread_id}/ws?after={after}",
        additional_headers=daemon.headers,
        max_size=None,
        open_timeout=STEP,
    ) as conn:
        conn.send(json.dumps({"op": "prompt", "text": "still alive?", "client_id": "final"}))
        turn_id = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            frame = json.loads(conn.recv(timeout=30))
            if frame["kind"] == "client.accepted" and frame["data"].get("client_id") == "final":
                turn_id = frame["data"]["turn_id"]
            if frame["kind"] == "turn.ended" and turn_id and frame["data"].get("turn_id") == turn_id:
                break
        else:
            raise AssertionError("the final prompt's turn never ended")
    assert not daemon.new_log_problems()
