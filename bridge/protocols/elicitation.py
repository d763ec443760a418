"""Elicitation, dialect-neutral and pure: the form an agent asks a user to fill in, checked
before anyone sees it, and the answer checked against it before the agent does.

An agent's schema is untrusted input: it is kept only when it is the flat, restricted
kind the ACP specification allows for form mode (MCP's, which ACP adopted): an object
whose properties are strings (optionally an enum, titled or not, or a format), numbers,
integers, booleans or a multi-select array of string options. Everything is bounded —
the schema's size, its property count, every text and option list — and anything else
(a nested object, an unknown type, a wrong type for a keyword) refuses the whole request
with :class:`Refused`, whose text says what was wrong. What is kept is a normalized copy
holding only the keywords the bridge understands, so a client renders and validates what
the bridge validated, nothing more.

A string ``pattern`` is kept for clients to show but never evaluated here: a regular
expression from an agent can take exponential time in Python's engine, and the agent
checks its own answer again anyway (the specification asks both sides to validate).

:class:`Elicitor` is the optional codec capability (looked up with ``isinstance``, as
``ModeSetter`` is) that turns a client's answer into the line the agent reads.
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from bridge.protocols.jsonline import dumps

ACTIONS = ("accept", "decline", "cancel")
MODES = ("form", "url")

MAX_SCHEMA_CHARS = 64 * 1024  # the schema as JSON
MAX_PROPERTIES = 64
MAX_NAME = 128  # a property's name
MAX_TEXT = 4096  # a message, title or description
MAX_OPTIONS = 256  # an enum's values, a multi-select's options
MAX_OPTION = 1024  # one option's value or title
MAX_PATTERN = 1024
MAX_STRING = 64 * 1024  # one string answer
MAX_URL = 4096
MAX_ID = 256  # an elicitationId, a toolCallId
FORMATS = frozenset({"email", "uri", "date", "date-time"})
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+")  # linear: no nested quantifier


class Refused(ValueError):
    """The agent's request, or a client's answer, does not hold: the text says why."""


@runtime_checkable
class Elicitor(Protocol):
    """A dialect whose agent asks elicitations: the line that answers one."""

    def answer_elicitation(self, request_id: str, action: str, content: dict[str, Any] | None) -> str | None:
        """The answer to the agent's pending request ``request_id``; None when it is not
        pending any more (withdrawn, already answered)."""
        ...


# ---------------------------------------------------------------------- small checks


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def text(v: Any, name: str, bound: int = MAX_TEXT, *, empty: bool = True) -> str:
    if not isinstance(v, str) or len(v) > bound or (not empty and not v):
        raise Refused(f"{name} must be a {'' if empty else 'non-empty '}string of at most {bound} characters")
    return v


def _opt_text(prop: dict[str, Any], out: dict[str, Any], key: str, where: str, bound: int = MAX_TEXT) -> None:
    if prop.get(key) is not None:
        out[key] = text(prop[key], f"{where}.{key}", bound)


def _count(prop: dict[str, Any], out: dict[str, Any], key: str, where: str) -> None:
    v = prop.get(key)
    if v is None:
        return
    if not _is_int(v) or v < 0:
        raise Refused(f"{where}.{key} must be a non-negative integer")
    out[key] = v


def _bound(prop: dict[str, Any], out: dict[str, Any], key: str, where: str, integer: bool) -> None:
    v = prop.get(key)
    if v is None:
        return
    if not (_is_int(v) if integer else _is_number(v)):
        raise Refused(f"{where}.{key} must be {'an integer' if integer else 'a finite number'}")
    out[key] = v


def _ordered(out: dict[str, Any], low: str, high: str, where: str) -> None:
    if low in out and high in out and out[low] > out[high]:
        raise Refused(f"{where}: {low} is greater than {high}")


def _values(v: Any, where: str) -> list[str]:
    """An untitled option list: distinct strings."""
    if not isinstance(v, list) or not 0 < len(v) <= MAX_OPTIONS:
        raise Refused(f"{where} must be a list of 1 to {MAX_OPTIONS} strings")
    out = [text(x, where, MAX_OPTION) for x in v]
    if len(set(out)) != len(out):
        raise Refused(f"{where} has a value twice")
    return out


def _titled(v: Any, where: str) -> list[dict[str, str]]:
    """A titled option list: ``{const, title[, description]}``, distinct consts."""
    if not isinstance(v, list) or not 0 < len(v) <= MAX_OPTIONS:
        raise Refused(f"{where} must be a list of 1 to {MAX_OPTIONS} options")
    out: list[dict[str, str]] = []
    for o in v:
        if not isinstance(o, dict):
            raise Refused(f"{where}: each option must be an object with const and title")
        option = {"const": text(o.get("const"), f"{where}.const", MAX_OPTION), "title": ""}
        option["title"] = text(o.get("title"), f"{where}.title", MAX_OPTION)
        if isinstance(o.get("description"), str):
            option["description"] = text(o["description"], f"{where}.description")
        out.append(option)
    if len({o["const"] for o in out}) != len(out):
        raise Refused(f"{where} has a const twice")
    return out


def choices(prop: dict[str, Any]) -> list[str] | None:
    """The values a normalized string or multi-select property allows, if it restricts them."""
    source = prop.get("items", prop) if prop.get("type") == "array" else prop
    if "enum" in source:
        return list(source["enum"])
    titled = source.get("oneOf") or source.get("anyOf")
    return [o["const"] for o in titled] if titled else None


# ---------------------------------------------------------------------- schema


def _string(prop: dict[str, Any], out: dict[str, Any], where: str) -> None:
    _count(prop, out, "minLength", where)
    _count(prop, out, "maxLength", where)
    _ordered(out, "minLength", "maxLength", where)
    _opt_text(prop, out, "pattern", where, MAX_PATTERN)
    if prop.get("format") is not None:
        if prop["format"] not in FORMATS:
            raise Refused(f"{where}.format must be one of {sorted(FORMATS)}")
        out["format"] = prop["format"]
    if prop.get("enum") is not None and prop.get("oneOf") is not None:
        raise Refused(f"{where} has both enum and oneOf")
    if prop.get("enum") is not None:
        out["enum"] = _values(prop["enum"], f"{where}.enum")
    elif prop.get("oneOf") is not None:
        out["oneOf"] = _titled(prop["oneOf"], f"{where}.oneOf")


def _number(prop: dict[str, Any], out: dict[str, Any], where: str) -> None:
    integer = out["type"] == "integer"
    _bound(prop, out, "minimum", where, integer)
    _bound(prop, out, "maximum", where, integer)
    _ordered(out, "minimum", "maximum", where)


def _array(prop: dict[str, Any], out: dict[str, Any], where: str) -> None:
    items = prop.get("items")
    if not isinstance(items, dict):
        raise Refused(f"{where}.items must be an object")
    if items.get("anyOf") is not None:
        out["items"] = {"anyOf": _titled(items["anyOf"], f"{where}.items.anyOf")}
    elif items.get("type") == "string":
        out["items"] = {"type": "string", "enum": _values(items.get("enum"), f"{where}.items.enum")}
    else:
        raise Refused(f"{where}.items must be string options (enum) or titled options (anyOf)")
    _count(prop, out, "minItems", where)
    _count(prop, out, "maxItems", where)
    _ordered(out, "minItems", "maxItems", where)


_KINDS = {"string": _string, "number": _number, "integer": _number, "boolean": None, "array": _array}


def _property(name: Any, prop: Any) -> dict[str, Any]:
    where = f"property {str(name)[:MAX_NAME]!r}"
    text(name, "a property name", MAX_NAME, empty=False)
    if not isinstance(prop, dict):
        raise Refused(f"{where} must be an object")
    kind = prop.get("type")
    if not isinstance(kind, str) or kind not in _KINDS:
        # Nested objects, references, combinators, custom types: nothing a form can show.
        raise Refused(f"{where}: type must be one of {list(_KINDS)}")
    out: dict[str, Any] = {"type": kind}
    _opt_text(prop, out, "title", where)
    _opt_text(prop, out, "description", where)
    fill = _KINDS[kind]
    if fill is not None:
        fill(prop, out, where)
    if prop.get("default") is not None:
        try:  # a default the property itself refuses is left out, as the SDKs drop it
            out["default"] = check_value(out, prop["default"], where)
        except Refused:
            pass
    return out


def form_schema(raw: Any) -> dict[str, Any]:
    """The normalized copy of a form's ``requestedSchema``; raises Refused."""
    if not isinstance(raw, dict):
        raise Refused("requestedSchema must be an object")
    try:
        size = len(dumps(raw))
    except (ValueError, TypeError, RecursionError):
        raise Refused("requestedSchema is not plain JSON") from None
    if size > MAX_SCHEMA_CHARS:
        raise Refused(f"requestedSchema is larger than {MAX_SCHEMA_CHARS} characters")
    if raw.get("type", "object") != "object":
        raise Refused('requestedSchema.type must be "object"')
    props = raw.get("properties", {})
    if not isinstance(props, dict) or len(props) > MAX_PROPERTIES:
        raise Refused(f"requestedSchema.properties must be an object of at most {MAX_PROPERTIES} properties")
    out: dict[str, Any] = {"type": "object", "properties": {n: _property(n, p) for n, p in props.items()}}
    required = raw.get("required") or []
    if not isinstance(required, list) or any(not isinstance(r, str) or r not in props for r in required):
        raise Refused("requestedSchema.required must list names of its properties")
    out["required"] = list(dict.fromkeys(required))
    _opt_text(raw, out, "title", "requestedSchema")
    _opt_text(raw, out, "description", "requestedSchema")
    return out


