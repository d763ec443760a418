"""The top-level Dockerfile, built with podman from a locally made Debian base
(imagebuild.py) and run for real: health, auth token, a demo chat through REST, a non-root
daemon under an init, ``podman healthcheck run``, a clean SIGTERM stop, and the
transcript and the agent's own session surviving a new container on the same volumes."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import imagebuild
import pytest

ROOT = Path(__file__).resolve().parents[2]
TAG = "localhost/agent-bridge:ci"
UID = 10001
STEP_S = 30.0

pytestmark = [
    pytest.mark.timeout(1800),  # cold: debootstrap, import, build (each bounded below)
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in imagebuild.TOOLS),
        reason=f"needs the Debian packages {', '.join(imagebuild.TOOLS)} (scripts/test installs them)",
    ),
]

_names = count()


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[imagebuild.Podman, float]]:
    pm = imagebuild.setup()
    imagebuild.base_image(pm)
    seconds = imagebuild.build(pm, ROOT, TAG)
    print(f"\nimage build: {seconds:.1f} s ({imagebuild.storage_driver()} storage)")
    yield pm, seconds


class Container:
    """One ``podman run -d`` of the image with the port published on loopback; removed
    (with nothing else) on close."""

    def __init__(self, pm: imagebuild.Podman, volumes: dict[str, str], env: dict[str, str], image: str = TAG) -> None:
        self.pm = pm
        self.name = f"agent-bridge-ci-{next(_names)}-{time.monotonic_ns()}"
        # As the Kubernetes manifests run it: read-only root (podman adds tmpfs /tmp),
        # no capabilities, no privilege gain.
        args = ["run", "-d", "--name", self.name, "-p", "127.0.0.1::8765", "--read-only"]
        args += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        for vol, target in volumes.items():
            args += ["-v", f"{vol}:{target}"]
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        pm.run(*args, image, timeout=60)
        port = pm.run("port", self.name, "8765/tcp").stdout.strip().rsplit(":", 1)[1]
        self.url = f"http://127.0.0.1:{port}"

    def logs(self) -> str:
        p = self.pm.run("logs", self.name, check=False)
        return p.stdout + p.stderr

    def exec(self, *argv: str) -> str:
        return self.pm.run("exec", self.name, *argv).stdout

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STEP_S
        while True:
            try:
                r = httpx.get(f"{self.url}/healthz", timeout=2)
                if r.status_code == 200:
                    assert r.json() == {"status": "ok"}
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"/healthz never answered:\n{self.logs()}")
            time.sleep(0.2)

    def state(self) -> str:
        return self.pm.run("inspect", "--format", "{{.State.Status}}", self.name).stdout.strip()

    def close(self) -> None:
        # -v: the anonymous volumes the image's VOLUMEs got (named ones stay).
        self.pm.run("rm", "-f", "-v", "-t", "0", self.name, check=False, timeout=60)


@pytest.fixture
def volumes(image: tuple[imagebuild.Podman, float]) -> Iterator[dict[str, str]]:
    pm, _ = image
    tag = f"{next(_names)}-{time.monotonic_ns()}"
    vols = {f"agent-bridge-ci-data-{tag}": "/data", f"agent-bridge-ci-home-{tag}": "/home/agent-bridge"}
    for v in vols:
        pm.run("volume", "create", v)
    yield vols
    for v in vols:
        pm.run("volume", "rm", "-f", v, check=False)


def chat(http: httpx.Client, thread: str, text: str) -> list[dict[str, Any]]:
    """Send a prompt and long-poll the transcript until its turn ends; the turn's events."""
    r = http.post(f"/v1/threads/{thread}/messages", json={"text": text})
    assert r.status_code == 202, r.text
    seq = r.json()["seq"]
    events: list[dict[str, Any]] = []
    after = seq
    deadline = time.monotonic() + STEP_S
    while not any(e["kind"] == "turn.ended" for e in events):
        assert time.monotonic() < deadline, f"no turn.ended: {events}"
        page = http.get(f"/v1/threads/{thread}/events", params={"after": after, "wait": 5}).json()
        events += page["events"]
        # The cursor is the last event received: last_seq is the thread's, which may
        # already count events committed after this page was read.
        after = page["events"][-1]["seq"] if page["events"] else after
    return events


