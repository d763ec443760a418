"""Web Push end to end (issue #39): a real daemon, real agents, and a loopback push service
(tests/support/push_service.py) that verifies each push's VAPID token against the key the
daemon serves and decrypts its body with the key of a browser the test made. Also: gone
subscriptions removed, retries bounded, users' browsers kept apart, no push while a page
has the thread open, and hostile subscriptions refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import STEP_TIMEOUT, Daemon, base_config, new_thread, profile_toml, wait_until
from support.push_service import PushService, b64u
from test_users_e2e import add_user, bearer

pytestmark = pytest.mark.timeout(90)
ALLOW = "\n[push]\nallow_private_endpoints = true\n"


def cfg(agent_env: dict[str, str], push: str = ALLOW) -> str:
    return "[server]\nstop_grace_s = 1\n" + profile_toml("sj", "stream-json", agent_env, permission_prompts=True) + push


async def subscribe(http: httpx.AsyncClient, browser: Any, **headers: str) -> dict[str, Any]:
    r = await http.post("/v1/me/push-subscriptions", json=browser.subscription(), headers=headers)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def listed(http: httpx.AsyncClient, **headers: str) -> dict[str, Any]:
    r = await http.get("/v1/me/push-subscriptions", headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_a_permission_and_a_turn_end_are_pushed_signed_and_encrypted(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    with PushService() as service:
        d = await daemon_factory(cfg(agent_env))
        phone = service.browser("phone")
        async with d.http() as http:
            first = await listed(http)
            assert first["subscriptions"] == [] and len(first["vapid_public_key"]) == 87
            sub = await subscribe(http, phone)
            assert sub["origin"] == service.origin and sub["last_outcome"] is None
            assert phone.endpoint not in json.dumps(sub)  # only its origin is shown
            thread = await new_thread(d, "sj", title="Fix the build")
            c = await d.ws(thread["id"])  # a client with the token: not a page
            await c.prompt("ask")
            rid = (await c.kind("permission.requested"))["data"]["request_id"]
            await wait_until(lambda: len(service.to(phone)) == 1, what="the permission's push")
            push = service.to(phone)[0]
            assert service.errors == []
            assert push.vapid_key == first["vapid_public_key"]
            assert push.payload == {
                "v": 1,
                "thread_id": thread["id"],
                "kind": "permission",
                "title": "Fix the build",
                "line": "Permission waiting: Bash",
                "request_id": rid,
            }
            assert push.headers["urgency"] == "high" and int(push.headers["ttl"]) <= 600
            assert "touch x" not in json.dumps(push.payload)  # no tool input
            r = await http.post(f"/v1/threads/{thread['id']}/permissions/{rid}", json={"decision": "allow"})
            assert r.status_code == 200
            await c.kind("turn.ended")
            await wait_until(lambda: len(service.to(phone)) == 2, what="the turn's push")
            assert service.to(phone)[1].payload == {
                "v": 1,
                "thread_id": thread["id"],
                "kind": "turn_ended",
                "title": "Fix the build",
                "line": "Turn ended",
            }
            assert service.errors == []

            async def delivered() -> dict[str, Any]:
                return dict((await listed(http))["subscriptions"][0])

            shown: dict[str, Any] = {}

            async def poll() -> bool:
                shown.update(await delivered())
                return shown["last_outcome"] == "delivered"

            await wait_for(poll)
            assert shown["last_status"] == 201 and shown["last_at"].endswith("Z")
            metrics = (await http.get("/metrics")).text
            assert 'agent_bridge_push_total{outcome="delivered"} 2' in metrics
            assert (await http.delete(f"/v1/me/push-subscriptions/{sub['id']}")).status_code == 204
            assert (await http.delete(f"/v1/me/push-subscriptions/{sub['id']}")).status_code == 404
            assert (await listed(http))["subscriptions"] == []
    # Nothing of a subscription's endpoint path or keys in the daemon's log.
    log = d.stderr()
    assert phone.endpoint.rsplit("/", 1)[1] not in log and b64u(phone.auth) not in log
    assert "push.sent" in log


async def wait_for(check: Any, timeout: float = STEP_TIMEOUT) -> None:
    """Until ``await check()`` holds (a state read over HTTP), within ``timeout``."""
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 (a state read over HTTP: no event to wait on)
            await asyncio.sleep(0.05)


async def test_a_gone_subscription_is_removed_and_retries_are_bounded(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    with PushService() as service:
        d = await daemon_factory(cfg(agent_env))
        gone, busy, flaky = service.browser("gone"), service.browser("busy"), service.browser("flaky")
        service.answers[gone.endpoint.removeprefix(service.origin)] = [(410, {})]
        service.answers[busy.endpoint.removeprefix(service.origin)] = [(503, {"Retry-After": "0"})]
        service.answers[flaky.endpoint.removeprefix(service.origin)] = [(429, {"Retry-After": "0"}), (201, {})]
        async with d.http() as http:
            for b in (gone, busy, flaky):
                await subscribe(http, b)
            thread = await new_thread(d, "sj")
            c = await d.ws(thread["id"])
            await c.turn("hello")
            await wait_until(
                lambda: len(service.to(gone)) == 1 and len(service.to(busy)) == 4 and len(service.to(flaky)) == 2,
                what="every delivery to end",
            )
            assert service.errors == []
            seen: dict[str, Any] = {}

            async def settled() -> bool:
                seen.clear()
                seen.update({s["origin"] + s["id"]: s for s in (await listed(http))["subscriptions"]})
                outcomes = sorted(s["last_outcome"] or "" for s in seen.values())
                return outcomes == ["delivered", "failed"]

            await wait_for(settled)  # the gone one removed; the busy one given up after 4 tries
            assert sorted((s["last_outcome"], s["last_status"]) for s in seen.values()) == [
                ("delivered", 201),
                ("failed", 503),
            ]
            metrics = (await http.get("/metrics")).text
            assert 'agent_bridge_push_total{outcome="gone"} 1' in metrics
            assert "agent_bridge_push_retried_total 4" in metrics  # 3 for busy, 1 for flaky


async def test_no_push_while_a_page_of_the_owner_has_the_thread_open(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    with PushService() as service:
        d: Daemon = await daemon_factory(cfg(agent_env))
        laptop = service.browser("laptop")
        async with d.http() as http:
            await subscribe(http, laptop)
            thread = await new_thread(d, "sj")
            r = await http.post("/v1/session")
            assert r.status_code == 204
            cookie = r.headers["set-cookie"].split(";", 1)[0]
        page = await websockets.connect(
            f"{d.ws_url}/v1/threads/{thread['id']}/ws",
            additional_headers={"Cookie": cookie, "Origin": d.url},
            open_timeout=STEP_TIMEOUT,
        )
        try:
            await page.send(json.dumps({"op": "prompt", "text": "hello"}))
            async with asyncio.timeout(STEP_TIMEOUT):
                while json.loads(await page.recv()).get("kind") != "turn.ended":
                    pass
            async with d.http() as http:
                metrics = (await http.get("/metrics")).text
            assert "agent_bridge_push_suppressed_total 1" in metrics
        finally:
            await page.close()
        c = await d.ws(thread["id"])  # the page closed; a token client does not count
        await c.turn("again")
        await wait_until(lambda: len(service.to(laptop)) == 1, what="the second turn's push")
        assert service.to(laptop)[0].payload is not None and service.to(laptop)[0].payload["kind"] == "turn_ended"
        assert service.errors == []


async def test_users_are_told_only_of_their_own_threads(
    daemon_factory: Any, agent_env: dict[str, str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    config = cfg(agent_env) + '\n[auth]\nmode = "users"\n' + f"\n[store]\nurl = {json.dumps(url)}\n"
    with PushService() as service:
        d: Daemon = await daemon_factory(config, token=None)
        alice, bob, root = [await add_user(url, n, admin=(n == "root")) for n in ("alice", "bob", "root")]
        a_phone, b_phone, r_phone = service.browser("alice"), service.browser("bob"), service.browser("root")
        async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
            for token, b in ((alice, a_phone), (bob, b_phone), (root, r_phone)):
                await subscribe(http, b, **bearer(token))
            assert len((await listed(http, **bearer(alice)))["subscriptions"]) == 1
            mine = (await listed(http, **bearer(bob)))["subscriptions"][0]["id"]
            r = await http.delete(f"/v1/me/push-subscriptions/{mine}", headers=bearer(alice))
            assert r.status_code == 404  # not alice's to remove
            r = await http.post("/v1/threads", json={"agent": "sj"}, headers=bearer(alice))
            assert r.status_code == 201, r.text
            tid = r.json()["id"]
            r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "hello"}, headers=bearer(alice))
            assert r.status_code in (200, 202), r.text
        await wait_until(lambda: len(service.to(a_phone)) == 1, what="alice's push")
        assert service.to(a_phone)[0].payload is not None and service.to(a_phone)[0].payload["thread_id"] == tid
        assert service.to(b_phone) == [] and service.to(r_phone) == []  # not bob's, not the admin's
        assert service.errors == []


BAD = [
    ({"endpoint": "http://push.example/x"}, 400, "invalid_subscription"),
    ({"endpoint": "https://user:pw@push.example/x"}, 400, "invalid_subscription"),
    ({"endpoint": "https://push.example/x#frag"}, 400, "invalid_subscription"),
    ({"endpoint": "ftp://push.example/x"}, 400, "invalid_subscription"),
    ({"endpoint": "https:///x"}, 400, "invalid_subscription"),
    ({"endpoint": "https://push.example/" + "a" * 2100}, 400, "invalid_request"),
    ({"endpoint": "https://push.example/\u00e9"}, 400, "invalid_subscription"),
    ({"keys": {"p256dh": b64u(b"\x04" + b"\x01" * 64), "auth": b64u(b"a" * 16)}}, 400, "invalid_subscription"),
    ({"keys": {"p256dh": "x" * 87, "auth": b64u(b"a" * 15)}}, 400, "invalid_subscription"),
    ({"keys": {"p256dh": "%%%", "auth": "!!"}}, 400, "invalid_subscription"),
    ({"extra": 1}, 400, "invalid_request"),
    ({"endpoint": "https://127.0.0.1/x"}, 422, "push_endpoint_refused"),
    ({"endpoint": "https://10.1.2.3/x"}, 422, "push_endpoint_refused"),
    ({"endpoint": "https://169.254.169.254/latest"}, 422, "push_endpoint_refused"),
    ({"endpoint": "https://[::1]/x"}, 422, "push_endpoint_refused"),
    ({"endpoint": "https://[::ffff:192.168.0.1]/x"}, 422, "push_endpoint_refused"),
    ({"endpoint": "https://localhost/x"}, 422, "push_endpoint_refused"),
    ({"endpoint": "https://0.0.0.0/x"}, 422, "push_endpoint_refused"),
]


async def test_hostile_subscriptions_are_refused(daemon_factory: Any, agent_env: dict[str, str]) -> None:
    with PushService() as service:
        d = await daemon_factory(cfg(agent_env, push=""))  # the default: no private endpoints
        good = service.browser("x").subscription()
        async with d.http() as http:
            for change, status, code in BAD:
                body = {**good, "endpoint": "https://push.example/ok", **change}
                r = await http.post("/v1/me/push-subscriptions", json=body)
                assert (r.status_code, r.json()["error"]["code"]) == (status, code), (change, r.text)
            # The loopback service itself, without allow_private_endpoints.
            r = await http.post("/v1/me/push-subscriptions", json=good)
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_subscription")
            assert (await listed(http))["subscriptions"] == []


async def test_push_off_refuses_subscriptions(daemon_factory: Any, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(cfg(agent_env, push="\n[push]\nenabled = false\n"))
    async with d.http() as http:
        r = await http.get("/v1/me/push-subscriptions")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "push_disabled")
    assert not (d.data_dir / "vapid.pem").exists()


async def test_the_vapid_key_is_made_once_private(
    daemon_factory: Any, agent_env: dict[str, str], tmp_path: Path
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env) + ALLOW)
    async with d.http() as http:
        key = (await listed(http))["vapid_public_key"]
    pem = d.data_dir / "vapid.pem"
    assert pem.stat().st_mode & 0o777 == 0o600
    await d.stop()
    await d.start()
    async with d.http() as http:
        assert (await listed(http))["vapid_public_key"] == key


async def test_a_question_is_pushed_and_an_interrupted_turn_is_not(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    with PushService() as service:
        d = await daemon_factory(cfg(agent_env))
        tablet = service.browser("tablet")
        async with d.http() as http:
            await subscribe(http, tablet)
        thread = await new_thread(d, "sj", title="Ask me")
        c = await d.ws(thread["id"])
        acc = await c.prompt("elicit")
        await c.kind("elicitation.requested")
        await wait_until(lambda: len(service.to(tablet)) == 1, what="the question's push")
        assert service.to(tablet)[0].payload == {
            "v": 1,
            "thread_id": thread["id"],
            "kind": "elicitation",
            "title": "Ask me",
            "line": "The agent asks you something",
        }
        await c.send(op="interrupt")  # the user stopped it: a cancelled turn tells nobody
        await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
        await c.turn("hello")  # the next turn's end is pushed, and only it
        await wait_until(lambda: len(service.to(tablet)) == 2, what="the next turn's push")
        assert [p.payload["kind"] for p in service.to(tablet) if p.payload] == ["elicitation", "turn_ended"]
        assert service.errors == []
