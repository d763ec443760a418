"""One ACP session attached to a gateway connection (api/acp_agent.py): the thread's records
delivered as ``session/update``s, its permission requests asked of the client and their
answers run as commands, and the prompts waiting for their turn to end.

It is a fanout sink (sessions/fanout.py): ``deliver`` hands it the thread's records in
order, from the store first and then live, and it turns each into notifications through
the pure mapping of sessions/acp_session.py.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from bridge.api import acp_elicit
from bridge.api.acp_threads import AcpThread
from bridge.errors import BridgeError
from bridge.protocols import jsonrpc
from bridge.protocols.events import Record
from bridge.protocols.jsonrpc import RpcError
from bridge.sessions import acp_session as mapping
from bridge.sessions.commands import AnswerPermission
from bridge.sessions.fanout import Subscriber, deliver

if TYPE_CHECKING:
    from bridge.api.acp_agent import AcpAgent

log = structlog.get_logger("bridge.acp_gateway")

META = "agent-bridge"  # our key in ACP's _meta
PRIME_STEP = 64  # records read back at first to find where the message being streamed began
PRIME_MAX = 16384  # … and at most (a longer message than that gets a new id where the read began)


def meta(params: dict[str, Any]) -> dict[str, Any]:
    """``params._meta["agent-bridge"]``, or ``{}``."""
    outer = params.get("_meta")
    ours = outer.get(META) if isinstance(outer, dict) else None
    return ours if isinstance(ours, dict) else {}


class Attached:
    """One session (thread) attached to the connection: its subscriber, its mapper, the
    prompts waiting for their turn's end and the permission requests sent for it."""

    def __init__(self, agent: AcpAgent, thread: AcpThread) -> None:
        self.agent = agent
        self.thread = thread
        self.sub: Subscriber = thread.subscribe()
        self.mapper = mapping.UpdateMapper(thread.id)
        # What this client was last told of the thread's title and config options: a change
        # of the thread (api/acp_session_ops.py's watch) is sent when it differs.
        self.title: str | None = str(thread.row().get("title") or "") or None
        self.config: list[dict[str, Any]] | None = None
        self.by_client: dict[str, jsonrpc.Id] = {}  # client_id → the prompt's rpc id
        self.by_turn: dict[str, jsonrpc.Id] = {}  # turn_id → the prompt's rpc id
        self.asked: dict[str, jsonrpc.Id] = {}  # permission request id → our rpc id, still unanswered
        self.sent_asks: set[str] = set()  # permission requests ever sent on this attachment
        self.elicits = acp_elicit.Asked()  # its elicitations (api/acp_elicit.py)
        self.task: asyncio.Task[None] | None = None
        self.replay_frames = False  # fanout.Sink: records, never stored frames

    def prompts(self) -> list[jsonrpc.Id]:
        """The rpc ids of the prompts waiting for their turn's end."""
        return [*self.by_client.values(), *self.by_turn.values()]

    # -- fanout.Sink

    async def send(self, texts: list[str], records: list[Record]) -> None:
        # ``texts`` are the thread WebSocket's notices and answers: nothing of ACP's.
        for rec in records:
            await self.record(rec)

    async def send_frames(self, frames: list[bytes]) -> None:  # pragma: no cover - replay_frames is False
        raise AssertionError("the ACP gateway reads records")

    async def record(self, rec: Record) -> None:
        data = rec.data
        own = False
        if rec.kind == "message" and rec.source == "client":
            cid = data.get("client_id")
            if isinstance(cid, str) and cid in self.by_client and isinstance(data.get("turn_id"), str):
                self.by_turn[data["turn_id"]] = self.by_client.pop(cid)
                own = True
        for update in self.mapper.updates(rec, own_prompt=own):
            params = {"sessionId": self.thread.id, "update": update, "_meta": {META: {"seq": rec.seq}}}
            await self.agent.notify("session/update", params)
        if rec.kind == "turn.ended":
            await self._turn_ended(data)
        elif rec.kind == "permission.requested":
            await self.ask(data)
        elif rec.kind == "permission.resolved":
            await self._resolved(data)
        elif rec.kind in acp_elicit.KINDS:
            await acp_elicit.on_record(self, rec)

    async def _turn_ended(self, data: dict[str, Any]) -> None:
        turn_id = data.get("turn_id")
        rpc_id = self.by_turn.pop(turn_id, None) if isinstance(turn_id, str) else None
        if rpc_id is None:
            return
        await self.agent.answer_turn(rpc_id, data)

    # -- permission requests

    async def ask(self, data: dict[str, Any]) -> None:
        """``session/request_permission`` for a request that is still pending, once."""
        rid = data.get("request_id")
        if not isinstance(rid, str) or rid in self.sent_asks or not self.thread.is_pending(rid):
            return
        self.sent_asks.add(rid)
        rpc_id = await self.agent.request(
            "session/request_permission", mapping.permission_request(self.thread.id, data), (self, rid, data)
        )
        if rpc_id is not None:
            self.asked[rid] = rpc_id

    async def _resolved(self, data: dict[str, Any]) -> None:
        """Answered elsewhere (another client, a timeout, the agent): the request this
        client still shows is cancelled (``$/cancel_request``, ACP's request cancellation)."""
        rid = data.get("request_id")
        if not isinstance(rid, str):
            return
        self.sent_asks.discard(rid)  # resolved: never pending again, so never asked again
        rpc_id = self.asked.pop(rid, None)
        if rpc_id is not None:
            self.agent.forget(rpc_id)
            await self.agent.notify("$/cancel_request", {"requestId": rpc_id})

    async def withdraw(self) -> None:
        """Every permission request this client still has is withdrawn (``$/cancel_request``):
        the session left the connection, or its thread went."""
        for rid, rpc_id in list(self.asked.items()):
            self.asked.pop(rid, None)
            self.agent.forget(rpc_id)
            await self.agent.notify("$/cancel_request", {"requestId": rpc_id})
        await acp_elicit.withdraw_all(self)

    async def answered(self, rid: str, data: dict[str, Any], result: Any, error: RpcError | None) -> None:
        """The client's answer to our ``session/request_permission`` (an error is a denial)."""
        if acp_elicit.ours(rid):  # or to our elicitation/create
            return await acp_elicit.answered(self, rid, data, result, error)
        self.asked.pop(rid, None)
        answer = mapping.permission_answer(data, result) if error is None else ("deny", None)
        if answer is None:
            log.info("acp.permission_answer_ignored", thread_id=self.thread.id, request_id=rid)
            return
        decision, option_id = answer
        command = AnswerPermission(
            request_id=rid, decision=decision, channel="acp", option_id=option_id, actor=self.agent.user.name
        )
        try:
            await self.thread.run(command)
        except BridgeError as exc:
            log.info("acp.permission_answer_refused", thread_id=self.thread.id, request_id=rid, code=exc.code)

    async def ask_pending(self) -> None:
        for view in self.thread.pending_permissions():
            await self.ask(view)
        await acp_elicit.ask_pending(self)

    # -- the transcript

    async def prime(self, before: int) -> None:
        """The mapper takes in the records from the last one after which nothing earlier
        matters (acp_session.resets) up to ``before``: a session attached in the middle of
        a message gives its chunks the message id its start had. Read back in growing
        windows, at most PRIME_MAX records."""
        span = PRIME_STEP
        while before > 0:
            low = max(0, before - span)
            records = await self._between(low, before)
            starts = [i for i, rec in enumerate(records) if mapping.resets(rec)]
            if starts or low == 0 or span >= PRIME_MAX:
                self.mapper.prime(records[starts[-1] :] if starts else records)
                return
            span *= 4

    async def _between(self, low: int, high: int) -> list[Record]:
        """The records with ``low < seq <= high``."""
        out: list[Record] = []
        cursor = low
        while cursor < high:
            page = await self.thread.read_page(cursor, min(high - cursor, PRIME_MAX))
            out += [r for r in page if r.seq <= high]
            if not page or not page.more or page[-1].seq >= high:
                break
            cursor = page[-1].seq
        return out

    async def replay(self, after: int, page: int) -> int:
        """Every record after ``after`` as updates (session/load); the seq reached."""
        cursor = after
        while True:
            records = await self.thread.read_page(cursor, page)
            for rec in records:
                await self.record(rec)
            if records:
                cursor = records[-1].seq
            if not records.more:  # (not a short page: pages also stop at a few MiB)
                return cursor

    async def answer_again(self, rpc_id: jsonrpc.Id, seq: int, page: int) -> None:
        """A prompt sent again (the relay reconnected; its record is at ``seq``): answered
        from the transcript if its turn already ended, else when it ends."""
        first = await self.thread.read_page(seq - 1, 1)
        turn_id = first[0].data.get("turn_id") if first else None
        if not isinstance(turn_id, str):
            raise RpcError.internal("the prompt's turn is not in the transcript")
        self.by_turn[turn_id] = rpc_id
        cursor = seq
        while self.by_turn.get(turn_id) == rpc_id:
            records = await self.thread.read_page(cursor, page)
            for rec in records:
                if rec.kind == "turn.ended" and rec.data.get("turn_id") == turn_id and self.by_turn.pop(turn_id, None):
                    await self.agent.answer_turn(rpc_id, rec.data)
                    return
            if not records.more:
                return
            cursor = records[-1].seq

    # -- life

    def start(self, after: int) -> None:
        self.task = asyncio.create_task(self._run(after))

    async def _run(self, after: int) -> None:
        try:
            why = await deliver(self.sub, after, self.thread, self)
        except Exception as exc:  # a client that does not read (send deadline), or a dead socket
            log.info("acp.session_send_failed", thread_id=self.thread.id, error=type(exc).__name__)
            self.agent.out.fail()
            return
        await self.agent.session_closed(self, why or "closed")

    def detach(self, *, cancel: bool = True) -> None:
        """Unsubscribed; its delivery task cancelled unless it is the caller."""
        self.thread.unsubscribe(self.sub)
        if cancel and self.task is not None:
            self.task.cancel()
