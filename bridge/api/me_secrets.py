"""The caller's own secrets (docs/api.md §4.19; bridge/user_secrets.py): stored for one agent
profile and given to the caller's agents of that profile as environment variables.

``PUT /v1/me/secrets/{profile}/{key}`` with ``{"value"}`` stores or replaces one (204);
``GET /v1/me/secrets`` lists their names (profile, key, updated_at), never a value;
``DELETE /v1/me/secrets/{profile}/{key}`` removes one (204). Every caller manages only
their own (the daemon's own token: the operator's, which its threads get); an admin
manages other users' with ``agent-bridge users secret``. Values are never returned,
logged, or quoted in an error.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from bridge import user_secrets
from bridge.api.auth import require_auth
from bridge.api.context import Ctx
from bridge.api.users import current_user
from bridge.config import AgentProfile
from bridge.errors import NotFound

router = APIRouter(prefix="/v1/me/secrets", dependencies=[Depends(require_auth)])


class SecretIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Checked by user_secrets.value_problem (size, NUL, URLs) with codes of its own; the
    # bound here only stops a body far past any secret before it is handled further.
    value: str = Field(..., max_length=4 * user_secrets.MAX_VALUE_BYTES)


def _profile(ctx: Ctx, name: str) -> AgentProfile:
    prof = ctx.settings.agents.get(name)
    if prof is None:
        raise NotFound(f"no agent profile {name[:128]!r}", code="agent_not_found")
    return prof


def _owner(request: Request) -> str:
    return user_secrets.owner_of(current_user(request).owner)


@router.get("")
async def list_secrets(request: Request, ctx: Ctx) -> dict[str, Any]:
    return {"secrets": await user_secrets.names(ctx.store, _owner(request))}


@router.put("/{profile}/{key}", status_code=204)
async def put_secret(request: Request, ctx: Ctx, profile: str, key: str, body: SecretIn) -> Response:
    ring = user_secrets.keyring(ctx.settings.data_dir)
    await user_secrets.put(ctx.store, ring, _owner(request), _profile(ctx, profile), key, body.value)
    return Response(status_code=204)


@router.delete("/{profile}/{key}", status_code=204)
async def delete_secret(request: Request, ctx: Ctx, profile: str, key: str) -> Response:
    if not user_secrets.NAME_RE.fullmatch(key):
        raise NotFound(f"no secret {key[:128]!r}", code="secret_not_found")
    await user_secrets.remove(ctx.store, _owner(request), profile, key)
    return Response(status_code=204)
