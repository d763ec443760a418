"""``agent-bridge migrate`` and ``agent-bridge users …``: commands on the store itself, run
without a daemon (bridge/cli.py dispatches here)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from bridge import secrets_cli
from bridge.config import load_settings
from bridge.errors import BridgeError
from bridge.logs import configure_logging
from bridge.store import factory as store_factory
from bridge.store.urls import parse as parse_store_url


def store_command(args: argparse.Namespace) -> int:
    """``migrate`` and ``users``: the store of ``--store-url``, else the configured one."""
    settings = load_settings(config=args.config, data_dir=args.data_dir, discover_path=False)
    url = args.store_url or settings.store_url
    if args.command == "migrate":
        return _migrate(url)
    if args.users_command == "secret":  # the profiles as the daemon finds them (PATH too)
        return asyncio.run(secrets_cli.run(args, load_settings(config=args.config, data_dir=args.data_dir), url))
    return asyncio.run(_users(args, url, settings.auth.mode))


async def _users(args: argparse.Namespace, url: str, mode: str) -> int:
    """``agent-bridge users add|list|revoke`` (docs/api.md §1.1, §3.6)."""
    from bridge.api.users import check_name

    configure_logging("console", logging.WARNING)  # stdout carries the token alone
    if mode != "users":
        print('agent-bridge: note: [auth] mode is "token": users count only with mode = "users"', file=sys.stderr)
    if args.users_command != "list" and (problem := check_name(args.name)) is not None:
        raise BridgeError(problem)
    store_factory.check_schema(url)
    store = await store_factory.open_store(url)
    try:
        if args.users_command == "list":
            return await _users_list(store, as_json=args.json)
        if args.users_command == "add":
            return await _users_add(store, args.name, admin=args.admin)
        if not await store.revoke_user(args.name):
            raise BridgeError(f"no active user {args.name!r}")
        print(f"agent-bridge: user {args.name!r} revoked", file=sys.stderr)
        return 0
    finally:
        await store.close()


async def _users_list(store: Any, *, as_json: bool) -> int:
    rows = await store.list_users()
    if as_json:
        print(json.dumps([vars_of(u) for u in rows], indent=2))
        return 0
    for u in rows:
        state = f"revoked {u.revoked_at}" if u.revoked_at else "active"
        print(f"{u.name}\t{'admin' if u.admin else 'user'}\t{state}\tadded {u.created_at}")
    return 0


async def _users_add(store: Any, name: str, *, admin: bool) -> int:
    from bridge.api.users import new_token, token_hash

    token = new_token()
    if not await store.add_user(name, token_hash(token), admin=admin):
        raise BridgeError(f"user {name!r} exists; revoke it first to issue a new token")
    print(token)  # the only time it is shown: the store keeps its hash
    print(f"agent-bridge: user {name!r} added; the token above is shown only once", file=sys.stderr)
    return 0


def vars_of(user: Any) -> dict[str, Any]:
    return {"name": user.name, "admin": user.admin, "created_at": user.created_at, "revoked_at": user.revoked_at}


def _migrate(url: str) -> int:
    """``agent-bridge migrate``: the versions applied, one line (under the migration lock)."""
    shown = parse_store_url(url).shown
    applied = asyncio.run(store_factory.migrate(url))
    print(f"{shown}: " + (f"applied {', '.join(map(str, applied))}" if applied else "up to date"))
    return 0
