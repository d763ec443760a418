"""Per-user secrets (docs/security.md "Per-user secrets"): values a user stores for one
agent profile, given to that user's agents of that profile as environment variables.

* Encryption at rest: AES-256-GCM (``cryptography``), a fresh 96-bit nonce per value, and
  the user, the profile and the variable's name as associated data, so a row copied to
  another user, profile or name does not decrypt. The store keeps the nonce and the
  ciphertext (with its tag), never the value.
* The key: ``AGENT_BRIDGE_SECRETS_KEY`` (32 bytes, standard or URL-safe base64) when set,
  else ``<data dir>/secrets.key`` (32 random bytes, created 0600 when the first secret is
  stored). A malformed key is refused with ``secrets_key_invalid``; nothing is then
  stored or decrypted. Replicas sharing a store must share the key.
* Names: an environment variable's (``[A-Z_][A-Z0-9_]{0,127}``), never one the launch
  rules own (the OS allowlist, ``LD_*``, interpreter hooks such as ``NODE_OPTIONS``, the
  bridge's own ``AGENT_BRIDGE_*``/``AWP_*``) and never one the profile's ``env`` sets
  (the operator's setting wins). Values: 1 byte to 16 KiB of UTF-8, no NUL, and no
  remote URL unless the profile opts in (the launch rules' URL check).
* Whose: a thread's owner; threads without one (token mode, the operator's threads in
  users mode) belong to :data:`OPERATOR_NAME`, which no user can be named.

Nothing here logs or puts a value (or a key) in an error message: messages name the user,
the profile and the variable only.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bridge.config import AgentProfile
from bridge.errors import BridgeError, InvalidRequest, LaunchRefused, NotFound
from bridge.process.launch import ENV_ALLOWLIST, url_problem
from bridge.store.base import SecretStore

log = structlog.get_logger("bridge.security")

KEY_ENV = "AGENT_BRIDGE_SECRETS_KEY"
KEY_FILE = "secrets.key"
KEY_BYTES = 32
NONCE_BYTES = 12
OPERATOR_NAME = "operator"  # the owner of threads without one (users can never have this name)
MAX_VALUE_BYTES = 16 * 1024
MAX_PER_USER = 64  # secrets one user may hold, every profile together (64 x 16 KiB = 1 MiB of env)
NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
_AAD_LABEL = "agent-bridge/user-secret/v1"

# Names a secret may never have: what the launch rules give an agent (the OS allowlist),
# and what changes how a program or an interpreter starts rather than what it reads.
RESERVED_NAMES = ENV_ALLOWLIST | frozenset(
    {
        "NODE_OPTIONS",
        "NODE_PATH",
        "NODE_EXTRA_CA_CERTS",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONINSPECT",
        "BASH_ENV",
        "ENV",
        "PROMPT_COMMAND",
        "SHELLOPTS",
        "BASHOPTS",
        "IFS",
        "CDPATH",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "RESOLV_HOST_CONF",
        "PERL5OPT",
        "PERL5LIB",
        "PERLLIB",
        "RUBYOPT",
        "RUBYLIB",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "TMP",
        "TEMP",
        "PWD",
        "OLDPWD",
    }
)
RESERVED_PREFIXES = ("LD_", "DYLD_", "LC_", "XDG_", "MALLOC_", "AGENT_BRIDGE_", "AWP_")


class SecretsUnavailable(BridgeError):
    """The secrets key is malformed or cannot be read or made: nothing is stored or read."""

    code = "secrets_key_invalid"
    status = 503


@dataclass(frozen=True, slots=True)
class Sealed:
    nonce: bytes
    ciphertext: bytes  # with GCM's 16-byte tag


def aad(user: str, profile: str, key: str) -> bytes:
    """The associated data of a value: unambiguous (a JSON array) whatever the names hold."""
    return json.dumps([_AAD_LABEL, user, profile, key], ensure_ascii=True).encode()


def seal(master: bytes, user: str, profile: str, key: str, value: str) -> Sealed:
    nonce = secrets.token_bytes(NONCE_BYTES)
    return Sealed(nonce, AESGCM(master).encrypt(nonce, value.encode(), aad(user, profile, key)))


def unseal(master: bytes, user: str, profile: str, key: str, sealed: Sealed) -> str | None:
    """The value, or None when it does not decrypt (another key, another user's, profile's
    or name's row, or a damaged one)."""
    if len(sealed.nonce) != NONCE_BYTES:
        return None
    try:
        return AESGCM(master).decrypt(sealed.nonce, sealed.ciphertext, aad(user, profile, key)).decode()
    except (InvalidTag, UnicodeDecodeError):
        return None


def parse_key(text: str) -> bytes:
    """``AGENT_BRIDGE_SECRETS_KEY``: 32 bytes in standard or URL-safe base64 (padding optional)."""
    raw = text.strip().rstrip("=")
    if re.fullmatch(r"[A-Za-z0-9+/_-]{43}", raw):  # 32 bytes are 43 characters without padding
        key = base64.b64decode(raw.replace("-", "+").replace("_", "/") + "=")
        if len(key) == KEY_BYTES:
            return key
    raise SecretsUnavailable(f"{KEY_ENV} must be {KEY_BYTES} bytes in base64 (openssl rand -base64 32 makes one)")


class Keyring:
    """Where the key of one data dir comes from, read (and made) on first need."""

    def __init__(self, data_dir: Path, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.path = data_dir / KEY_FILE
        self._from_env = env.get(KEY_ENV) or None
        self._key: bytes | None = parse_key(self._from_env) if self._from_env is not None else None

    @property
    def source(self) -> str:
        return "env" if self._from_env is not None else "file"

    def key(self, *, create: bool) -> bytes:
        """The key; with ``create``, a new key file when there is none yet."""
        if self._key is None:
            self._key = self._read_file(create=create)
        return self._key

    def _read_file(self, *, create: bool) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                raise SecretsUnavailable(f"the secrets key {self.path} is missing") from None
            return self._create()
        except OSError as exc:
            raise SecretsUnavailable(f"cannot read the secrets key {self.path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            key = f.read(KEY_BYTES + 1)
        if len(key) != KEY_BYTES:
            raise SecretsUnavailable(f"the secrets key {self.path} is not {KEY_BYTES} bytes")
        return key

    def _create(self) -> bytes:
        key = secrets.token_bytes(KEY_BYTES)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:  # made by another process just now: use that one
            return self._read_file(create=False)
        except OSError as exc:
            raise SecretsUnavailable(f"cannot create the secrets key {self.path}: {exc.strerror}") from None
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, key)
            os.fsync(fd)
        finally:
            os.close(fd)
        return key


_keyrings: dict[tuple[Path, str | None], Keyring] = {}


def keyring(data_dir: Path, env: Mapping[str, str] | None = None) -> Keyring:
    """The keyring of ``data_dir`` (one per data dir and key variable, kept for the process)."""
    env = os.environ if env is None else env
    slot = (data_dir, env.get(KEY_ENV) or None)
    found = _keyrings.get(slot)
    if found is None:
        found = _keyrings[slot] = Keyring(data_dir, env)
    return found


# --------------------------------------------------------------------------- validation


def name_problem(key: str, profile_env: Mapping[str, str] = {}) -> tuple[str, str] | None:
    """(code, message) when ``key`` cannot be a secret's name, else None."""
    if not NAME_RE.fullmatch(key):
        return (
            "invalid_secret_name",
            "a secret's name is an environment variable's: A-Z, 0-9 and _, 1-128, not starting with a digit",
        )
    if key in RESERVED_NAMES or key.startswith(RESERVED_PREFIXES):
        return "secret_name_reserved", f"{key} is reserved: the launch rules set it, or it changes how programs start"
    if key in profile_env:
        return "secret_name_reserved", f"{key} is set by the agent profile's env, which a secret does not override"
    return None


def value_problem(value: str, *, remote_api_opt_in: bool) -> tuple[str, str] | None:
    """(code, message) when ``value`` cannot be stored; the message never holds the value."""
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        return "invalid_secret_value", "the value is not valid UTF-8"
    if size == 0:
        return "invalid_secret_value", "the value is empty (DELETE removes a secret)"
    if size > MAX_VALUE_BYTES:
        return "secret_too_large", f"the value is {size} bytes; at most {MAX_VALUE_BYTES}"
    if "\x00" in value:
        return "invalid_secret_value", "the value contains a NUL byte"
    if url_problem([value], opt_in=remote_api_opt_in) is not None:
        return "remote_url_refused", "the value holds a URL this agent profile may not reach (remote_api_opt_in)"
    return None


def check(key: str, value: str | None, profile_env: Mapping[str, str], *, remote_api_opt_in: bool) -> None:
    """InvalidRequest for a name (and a value) that cannot be stored."""
    problem = name_problem(key, profile_env)
    if problem is None and value is not None:
        problem = value_problem(value, remote_api_opt_in=remote_api_opt_in)
    if problem is not None:
        raise InvalidRequest(problem[1], code=problem[0])


def owner_of(thread_owner: str | None) -> str:
    """Whose secrets a thread's agents get."""
    return thread_owner if thread_owner is not None else OPERATOR_NAME


# --------------------------------------------------------------------------- operations


async def put(store: SecretStore, ring: Keyring, user: str, profile: AgentProfile, key: str, value: str) -> None:
    """Check, encrypt and store (or replace) ``user``'s secret ``key`` for ``profile``."""
    check(key, value, profile.env, remote_api_opt_in=profile.remote_api_opt_in)
    sealed = seal(ring.key(create=True), user, profile.name, key, value)
    if not await store.put_secret(user, profile.name, key, sealed.nonce, sealed.ciphertext, max_per_user=MAX_PER_USER):
        raise InvalidRequest(f"a user holds at most {MAX_PER_USER} secrets", code="too_many_secrets")
    log.info("secrets.set", user=user, profile=profile.name, key=key)


async def names(store: SecretStore, user: str) -> list[dict[str, str]]:
    """What ``GET /v1/me/secrets`` shows: names and times, never a value."""
    return [{"profile": r.profile, "key": r.key, "updated_at": r.updated_at} for r in await store.list_secrets(user)]


async def remove(store: SecretStore, user: str, profile: str, key: str) -> None:
    if not await store.delete_secret(user, profile, key):
        raise NotFound(f"no secret {key} for agent profile {profile!r}", code="secret_not_found")
    log.info("secrets.deleted", user=user, profile=profile, key=key)


async def agent_env(store: SecretStore, ring: Keyring, user: str, profile: AgentProfile) -> dict[str, str]:
    """The variables ``user``'s agents of ``profile`` get from their secrets. LaunchRefused
    when one cannot be given (the key is gone or another one, the profile no longer allows
    its URL); a name the rules or the profile now own is left out (the profile's wins)."""
    rows = await store.list_secrets(user, profile.name)
    if not rows:
        return {}
    try:
        master = ring.key(create=False)
    except SecretsUnavailable as exc:
        raise LaunchRefused(f"{user}'s secrets cannot be read: {exc.message}", code=exc.code) from None
    env: dict[str, str] = {}
    for row in rows:
        if name_problem(row.key, profile.env) is not None:
            log.warning("secrets.skipped", user=user, profile=profile.name, key=row.key, reason="name now reserved")
            continue
        value = unseal(master, user, profile.name, row.key, Sealed(row.nonce, row.ciphertext))
        if value is None:
            raise LaunchRefused(
                f"{user}'s secret {row.key} for agent profile {profile.name!r} does not decrypt with this daemon's "
                f"key ({KEY_ENV} or {KEY_FILE} is not the one it was stored with): set it again",
                code="secret_unreadable",
            )
        if url_problem([value], opt_in=profile.remote_api_opt_in) is not None:
            raise LaunchRefused(
                f"{user}'s secret {row.key} holds a URL agent profile {profile.name!r} may not reach",
                code="remote_url_refused",
            )
        env[row.key] = value
    return env
