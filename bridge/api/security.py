"""The auth token: where it comes from, and constant-time checks of what clients send.

Token precedence (API.md §1): ``--token`` / ``AGENT_BRIDGE_TOKEN``, else
``<data-dir>/token``, else a new random token written there with mode 0600.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from bridge.config import Settings
from bridge.errors import ConfigError

SUBPROTOCOL = "agent-bridge.v1"
BEARER_PREFIX = "bearer."


def resolve_token(settings: Settings) -> str | None:
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
            return p[len(BEARER_PREFIX):]
    return None
