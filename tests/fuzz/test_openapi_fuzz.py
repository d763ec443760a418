"""Property-based fuzzing of the REST API from its own OpenAPI document (issue #6 item 8).

schemathesis reads ``/openapi.json`` from a live daemon and sends every operation valid
and invalid requests (its examples, coverage and fuzzing phases, a bounded number of
examples each) with the bearer token on every call. Two properties hold for all of them:

* no 5xx: a client can never make the daemon fail (the documented 503s — ``capacity``,
  ``store_unavailable`` — need conditions this daemon never reaches);
* every 4xx is JSON with the standard error body ``{"error": {"code", "message"}}``.

Half of the generated thread ids are swapped for a real thread, so the handlers behind the
"no such thread" check are reached too. The daemon's log must stay free of tracebacks.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from fuzz_daemon import SyncDaemon, running_daemon
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.pytest.lazy import get_all_tests

MAX_EXAMPLES = 25

CONFIG = f"""
request-timeout = 15
[generation]
mode = "all"
max-examples = {MAX_EXAMPLES}
database = "none"
[phases.stateful]
enabled = false
"""


@pytest.fixture(scope="module")
def openapi_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncDaemon]:
    # Enough room that the fuzzer's threads and agents never hit "capacity" (a documented
    # 503), and agents it starts are reaped quickly.
    with running_daemon(
        tmp_path_factory.mktemp("openapi-fuzz"),
        "max_conversations = 1000\nidle_timeout_s = 2\nmax_pending_prompts = 1000\n",
    ) as d:
        yield d


@pytest.fixture(scope="module")
def api_schema(openapi_daemon: SyncDaemon) -> Any:
    config = SchemathesisConfig.from_str(CONFIG)
    return schemathesis.openapi.from_url(
        f"{openapi_daemon.url}/openapi.json", config=config, headers=openapi_daemon.headers
    )


class RealThreads:
    """A real thread for generated requests to aim at, recreated when a DELETE took it."""

    def __init__(self, daemon: SyncDaemon) -> None:
        self.daemon = daemon
        self.shared = self.create()

    def create(self) -> str:
        with self.daemon.http() as http:
            r = http.post("/v1/threads", json={"agent": "stream-json", "title": "openapi fuzz"})
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

    def for_case(self, method: str) -> str:
        if method == "DELETE":
            return self.create()  # a throwaway: deleting the shared one would 404 the rest
        with self.daemon.http() as http:
            if http.get(f"/v1/threads/{self.shared}").status_code == 404:
                self.shared = self.create()
        return self.shared


@pytest.fixture(scope="module")
def real_threads(openapi_daemon: SyncDaemon) -> RealThreads:
    return RealThreads(openapi_daemon)


def error_body_problem(status: int, content_type: str, text: str) -> str | None:
    """Why a 4xx response is not the standard error body (None: it is)."""
    if not content_type.startswith("application/json"):
        return f"Content-Type {content_type!r}"
    try:
        body = json.loads(text)
    except ValueError:
        return "not JSON"
    if not (isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], dict)):
        return "not {error: {code, message}}"
    err = body["error"]
    if not (isinstance(err.get("code"), str) and err["code"] and isinstance(err.get("message"), str)):
        return "malformed error object"
    return None


class ShapeViolations:
    """4xx responses without the standard error body, one example per distinct answer.

    Recorded rather than raised: one such answer (say every 405) must not stop an
    operation's fuzzing before it reaches a 5xx."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, str], str] = {}

    def check(self, ctx: Any, response: Any, case: Any) -> bool | None:
        if not 400 <= response.status_code < 500:
            return None
        content_type = response.headers.get("content-type", [""])
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        problem = error_body_problem(response.status_code, content_type, response.text)
        if problem is not None:
            key = (response.status_code, response.text[:120])
            request = response.request
            self.seen.setdefault(
                key,
                f"{response.status_code} {problem}: {response.text[:200]!r} <- {request.method} {request.url[:200]}",
            )
        return True


