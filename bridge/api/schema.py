"""Client input, one schema for every transport: a REST body and a WebSocket frame that
mean the same thing are validated by the same model (docs/api.md §4.6, §5.3), and each
model makes the one command it stands for (sessions/commands.py), with the bounds of that
module's one table.

A malformed field is a pydantic ValidationError, which each transport answers in its own
words (REST: 400 ``invalid_request``; a frame: ``client.rejected`` ``invalid_frame``, or
``invalid_client_id`` for the client id); content blocks that cannot be sent are refused
as ``invalid_content`` by :func:`~bridge.api.content.normalize_prompt` in both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from bridge.api.content import normalize_prompt
from bridge.errors import BOUND_WORDS
from bridge.sessions.commands import BOUNDS, AnswerPermission, Prompt, Raw, SetConfigOption, SetMode

MAX_CLIENT_ID = BOUNDS.client_id


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def from_frame(cls, frame: dict[str, Any]) -> Any:
        """Validate a WebSocket frame: its known fields only (a frame may carry others,
        ``op`` first among them)."""
        return cls.model_validate({k: frame[k] for k in cls.model_fields if k in frame})


class PromptIn(_In):
    text: str | None = None
    content: list[Any] | None = None
    client_id: str | None = Field(None, min_length=1, max_length=MAX_CLIENT_ID)

    @field_validator("client_id")
    @classmethod
    def _client_id(cls, v: str | None) -> str | None:
        if v is not None and not _utf8(v):
            raise ValueError("client_id must be valid Unicode text")
        return v

    @model_validator(mode="before")
    @classmethod
    def _blocks(cls, data: Any) -> Any:
        if isinstance(data, dict):
            # InvalidRequest (invalid_content), not a ValidationError: the same answer on
            # every transport. Checked before the field types, as it always was.
            data = {**data, "content": normalize_prompt(data.get("text"), data.get("content")), "text": None}
        return data

    def command(self, actor: str, trace: dict[str, str] | None = None) -> Prompt:
        assert self.content is not None
        return Prompt(content=self.content, client_id=self.client_id, actor=actor, trace=trace)


class PermissionIn(_In):
    decision: str = Field(..., max_length=BOUNDS.decision)  # allow | deny, checked by the conversation
    option_id: str | None = Field(None, min_length=1, max_length=BOUNDS.option_id)
    message: str | None = Field(None, max_length=BOUNDS.permission_message)

    def command(self, request_id: str, actor: str, channel: str) -> AnswerPermission:
        """``channel``: how the answer came, recorded as ``permission.resolved``'s ``by``."""
        return AnswerPermission(
            request_id=request_id,
            decision=self.decision,
            channel=channel,
            option_id=self.option_id,
            message=self.message,
            actor=actor,
        )


class PermissionFrame(PermissionIn):
    request_id: str = Field(..., min_length=1, max_length=BOUNDS.request_id)


class RawIn(_In):
    message: dict[str, Any]

    def command(self, actor: str) -> Raw:
        return Raw(message=self.message, actor=actor)


class ModeIn(_In):
    """``POST …/mode`` and the ``set_mode`` frame (docs/api.md §4.19)."""

    mode_id: str = Field(..., min_length=1, max_length=BOUNDS.mode_id)

    def command(self, actor: str) -> SetMode:
        return SetMode(mode_id=self.mode_id, actor=actor)


class ConfigIn(_In):
    """``POST …/config`` and the ``set_config_option`` frame (docs/api.md §4.21): a select
    option's value id, or a boolean."""

    config_id: str = Field(..., min_length=1, max_length=BOUNDS.config_id)
    value: StrictBool | StrictStr  # strict: "true" or "1" is a value id, never a boolean

    @field_validator("value")
    @classmethod
    def _value(cls, v: bool | str) -> bool | str:
        if isinstance(v, str) and not 0 < len(v) <= BOUNDS.config_value:
            raise ValueError(f"must be a boolean or a non-empty string of at most {BOUNDS.config_value} characters")
        return v

    def command(self, actor: str) -> SetConfigOption:
        return SetConfigOption(config_id=self.config_id, value=self.value, actor=actor)


# pydantic's error types, said as a person would (issue #34: "Input should be a valid
# dictionary or object to extract fields from" names a library, not what to send).
_PLAIN: dict[str, str] = {
    **BOUND_WORDS,
    "extra_forbidden": "is not a field this request takes",
    "dict_type": "must be a JSON object",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "json_invalid": "is not valid JSON",
}


def plain_error(err: Mapping[str, Any], *, skip: Sequence[str] = ()) -> str:
    """One validation error as ``<where>: <what is wrong>`` in plain words; ``where`` is the
    field's path (``query.limit``, ``content.0.text``) without the ``skip`` parts, or
    ``the request body`` when the body itself is wrong."""
    where = ".".join(str(p) for p in err.get("loc", ()) if p not in skip) or "the request body"
    kind = str(err.get("type", ""))
    if kind == "json_invalid":
        # Its location is the character where parsing stopped, not a field.
        at = next((p for p in err.get("loc", ()) if isinstance(p, int)), None)
        return "the request body: is not valid JSON" + ("" if at is None else f" (at character {at})")
    template = _PLAIN.get(kind)
    if template is None:
        what = str(err.get("msg", "is invalid"))
        what = what.removeprefix("Value error, ")  # a validator of ours: already in words
        return f"{where}: {what}"
    try:
        return f"{where}: {template.format(**(err.get('ctx') or {}))}"
    except (KeyError, IndexError):
        return f"{where}: {err.get('msg', 'is invalid')}"


def frame_error_code(exc: ValidationError) -> str:
    """The code a frame's ValidationError is answered with."""
    fields = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
    return "invalid_client_id" if fields == {"client_id"} else "invalid_frame"


__all__ = ["ModeIn", "PermissionFrame", "PermissionIn", "PromptIn", "RawIn", "frame_error_code", "plain_error"]
