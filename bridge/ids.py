"""Identifiers the bridge makes: ``thr_…`` threads, ``turn_…`` turns."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"
