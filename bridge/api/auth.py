"""Authentication: who is calling (docs/api.md §3, docs/security.md), the one resolver
every transport uses (REST, WebSocket, SSE, the ACP gateway).

A caller is a :class:`~bridge.api.users.User`, from the first of: a trusted proxy's user
header (users mode), a bearer token (api/tokens.py), a live browser session cookie
(api/browser_sessions.py). Wrong ones are counted against their source
(api/throttle.py); signing in and out is api/signin.py; the request guard (Host, Origin,
CORS, page headers) is api/guard.py.

Nothing here logs a token, a cookie or an Authorization header.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Request
from starlette.requests import HTTPConnection

from bridge.api.browser_sessions import COOKIE_NAME
from bridge.api.context import AppContext, context
from bridge.api.tokens import given_token, token_matches
from bridge.api.users import OPERATOR, User, UserDirectory, current_user
from bridge.errors import Forbidden, Throttled, Unauthorized


def peer_of(conn: HTTPConnection) -> str:
    """The socket's peer address ("unknown" on a Unix socket)."""
    return conn.client.host if conn.client else "unknown"


def credential_source(conn: HTTPConnection) -> str:
    """Whom this request's wrong credentials count against (:meth:`Refusals.source`)."""
    return context(conn).refusals.source(peer_of(conn), conn.headers.getlist("x-forwarded-for"))


def count_wrong(ctx: AppContext, source: str, what: str) -> None:
    """Count a wrong token or login code; 429 when ``source`` was already throttled."""
    if (wait := ctx.refusals.wrong(source, what)) is not None:
        raise Throttled(f"too many wrong credentials from {source}; retry in {wait} s", retry_after_s=wait)


async def authenticate(
    ctx: AppContext,
    headers: Mapping[str, str],
    cookies: Mapping[str, str],
    *,
    websocket: bool = False,
    peer: str = "unknown",
    source: str | None = None,
) -> User | None:
    """The caller, or None: a trusted proxy's user header (users mode), a bearer token (header,
    or for a WebSocket the subprotocol) or a live session cookie. A token that is present
    but wrong fails even beside a good cookie. ``peer`` is the socket's peer (whom a proxy
    header is believed from), ``source`` whom wrong credentials count against (default:
    the peer). A valid credential always passes; a wrong token from a throttled source
    raises Throttled (:class:`~bridge.api.throttle.Refusals`)."""
    if ctx.token is None:
        return OPERATOR
    source = peer if source is None else source
    directory = ctx.users
    if directory is not None and (proxied := directory.proxy_name(headers, peer)) is not None:
        return await _proxy_user(ctx, directory, proxied, source)
    given = given_token(headers, websocket=websocket)
    if given is not None:
        user = await token_user(ctx, given)  # checked first: the throttle never refuses it
        if user is None:
            count_wrong(ctx, source, "token")
        return user
    user = await _session_user(ctx, cookies.get(COOKIE_NAME))
    if user is None:
        what = "session cookie" if COOKIE_NAME in cookies else "no credentials"
        ctx.refusals.refused(source, what, guess=False)
    return user


async def _proxy_user(ctx: AppContext, directory: UserDirectory, name: str, peer: str) -> User | None:
    """The user a trusted proxy named: an active user, else nobody (401)."""
    user = await directory.by_name(name)
    if user is None:
        ctx.refusals.refused(peer, "proxy user", guess=False)
    return user


async def token_user(ctx: AppContext, given: str) -> User | None:
    """The daemon's own token is the operator; in users mode, a user's token is that user."""
    if ctx.token is not None and token_matches(ctx.token, given):
        return OPERATOR
    directory = ctx.users
    return None if directory is None else await directory.by_token(given)


async def named_user(ctx: AppContext, name: str | None) -> User | None:
    """The user a session or a login code was made for (None there: the operator), or None
    when that user was revoked since."""
    if name is None:
        return OPERATOR
    directory = ctx.users
    return None if directory is None else await directory.by_name(name)


async def _session_user(ctx: AppContext, sid: str | None) -> User | None:
    sessions = ctx.sessions
    live, name = await sessions.lookup_shared(sid)
    if not live:
        return None
    user = await named_user(ctx, name)
    if user is None and name is not None:  # revoked (on any replica) since it signed in
        sessions.drop_user(name)
    return user


async def resolve_user(conn: HTTPConnection) -> User | None:
    """The one resolver for every transport (REST, WebSocket, SSE, the ACP gateway): the
    caller of this request or upgrade, or None when its credentials are missing or wrong.
    Raises Throttled (429) for a wrong token from a source that sent too many."""
    websocket = conn.scope["type"] == "websocket"
    return await authenticate(
        context(conn),
        conn.headers,
        conn.cookies,
        websocket=websocket,
        peer=peer_of(conn),
        source=credential_source(conn),
    )


async def require_auth(request: Request) -> User:
    """The dependency of every ``/v1`` REST route; the caller is ``request.state.user``."""
    user = await resolve_user(request)
    if user is None:
        raise Unauthorized(how_to_authenticate(request))
    request.state.user = user
    return user


# Sent with every 401 (RFC 6750): the scheme the daemon takes. A Bearer challenge never
# makes a browser show a password dialog, as a Basic one would.
WWW_AUTHENTICATE = 'Bearer realm="agent-bridge"'


def how_to_authenticate(conn: HTTPConnection) -> str:
    """The 401's message: what was wrong with what this request sent, and how to send the
    right credential (issue #34 item 5). It names no path or secret of the daemon: only what
    the caller sent (which it knows) and where an operator finds a token."""
    ctx = context(conn)
    websocket = conn.scope["type"] == "websocket"
    directory = ctx.users
    if directory is not None and directory.proxy_name(conn.headers, peer_of(conn)) is not None:
        return "the user your proxy names is not an active user here; ask an operator (agent-bridge users add NAME)"
    if given_token(conn.headers, websocket=websocket) is not None:
        what = "the bearer token is wrong"
    elif COOKIE_NAME in conn.cookies:
        what = "the browser session has expired or was signed out"
    else:
        what = "no credentials were sent"
    if ctx.settings.auth.mode == "users":
        credential = "your user token (an operator makes one with `agent-bridge users add NAME`)"
    else:
        credential = "the daemon's token (the file <data-dir>/token on its machine, or its AGENT_BRIDGE_TOKEN)"
    how = "Authorization: Bearer <token>"
    if websocket:
        how += " or the subprotocols agent-bridge.v1, bearer.<token>"
    return (
        f"{what}: send {credential} as {how}; a browser signs in with the one-time link "
        "`agent-bridge login-link` prints (docs/security.md)"
    )


def require_admin(conn: HTTPConnection) -> None:
    """Routes about the daemon or its one shared HOME rather than the caller's own threads
    (docs/api.md §3.6): in users mode only admins (and the operator) may use them."""
    if context(conn).settings.auth.mode == "users" and not current_user(conn).admin:
        raise Forbidden("this needs an admin in users mode: it is about the daemon, not your threads")
