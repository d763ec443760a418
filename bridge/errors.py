"""One exception tree for everything the bridge refuses or fails at.

    BridgeError                      code, message, http status
    ├── ConfigError                  bad config file / flag / profile (startup)
    ├── LaunchRefused                a launch rule said no; nothing was spawned (docs/api.md §2)
    ├── Unauthorized                 missing or wrong credentials
    ├── Throttled                    too many wrong credentials from one peer (429, Retry-After)
    ├── NotFound                     thread_not_found, agent_not_found, a page asset
    ├── InvalidRequest               a client sent something we will not act on
    ├── Busy                         too many queued prompts on one thread
    ├── Capacity                     max_conversations agents are already running
    ├── Conflict                     the thread is not in a state that allows this
    │   └── HeldElsewhere            another replica holds the thread's live lease
    ├── Draining                     the daemon is stopping (SIGTERM): no new threads
    └── StoreError                   the store failed; nothing acknowledged was lost
        └── LeaseLost                an append under an epoch that is no longer the live lease

Only ``api/`` maps these onto HTTP statuses and WebSocket frames, always with the one
error body of :func:`error_body` (docs/api.md §9).
"""

from __future__ import annotations

import json


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    """The body of every refusal the bridge sends: ``{"error": {"code", "message"}}``."""
    return {"error": {"code": code, "message": message}}


def error_json(code: str, message: str) -> bytes:
    """:func:`error_body` as UTF-8 JSON, for the places that write raw ASGI / HTTP."""
    return json.dumps(error_body(code, message)).encode()


class BridgeError(Exception):
    code = "internal_error"
    status = 500
    # Seconds a client should wait before trying again (HTTP Retry-After), for refusals
    # that pass by themselves: a store or bus outage, a draining replica, throttling.
    retry_after_s: int | None = None

    def __init__(self, message: str, *, code: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class ConfigError(BridgeError):
    code = "config_error"
    status = 400


class LaunchRefused(BridgeError):
    code = "launch_refused"
    status = 422


class Unauthorized(BridgeError):
    code = "unauthorized"
    status = 401


class Throttled(BridgeError):
    code = "too_many_failures"
    status = 429

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class Forbidden(BridgeError):
    code = "admin_required"
    status = 403


class NotFound(BridgeError):
    code = "not_found"
    status = 404


class InvalidRequest(BridgeError):
    code = "invalid_request"
    status = 400


class Busy(BridgeError):
    code = "busy"
    status = 429


class Capacity(BridgeError):
    code = "capacity"
    status = 503


class Conflict(BridgeError):
    code = "conflict"
    status = 409


class StoreError(BridgeError):
    code = "store_error"
    status = 503
    retry_after_s: int | None = 2  # an outage: the store reconnects by itself


# A WebSocket's close code when the store cannot be read (RFC 6455 1013 "Try Again Later"):
# the thread may well exist; reconnect later with ``after=`` (docs/api.md §5.7).
STORE_UNAVAILABLE_CLOSE = 1013


class LeaseLost(StoreError):
    """An append fenced by a lease epoch that is no longer this replica's live lease: the
    database refused it (nothing was written)."""

    code = "lease_lost"
    status = 409
    retry_after_s = None


class HeldElsewhere(Conflict):
    """Another replica (``holder``) holds this thread's live lease: only it may run the
    agent and append (docs/DESIGN.md "Ownership")."""

    code = "not_owner"  # wire codes keep their historical names (docs/api.md): not_owner, owner_*

    def __init__(self, holder: str, thread_id: str = "") -> None:
        super().__init__(f"thread {thread_id or '?'} is held by replica {holder!r}")
        self.holder = holder
        self.thread_id = thread_id


class Draining(BridgeError):
    """The daemon is draining (SIGTERM): it takes no new work (no thread, prompt, lease or
    agent start); another replica does (sessions/forwarding.py)."""

    code = "draining"
    status = 503
    retry_after_s = 1  # at once, and the load balancer sends it to another replica


# pydantic's bound and choice errors in words, shared by the config's refusals
# (config_sources) and the API's (api/schema): each adds its own words for types.
BOUND_WORDS: dict[str, str] = {
    "missing": "is required",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "list_type": "must be a list",
    "int_from_float": "must be a whole number",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "string_too_short": "must be at least {min_length} character(s) long",
    "string_too_long": "must be at most {max_length} characters long",
    "too_short": "must hold at least {min_length} item(s)",
    "too_long": "must hold at most {max_length} items",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
}
