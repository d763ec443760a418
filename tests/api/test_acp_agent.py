"""The ACP agent of the gateway (api/acp_agent.py) in process, through its two seams: JSON
values in and an Outbox out (what the WebSocket gives it), and the threads it reaches only
as api/acp_threads.py's AcpThreads — here a fake that records the commands it is asked to
run. No daemon, no socket: what the agent answers, and what it asks of a thread."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from acp import schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.api.acp_agent import AcpAgent
from bridge.api.acp_threads import AcpThread
from bridge.api.users import User
from bridge.config import load_settings
from bridge.errors import NotFound
from bridge.protocols import jsonrpc
from bridge.protocols.envelope import Frames, Page
from bridge.protocols.events import Record
from bridge.protocols.jsonline import dumps
from bridge.protocols.jsonrpc import Notification, Request, Response
from bridge.sessions.actions import Accepted
from bridge.sessions.commands import AnswerPermission, Command, Interrupt, Prompt, SetMode, SetModel
from bridge.sessions.fanout import Subscriber
from bridge.store.base import ThreadRow

USER = User("ann", admin=False, owner="ann")
V = "2.0"


class Outbox:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed: tuple[int, str] | None = None
        self.failed = False

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(json.loads(dumps(message)))  # as the client reads it

    def fail(self) -> None:
        self.failed = True

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


class FakeThread:
    def __init__(self, tid: str, owner: str | None = "ann") -> None:
        self.id = tid
        self.owner = owner
        self.records: list[Record] = []
        self.pending: list[dict[str, Any]] = []
        self.commands: list[Command[Any]] = []
        self.subs: list[Subscriber] = []
        self.fields: dict[str, Any] = {"title": "", "model": "m1", "updated_at": "2026-01-01T00:00:00Z"}
        self.profile_models: list[str] = []
        self.stops = 0

    @property
    def last_seq(self) -> int:
        return self.records[-1].seq if self.records else 0

    def modes(self) -> dict[str, Any] | None:
        info = self.fields.get("agent_info")
        return info.get("modes") if isinstance(info, dict) else None

    def pending_permissions(self) -> list[dict[str, Any]]:
        return list(self.pending)

    def is_pending(self, request_id: str) -> bool:
        return any(p["request_id"] == request_id for p in self.pending)

    def subscribe(self) -> Subscriber:
        sub = Subscriber()
        self.subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        sub.close("unsubscribed")
        self.subs.remove(sub)

    async def read_page(self, after: int, limit: int) -> Page:
        page = [r for r in self.records if r.seq > after][:limit]
        return Page(page, more=len(page) == limit)

    async def read_frames(self, after: int, limit: int, *, raw: bool) -> Frames:
        raise AssertionError("the ACP agent reads records")

    async def run(self, command: Command[Any]) -> Any:
        self.commands.append(command)
        if isinstance(command, Prompt):
            self.emit("client", "message", {"text": "hi", "client_id": command.client_id, "turn_id": "t1"})
            return Accepted(seq=self.last_seq, turn_id="t1")
        if isinstance(command, SetModel):  # the thread's model switch, as sessions/model_port.py records it
            self.fields["model"] = command.model
            return {"model": command.model}
        return None

    async def start_agent(self, wait_s: float) -> None:
        return None

    def row(self) -> dict[str, Any]:
        return {"id": self.id, **self.fields}

    def models(self) -> list[str]:
        return list(self.profile_models)

    async def stop_agent(self) -> None:
        self.stops += 1

    def emit(self, source: str, kind: str, data: dict[str, Any]) -> None:
        rec = Record(self.last_seq + 1, "2026-01-01T00:00:00Z", source, kind, data, None, False)
        self.records.append(rec)
        for sub in self.subs:
            sub.push([rec])


class FakeThreads:
    def __init__(self) -> None:
        self.threads: dict[str, FakeThread] = {}
        self.watchers: list[asyncio.Queue[list[tuple[str, dict[str, Any] | None]]]] = []
        self.deleted: list[str] = []

    async def delete(self, thread_id: str, user: User) -> None:
        thread = self.threads.get(thread_id)
        if thread is None or thread.owner != user.owner:
            raise NotFound(f"no thread {thread_id}", code="thread_not_found")
        del self.threads[thread_id]
        self.deleted.append(thread_id)
        for sub in list(thread.subs):
            sub.close("deleted")

    async def watch(self) -> AsyncIterator[list[tuple[str, dict[str, Any] | None]]]:
        # As the change log: the changes after the cursor taken at the first page, none before.
        mine: asyncio.Queue[list[tuple[str, dict[str, Any] | None]]] = asyncio.Queue()
        self.watchers.append(mine)
        yield []
        while True:
            yield await mine.get()

    def change(self, thread: FakeThread, **fields: Any) -> None:
        """A change of the thread's row, as the change log tells it."""
        thread.fields.update(fields)
        for queue in self.watchers:
            queue.put_nowait([(thread.id, thread.row())])

    async def create(self, *, agent: str | None, cwd: str, owner: str | None, admin: bool) -> AcpThread:
        thread = FakeThread(f"thr_{len(self.threads)}", owner)
        self.threads[thread.id] = thread
        return thread

    async def get(self, thread_id: str) -> AcpThread:
        if thread_id not in self.threads:
            raise NotFound(f"no thread {thread_id}", code="thread_not_found")
        return self.threads[thread_id]

    async def list(self, *, limit: int, cursor: str | None, owner: str | None) -> tuple[list[ThreadRow], str | None]:
        rows = [
            {"id": t.id, "cwd": "/w", "updated_at": "x", "agent": "demo", "state": "idle", "last_seq": t.last_seq}
            for t in self.threads.values()
        ]
        return rows, None  # type: ignore[return-value]


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


