"""``[push]``: Web Push to users' browsers (issue #39; docs/configuration.md "Push")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PushSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Off: no subscriptions taken, nothing sent (the page hides its control).
    enabled: bool = True
    # The VAPID token's contact (RFC 8292 §2.1): a mailto: or https: URI that push services
    # may use to reach the operator. Some (Apple's) refuse a localhost address.
    subject: str = Field("mailto:agent-bridge@localhost", pattern=r"^(mailto:[^\s@]+@[^\s@]+|https://\S+)$")
    # Endpoints whose host resolves to a private, loopback or link-local address (a push
    # service on the LAN; plain http only for a loopback one, as tests use) are refused
    # unless this is true: the daemon POSTs to a URL a client chose.
    allow_private_endpoints: bool = False
    # Subscriptions one user may hold (browsers and devices).
    max_per_user: int = Field(20, ge=1, le=1000)
