"""DESIGN.md's import rules, checked by walking the AST of every module in bridge/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BRIDGE = Path(__file__).resolve().parent.parent / "bridge"

# module prefix → imports it must never make
FORBIDDEN = {
    "bridge.protocols": (
        "asyncio",
        "subprocess",
        "os",
        "sqlite3",
        "fastapi",
        "starlette",
        "uvicorn",
        "bridge.process",
        "bridge.sessions",
        "bridge.store",
        "bridge.api",
    ),
    "bridge.process": (
        "sqlite3",
        "fastapi",
        "starlette",
        "bridge.sessions",
        "bridge.store",
        "bridge.api",
        "bridge.protocols.stream_json",
        "bridge.protocols.awp_jsonl",
        "bridge.protocols.codecs",
    ),
    "bridge.store": ("fastapi", "starlette", "subprocess", "bridge.process", "bridge.sessions", "bridge.api"),
    "bridge.sessions": ("sqlite3", "fastapi", "starlette", "bridge.api"),
    "bridge.bus": (
        "sqlite3",
        "fastapi",
        "starlette",
        "subprocess",
        "bridge.process",
        "bridge.sessions",
        "bridge.store",
        "bridge.api",
    ),
}
ONLY_IN = {"sqlite3": "bridge.store", "fastapi": "bridge.api", "starlette": "bridge.api", "redis": "bridge.bus"}


def modules() -> list[tuple[str, set[str]]]:
    out = []
    for path in sorted(BRIDGE.rglob("*.py")):
        name = ".".join(path.relative_to(BRIDGE.parent).with_suffix("").parts)
        imports: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imports |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imports.add(node.module)
        out.append((name, imports))
    return out


@pytest.mark.parametrize(("module", "imports"), modules(), ids=[m for m, _ in modules()])
def test_module_respects_the_layering(module: str, imports: set[str]) -> None:
    for prefix, banned in FORBIDDEN.items():
        if module.startswith(prefix):
            bad = {i for i in imports for b in banned if i == b or i.startswith(b + ".")}
            assert not bad, f"{module} imports {bad}"
    for lib, home in ONLY_IN.items():
        if any(i == lib or i.startswith(lib + ".") for i in imports):
            assert module.startswith(home), f"{module} imports {lib}; only {home} may"


DIALECT_NAMES = (
    "StreamJsonCodec",
    "AwpJsonlCodec",
    "AcpCodec",
    "bridge.protocols.stream_json",
    "bridge.protocols.awp_jsonl",
    "bridge.protocols.acp",
)


@pytest.mark.parametrize(
    "path",
    sorted([*BRIDGE.joinpath("sessions").glob("*.py"), *BRIDGE.joinpath("api").glob("*.py")]),
    ids=lambda p: p.name,
)
def test_sessions_and_api_never_name_a_dialect(path: Path) -> None:
    text = path.read_text()
    named = [n for n in DIALECT_NAMES if n in text]
    assert not named, f"{path.name} names {named}: talk to protocols.codec.Codec instead"
    for proto in ('"stream-json"', '"awp-jsonl"', '"acp"'):
        assert f"== {proto}" not in text and f"!= {proto}" not in text, f"{path.name} compares with {proto}"


PURE = (
    "bridge.sessions.core",
    "bridge.sessions.output",
    "bridge.sessions.actions",
    "bridge.sessions.permissions",
    "bridge.sessions.scrub",
    "bridge.sessions.tasks",
    "bridge.sessions.task_state",
    "bridge.sessions.task_values",
    "bridge.sessions.task_json",
)


@pytest.mark.parametrize(
    ("module", "imports"), [m for m in modules() if m[0] in PURE], ids=[m for m, _ in modules() if m in PURE]
)
def test_the_conversation_core_is_pure(module: str, imports: set[str]) -> None:
    bad = {
        i
        for i in imports
        if i.split(".")[0] in ("asyncio", "os", "subprocess", "signal", "socket")
        or i.startswith(("bridge.process.agent_process", "bridge.store", "bridge.api"))
    }
    assert not bad, f"{module} imports {bad}"


def _sessions_graph() -> dict[str, set[str]]:
    """bridge/sessions modules → the sessions modules each imports (a TYPE_CHECKING import
    counts: it is a cycle all the same, one that only moved out of sight)."""
    names = {m for m, _ in modules() if m.startswith("bridge.sessions.")}
    graph: dict[str, set[str]] = {}
    for module, imports in modules():
        if module in names:
            graph[module] = {i for i in imports if i in names and i != module}
    for path in sorted(BRIDGE.joinpath("sessions").glob("*.py")):  # `from bridge.sessions import x`
        module = f"bridge.sessions.{path.stem}"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "bridge.sessions":
                graph[module] |= {f"bridge.sessions.{a.name}" for a in node.names} & names
    return graph


def test_no_sessions_module_imports_one_that_imports_it_back() -> None:
    """The conversation and the forwarding of its commands once imported each other
    (issue #33): a client's command now reaches either through sessions/commands.py."""
    graph = _sessions_graph()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted(m for m in graph if reaches(m, m))
    assert not cycles, f"import cycle through {cycles}"


def test_the_commands_are_pure_data() -> None:
    [(_, imports)] = [m for m in modules() if m[0] == "bridge.sessions.commands"]
    allowed = {"__future__", "collections.abc", "dataclasses", "typing", "bridge.errors", "bridge.sessions.actions"}
    assert imports - allowed <= {"bridge.sessions.fanout"}, imports  # (fanout: a type, for ThreadPort)
