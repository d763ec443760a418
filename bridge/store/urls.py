"""Store URLs (``[store] url``, ``AGENT_BRIDGE_STORE_URL``): ``sqlite:///<absolute path>``
or ``postgresql://user:password@host:port/db?...`` (libpq's URI form; ``postgres://`` too).

A password in a URL is a secret: :func:`redact` is how a URL is ever shown (logs, errors),
and :func:`scrub` removes it from any text (a driver's error message) before it is shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from bridge.errors import ConfigError

Kind = Literal["sqlite", "postgresql"]
HIDDEN = "***"


@dataclass(frozen=True, slots=True)
class StoreUrl:
    kind: Kind
    url: str  # as given (holds the password: never log it)
    path: Path | None = None  # sqlite only

    @property
    def shown(self) -> str:
        return redact(self.url)

    def scrub(self, text: str) -> str:
        return scrub(text, self.url)


def default_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'bridge.db'}"


def parse(url: str) -> StoreUrl:
    """A checked store URL; ConfigError (which shows the URL redacted) when it is not one."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"[store] url {redact(url)!r} is not a URL: {exc}", code="invalid_store_url") from exc
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc or not parts.path.startswith("/") or parts.query or parts.fragment:
            raise ConfigError(
                f"[store] url {redact(url)!r}: a SQLite URL is sqlite:///<absolute path>", code="invalid_store_url"
            )
        return StoreUrl("sqlite", url, Path(unquote(parts.path)))
    if scheme in ("postgresql", "postgres"):
        _check_postgres(url)
        return StoreUrl("postgresql", url)
    raise ConfigError(
        f"[store] url {redact(url)!r}: the scheme must be sqlite or postgresql, not {parts.scheme or 'none'!r}",
        code="invalid_store_url",
    )


def _check_postgres(url: str) -> None:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"[store] url {redact(url)!r}: the port is not a number", code="invalid_store_url") from exc
    if parts.fragment:
        raise ConfigError(f"[store] url {redact(url)!r}: a fragment is not allowed", code="invalid_store_url")
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError as exc:
        raise ConfigError(
            "[store] url is a PostgreSQL URL, but the PostgreSQL driver is not installed: "
            "pip install 'agent-bridge[postgres]'",
            code="invalid_store_url",
        ) from exc
    try:
        conninfo_to_dict(url)
    except Exception as exc:  # psycopg.ProgrammingError: libpq refused it
        raise ConfigError(f"[store] url {redact(url)!r}: {scrub(str(exc), url)}", code="invalid_store_url") from exc


_PASSWORD_PARAM = re.compile(r"(?i)(password=)[^&\s]*")


def redact(url: str) -> str:
    """The URL with any password (``user:password@`` or ``?password=``) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _PASSWORD_PARAM.sub(rf"\g<1>{HIDDEN}", re.sub(r"//[^@/]*@", f"//{HIDDEN}@", url))
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:{HIDDEN}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, HIDDEN if k.lower() == "password" else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def passwords(url: str) -> list[str]:
    """The URL's passwords as written and percent-decoded (for scrubbing)."""
    return _passwords(url)


def _passwords(url: str) -> list[str]:
    found: list[str] = []
    try:
        parts = urlsplit(url)
        if parts.password:
            found += [parts.password, unquote(parts.password)]
        found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password" and v]
    except ValueError:
        pass
    return [p for p in found if p]


def scrub(text: str, url: str) -> str:
    """``text`` with the URL's password (raw or percent-decoded) nowhere in it."""
    for secret in sorted(set(_passwords(url)), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return text
