#!/usr/bin/env python3
"""Replay a recorded stream-json transcript against a live host. Standard library only.

Run as ``python -I replay_agent.py --transcript PATH [flags] [any other args]``; other
arguments (``--output-format stream-json --verbose --model=M --resume=ID ...``) are accepted
and ignored, so the bridge can launch it with its usual argv. ``$REPLAY_TRANSCRIPT`` stands
in for ``--transcript`` when that flag is absent.

A transcript (tests/fixtures/transcripts/*/*.transcript.jsonl) is JSON lines: an optional
header ``{"argv", "scenario"}``, then ``{"t", "dir", "line"}`` entries where ``dir`` is
``">"`` (the host wrote ``line`` to the agent's stdin), ``"<"`` (the agent wrote ``line``
to stdout, exact text) or ``"stderr"``. Other lines (``{"exit": 0}``, ``{"step": ...}``)
are skipped.

The agent writes nothing until its first stdin line arrives. Then it walks the transcript:

- ``">"``: wait for a stdin line that matches the recorded one *by kind*: the same
  ``type``; for ``control_request`` the same ``request.subtype``; for ``control_response``
  the same ``response.subtype``, the same ``response.response.behavior`` when the recorded
  line has one, and the same ``response.request_id`` when the recorded one answers a
  request this agent sent (those ids are replayed verbatim, so the host must echo them).
  Lines that do not match are logged and skipped (``--strict``: exit 2 with a report).
  A recorded ``control_response`` to a request the agent already withdrew with a
  ``control_cancel_request`` is *optional*: a host that (rightly) never sends it is
  matched against the next host line instead.
- ``"<"``: write the line to stdout (flushed). A ``control_response`` to a host
  ``control_request`` gets its ``request_id`` rewritten to the id the host actually used
  (so an interrupt ack correlates); everything else is byte-for-byte the recording.
- ``"stderr"``: write the line to stderr.

At the end of the transcript it reads stdin until EOF, then exits 0; EOF earlier also
exits 0.

Flags:
  --transcript PATH            the transcript to replay (required, or $REPLAY_TRANSCRIPT)
  --strict                     exit 2 on a host line that does not match (default: skip it)
  --skip-host-initialize       (default) drop a recorded host ``initialize`` control_request
                               and its response: the bridge never sends one. Hook callbacks
                               registered by that initialize (``hook_callback`` requests and
                               the host's answers to them) are dropped with it.
  --no-skip-host-initialize    replay the initialize exchange as recorded

Environment: FAKE_AGENT_LOG (append JSON lines: ``{"event":"start","argv","env","cwd","pid"}``,
``{"event":"stdin","line"}`` for every stdin line, ``{"event":"skipped","line"}`` for each
unmatched one).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

LOG_LOCK = threading.Lock()
EOF = None


def log(**entry: object) -> None:
    path = os.environ.get("FAKE_AGENT_LOG")
    if path:
        with LOG_LOCK, open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def diag(text: str) -> None:
    sys.stderr.write(f"replay agent: {text}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------- arguments


@dataclass
class Options:
    transcript: str | None = None
    strict: bool = False
    skip_host_initialize: bool = True


def parse_args(argv: list[str]) -> Options:
    opts = Options(transcript=os.environ.get("REPLAY_TRANSCRIPT") or None)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--transcript" and i + 1 < len(argv):
            opts.transcript = argv[i + 1]
            i += 1
        elif a.startswith("--transcript="):
            opts.transcript = a.split("=", 1)[1]
        elif a == "--strict":
            opts.strict = True
        elif a == "--skip-host-initialize":
            opts.skip_host_initialize = True
        elif a == "--no-skip-host-initialize":
            opts.skip_host_initialize = False
        # anything else: a flag meant for the real CLI; accepted and ignored
        i += 1
    return opts


# ---------------------------------------------------------------------- transcript


@dataclass
class Entry:
    dir: str  # ">", "<" or "stderr"
    line: str
    obj: dict[str, Any] | None = field(default=None)  # the parsed JSON of ">"/"<" lines


def _parse(line: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _d(v: object) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def load_transcript(path: str) -> list[Entry]:
    entries: list[Entry] = []
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            raw = raw.strip()
            if not raw:
                continue
            rec = _parse(raw)
            if rec is None or rec.get("dir") not in (">", "<", "stderr") or not isinstance(rec.get("line"), str):
                continue  # header, exit marker, step marker, ...
            line = rec["line"].rstrip("\r\n")
            entries.append(Entry(rec["dir"], line, _parse(line) if rec["dir"] != "stderr" else None))
    return entries


def strip_host_initialize(entries: list[Entry]) -> list[Entry]:
    """Drop host initialize requests, their responses, and the hook callbacks they registered."""
    init_ids: set[str] = set()
    registers_hooks = False
    for e in entries:
        o = _d(e.obj)
        req = _d(o.get("request"))
        if e.dir == ">" and o.get("type") == "control_request" and req.get("subtype") == "initialize":
            init_ids.add(str(o.get("request_id")))
            registers_hooks = registers_hooks or bool(req.get("hooks"))
    if not init_ids:
        return entries
    hook_ids: set[str] = set()
    if registers_hooks:
        for e in entries:
            o = _d(e.obj)
            if (
                e.dir == "<"
                and o.get("type") == "control_request"
                and _d(o.get("request")).get("subtype") == "hook_callback"
            ):
                hook_ids.add(str(o.get("request_id")))
    kept: list[Entry] = []
    for e in entries:
        o = _d(e.obj)
        t = o.get("type")
        rid = str(o.get("request_id")) if t == "control_request" else str(_d(o.get("response")).get("request_id"))
        if e.dir == ">" and t == "control_request" and rid in init_ids:
            continue
        if e.dir == "<" and t == "control_response" and rid in init_ids:
            continue
        if e.dir == "<" and t == "control_request" and rid in hook_ids:
            continue
        if e.dir == ">" and t == "control_response" and rid in hook_ids:
            continue
        kept.append(e)
    return kept


# ---------------------------------------------------------------------- stdin


class Inbox:
    """Lines from stdin, read by a thread (every line logged), with a one-line pushback."""

    def __init__(self) -> None:
        self._q: queue.Queue[str | None] = queue.Queue()
        self._back: list[str | None] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in sys.stdin.buffer:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                log(event="stdin", line=line)
                if line.strip():
                    self._q.put(line)
        except (OSError, ValueError):
            pass
        self._q.put(EOF)

    def get(self) -> str | None:
        if self._back:
            return self._back.pop()
        return self._q.get()  # no timeout: the host decides when to talk

    def unget(self, line: str | None) -> None:
        self._back.append(line)


# ---------------------------------------------------------------------- replay


class Mismatch(Exception):
    pass


class Replayer:
    def __init__(self, entries: list[Entry], inbox: Inbox, strict: bool) -> None:
        self.entries = entries
        self.inbox = inbox
        self.strict = strict
        self.id_map: dict[str, str] = {}  # recorded host request_id -> the host's real one
        self.agent_request_ids: set[str] = set()  # control_requests this agent has written
        self.cancelled_ids: set[str] = set()  # ... and later withdrew

    # -- matching

    def _optional(self, e: Entry) -> bool:
        o = _d(e.obj)
        return (
            o.get("type") == "control_response" and str(_d(o.get("response")).get("request_id")) in self.cancelled_ids
        )

    def matches(self, recorded: Entry, got: dict[str, Any] | None) -> bool:
        want = _d(recorded.obj)
        if got is None or got.get("type") != want.get("type"):
            return False
        if want.get("type") == "control_request":
            return _d(got.get("request")).get("subtype") == _d(want.get("request")).get("subtype")
        if want.get("type") == "control_response":
            wr, gr = _d(want.get("response")), _d(got.get("response"))
            if gr.get("subtype") != wr.get("subtype"):
                return False
            behavior = _d(wr.get("response")).get("behavior")
            if behavior is not None and _d(gr.get("response")).get("behavior") != behavior:
                return False
            rid = wr.get("request_id")
            if isinstance(rid, str) and rid in self.agent_request_ids and gr.get("request_id") != rid:
                return False
        return True

    def _candidates(self, i: int) -> list[int]:
        """Host entries a stdin line may satisfy now: the entry at ``i``, and past it while optional."""
        out = []
        k: int | None = i
        while k is not None:
            out.append(k)
            if not self._optional(self.entries[k]):
                break
            k = next((j for j in range(k + 1, len(self.entries)) if self.entries[j].dir == ">"), None)
        return out

    def await_host(self, i: int) -> int | None:
        """Wait for a stdin line matching host entry ``i`` (or a later one past optional
        entries). Returns the index of the entry it matched, None on EOF."""
        while True:
            line = self.inbox.get()
            if line is EOF:
                return None
            got = _parse(line)
            for k in self._candidates(i):
                if self.matches(self.entries[k], got):
                    self._note_host(self.entries[k], got or {})
                    return k
            log(event="skipped", line=line)
            if self.strict:
                raise Mismatch(
                    f"host line does not match the transcript.\n  expected: {self.entries[i].line}\n  got:      {line}"
                )

    def _note_host(self, recorded: Entry, got: dict[str, Any]) -> None:
        want = _d(recorded.obj)
        if want.get("type") == "control_request":
            old, new = want.get("request_id"), got.get("request_id")
            if isinstance(old, str) and isinstance(new, str):
                self.id_map[old] = new

    # -- output

    def agent_line(self, e: Entry) -> str:
        o = _d(e.obj)
        t = o.get("type")
        if t == "control_request" and isinstance(o.get("request_id"), str):
            self.agent_request_ids.add(o["request_id"])
        elif t == "control_cancel_request" and isinstance(o.get("request_id"), str):
            self.cancelled_ids.add(o["request_id"])
        elif t == "control_response":
            old = _d(o.get("response")).get("request_id")
            if isinstance(old, str) and old in self.id_map and self.id_map[old] != old:
                return rewrite_request_id(e.line, old, self.id_map[old])
        return e.line

    def emit(self, e: Entry) -> None:
        if e.dir == "<":
            sys.stdout.write(self.agent_line(e) + "\n")
            sys.stdout.flush()
        elif e.dir == "stderr":
            sys.stderr.write(e.line + "\n")
            sys.stderr.flush()

    # -- the walk

    def run(self) -> int:
        first = self.inbox.get()  # print nothing before the host has spoken
        if first is EOF:
            return 0
        self.inbox.unget(first)
        i = 0
        while i < len(self.entries):
            e = self.entries[i]
            if e.dir != ">":
                self.emit(e)
                i += 1
                continue
            try:
                k = self.await_host(i)
            except Mismatch as exc:
                diag(str(exc))
                return 2
            if k is None:
                return 0  # EOF mid-transcript
            for skipped in self.entries[i:k]:  # optional host lines never sent: replay what came after them
                self.emit(skipped)
            i = k + 1
        while True:  # transcript done: stay up until the host closes stdin
            line = self.inbox.get()
            if line is EOF:
                return 0
            log(event="skipped", line=line)
            if self.strict:
                diag(f"host line after the end of the transcript: {line}")
                return 2


def rewrite_request_id(line: str, old: str, new: str) -> str:
    """Swap response.request_id in an exact recorded line, keeping every other byte."""
    for sep in (":", ": "):
        needle = f'"request_id"{sep}{json.dumps(old)}'
        if line.count(needle) == 1:
            candidate = line.replace(needle, f'"request_id"{sep}{json.dumps(new)}')
            if _d(_d(_parse(candidate)).get("response")).get("request_id") == new:
                return candidate
    obj = json.loads(line)  # unusual layout: re-serialize
    obj["response"]["request_id"] = new
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def main() -> int:
    opts = parse_args(sys.argv[1:])
    log(event="start", argv=sys.argv, env=dict(os.environ), cwd=os.getcwd(), pid=os.getpid())
    if not opts.transcript:
        diag("no transcript: pass --transcript PATH (or set REPLAY_TRANSCRIPT)")
        return 2
    try:
        entries = load_transcript(opts.transcript)
    except OSError as exc:
        diag(f"cannot read transcript {opts.transcript}: {exc}")
        return 2
    if opts.skip_host_initialize:
        entries = strip_host_initialize(entries)
    try:
        return Replayer(entries, Inbox(), opts.strict).run()
    except BrokenPipeError:
        return 0  # the host went away


if __name__ == "__main__":
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    os._exit(code)  # do not wait on the stdin reader thread
