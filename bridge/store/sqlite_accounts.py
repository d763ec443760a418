"""Browser sessions, users and per-user secrets in the SQLite store: each write is one of
``sqlite_sql.OPS``, run where the write connection is (the writer thread or process); the
reads are the PostgreSQL store's (bridge/store/common.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bridge.clock import now_iso
from bridge.store import sqlite_accounts_sql as sql


class SqliteAccounts:
    """The writes of the SessionStore, UserStore and SecretStore halves of SqliteStore."""

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
