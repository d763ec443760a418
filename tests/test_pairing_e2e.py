"""Pairing a phone (issue #39 item 3): the sign-in link as a QR code in the terminal
(``agent-bridge login-link --qr``; ``serve``'s first lines on a terminal, never in a pipe or
a log file), and ``POST /v1/me/pairing``, the page's fresh code each time, whose session
ends with the one that minted it. Real daemons, real processes, a real pseudo-terminal;
every QR code read back by zxing-cpp, a decoder independent of the encoder."""

from __future__ import annotations

import asyncio
import base64
import os
import pty
import re
import signal
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest
import segno
from conftest import STEP_TIMEOUT, TOKEN, Daemon, base_config, bridge_cli
from support.qr_read import decode_modules, modules_from_half_blocks

from bridge import qr

pytestmark = pytest.mark.asyncio


def qr_block(out: str, link: str, before: str = "") -> list[str]:
    """The QR lines printed after ``link``'s own line (``before`` it) and a blank one."""
    lines = out.replace("\r", "").split("\n")
    at = lines.index(before + link)
    assert lines[at + 1] == "", lines[at : at + 3]
    height = len(qr.terminal_lines(link, colour=False))
    return lines[at + 2 : at + 2 + height]


def read_back(lines: list[str], link: str) -> None:
    """The printed blocks are exactly segno's symbol for ``link``, and a reader that never
    saw segno decodes them to ``link``."""
    rows = modules_from_half_blocks(lines)
    expected = [[bool(m) for m in r] for r in segno.make_qr(link, error="l").matrix_iter(border=4)]
    # An odd number of rows is padded with one light row at the bottom.
    assert rows[: len(expected)] == expected and not any(any(r) for r in rows[len(expected) :])
    assert decode_modules(rows) == [link]


async def test_login_link_qr_prints_the_link_and_a_qr_code_that_decodes_to_it(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env), token=None)  # the token file
    rc, out, err = await bridge_cli("login-link", "--qr", "--data-dir", str(d.data_dir))
    assert rc == 0, err
    link = out.split("\n", 1)[0]
    assert link.startswith(f"{d.url}/#login=")
    block = qr_block(out, link)
    assert "\x1b" not in out  # piped: plain text, no colour escapes
    read_back(block, link)
    # The code in the QR code is the link's own: it signs a browser in, once.
    code = link.split("#login=", 1)[1]
    async with httpx.AsyncClient(base_url=d.url) as http:
        assert (await http.post("/v1/session", json={"code": code})).status_code == 204
        assert (await http.post("/v1/session", json={"code": code})).status_code == 401
    # Without --qr, the link alone, as before.
    rc, out, _ = await bridge_cli("login-link", "--data-dir", str(d.data_dir))
    assert rc == 0 and out.count("\n") == 1 and "█" not in out


class PtyServe:
    """``agent-bridge serve`` whose stdout is a pseudo-terminal, as in a person's shell."""

    def __init__(self, d: Daemon, env: dict[str, str]) -> None:
        self.d = d
        self.env = env
        self.out = b""
        self.more = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        master, slave = pty.openpty()
        os.set_blocking(master, False)
        self.master = master
        argv = [sys.executable, "-m", "bridge", "serve", "--port", "0", "--config", str(self.d.config_path)]
        argv += ["--data-dir", str(self.d.data_dir), "--log-format", "json", "--token", TOKEN]
        with self.d.stderr_path.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=slave, stderr=err, stdin=asyncio.subprocess.DEVNULL, env=self.env, cwd=str(self.d.tmp)
            )
        os.close(slave)
        asyncio.get_running_loop().add_reader(master, self._read)

    def _read(self) -> None:
        try:
            self.out += os.read(self.master, 65536)
        except OSError:  # EIO: the daemon closed its side
            asyncio.get_running_loop().remove_reader(self.master)
        self.more.set()

    async def until(self, pattern: str) -> re.Match[str]:
        async with asyncio.timeout(STEP_TIMEOUT):
            while (m := re.search(pattern, self.out.decode(errors="replace"))) is None:
                self.more.clear()
                await self.more.wait()
        return m

    async def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(self.proc.wait(), 30)
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)


