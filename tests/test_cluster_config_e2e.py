"""A session config option set on the replica that does not run the thread's agent
(docs/api.md §4.21, §6): the switch reaches the holder through the bus, the holder's agent
switches, and its answer — the full list, or the agent's refusal — comes back to the client
that asked. Two daemons sharing one PostgreSQL and one Redis, an ACP fake agent with config
options."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import Daemon, new_thread
from test_acp_e2e import FAKE_ACP, acp_profile
from test_cluster_e2e import get, metric, replica_pair

from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
async def pair(pg_url: str, redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[tuple[Daemon, Daemon]]:
    marker = str(tmp_path / "agent.log")
    agent = acp_profile("cfg", {"FAKE_AGENT_LOG": marker}, "--config-options")
    shared = {"AGENT_BRIDGE_STORE_URL": pg_url, "AGENT_BRIDGE_BUS_URL": redis_server.url}
    async with replica_pair(tmp_path, shared, agent, "stop_grace_s = 2\n", marker, str(FAKE_ACP)) as both:
        yield both


async def test_set_config_option_on_the_other_replica_is_run_by_the_holder(pair: tuple[Daemon, Daemon]) -> None:
    a, b = pair
    tid = (await new_thread(a, "cfg", title="shared"))["id"]
    on_a = await a.ws(tid)
    await on_a.turn("hello")  # A runs the agent now, and holds the lease
    async with b.http() as http:
        r = await http.post(f"/v1/threads/{tid}/config", json={"config_id": "model", "value": "deep"})
        assert r.status_code == 200, r.text
        assert r.json()["config_id"] == "model" and r.json()["config_options"][1]["currentValue"] == "deep"
        refused = await http.post(f"/v1/threads/{tid}/config", json={"config_id": "nope", "value": "x"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "config_refused", refused.text
    assert await metric(b, "agent_bridge_forwarded_total") >= 2
    end = await on_a.turn("whatconfig")  # the holder's agent itself uses the deep model now
    assert end["data"]["status"] == "success"
    said = [f["data"]["text"] for f in on_a.seen("message.delta")]
    assert said[-1] == "config: model=deep mode=default"
    row = await get(b, f"/v1/threads/{tid}")
    assert row["agent_info"]["config_options"][1]["currentValue"] == "deep"
