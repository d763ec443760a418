"""The values of a profile's secret-looking environment variables never reach the
transcript: every agent line and stderr line is scrubbed of them before it is stored
(docs/api.md §6.9). Pure."""

from __future__ import annotations

from collections.abc import Mapping

from bridge.protocols.events import REDACTED, SECRET_KEY_RE

MIN_SECRET_LEN = 6  # shorter values would redact ordinary words


class Scrubber:
    def __init__(self, env: Mapping[str, str]) -> None:
        self._secrets = [v for k, v in env.items() if SECRET_KEY_RE.search(k) and len(v) >= MIN_SECRET_LEN]
        self._bytes = [(v.encode(), REDACTED.encode()) for v in self._secrets]

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
