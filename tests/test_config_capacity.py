"""``[capacity]`` is read, checked and refused in plain words (issue #36)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import Settings, load_settings
from bridge.errors import ConfigError


def settings_of(tmp_path: Path, toml: str) -> Settings:
    path = tmp_path / "config.toml"
    path.write_text(toml)
    return load_settings(config=str(path), env={}, discover_path=False)


def test_defaults_and_values(tmp_path: Path) -> None:
    cap = load_settings(env={}, discover_path=False).capacity
    assert (cap.memory_budget_mb, cap.max_threads, cap.max_threads_per_user, cap.max_transcript_mb) == (
        "auto",
        100_000,
        None,
        1024,
    )
    s = settings_of(tmp_path, "[capacity]\nmemory_budget_mb = 0\nmax_threads = 5\nmax_threads_per_user = 2\n")
    assert s.capacity.memory_budget_mb == 0 and s.capacity.max_threads_per_user == 2
    profile = '[agents.a]\nprotocol = "awp-jsonl"\nexecutable = "/bin/true"\nmemory_limit_mb = 512\n'
    a = settings_of(tmp_path, profile).agents["a"]
    assert a.memory_limit_mb == 512 and a.memory_estimate_mb is None


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("memory_budget_mb = -1", "[capacity] memory_budget_mb: must be 'auto', 0 (off) or a whole number of MiB"),
        ('memory_budget_mb = "lots"', "[capacity] memory_budget_mb: must be 'auto', 0 (off) or a whole number of MiB"),
        ("memory_budget_mb = true", "[capacity] memory_budget_mb: must be 'auto', 0 (off) or a whole number of MiB"),
        ("max_thread = 3", "did you mean 'max_threads'?"),
        ("max_threads = 0", "[capacity] max_threads"),
    ],
)
def test_bad_values_are_refused_with_the_key(tmp_path: Path, toml: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings_of(tmp_path, f"[capacity]\n{toml}\n")
    assert words in err.value.message
