"""Client content blocks (docs/api.md §4.6): text, image and document, validated and
passed on in the Anthropic block shape every dialect here accepts. Anything else is
refused explicitly, never reinterpreted."""

from __future__ import annotations

import binascii
from typing import Any

from bridge.errors import InvalidRequest
from bridge.sessions.commands import BOUNDS

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
DOCUMENT_TYPES = frozenset({"application/pdf", "text/plain"})
MAX_BLOCKS = BOUNDS.content_blocks  # (the one table of a command's bounds)


def _bad(msg: str) -> InvalidRequest:
    return InvalidRequest(msg, code="invalid_content")


def normalize_prompt(text: Any, content: Any) -> list[dict[str, Any]]:
    if (text is None) == (content is None):
        raise _bad("send exactly one of 'text' or 'content'")
    if text is not None:
        if not isinstance(text, str) or not text.strip():
            raise _bad("'text' must be a non-empty string")
        return [{"type": "text", "text": text}]
    if not isinstance(content, list) or not content:
        raise _bad("'content' must be a non-empty list of blocks")
    if len(content) > MAX_BLOCKS:
        raise _bad(f"at most {MAX_BLOCKS} content blocks")
    return [_block(i, b) for i, b in enumerate(content)]


def _block(i: int, block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise _bad(f"content[{i}] must be an object")
    btype = block.get("type")
    if btype == "text":
        if not isinstance(block.get("text"), str):
            raise _bad(f"content[{i}].text must be a string")
        return {"type": "text", "text": block["text"]}
    if btype in ("image", "document"):
        allowed = IMAGE_TYPES if btype == "image" else DOCUMENT_TYPES
        source = block.get("source")
        if not isinstance(source, dict) or source.get("type") != "base64":
            raise _bad(f"content[{i}].source must be {{type:'base64', media_type, data}}")
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or media_type not in allowed:
            raise _bad(f"content[{i}]: media_type must be one of {', '.join(sorted(allowed))}")
        if not isinstance(data, str) or not data:
            raise _bad(f"content[{i}].source.data must be base64 text")
        try:
            binascii.a2b_base64(data.encode("ascii"), strict_mode=True)
        except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
            raise _bad(f"content[{i}].source.data is not valid base64") from exc
        return {"type": btype, "source": {"type": "base64", "media_type": media_type, "data": data}}
    raise _bad(f"content[{i}]: unsupported block type {btype!r} (text, image, document)")