# ---------------------------------------------------------------------- answers


def _check_string(prop: dict[str, Any], v: Any, where: str) -> str:
    if not isinstance(v, str) or len(v) > MAX_STRING:
        raise Refused(f"{where} must be a string of at most {MAX_STRING} characters")
    if len(v) < prop.get("minLength", 0) or len(v) > prop.get("maxLength", MAX_STRING):
        raise Refused(f"{where} must be {prop.get('minLength', 0)} to {prop.get('maxLength', MAX_STRING)} characters")
    allowed = choices(prop)
    if allowed is not None and v not in allowed:
        raise Refused(f"{where} must be one of the options")
    if not _formatted(prop.get("format"), v):
        raise Refused(f"{where} is not a valid {prop['format']}")
    return v


def _formatted(fmt: str | None, v: str) -> bool:
    try:
        if fmt == "date":
            date.fromisoformat(v)
        elif fmt == "date-time":
            datetime.fromisoformat(v)
    except ValueError:
        return False
    if fmt == "email":
        return _EMAIL.fullmatch(v) is not None
    if fmt == "uri":
        parts = urlsplit(v)
        return bool(parts.scheme) and bool(parts.netloc or parts.path)
    return True


def _check_number(prop: dict[str, Any], v: Any, where: str) -> int | float:
    if prop["type"] == "integer" and isinstance(v, float) and v.is_integer():
        v = int(v)  # 3.0 from a client that only has floats
    if not (_is_int(v) if prop["type"] == "integer" else _is_number(v)):
        raise Refused(f"{where} must be {'an integer' if prop['type'] == 'integer' else 'a number'}")
    if v < prop.get("minimum", -math.inf) or v > prop.get("maximum", math.inf):
        raise Refused(f"{where} is out of range")
    return v  # type: ignore[no-any-return]


