"""The daemon's auth token and the bearer credentials clients send (docs/api.md §3).

* Where the token comes from: ``--token`` / ``AGENT_BRIDGE_TOKEN``, else
  ``<data-dir>/token``, else a new random token written there with mode 0600.
* Where a client puts it: ``Authorization: Bearer``, or for a WebSocket upgrade the
  subprotocol pair ``agent-bridge.v1`` + ``bearer.<token>`` (browsers cannot set headers on
  an upgrade). Never a URL query parameter: those end up in logs and histories.

Pure parsing and comparison; who the holder of a credential is, is api/auth.py's question.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from bridge.config import Settings
from bridge.errors import ConfigError

SUBPROTOCOL = "agent-bridge.v1"
BEARER_PREFIX = "bearer."


def resolve_token(settings: Settings) -> str | None:
    """The token this daemon accepts, or None with ``--no-auth``."""
    if settings.no_auth:
        return None
    if settings.token:
        return settings.token
    path = settings.data_dir / "token"
    try:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror}") from exc
    return _write_new_token(path)


def _write_new_token(path: Path) -> str:
    # Written beside its final place and renamed: a reader never sees half a token, and the
    # file is 0600 from its first byte.
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return token


def token_matches(expected: str, given: str | None) -> bool:
    """Constant time, so the time taken says nothing about how much of ``given`` was right."""
    if given is None:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def bearer_from_header(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, cred = value.partition(" ")
    if scheme.lower() != "bearer" or not cred:
        return None
    return cred.strip()


def bearer_from_subprotocols(offered: list[str]) -> str | None:
    for p in offered:
        if p.startswith(BEARER_PREFIX):
            return p[len(BEARER_PREFIX) :]
    return None


def offered_subprotocols(headers: Mapping[str, str]) -> list[str]:
    return [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def given_token(headers: Mapping[str, str], *, websocket: bool) -> str | None:
    """The bearer token sent: the header, or for a WebSocket upgrade the subprotocol."""
    given = bearer_from_header(headers.get("authorization"))
    if given is None and websocket:
        given = bearer_from_subprotocols(offered_subprotocols(headers))
    return given
