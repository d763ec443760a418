"""loads_strict's orjson fast path (issue #22) gives exactly what the strict ``json``
decoder gives, and refuses exactly what it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.protocols.jsonline import _STRICT, MAX_JSON_DEPTH, loads_strict

SAME = [
    '{"type":"user","message":{"role":"user","content":[{"type":"text","text":"hi"}]}}',
    '{"n":123456789012345678901234567890}',  # beyond 64 bits: json's exact int
    '{"n":-9223372036854775809,"m":18446744073709551616}',
    '{"s":"\\ud83d\\ude00","t":"\\u00e9"}',
    '{"f":1e308,"g":-0.0,"h":0.1,"i":5e-324}',
    '{"a":1,"a":2}',  # the last duplicate wins in both
    ' \t\r\n{"x":[true,false,null]} \n',
    "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH,
    '"just a string"',
]
REFUSED = [
    '{"n":1e400}',
    '{"n":NaN}',
    '{"n":-Infinity}',
    '{"s":"\\ud800"}',  # a lone surrogate escape: json takes it, loads_strict keeps json's answer
    "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
    "",
    "  ",
    '\x0c{"a":1}',
    '{"a":"\x01"}',
    "\ufeff{}",
    "{} {}",
]


def _typed(v: Any) -> Any:
    """The value with its types spelled out (1 == 1.0 == True in Python)."""
    if isinstance(v, dict):
        return {k: _typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_typed(x) for x in v]
    return (type(v).__name__, repr(v))


@pytest.mark.parametrize("text", SAME)
def test_the_fast_path_gives_jsons_values(text: str) -> None:
    assert _typed(loads_strict(text)) == _typed(_STRICT.decode(text))


@pytest.mark.parametrize("text", REFUSED)
def test_what_json_strictly_refuses_is_refused(text: str) -> None:
    try:
        expected: Any = _STRICT.decode(text)
    except ValueError:
        with pytest.raises(ValueError):
            loads_strict(text)
        return
    if text.count("[") > MAX_JSON_DEPTH:
        with pytest.raises(ValueError, match="nested deeper"):
            loads_strict(text)
        return
    assert _typed(loads_strict(text)) == _typed(expected)  # the lone surrogate: json's value


def test_a_lone_surrogate_in_the_text_itself_takes_jsons_path() -> None:
    assert loads_strict('"\ud800"') == json.loads('"\ud800"')
