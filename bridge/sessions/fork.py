"""Forking a thread (docs/api.md §4.26): where a fork begins, and its transcript's copy.

Two steps, so that each runs where it must:

1. :func:`fork_point_here` (the :class:`~bridge.sessions.commands.ForkPoint` command, run
   on the replica that runs the source: its turn and its agent session are known there)
   rounds the asked seq down to a turn boundary — the newest ``turn.ended`` at or before
   it — and finds what the agent copies: its session, and for a dialect that can stop
   early the chain entry the kept turn ended with (protocols/forking.py). A point the
   agent cannot fork at is refused here (409 ``fork_not_supported``), before anything is
   made.
2. :func:`copy_transcript` writes the source's events up to that seq into the new thread
   under the same seqs, before its conversation exists (the registry's ``fork``), so
   nothing else can write to it meanwhile. The store indexes the copy under the fork (it
   is the caller's thread to search) and records no usage for the copied turn ends (they
   were the source's turns: store/usage.py).

Why a turn boundary: an agent's session holds whole turns (Claude Code resumes at a chain
entry; ACP copies a session between prompts), so "up to seq N" is honest only at a turn's
end. Without ``after_seq`` the fork is of the end, which a running turn has not reached:
409 ``turn_active`` then (with ``after_seq`` the running turn is simply not taken).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge.errors import Conflict, InvalidRequest, LaunchRefused
from bridge.protocols.events import Record
from bridge.protocols.forking import NativeFork, chain_entry, fork_way
from bridge.sessions.commands import ForkPoint
from bridge.sessions.conversation import Conversation
from bridge.sessions.worktree import Worktree
from bridge.store.base import Store

PAGE = 1000  # events read or copied at a time (each page bounded by the store's PAGE_BYTES too)


async def fork_point_here(conv: Conversation, command: ForkPoint) -> dict[str, Any]:
    """``{"seq", "session", "at"}``: the last seq a fork takes, the agent session it copies
    (None: the fork starts a fresh one, there being nothing to know) and the chain entry
    the copy stops at (None: the session's end)."""
    profile = conv.profile
    if profile is None:  # as a prompt to the thread would be refused (conversation._start)
        raise LaunchRefused(f"agent profile {conv.thread['agent']!r} is no longer configured", code="agent_not_found")
    async with conv.journal.lock:  # one moment's turn, seq and session
        core = conv.core
        active, last, session = core.active is not None, core.last_seq, core.native_session_id
    if command.after_seq is None and active:
        raise Conflict("a turn is running: fork at a seq, or once the turn ended", code="turn_active")
    target = last if command.after_seq is None else command.after_seq
    if target > last:
        raise InvalidRequest(f"after_seq {target} is beyond the thread's last seq {last}")
    protocol = profile.protocol
    seq, at = await _boundary(conv.store, conv.id, target, protocol)
    if seq == 0 or session is None:
        return {"seq": seq, "session": None, "at": None}
    way = fork_way(protocol, profile.executable, profile.args, conv.thread.get("agent_info"))
    if not way.able:
        raise Conflict("this thread's agent has no way to fork its conversation", code="fork_not_supported")
    if not way.earlier:
        # It copies its whole session: only the end, with no turn under way, is that.
        if active:
            raise Conflict("this agent forks only at the end, and a turn is running", code="turn_active")
        end, _ = await _boundary(conv.store, conv.id, last, protocol)
        if seq != end:
            raise Conflict(
                "this thread's agent can fork only at the end of its conversation", code="fork_not_supported"
            )
        return {"seq": seq, "session": session, "at": None}
    if at is None:  # its session held no entry yet at that point: nothing to copy
        return {"seq": seq, "session": None, "at": None}
    return {"seq": seq, "session": session, "at": at}


async def _boundary(store: Store, thread_id: str, target: int, protocol: str) -> tuple[int, str | None]:
    """The newest ``turn.ended`` at or before ``target`` (0: none) and the newest session
    chain entry at or before it. Read backwards a turn at a time (from each ``turn.started``
    the store finds before the window), so an old thread is not read from its start."""
    cut: int | None = None
    end = target
    while end > 0:
        starts = await store.turn_starts_before(thread_id, end + 1, 1)
        low = starts[0] - 1 if starts else 0
        window = await _read(store, thread_id, low, end)
        if cut is None:
            ends = [r.seq for r in window if r.kind == "turn.ended"]
            if ends:
                cut = ends[-1]
        if cut is not None:
            entries = [u for r in window if r.seq <= cut and (u := chain_entry(protocol, r.raw))]
            if entries:
                return cut, entries[-1]
        end = low
    return cut or 0, None


async def _read(store: Store, thread_id: str, after: int, upto: int) -> list[Record]:
    out: list[Record] = []
    while after < upto:
        page = await store.read_events(thread_id, after, PAGE)
        out += [r for r in page if r.seq <= upto]
        if not page or page[-1].seq >= upto or not page.more:
            break
        after = page[-1].seq
    return out


@dataclass(frozen=True, slots=True)
class Fork:
    """A fork being made (the registry's ``create``): its source, the last seq it takes,
    the agent session its first process copies (and up to which chain entry), the
    source's agent_info (what its agent said it takes, until the fork's own says) and
    the source's own worktree, if it has one (the fork's is made from its branch)."""

    source: str
    seq: int
    session: str | None
    at: str | None
    agent_info: Any
    worktree: Worktree | None = None  # the source's own worktree: the fork gets one from its branch

    def __post_init__(self) -> None:
        if self.session is not None:
            try:
                NativeFork(self.session, self.at)
            except ValueError:
                raise InvalidRequest("the fork point names no entry of the agent's session") from None

    def fields(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The new row's ``forked_from`` and ``agent_info``. ``forked_from`` holds the public
        ``thread`` and ``seq`` and, until the agent reports the fork's own session, the
        native fork its first process makes (protocols/forking.pending_fork; api/views.py
        shows only the public pair)."""
        native = NativeFork(self.session, self.at).stored() if self.session else {}
        info = self.agent_info if isinstance(self.agent_info, dict) else None
        return {"thread": self.source, "seq": self.seq, **native}, info

    async def copy(self, store: Store, target: str) -> int:
        return await copy_transcript(store, self.source, target, self.seq)


async def copy_transcript(store: Store, source: str, target: str, upto: int) -> int:
    """The source's events 1..``upto`` appended to ``target`` under the same seqs, a page
    per append (no client_id: the fork's prompts are its own). Returns the last seq
    copied (0 for none)."""
    after = last = 0
    while after < upto:
        page = await store.read_events(source, after, PAGE)
        taken = [r for r in page if r.seq <= upto]
        if taken:
            await store.append(target, taken, [None] * len(taken), {})
            last = taken[-1].seq
        if not page or page[-1].seq >= upto or not page.more:
            break
        after = page[-1].seq
    return last


__all__ = ["Fork", "copy_transcript", "fork_point_here"]
