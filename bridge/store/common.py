"""What the two stores do the same way, as a base class: their health and listeners, how a
thread row's columns are written (bridge/store/rows.py), ``ping``, and every read that is
the same statement on both databases (threads, the thread list, the change log, users,
secrets, a client event). A store supplies three primitives: :meth:`_fetch` (one read
statement), :meth:`_snapshot` (several in one consistent snapshot) and
:meth:`_rows_settled` (what must be written before thread rows are read).

A new store (another database) subclasses this, sets ``shared`` and ``_BOOL_AS_INT``, gives
the three primitives and the writes, and runs tests/store/test_conformance.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

from bridge.errors import StoreError
from bridge.store import push_sql, rows
from bridge.store.base import Change, PushRow, SecretRow, StoreListeners, ThreadFields, ThreadRow, UserRow


class CommonStore:
    shared: ClassVar[bool]
    _BOOL_AS_INT: ClassVar[bool]  # a boolean column is written as 0/1 (SQLite)

    replica_id: str

    def __init__(self, replica_id: str, listeners: StoreListeners | None) -> None:
        self.replica_id = replica_id
        self.listeners = listeners if listeners is not None else StoreListeners()
        self.healthy = True
        self.last_error: str | None = None
        self.batches = 0  # group commits so far (metrics)
        self.appended = 0  # events committed so far (metrics)

    # ------------------------------------------------------------------ primitives

    async def _fetch(self, statement: str, params: Sequence[Any]) -> list[Any]:
        """The rows of one read (``?`` placeholders) on a read connection."""
        raise NotImplementedError

    async def _snapshot(self, reads: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        """The rows of each read, all from one snapshot of the database."""
        raise NotImplementedError

    async def _rows_settled(self) -> None:
        """Before thread rows are read: whatever the store still owes them is written."""

    # ------------------------------------------------------------------ health and listeners

    def _set_health(self, healthy: bool, error: str | None) -> None:
        if healthy == self.healthy:
            self.last_error = error or self.last_error
            return
        self.healthy, self.last_error = healthy, error
        self.listeners.health_changed(healthy, error)

    def _changed(self) -> None:
        self.listeners.changed()

    async def ping(self) -> None:
        """The store answers a read and can be written; else ``store_unavailable`` (the
        code a client is given for a store it cannot use right now, on either store)."""
        try:
            await self._fetch("SELECT 1", ())
        except StoreError as exc:
            raise StoreError(exc.message, code="store_unavailable") from exc
        if not self.healthy:
            raise StoreError(f"store cannot be written: {self.last_error}", code="store_unavailable")

    # ------------------------------------------------------------------ thread rows

    def _dump(self, fields: ThreadFields) -> dict[str, Any]:
        """Columns as written (rows.encode_fields), stamped with this replica when they
        record a process."""
        return rows.stamp(rows.encode_fields(fields, bool_as_int=self._BOOL_AS_INT), self.replica_id)

    def _new_row(self, thread: ThreadRow) -> dict[str, Any]:
        return self._dump({k: thread.get(k) for k in rows.THREAD_COLUMNS if k in thread})

    @contextlib.asynccontextmanager
    async def creation_lock(self) -> AsyncIterator[None]:
        yield  # one daemon per SQLite file: sessions/caps.py's lock is enough

    async def count_threads(self, owner: str | None = None) -> int:
        # An index alone (the owner's for one user): well under a millisecond for 100,000 rows.
        if owner is None:
            found = await self._fetch("SELECT count(*) FROM threads", ())
        else:
            found = await self._fetch("SELECT count(*) FROM threads WHERE owner = ?", (owner,))
        return int(found[0][0])

    async def get_thread(self, thread_id: str) -> ThreadRow | None:
        await self._rows_settled()
        found = await self._fetch(rows.GET_THREAD, (thread_id,))
        return rows.thread_row(found[0]) if found else None

    async def list_threads(
        self,
        *,
        limit: int,
        cursor: str | None,
        agent: str | None,
        owner: str | None = None,
        archived: bool | None = False,
    ) -> tuple[list[ThreadRow], str | None]:
        statement, params = rows.list_query(limit, cursor, agent, owner, archived)
        await self._rows_settled()  # the order is by updated_at
        return rows.list_page([rows.thread_row(r) for r in await self._fetch(statement, params)], limit)

    # ------------------------------------------------------------------ change log

    async def read_changes(self, after: int, limit: int) -> list[Change]:
        return rows.changes(await self._snapshot(rows.changes_queries(after, limit)), after, limit)

    async def _counter(self, statement: str) -> int:
        found = await self._fetch(statement, ())
        return int(found[0][0]) if found else 0

    async def latest_change(self) -> int:
        return await self._counter(rows.LATEST_CHANGE)

    async def change_horizon(self) -> int:
        return await self._counter(rows.CHANGE_HORIZON)

    # ------------------------------------------------------------------ transcript

    async def find_client_event(self, thread_id: str, client_id: str) -> int | None:
        found = await self._fetch(rows.FIND_CLIENT_EVENT, (thread_id, client_id))
        return int(found[0][0]) if found else None

    async def turn_starts_before(self, thread_id: str, before: int, limit: int) -> list[int]:
        return [int(r[0]) for r in await self._fetch(rows.TURN_STARTS_BEFORE, (thread_id, before, limit))]

    # ------------------------------------------------------------------ users and secrets

    async def user_by_token(self, token_hash: str) -> tuple[UserRow, str] | None:
        found = await self._fetch(rows.USER_BY_TOKEN, (token_hash,))
        return (rows.user_row(found[0]), found[0][4]) if found else None

    async def get_user(self, name: str) -> UserRow | None:
        found = await self._fetch(rows.GET_USER, (name,))
        return rows.user_row(found[0]) if found else None

    async def list_users(self) -> list[UserRow]:
        return [rows.user_row(r) for r in await self._fetch(rows.LIST_USERS, ())]

    async def list_secrets(self, user: str, profile: str | None = None) -> list[SecretRow]:
        found = await self._fetch(rows.LIST_SECRETS, (user, profile, profile))
        return [SecretRow(r[0], r[1], r[2], bytes(r[3]), bytes(r[4]), r[5]) for r in found]

    # ------------------------------------------------------------------ push subscriptions

    async def list_push_subscriptions(self, user: str) -> list[PushRow]:
        return [_push_row(r) for r in await self._fetch(push_sql.LIST, (user,))]

    async def get_push_subscription(self, sub_id: str) -> PushRow | None:
        found = await self._fetch(push_sql.GET, (sub_id,))
        return _push_row(found[0]) if found else None


def _push_row(r: Sequence[Any]) -> PushRow:
    status = None if r[8] is None else int(r[8])
    return PushRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), str(r[5]), r[6], r[7], status)
