"""deploy/ and the Dockerfile checked by the tools that own their formats: hadolint, the
systemd unit with ``systemd-analyze verify`` (it runs without a running systemd), the
Kubernetes manifests with kubernetes-validate against a pinned Kubernetes version, the
compose file against the Compose Specification schema (check-jsonschema's copy) and its
Caddyfile with ``caddy validate``. Each check is also shown to fail on a broken copy."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.config import ClusterSettings, ServerSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
K8S_VERSION = "1.33.0"  # the Kubernetes release the manifests are validated against


# Where each tool comes from: Debian's packages, else the test extras (pip).
SOURCES = {"systemd-analyze": "Debian package systemd", "caddy": "Debian package caddy"}


def tool(name: str) -> str:
    path = shutil.which(name, path=f"{BIN}:/usr/bin:/usr/sbin:/bin")
    if path is None:
        source = SOURCES.get(name, "the test extras: .venv/bin/pip install -e '.[test]'")
        pytest.skip(f"{name} is not installed ({source}; scripts/test installs it)")
    return path


def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


# --------------------------------------------------------------------------- Dockerfile


def test_hadolint_finds_nothing_in_the_dockerfile(tmp_path: Path) -> None:
    hadolint = tool("hadolint")
    r = run(hadolint, "--no-color", str(ROOT / "Dockerfile"))
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr
    broken = tmp_path / "Dockerfile"
    broken.write_text((ROOT / "Dockerfile").read_text() + "USER root\n")
    r = run(hadolint, "--no-color", str(broken))
    assert r.returncode != 0 and "DL3002" in r.stdout, r.stdout


def test_dockerfile_takes_nothing_of_this_machine() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=docker\.io/library/debian:bookworm-slim$", text, re.M)
    for word in ("/usr/local/share/ca-certificates", "/root/", "/work/", "localhost/", "--network"):
        assert word not in text, word
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert rules[0] == "*", "the build context is an allowlist"


# --------------------------------------------------------------------------- systemd

UNIT = DEPLOY / "systemd" / "agent-bridge.service"


def verify_unit(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of ``text``, with ExecStart pointed at this checkout's
    agent-bridge (the unit's /opt path does not exist here; verify checks it is there)."""
    exe = BIN / "agent-bridge"
    assert exe.exists()
    unit = tmp_path / "agent-bridge.service"
    unit.write_text(text.replace("/opt/agent-bridge/bin/agent-bridge", str(exe)))
    return run(tool("systemd-analyze"), "verify", str(unit))


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    r = verify_unit(tmp_path, UNIT.read_text())
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    r = verify_unit(tmp_path, UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=strictest"))
    assert "strictest" in r.stderr, r.stderr  # verify reports bad values on stderr, exit 0
    r = verify_unit(tmp_path, UNIT.read_text().replace("[Service]", "[Service]\nNoSuchSetting=1"))
    assert "NoSuchSetting" in r.stderr, r.stderr


def unit_settings() -> list[tuple[str, str, list[str]]]:
    """(key, value, the comment lines right above it) for every setting of the unit."""
    out, comments = [], []
    for line in UNIT.read_text().splitlines():
        if line.startswith("#"):
            comments.append(line)
        elif "=" in line:
            key, _, value = line.partition("=")
            out.append((key, value, comments))
            comments = []
        elif not line.strip():
            comments = []
    return out


def test_systemd_unit_hardening_each_line_says_why() -> None:
    settings = unit_settings()
    got = {k: v for k, v, _ in settings}
    for key, value in {
        "User": "agent-bridge",
        "StateDirectory": "agent-bridge",
        "Environment": "AGENT_BRIDGE_DATA_DIR=/var/lib/agent-bridge/data",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "KillMode": "control-group",
        "Restart": "on-failure",
    }.items():
        assert key in got, key
        if key != "Environment":
            assert got[key] == value, (key, got[key])
    assert "Environment=HOME=/var/lib/agent-bridge" in UNIT.read_text()
    assert "ReadWritePaths" in got and "LimitNOFILE" in got
    assert "MemoryDenyWriteExecute" not in got, "it kills Node/V8 agent CLIs"
    assert "MemoryDenyWriteExecute" in UNIT.read_text(), "the unit says why it is not set"
    hardening = re.compile(
        r"^(NoNewPrivileges|Protect\w+|Private\w+|Restrict\w+|ReadWritePaths|LockPersonality|UMask)$"
    )
    keys = [key for key, _, _ in settings if hardening.match(key)]
    assert len(keys) >= 15, keys
    for key in keys:
        assert commented(key), f"{key}: no comment says why"


def commented(key: str) -> bool:
    """``key``'s line has a comment above it, directly or above the block of settings
    (no blank line between) it belongs to."""
    lines = UNIT.read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(f"{key}="))
    while i > 0 and lines[i - 1].strip() and not lines[i - 1].startswith("#"):
        i -= 1
    return i > 0 and lines[i - 1].startswith("#")