def _check_array(prop: dict[str, Any], v: Any, where: str) -> list[str]:
    allowed = choices(prop) or []
    if not isinstance(v, list) or any(not isinstance(x, str) or x not in allowed for x in v):
        raise Refused(f"{where} must be a list of the options")
    if len(set(v)) != len(v):
        raise Refused(f"{where} names an option twice")
    if len(v) < prop.get("minItems", 0) or len(v) > prop.get("maxItems", len(allowed)):
        raise Refused(f"{where}: choose {prop.get('minItems', 0)} to {prop.get('maxItems', len(allowed))} options")
    return list(v)


def check_value(prop: dict[str, Any], v: Any, where: str) -> Any:
    """One answer to one normalized property; raises Refused."""
    kind = prop["type"]
    if kind == "string":
        return _check_string(prop, v, where)
    if kind == "boolean":
        if not isinstance(v, bool):
            raise Refused(f"{where} must be true or false")
        return v
    if kind == "array":
        return _check_array(prop, v, where)
    return _check_number(prop, v, where)


def check_content(schema: dict[str, Any], content: Any) -> dict[str, Any]:
    """An accepted form's content against its normalized schema: every key a property,
    every required one present, every value of its property's kind; raises Refused."""
    if content is None:
        content = {}
    if not isinstance(content, dict):
        raise Refused("content must be an object")
    props: dict[str, Any] = schema.get("properties", {})
    unknown = [k for k in content if k not in props]
    if unknown:
        raise Refused(f"content has {str(unknown[0])[:MAX_NAME]!r}, which the form does not ask for")
    missing = [r for r in schema.get("required", []) if r not in content]
    if missing:
        raise Refused(f"content lacks the required {missing[0]!r}")
    return {k: check_value(props[k], v, f"content.{k}") for k, v in content.items()}


# ---------------------------------------------------------------------- url mode


def url_target(raw: Any) -> tuple[str, str]:
    """A URL-mode request's ``url`` and its host: only an absolute http(s) URL, without
    credentials, whitespace or control characters, is shown to a user; raises Refused."""
    url = text(raw, "url", MAX_URL, empty=False)
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise Refused("url must not contain whitespace or control characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        raise Refused("url is not a valid URL") from None
    if parts.scheme not in ("https", "http") or not host:
        raise Refused("url must be an absolute http or https URL")
    if parts.username is not None or parts.password is not None:
        raise Refused("url must not carry credentials")
    return url, host


def suspicious_host(host: str) -> bool:
    """A host a user may misread: Punycode labels or characters outside ASCII."""
    return not host.isascii() or any(label.startswith("xn--") for label in host.split("."))
