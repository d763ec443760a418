"""The bundled web page (issue #7): ``GET /`` is ``web/index.html``, ``GET /assets/<path>``
the other files of ``web/``. No auth: the page holds no secret, and everything it shows
comes from the authenticated ``/v1`` API. Only files that exist when the daemon starts are
served (a fixed table, so no path from a request ever reaches the file system), each with
a content type from a short allowlist; security.PageHeaders adds the CSP and friends.

Where ``web/`` is: installed from a wheel it is package data at ``bridge/web/`` (setup.py
maps it there); in a source checkout or an editable install it is ``web/`` beside
``bridge/``.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from bridge.errors import NotFound

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
    ".json": "application/json",
    ".webmanifest": "application/manifest+json",
}
# Unhashed file names: the browser may keep a copy but must revalidate (ETag) each time.
CACHE = {"Cache-Control": "no-cache"}


def web_root() -> Path | None:
    pkg = Path(__file__).resolve().parent.parent
    for candidate in (pkg / "web", pkg.parent / "web"):
        if (candidate / "index.html").is_file():
            return candidate
    return None


def _table(root: Path | None) -> dict[str, Path]:
    if root is None:
        return {}
    return {
        p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in CONTENT_TYPES and not p.name.startswith(".")
    }


def make_router(root: Path | None = None) -> APIRouter:
    root = root or web_root()
    files = _table(root)
    router = APIRouter()

    def serve(rel: str) -> Response:
        path = files.get(rel)
        if path is None:
            raise NotFound(f"no such page asset: {rel[:200]}", code="not_found")
        return FileResponse(path, media_type=CONTENT_TYPES[path.suffix], headers=CACHE)

    @router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index() -> Response:
        return serve("index.html")

    @router.api_route("/sw.js", methods=["GET", "HEAD"], include_in_schema=False)
    async def service_worker() -> Response:
        # At the root, so that its scope is the whole page (/); a worker under /assets/
        # could control only /assets/ (docs/web.md "Install and push").
        return serve("sw.js")

    @router.api_route("/assets/{rel:path}", methods=["GET", "HEAD"], include_in_schema=False)
    async def asset(rel: str) -> Response:
        return serve(rel)

    return router
