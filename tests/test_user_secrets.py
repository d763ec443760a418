"""Per-user secrets without a daemon (bridge/user_secrets.py, bridge/sessions/scrub.py): the
AES-GCM round trip, associated data that binds a value to its user, profile and name, the
key file (made 0600 once, refused when damaged) and the key variable, the name and value
rules, and the scrubber that keeps values out of a transcript. Pure, or a temp dir."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from bridge import secrets_cli, user_secrets
from bridge.errors import InvalidRequest
from bridge.process.launch import ENV_ALLOWLIST
from bridge.protocols.events import REDACTED
from bridge.sessions.scrub import Scrubber
from bridge.user_secrets import Keyring, Sealed, SecretsUnavailable, seal, unseal

KEY = bytes(range(32))


def test_a_value_round_trips_and_each_sealing_has_its_own_nonce() -> None:
    a = seal(KEY, "alice", "claude", "ANTHROPIC_API_KEY", "sk-ant-é-1234")
    b = seal(KEY, "alice", "claude", "ANTHROPIC_API_KEY", "sk-ant-é-1234")
    assert a.nonce != b.nonce and a.ciphertext != b.ciphertext
    assert b"sk-ant" not in a.ciphertext
    assert unseal(KEY, "alice", "claude", "ANTHROPIC_API_KEY", a) == "sk-ant-é-1234"


@pytest.mark.parametrize(
    ("user", "profile", "key"),
    [("bob", "claude", "TOKEN"), ("alice", "qwen", "TOKEN"), ("alice", "claude", "OTHER")],
)
def test_a_row_moved_to_another_user_profile_or_name_does_not_decrypt(user: str, profile: str, key: str) -> None:
    sealed = seal(KEY, "alice", "claude", "TOKEN", "value-123")
    assert unseal(KEY, user, profile, key, sealed) is None


def test_the_associated_data_cannot_be_shifted_between_fields() -> None:
    # A separator-joined AAD would make ("a", "b|c") and ("a|b", "c") the same.
    assert user_secrets.aad("a", "b\x00c", "K") != user_secrets.aad("a\x00b", "c", "K")
    sealed = seal(KEY, "al", "ice", "K", "value-123")
    assert unseal(KEY, "a", "lice", "K", sealed) is None


def test_another_key_or_a_damaged_row_does_not_decrypt() -> None:
    sealed = seal(KEY, "alice", "claude", "TOKEN", "value-123")
    assert unseal(bytes(32), "alice", "claude", "TOKEN", sealed) is None
    flipped = bytes([sealed.ciphertext[0] ^ 1]) + sealed.ciphertext[1:]
    assert unseal(KEY, "alice", "claude", "TOKEN", Sealed(sealed.nonce, flipped)) is None
    assert unseal(KEY, "alice", "claude", "TOKEN", Sealed(sealed.nonce[:8], sealed.ciphertext)) is None


def test_the_key_file_is_made_once_0600_and_only_when_asked(tmp_path: Path) -> None:
    ring = Keyring(tmp_path, env={})
    with pytest.raises(SecretsUnavailable) as missing:
        ring.key(create=False)
    assert missing.value.code == "secrets_key_invalid" and not (tmp_path / "secrets.key").exists()
    key = ring.key(create=True)
    path = tmp_path / "secrets.key"
    assert len(key) == 32 and path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Keyring(tmp_path, env={}).key(create=True) == key  # read, not made again


def test_a_damaged_or_symlinked_key_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secrets.key").write_bytes(b"short")
    with pytest.raises(SecretsUnavailable, match="not 32 bytes"):
        Keyring(tmp_path, env={}).key(create=True)
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "real").write_bytes(KEY)
    os.symlink(tmp_path / "real", other / "secrets.key")
    with pytest.raises(SecretsUnavailable):
        Keyring(other, env={}).key(create=True)


def test_the_key_variable_wins_and_a_malformed_one_is_refused_without_quoting_it(tmp_path: Path) -> None:
    std = base64.b64encode(KEY).decode()
    url = base64.urlsafe_b64encode(KEY).decode().rstrip("=")
    for text in (std, url, f" {std}\n"):
        ring = Keyring(tmp_path, env={"AGENT_BRIDGE_SECRETS_KEY": text})
        assert ring.key(create=True) == KEY and ring.source == "env"
    assert not (tmp_path / "secrets.key").exists()
    for bad in ("c2hvcnQ=", "not base64 at all!!" * 3, base64.b64encode(bytes(33)).decode()):
        with pytest.raises(SecretsUnavailable) as exc:
            Keyring(tmp_path, env={"AGENT_BRIDGE_SECRETS_KEY": bad})
        assert exc.value.code == "secrets_key_invalid" and bad not in exc.value.message


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("lower", "invalid_secret_name"),
        ("1ABC", "invalid_secret_name"),
        ("A-B", "invalid_secret_name"),
        ("A" * 129, "invalid_secret_name"),
        ("", "invalid_secret_name"),
        ("PATH", "secret_name_reserved"),
        ("HOME", "secret_name_reserved"),
        ("LD_PRELOAD", "secret_name_reserved"),
        ("LD_LIBRARY_PATH", "secret_name_reserved"),
        ("NODE_OPTIONS", "secret_name_reserved"),
        ("BASH_ENV", "secret_name_reserved"),
        ("AGENT_BRIDGE_TOKEN", "secret_name_reserved"),
        ("AWP_AGENT_CLI_EXECUTABLE", "secret_name_reserved"),
        ("LC_ALL", "secret_name_reserved"),
        ("SET_BY_PROFILE", "secret_name_reserved"),
    ],
)
def test_names_the_launch_rules_or_the_profile_own_are_refused(key: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        user_secrets.check(key, "value-123", {"SET_BY_PROFILE": "x"}, remote_api_opt_in=False)
    assert exc.value.code == code


def test_every_variable_of_the_os_allowlist_is_reserved() -> None:
    for name in ENV_ALLOWLIST:
        assert user_secrets.name_problem(name) is not None, name
    assert user_secrets.name_problem("ANTHROPIC_API_KEY") is None
    assert user_secrets.name_problem("_X") is None


@pytest.mark.parametrize(
    ("value", "code", "opt_in"),
    [
        ("", "invalid_secret_value", False),
        ("a\x00b", "invalid_secret_value", False),
        ("\ud800x", "invalid_secret_value", False),
        ("x" * (16 * 1024 + 1), "secret_too_large", False),
        ("https://api.example.com/v1", "remote_url_refused", False),
        ("http://api.example.com/v1", "remote_url_refused", True),
    ],
)
def test_bad_values_are_refused_without_quoting_them(value: str, code: str, opt_in: bool) -> None:
    with pytest.raises(InvalidRequest) as exc:
        user_secrets.check("TOKEN", value, {}, remote_api_opt_in=opt_in)
    assert exc.value.code == code
    if len(value) > 3:
        assert value not in exc.value.message and "example" not in exc.value.message


def test_values_that_pass() -> None:
    for value in ("x" * (16 * 1024), "multi\nline\n-----END KEY-----", "https://api.example.com", "http://127.0.0.1:9"):
        user_secrets.check("TOKEN", value, {}, remote_api_opt_in=True)
    user_secrets.check("TOKEN", "http://localhost:8080/v1", {}, remote_api_opt_in=False)


def test_the_scrubber_redacts_owner_secrets_whatever_their_names_and_as_json_writes_them() -> None:
    plain, quoted, accented = "plainvalue42", 'with"quote\\back', "clé-secrète"
    scrub = Scrubber({"PLAIN_SETTING": "not-a-secret-name"}, extra=[plain, quoted, accented, "short"])
    line = json.dumps({"text": f"{plain} {quoted} {accented} short not-a-secret-name"})
    ascii_line = json.dumps({"text": accented})
    out = b"".join(scrub.lines([line.encode(), ascii_line.encode()])).decode()
    assert plain not in out and "quote" not in out and "cl" not in out
    assert out.count(REDACTED) == 4
    assert "short" in out and "not-a-secret-name" in out  # too short to scrub; not a secret's name
    assert scrub.text(f"stderr: {plain}") == f"stderr: {REDACTED}"


def test_the_cli_reads_one_value_from_stdin_less_one_newline(tmp_path: Path) -> None:
    import io

    assert secrets_cli.MAX_VALUE_BYTES == user_secrets.MAX_VALUE_BYTES
    assert secrets_cli.read_value(io.BytesIO(b"abc\n")) == "abc"
    assert secrets_cli.read_value(io.BytesIO(b"abc\r\n")) == "abc"
    assert secrets_cli.read_value(io.BytesIO(b"a\nb\n\n")) == "a\nb\n"
