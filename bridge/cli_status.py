"""The command line's read-only questions (docs/api.md §1.1): ``agents`` (which profiles
could run, and how confined), ``status`` (does a daemon serve this data dir) and
``login-link`` (a one-time sign-in link from it). They never start a daemon or open its
store: ``agents`` reads the settings, the other two the data dir's discovery record and
the daemon it names. ``serve``, ``migrate`` and ``users`` stay in bridge/cli.py."""

from __future__ import annotations

import http.client
import json
import os
import sys
from pathlib import Path
from typing import Any

from bridge import discovery
from bridge.config import AgentProfile, Settings, default_data_dir
from bridge.tested_agents import TESTED, cli_version

NOT_RUNNING = 3  # status and login-link: no daemon serves that data dir (docs/api.md §1.1)


# --------------------------------------------------------------------------- agents


def agents(settings: Settings, *, as_json: bool) -> int:
    default = settings.default_profile()  # once: it checks executables
    rows = [_agent_row(settings, name, prof, default) for name, prof in settings.agents.items()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    box = settings.confinement()
    if not box.confined:
        print(f"agents run unconfined: {box.problem or '[sandbox] mode = none'} (docs/security.md)")
    for r in rows:
        _print_agent(r)
    return 0


def _agent_row(settings: Settings, name: str, prof: AgentProfile, default: str) -> dict[str, Any]:
    problem = settings.profile_problem(name)  # a launch rule its settings break, or its executable's
    cli = None if problem or prof.builtin else cli_version(prof.executable, prof.args)
    return {
        "name": name,
        "protocol": prof.protocol,
        "model": prof.model,
        "executable": prof.executable,
        "available": problem is None,
        "problem": problem,
        "default": name == default,
        "sandbox": settings.confinement().for_profile(prof.sandbox).mechanism,
        # the CLI's npm package and version, and whether tests/real runs that version
        "cli": None if cli is None else {"package": cli.package, "version": cli.version, "tested": cli.tested},
    }


def _print_agent(r: dict[str, Any]) -> None:
    mark = "ok " if r["available"] else "-- "
    default = " (default)" if r["default"] else ""
    print(f"{mark}{r['name']}{default}  [{r['protocol']}]  {r['executable']}  sandbox: {r['sandbox']}")
    if r["problem"]:
        print(f"     unusable: {r['problem']}")
    seen = r["cli"]
    if seen and not seen["tested"]:
        tested = ", ".join(sorted(TESTED[seen["package"]]))
        print(f"     untested version: {seen['package']} {seen['version']} (tested: {tested}; docs/agents.md)")


# --------------------------------------------------------------------------- status, login-link


def data_dir(flag: str | None) -> Path:
    """The data dir as serve resolves it (docs/api.md §1.2): flag, env twin, default."""
    return Path(flag or os.environ.get("AGENT_BRIDGE_DATA_DIR") or default_data_dir(os.environ)).expanduser().absolute()


def status(data_dir: Path, *, as_json: bool) -> int:
    found = discovery.look(data_dir)
    if as_json:
        print(json.dumps(_status_json(data_dir, found), indent=2))
    elif found.state == "running" and found.info is None:
        assert found.record is not None
        print(f"running: pid {found.record.pid}, {_where(found.record)} ({found.detail})")
    elif found.state == "running":
        assert found.record is not None and found.info is not None
        rec, info = found.record, found.info
        print(
            f"running: pid {rec.pid}, {_where(rec)}, version {info.get('version')}, "
            f"up {_duration(info.get('uptime_s'))}, {info.get('live_agents')} live agent(s), "
            f"{info.get('loaded_threads')} loaded thread(s)"
        )
    else:
        print(f"{found.state.replace('_', ' ')}: {found.detail}")
    return 0 if found.state == "running" else NOT_RUNNING


def _where(rec: discovery.Record) -> str:
    return rec.url or f"unix:{rec.uds}"


def _status_json(data_dir: Path, found: discovery.Found) -> dict[str, Any]:
    out: dict[str, Any] = {"state": found.state, "running": found.state == "running", "data_dir": str(data_dir)}
    out["throttled"], out["retry_after_s"] = found.retry_after_s is not None, found.retry_after_s
    if found.record is not None:
        out.update({k: v for k, v in found.record.as_dict().items() if k != "data_dir"})
    info = found.info or {}
    for key in ("uptime_s", "live_agents", "loaded_threads", "subscribers"):
        out[key] = info.get(key)
    out["detail"] = found.detail
    return out


def _duration(seconds: object) -> str:
    if not isinstance(seconds, (int, float)):
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def login_link(data_dir: Path, *, qr: bool = False) -> int:
    """A fresh one-time sign-in link from the running daemon (``POST /v1/login-codes``);
    with ``qr``, drawn as a QR code below it too."""
    found = discovery.look(data_dir)
    rec = found.record
    if found.state != "running" or rec is None:
        return _fail(f"no daemon serves {data_dir} ({found.state.replace('_', ' ')}: {found.detail})", NOT_RUNNING)
    if rec.url is None:
        return _fail(f"the daemon listens on the Unix socket {rec.uds} only; no browser can reach it", 2)
    if not rec.auth:
        return _print_link(f"{rec.url}/", qr=qr)
    try:
        code, body, wait = discovery.exchange(rec, "POST", "/v1/login-codes", token=discovery.token_for(rec))
    except (OSError, http.client.HTTPException) as exc:
        return _fail(f"the daemon did not answer: {exc}", NOT_RUNNING)
    where = rec.token_file or "AGENT_BRIDGE_TOKEN"
    if code == 429:
        return _fail(f"the daemon runs (pid {rec.pid}), {discovery.throttled_detail(where, wait)}", 2)
    if code != 201 or not isinstance(body, dict) or not isinstance(body.get("code"), str):
        return _fail(f"the daemon refused the token from {where} ({code}); is it its own?", 2)
    return _print_link(f"{rec.url}/#login={body['code']}", qr=qr)


def _print_link(link: str, *, qr: bool) -> int:
    print(link, flush=True)
    if qr:
        print_qr(link, tty=sys.stdout.isatty())
    return 0


def print_qr(link: str, *, tty: bool) -> None:
    """``link`` as a QR code on stdout (bridge/qr.py): coloured for a terminal, plain text
    when piped; with a blank line before it, so it never touches the link's line."""
    from bridge import qr  # segno is loaded only by the commands that draw

    print("\n" + "\n".join(qr.terminal_lines(link, colour=qr.wants_colour(tty, os.environ))), flush=True)


def _fail(message: str, exit_code: int) -> int:
    print(f"agent-bridge: {message}", file=sys.stderr)
    return exit_code
