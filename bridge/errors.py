"""One exception tree for everything the bridge refuses or fails at.

    BridgeError                      code, message, http status
    ├── ConfigError                  bad config file / flag / profile (startup)
    ├── LaunchRefused                a launch rule said no; nothing was spawned (API.md §2)
    ├── NotFound                     thread_not_found, agent_not_found
    ├── InvalidRequest               a client sent something we will not act on
    ├── Busy                         too many queued prompts on one thread
    ├── Capacity                     max_conversations agents are already running
    ├── Conflict                     the thread is not in a state that allows this
    └── StoreError                   the store failed; nothing acknowledged was lost

Only ``api/`` maps these onto HTTP statuses and WebSocket frames.
"""

from __future__ import annotations


class BridgeError(Exception):
    code = "internal_error"
    status = 500

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class ConfigError(BridgeError):
    code = "config_error"
    status = 400


class LaunchRefused(BridgeError):
    code = "launch_refused"
    status = 422


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