def reply_text(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["data"].get("text", "")
        for e in events
        if e["kind"] == "message" and e["data"].get("role") == "assistant" and e["source"] == "agent"
    )


def stop(c: Container) -> float:
    start = time.monotonic()
    c.pm.run("stop", "--time", "15", c.name, timeout=40)
    took = time.monotonic() - start
    code = c.pm.run("inspect", "--format", "{{.State.ExitCode}}", c.name).stdout.strip()
    assert code == "0", f"exit code {code} after SIGTERM (137 would be SIGKILL):\n{c.logs()}"
    return took


def test_image_serves_a_demo_chat_as_non_root_and_stops_cleanly(
    image: tuple[imagebuild.Podman, float], volumes: dict[str, str]
) -> None:
    pm, _ = image
    # Published on another port than the one bound inside: with allowed_hosts set, the
    # names clients use (here 127.0.0.1 on any port) must be in it.
    env = {"AGENT_BRIDGE_ALLOWED_HOSTS": "bridge.example,127.0.0.1"}
    c = Container(pm, volumes, env)
    try:
        c.wait_healthy()
        # PID 1 is the init (tini); the daemon its child, neither root.
        assert c.exec("cat", "/proc/1/comm").strip() == "tini"
        statuses = c.exec("sh", "-c", "grep -H '^Uid:' /proc/[0-9]*/status")
        uids = {line.split()[1] for line in statuses.splitlines()}
        assert uids == {str(UID)}, statuses
        # The token: generated into the data volume, and the log says how to read it.
        logs = c.logs()
        assert "auth.token" in logs and "source=generated" in logs and "cat /data/token" in logs, logs
        token = c.exec("cat", "/data/token").strip()
        assert len(token) >= 32 and token not in logs
        assert c.exec("stat", "-c", "%a %u", "/data/token").strip() == f"600 {UID}"
        assert httpx.get(f"{c.url}/v1/agents", timeout=5).status_code == 401

        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=c.url, headers=auth, timeout=STEP_S) as http:
            # allowed_hosts from the env twin: a published name is served, others are not.
            assert http.get("/v1/agents", headers={"Host": "bridge.example"}).status_code == 200
            r = http.get("/v1/agents", headers={"Host": "elsewhere.example"})
            assert r.status_code == 421, r.text
            # Agents run confined in the image, unprivileged (docs/deploy.md "Confinement").
            daemon = http.get("/v1/daemon").json()
            assert daemon["sandbox"] == "landlock", daemon
            r = http.post("/v1/threads", json={"agent": "demo", "title": "in a container"})
            assert r.status_code == 201, r.text
            thread = r.json()["id"]
            turn = chat(http, thread, "hello from the container test")
            assert "hello from the container test" in reply_text(turn), turn
            before = http.get(f"/v1/threads/{thread}/events", params={"after": 0, "limit": 1000}).json()["events"]
            assert http.get("/readyz").status_code == 200

        rss = c.exec("sh", "-c", "grep -h VmRSS /proc/[0-9]*/status")
        print(f"\nRSS in the container (tini, daemon[, demo agent]): {' | '.join(rss.split(chr(10)))}")

        hc = pm.run("healthcheck", "run", c.name, check=False)
        assert hc.returncode == 0 and "unhealthy" not in hc.stdout, (hc.stdout, hc.stderr)

        took = stop(c)
        assert took < 15, f"SIGTERM took {took:.1f} s"
        assert "daemon.stopped" in c.logs()
    finally:
        c.close()

    # A new container on the same volumes: same token, the transcript intact, and the
    # agent resumes its own session (its history lives in the data volume).
    c = Container(pm, volumes, {})
    try:
        c.wait_healthy()
        assert "source=file" in c.logs()
        assert c.exec("cat", "/data/token").strip() == token
        with httpx.Client(base_url=c.url, headers=auth, timeout=STEP_S) as http:
            after = http.get(f"/v1/threads/{thread}/events", params={"after": 0, "limit": 1000}).json()["events"]
            assert after[: len(before)] == before
            # What SIGTERM added: the agent closed by the daemon, not killed.
            added = after[len(before) :]
            assert [e["kind"] for e in added] == ["process.exited"], added
            assert added[0]["data"]["reason"] == "daemon_shutdown" and added[0]["data"]["signal"] is None, added
            turn = chat(http, thread, "what did I say?")
            assert "hello from the container test" in reply_text(turn), turn
        assert stop(c) < 15
    finally:
        c.close()


