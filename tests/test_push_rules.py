"""Web Push's pure rules and its keys (issue #39, bridge/push/rules.py, keys.py): which
subscriptions are taken, which addresses may be contacted, what notifies and says what, the
retry schedule; the VAPID key made once and private, its tokens and the message encryption
read back by the tests' independent reading of RFC 8291 and 8292."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from support.push_service import Browser, b64u, verify_vapid

from bridge.push import keys, rules


def good(endpoint: str = "https://push.example:8443/a/b") -> tuple[str, str, str]:
    b = Browser(endpoint)
    sub = b.subscription()
    return sub["endpoint"], sub["keys"]["p256dh"], sub["keys"]["auth"]


def test_a_subscription_is_checked_and_its_origin_is_the_token_audience() -> None:
    s = rules.check(*good(), allow_private=False)
    assert (s.host, s.port, s.origin) == ("push.example", 8443, "https://push.example:8443")
    assert rules.check(*good("https://Push.Example/x"), allow_private=False).origin == "https://push.example"
    loop = rules.check(*good("http://127.0.0.1:9/p"), allow_private=True)
    assert loop.origin == "http://127.0.0.1:9"
    with pytest.raises(rules.BadSubscription):  # plain http: only loopback, only when allowed
        rules.check(*good("http://127.0.0.1:9/p"), allow_private=False)
    with pytest.raises(rules.BadSubscription):
        rules.check(*good("http://push.example/p"), allow_private=True)


@pytest.mark.parametrize(
    ("endpoint", "p256dh", "auth"),
    [
        ("https://push.example/\x00", None, None),
        ("https://a b/x", None, None),
        ("https://push.example\\@evil/x", None, None),
        ("javascript:alert(1)", None, None),
        ("https://push.example:99999/x", None, None),
        (None, b64u(b"\x04" + b"\x00" * 64), None),  # not on the curve
        (None, b64u(b"\x02" + b"\x11" * 32), None),  # compressed: 33 bytes
        (None, None, b64u(b"x" * 17)),
        (None, "é" * 87, None),
    ],
)
def test_hostile_subscriptions_are_refused(endpoint: str | None, p256dh: str | None, auth: str | None) -> None:
    e, p, a = good()
    with pytest.raises(rules.BadSubscription):
        rules.check(endpoint or e, p256dh or p, auth or a, allow_private=True)


def test_only_public_addresses_may_be_contacted_unless_private_ones_are_allowed() -> None:
    for public in ("8.8.8.8", "2606:4700:4700::1111"):
        assert rules.address_allowed(public, allow_private=False)
    for private in ("127.0.0.1", "10.1.2.3", "192.168.1.1", "169.254.169.254", "::1", "fe80::1%eth0", "fc00::1"):
        assert not rules.address_allowed(private, allow_private=False), private
        assert rules.address_allowed(private, allow_private=True), private
    for never in ("0.0.0.0", "::", "224.0.0.1", "ff02::1", "::ffff:0.0.0.0", "not-an-address"):
        assert not rules.address_allowed(never, allow_private=True), never
    assert not rules.address_allowed("::ffff:10.0.0.1", allow_private=False)  # IPv4 inside IPv6


def test_what_notifies_and_what_it_says() -> None:
    n = rules.notice_for(
        "thr_1",
        "  A   long\ntitle " + "x" * 200,
        "permission.requested",
        {"tool": "Bash", "request_id": "r1", "input": {"command": "rm -rf /"}},
    )
    assert n is not None and n.kind == "permission" and n.request_id == "r1" and n.urgency == "high"
    body = json.loads(n.payload())
    assert body["title"].startswith("A long title x") and len(body["title"]) == rules.TITLE_CHARS
    assert body["line"] == "Permission waiting: Bash" and "rm -rf" not in n.payload().decode()
    assert n.ttl_s == rules.TTL_ASKING_S and len(n.topic) <= 32
    e = rules.notice_for("thr_1", "", "elicitation.requested", {"message": "your password?"})
    assert e is not None and e.title == "Untitled" and "password" not in e.payload().decode()
    ok = rules.notice_for("thr_1", "t", "turn.ended", {"status": "success"})
    assert ok is not None and (ok.kind, ok.line, ok.urgency, ok.ttl_s) == (
        "turn_ended",
        "Turn ended",
        "normal",
        rules.TTL_TURN_S,
    )
    bad = rules.notice_for("thr_1", "t", "turn.ended", {"status": "error", "reason": "daemon_stopped"})
    assert bad is not None and (bad.kind, bad.line) == ("turn_failed", "Turn failed (daemon_stopped)")
    assert rules.notice_for("thr_1", "t", "turn.ended", {"status": "cancelled"}) is None
    assert rules.notice_for("thr_1", "t", "turn.ended", {"status": "error", "error": "not started: x"}) is None
    assert rules.notice_for("thr_1", "t", "message", {"text": "hi"}) is None


def test_retries_wait_the_services_retry_after_or_double_and_are_capped() -> None:
    assert [rules.retry_delay(a, None) for a in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert rules.retry_delay(1, "3") == 3.0 and rules.retry_delay(1, "0") == 0.0
    assert rules.retry_delay(1, "86400") == rules.RETRY_CAP_S and rules.retry_delay(20, None) == rules.RETRY_CAP_S
    assert rules.retry_delay(2, "Wed, 21 Oct 2015 07:28:00 GMT") == 2.0  # a date: the schedule


def test_the_vapid_key_is_made_once_private_and_signs_for_an_audience(tmp_path: Path) -> None:
    v = keys.Vapid(tmp_path, "mailto:ops@example.com")
    mode = stat.S_IMODE(os.stat(tmp_path / keys.KEY_FILE).st_mode)
    assert mode == 0o600 and keys.Vapid(tmp_path, "mailto:x@example.com").public_key == v.public_key
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    claims, key = verify_vapid(v.authorization("https://push.example:8443"), "https://push.example:8443")
    assert key == v.public_key and claims["sub"] == "mailto:ops@example.com"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / keys.KEY_FILE).write_text("not a key")
    with pytest.raises(Exception, match="not a PEM private key"):
        keys.Vapid(tmp_path / "other", "mailto:ops@example.com")


def test_a_message_is_encrypted_for_the_browser_alone() -> None:
    phone = Browser("https://push.example/x")
    sub = phone.subscription()["keys"]
    body = keys.encrypt(b'{"v":1}', sub["p256dh"], sub["auth"])
    assert phone.decrypt(body) == b'{"v":1}'
    assert keys.encrypt(b'{"v":1}', sub["p256dh"], sub["auth"]) != body  # a fresh key and salt each time
    other = Browser("https://push.example/y")
    with pytest.raises(Exception):  # noqa: B017 (AESGCM's InvalidTag or a bad key: not the browser's)
        other.decrypt(body)
