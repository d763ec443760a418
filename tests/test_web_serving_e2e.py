"""The daemon serves the bundled page (issue #7) with strict headers (issue #6 item 7), and
the one-time login link it prints at start-up trades for a session cookie exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from conftest import ROOT, STEP_TIMEOUT, TOKEN, Daemon, base_config

from bridge.api.login_codes import LoginCodes
from bridge.cli import page_link

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'; manifest-src 'self'; worker-src 'self'"
)
ASSETS = ("app.js", "stream.js", "transcript.js", "markdown.js", "highlight.js", "style.css", "icon.svg")


async def second_line(d: Daemon) -> str:
    assert d.proc is not None and d.proc.stdout is not None
    line = await asyncio.wait_for(d.proc.stdout.readline(), STEP_TIMEOUT)
    return line.decode().rstrip("\n")


def login_code(line: str, d: Daemon) -> str:
    prefix = f"open {d.url}/#login="
    assert line.startswith(prefix), line
    return line.removeprefix(prefix)


def anon(d: Daemon, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=d.url, headers=headers, timeout=STEP_TIMEOUT)


def assert_page_headers(r: httpx.Response) -> None:
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"


async def test_page_and_assets_are_served_without_auth_with_strict_headers(daemon: Daemon) -> None:
    async with anon(daemon) as http:
        page = await http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert_page_headers(page)
        assert '<script type="module" src="/assets/app.js"></script>' in page.text
        assert "<script>" not in page.text and " style=" not in page.text  # nothing inline
        head = await http.head("/")  # monitors and `curl -I` ask with HEAD
        assert (head.status_code, head.content) == (200, b"")
        assert head.headers["content-type"] == page.headers["content-type"]
        assert_page_headers(head)
        types = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}
        for name in ASSETS:
            r = await http.get(f"/assets/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-type"].startswith(types[name.rsplit(".", 1)[1]])
            assert_page_headers(r)
        # JSON answers carry them too, refusals included.
        api = await http.get("/v1/threads")
        assert api.status_code == 401
        assert_page_headers(api)
        for path in (
            "/assets/nope.js",
            "/assets/../bridge/cli.py",
            "/assets/%2e%2e/pyproject.toml",
            "/assets//etc/passwd",
            "/index.html",
        ):
            r = await http.get(path)
            assert r.status_code == 404, path
            assert r.json()["error"]["code"] == "not_found"


async def test_the_startup_link_logs_a_browser_in_once(daemon: Daemon) -> None:
    line = await second_line(daemon)
    code = login_code(line, daemon)
    assert len(code) >= 40
    own = {"Origin": daemon.url}
    async with anon(daemon, **own) as http:
        wrong = await http.post("/v1/session", json={"code": code[:-1] + ("A" if code[-1] != "A" else "B")})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
        assert "set-cookie" not in wrong.headers
        for junk in ({}, {"code": None}, {"code": 12}, [code], {"code": ""}):
            assert (await http.post("/v1/session", json=junk)).status_code == 401
        # The code travels in the body, never the query.
        assert (await http.post("/v1/session", params={"code": code})).status_code == 401
        ok = await http.post("/v1/session", json={"code": code})
        assert ok.status_code == 204
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        # The cookie works for REST ...
        assert (await http.get("/v1/threads")).status_code == 200
    # ... and the code is spent.
    async with anon(daemon, **own) as http:
        again = await http.post("/v1/session", json={"code": code})
        assert again.status_code == 401
        assert (await http.get("/v1/threads")).status_code == 401
    err = daemon.stderr()
    assert code not in err and TOKEN not in err


async def test_a_login_code_expires(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d: Daemon = await daemon_factory(base_config(tmp_path, agent_env, server="login_code_ttl_s = 0.000001\n"))
    code = login_code(await second_line(d), d)
    async with anon(d) as http:
        r = await http.post("/v1/session", json={"code": code})
        assert r.status_code == 401 and "set-cookie" not in r.headers


async def test_the_token_still_mints_a_session_and_a_wrong_token_beats_a_good_code(daemon: Daemon) -> None:
    code = login_code(await second_line(daemon), daemon)
    async with anon(daemon, Authorization="Bearer wrong") as http:
        # A bearer header that is present decides alone: the code is not even looked at.
        assert (await http.post("/v1/session", json={"code": code})).status_code == 401
    async with anon(daemon, Authorization=f"Bearer {TOKEN}") as http:
        assert (await http.post("/v1/session")).status_code == 204
    async with anon(daemon) as http:
        assert (await http.post("/v1/session", json={"code": code})).status_code == 204


def test_the_link_names_a_loopback_address_and_carries_a_code_only_with_auth() -> None:
    codes = LoginCodes()
    assert (
        page_link("http", "127.0.0.1", 8765, SimpleNamespace(token=None, login_codes=codes)) == "http://127.0.0.1:8765/"
    )
    assert len(codes) == 0
    link = page_link("https", "0.0.0.0", 9, SimpleNamespace(token="t", login_codes=codes))
    assert link.startswith("https://127.0.0.1:9/#login=") and len(codes) == 1
    assert page_link("http", "::1", 9, SimpleNamespace(token=None, login_codes=codes)) == "http://[::1]:9/"


def test_login_codes_are_single_use_bounded_and_expire() -> None:
    now = [0.0]
    codes = LoginCodes(ttl_s=10, limit=2, clock=lambda: now[0])
    a, b = codes.issue(), codes.issue()
    assert not codes.redeem(a + "x") and not codes.redeem(None) and not codes.redeem("")
    assert codes.redeem(a) and not codes.redeem(a)
    c = codes.issue()
    d = codes.issue()  # over the limit: the oldest (b) is dropped
    assert not codes.redeem(b) and codes.redeem(c)
    now[0] = 10.0
    assert not codes.redeem(d) and len(codes) == 0


def test_the_page_never_parses_strings_as_html() -> None:
    """A source check backing the browser tests (tests/web/): the page builds every node
    with createElement/textContent, so no string it receives can become markup or code."""
    scripts = sorted((ROOT / "web").glob("*.js"))
    assert scripts
    for path in scripts:
        text = path.read_text()
        for bad in (
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            'setAttribute("on',
            "srcdoc",
        ):
            assert bad not in text, f"{path.name} uses {bad}"
