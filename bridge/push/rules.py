"""PURE what Web Push allows and says: a subscription checked, which committed events
notify, each notification's payload, the retry schedule, which addresses the daemon may
contact. No I/O here (the address check takes the resolved addresses as given).

Limits are the daemon's own, written where they are checked:

* an endpoint is an absolute ``https`` URL of at most ``MAX_ENDPOINT`` characters, with a
  host, no user info, no fragment; ``http`` only for a loopback host and only with
  ``[push] allow_private_endpoints`` (a test's push service);
* ``p256dh`` is a base64url P-256 public key (65 bytes, uncompressed, on the curve);
  ``auth`` a base64url 16-byte secret (RFC 8291 §2, §3);
* the daemon contacts an endpoint's host only when every address it resolves to is public
  (``is_global``), unless ``allow_private_endpoints``: an endpoint is a URL a client chose,
  and a POST to an intranet or cloud-metadata address is the daemon's to refuse (SSRF).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric import ec

from bridge.network import is_loopback_host

MAX_ENDPOINT = 2048
P256DH_BYTES = 65  # an uncompressed P-256 point (RFC 8291 §3.1)
AUTH_BYTES = 16  # the auth secret (RFC 8291 §3.2)
TITLE_CHARS = 80
LINE_CHARS = 120
# Retries of one delivery (429, 5xx, a network error): at most this many attempts, each
# after the push service's Retry-After or the schedule, never longer than RETRY_CAP_S.
ATTEMPTS = 4
RETRY_BASE_S = 1.0
RETRY_CAP_S = 60.0
# How long a push service keeps a message for an offline browser (the TTL header): a
# permission or a question waits at most permission_timeout_s (300 s by default), so
# telling of it later is noise; a turn's end is worth a day.
TTL_ASKING_S = 600
TTL_TURN_S = 86_400

Kind = Literal["permission", "elicitation", "turn_ended", "turn_failed"]


class BadSubscription(ValueError):
    """A subscription refused, with what is wrong (never the endpoint's path or keys)."""


@dataclass(frozen=True, slots=True)
class Subscription:
    endpoint: str
    p256dh: str
    auth: str
    host: str
    port: int
    origin: str  # scheme://host[:port], the VAPID token's audience (RFC 8292 §2)


def _b64url(value: str, size: int, what: str) -> bytes:
    if not isinstance(value, str) or len(value) > 4 * size or not value.isascii():
        raise BadSubscription(f"keys.{what} must be base64url text")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise BadSubscription(f"keys.{what} is not base64url") from None
    if len(raw) != size:
        raise BadSubscription(f"keys.{what} must be {size} bytes, not {len(raw)}")
    return raw


def check(endpoint: str, p256dh: str, auth: str, *, allow_private: bool) -> Subscription:
    """A browser's subscription (PushSubscription.toJSON()), checked; BadSubscription says why."""
    scheme, host, port = _endpoint(endpoint, allow_private=allow_private)
    key = _b64url(p256dh, P256DH_BYTES, "p256dh")
    try:
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), key)
    except ValueError:
        raise BadSubscription("keys.p256dh is not a P-256 public key") from None
    _b64url(auth, AUTH_BYTES, "auth")
    default = 443 if scheme == "https" else 80
    shown = f"[{host}]" if ":" in host else host
    origin = f"{scheme}://{shown}" + ("" if port == default else f":{port}")
    return Subscription(endpoint, p256dh, auth, host, port, origin)


def _endpoint(endpoint: str, *, allow_private: bool) -> tuple[str, str, int]:
    """The endpoint's scheme, host and port, or BadSubscription."""
    if len(endpoint) > MAX_ENDPOINT or not (endpoint.isascii() and endpoint.isprintable()):
        raise BadSubscription(f"endpoint must be a URL of at most {MAX_ENDPOINT} printable ASCII characters")
    try:
        url = urlsplit(endpoint)
        port = url.port
    except ValueError:
        raise BadSubscription("endpoint is not a URL") from None
    host = (url.hostname or "").lower()
    plain = url.username is None and url.password is None and not url.fragment
    if not host or not plain or any(c in endpoint for c in " \\"):
        raise BadSubscription("endpoint must be an absolute URL with a host, no user info and no fragment")
    _scheme(url.scheme, host, allow_private=allow_private)
    return url.scheme, host, port or (443 if url.scheme == "https" else 80)


