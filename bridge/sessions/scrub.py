"""The values of a profile's secret-looking environment variables, and of the thread
owner's own secrets (bridge/user_secrets.py, whatever their names), never reach the
transcript: every agent line and stderr line is scrubbed of them before it is stored
(docs/api.md §6.9). A secret the agent streams across two deltas is caught by
sessions/delta_scrub.py. Pure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from bridge.protocols.events import REDACTED, SECRET_KEY_RE

MIN_SECRET_LEN = 6  # shorter values would redact ordinary words


class Scrubber:
    def __init__(self, env: Mapping[str, str], extra: Iterable[str] = ()) -> None:
        found = [v for k, v in env.items() if SECRET_KEY_RE.search(k)]
        values = {v for v in (*found, *extra) if len(v) >= MIN_SECRET_LEN}
        # Agent lines are JSON: a value with a quote, a backslash, a control character or
        # (escaped as \uXXXX) non-ASCII text appears there escaped, so that form too.
        written = {json.dumps(v, ensure_ascii=a)[1:-1] for v in values for a in (False, True)}
        # Longest first: a secret that holds another is redacted whole.
        self._secrets = sorted(values | written, key=len, reverse=True)
        self._bytes = [(v.encode(), REDACTED.encode()) for v in self._secrets]

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every form redacted, longest first."""
        return tuple(self._secrets)

    def lines(self, lines: list[bytes]) -> list[bytes]:
        if not self._bytes:
            return lines
        out = []
        for line in lines:
            for secret, mark in self._bytes:
                if secret in line:
                    line = line.replace(secret, mark)
            out.append(line)
        return out

    def text(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text
