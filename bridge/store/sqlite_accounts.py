"""Browser sessions, users and per-user secrets in the SQLite store: each write is one of
``sqlite_sql.OPS``, run where the write connection is (the writer thread or process); the
reads are the PostgreSQL store's (bridge/store/common.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bridge.clock import now_iso
from bridge.store import push_sql
from bridge.store import sqlite_accounts_sql as sql
from bridge.store.base import PushRow


class SqliteAccounts:
    """The writes of the SessionStore, UserStore, SecretStore and PushStore halves of SqliteStore."""

    _run: Callable[..., Any]  # SqliteStore._run(op, *args): an op where the write connection is

    # ------------------------------------------------------------------ browser sessions

    async def load_sessions(self, now: float) -> list[tuple[str, float, str | None]]:
        """Unexpired browser sessions, oldest first (expired ones are deleted)."""
        return [(str(k), float(e), u) for k, e, u in await self._run(sql.load_sessions, float(now))]

    async def save_session(
        self, key: str, expires_at: float, evicted: Sequence[str] = (), *, user: str | None = None
    ) -> None:
        await self._run(sql.save_session, key, float(expires_at), list(evicted), user)

    async def delete_session(self, key: str) -> None:
        await self._run(sql.delete_session, key)

    # ------------------------------------------------------------------ users

    async def add_user(self, name: str, token_hash: str, *, admin: bool) -> bool:
        return bool(await self._run(sql.add_user, name, token_hash, bool(admin), now_iso()))

    async def revoke_user(self, name: str) -> bool:
        return bool(await self._run(sql.revoke_user, name, now_iso()))

    # ------------------------------------------------------------------ per-user secrets

    async def put_secret(
        self, user: str, profile: str, key: str, nonce: bytes, ciphertext: bytes, *, max_per_user: int
    ) -> bool:
        return bool(
            await self._run(
                sql.put_secret, user, profile, key, bytes(nonce), bytes(ciphertext), now_iso(), max_per_user
            )
        )

    async def delete_secret(self, user: str, profile: str, key: str) -> bool:
        return bool(await self._run(sql.delete_secret, user, profile, key))

    # ------------------------------------------------------------------ push subscriptions

    async def put_push_subscription(self, row: PushRow, *, max_per_user: int) -> str | None:
        values = [row.id, row.user, row.endpoint, row.p256dh, row.auth, row.created_at]
        kept = await self._run(push_sql.put_push_subscription, values, max_per_user)
        return None if kept is None else str(kept)

    async def delete_push_subscription(self, sub_id: str, user: str) -> bool:
        return bool(await self._run(push_sql.delete_push_subscription, sub_id, user))

    async def forget_push_subscription(self, sub_id: str, endpoint: str) -> bool:
        return bool(await self._run(push_sql.forget_push_subscription, sub_id, endpoint))

    async def record_push_outcome(self, sub_id: str, at: str, outcome: str, status: int | None) -> None:
        await self._run(push_sql.record_push_outcome, sub_id, at, outcome, status)