def _scheme(scheme: str, host: str, *, allow_private: bool) -> None:
    if scheme == "http" and not (allow_private and is_loopback_host(host)):
        raise BadSubscription("endpoint must be https (http only for a loopback push service allowed by the config)")
    if scheme not in ("https", "http"):
        raise BadSubscription("endpoint must be https")


def address_allowed(address: str, *, allow_private: bool) -> bool:
    """Whether the daemon may connect to ``address`` (one the endpoint's host resolved to)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_multicast or ip.is_unspecified:
        return False
    return allow_private or ip.is_global


# ---------------------------------------------------------------------- what notifies


@dataclass(frozen=True, slots=True)
class Notice:
    """One notification: what the service worker shows, and how urgently it is sent."""

    thread_id: str
    kind: Kind
    title: str
    line: str
    request_id: str | None = None

    @property
    def ttl_s(self) -> int:
        return TTL_ASKING_S if self.kind in ("permission", "elicitation") else TTL_TURN_S

    @property
    def urgency(self) -> str:
        return "high" if self.kind in ("permission", "elicitation") else "normal"

    @property
    def topic(self) -> str:
        """RFC 8030 §5.4: a newer message of the same topic replaces an undelivered one
        (≤ 32 base64url characters): one per thread and kind of news."""
        short = {"permission": "p", "elicitation": "e", "turn_ended": "t", "turn_failed": "t"}[self.kind]
        return (short + "-" + self.thread_id.replace("_", "-"))[:32]

    def payload(self) -> bytes:
        """The JSON the service worker receives (docs/web.md): small, no prompt text but the
        thread's title, no tool input, no secret; ``request_id`` lets a notification answer."""
        body: dict[str, Any] = {"v": 1, "thread_id": self.thread_id, "kind": self.kind, "title": self.title}
        body["line"] = self.line
        if self.request_id is not None:
            body["request_id"] = self.request_id
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _short(text: object, limit: int) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def notice_for(thread_id: str, title: object, kind: str, data: dict[str, Any]) -> Notice | None:
    """The notification a committed event makes, if any: a permission or a question asked,
    a turn ended or failed. A turn a user cancelled, and a prompt that never started (the
    turn before it failed: that one is told), make none."""
    name = _short(title, TITLE_CHARS) or "Untitled"
    if kind == "permission.requested":
        tool = _short(data.get("tool"), 40) or "a tool"
        rid = data.get("request_id")
        return Notice(
            thread_id, "permission", name, f"Permission waiting: {tool}", rid if isinstance(rid, str) else None
        )
    if kind == "elicitation.requested":
        return Notice(thread_id, "elicitation", name, "The agent asks you something")
    if kind != "turn.ended":
        return None
    status, error = data.get("status"), data.get("error")
    if status == "cancelled" or (isinstance(error, str) and error.startswith("not started")):
        return None
    if status in ("success", "completed", None):
        return Notice(thread_id, "turn_ended", name, "Turn ended")
    reason = _short(data.get("reason") or status, 40)
    return Notice(thread_id, "turn_failed", name, f"Turn failed ({reason})"[:LINE_CHARS])


def retry_delay(attempt: int, retry_after: str | None) -> float:
    """Seconds before attempt ``attempt + 1`` (attempt counts from 1): the push service's
    Retry-After in seconds when it gave one, else doubling from RETRY_BASE_S; at most
    RETRY_CAP_S either way."""
    if retry_after is not None and retry_after.strip().isdigit():
        return min(float(retry_after.strip()), RETRY_CAP_S)
    return float(min(RETRY_BASE_S * 2 ** (attempt - 1), RETRY_CAP_S))
