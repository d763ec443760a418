"""Command line (docs/api.md §1.1): ``serve``, ``agents``, ``migrate``, ``users``, ``status``, ``login-link``,
``--version``. The read-only questions (``agents``, ``status``, ``login-link``) are answered
in bridge/cli_status.py; ``serve`` (the daemon's start and stop), ``migrate`` and ``users``
here."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
import stat
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import uvicorn

from bridge import __version__, cli_help, cli_status, cli_store, datadir, discovery, secrets_cli
from bridge.config import Settings, load_settings, sandbox_refusal
from bridge.connections import ConnectionGuard, connection_limit, guarded_protocol
from bridge.errors import BridgeError
from bridge.logs import configure_logging
from bridge.network import is_loopback_host
from bridge.process.cgroup import AGENT_CGROUPS
from bridge.process.parent import ParentWatch, alive, quiet_broken_stdio
from bridge.process.sandbox import harden_daemon, scrub_process
from bridge.process.subreaper import TRACKER, reap_recorded
from bridge.store import factory as store_factory
from bridge.store import writer_client
from bridge.store.urls import passwords

if TYPE_CHECKING:
    from bridge.api.context import AppContext

log = structlog.get_logger("bridge.cli")

# The exit code of status and login-link when no daemon serves the data dir (docs/api.md §1.1).
NOT_RUNNING = cli_status.NOT_RUNNING


# The help of options several commands share (bridge/cli_help.py has the rest of the words).
DATA_DIR_HELP = (
    "data directory (default: AGENT_BRIDGE_DATA_DIR, else $XDG_DATA_HOME/agent-bridge, "
    "else ~/.local/share/agent-bridge)"
)
JSON_HELP = "print JSON for programs (default: lines for people)"
STORE_URL_HELP = (
    "the store: sqlite:///PATH or postgresql://… "
    "(default: AGENT_BRIDGE_STORE_URL, else [store] url, else sqlite:///<data-dir>/bridge.db)"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agent-bridge")
    p.add_argument("--version", action="version", version=f"agent-bridge {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", metavar="FILE", help="TOML config file (default: AGENT_BRIDGE_CONFIG, else none)")
        sp.add_argument("--data-dir", metavar="DIR", help=DATA_DIR_HELP)

    serve = sub.add_parser("serve", help="run the daemon")
    common(serve)
    serve.add_argument("--host", help="bind address (default: AGENT_BRIDGE_HOST, else [server] host, else 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=int,
        help="port; 0 picks a free one (default: AGENT_BRIDGE_PORT, else [server] port, else 8765)",
    )
    auth = serve.add_mutually_exclusive_group()
    auth.add_argument(
        "--token",
        help="auth token, visible to every local user in ps: prefer AGENT_BRIDGE_TOKEN "
        "(default: AGENT_BRIDGE_TOKEN, else the file <data-dir>/token, made at the first start)",
    )
    auth.add_argument(
        "--no-auth", action="store_true", help="no token; loopback or --uds only (default: a token is needed)"
    )
    serve.add_argument(
        "--log-format",
        choices=["json", "console"],
        help="log lines as JSON objects or for a terminal (default: AGENT_BRIDGE_LOG_FORMAT, else console)",
    )
    _desktop_serve_flags(serve)

    agents = sub.add_parser("agents", help="list the agent profiles, whether each can run, and the default")
    common(agents)
    agents.add_argument("--json", action="store_true", help=JSON_HELP)
    _desktop_commands(sub)

    acp = sub.add_parser("acp", help="an ACP agent on stdio, relayed to a daemon (for editors)")
    acp.add_argument("--url", help="the daemon's address (default: the daemon serving --data-dir)")
    acp.add_argument("--token", help="auth token (default: AGENT_BRIDGE_TOKEN, else that daemon's token file)")
    acp.add_argument(
        "--agent", metavar="NAME", help="the agent profile of new sessions (default: the daemon's default)"
    )
    acp.add_argument("--data-dir", metavar="DIR", help=DATA_DIR_HELP)

    migrate = sub.add_parser("migrate", help="create or upgrade the store's schema, then exit")
    common(migrate)
    migrate.add_argument("--store-url", metavar="URL", help=STORE_URL_HELP)
    _users_commands(sub, common)
    cli_help.finish(p)
    return p


def _users_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """``users add|list|revoke`` ([auth] mode = "users", docs/security.md "Users")."""
    users = sub.add_parser("users", help="add, list or revoke users (in the configured store)")
    usub = users.add_subparsers(dest="users_command", required=True)
    add = usub.add_parser("add", help="add a user (or give a revoked one a new token); prints the token once")
    add.add_argument("name")
    add.add_argument(
        "--admin", action="store_true", help="the user sees and may act on every thread (default: only their own)"
    )
    listing = usub.add_parser("list", help="list users")
    listing.add_argument("--json", action="store_true", help=JSON_HELP)
    revoke = usub.add_parser("revoke", help="revoke a user: their token, sessions and open streams end")
    revoke.add_argument("name")
    for sp in (add, listing, revoke):
        common(sp)
        sp.add_argument("--store-url", metavar="URL", help=STORE_URL_HELP)
    secrets_cli.add_commands(usub, common)


def _desktop_serve_flags(serve: argparse.ArgumentParser) -> None:
    """Flags for desktop shells (docs/desktop.md)."""
    serve.add_argument(
        "--uds",
        metavar="PATH",
        help="listen on this Unix socket (made 0600) instead of a TCP port (default: TCP)",
    )
    serve.add_argument(
        "--parent-pid",
        type=int,
        metavar="PID",
        help="stop cleanly when this process exits, for desktop shells (default: run until signalled)",
    )


def _desktop_commands(sub: Any) -> None:
    status = sub.add_parser("status", help="does a daemon serve the data dir? (exit 0 yes, 3 no)")
    status.add_argument("--data-dir", metavar="DIR", help=DATA_DIR_HELP)
    status.add_argument("--json", action="store_true", help=JSON_HELP)
    link = sub.add_parser("login-link", help="print a fresh one-time sign-in link for the running daemon")
    link.add_argument("--data-dir", metavar="DIR", help=DATA_DIR_HELP)
    link.add_argument(
        "--qr",
        action="store_true",
        help="also draw the link as a QR code, for a phone's camera (default: the link only)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        if args.command == "agents":
            settings = load_settings(config=args.config, data_dir=args.data_dir)
            return cli_status.agents(settings, as_json=args.json)
        if args.command == "status":
            return cli_status.status(cli_status.data_dir(args.data_dir), as_json=args.json)
        if args.command == "login-link":
            return cli_status.login_link(cli_status.data_dir(args.data_dir), qr=args.qr)
        if args.command == "acp":
            from bridge import acp_adapter

            return acp_adapter.run(args.url, args.token, args.agent, cli_status.data_dir(args.data_dir))
        if args.command in ("users", "migrate"):
            return cli_store.store_command(args)
        if args.uds and (args.host or args.port is not None):
            raise BridgeError("--uds listens on a Unix socket instead of TCP: give no --host or --port")
        settings = load_settings(
            config=args.config,
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            token=args.token,
            no_auth=args.no_auth,
            log_format=args.log_format,
        )
        return serve(settings, secret_on_command_line=bool(args.token), uds=args.uds, parent_pid=args.parent_pid)
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


def _check_store(settings: Settings) -> None:
    """A newer version's database is refused; a shared store is migrated here, under its
    advisory lock, and its replica_id checked, so a store that cannot be reached or an id
    in use is one clear line (exit 2) before anything listens."""
    store_factory.check_before_serve(settings.store_url, replica_id=settings.cluster.replica_id)


def ws_compression(settings: Settings, *, unix_socket: bool = False) -> bool:
    """Whether permessage-deflate is offered ([server] ws_compression); a Unix socket is as
    local as loopback."""
    mode = settings.server.ws_compression
    return mode == "on" or (mode == "auto" and not unix_socket and not is_loopback_host(settings.host))


def serve(
    settings: Settings,
    *,
    secret_on_command_line: bool = False,
    uds: str | None = None,
    parent_pid: int | None = None,
) -> int:
    from bridge.api.app import create_app

    if problem := _serve_refusal(settings, parent_pid, unix_socket=uds is not None):
        print(f"agent-bridge: {problem}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format)
    if secret_on_command_line:
        log.warning("auth.secret_on_command_line", hint=ON_COMMAND_LINE_HINT)
    protect_secrets(settings)
    _warn_unconfined(settings)
    _log_unusable(settings)
    # Private files, one daemon per data dir, and agents' escaped descendants found; the
    # lock is held before the store is opened and before any reaper runs (bridge/datadir.py).
    datadir.make_private(settings.data_dir)
    lock_fd = datadir.lock(settings.data_dir)
    _check_store(settings)
    TRACKER.install(settings.data_dir)
    writer_client.SPAWN_WATCH = TRACKER  # the store's writer process is no orphan
    AGENT_CGROUPS.setup(settings.capacity.agent_cgroups)  # memory_limit_mb: the kernel's, or sampled
    killed = reap_recorded(settings.data_dir)
    if killed:
        log.warning("agent.orphans_reaped", pids=killed, source="agents_record")
    raise_fd_limit()
    listener = _listen(settings, uds)

    def ready() -> None:
        # daemon.json first: a shell that has read the first line finds it (docs/desktop.md).
        discovery.publish(settings.data_dir, _record(settings, listener, token_file, app.context.running.started_at))
        # Scripts and tests parse exactly this first stdout line (docs/api.md §1.3).
        print(f"agent-bridge listening on {listener.shown}", flush=True)
        if listener.url is not None:
            # The second: a link that logs a browser in once (docs/security.md "One-time
            # link"). The code sits in the fragment, which browsers never send to a server.
            link = page_link(listener.scheme, listener.host, listener.port, app.context)
            print(f"open {link}", flush=True)
            # The same link for a phone's camera, on a terminal only: a log file or a pipe
            # gets the secret once, as the line above (docs/security.md "Pairing a phone").
            if sys.stdout.isatty():
                cli_status.print_qr(link, tty=True)
        tune_gc()

    token_file = settings.data_dir / "token"
    had_token_file = token_file.exists()
    app = create_app(settings, on_ready=ready, bound_port=listener.port, unix_socket=listener.uds is not None)
    _log_token_source(settings, token_file, had_token_file)
    server = _Server(
        _uvicorn_config(settings, app, unix_socket=listener.uds is not None),
        before_shutdown=lambda: _drain(app.context.registry),
        on_stop=lambda: _drain_now(app.context),
        parent_pid=parent_pid,
    )
    try:
        asyncio.run(server.serve(sockets=[listener.sock]))
    except KeyboardInterrupt:
        pass
    finally:
        discovery.withdraw(settings.data_dir, os.getpid())
        listener.close()
        AGENT_CGROUPS.close()
    logging.shutdown()
    datadir.unlock(lock_fd)
    return 0 if server.started else 1


async def _drain(registry: Any) -> None:
    """SIGTERM: no new work from now on (503 ``draining``) and every agent stopping, its
    lease let go once its exit is recorded (Registry.drain); then every client told."""
    registry.drain()
    await registry.close_clients("daemon_shutdown")


def _drain_now(context: Any) -> None:
    """The signal itself drains, not the server's next look at it (up to 0.1 s later):
    a command forwarded here in between would be accepted, then end "not started"."""
    if context.started:
        context.registry.drain()


# The cyclic collector's first threshold (CPython's default is 700): the echo loop allocates
# no lasting containers, but the 100-thread run passed 700 about 140 times (and the second
# generation's threshold 14 times, 1-3 ms each) after start-up (docs/benchmarks.md "Transport").
# 10,000 was not enough for a flood: a young collection traverses what is still alive, and a
# flood keeps ~2,000 lines' worth of records in flight (the pipelined commits, subscriber
# buffers), so each one cost ~6 ms: 0.29 s of a 200,000-line raw flood (1.5 µs a line), and
# 0.01 s at 100,000. The cost: up to that many container objects of cyclic garbage wait.
GC_GEN0_THRESHOLD = 100_000


def tune_gc() -> None:
    """After start-up: everything allocated so far (modules, the app, the settings) moves to
    the collector's permanent generation, which no collection scans again (a full one over
    it took 60-170 ms here), and the young generation is collected less often."""
    gc.freeze()  # no collection first: that full collection would run as clients connect
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


# Variables whose values are secrets the daemon itself (or libpq) reads.
SECRET_VARIABLES = ("AGENT_BRIDGE_TOKEN", "AGENT_BRIDGE_SECRETS_KEY", "PGPASSWORD", "REDISCLI_AUTH")


def protect_secrets(settings: Settings) -> None:
    """No secret where an agent could read it (docs/security.md "Confinement"): the token
    and the store's and bus's passwords are blanked in this process's command line and
    initial environment (what /proc shows), after the variables that hold them are given a
    copy of their own (C code such as libpq reads them with getenv); then the daemon is
    made not dumpable, so its memory and environment are closed to other processes of its
    user. Children it spawns (agents, the store's writer) start dumpable: the writer makes
    itself not dumpable too."""
    found = [settings.token or ""]
    for url in (settings.store_url, settings.cluster.bus_url or ""):
        found += passwords(url)
    found += [os.environ.get(name, "") for name in SECRET_VARIABLES]
    secrets = [x for x in dict.fromkeys(found) if x]
    for name, value in list(os.environ.items()):
        if any(x in value for x in secrets):
            os.environ[name] = value  # a heap copy: the original bytes are blanked next
    scrub_process(secrets)
    if not harden_daemon():
        log.warning("sandbox.daemon_dumpable", hint="prctl(PR_SET_DUMPABLE, 0) failed")


def _warn_unconfined(settings: Settings) -> None:
    box = settings.confinement()
    if box.confined:
        return
    why = box.problem or '[sandbox] mode = "none"'
    print(f"agent-bridge: warning: agents run unconfined ({why}); see docs/security.md", file=sys.stderr)
    log.warning("sandbox.none", reason=why)


def _log_unusable(settings: Settings) -> None:
    """Once at start: the profiles that cannot run and why (the reasons carry no URL's
    userinfo or query: bridge/config_sources.py). The daemon serves the others."""
    unusable = {name: problem for name in settings.agents if (problem := settings.profile_problem(name))}
    if unusable:
        log.warning("agents.unusable", profiles=unusable, default=settings.default_profile())


def _serve_refusal(settings: Settings, parent_pid: int | None, *, unix_socket: bool) -> str | None:
    if settings.no_auth and not unix_socket and not is_loopback_host(settings.host):
        return "--no-auth is refused unless the bind address is loopback"
    if problem := sandbox_refusal(settings):
        return problem
    if parent_pid is not None and (parent_pid <= 0 or not alive(parent_pid)):
        return f"--parent-pid {parent_pid} is not a running process"
    return None


def _uvicorn_config(settings: Settings, app: Any, *, unix_socket: bool) -> uvicorn.Config:
    from bridge.api.ws_transport import PROTOCOL as WS_PROTOCOL

    ssl: dict[str, Any] = {}
    if settings.server.tls_cert and settings.server.tls_key:
        ssl = {"ssl_certfile": settings.server.tls_cert, "ssl_keyfile": settings.server.tls_key}
    # proxy_headers off: X-Forwarded-Proto is honoured only with [server]
    # trust_proxy_headers, by security.RequestGuard (docs/security.md).
    limit = connection_limit(settings.server.max_connections, settings.server.max_conversations)
    guard = ConnectionGuard(limit, settings.server.header_timeout_s, settings.server.body_timeout_s)
    return uvicorn.Config(
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
        ws_per_message_deflate=ws_compression(settings, unix_socket=unix_socket),
        timeout_graceful_shutdown=5,
        **ssl,
    )


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


def page_link(scheme: str, host: str, port: int, ctx: AppContext) -> str:
    """The web page's address; with auth on, carrying a fresh one-time login code."""
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 -- a wildcard bind: loopback reaches it
        host = "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{port}/"
    if ctx.token is None:
        return url
    return f"{url}#login={ctx.login_codes.issue()}"


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown, which would make the
    daemon exit by signal; a graceful stop should exit 0 (issue #3), so the signals are
    handled here instead. Before uvicorn waits for open connections, every WebSocket and
    SSE client is told the daemon is going away (close 1001 / ``event: close``), so that
    wait is short and clients know to reconnect with ``after=``. With ``parent_pid``
    (sidecar mode), that process's exit is one more reason for the same graceful stop."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        before_shutdown: Callable[[], Awaitable[None]],
        on_stop: Callable[[], None] = lambda: None,
        parent_pid: int | None = None,
    ) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown
        self._on_stop = on_stop  # called at once on SIGTERM/SIGINT, before the server notices
        self._parent_pid = parent_pid
        self._parent: ParentWatch | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self._parent_pid is not None:
            self._parent = ParentWatch(self._parent_pid, self._parent_exited)
            self._parent.start()

    def _parent_exited(self) -> None:
        quieted = quiet_broken_stdio()  # before anything logs: the dead shell's pipes
        log.info("daemon.parent_exited", pid=self._parent_pid, stdio_to_devnull=quieted)
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._parent is not None:
            self._parent.close()
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
        with contextlib.suppress(Exception):  # never let this stop the shutdown itself
            self._on_stop()


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


@dataclass
class _Listener:
    """The one listening socket: TCP (``url`` the address a local client uses) or a Unix
    socket (``uds`` its path; ``url`` None)."""

    sock: socket.socket
    scheme: str
    host: str
    port: int
    uds: Path | None = None
    uds_inode: int | None = None

    @property
    def url(self) -> str | None:
        if self.uds is not None:
            return None
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host  # noqa: S104 -- wildcard
        shown = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{shown}:{self.port}"

    @property
    def shown(self) -> str:
        """What the first stdout line names (docs/api.md §1.3)."""
        if self.uds is not None:
            return f"unix:{self.uds}"
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{shown}:{self.port}"

    def close(self) -> None:
        self.sock.close()
        if self.uds is not None:
            with contextlib.suppress(OSError):
                if os.lstat(self.uds).st_ino == self.uds_inode:  # ours, not a successor's
                    os.unlink(self.uds)


def _listen(settings: Settings, uds: str | None) -> _Listener:
    scheme = "https" if settings.server.tls_cert and settings.server.tls_key else "http"
    if uds is not None:
        path = Path(uds).expanduser().absolute()
        sock = _bind_uds(path)
        return _Listener(sock, scheme, "localhost", 0, uds=path, uds_inode=os.lstat(path).st_ino)
    sock = _bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    return _Listener(sock, scheme, host, port)


# sun_path holds 108 bytes on Linux, the last a NUL.
UDS_PATH_MAX = 107


def _bind_uds(path: Path) -> socket.socket:
    """A Unix socket at ``path``, mode 0600 before it listens. A socket file nobody listens
    on (a daemon that died) is replaced; a live one, or anything else there, is refused."""
    if len(os.fsencode(path)) > UDS_PATH_MAX:
        raise BridgeError(
            f"--uds {path}: longer than {UDS_PATH_MAX} bytes, the limit of a Unix socket path", code="bind_failed"
        )
    _clear_dead_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))  # umask 077 (datadir.make_private): never wider than 0700
        os.chmod(path, 0o600)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise BridgeError(f"cannot listen on {path}: {exc.strerror}", code="bind_failed") from exc
    sock.set_inheritable(False)
    return sock


def _clear_dead_socket(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BridgeError(f"cannot use --uds {path}: {exc.strerror}", code="bind_failed") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise BridgeError(f"--uds {path} exists and is not a socket; refusing to replace it", code="bind_failed")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except ConnectionRefusedError:
        os.unlink(path)  # nobody listens: a dead daemon's socket
        log.info("uds.stale_socket_replaced", path=str(path))
        return
    except OSError as exc:
        raise BridgeError(f"cannot use --uds {path}: {exc.strerror}", code="bind_failed") from exc
    finally:
        probe.close()
    raise BridgeError(f"--uds {path} is in use by another process", code="bind_failed")


def _record(settings: Settings, listener: _Listener, token_file: Path, started_at: str) -> discovery.Record:
    from_file = not settings.no_auth and not settings.token
    return discovery.Record(
        url=listener.url,
        uds=None if listener.uds is None else str(listener.uds),
        pid=os.getpid(),
        version=__version__,
        started_at=started_at,
        token_file=str(token_file) if from_file else None,
        data_dir=str(settings.data_dir),
        auth=not settings.no_auth,
    )


__all__ = ["main", "serve"]
