"""Deliveries (issue #39; docs/api.md "Push subscriptions"): which committed events notify
whom, and each push sent, retried, recorded.

* **Who.** A thread's owner (its ``owner``, or the operator for a thread without one, as in
  token mode): every subscription of that user, never another's, admins included.
* **When.** ``permission.requested``, ``elicitation.requested``, a ``turn.ended`` that ended
  or failed (rules.notice_for), while no page of the owner has the thread open: no
  WebSocket on ``/v1/threads/{id}/ws`` signed in with the owner's browser session
  (:meth:`Pusher.watching`). A page that has it open tells its user itself.
* **How.** One POST per subscription (RFC 8030 §5) with the payload encrypted for the
  browser (RFC 8291) and a VAPID token for the endpoint's origin (RFC 8292); ``TTL``,
  ``Urgency`` and ``Topic`` by kind (rules.Notice). Through one httpx client whose
  connections go only to addresses rules.address_allowed accepts: the host is resolved at
  connect time and every address checked, then the checked address is the one dialled (so
  a name that changes between check and connect cannot redirect it); no redirects
  followed, no proxy from the environment.
* **Outcomes**, recorded on the subscription (the last one) and counted for /metrics:
  ``delivered`` (2xx), ``gone`` (404/410: the subscription is removed), ``refused`` (another
  4xx: not retried), ``failed`` (429, 5xx or no answer through ATTEMPTS tries), ``blocked``
  (the host resolves to an address not allowed, or not at all), ``error`` (the message
  could not be made). Retries wait the service's Retry-After or a doubling delay, capped.
* **Bounds.** At most CONCURRENT deliveries at once and BACKLOG waiting; beyond that a
  notification is dropped (counted, logged). Logs name a subscription by id and its
  endpoint's origin only: the endpoint's path is a capability, never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpcore
import httpx
import structlog

from bridge.clock import now_iso
from bridge.config_push import PushSettings
from bridge.protocols.events import Record
from bridge.push import keys, rules
from bridge.store.base import PushRow, Store, ThreadRow
from bridge.user_secrets import owner_of

log = structlog.get_logger("bridge.push")

CONCURRENT = 8
BACKLOG = 256
TIMEOUT_S = 10.0
OUTCOMES = ("delivered", "gone", "refused", "failed", "blocked", "error")


class EndpointRefused(Exception):
    """The endpoint's host resolves to an address the daemon may not contact."""


async def allowed_addresses(host: str, port: int, *, allow_private: bool) -> list[str]:
    """The addresses ``host`` resolves to, all of them allowed; EndpointRefused otherwise."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise EndpointRefused("the endpoint's host does not resolve") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses or not all(rules.address_allowed(a, allow_private=allow_private) for a in addresses):
        raise EndpointRefused("the endpoint's host is a private, loopback or reserved address")
    return addresses


class _Guarded(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the address rule in front of every connection."""

    def __init__(self, allow_private: bool) -> None:
        self._inner = httpcore.AnyIOBackend()
        self._allow_private = allow_private

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        last: Exception = EndpointRefused("no address")
        for address in await allowed_addresses(host, port, allow_private=self._allow_private):
            try:  # (TLS still names the host: httpcore takes SNI from the URL, not from here)
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                last = exc
        raise last

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise EndpointRefused("push endpoints are reached over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def make_client(allow_private: bool) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(retries=0)
    # httpx has no parameter for the network backend: its pool is replaced by one that has
    # ours (the same pool class httpx builds, the same TLS defaults).
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl.create_default_context(), max_connections=CONCURRENT, network_backend=_Guarded(allow_private)
    )
    return httpx.AsyncClient(transport=transport, timeout=TIMEOUT_S, follow_redirects=False, trust_env=False)


