"""Secrets that cross the boundary between two streamed deltas (docs/api.md §6.9).

:class:`~bridge.sessions.scrub.Scrubber` redacts each agent line on its own, but an agent
streams its reply as many ``message.delta`` lines: a secret whose first half ends one
delta and whose rest starts the next is in neither line whole, yet a client that joins
the deltas, and the search index that joins them into one document, would hold it whole.

:class:`DeltaScrub` keeps, per channel, the end of a delta's text that could be the start
of a secret (a proper prefix of one: usually nothing or a character or two, at most one
character less than the longest secret) and puts
it in front of the next delta of that channel, where the joined text is scrubbed again.
What is held is given back, as a delta of its own, before any other event of the agent
and when its stdout ends: so no text the conversation stores or sends ever ends in part
of a secret, and no secret is ever whole across two of them. A held prefix that turns out
not to start a secret comes out unchanged, only one delta later. Pure.
"""

from __future__ import annotations

import re
from typing import Any

from bridge.protocols.codec import Decoded
from bridge.protocols.events import Event
from bridge.sessions.scrub import Scrubber

DELTA = "message.delta"
PROBE = 3  # (hold_at looks up shorter ends itself; a secret is at least scrub.MIN_SECRET_LEN long)


class DeltaScrub:
    def __init__(self, scrub: Scrubber) -> None:
        self._scrub = scrub
        # Every form the scrubber redacts (plain and JSON-escaped: a reply may quote JSON).
        # A delta's end is searched (one regular expression, in C) for the first PROBE
        # characters of any of them, rarely found in ordinary text; its last one or two
        # characters are looked up among the secrets' shorter beginnings.
        by_probe: dict[str, list[str]] = {}
        for secret in scrub.secrets:
            by_probe.setdefault(secret[:PROBE], []).append(secret)
        self._by_probe = {p: tuple(v) for p, v in by_probe.items()}
        self._probes = re.compile("|".join(map(re.escape, by_probe)), re.DOTALL) if by_probe else None
        self._short1 = frozenset(s[:1] for s in scrub.secrets)
        self._short2 = frozenset(s[:2] for s in scrub.secrets)
        self._window = max((len(s) for s in scrub.secrets), default=1) - 1
        # channel -> (the text held back, the data of the delta it ended: a flush keeps its fields)
        self._held: dict[str, tuple[str, dict[str, Any]]] = {}

    @property
    def active(self) -> bool:
        """False when there is no secret to look for: the caller may skip this entirely."""
        return bool(self._by_probe)

    def decoded(self, decoded: list[Decoded]) -> list[Decoded]:
        """A read's decoded lines, their events passed through :meth:`events`."""
        for d in decoded:
            if d.events:
                d.events = self.events(d.events)
        return decoded

    def events(self, events: list[Event]) -> list[Event]:
        """One line's (or one read's) events, with the deltas' text moved as above."""
        out: list[Event] = []
        for ev in events:
            if ev.kind == DELTA and ev.source == "agent":
                out.append(self._delta(ev))
            else:
                if self._held:
                    out += self.flush()
                out.append(ev)
        return out

    def flush(self) -> list[Event]:
        """What is held, as deltas of their channels (the agent's next event or its exit)."""
        held, self._held = self._held, {}
        return [Event("agent", DELTA, {**data, "text": text}) for text, data in held.values()]

    def _delta(self, ev: Event) -> Event:
        data = ev.data
        text = data.get("text")
        if not isinstance(text, str):
            return ev
        joined = text
        if self._held and (held := self._held.pop(_channel(data), None)) is not None:
            joined = self._scrub.text(held[0] + text)
        cut = self.hold_at(joined)
        if cut < len(joined):
            self._held[_channel(data)] = (joined[cut:], data)
            joined = joined[:cut]
        if joined == text:
            return ev
        return Event(ev.source, ev.kind, {**data, "text": joined}, ev.raw, ev.relay)

    def hold_at(self, text: str) -> int:
        """Where the longest end of ``text`` that is a proper prefix of a secret begins;
        ``len(text)`` when no end of it is."""
        n = len(text)
        if (probes := self._probes) is None:
            return n
        start = n - self._window
        # Left to right: the first start that begins a secret is the longest end.
        m = probes.search(text, start if start > 0 else 0)
        while m is not None:
            pos = m.start()
            tail = text[pos:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self._by_probe[m.group()]):
                return pos
            m = probes.search(text, pos + 1)
        if text[-2:] in self._short2 and n >= 2:
            return n - 2
        if text[-1:] in self._short1 and n >= 1:
            return n - 1
        return n


def _channel(data: dict[str, Any]) -> str:
    channel = data.get("channel")
    return channel if isinstance(channel, str) else "text"
