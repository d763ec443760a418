"""The Python twin of acp_sdk_client.mjs: the same plan of steps run with the official
Python SDK (agent-client-protocol), giving the same report, so that one test holds both
SDKs to the same expectations (tests/test_acp_sdk_clients_e2e.py).

    python acp_sdk_client.py PLAN.json      (or ``await run(plan)`` in a test)

Every message the gateway sends is validated against the SDK's pydantic models
(support/acp_client.Validator); what does not fit lands in the report's ``problems``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import acp
from acp import schema
from acp.stdio import spawn_agent_process
from acp.ws import create_websocket_stream
from pydantic import TypeAdapter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from support.acp_client import Validator

STEP_S = 30.0


class Client:
    """The SDK's ``Client`` side, answering as the current step's ``answer`` says."""

    def __init__(self, report: dict[str, Any], changed: Callable[[], None]) -> None:
        self.report = report
        self.policy: dict[str, Any] = {"permission": "allow", "elicitation": "decline"}
        # Answers held back ("never"): left unanswered; closing the connection ends them
        # (an answer released then would race the transport's close).
        self.held: list[asyncio.Future[None]] = []
        self._changed = changed

    async def _held(self) -> None:
        f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append(f)
        await f

    async def request_permission(self, session_id: str, tool_call: Any, options: Any, **kw: Any) -> Any:
        self.report["asks"].append(
            {
                "sessionId": session_id,
                "toolCall": tool_call.model_dump(by_alias=True, exclude_none=True),
                "options": [o.model_dump(by_alias=True, exclude_none=True) for o in options],
            }
        )
        want = self.policy["permission"]
        outcome: dict[str, Any] = {"outcome": "cancelled"}
        if want == "never":
            await self._held()
        elif want in ("allow", "reject"):
            kind = "allow_once" if want == "allow" else "reject_once"
            option = next((o for o in options if o.kind == kind), options[0])
            outcome = {"outcome": "selected", "optionId": option.option_id}
        return schema.RequestPermissionResponse.model_validate({"outcome": outcome})

    async def create_elicitation(self, message: str, mode: Any, **kw: Any) -> Any:
        self.report["elicitations"].append({"message": message, "mode": mode.model_dump(by_alias=True)})
        want = self.policy["elicitation"]
        if want == "never":
            await self._held()
            want = "cancel"
        answer = {"action": want} if isinstance(want, str) else {"action": "accept", "content": want}
        return TypeAdapter(schema.CreateElicitationResponse).validate_python(answer)

    async def complete_elicitation(self, elicitation_id: str, **kw: Any) -> None:
        pass

    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        self._changed()

    async def write_text_file(self, *a: Any, **kw: Any) -> Any:
        raise acp.RequestError.method_not_found("fs/write_text_file")

    async def read_text_file(self, *a: Any, **kw: Any) -> Any:
        raise acp.RequestError.method_not_found("fs/read_text_file")

    def on_connect(self, conn: Any) -> None:
        pass


def _substitute(value: Any, saved: dict[str, Any]) -> Any:
    if isinstance(value, str) and value.startswith("$"):
        return saved[value[1:]]
    if isinstance(value, list):
        return [_substitute(v, saved) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, saved) for k, v in value.items()}
    return value


def _dig(value: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else value[int(key)] if isinstance(value, list) else None
    return value


class Runner:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.report: dict[str, Any] = {"results": [], "received": [], "problems": [], "asks": [], "elicitations": []}
        self.saved: dict[str, Any] = {}
        self.validators: list[Validator] = []
        self.running: dict[str, asyncio.Future[Any]] = {}
        self.sent_at: dict[str, tuple[Validator, int]] = {}  # a started request: where it was sent
        self._arrived = asyncio.Event()
        self.client = Client(self.report, self._poke)

    def _poke(self) -> None:
        self._arrived.set()
        self._arrived = asyncio.Event()

    def _received(self) -> list[dict[str, Any]]:
        return [m for v in self.validators for m in v.received]

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        t = self.plan["transport"]
        validator = Validator()
        self.validators.append(validator)
        observe = [validator, lambda event: self._poke()]
        if t["kind"] == "ws":
            headers = {"Authorization": f"Bearer {t['token']}"}
            transport = await asyncio.wait_for(create_websocket_stream(t["url"], headers=headers), STEP_S)
            conn = acp.connect_to_agent(self.client, transport, observers=observe, use_unstable_protocol=True)  # type: ignore[arg-type]
            try:
                yield conn
            finally:
                await asyncio.wait_for(conn.close(), STEP_S)
        else:
            cmd, *args = t["command"]
            async with spawn_agent_process(
                self.client,  # type: ignore[arg-type]
                cmd,
                *args,
                env=t.get("env"),
                observers=observe,
                use_unstable_protocol=True,
            ) as (conn, proc):
                yield conn
                proc.stdin.close()
                await asyncio.wait_for(proc.wait(), STEP_S)

    async def _settle(self, pending: Any) -> dict[str, Any]:
        try:
            return {"result": await asyncio.wait_for(pending, STEP_S)}
        except acp.RequestError as exc:
            return {"error": {"code": exc.code, "message": str(exc), "data": exc.data}}

    async def step(self, conn: Any, step: dict[str, Any]) -> dict[str, Any]:
        op = step["op"]
        params = _substitute(step.get("params", {}), self.saved)
        if op == "request":
            return await self._settle(conn._conn.send_request(step["method"], params))
        if op == "notify":
            await conn._conn.send_notification(step["method"], params)
            return {}
        if op == "start":
            self.sent_at[step["id"]] = (self.validators[-1], len(self.validators[-1].sent))
            self.running[step["id"]] = asyncio.ensure_future(conn._conn.send_request(step["method"], params))
            return {}
        if op == "cancel_request":  # for a started request, by the JSON-RPC id it went out with
            validator, at = self.sent_at[step["id"]]
            await conn._conn.send_notification("$/cancel_request", {"requestId": list(validator.sent)[at]})
            return {}
        if op == "finish":
            return await self._settle(self.running.pop(step["id"]))
        if op == "until":

            def seen() -> int:
                return sum(
                    1
                    for m in self._received()
                    if m.get("method") == "session/update" and m["params"]["update"]["sessionUpdate"] == step["kind"]
                )

            async with asyncio.timeout(STEP_S):
                while seen() < step["count"]:
                    await self._arrived.wait()
            return {}
        raise ValueError(f"unknown op {op}")

    async def run(self) -> dict[str, Any]:
        steps = list(self.plan["steps"])
        while steps:
            async with self.connection() as conn:
                while steps:
                    step = steps.pop(0)
                    if step["op"] == "reconnect":
                        self.report["results"].append({"updates": []})
                        break
                    self.client.policy.update(step.get("answer", {}))
                    start = len(self._received())
                    out = await self.step(conn, step)
                    out["updates"] = [
                        m["params"] for m in self._received()[start:] if m.get("method") == "session/update"
                    ]
                    for name, dotted in step.get("save", {}).items():
                        self.saved[name] = _dig(out, dotted)
                    self.report["results"].append(out)
        self.report["received"] = self._received()
        self.report["problems"] = [p for v in self.validators for p in v.problems]
        return self.report


async def run(plan: dict[str, Any]) -> dict[str, Any]:
    return await Runner(plan).run()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(json.loads(Path(sys.argv[1]).read_text())))))