def run(tmp_path: Path, body: Callable[[AcpAgent, Outbox, FakeThreads], Awaitable[None]]) -> None:
    async def go() -> None:
        out, threads = Outbox(), FakeThreads()
        conf = load_settings(data_dir=str(tmp_path), env={}, discover_path=False)
        agent = AcpAgent(out, threads, conf, USER, None, "conn-1")
        try:
            await body(agent, out, threads)
        finally:
            await agent.close()

    asyncio.run(go())


async def call(agent: AcpAgent, out: Outbox, rid: Any, method: str, params: Any = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": V, "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    await agent.message(msg)
    await settle()
    answers = [m for m in out.sent if "method" not in m and m.get("id") == rid]
    assert len(answers) == 1, out.sent
    return answers[0]


def test_what_is_not_a_request_it_can_serve_is_answered_with_the_code_json_rpc_gives(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        assert (await call(agent, out, 1, "session/list", {}))["error"]["code"] == jsonrpc.INVALID_REQUEST
        await agent.message([{"jsonrpc": V, "id": 2, "method": "initialize"}])
        assert out.sent[-1] == {"jsonrpc": V, "id": None, "error": {"code": -32600, "message": jsonrpc.BATCH}}
        await agent.message({"id": 3, "method": "initialize"})
        assert out.sent[-1]["id"] == 3 and out.sent[-1]["error"]["code"] == -32600
        await agent.message({"jsonrpc": V, "id": True, "method": "initialize"})
        assert out.sent[-1]["id"] is None and out.sent[-1]["error"]["code"] == -32600
        init = await call(agent, out, "a", "initialize", {"protocolVersion": 1})
        assert init["result"]["protocolVersion"] == 1 and init["result"]["agentCapabilities"]["loadSession"]
        assert (await call(agent, out, 4, "session/fork", {}))["error"]["code"] == jsonrpc.METHOD_NOT_FOUND
        assert (await call(agent, out, 5, "session/new", [1]))["error"]["code"] == jsonrpc.INVALID_PARAMS
        assert (await call(agent, out, 6, "session/load", {"sessionId": "x"}))["error"]["code"] == -32002
        assert (await call(agent, out, 7, "session/list"))["result"] == {"sessions": []}  # params may be left out
        # A broken response, an answer to nothing, a notification: never answered back.
        n = len(out.sent)
        for msg in (
            {"jsonrpc": V, "id": 8},
            {"jsonrpc": V, "id": 8, "result": {}, "error": {"code": 1, "message": "m"}},
            {"jsonrpc": V, "id": 99, "result": {}},
            {"jsonrpc": V, "method": "no/such"},
        ):
            await agent.message(msg)
        await settle()
        assert len(out.sent) == n

    run(tmp_path, body)


def test_a_prompt_is_a_prompt_command_and_is_answered_at_its_turns_end(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        sid = (await call(agent, out, 1, "session/new", {"cwd": "/w", "mcpServers": []}))["result"]["sessionId"]
        thread = threads.threads[sid]
        prompt = {
            "sessionId": sid,
            "prompt": [{"type": "text", "text": "hi"}],
            "_meta": {"agent-bridge": {"client_id": "c1"}},
        }
        await agent.message({"jsonrpc": V, "id": 2, "method": "session/prompt", "params": prompt})
        await settle()
        [command] = thread.commands
        assert command == Prompt(content=[{"type": "text", "text": "hi"}], client_id="c1", actor="ann")
        thread.emit("agent", "message.delta", {"text": "hello"})
        thread.emit("agent", "turn.ended", {"turn_id": "t1", "status": "success", "stop_reason": "end_turn"})
        await settle()
        updates = [m["params"]["update"] for m in out.sent if m.get("method") == "session/update"]
        chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hello"}}
        assert updates == [{**chunk, "messageId": f"{sid}:2"}]
        assert out.sent[-1] == {"jsonrpc": V, "id": 2, "result": {"stopReason": "end_turn"}}
        await agent.message({"jsonrpc": V, "method": "session/cancel", "params": {"sessionId": sid}})
        await settle()
        assert thread.commands[-1] == Interrupt(actor="ann")

    run(tmp_path, body)


def test_permission_answers_are_commands_and_a_broken_answer_is_a_denial(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        sid = (await call(agent, out, 1, "session/new", {"cwd": "/w", "mcpServers": []}))["result"]["sessionId"]
        thread = threads.threads[sid]
        for rid in ("p1", "p2"):
            thread.pending.append({"request_id": rid})
            thread.emit("agent", "permission.requested", {"request_id": rid, "tool": "Bash", "input": {}})
        await settle()
        asks = [m for m in out.sent if m.get("method") == "session/request_permission"]
        assert [type(a["id"]) for a in asks] == [int, int] and asks[0]["id"] != asks[1]["id"]
        n = len(out.sent)
        selected = {"outcome": {"outcome": "selected", "optionId": "allow"}}
        await agent.message({"jsonrpc": V, "id": asks[0]["id"], "result": selected})
        await agent.message({"jsonrpc": V, "id": str(asks[1]["id"]), "result": selected})  # not our id: "1" is not 1
        await agent.message(
            {"jsonrpc": V, "id": asks[1]["id"], "result": selected, "error": {"code": 1, "message": "x"}}
        )
        await settle()
        assert thread.commands == [
            AnswerPermission(request_id="p1", decision="allow", channel="acp", actor="ann"),
            AnswerPermission(request_id="p2", decision="deny", channel="acp", actor="ann"),
        ]
        assert len(out.sent) == n  # nothing said back to answers

    run(tmp_path, body)


def updates_of(out: Outbox, sid: str) -> list[dict[str, Any]]:
    return [
        m["params"]["update"]
        for m in out.sent
        if m.get("method") == "session/update" and m["params"]["sessionId"] == sid
    ]


async def new_session(agent: AcpAgent, out: Outbox, threads: FakeThreads, rid: Any = "new") -> FakeThread:
    answer = await call(agent, out, rid, "session/new", {"cwd": "/w", "mcpServers": []})
    return threads.threads[answer["result"]["sessionId"]]


def test_initialize_advertises_the_session_methods_there_are(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        init = await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        schema.InitializeResponse.model_validate(init["result"])
        caps = init["result"]["agentCapabilities"]["sessionCapabilities"]
        assert caps == {"list": {}, "resume": {}, "close": {}, "delete": {}}
        for method in ("session/close", "session/delete", "session/set_config_option"):
            assert (await call(agent, out, method, method, {}))["error"]["code"] == jsonrpc.INVALID_PARAMS

    run(tmp_path, body)


def test_close_cancels_the_sessions_prompt_withdraws_its_asks_stops_its_agent_and_detaches(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        thread = await new_session(agent, out, threads)
        sid = thread.id
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
        await agent.message({"jsonrpc": V, "id": "p", "method": "session/prompt", "params": prompt})
        thread.pending.append({"request_id": "r1"})
        thread.emit("agent", "permission.requested", {"request_id": "r1", "tool": "Bash", "input": {}})
        await settle()
        (ask,) = [m for m in out.sent if m.get("method") == "session/request_permission"]
        closed = await call(agent, out, "c", "session/close", {"sessionId": sid})
        assert closed["result"] == {} and thread.stops == 1
        assert {"jsonrpc": V, "id": "p", "result": {"stopReason": "cancelled"}} in out.sent
        assert {"jsonrpc": V, "method": "$/cancel_request", "params": {"requestId": ask["id"]}} in out.sent
        n = len(out.sent)
        thread.emit("agent", "message.delta", {"text": "late"})
        thread.emit("agent", "turn.ended", {"turn_id": "t1", "status": "cancelled"})
        await settle()
        assert len(out.sent) == n and not thread.subs  # detached: nothing more of it
        # Closed twice is closed; a prompt needs the session attached again; an unknown one is -32002.
        assert (await call(agent, out, "c2", "session/close", {"sessionId": sid}))["result"] == {}
        assert (await call(agent, out, "p2", "session/prompt", prompt))["error"]["code"] == -32002
        assert (await call(agent, out, "c3", "session/close", {"sessionId": "thr_nope"}))["error"]["code"] == -32002
        assert thread.stops == 1
        await call(agent, out, "r", "session/resume", {"sessionId": sid})  # and it can come back

    run(tmp_path, body)


def test_delete_deletes_with_the_callers_rights_and_tells_the_attached_session(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        thread = await new_session(agent, out, threads)
        theirs = FakeThread("thr_bob", owner="bob")
        threads.threads[theirs.id] = theirs
        prompt = {"sessionId": thread.id, "prompt": [{"type": "text", "text": "hi"}]}
        await agent.message({"jsonrpc": V, "id": "p", "method": "session/prompt", "params": prompt})
        await settle()
        assert (await call(agent, out, "d", "session/delete", {"sessionId": thread.id}))["result"] == {}
        await settle()
        assert threads.deleted == [thread.id]
        info = updates_of(out, thread.id)[-1]
        assert info == {"sessionUpdate": "session_info_update", "_meta": {"agent-bridge": {"deleted": True}}}
        (failed,) = [m for m in out.sent if m.get("id") == "p"]
        assert failed["error"]["data"] == {"code": "thread_deleted"}
        # Gone, never there, someone else's: all {} as ACP asks, and bob's thread stays.
        for sid in (thread.id, "thr_never", theirs.id):
            assert (await call(agent, out, f"d-{sid}", "session/delete", {"sessionId": sid}))["result"] == {}
        assert threads.deleted == [thread.id] and theirs.id in threads.threads
        listed = await call(agent, out, "l", "session/list", {})
        assert thread.id not in {x["sessionId"] for x in listed["result"]["sessions"]}

    run(tmp_path, body)


def test_config_options_model_and_mode_and_the_other_sessions_hear_of_changes(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        answer = await call(agent, out, 1, "session/new", {"cwd": "/w", "mcpServers": []})
        schema.NewSessionResponse.model_validate(answer["result"])
        sid = answer["result"]["sessionId"]
        thread = threads.threads[sid]
        (model,) = answer["result"]["configOptions"]
        assert model["id"] == "model" and model["currentValue"] == "m1" and model["category"] == "model"
        thread.profile_models = ["m2"]
        thread.fields["agent_info"] = {
            "modes": {"currentModeId": "a", "availableModes": [{"id": "a", "name": "A"}, {"id": "b", "name": "B"}]}
        }
        params = {"sessionId": sid, "configId": "model", "value": "m2"}
        got = await call(agent, out, 2, "session/set_config_option", params)
        schema.SetSessionConfigOptionResponse.model_validate(got["result"])
        assert thread.fields["model"] == "m2" and thread.commands[-1] == SetModel(model="m2", actor="ann")
        assert {o["id"]: o["currentValue"] for o in got["result"]["configOptions"]} == {"mode": "a", "model": "m2"}
        got = await call(agent, out, 3, "session/set_config_option", {**params, "configId": "mode", "value": "b"})
        assert thread.commands[-1] == SetMode(mode_id="b", actor="ann")
        assert {o["id"]: o["currentValue"] for o in got["result"]["configOptions"]} == {"mode": "b", "model": "m2"}
        for bad in ({**params, "value": "m9"}, {**params, "configId": "nope"}, {**params, "value": True}):
            assert (await call(agent, out, f"bad-{bad}", "session/set_config_option", bad))["error"]["code"] == -32602
        # What this client set is not told back to it; a change made elsewhere is.
        thread.fields["agent_info"]["modes"]["currentModeId"] = "b"
        threads.change(thread, model="m2")
        await settle()
        assert not [u for u in updates_of(out, sid) if u["sessionUpdate"] == "config_option_update"]
        threads.change(thread, model="m1", title="named elsewhere")
        await settle()
        info, config = updates_of(out, sid)[-2:]
        assert info == {
            "sessionUpdate": "session_info_update",
            "title": "named elsewhere",
            "updatedAt": "2026-01-01T00:00:00Z",
        }
        assert config["sessionUpdate"] == "config_option_update"
        assert {o["id"]: o["currentValue"] for o in config["configOptions"]} == {"mode": "b", "model": "m1"}
        for update in (info, config):
            schema.SessionNotification.model_validate({"sessionId": sid, "update": update})

    run(tmp_path, body)


def test_a_load_from_the_middle_of_a_message_gives_its_chunks_the_id_its_start_had(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        thread = FakeThread("thr_long")
        threads.threads[thread.id] = thread
        thread.emit("agent", "tool.result", {"tool_call_id": "t", "output": "x"})
        for i in range(300):  # longer than the first window read back
            thread.emit("agent", "message.delta", {"text": f"{i} "})
        await call(agent, out, 1, "session/load", {"sessionId": thread.id})
        whole = {u["messageId"] for u in updates_of(out, thread.id) if u["sessionUpdate"] == "agent_message_chunk"}
        assert whole == {"thr_long:2"}
        await call(agent, out, 2, "session/close", {"sessionId": thread.id})
        out.sent.clear()
        await call(agent, out, 3, "session/load", {"sessionId": thread.id, "_meta": {"agent-bridge": {"after": 250}}})
        later = [u for u in updates_of(out, thread.id) if u["sessionUpdate"] == "agent_message_chunk"]
        assert len(later) == 51 and {u["messageId"] for u in later} == {"thr_long:2"}

    run(tmp_path, body)


def test_a_title_given_while_a_load_replays_reaches_the_loading_client(tmp_path: Path) -> None:
    class Renamed(FakeThread):
        fakes: FakeThreads

        async def read_page(self, after: int, limit: int) -> Page:
            if not self.fields["title"]:  # committed while the replay reads, once
                self.fakes.change(self, title="named meanwhile")
            return await super().read_page(after, limit)

    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        thread = Renamed("thr_r")
        thread.fakes = threads
        threads.threads[thread.id] = thread
        thread.emit("agent", "message.delta", {"text": "x"})
        await call(agent, out, 1, "session/load", {"sessionId": thread.id})
        await settle()
        titles = [u.get("title") for u in updates_of(out, thread.id) if u["sessionUpdate"] == "session_info_update"]
        assert titles and titles[-1] == "named meanwhile"

    run(tmp_path, body)


def test_a_turns_usage_is_told_before_its_prompt_is_answered(tmp_path: Path) -> None:
    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, 0, "initialize", {"protocolVersion": 1})
        thread = await new_session(agent, out, threads)
        prompt = {"sessionId": thread.id, "prompt": [{"type": "text", "text": "hi"}]}
        await agent.message({"jsonrpc": V, "id": "p", "method": "session/prompt", "params": prompt})
        await settle()
        usage = {"used": 5, "size": 10}
        thread.emit("agent", "turn.ended", {"turn_id": "t1", "status": "success", "usage": {"context": usage}})
        await settle()
        assert out.sent[-2]["params"]["update"] == {"sessionUpdate": "usage_update", **usage}
        assert out.sent[-1] == {"jsonrpc": V, "id": "p", "result": {"stopReason": "end_turn"}}

    run(tmp_path, body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
METHODS = ["initialize", "session/new", "session/load", "session/resume", "session/prompt", "session/list",
           "session/set_mode", "session/cancel", "session/close", "session/delete", "session/set_config_option",
           "x"]  # fmt: skip
messages = st.fixed_dictionaries(
    {"jsonrpc": st.just(V)},
    optional={
        "id": st.integers(-2, 3) | st.text(max_size=2) | json_values,
        "method": st.sampled_from(METHODS) | json_values,
        "params": st.fixed_dictionaries(
            {},
            optional={
                "protocolVersion": st.just(1) | json_values,
                "sessionId": st.sampled_from(["thr_0", "x"]) | json_values,
                "cwd": st.just("/w") | json_values,
                "prompt": json_values,
                "cursor": json_values,
            },
        )
        | json_values,
        "result": json_values,
        "error": json_values,
    },
)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages | json_values, min_size=1, max_size=6))
def test_whatever_a_client_sends_every_message_back_is_json_rpc_and_each_request_is_answered_once(
    tmp_path_factory: pytest.TempPathFactory, sent: list[Any]
) -> None:
    tmp = tmp_path_factory.mktemp("acp")

    async def body(agent: AcpAgent, out: Outbox, threads: FakeThreads) -> None:
        await call(agent, out, "init", "initialize", {"protocolVersion": 1})
        for value in sent:
            await agent.message(value)
        await settle()
        # a request, or an invalid one whose id could be read
        ids = [m.id if isinstance(m, Request) else getattr(m, "answer_id", None) for m in map(jsonrpc.classify, sent)]
        asked = Counter(jsonrpc.id_key(i) for i in ids if i is not None)
        asked[jsonrpc.id_key("init")] += 1
        answered: Counter[Any] = Counter()
        for msg in out.sent:
            got = jsonrpc.classify(msg)
            assert isinstance(got, Request | Notification | Response), msg  # never an invalid message
            if isinstance(got, Response) and got.id is not None:
                answered[jsonrpc.id_key(got.id)] += 1
        # at most one answer per request, and none to what was not a request
        assert all(n <= asked[key] for key, n in answered.items()), (sent, out.sent)
        assert not out.failed

    run(tmp, body)
