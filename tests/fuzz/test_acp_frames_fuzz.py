"""Property test for the ACP gateway (docs/api.md §11): whatever an ACP client sends, every
message the gateway sends back is JSON-RPC 2.0 (protocols/jsonrpc.py reads it as a request,
a notification or a response, never as invalid), the connection stays open and usable (a
``session/list`` sent after the frame is answered), the daemon logs no error or traceback
and ``/healthz`` stays ok.

One daemon and one initialized connection, with a session attached, serve every example;
the frames are JSON-RPC messages built around ACP's methods with any JSON in any member,
junk JSON, bracket bombs, text that is not JSON and binary frames.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fuzz_daemon import SyncDaemon, running_daemon
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from bridge.protocols import jsonrpc

STEP = 15.0
FUZZ = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
SENTINELS = itertools.count()


class Acp:
    """The one fuzzed connection, with the session it attached."""

    def __init__(self, conn: ClientConnection, session_id: str, cwd: str) -> None:
        self.conn = conn
        self.session_id = session_id
        self.cwd = cwd

    def until_answer(self, rid: str) -> tuple[dict[str, Any], list[Any]]:
        """Everything received up to the answer to ``rid``, that answer last."""
        seen: list[Any] = []
        while True:
            msg = json.loads(self.conn.recv(timeout=STEP))
            seen.append(msg)
            if isinstance(msg, dict) and "method" not in msg and msg.get("id") == rid:
                return msg, seen


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncDaemon]:
    with running_daemon(tmp_path_factory.mktemp("acp-fuzz"), "idle_timeout_s = 5\nmax_pending_prompts = 8\n") as d:
        yield d


@pytest.fixture(scope="module")
def acp(daemon: SyncDaemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Acp]:
    cwd = tmp_path_factory.mktemp("acp-cwd")
    with connect(
        f"{daemon.ws_url}/v1/acp/stream-json", additional_headers=daemon.headers, max_size=None, open_timeout=STEP
    ) as conn:
        link = Acp(conn, "", str(cwd))
        conn.send(
            json.dumps({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {"protocolVersion": 1}})
        )
        assert "result" in link.until_answer("init")[0]
        new = {"jsonrpc": "2.0", "id": "new", "method": "session/new", "params": {"cwd": str(cwd), "mcpServers": []}}
        conn.send(json.dumps(new))
        answer, _ = link.until_answer("new")
        link.session_id = answer["result"]["sessionId"]
        yield link


scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=10,
)
METHODS = [
    "initialize",
    "session/new",
    "session/load",
    "session/resume",
    "session/list",
    "session/set_mode",
    "session/cancel",
    "session/prompt",
    "session/fork",
    "$/cancel_request",
]
SESSION = "<the session>"  # replaced by the attached session's id
CWD = "<the cwd>"
ids = st.integers(-3, 5) | st.text(max_size=4) | scalars
params = st.fixed_dictionaries(
    {},
    optional={
        "protocolVersion": st.just(1) | scalars,
        "sessionId": st.sampled_from([SESSION, "thr_none"]) | scalars,
        "cwd": st.sampled_from([CWD, "/", "relative"]) | scalars,
        "mcpServers": st.just([]) | json_values,
        "modeId": st.text(max_size=6) | scalars,
        "cursor": json_values,
        "prompt": st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.just("fuzz")}), max_size=2)
        | json_values,
        "_meta": st.fixed_dictionaries({"agent-bridge": json_values}) | json_values,
    },
)
messages = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0") | scalars},
    optional={
        "id": ids,
        "method": st.sampled_from(METHODS) | scalars,
        "params": params | json_values,
        "result": json_values,
        "error": st.fixed_dictionaries({"code": st.integers() | scalars, "message": st.text(max_size=6) | scalars})
        | json_values,
    },
)
Payload = str | bytes
payloads: st.SearchStrategy[Payload] = st.one_of(
    messages.map(json.dumps),
    st.lists(messages, max_size=3).map(json.dumps),  # a batch
    json_values.map(json.dumps),
    st.integers(1, 50_000).map(lambda n: "[" * n + "]" * n),
    st.text(max_size=100),
    st.binary(max_size=64),
)


def _filled(payload: Payload, acp: Acp) -> Payload:
    if isinstance(payload, bytes):
        return payload
    return payload.replace(json.dumps(SESSION), json.dumps(acp.session_id)).replace(
        json.dumps(CWD), json.dumps(acp.cwd)
    )


@pytest.mark.timeout(300)
@FUZZ
@given(payload=payloads)
@example(payload='{"jsonrpc": "2.0", "id": 5}')
@example(payload='{"jsonrpc": "2.0", "id": 1, "result": {}, "error": {"code": 1, "message": "x"}}')
@example(payload='[{"jsonrpc": "2.0", "id": 1, "method": "session/list"}]')
@example(payload="[" * 100_000 + "]" * 100_000)
def test_every_message_back_is_json_rpc_and_the_connection_stays_usable(
    daemon: SyncDaemon, acp: Acp, payload: Payload
) -> None:
    acp.conn.send(_filled(payload, acp))
    sentinel = f"sentinel-{next(SENTINELS)}"
    acp.conn.send(json.dumps({"jsonrpc": "2.0", "id": sentinel, "method": "session/list", "params": {}}))
    answer, seen = acp.until_answer(sentinel)
    assert "result" in answer, answer
    for msg in seen:
        assert not isinstance(jsonrpc.classify(msg), jsonrpc.Invalid), (payload, msg)
    problems = daemon.new_log_problems()
    assert not problems, f"daemon logged after {payload!r:.200}:\n" + "\n".join(problems)
    assert daemon.healthy()
