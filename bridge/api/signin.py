"""Signing a browser in and out (docs/api.md §3.2): ``POST /v1/session`` trades the token
or a one-time login code for the session cookie, ``DELETE /v1/session`` ends it, and
``POST /v1/login-codes`` mints a code for ``agent-bridge login-link``.

These are the only routes under ``/v1`` that do not take ``require_auth`` as a whole: each
checks the one credential it accepts itself.
"""

from __future__ import annotations

import json
import math

from fastapi import APIRouter, Request, Response
from starlette.requests import HTTPConnection

from bridge.api.auth import authenticate, count_wrong, credential_source, named_user, peer_of, require_auth, token_user
from bridge.api.browser_sessions import COOKIE_NAME, session_cookie
from bridge.api.context import context
from bridge.api.tokens import bearer_from_header
from bridge.api.users import OPERATOR, User
from bridge.errors import Unauthorized

router = APIRouter(prefix="/v1")

_NO_STORE = {"Cache-Control": "no-store"}


@router.post("/session", status_code=204)
async def login(request: Request) -> Response:
    """Trade the bearer token (header only), or a one-time login code (JSON body
    ``{"code": …}``), for an HttpOnly session cookie."""
    ctx = context(request)
    given = bearer_from_header(request.headers.get("authorization"))
    user: User | None = OPERATOR
    if given is not None:
        if ctx.token is not None:
            user = await token_user(ctx, given)
        what = "token"
    else:
        ok, name = ctx.login_codes.redeem_for(_code_from_body(await request.body()))
        user = OPERATOR if ctx.token is None else await named_user(ctx, name) if ok else None
        what = "login code"
    # Checked first, counted after: a valid token or code signs in from any source.
    if user is None:
        count_wrong(ctx, credential_source(request), what)
        raise Unauthorized("POST /v1/session needs the token as Authorization: Bearer, or a valid one-time login code")
    sid = await ctx.sessions.create(user.owner)
    return _cookie_response(request, sid, max(1, math.ceil(ctx.sessions.ttl_s)))


@router.post("/login-codes", status_code=201)
async def new_login_code(request: Request) -> Response:
    """A fresh one-time login code (``agent-bridge login-link``), for the bearer token
    only: a browser session may not mint the codes that would outlive it."""
    ctx = context(request)
    given = bearer_from_header(request.headers.get("authorization"))
    user: User | None = OPERATOR
    if ctx.token is not None:
        user = None
        if given is not None:
            peer, source = peer_of(request), credential_source(request)
            user = await authenticate(ctx, request.headers, {}, peer=peer, source=source)
    if user is None:
        raise Unauthorized("POST /v1/login-codes needs the token as Authorization: Bearer")
    body = {"code": ctx.login_codes.issue(user.owner), "expires_in_s": ctx.login_codes.ttl_s}
    return Response(json.dumps(body), status_code=201, media_type="application/json", headers=_NO_STORE)


def _code_from_body(body: bytes) -> object:
    if not body or len(body) > 4096:
        return None
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return obj.get("code") if isinstance(obj, dict) else None


@router.delete("/session", status_code=204)
async def logout(request: Request) -> Response:
    await require_auth(request)
    await context(request).sessions.revoke(request.cookies.get(COOKIE_NAME))
    return _cookie_response(request, "", 0)


def _cookie_response(conn: HTTPConnection, value: str, max_age: int) -> Response:
    # Secure whenever the browser reached us over TLS: ours, or a proxy's that says so.
    secure = context(conn).tls or conn.scope.get("bridge.scheme") == "https"
    return Response(status_code=204, headers={"Set-Cookie": session_cookie(value, max_age, secure=secure), **_NO_STORE})
