"""docs/api.md stays the reference: every error code, event kind and WebSocket close code
the code can produce is in it, every ``docs/api.md §N`` citation names a section that
exists, every relative link in the docs resolves, and nothing outside bridge/ and bench/
cites a document that is not in this repository (issue #14 item 7). Pure file reads."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"
# The demo agent is an agent, not the daemon: its codes are its own.
SKIP = {ROOT / "bridge" / "demo_agent.py"}
SNAKE = re.compile(r"[a-z]+(?:_[a-z]+)+|[a-z]+")


def api_text() -> str:
    return API_MD.read_text(encoding="utf-8")


def section(number: str) -> str:
    """The text of §number of docs/api.md, up to the next anchor."""
    text = api_text()
    start = text.index(f'<a id="s{number}"></a>')
    end = text.find('<a id="s', start + 1)
    return text[start : end if end >= 0 else len(text)]


def bridge_trees() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted((ROOT / "bridge").rglob("*.py")):
        if path not in SKIP:
            yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _status(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and 100 <= node.value <= 599


def error_codes() -> set[str]:
    """Every machine-readable error code written in bridge/: ``code="…"`` arguments,
    ``code = "…"`` class attributes, ``{"code": "…"}`` bodies, ``{status: "code"}`` maps,
    and a snake_case string that follows an HTTP status in a call or a tuple."""
    codes: set[str] = set()
    for _, tree in bridge_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "code" and (s := _str(node.value)):
                codes.add(s)
            elif isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "code" for t in stmt.targets
                    ):
                        if s := _str(stmt.value):
                            codes.add(s)
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if _str(k) == "code" and (s := _str(v)):
                        codes.add(s)
                    elif k is not None and _status(k) and (s := _str(v)):
                        codes.add(s)
            elif isinstance(node, (ast.Call, ast.Tuple)):
                items = node.args if isinstance(node, ast.Call) else node.elts
                for i, item in enumerate(items):
                    if _status(item):
                        follow = [_str(x) for x in items[i + 1 : i + 3]]
                        found = next((s for s in follow if s and SNAKE.fullmatch(s) and "_" in s), None)
                        if found:
                            codes.add(found)
    return codes


def emitted_kinds() -> set[str]:
    """Kinds of ``Event(source, kind, …)``, ``self._ev(kind, …)``, ``ephemeral(kind, …)``
    and ``ev.kind = "…"`` rewrites in bridge/."""
    kinds: set[str] = set()
    for _, tree in bridge_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name == "Event" and len(node.args) >= 2 and (s := _str(node.args[1])):
                    kinds.add(s)
                elif name in ("_ev", "ephemeral") and node.args and (s := _str(node.args[0])):
                    kinds.add(s)
            elif isinstance(node, ast.Assign) and (s := _str(node.value)):
                if any(isinstance(t, ast.Attribute) and t.attr == "kind" for t in node.targets):
                    kinds.add(s)
    return kinds


def test_the_collectors_see_the_codes_and_kinds_they_are_meant_to():
    # A collector that finds nothing would make the tests below pass vacuously.
    assert {"thread_not_found", "busy", "unauthorized", "body_too_large", "host_not_allowed"} <= error_codes()
    assert {"request_line_too_long", "not_found", "method_not_allowed", "store_unavailable"} <= error_codes()
    assert {"turn.ended", "message.delta", "client.accepted", "agent.other", "notice"} <= emitted_kinds()


def test_every_error_code_in_the_code_is_in_the_reference():
    text = api_text()
    missing = sorted(c for c in error_codes() if f"`{c}`" not in text)
    assert not missing, f"error codes not in docs/api.md: {missing}"


def test_every_event_kind_the_code_emits_is_in_the_kinds_table():
    table = section("6.3")
    missing = sorted(k for k in emitted_kinds() if f"| `{k}` |" not in table and f"`{k}`" not in table)
    assert not missing, f"event kinds not in docs/api.md §6.3: {missing}"


def test_every_websocket_close_code_is_in_the_close_code_table():
    tree = ast.parse((ROOT / "bridge" / "api" / "ws.py").read_text(encoding="utf-8"))
    codes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and "close" in ast.unparse(node.func):
            codes |= {a.value for a in node.args if isinstance(a, ast.Constant) and type(a.value) is int}
        elif isinstance(node, (ast.Return, ast.Assign)) and isinstance(node.value, ast.Tuple):
            first = node.value.elts[0] if node.value.elts else None
            if isinstance(first, ast.Constant) and type(first.value) is int:
                codes.add(first.value)
        elif isinstance(node, ast.Dict):
            codes |= {v.value for v in node.values if isinstance(v, ast.Constant) and type(v.value) is int}
    codes = {c for c in codes if 1000 <= c <= 4999}
    assert {1000, 1001, 1003, 4400, 4404, 4410} <= codes
    table = section("5.7")
    missing = sorted(c for c in codes if f"| {c} |" not in table)
    assert not missing, f"close codes not in docs/api.md §5.7: {missing}"


def repo_files() -> Iterator[Path]:
    for top in ("bridge", "bench", "tests", "web", "docs"):
        for path in sorted((ROOT / top).rglob("*")):
            if (
                path.is_file()
                and path.suffix in (".py", ".js", ".md", ".html", ".css")
                and "fixtures" not in path.parts
            ):
                yield path
    yield ROOT / "README.md"


ANCHOR = re.compile(r'<a id="s(\d+(?:\.\d+)?)"></a>')
CITATION = re.compile(r"api\.md((?:[ ,–-]*(?:and )?§\d+(?:\.\d+)?)+)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_citation_of_the_reference_names_a_section_that_exists():
    anchors = set(ANCHOR.findall(api_text()))
    assert {"1", "4.6", "5.7", "6.3", "9", "10"} <= anchors
    bad = []
    for path in repo_files():
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for cited in CITATION.findall(line):
                bad += [
                    f"{path.relative_to(ROOT)}:{lineno} §{n}"
                    for n in re.findall(r"§(\d+(?:\.\d+)?)", cited)
                    if n not in anchors
                ]
            for target in LINK.findall(line):
                if target.startswith(("api.md#s", "docs/api.md#s")) and target.split("#s", 1)[1] not in anchors:
                    bad.append(f"{path.relative_to(ROOT)}:{lineno} {target}")
    assert not bad, f"citations of sections docs/api.md does not have: {bad}"


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if target.startswith(("http://", "https://", "mailto:", "#")):
                    continue
                if not (path.parent / target.split("#", 1)[0]).exists():
                    broken.append(f"{path.relative_to(ROOT)}:{lineno} {target}")
    assert not broken, f"links to files that do not exist: {broken}"


# Documents that are not in this repository. bridge/ and bench/ still cite some of them;
# they join this check once their citations point at docs/api.md (issue #14 item 7).
OUTSIDE = re.compile(r"\bAPI\.md\b|\.\./shared\b|/work/shared\b|\bprotocols\.md\b|\bwebsocket\.md\b")


@pytest.mark.parametrize("top", ["README.md", "docs", "web", "tests", "bridge", "bench"])
def test_nothing_cites_a_document_outside_the_repository(top: str):
    here = Path(__file__).resolve()
    root = ROOT / top
    paths = [root] if root.is_file() else [p for p in repo_files() if root in p.parents]
    hits = [
        f"{path.relative_to(ROOT)}:{lineno}"
        for path in paths
        if path != here
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, f"citations of documents not in the repository: {hits}"
