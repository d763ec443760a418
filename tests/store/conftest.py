"""Every store-level test runs against both stores: ``store_url`` is a SQLite file in the
test's tmp dir or a fresh database on the test PostgreSQL server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.stores import StoreFactory

from bridge.store.base import Store
from bridge.store.factory import make_store

KINDS = ("sqlite", "postgresql")


@pytest.fixture(params=KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if store_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'bridge.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def opened(store_url: str) -> StoreFactory:
    """``async with opened(replica_id="a") as store``: a store on the test's database,
    opened, and closed afterwards; two of them are two replicas on one database."""

    @contextlib.asynccontextmanager
    async def make(replica_id: str = "local", url: str | None = None) -> AsyncIterator[Store]:
        store = make_store(url or store_url, replica_id=replica_id)
        await store.open()
        try:
            yield store
        finally:
            await store.close()

    return make
