"""A loopback Web Push service for tests (issue #39): a real HTTP server on port 0 that
takes each push, checks its VAPID token (RFC 8292: ES256 against the key the daemon
serves, ``aud`` the endpoint's origin, ``exp`` within 24 hours) and decrypts its body
(RFC 8291 aes128gcm) with the private key of a browser the test made. Written from the
RFCs with ``cryptography``'s primitives, not with the libraries the daemon uses, so that
the daemon's wire format is checked by an independent reading.

Each subscription path may be given a list of answers (status, headers) to give in turn;
the last one repeats. The default is 201."""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


def b64u(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64u(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _hkdf(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


@dataclass
class Browser:
    """A browser's push key pair and auth secret, and its endpoint on the service."""

    endpoint: str
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    auth: bytes = field(default_factory=lambda: secrets.token_bytes(16))

    @property
    def public(self) -> bytes:
        return self.key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )

    def subscription(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "expirationTime": None,
            "keys": {"p256dh": b64u(self.public), "auth": b64u(self.auth)},
        }

    def decrypt(self, body: bytes) -> bytes:
        """RFC 8291 §3.4 and RFC 8188 §2: the header, the keys, the one record."""
        salt, rs, idlen = body[:16], int.from_bytes(body[16:20], "big"), body[20]
        sender_pub = body[21 : 21 + idlen]
        record = body[21 + idlen :]
        assert idlen == 65 and rs >= 18 and len(record) <= rs, (idlen, rs, len(record))
        sender = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), sender_pub)
        shared = self.key.exchange(ec.ECDH(), sender)
        ikm = _hkdf(self.auth, shared, b"WebPush: info\x00" + self.public + sender_pub, 32)
        cek = _hkdf(salt, ikm, b"Content-Encoding: aes128gcm\x00", 16)
        nonce = _hkdf(salt, ikm, b"Content-Encoding: nonce\x00", 12)
        padded = AESGCM(cek).decrypt(nonce, record, None)
        unpadded = padded.rstrip(b"\x00")
        assert unpadded.endswith(b"\x02"), "the last record ends with delimiter 2"
        return unpadded[:-1]


@dataclass
class Push:
    path: str
    headers: dict[str, str]
    body: bytes
    claims: dict[str, Any] | None = None
    vapid_key: str | None = None
    payload: dict[str, Any] | None = None


def verify_vapid(authorization: str, audience: str, now: float | None = None) -> tuple[dict[str, Any], str]:
    """``vapid t=<JWT>, k=<key>`` checked (RFC 8292 §3): the claims and the key."""
    scheme, _, params = authorization.partition(" ")
    assert scheme.lower() == "vapid", authorization[:20]
    parts = dict(p.strip().split("=", 1) for p in params.split(","))
    token, key = parts["t"], parts["k"]
    head, claims_b64, sig = token.split(".")
    assert json.loads(unb64u(head)) == {"typ": "JWT", "alg": "ES256"}
    raw_sig = unb64u(sig)
    assert len(raw_sig) == 64
    der = utils.encode_dss_signature(int.from_bytes(raw_sig[:32], "big"), int.from_bytes(raw_sig[32:], "big"))
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64u(key))
    public.verify(der, f"{head}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))  # raises if forged
    claims = json.loads(unb64u(claims_b64))
    now = time.time() if now is None else now
    assert claims["aud"] == audience, claims
    assert now < claims["exp"] <= now + 24 * 3600, claims
    assert str(claims["sub"]).startswith(("mailto:", "https://")), claims
    return claims, key


class PushService:
    def __init__(self) -> None:
        self.pushes: list[Push] = []
        self.browsers: dict[str, Browser] = {}
        self.answers: dict[str, list[tuple[int, dict[str, str]]]] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                push = Push(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                try:
                    service._check(push)
                except Exception as exc:
                    service.errors.append(f"{type(exc).__name__}: {exc}")
                with service._lock:
                    service.pushes.append(push)
                    queue = service.answers.get(self.path) or [(201, {})]
                    status, headers = queue.pop(0) if len(queue) > 1 else queue[0]
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PushService:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def browser(self, name: str) -> Browser:
        b = Browser(f"{self.origin}/push/{name}-{secrets.token_urlsafe(8)}")
        self.browsers[b.endpoint.removeprefix(self.origin)] = b
        return b

    def _check(self, push: Push) -> None:
        assert push.headers.get("content-encoding") == "aes128gcm", push.headers
        assert int(push.headers["ttl"]) > 0 and push.headers.get("urgency") in ("high", "normal", "low")
        push.claims, push.vapid_key = verify_vapid(push.headers["authorization"], self.origin)
        browser = self.browsers[push.path]
        push.payload = json.loads(browser.decrypt(push.body))

    def to(self, browser: Browser) -> list[Push]:
        path = browser.endpoint.removeprefix(self.origin)
        with self._lock:
            return [p for p in self.pushes if p.path == path]
