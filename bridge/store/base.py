"""What the sessions and the API need from a store: three narrow protocols and a typed
thread row. These are the seams a shared PostgreSQL store plugs into (docs/DESIGN.md).

* :class:`ThreadStore` — thread rows: create, read, list (newest activity first, paged),
  update some columns, delete, and the rows a previous daemon left live.
* :class:`TranscriptStore` — the per-thread, gapless, durable event log: an append is
  durable before it returns (and before anything is published); reads are by seq.
* :class:`SessionStore` — browser sessions (hashed keys, their expiry and their user).
* :class:`UserStore` — users and the hashes of their tokens (``[auth] mode = "users"``).
* :class:`SecretStore` — per-user secrets for agent profiles, as ciphertext only.
* :class:`PushStore` — users' Web Push subscriptions and each one's last delivery.
* :class:`ChangeStore` — the server-wide change log of thread rows (``GET /v1/events``):
  every write that changes a row as clients see it gives the row a new ``change_seq``
  from one store-wide counter that increases in commit order; a deleted thread leaves a
  tombstone. Exact semantics in docs/DESIGN.md ("The change log").
* :class:`LeaseStore` — which replica holds a live thread's lease (epoch, expiry on the database's
  clock), and the replicas sharing the store (docs/DESIGN.md "Leases and fencing").

:class:`Store` is all of them plus a lifecycle, health, its :class:`StoreListeners` and the
``shared`` capability; the embedded implementation is
:class:`~bridge.store.sqlite.SqliteStore`, the shared one
:class:`~bridge.store.postgres.PostgresStore` (``bridge.store.factory.open_store``). What
both do the same way is written once in bridge/store/common.py and rows.py, and
tests/store/test_conformance.py holds every store to the same behaviour.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, Required, TypedDict, cast

if TYPE_CHECKING:  # annotations only: the SQLite writer process imports this module too
    from bridge.protocols.envelope import Frames, Page
    from bridge.protocols.events import Record


class ThreadRow(TypedDict, total=False):
    """A thread as stored (the public view is api/views.py's)."""

    id: Required[str]
    agent: Required[str]
    protocol: Required[str]
    cwd: Required[str]
    model: str | None
    title: str
    native_session_id: str | None
    state: str  # idle | starting | running | stopping | exited
    turn_active: bool
    last_seq: int
    created_at: str
    updated_at: str
    last_exit: dict[str, Any] | None
    options: dict[str, Any]
    agent_info: dict[str, Any] | None
    tasks: str | None  # TaskTable.to_json()
    pid: int | None
    pid_start: int | None
    pending_permissions: int  # permission requests waiting for a client's answer
    owner: str | None  # the user who created it ([auth] mode = "users"); None in token mode
    archived: bool  # hidden from the thread list unless asked for (docs/api.md §4.24)
    usage: dict[str, Any] | None  # what its turns used, added up (bridge/store/usage.py)
    forked_from: dict[str, Any] | None  # {"thread", "seq"}: the thread and seq it was forked at
    worktree: dict[str, Any] | None  # {"repo", "path", "branch", "base"}: its own git worktree
    # What its transcript holds (``transcript_size`` of every event), kept by the appends:
    # [capacity] max_transcript_mb is checked against it. Private, like the columns below.
    transcript_bytes: int


# A transcript page (read_events, read_frames) stops after the event that brings it to this
# many bytes of stored data: a page is at most this plus one event, whatever ``limit`` asks
# (Hardening II #4: 24 events of 8 MiB made one replay take 874 MB). One event can be large:
# a client prompt of up to 8 MiB is stored as its text and as the line written to the agent.
# A page shorter than its count is therefore not the end of the transcript: Page.more is.
PAGE_BYTES = 4 * 1024 * 1024

# A partial update of a thread row: some of its columns (never ``id``).
ThreadFields = Mapping[str, Any]
THREAD_COLUMNS = frozenset(ThreadRow.__annotations__) - {"id"}


# What an event counts for in ``transcript_bytes``: the characters of its data and raw
# text (about their bytes), plus this much for its envelope and its row, so that a flood of
# tiny events counts too. A measure, not the exact file size: both stores count it the same
# way from the records, before they are written, so the cap costs no read.
EVENT_OVERHEAD = 64


def transcript_size(records: Sequence[Record]) -> int:
    """What ``records`` add to their thread's ``transcript_bytes``."""
    size = EVENT_OVERHEAD * len(records)
    for r in records:
        size += len(r.data_json) + (len(r.raw) if r.raw is not None else 0)
    return size


def apply_fields(row: ThreadRow, fields: ThreadFields) -> None:
    """Update a live row in memory with columns just written to the store."""
    cast(dict[str, Any], row).update(fields)


class ThreadStore(Protocol):
    async def create_thread(self, thread: ThreadRow) -> None: ...
    async def get_thread(self, thread_id: str) -> ThreadRow | None: ...
    async def list_threads(
        self,
        *,
        limit: int,
        cursor: str | None,
        agent: str | None,
        owner: str | None = None,
        archived: bool | None = False,
    ) -> tuple[list[ThreadRow], str | None]:
        """Newest activity first; with ``owner``, that user's threads only; ``archived``:
        only the threads not archived (False), only the archived (True), or both (None)."""
        ...

    async def update_thread(self, thread_id: str, fields: ThreadFields) -> None: ...
    async def delete_thread(self, thread_id: str) -> bool: ...
    async def count_threads(self, owner: str | None = None) -> int:
        """Threads in the store ([capacity] max_threads); with ``owner``, that user's."""
        ...

    def creation_lock(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while a thread is counted against the caps and created: every daemon
        sharing this store creates one thread at a time, so together they never pass
        ``max_threads``. A store one daemon owns needs no more than that daemon's own lock."""
        ...

    async def live_threads(self) -> list[ThreadRow]:
        """Rows a previous daemon left with a process or a turn in flight."""
        ...


class TranscriptStore(Protocol):
    async def append(
        self,
        thread_id: str,
        records: Sequence[Record],
        client_ids: Sequence[str | None],
        thread_fields: ThreadFields,
        *,
        epoch: int | None = None,
    ) -> None:
        """Store ``records`` (the next seqs of the thread, in order) and ``thread_fields``
        in one transaction; durable when it returns. A ``client_id`` is unique per thread.
        With ``epoch``, the append is fenced by the database in that transaction: it commits
        only while this store's replica holds the thread's live lease with that epoch, and
        raises :class:`~bridge.errors.LeaseLost` (nothing written) otherwise."""
        ...

    async def read_events(self, thread_id: str, after: int, limit: int, *, with_raw: bool = True) -> Page:
        """Events after ``after`` in seq order: at most ``limit``, and bounded by PAGE_BYTES
        (never more than that plus one event loaded); ``Page.more`` says whether to read on.
        ``with_raw=False``: each record's ``raw`` is None (not read: the compacted history
        needs only the data)."""
        ...

    async def read_frames(self, thread_id: str, after: int, limit: int, *, raw: bool) -> Frames:
        """The same page as frames joined from the stored rows (``Frames.count`` rows read,
        ``Frames.more`` as ``Page.more``)."""
        ...

    async def find_client_event(self, thread_id: str, client_id: str) -> int | None: ...

    async def turn_starts_before(self, thread_id: str, before: int, limit: int) -> list[int]:
        """The seqs of the newest ``turn.started`` events before ``before``, newest first,
        at most ``limit``."""
        ...

    async def search(
        self, q: str, *, owner: str | None, limit: int, cursor: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Full-text search (bridge/store/search_text.py): the newest matching documents of
        the threads ``owner`` has (every thread's with None), at most ``limit``, as hits
        ``{thread, seq, kind, ts, snippet, marks}``, and the next page's cursor.
        InvalidRequest for a query or cursor that is not valid."""
        ...

    async def usage_report(
        self, *, group_by: str, owner: str | None, since: str | None, until: str | None, limit: int
    ) -> dict[str, Any]:
        """What the turns ended in ``[since, until)`` (``ts`` text; None: unbounded) used,
        summed per ``group_by`` (bridge/store/usage.py ``GROUPS``), of ``owner``'s threads
        (every thread's with None): usage.report's answer."""
        ...


class SessionStore(Protocol):
    async def load_sessions(self, now: float) -> list[tuple[str, float, str | None]]:
        """Unexpired sessions, oldest first: (key, expiry, user name or None)."""
        ...

    async def save_session(
        self, key: str, expires_at: float, evicted: Sequence[str] = (), *, user: str | None = None
    ) -> None: ...
    async def delete_session(self, key: str) -> None: ...


@dataclass(frozen=True, slots=True)
class UserRow:
    """A user ([auth] mode = "users"). Only a hash of the token is ever stored."""

    name: str
    admin: bool
    created_at: str
    revoked_at: str | None  # None: active


class UserStore(Protocol):
    """Users and the hashes of their tokens (api/users.py), shared by every replica."""

    async def add_user(self, name: str, token_hash: str, *, admin: bool) -> bool:
        """Create the user, or give a revoked one a new token (active again); False when
        an active user has that name (nothing changed)."""
        ...

    async def user_by_token(self, token_hash: str) -> tuple[UserRow, str] | None:
        """The active user whose token hashes to ``token_hash``, with the stored hash."""
        ...

    async def get_user(self, name: str) -> UserRow | None: ...
    async def list_users(self) -> list[UserRow]: ...

    async def revoke_user(self, name: str) -> bool:
        """Forget the user's token hash, mark the user revoked and delete their browser
        sessions and their secrets, in one transaction; False when no active user has
        that name."""
        ...


@dataclass(frozen=True, slots=True)
class SecretRow:
    """A user's secret for one agent profile (bridge/user_secrets.py): only its AES-GCM nonce
    and ciphertext are stored, never the value."""

    user: str
    profile: str
    key: str
    nonce: bytes
    ciphertext: bytes
    updated_at: str


class SecretStore(Protocol):
    """Per-user secrets, encrypted by the caller (bridge/user_secrets.py), shared by every replica."""

    async def put_secret(
        self, user: str, profile: str, key: str, nonce: bytes, ciphertext: bytes, *, max_per_user: int
    ) -> bool:
        """Store (or replace) the secret; False when it is new and the user already holds
        ``max_per_user`` secrets (nothing stored)."""
        ...

    async def list_secrets(self, user: str, profile: str | None = None) -> list[SecretRow]:
        """The user's secrets (of one profile, or all), by profile then key."""
        ...

    async def delete_secret(self, user: str, profile: str, key: str) -> bool:
        """False when there was no such secret."""
        ...


@dataclass(frozen=True, slots=True)
class PushRow:
    """A browser's Web Push subscription (bridge/push/): the push service's endpoint, the
    browser's P-256 public key and auth secret (base64url, RFC 8291), whose it is, and how
    its last delivery went (None before the first)."""

    id: str
    user: str
    endpoint: str
    p256dh: str
    auth: str
    created_at: str
    last_at: str | None = None
    last_outcome: str | None = None
    last_status: int | None = None


class PushStore(Protocol):
    """Web Push subscriptions, shared by every replica (any replica may deliver)."""

    async def put_push_subscription(self, row: PushRow, *, max_per_user: int) -> str | None:
        """Store ``row``, or replace the row with its endpoint (which keeps its id; owner and
        keys are the new ones, the last outcome forgotten). The id stored under, or None
        when the user already holds ``max_per_user`` other subscriptions (nothing stored)."""
        ...

    async def list_push_subscriptions(self, user: str) -> list[PushRow]:
        """The user's subscriptions, oldest first."""
        ...

    async def get_push_subscription(self, sub_id: str) -> PushRow | None: ...

    async def delete_push_subscription(self, sub_id: str, user: str) -> bool:
        """False when the user has no subscription with that id."""
        ...

    async def forget_push_subscription(self, sub_id: str, endpoint: str) -> bool:
        """Remove a subscription the push service said is gone, unless it was replaced
        (its endpoint changed) meanwhile."""
        ...

    async def record_push_outcome(self, sub_id: str, at: str, outcome: str, status: int | None) -> None:
        """A delivery's outcome (nothing when the subscription is gone meanwhile)."""
        ...


# The thread object clients see (docs/api.md §4.3), in its order; api/views.py shows these.
PUBLIC_THREAD_FIELDS = (
    "id",
    "agent",
    "protocol",
    "model",
    "cwd",
    "title",
    "native_session_id",
    "state",
    "turn_active",
    "last_seq",
    "created_at",
    "updated_at",
    "last_exit",
    "agent_info",
    "options",
    "pending_permissions",
    "owner",
    "archived",
    "usage",
    "forked_from",
    "worktree",
)
# A thread row's columns in both stores: those, and the store's own (the agent process, the task table).
PRIVATE_THREAD_COLUMNS = ("pid", "pid_start", "tasks", "transcript_bytes")
ROW_COLUMNS = PUBLIC_THREAD_FIELDS + PRIVATE_THREAD_COLUMNS
# A write of any of these columns is a change clients see (the thread object less ``id``):
# it gives the row a new change_seq. Other columns (pid, tasks, …) do not.
CHANGE_COLUMNS = frozenset(PUBLIC_THREAD_FIELDS) - {"id"}

# Tombstones of deleted threads are kept for at least this long and at most this many
# (the newest); pruning one moves the change horizon up to its change_seq.
TOMBSTONE_KEEP = 10_000
TOMBSTONE_MAX_AGE_S = 7 * 24 * 3600.0

ChangeKind = Literal["thread.created", "thread.updated", "thread.deleted"]


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of the change log: a thread's newest state (``thread``, None when it was
    deleted) at its newest ``cursor`` (the row's change_seq, or its tombstone's)."""

    cursor: int
    kind: ChangeKind
    thread_id: str
    thread: ThreadRow | None
    deleted_at: str | None = None
    owner: str | None = None  # a deleted thread's owner (the row is gone)


class ChangesPruned(Exception):
    """``read_changes(after)`` with ``after`` below the horizon: tombstones after it were
    pruned, so the changes since it cannot all be told (the client must re-list)."""

    def __init__(self, after: int, horizon: int) -> None:
        super().__init__(f"cursor {after} is older than the change horizon {horizon}")
        self.after = after
        self.horizon = horizon


class StoreListeners:
    """Who hears of a store's health and of its row changes. A store is given one at
    construction (``make_store(..., listeners=…)``; it makes its own otherwise) and calls
    it; each party that cares subscribes its own callback with :meth:`add` (the registry,
    the cluster link), so none replaces or wraps another's. Callbacks run on the event
    loop, in the order they were added, and must not block.

    * ``change``: after a commit of this store that gave some row a new change_seq (a
      wake-up only). Commits by other processes on a shared store do not call it: a
      cross-replica bus wakes those readers.
    * ``health``: ``(healthy, error)`` when the store starts or stops being writable."""

    __slots__ = ("change", "health")

    def __init__(
        self,
        *,
        change: Sequence[Callable[[], None]] = (),
        health: Sequence[Callable[[bool, str | None], None]] = (),
    ) -> None:
        self.change: list[Callable[[], None]] = list(change)
        self.health: list[Callable[[bool, str | None], None]] = list(health)

    def add(
        self,
        *,
        change: Callable[[], None] | None = None,
        health: Callable[[bool, str | None], None] | None = None,
    ) -> None:
        if change is not None:
            self.change.append(change)
        if health is not None:
            self.health.append(health)

    def changed(self) -> None:
        for listener in self.change:
            listener()

    def health_changed(self, healthy: bool, error: str | None) -> None:
        for listener in self.health:
            listener(healthy, error)


class ChangeStore(Protocol):
    async def read_changes(self, after: int, limit: int) -> list[Change]:
        """Rows with change_seq > ``after`` (``thread.created`` when created_seq > after,
        else ``thread.updated``) and tombstones > ``after`` (``thread.deleted``), in cursor
        order, at most ``limit``: one entry per thread, at its newest cursor. Read in one
        snapshot. Raises ChangesPruned when ``after`` is below ``change_horizon()``."""
        ...

    async def latest_change(self) -> int:
        """The newest cursor committed (0 for an empty store)."""
        ...

    async def change_horizon(self) -> int:
        """The oldest cursor still servable: ``read_changes(after)`` works for every
        ``after >= change_horizon()``."""
        ...


@dataclass(frozen=True, slots=True)
class Lease:
    """A thread's lease as the database sees it now: ``live`` and ``expires_in_s`` are
    computed on the database's clock, never a replica's."""

    holder: str | None  # the replica holding it (the column lease_owner)
    epoch: int  # the last epoch granted (0: never leased); kept when the lease is released
    expires_in_s: float | None  # None: no holder; negative: expired
    live: bool


@dataclass(frozen=True, slots=True)
class Replica:
    replica_id: str
    instance: str  # a nonce per process: a restarted replica is a new instance
    url: str | None
    started_at: str
    heartbeat_age_s: float  # on the database's clock
    threads: int  # live leases held


class LeaseStore(Protocol):
    """Leases on live threads (which replica runs each), fenced by epochs. Every expiry is decided by the
    database's clock (``now()`` there), so replicas' clocks may disagree freely.

    ``replica_id`` is the replica this store instance acts for (it is given to the store
    when it is made, and stamped on the rows whose process it records)."""

    replica_id: str

    async def acquire_lease(self, thread_id: str, replica_id: str, ttl_s: float) -> int | None:
        """The epoch now held: a new one (last + 1) when the thread had no holder or its
        lease had expired, the same one (renewed) when ``replica_id`` already holds it live;
        None when another replica holds it live, or there is no such thread."""
        ...

    async def renew_leases(self, replica_id: str, ttl_s: float) -> dict[str, int]:
        """Extend every live lease ``replica_id`` holds, in one statement; the threads and
        epochs renewed. A lease that had already expired is not renewed (it is lost)."""
        ...

    async def release_lease(self, thread_id: str, replica_id: str, epoch: int) -> bool:
        """Give the lease up at once (draining, a stopped agent); False if it was not held."""
        ...

    async def lease_of(self, thread_id: str) -> Lease | None: ...

    async def orphaned_threads(self, limit: int) -> list[ThreadRow]:
        """At most ``limit`` rows that say a process or a turn is live (``state``
        starting/running/stopping, or ``turn_active``) while no replica holds their lease
        live (released, expired, or never taken): what a replica that died or was cut off
        left open, for whoever closes its books (sessions/sweep.py). Longest unheld first."""
        ...

    async def register_replica(self, instance: str, url: str | None) -> None:
        """Announce this replica; refused (StoreError ``replica_id_in_use``) while another
        live process holds the same ``replica_id``."""
        ...

    async def heartbeat(self) -> None: ...
    async def list_replicas(self) -> list[Replica]: ...


class Store(
    ThreadStore, TranscriptStore, SessionStore, UserStore, SecretStore, PushStore, ChangeStore, LeaseStore, Protocol
):
    @property
    def shared(self) -> bool:
        """Whether other replicas may use this store at once (PostgreSQL): leases, the
        replica lock and cross-replica wake-ups matter only then. A SQLite file is one
        daemon's (its data dir is locked)."""
        ...

    healthy: bool  # False while writes fail (they are retried; nothing acknowledged is lost)
    listeners: StoreListeners  # told of health and row changes (given at construction)
    batches: int  # group commits so far (metrics)
    appended: int  # events committed so far (metrics)

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def ping(self) -> None:
        """Raise StoreError ``store_unavailable`` when the store cannot be read or written."""
        ...