class Pusher:
    def __init__(self, store: Store, settings: PushSettings, data_dir: Path) -> None:
        self.store = store
        self.settings = settings
        self.vapid = keys.Vapid(data_dir, settings.subject)
        self._client = make_client(settings.allow_private_endpoints)
        self._open: Counter[tuple[str, str]] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(CONCURRENT)
        self.counts: Counter[str] = Counter()  # outcomes, "retried", "dropped", "suppressed"

    # ------------------------------------------------------------------ pages open

    @contextlib.contextmanager
    def watching(self, owner: str | None, thread_id: str) -> Iterator[None]:
        """A page of ``owner`` (a user's name, None: the operator) has ``thread_id`` open."""
        key = (owner_of(owner), thread_id)
        self._open[key] += 1
        try:
            yield
        finally:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]

    def is_open(self, owner: str | None, thread_id: str) -> bool:
        return self._open.get((owner_of(owner), thread_id), 0) > 0

    # ------------------------------------------------------------------ committed events

    def committed(self, thread: ThreadRow, records: Sequence[Record]) -> None:
        """Called on the loop with each commit of a thread run here (registry.on_records):
        never blocks, never raises into the journal."""
        for rec in records:
            if rec.kind not in ("permission.requested", "elicitation.requested", "turn.ended"):
                continue
            data = rec.data if isinstance(rec.data, dict) else {}
            notice = rules.notice_for(thread["id"], thread.get("title"), rec.kind, data)
            if notice is None:
                continue
            owner = thread.get("owner")
            if self.is_open(owner, thread["id"]):
                self.counts["suppressed"] += 1
                continue
            if len(self._tasks) >= BACKLOG:
                self.counts["dropped"] += 1
                log.warning("push.dropped", thread_id=thread["id"], kind=notice.kind)
                continue
            task = asyncio.get_running_loop().create_task(self._notify(owner_of(owner), notice), name="push")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _notify(self, user: str, notice: rules.Notice) -> None:
        try:
            subs = await self.store.list_push_subscriptions(user)
        except Exception as exc:  # the store is down: this notification is lost, said so
            log.warning("push.store_unavailable", error=type(exc).__name__)
            return
        await asyncio.gather(*(self.deliver(sub, notice) for sub in subs))

    # ------------------------------------------------------------------ one delivery

    async def deliver(self, sub: PushRow, notice: rules.Notice) -> str:
        """Send ``notice`` to ``sub``, retrying as the rules say; record and return the outcome."""
        async with self._slots:
            outcome, status, attempts = await self._attempts(sub, notice)
        self.counts[outcome] += 1
        origin = _origin(sub.endpoint)
        log.info("push.sent", subscription=sub.id, origin=origin, outcome=outcome, status=status, attempts=attempts)
        with contextlib.suppress(Exception):
            if outcome == "gone":
                await self.store.forget_push_subscription(sub.id, sub.endpoint)
            else:
                await self.store.record_push_outcome(sub.id, now_iso(), outcome, status)
        return outcome

    async def _attempts(self, sub: PushRow, notice: rules.Notice) -> tuple[str, int | None, int]:
        try:
            checked = rules.check(
                sub.endpoint, sub.p256dh, sub.auth, allow_private=self.settings.allow_private_endpoints
            )
            body = keys.encrypt(notice.payload(), sub.p256dh, sub.auth)
            headers = {
                "Authorization": self.vapid.authorization(checked.origin),
                "Content-Encoding": "aes128gcm",
                "Content-Type": "application/octet-stream",
                "TTL": str(notice.ttl_s),
                "Urgency": notice.urgency,
                "Topic": notice.topic,
            }
        except Exception as exc:  # a row the rules refuse now, a key the library refused
            log.warning("push.unsendable", subscription=sub.id, error=type(exc).__name__)
            return "error", None, 0
        status: int | None = None
        for attempt in range(1, rules.ATTEMPTS + 1):
            retry_after: str | None = None
            try:
                # Streamed and never read: a push service's answer body is not ours to hold.
                async with self._client.stream("POST", sub.endpoint, content=body, headers=headers) as answer:
                    status, retry_after = answer.status_code, answer.headers.get("retry-after")
            except EndpointRefused:
                return "blocked", None, attempt
            except httpx.HTTPError:
                status = None
            else:
                if 200 <= status < 300:
                    return "delivered", status, attempt
                if status in (404, 410):
                    return "gone", status, attempt
                if status != 429 and status < 500:
                    return "refused", status, attempt
            if attempt < rules.ATTEMPTS:
                self.counts["retried"] += 1
                await asyncio.sleep(rules.retry_delay(attempt, retry_after))
        return "failed", status, rules.ATTEMPTS

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._client.aclose()

    def exposition(self) -> str:
        """The /metrics lines: deliveries by outcome, retries, drops, pushes a page made moot."""
        out = "# HELP agent_bridge_push_total Web Push deliveries by outcome.\n# TYPE agent_bridge_push_total counter\n"
        for outcome in OUTCOMES:
            out += f'agent_bridge_push_total{{outcome="{outcome}"}} {self.counts[outcome]}\n'
        for name, what in (
            ("retried", "Web Push attempts retried."),
            ("dropped", "Notifications dropped: too many deliveries waiting."),
            ("suppressed", "Notifications not pushed: a page of the user had the thread open."),
        ):
            out += f"# HELP agent_bridge_push_{name}_total {what}\n# TYPE agent_bridge_push_{name}_total counter\n"
            out += f"agent_bridge_push_{name}_total {self.counts[name]}\n"
        return out


def _origin(endpoint: str) -> str:
    scheme, _, rest = endpoint.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].rsplit('@', 1)[-1]}"
