"""Command line (docs/api.md §1.1): ``serve``, ``agents``, ``migrate``, ``--version``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import resource
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import structlog
import uvicorn

from bridge import __version__, datadir
from bridge.config import Settings, load_settings
from bridge.connections import ConnectionGuard, connection_limit, guarded_protocol
from bridge.errors import BridgeError
from bridge.logs import configure_logging
from bridge.network import is_loopback_host
from bridge.process.launch import executable_problem
from bridge.process.subreaper import TRACKER, reap_recorded
from bridge.store import factory as store_factory
from bridge.store.urls import parse as parse_store_url
from bridge.tested_agents import TESTED, cli_version

log = structlog.get_logger("bridge.cli")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agent-bridge", description=__doc__)
    p.add_argument("--version", action="version", version=f"agent-bridge {__version__}")
    sub = p.add_subparsers(dest="command")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="TOML config file (env AGENT_BRIDGE_CONFIG)")
        sp.add_argument("--data-dir", help="data directory (env AGENT_BRIDGE_DATA_DIR)")

    serve = sub.add_parser("serve", help="run the daemon")
    common(serve)
    serve.add_argument("--host", help="bind address (env AGENT_BRIDGE_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port, 0 = any free one (env AGENT_BRIDGE_PORT)")
    auth = serve.add_mutually_exclusive_group()
    auth.add_argument(
        "--token",
        help="auth token; visible to every local user in ps, so prefer the env twin "
        "AGENT_BRIDGE_TOKEN or the token file <data-dir>/token",
    )
    auth.add_argument("--no-auth", action="store_true", help="no token (loopback only)")
    serve.add_argument("--log-format", choices=["json", "console"])

    agents = sub.add_parser("agents", help="list agent profiles and whether each is usable")
    common(agents)
    agents.add_argument("--json", action="store_true", help="machine-readable output")

    migrate = sub.add_parser("migrate", help="create or upgrade the store's schema, then exit")
    common(migrate)
    migrate.add_argument("--store-url", help="store URL (env AGENT_BRIDGE_STORE_URL, [store] url)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        if args.command == "agents":
            settings = load_settings(config=args.config, data_dir=args.data_dir)
            return _agents(settings, as_json=args.json)
        if args.command == "migrate":
            settings = load_settings(config=args.config, data_dir=args.data_dir, discover_path=False)
            return _migrate(args.store_url or settings.store_url)
        settings = load_settings(
            config=args.config,
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            token=args.token,
            no_auth=args.no_auth,
            log_format=args.log_format,
        )
        return serve(settings, secret_on_command_line=bool(args.token))
    except BridgeError as exc:
        print(f"agent-bridge: {exc.message}", file=sys.stderr)
        return 2


# --token is readable by every local user (ps, /proc/PID/cmdline): said once at start.
ON_COMMAND_LINE_HINT = (
    "--token puts the token on the command line, where every local user can read it "
    "(ps, /proc/PID/cmdline); use AGENT_BRIDGE_TOKEN or the token file <data-dir>/token instead"
)


def raise_fd_limit() -> None:
    """The soft limit on open files raised to the hard limit: each connection, agent pipe
    and database handle is a descriptor, and the usual soft limit (1024) is soon reached."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = FD_LIMIT_CAP if hard == resource.RLIM_INFINITY else hard
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("fd_limit.unchanged", error=str(exc))


# With no hard limit, the soft one goes this high (select()-free, so any number works).
FD_LIMIT_CAP = 1 << 20