def test_env_file_sets_nothing_by_default() -> None:
    for line in (DEPLOY / "systemd" / "agent-bridge.env").read_text().splitlines():
        assert not line.strip() or line.startswith("#"), f"an example env file sets nothing: {line}"


# --------------------------------------------------------------------------- Kubernetes

K8S = DEPLOY / "k8s"


def k8s_documents() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def kubernetes_validate(*files: Path) -> subprocess.CompletedProcess[str]:
    return run(tool("kubernetes-validate"), "--kubernetes-version", K8S_VERSION, "--strict", *map(str, files))


def test_kubernetes_manifests_validate_against_a_pinned_version(tmp_path: Path) -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = sorted(kustomization["resources"])
    assert listed == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    r = kubernetes_validate(*(K8S / name for name in listed))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed") == 9, r.stdout
    broken = tmp_path / "deployment.yaml"
    broken.write_text((K8S / "deployment.yaml").read_text().replace("replicas: 1", "replicas: 1\n  replica: 1"))
    r = kubernetes_validate(broken)
    assert r.returncode != 0, r.stdout


def test_kubernetes_manifests_say_what_the_issue_asks() -> None:
    docs = k8s_documents()
    assert set(docs) == {
        "ConfigMap/agent-bridge-config",
        "Secret/agent-bridge-token",
        "PersistentVolumeClaim/agent-bridge-data",
        "PersistentVolumeClaim/agent-bridge-home",
        "PersistentVolumeClaim/agent-bridge-workspaces",
        "Deployment/agent-bridge",
        "Service/agent-bridge",
        "Ingress/agent-bridge",
        "PodDisruptionBudget/agent-bridge",
    }
    dep = docs["Deployment/agent-bridge"]["spec"]
    assert dep["replicas"] == 1 and dep["strategy"]["type"] == "Recreate"
    pod = dep["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["httpHeaders"] == [{"name": "Host", "value": "localhost:8765"}]
    assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/data", "/home/agent-bridge", "/workspaces", "/tmp", "/etc/agent-bridge"} <= mounts
    env = {e["name"]: e for e in c["env"]}
    assert env["AGENT_BRIDGE_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "agent-bridge-token"
    annotations = docs["Ingress/agent-bridge"]["metadata"]["annotations"]
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"]) >= 3600
    server = tomllib.loads(docs["ConfigMap/agent-bridge-config"]["data"]["config.toml"])["server"]
    ServerSettings(**server)  # the daemon accepts it
    assert server["allowed_hosts"] == docs["Ingress/agent-bridge"]["spec"]["rules"][0]["host"].split()


# --------------------------------------------------------------------------- compose

COMPOSE = DEPLOY / "compose"


def compose_schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    return run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path))


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    r = compose_schema_check(COMPOSE / "compose.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    doc["services"]["bridge"]["restart_policy"] = "always"  # not a service key
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(doc))
    r = compose_schema_check(broken)
    assert r.returncode != 0, r.stdout


def test_compose_file_wires_sqlite_volumes_and_the_proxy() -> None:
    doc = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    bridge, proxy = doc["services"]["bridge"], doc["services"]["proxy"]
    mounts = dict(v.split(":")[:2] for v in bridge["volumes"])
    assert (
        mounts["data"] == "/data" and mounts["home"] == "/home/agent-bridge" and mounts["workspaces"] == "/workspaces"
    )
    assert {"data", "home", "workspaces"} <= set(doc["volumes"])
    assert "ports" not in bridge, "only the proxy is published"
    assert "caddy" in proxy["image"] and "./Caddyfile:/etc/caddy/Caddyfile:ro" in proxy["volumes"]
    assert bridge["environment"]["AGENT_BRIDGE_ALLOWED_HOSTS"] == proxy["environment"]["BRIDGE_HOSTNAME"]


