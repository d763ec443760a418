"""``/v1/me/push-subscriptions``: the caller's browsers subscribed to Web Push (docs/api.md
§4.28; bridge/push/). Each caller manages only their own (the daemon's token: the
operator's, whose threads they are told of).

``GET`` lists them with each one's last delivery and gives the daemon's VAPID public key
(what a page passes to ``pushManager.subscribe``); ``POST`` stores one (the browser's
``PushSubscription.toJSON()``), checked: the endpoint's form and keys (bridge/push/rules.py)
and where its host resolves (sender.allowed_addresses), since the daemon will POST there;
``DELETE …/{id}`` removes one. The endpoint is shown to its owner only as its origin.
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from bridge.api.auth import require_auth
from bridge.api.context import Ctx
from bridge.api.users import current_user
from bridge.clock import now_iso
from bridge.errors import BridgeError, InvalidRequest, NotFound
from bridge.push import rules
from bridge.push.sender import EndpointRefused, Pusher, allowed_addresses
from bridge.store.base import PushRow
from bridge.user_secrets import owner_of

router = APIRouter(prefix="/v1/me/push-subscriptions", dependencies=[Depends(require_auth)])


class PushConflict(BridgeError):
    code = "push_disabled"
    status = 409


class EndpointNotAllowed(BridgeError):
    code = "push_endpoint_refused"
    status = 422


class KeysIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    p256dh: str = Field(..., max_length=200)
    auth: str = Field(..., max_length=100)


class SubscriptionIn(BaseModel):
    """``PushSubscription.toJSON()``: ``expirationTime`` is accepted and not used (push
    services that expire a subscription answer 404/410, which removes it)."""

    model_config = ConfigDict(extra="forbid")
    endpoint: str = Field(..., max_length=rules.MAX_ENDPOINT)
    keys: KeysIn
    expirationTime: float | None = None


def _pusher(ctx: Ctx) -> Pusher:
    pusher = ctx.running.push
    if pusher is None:
        raise PushConflict("Web Push is off on this daemon ([push] enabled = false)", code="push_disabled")
    return pusher


def _shown(row: PushRow) -> dict[str, Any]:
    scheme, _, rest = row.endpoint.partition("://")
    return {
        "id": row.id,
        "origin": f"{scheme}://{rest.split('/', 1)[0]}",
        "created_at": row.created_at,
        "last_at": row.last_at,
        "last_outcome": row.last_outcome,
        "last_status": row.last_status,
    }


@router.get("")
async def list_subscriptions(request: Request, ctx: Ctx) -> dict[str, Any]:
    pusher = _pusher(ctx)
    rows = await ctx.store.list_push_subscriptions(owner_of(current_user(request).owner))
    return {"vapid_public_key": pusher.vapid.public_key, "subscriptions": [_shown(r) for r in rows]}


@router.post("", status_code=201)
async def subscribe(request: Request, ctx: Ctx, body: SubscriptionIn) -> dict[str, Any]:
    pusher = _pusher(ctx)
    allow = pusher.settings.allow_private_endpoints
    try:
        sub = rules.check(body.endpoint, body.keys.p256dh, body.keys.auth, allow_private=allow)
        await allowed_addresses(sub.host, sub.port, allow_private=allow)
    except rules.BadSubscription as exc:
        raise InvalidRequest(str(exc), code="invalid_subscription") from None
    except EndpointRefused as exc:
        raise EndpointNotAllowed(str(exc), code="push_endpoint_refused") from None
    user = owner_of(current_user(request).owner)
    row = PushRow("psub_" + secrets.token_urlsafe(12), user, sub.endpoint, sub.p256dh, sub.auth, now_iso())
    kept = await ctx.store.put_push_subscription(row, max_per_user=pusher.settings.max_per_user)
    if kept is None:
        raise PushConflict(
            f"at most {pusher.settings.max_per_user} push subscriptions per user; remove one first",
            code="push_subscription_limit",
        )
    stored = await ctx.store.get_push_subscription(kept)
    return _shown(stored if stored is not None else row)


@router.delete("/{sub_id}", status_code=204)
async def unsubscribe(request: Request, ctx: Ctx, sub_id: str) -> Response:
    _pusher(ctx)
    if len(sub_id) > 64 or not await ctx.store.delete_push_subscription(sub_id, owner_of(current_user(request).owner)):
        raise NotFound(f"no push subscription {sub_id[:64]!r}", code="push_subscription_not_found")
    return Response(status_code=204)