async def test_serve_draws_the_start_up_link_as_a_qr_code_on_a_terminal_only(
    tmp_path: Path, agent_env: dict[str, str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_") and k != "NO_COLOR"}
    (tmp_path / "tty").mkdir()
    s = PtyServe(Daemon(tmp_path / "tty", base_config(tmp_path, agent_env)), env)
    await s.start()
    try:
        link = (await s.until(r"open (http://\S+#login=\S+)\r\n"))[1]
        height = len(qr.terminal_lines(link, colour=False))
        # The link's line, a blank line, then the QR code, each line coloured black on white.
        await s.until(re.escape(link) + r"\r\n\r\n" + r"(\x1b\[30;107m[ █▀▄]+\x1b\[0m\r\n)" + f"{{{height}}}")
        block = qr_block(s.out.decode(), link, before="open ")
        assert all(line.startswith("\x1b[30;107m") and line.endswith("\x1b[0m") for line in block)
        read_back(block, link)
        async with httpx.AsyncClient(base_url=link.split("/#", 1)[0]) as http:
            r = await http.post("/v1/session", json={"code": link.split("#login=", 1)[1]})
        assert r.status_code == 204
    finally:
        await s.stop()
    # Piped (a log file, a desktop shell): the link once, as before, and no QR code.
    d = Daemon(tmp_path, base_config(tmp_path, agent_env))
    await d.start()
    await d.stop()
    assert d.proc is not None and d.proc.stdout is not None
    rest = (await d.proc.stdout.read()).decode()
    assert rest.count("#login=") == 1 and rest.startswith("open ") and not re.search("[█▀▄]", rest), rest


# --------------------------------------------------------------------------- POST /v1/me/pairing


def svg_modules(data_uri: str) -> list[list[bool]]:
    """The modules of segno's SVG (one path of horizontal runs, 4 px a module), read from
    the path's moves: enough to hand the picture to an independent decoder."""
    prefix, _, payload = data_uri.partition(",")
    assert prefix.startswith("data:image/svg+xml"), prefix
    svg = base64.b64decode(payload).decode() if prefix.endswith(";base64") else urllib.parse.unquote(payload)
    size = int(re.search(r"width=['\"](\d+)", svg)[1]) // 4  # type: ignore[index]
    rows = [[False] * size for _ in range(size)]
    path = re.search(r"<path[^>]*stroke=[^>]*\sd=['\"]([^'\"]+)", svg)[1]  # type: ignore[index]
    x = y = 0.0
    for op, a, b in re.findall(r"([Mmhv])(-?[\d.]+)(?:[ ,](-?[\d.]+))?", path):
        if op == "M":
            x, y = float(a), float(b)
        elif op == "m":
            x, y = x + float(a), y + float(b)
        elif op == "h":
            for i in range(round(float(a))):
                rows[int(y)][int(x) + i] = True
            x += float(a)
    return rows


async def test_pairing_gives_a_fresh_code_each_time_bound_to_the_session_that_asked(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env, server="session_ttl_s = 3600\n"))
    async with httpx.AsyncClient(base_url=d.url) as anon:
        r = await anon.post("/v1/me/pairing")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    async with httpx.AsyncClient(base_url=d.url) as browser:
        r = await browser.post("/v1/session", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 204
        first = await browser.post("/v1/me/pairing")
        second = await browser.post("/v1/me/pairing")
    assert first.status_code == second.status_code == 201, first.text
    assert first.headers["cache-control"] == "no-store"
    a, b = first.json(), second.json()
    assert a["code"] != b["code"] and a["expires_in_s"] == 600
    assert a["link"] == f"{d.url}/#login={a['code']}"  # where this browser reached the daemon
    assert decode_modules(svg_modules(a["qr_svg"])) == [a["link"]]
    # Used once, then refused; the phone's session ends no later than the one that paired it.
    async with httpx.AsyncClient(base_url=d.url) as phone:
        r = await phone.post("/v1/session", json={"code": a["code"]})
        assert r.status_code == 204
        max_age = int(re.search(r"Max-Age=(\d+)", r.headers["set-cookie"])[1])  # type: ignore[index]
        assert 3500 < max_age <= 3600
        assert (await phone.get("/v1/me")).json()["name"] == "operator"
        again = await phone.post("/v1/session", json={"code": a["code"]})
        assert again.status_code == 401
    # A code whose session signed out is refused: no session outlives itself through codes.
    async with httpx.AsyncClient(base_url=d.url) as browser:
        await browser.post("/v1/session", headers={"Authorization": f"Bearer {TOKEN}"})
        code = (await browser.post("/v1/me/pairing")).json()["code"]
        assert (await browser.delete("/v1/session")).status_code == 204
    async with httpx.AsyncClient(base_url=d.url) as phone:
        assert (await phone.post("/v1/session", json={"code": code})).status_code == 401
    # The bearer token mints one that is bound to no session.
    async with d.http() as http:
        r = await http.post("/v1/me/pairing")
    async with httpx.AsyncClient(base_url=d.url) as phone:
        assert (await phone.post("/v1/session", json={"code": r.json()["code"]})).status_code == 204


async def test_a_pairing_code_expires_as_a_login_code_does(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    ttl = 0.5
    d = await daemon_factory(base_config(tmp_path, agent_env, server=f"login_code_ttl_s = {ttl}\n"))
    async with d.http() as http:
        body = (await http.post("/v1/me/pairing")).json()
    assert body["expires_in_s"] == ttl
    # What is awaited here is the clock itself: the code's lifetime, then a margin.
    await asyncio.sleep(ttl + 0.5)
    async with httpx.AsyncClient(base_url=d.url) as phone:
        r = await phone.post("/v1/session", json={"code": body["code"]})
    assert r.status_code == 401 and "set-cookie" not in r.headers


async def test_in_users_mode_a_user_pairs_only_as_themselves_and_a_revoked_users_code_fails(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    cfg = base_config(tmp_path, agent_env) + f'\n[auth]\nmode = "users"\n\n[store]\nurl = "{url}"\n'
    d = await daemon_factory(cfg)
    tokens = {}
    for name in ("alice", "bob"):
        rc, out, err = await bridge_cli("users", "add", name, "--store-url", url)
        assert rc == 0, err
        tokens[name] = out.strip()
    codes = {}
    for name, token in tokens.items():
        async with httpx.AsyncClient(base_url=d.url) as browser:
            assert (await browser.post("/v1/session", headers={"Authorization": f"Bearer {token}"})).status_code == 204
            r = await browser.post("/v1/me/pairing")
            assert r.status_code == 201, r.text
            codes[name] = r.json()["code"]
    async with httpx.AsyncClient(base_url=d.url) as phone:
        assert (await phone.post("/v1/session", json={"code": codes["alice"]})).status_code == 204
        assert (await phone.get("/v1/me")).json()["name"] == "alice"
    rc, _, err = await bridge_cli("users", "revoke", "bob", "--store-url", url)
    assert rc == 0, err
    async with httpx.AsyncClient(base_url=d.url) as phone:
        assert (await phone.post("/v1/session", json={"code": codes["bob"]})).status_code == 401
