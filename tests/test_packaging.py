"""A non-editable install carries the web page (README command 1 is ``pip install .``):
the wheel holds every file of web/ as bridge/web/, and the installed package finds and
serves them from there."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT

PROBE = """
import asyncio, sys
import httpx
from fastapi import FastAPI
import bridge
from bridge.api import web
root = web.web_root()
assert str(root).startswith(sys.argv[1]), (bridge.__file__, root)
app = FastAPI()
app.include_router(web.make_router())
async def main():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        page = await c.get("/")
        asset = await c.get("/assets/app.js")
    assert page.status_code == 200 and "<title>agent-bridge</title>" in page.text, page.status_code
    assert asset.status_code == 200 and asset.headers["content-type"].startswith("text/javascript")
    print("served from", root)
asyncio.run(main())
"""


def test_the_wheel_carries_the_page_and_the_installed_package_serves_it(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = dist.glob("agent_bridge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"bridge/web/{p.relative_to(ROOT / 'web').as_posix()}" for p in (ROOT / "web").rglob("*") if p.is_file()
    }
    assert expected and expected <= names, expected - names
    assert "bridge/web/index.html" in names and "bridge/py.typed" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # The unpacked wheel comes first on the path, ahead of this checkout.
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(site)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=str(tmp_path),
        check=False,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert f"served from {site}/bridge/web" in probe.stdout
