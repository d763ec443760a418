"""Signing a browser in and out (docs/api.md §3.2): ``POST /v1/session`` trades the token
or a one-time login code for the session cookie, ``DELETE /v1/session`` ends it,
``POST /v1/login-codes`` mints a code for ``agent-bridge login-link``, and
``POST /v1/me/pairing`` one for another device, with its link as a QR code (§3.7).

These are the only routes under ``/v1`` that do not take ``require_auth`` as a whole: each
checks the one credential it accepts itself.
"""

from __future__ import annotations

import json
import math

from fastapi import APIRouter, Request, Response
from starlette.requests import HTTPConnection

from bridge import qr
from bridge.api.auth import authenticate, count_wrong, credential_source, named_user, peer_of, require_auth, token_user
from bridge.api.browser_sessions import COOKIE_NAME, session_cookie
from bridge.api.context import AppContext, context
from bridge.api.tokens import bearer_from_header, given_token
from bridge.api.users import OPERATOR, User
from bridge.errors import InvalidRequest, Unauthorized
from bridge.network import parse_host_port

router = APIRouter(prefix="/v1")

_NO_STORE = {"Cache-Control": "no-store"}


@router.post("/session", status_code=204)
async def login(request: Request) -> Response:
    """Trade the bearer token (header only), or a one-time login code (JSON body
    ``{"code": …}``), for an HttpOnly session cookie."""
    ctx = context(request)
    given = bearer_from_header(request.headers.get("authorization"))
    user: User | None = OPERATOR
    not_after: float | None = None
    if given is not None:
        if ctx.token is not None:
            user = await token_user(ctx, given)
        what = "token"
    else:
        user, not_after = await _code_user(ctx, await request.body())
        what = "login code"
    # Checked first, counted after: a valid token or code signs in from any source.
    if user is None:
        count_wrong(ctx, credential_source(request), what)
        raise Unauthorized("POST /v1/session needs the token as Authorization: Bearer, or a valid one-time login code")
    sid = await ctx.sessions.create(user.owner, not_after=not_after)
    return _cookie_response(request, sid, max(1, math.ceil(ctx.sessions.seconds_left(sid))))


async def _code_user(ctx: AppContext, body: bytes) -> tuple[User | None, float | None]:
    """Whom a one-time code signs in (None: nobody), and when that session must end at the
    latest: a code a page minted (POST /v1/me/pairing) makes a session that ends with the
    one that minted it, and is refused once that one ended, so no chain of codes keeps a
    browser signed in past its first session (docs/security.md "Pairing a phone")."""
    grant = ctx.login_codes.redeem_grant(_code_from_body(body))
    if ctx.token is None:
        return OPERATOR, None
    if grant is None:
        return None, None
    not_after = None
    if grant.parent is not None and (not_after := ctx.sessions.expiry(grant.parent)) is None:
        return None, None
    return await named_user(ctx, grant.user), not_after


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


@router.post("/me/pairing", status_code=201)
async def new_pairing(request: Request) -> Response:
    """A fresh one-time sign-in link for the caller's other device, and its QR code (the
    page's "Sign in another device"). Any signed-in caller, for themselves only: a user's
    code signs that user in, the operator's the operator. A code asked for with a browser
    session names it (login_codes.Grant.parent): the session it makes ends when that one
    does, and it is refused once that one is signed out or expired, so a session can hand
    itself to a phone but never outlive itself through codes (the rule
    ``POST /v1/login-codes`` keeps by taking the token only)."""
    user = await require_auth(request)
    ctx = context(request)
    link = f"{_origin(request)}/"
    code = None
    if ctx.token is not None:
        code = ctx.login_codes.issue(user.owner, parent=_minting_session(ctx, request))
        link += f"#login={code}"
    body = {
        "code": code,
        "link": link,
        "expires_in_s": ctx.login_codes.ttl_s if code is not None else None,
        "qr_svg": qr.svg_data_uri(link),
    }
    return Response(json.dumps(body), status_code=201, media_type="application/json", headers=_NO_STORE)


def _origin(request: Request) -> str:
    """The address the caller reached the daemon at (scheme and Host): the one its page is
    on, so the phone is sent where this browser already goes. The Host header has passed the
    guard's check (api/guard.py); its form is checked again here, since it goes into a link."""
    host = request.headers.get("host", "").strip()
    try:
        parse_host_port(host)
    except ValueError:
        raise InvalidRequest("the Host header is not a host name or address with an optional port") from None
    secure = context(request).tls or request.scope.get("bridge.scheme") == "https"
    return f"{'https' if secure else 'http'}://{host}"


def _minting_session(ctx: AppContext, request: Request) -> str | None:
    """The browser session this request came by, when it came by one (not a bearer token,
    not a trusted proxy's user header): the session the new code's session may not outlive."""
    if given_token(request.headers, websocket=False) is not None:
        return None
    directory = ctx.users
    if directory is not None and directory.proxy_name(request.headers, peer_of(request)) is not None:
        return None
    return request.cookies.get(COOKIE_NAME)


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
