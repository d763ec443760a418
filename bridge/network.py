"""Host names, Host headers, origins and loopback: the parsing the launch rules
(remote-URL opt-in), the configuration (allowed_hosts, allowed_origins) and the request
guard (Host and Origin checks) share."""

from __future__ import annotations

import ipaddress
import re


def is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_host_port(value: str) -> tuple[str, int | None]:
    """``name``, ``name:port``, ``1.2.3.4:port``, ``[::1]:port`` → (lower-case name, port).

    The form of an HTTP ``Host`` header and of a ``[server] allowed_hosts`` entry; brackets
    are kept on IPv6 literals, a trailing dot is dropped. ValueError if malformed."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end < 0:
            raise ValueError(f"unterminated IPv6 literal in {value!r}")
        host, rest = v[: end + 1], v[end + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"bad IPv6 literal in {value!r}") from None
        if rest and not rest.startswith(":"):
            raise ValueError(f"junk after the IPv6 literal in {value!r}")
        port_text = rest[1:] if rest else None
    else:
        host, sep, port_text_ = v.partition(":")
        port_text = port_text_ if sep else None
        host = host.removesuffix(".")
        if not _HOST_NAME_RE.fullmatch(host):
            raise ValueError(f"not a host name or address: {value!r}")
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or len(port_text) > 5 or not 0 < int(port_text) <= 65535:
            raise ValueError(f"bad port in {value!r}")
        port = int(port_text)
    return host, port


def parse_origin(value: str) -> tuple[str, str, int]:
    """``scheme://host[:port]`` (a browser's ``Origin``) → (scheme, host, port); the
    default port of the scheme fills in a missing one. ValueError if malformed (``null``,
    a path, user info, another scheme)."""
    scheme, sep, rest = value.strip().partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in DEFAULT_PORTS or not rest or any(c in rest for c in "/?#@"):
        raise ValueError(f"not an origin (scheme://host[:port]): {value!r}")
    host, port = parse_host_port(rest)
    return scheme, host, DEFAULT_PORTS[scheme] if port is None else port


DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_NAME_RE = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