def _aim_at_a_real_thread(case: Any, real_threads: RealThreads) -> None:
    params = case.path_parameters or {}
    tid = params.get("thread_id")
    if not isinstance(tid, str) or case.path.endswith("/events/stream"):
        return  # a real thread would make the SSE stream run forever
    # Half the cases, chosen from the generated id itself so that a failure replays.
    if zlib.crc32(tid.encode("utf-8", "surrogatepass")) % 2:
        return
    params["thread_id"] = real_threads.for_case(case.method.upper())
    if case.path.endswith("/events") and isinstance(case.query, dict):
        wait = case.query.get("wait")
        if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0.2:
            case.query["wait"] = 0.2  # a long-poll on a quiet thread waits its full term


FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    # No shrinking: a failure is reported with the example that found it, and a
    # bug cannot turn the CI budget into minutes of shrinking.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


def _check_change_stream(case: Any, daemon: SyncDaemon, shapes: ShapeViolations) -> None:
    """``GET /v1/events`` never ends once it is accepted: only its answer's head is checked
    (no 5xx; a 4xx with the error body; else an event stream), then it is closed."""
    headers = {k: v for k, v in (case.headers or {}).items() if isinstance(v, str)}
    with (
        httpx.Client(base_url=daemon.url, timeout=15) as http,
        http.stream("GET", "/v1/events", params=case.query or {}, headers={**headers, **daemon.headers}) as r,
    ):
        assert r.status_code < 500, (r.status_code, case.query, headers)
        if r.status_code >= 400:
            problem = error_body_problem(r.status_code, r.headers.get("content-type", ""), r.read().decode())
            if problem is not None:
                shapes.seen.setdefault((r.status_code, problem), f"{r.status_code} {problem} <- GET /v1/events")
        else:
            assert r.headers["content-type"].startswith("text/event-stream"), r.headers


def _check(case: Any, daemon: SyncDaemon, real_threads: RealThreads, calls: list[str], shapes: ShapeViolations) -> None:
    _aim_at_a_real_thread(case, real_threads)
    calls.append(case.operation.label)
    if case.path == "/v1/events":
        _check_change_stream(case, daemon, shapes)
        return
    response = case.call(headers=daemon.headers, timeout=15)
    case.validate_response(response, checks=[not_a_server_error, shapes.check], headers=daemon.headers)


@pytest.mark.timeout(170)
def test_no_5xx_and_4xx_bodies_follow_the_contract(
    api_schema: Any, openapi_daemon: SyncDaemon, real_threads: RealThreads
) -> None:
    """Every operation through schemathesis' examples, coverage and fuzzing phases, valid
    and invalid data. (``schemathesis.pytest.from_fixture`` would do the same, but it sets
    ``Node._nodeid``, which pytest 9.2 no longer has; this drives the very same per-operation
    tests, ``get_all_tests``, without it.)"""
    failures: list[str] = []
    calls: list[str] = []
    shapes = ShapeViolations()
    tests = list(get_all_tests(schema=api_schema, test_func=_check, settings=FUZZ, given_kwargs={}))
    assert len(tests) >= 15
    for result in tests:
        operation, test = result.ok()
        try:
            test(daemon=openapi_daemon, real_threads=real_threads, calls=calls, shapes=shapes)
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup is a Base…
            failures.append(f"{operation.label}: {type(exc).__name__}: {exc}"[:3000])
    untested = {op.label for op, _ in (r.ok() for r in tests)} - set(calls)
    assert not untested, f"operations never called: {untested}"
    report = []
    if failures:
        report.append(f"{len(failures)} operation(s) failed:\n\n" + "\n\n".join(failures))
    if shapes.seen:
        report.append(
            f"{len(shapes.seen)} distinct 4xx answer(s) without the error body:\n"
            + "\n".join(sorted(shapes.seen.values()))
        )
    assert not report, "\n\n".join(report)


def test_the_daemon_is_healthy_after_the_fuzzing(openapi_daemon: SyncDaemon) -> None:
    assert openapi_daemon.healthy()
    r = httpx.get(f"{openapi_daemon.url}/readyz", timeout=10)
    assert (r.status_code, r.json()) == (200, {"status": "ok", "store": "ok", "bus": "none"})
    problems = openapi_daemon.new_log_problems()
    assert not problems, "daemon logged problems:\n" + "\n".join(problems[:60])