def test_caddyfile_validates(tmp_path: Path) -> None:
    caddy = tool("caddy")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path),
    }

    def validate(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [caddy, "validate", "--adapter", "caddyfile", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "BRIDGE_HOSTNAME": "bridge.example"},
            check=False,
        )

    text = (COMPOSE / "Caddyfile").read_text()
    assert "reverse_proxy bridge:8765" in text and "read_timeout 1h" in text
    r = validate(COMPOSE / "Caddyfile")
    assert r.returncode == 0 and "Valid configuration" in r.stdout + r.stderr, r.stdout + r.stderr
    broken = tmp_path / "Caddyfile"
    broken.write_text(text.replace("flush_interval -1", "flush_intervals -1"))
    assert validate(broken).returncode != 0


# --------------------------------------------------------------------------- scale out

SCALE_K8S = K8S / "scale-out"


def scale_k8s_documents() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((SCALE_K8S / "kustomization.yaml").read_text())
    docs: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((SCALE_K8S / name).read_text()):
            docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def test_scale_out_manifests_validate_against_a_pinned_version(tmp_path: Path) -> None:
    kustomization = yaml.safe_load((SCALE_K8S / "kustomization.yaml").read_text())
    listed = sorted(kustomization["resources"])
    assert listed == sorted(p.name for p in SCALE_K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    r = kubernetes_validate(*(SCALE_K8S / name for name in listed))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed") == 7, r.stdout
    broken = tmp_path / "deployment.yaml"
    text = (SCALE_K8S / "deployment.yaml").read_text()
    broken.write_text(text.replace("fieldPath: metadata.name", "fieldPath: metadata.name\n                  field: 1"))
    r = kubernetes_validate(broken)
    assert r.returncode != 0, r.stdout


def test_scale_out_manifests_share_what_a_takeover_needs() -> None:

    docs = scale_k8s_documents()
    assert set(docs) == {
        "ConfigMap/agent-bridge-config",
        "Secret/agent-bridge-cluster",
        "PersistentVolumeClaim/agent-bridge-shared",
        "Deployment/agent-bridge",
        "Service/agent-bridge",
        "Ingress/agent-bridge",
        "PodDisruptionBudget/agent-bridge",
    }
    dep = docs["Deployment/agent-bridge"]["spec"]
    assert dep["replicas"] >= 2 and dep["strategy"]["type"] == "RollingUpdate"
    pod = dep["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    # The replica id is the pod's name; the token, store and bus URLs come from the Secret.
    assert env["AGENT_BRIDGE_REPLICA_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    secret = docs["Secret/agent-bridge-cluster"]["stringData"]
    for var, key in (
        ("AGENT_BRIDGE_TOKEN", "token"),
        ("AGENT_BRIDGE_STORE_URL", "store-url"),
        ("AGENT_BRIDGE_BUS_URL", "bus-url"),
    ):
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "agent-bridge-cluster" and ref["key"] == key and not ref.get("optional"), var
        assert secret[key], key
    assert secret["store-url"].startswith("postgresql://") and secret["bus-url"].startswith("redis://")
    ClusterSettings(replica_id="agent-bridge-7d9f8b6c5-x2x4k", bus_url=secret["bus-url"])  # a pod name passes
    # One ReadWriteMany volume for HOME and the workspaces, mounted by every pod; the data
    # dir is the pod's own, with the default cwd and the demo agent's sessions on the share.
    assert docs["PersistentVolumeClaim/agent-bridge-shared"]["spec"]["accessModes"] == ["ReadWriteMany"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "agent-bridge-shared"
    assert "emptyDir" in volumes["data"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/data"]["name"] == "data"
    for path, sub in (
        ("/home/agent-bridge", "home"),
        ("/workspaces", "workspaces"),
        ("/data/workspaces", "workspaces"),
        ("/data/demo-agent", "demo-agent"),
    ):
        assert (mounts[path]["name"], mounts[path]["subPath"]) == ("shared", sub), path
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
        assert c[probe]["httpGet"]["path"] == path
        assert c[probe]["httpGet"]["httpHeaders"] == [{"name": "Host", "value": "localhost:8765"}]
    # The grace period holds the preStop pause and the whole drain: agents' stop_grace_s,
    # SIGKILL 3 s after SIGTERM, and time to flush.
    config = tomllib.loads(docs["ConfigMap/agent-bridge-config"]["data"]["config.toml"])
    ServerSettings(**config["server"])
    ClusterSettings(**config["cluster"])
    pause = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pause + config["server"]["stop_grace_s"] + 3 + 10
    assert docs["PodDisruptionBudget/agent-bridge"]["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "agent-bridge"}},
    }
    annotations = docs["Ingress/agent-bridge"]["metadata"]["annotations"]
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600
    assert config["server"]["allowed_hosts"] == docs["Ingress/agent-bridge"]["spec"]["rules"][0]["host"].split()


SCALE_COMPOSE = COMPOSE / "compose.scale.yaml"


def test_scale_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    r = compose_schema_check(SCALE_COMPOSE)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = yaml.safe_load(SCALE_COMPOSE.read_text())
    doc["services"]["redis"]["restart_policy"] = "always"
    broken = tmp_path / "compose.scale.yaml"
    broken.write_text(yaml.safe_dump(doc))
    assert compose_schema_check(broken).returncode != 0


def test_scale_compose_file_shares_the_store_bus_and_volumes_and_not_the_data_dirs() -> None:
    doc = yaml.safe_load(SCALE_COMPOSE.read_text())
    services = doc["services"]
    bridges = {name: s for name, s in services.items() if name.startswith("bridge-")}
    assert len(bridges) >= 2
    ids, data = set(), set()
    for name, s in bridges.items():
        env = s["environment"]
        ids.add(env["AGENT_BRIDGE_REPLICA_ID"])
        mounts = {target: source for source, target, *_ in (v.split(":") for v in s["volumes"])}
        data.add(mounts["/data"])
        assert mounts["/home/agent-bridge"] == "home" and mounts["/workspaces"] == "workspaces", name
        assert mounts["/data/workspaces"] == "workspaces" and mounts["/data/demo-agent"] == "demo-agent", name
        assert (
            env["AGENT_BRIDGE_STORE_URL"].startswith("postgresql://")
            and "@postgres:5432/" in env["AGENT_BRIDGE_STORE_URL"]
        )
        assert env["AGENT_BRIDGE_BUS_URL"] == "redis://redis:6379/0"
        assert ":?" in env["AGENT_BRIDGE_TOKEN"], "the token is required: one for every replica"
        assert s["build"]["args"]["EXTRAS"] == "cluster"
        assert "ports" not in s, "only the proxy is published"
        assert set(s["depends_on"]) == {"postgres", "redis"}
    assert len(ids) == len(data) == len(bridges), "each replica its own id and data dir"
    assert {e["AGENT_BRIDGE_STORE_URL"] for e in (s["environment"] for s in bridges.values())} == {
        bridges["bridge-1"]["environment"]["AGENT_BRIDGE_STORE_URL"]
    }
    proxy = services["proxy"]
    assert proxy["environment"]["BRIDGE_UPSTREAMS"].split() == [f"{name}:8765" for name in bridges]
    assert "./Caddyfile.scale:/etc/caddy/Caddyfile:ro" in proxy["volumes"]
    for backing in ("postgres", "redis"):
        assert services[backing]["networks"] == ["backend"] and "ports" not in services[backing]
    assert doc["networks"]["backend"]["internal"] is True


def test_scale_caddyfile_validates_and_lists_every_upstream(tmp_path: Path) -> None:
    caddy = tool("caddy")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path),
    }

    def caddy_cmd(cmd: str, path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [caddy, cmd, "--adapter", "caddyfile", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **env,
                "BRIDGE_HOSTNAME": "bridge.example",
                "BRIDGE_UPSTREAMS": "bridge-1:8765 bridge-2:8765 bridge-3:8765",
            },
            check=False,
        )

    path = COMPOSE / "Caddyfile.scale"
    r = caddy_cmd("validate", path)
    assert r.returncode == 0 and "Valid configuration" in r.stdout + r.stderr, r.stdout + r.stderr

    r = caddy_cmd("adapt", path)
    (server,) = json.loads(r.stdout)["apps"]["http"]["servers"].values()
    (handler,) = server["routes"][0]["handle"][0]["routes"][0]["handle"]
    assert [u["dial"] for u in handler["upstreams"]] == ["bridge-1:8765", "bridge-2:8765", "bridge-3:8765"]
    assert handler["flush_interval"] == -1
    assert handler["load_balancing"]["selection_policy"]["policy"] == "cookie"
    active = handler["health_checks"]["active"]
    assert active["uri"] == "/readyz" and active["headers"] == {"Host": ["localhost:8765"]}
    assert handler["transport"]["read_timeout"] >= 3600 * 10**9
    broken = tmp_path / "Caddyfile.scale"
    broken.write_text(path.read_text().replace("lb_policy cookie", "lb_policy sticky"))
    assert caddy_cmd("validate", broken).returncode != 0
