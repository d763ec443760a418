"""The daemon's VAPID key pair (RFC 8292) and a push message's encryption (RFC 8291,
``aes128gcm`` of RFC 8188), through py-vapid and http_ece: this module only keeps the key
and calls them.

The key pair is made once, on first use, as ``<data-dir>/vapid.pem`` (PKCS#8, 0600, written
to a temporary name and linked into place, so two starts racing keep one key): browsers'
subscriptions are bound to its public key (``applicationServerKey``), so a new key would
orphan every subscription. Replicas sharing a store must share this file.
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
from pathlib import Path
from typing import Any, cast

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02

from bridge.errors import BridgeError

KEY_FILE = "vapid.pem"
TOKEN_LIFE_S = 12 * 3600  # RFC 8292 §2: exp at most 24 hours ahead


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _load_or_make(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        pem = path.read_bytes()
    except FileNotFoundError:
        pem = _make(path)
    except OSError as exc:
        raise BridgeError(f"cannot read {path}: {exc.strerror}", code="data_dir_unusable") from exc
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise BridgeError(f"{path} is not a PEM private key; remove it to make a new one", code="config_error") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise BridgeError(f"{path} is not a P-256 key; remove it to make a new one", code="config_error")
    return key


def _make(path: Path) -> bytes:
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another start made one first: that one is kept
        except FileExistsError:
            return path.read_bytes()
    except OSError as exc:
        raise BridgeError(f"cannot write {path}: {exc.strerror}", code="data_dir_unusable") from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return pem


class Vapid:
    """The key pair: signs a token for an endpoint's origin; its public key for browsers."""

    def __init__(self, data_dir: Path, subject: str) -> None:
        self._key = _load_or_make(data_dir / KEY_FILE)
        self._vapid = Vapid02()
        self._vapid.private_key = self._key
        self.subject = subject
        raw = self._key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        self.public_key = b64url(raw)  # what a page gives pushManager.subscribe

    def authorization(self, audience: str, now: float | None = None) -> str:
        """The ``Authorization: vapid t=…, k=…`` value for a push to ``audience`` (the
        endpoint's origin), valid for TOKEN_LIFE_S."""
        exp = int(now if now is not None else time.time()) + TOKEN_LIFE_S
        headers = cast(dict[str, Any], self._vapid.sign({"aud": audience, "exp": exp, "sub": self.subject}))
        return str(headers["Authorization"])


def encrypt(payload: bytes, p256dh: str, auth: str) -> bytes:
    """``payload`` encrypted for the browser that holds ``p256dh``'s private key and
    ``auth`` (RFC 8291): a fresh sender key and salt each time; the body is one record."""
    sender = ec.generate_private_key(ec.SECP256R1())
    body = http_ece.encrypt(
        payload,
        salt=os.urandom(16),
        private_key=sender,
        dh=b64url_decode(p256dh),
        auth_secret=b64url_decode(auth),
        version="aes128gcm",
    )
    return bytes(body)