def _agents(settings: Settings, *, as_json: bool) -> int:
    rows: list[dict[str, Any]] = []
    for name, prof in settings.agents.items():
        problem = executable_problem(prof.executable)
        cli = None if problem or prof.builtin else cli_version(prof.executable, prof.args)
        rows.append(
            {
                "name": name,
                "protocol": prof.protocol,
                "model": prof.model,
                "executable": prof.executable,
                "available": problem is None,
                "problem": problem,
                "default": name == settings.default_agent,
                # the CLI's npm package and version, and whether tests/real runs that version
                "cli": None if cli is None else {"package": cli.package, "version": cli.version, "tested": cli.tested},
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        mark = "ok " if r["available"] else "-- "
        default = " (default)" if r["default"] else ""
        print(f"{mark}{r['name']}{default}  [{r['protocol']}]  {r['executable']}")
        if r["problem"]:
            print(f"     unusable: {r['problem']}")
        seen = r["cli"]
        if seen and not seen["tested"]:
            tested = ", ".join(sorted(TESTED[seen["package"]]))
            print(f"     untested version: {seen['package']} {seen['version']} (tested: {tested}; docs/agents.md)")
    return 0


def _migrate(url: str) -> int:
    """``agent-bridge migrate``: the versions applied, one line (under the migration lock)."""
    shown = parse_store_url(url).shown
    applied = asyncio.run(store_factory.migrate(url))
    print(f"{shown}: " + (f"applied {', '.join(map(str, applied))}" if applied else "up to date"))
    return 0


def _check_store(settings: Settings) -> None:
    """A newer version's database is refused; a shared store is migrated here, under its
    advisory lock, and its replica_id checked, so a store that cannot be reached or an id
    in use is one clear line (exit 2) before anything listens."""
    store_factory.check_schema(settings.store_url)
    if not settings.store_url.startswith("sqlite:"):
        asyncio.run(store_factory.migrate(settings.store_url, replica_id=settings.cluster.replica_id))


def ws_compression(settings: Settings) -> bool:
    """Whether permessage-deflate is offered ([server] ws_compression)."""
    mode = settings.server.ws_compression
    return mode == "on" or (mode == "auto" and not is_loopback_host(settings.host))


def serve(settings: Settings, *, secret_on_command_line: bool = False) -> int:
    from bridge.api.app import create_app
    from bridge.api.ws_transport import PROTOCOL as WS_PROTOCOL

    if settings.no_auth and not is_loopback_host(settings.host):
        print("agent-bridge: --no-auth is refused unless the bind address is loopback", file=sys.stderr)
        return 2
    configure_logging(settings.log_format)
    if secret_on_command_line:
        log.warning("auth.secret_on_command_line", hint=ON_COMMAND_LINE_HINT)
    # Private files, one daemon per data dir, and agents' escaped descendants found; the
    # lock is held before the store is opened and before any reaper runs (bridge/datadir.py).
    datadir.make_private(settings.data_dir)
    lock_fd = datadir.lock(settings.data_dir)
    _check_store(settings)
    TRACKER.install(settings.data_dir)
    killed = reap_recorded(settings.data_dir)
    if killed:
        log.warning("agent.orphans_reaped", pids=killed, source="agents_record")
    raise_fd_limit()
    sock = _bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host

    scheme = "https" if settings.server.tls_cert and settings.server.tls_key else "http"

    def ready() -> None:
        # Scripts and tests parse exactly this first stdout line (docs/api.md §1.1).
        print(f"agent-bridge listening on {scheme}://{shown}:{port}", flush=True)
        # The second: a link that logs a browser in once (docs/security.md "One-time
        # link"). The code sits in the fragment, which browsers never send to a server.
        print(f"open {page_link(scheme, host, port, app.state)}", flush=True)

    token_file = settings.data_dir / "token"
    had_token_file = token_file.exists()
    app = create_app(settings, on_ready=ready, bound_port=port)
    _log_token_source(settings, token_file, had_token_file)
    ssl: dict[str, Any] = {}
    if settings.server.tls_cert and settings.server.tls_key:
        ssl = {"ssl_certfile": settings.server.tls_cert, "ssl_keyfile": settings.server.tls_key}
    # proxy_headers off: X-Forwarded-Proto is honoured only with [server]
    # trust_proxy_headers, by security.RequestGuard (docs/security.md).
    limit = connection_limit(settings.server.max_connections, settings.server.max_conversations)
    guard = ConnectionGuard(limit, settings.server.header_timeout_s, settings.server.body_timeout_s)
    config = uvicorn.Config(
        app,
        http=guarded_protocol(guard),  # bounded connections, request headers on time
        log_config=None,
        access_log=False,
        lifespan="on",
        proxy_headers=False,
        ws=WS_PROTOCOL or "auto",  # batched frame writes (api/ws_transport.py)
        ws_max_size=16 * 1024 * 1024,
        ws_ping_interval=settings.server.ws_ping_interval_s,
        ws_ping_timeout=settings.server.ws_ping_timeout_s,
        ws_per_message_deflate=ws_compression(settings),
        timeout_graceful_shutdown=5,
        **ssl,
    )
    server = _Server(config, before_shutdown=lambda: app.state.registry.close_clients("daemon_shutdown"))
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
    logging.shutdown()
    datadir.unlock(lock_fd)
    return 0 if server.started else 1


def _log_token_source(settings: Settings, token_file: Path, had_token_file: bool) -> None:
    """Where the token came from and, for the token file, how to read it (a container's
    operator finds it there); never the token itself."""
    log = structlog.get_logger("bridge.cli")
    if settings.no_auth:
        log.info("auth.disabled")
    elif settings.token:
        log.info("auth.token", source="--token or AGENT_BRIDGE_TOKEN")
    else:
        source = "file" if had_token_file else "generated"
        log.info("auth.token", source=source, path=str(token_file), hint=f"read it with: cat {token_file}")


def page_link(scheme: str, host: str, port: int, state: Any) -> str:
    """The web page's address; with auth on, carrying a fresh one-time login code."""
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 -- a wildcard bind: loopback reaches it
        host = "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{port}/"
    if state.token is None:
        return url
    return f"{url}#login={state.login_codes.issue()}"


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown, which would make the
    daemon exit by signal; a graceful stop should exit 0 (issue #3), so the signals are
    handled here instead. Before uvicorn waits for open connections, every WebSocket and
    SSE client is told the daemon is going away (close 1001 / ``event: close``), so that
    wait is short and clients know to reconnect with ``after=``."""

    def __init__(self, config: uvicorn.Config, *, before_shutdown: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        with contextlib.suppress(Exception):  # never let this stop the shutdown itself
            await asyncio.wait_for(self._before_shutdown(), CLIENT_CLOSE_WAIT_S)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        sigs = (signal.SIGINT, signal.SIGTERM)
        for sig in sigs:
            loop.add_signal_handler(sig, self._on_signal)
        try:
            yield
        finally:
            for sig in sigs:
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True


# How long a graceful shutdown waits for clients to take their 1001 / "event: close".
CLIENT_CLOSE_WAIT_S = 2.0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted connections when the
    # listening socket says it is TCP; without it every small response waits ~40 ms for an ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BridgeError(f"cannot listen on {host}:{port}: {exc.strerror}", code="bind_failed") from exc
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


__all__ = ["main", "serve"]