def test_image_metadata(image: tuple[imagebuild.Podman, float]) -> None:
    pm, _ = image
    fmt = "{{json .Config.User}} {{json .Config.Volumes}} {{json .Config.Entrypoint}} {{json .Config.Healthcheck}}"
    out = pm.run("image", "inspect", "--format", fmt, TAG).stdout
    assert f'"{UID}:{UID}"' in out
    assert '"/data"' in out and '"/home/agent-bridge"' in out
    assert '["/usr/bin/tini","--","agent-bridge"]' in out.replace(" ", "")
    assert re.search(r"healthz", out), out


def test_agent_clis_build_argument_adds_node_and_the_cli(image: tuple[imagebuild.Podman, float]) -> None:
    """AGENT_CLIS: Node.js from Debian and the pinned Claude Code from npm; the daemon finds
    it on PATH and it runs as the image's user."""
    pm, _ = image
    pins = (ROOT / "tests/real/npm-pins.txt").read_text().split()
    (claude,) = [p for p in pins if p.startswith("@anthropic-ai/claude-code@")]
    tag = f"{TAG}-clis"
    seconds = imagebuild.build(pm, ROOT, tag, build_args=[f"AGENT_CLIS={claude}"])
    print(f"\nimage build with AGENT_CLIS={claude}: {seconds:.1f} s")
    # One running container, asked with exec: on podman 4.3 here every command that waits
    # for a container to exit (run --rm, start -a, wait) sits out a 20 s conmon timeout.
    c = Container(pm, {}, {}, image=tag)
    try:
        c.wait_healthy()
        found = {a["name"]: a for a in json.loads(c.exec("agent-bridge", "agents", "--json"))}
        assert found["claude"]["available"] is True, found
        assert found["claude"]["executable"].startswith("/usr/local/lib/node_modules/@anthropic-ai/claude-code/")
        r = http_agents(c)
        assert {"claude", "demo"} <= {a["name"] for a in r}, r
        uid, node, version = c.exec("sh", "-c", "id -u; node --version; claude --version").split("\n")[:3]
        assert uid == str(UID) and node.startswith("v") and claude.rsplit("@", 1)[1] in version, (uid, node, version)
    finally:
        c.close()
        # 1.2 GB that no other test uses (the rest goes after the run: scripts/test).
        pm.run("rmi", "--force", tag, check=False, timeout=120)


def http_agents(c: Container) -> list[dict[str, Any]]:
    token = c.exec("cat", "/data/token").strip()
    r = httpx.get(f"{c.url}/v1/agents", headers={"Authorization": f"Bearer {token}"}, timeout=STEP_S)
    assert r.status_code == 200, r.text
    result: list[dict[str, Any]] = r.json()
    return result


def test_extras_build_argument_adds_the_cluster_clients(image: tuple[imagebuild.Podman, float]) -> None:
    """EXTRAS=cluster (compose.scale.yaml builds so): psycopg 3 with its libpq and redis-py
    in the daemon's venv; the default image has neither."""
    pm, _ = image
    tag = f"{TAG}-cluster"
    seconds = imagebuild.build(pm, ROOT, tag, build_args=["EXTRAS=cluster"])
    print(f"\nimage build with EXTRAS=cluster: {seconds:.1f} s")
    probe = "import psycopg, redis; print(psycopg.pq.version(), redis.__version__)"
    c = Container(pm, {}, {}, image=tag)
    try:
        c.wait_healthy()
        libpq, redis_version = c.exec("/opt/agent-bridge/bin/python", "-c", probe).split()
        assert int(libpq) >= 130000 and redis_version[0].isdigit(), (libpq, redis_version)
    finally:
        c.close()
        pm.run("rmi", "--force", tag, check=False, timeout=120)
    c = Container(pm, {}, {})
    try:
        c.wait_healthy()
        r = pm.run("exec", c.name, "/opt/agent-bridge/bin/python", "-c", probe, check=False)
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, r.stdout + r.stderr
    finally:
        c.close()
