"""Helpers shared by tests that are not fixtures: a line-speaking subprocess driven from a
test thread, and the reference secret-key rules (issue #5 item 5) that the codec tests
check the codec's own regex against."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

TIMEOUT = 10.0  # every read

# --------------------------------------------------------------------------- a line peer


class LineProcess:
    """A subprocess spoken to on stdin and read line by line on stdout from a background
    thread; stderr goes to ``stderr_path`` (shown when a read fails)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, stderr_path: Path) -> None:
        self._stderr = open(stderr_path, "w", encoding="utf-8")  # closed in close()
        self.stderr_path = stderr_path
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            encoding="utf-8",
            env=env,
            cwd=str(stderr_path.parent),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def raw(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def send(self, obj: dict[str, Any]) -> None:
        self.raw(json.dumps(obj, separators=(",", ":")) + "\n")

    def next_line(self, timeout: float = TIMEOUT) -> str:
        """The next stdout line, without its newline."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output within {timeout} s; stderr: {self.stderr_text()}") from None
        if line is None:
            self.lines.put(None)
            raise AssertionError(f"agent closed stdout (rc={self.proc.poll()}); stderr: {self.stderr_text()}")
        assert line.endswith("\n"), line
        return line[:-1]

    def quiet(self, seconds: float) -> None:
        """Assert the process writes nothing for ``seconds``."""
        try:
            line = self.lines.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected output: {line!r}")

    def wait(self, timeout: float = TIMEOUT) -> int:
        return self.proc.wait(timeout=timeout)

    def stderr_text(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)
        self._reader.join(timeout=TIMEOUT)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass
        self._stderr.close()


# --------------------------------------------------------------------------- secrets

# Key names whose values (every scalar at any depth below them) never reach the transcript
# or a client. A reference written independently of the codec's regex.
SECRET_KEY_PARTS = (
    "token",
    "secret",
    "password",
    "passwd",
    "apikey",
    "api_key",
    "api-key",
    "authorization",
    "cookie",
    "credential",
    "email",
    "organization",
    "organisation",
    "account",
    "sessionkey",
    "session_key",
    "session-key",
    "privatekey",
    "private_key",
    "private-key",
)
REDACTED = "[redacted]"


def is_secret_key(key: str) -> bool:
    folded = key.casefold()
    # token COUNTS (tokens, totalTokens, input_tokens, tokens_used) are not secrets
    if folded.endswith("tokens") or "tokens_" in folded:
        folded = folded.replace("tokens", "")
    return any(part in folded for part in SECRET_KEY_PARTS)


def expected_redaction(value: Any, inside: bool = False) -> Any:
    if isinstance(value, dict):
        return {k: expected_redaction(v, inside or is_secret_key(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expected_redaction(v, inside) for v in value]
    return REDACTED if inside and value is not None else value
