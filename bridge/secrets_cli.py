"""``agent-bridge users secret set|list|unset`` (docs/api.md §1.1, docs/security.md
"Per-user secrets"): the operator manages any user's secrets in the configured store.

``set NAME PROFILE KEY`` reads the value from stdin (never from the command line, where
every local user could read it in ``ps``): without echo from a terminal, else all of
stdin less one trailing newline. ``NAME`` is a user of the store, or ``operator`` (the
daemon's own token: token mode's one caller, and the threads it creates in users mode).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

from bridge.config import Settings
from bridge.errors import BridgeError
from bridge.logs import configure_logging
from bridge.store import factory as store_factory

# What every command line would import (the parser is built for each one) stays small:
# the crypto and the API's name rule are imported when a secret command runs.
MAX_VALUE_BYTES = 16 * 1024  # bridge/user_secrets.py's (test_secrets_cli checks they agree)


def add_commands(usub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    secret = usub.add_parser("secret", help="a user's secrets for agent profiles (set reads the value from stdin)")
    ssub = secret.add_subparsers(dest="verb", required=True)
    put = ssub.add_parser("set", help="store NAME's secret KEY for agent profile PROFILE; the value is read from stdin")
    listing = ssub.add_parser("list", help="list NAME's secrets (names only, never values)")
    unset = ssub.add_parser("unset", help="remove NAME's secret KEY for agent profile PROFILE")
    for sp in (put, listing, unset):
        sp.add_argument("name", help='a user, or "operator" (the daemon\'s own token)')
    for sp in (put, unset):
        sp.add_argument("profile", help="an agent profile of the config")
        sp.add_argument("key", help="an environment variable's name, e.g. ANTHROPIC_API_KEY")
    listing.add_argument("--json", action="store_true", help="print JSON for programs (default: lines for people)")
    for sp in (put, listing, unset):
        common(sp)
        sp.add_argument(
            "--store-url",
            metavar="URL",
            help="the store (default: AGENT_BRIDGE_STORE_URL, else [store] url, else sqlite:///<data-dir>/bridge.db)",
        )


def read_value(stdin: BinaryIO | None = None) -> str:
    """The value from stdin: without echo at a terminal, else all of it less one newline."""
    if stdin is None and sys.stdin.isatty():
        return getpass.getpass("value (not shown): ")
    data = (stdin or sys.stdin.buffer).read(MAX_VALUE_BYTES + 3)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise BridgeError("the value on stdin is not UTF-8") from None


async def run(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from bridge import user_secrets
    from bridge.api.users import NAME

    configure_logging("console", logging.WARNING)
    name = args.name
    if name != user_secrets.OPERATOR_NAME and not NAME.fullmatch(name):
        raise BridgeError(f"{name[:80]!r} is not a user name")
    value = read_value() if args.verb == "set" else None
    store_factory.check_schema(url)
    store = await store_factory.open_store(url)
    try:
        if name != user_secrets.OPERATOR_NAME and await store.get_user(name) is None:
            raise BridgeError(f"no user {name!r} (agent-bridge users list)")
        if args.verb == "list":
            rows = await user_secrets.names(store, name)
            if args.json:
                print(json.dumps(rows, indent=2))
            for r in [] if args.json else rows:
                print(f"{r['profile']}\t{r['key']}\tupdated {r['updated_at']}")
            return 0
        if args.verb == "unset":
            await user_secrets.remove(store, name, args.profile, args.key)
            print(f"agent-bridge: {name}'s secret {args.key} for {args.profile!r} removed", file=sys.stderr)
            return 0
        profile = settings.agents.get(args.profile)
        if profile is None:
            raise BridgeError(f"no agent profile {args.profile!r} (agent-bridge agents)")
        assert value is not None
        ring = user_secrets.keyring(settings.data_dir)
        await user_secrets.put(store, ring, name, profile, args.key, value)
        print(
            f"agent-bridge: {name}'s secret {args.key} for {args.profile!r} stored; "
            "their agents of that profile get it from their next start",
            file=sys.stderr,
        )
        return 0
    finally:
        await store.close()
