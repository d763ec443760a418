"""GET /v1/workspace/dirs (issue #21): the working-directory picker's listing, confined
to ``[server] workspace_roots`` — in-process (a real app and store, real directories and
symlinks under tmp_path; no socket needed)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bridge.api.app import create_app
from bridge.config import ConfigError, load_settings

pytestmark = pytest.mark.timeout(30)
TOKEN = "t" * 32


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/{alpha/inner, beta, .hidden, file.txt, in-link → alpha, out-link → outside};
    outside/secret."""
    root = tmp_path / "root"
    for d in ("alpha/inner", "beta", ".hidden"):
        (root / d).mkdir(parents=True)
    (root / "file.txt").write_text("not a directory")
    (tmp_path / "outside" / "secret").mkdir(parents=True)
    (root / "in-link").symlink_to(root / "alpha")
    (root / "out-link").symlink_to(tmp_path / "outside")
    return root


@pytest.fixture
async def client(tmp_path: Path, tree: Path) -> AsyncIterator[httpx.AsyncClient]:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\nworkspace_roots = ["{tree}", "{tmp_path / "missing"}"]\n')
    settings = load_settings(config=str(cfg), data_dir=str(tmp_path / "data"), token=TOKEN, port=8765)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765", headers=headers) as c:
            yield c


async def test_the_roots_then_their_subdirectories(client: httpx.AsyncClient, tree: Path) -> None:
    r = await client.get("/v1/workspace/dirs")
    assert r.status_code == 200
    # A root that does not exist is not offered.
    assert r.json() == {
        "path": None,
        "parent": None,
        "dirs": [{"name": str(tree), "path": str(tree)}],
        "truncated": False,
    }
    r = await client.get("/v1/workspace/dirs", params={"path": str(tree)})
    assert r.status_code == 200
    body = r.json()
    # Directories only, no dot-directories, and no symlink that leads out of the roots.
    assert [d["name"] for d in body["dirs"]] == ["alpha", "beta", "in-link"]
    assert body["dirs"][0]["path"] == str(tree / "alpha")
    assert body["parent"] is None and body["path"] == str(tree)
    r = await client.get("/v1/workspace/dirs", params={"path": str(tree / "alpha")})
    assert r.json()["dirs"] == [{"name": "inner", "path": str(tree / "alpha" / "inner")}]
    assert r.json()["parent"] == str(tree)


async def test_nothing_outside_the_roots_is_listed(client: httpx.AsyncClient, tree: Path, tmp_path: Path) -> None:
    for path in (
        str(tmp_path / "outside"),
        str(tree / "out-link"),  # a symlink inside a root that points out of it
        str(tree / "out-link" / "secret"),
        str(tree / ".." / "outside"),  # .. out of the root
        str(tree) + "-sibling",  # a name that only starts like the root
        "/",
        "/etc",
    ):
        r = await client.get("/v1/workspace/dirs", params={"path": path})
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["code"] == "path_outside_roots"
    r = await client.get("/v1/workspace/dirs", params={"path": str(tree / "in-link")})
    assert r.status_code == 200 and r.json()["path"] == str(tree / "alpha")  # resolved, inside


async def test_bad_paths_and_missing_directories(client: httpx.AsyncClient, tree: Path) -> None:
    for path, status, code in [
        ("alpha", 400, "bad_path"),
        ("", 400, "bad_path"),
        (str(tree / "nope"), 404, "not_found"),
        (str(tree / "file.txt"), 404, "not_found"),
    ]:
        r = await client.get("/v1/workspace/dirs", params={"path": path})
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), path
    r = await client.get("/v1/workspace/dirs", params={"path": str(tree)}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


async def test_without_roots_nothing_is_listed(tmp_path: Path) -> None:
    app = create_app(load_settings(data_dir=str(tmp_path / "data"), token=TOKEN, port=8765))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1:8765", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as c:
            assert (await c.get("/v1/workspace/dirs")).json()["dirs"] == []
            r = await c.get("/v1/workspace/dirs", params={"path": str(tmp_path)})
            assert r.status_code == 403


def test_roots_must_be_absolute(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('[server]\nworkspace_roots = ["relative/dir"]\n')
    with pytest.raises(ConfigError, match="workspace_roots"):
        load_settings(config=str(cfg), data_dir=str(tmp_path), token=TOKEN, port=8765)
    cfg.write_text('[server]\nworkspace_roots = ["~/projects"]\n')
    s = load_settings(config=str(cfg), data_dir=str(tmp_path), token=TOKEN, port=8765)
    assert s.server.workspace_roots == [os.path.join(os.path.expanduser("~"), "projects")]


async def test_the_demo_threads_default_workspace_holds_sample_files(client: httpx.AsyncClient, tmp_path: Path) -> None:
    from bridge.sessions.samples import SAMPLES

    thread = (await client.post("/v1/threads", json={"agent": "demo"})).json()
    work = Path(thread["cwd"])
    assert work.parent == tmp_path / "data" / "workspaces"
    assert sorted(p.name for p in work.iterdir()) == sorted(SAMPLES)
    assert (work / "hello.py").read_text() == SAMPLES["hello.py"]
    # A thread given a directory gets nothing written into it.
    own = tmp_path / "mine"
    own.mkdir()
    r = await client.post("/v1/threads", json={"agent": "demo", "cwd": str(own)})
    assert r.status_code == 201 and list(own.iterdir()) == []
