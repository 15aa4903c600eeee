"""Triton's own front is closed by default: loopback, admin APIs behind a key
(no server is started here; tests/e2e/test_serve_command.py checks a real one)."""

from __future__ import annotations

import argparse
import logging
import os
import stat
from pathlib import Path

import pytest

from serving.cli import _admin_key_from_args
from serving.launcher import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_GRPC_METADATA,
    ADMIN_KEY_HEADER,
    LaunchOptions,
    TritonServer,
    exposure_warning,
    is_loopback,
    write_admin_key,
)
from serving.settings import DeploymentSettings

KEY = "k" * 20 + "_-."


def _server(tmp_path: Path, **options: object) -> TritonServer:
    return TritonServer(
        LaunchOptions(settings=DeploymentSettings.load(environ={}, model_dir="/models/x"), work_dir=tmp_path, **options)
    )  # type: ignore[arg-type]


def _flag(command: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")]
    assert len(values) == 1, (name, command)
    return values[0]


def test_the_default_binds_all_three_ports_to_loopback(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="serving.launcher"):
        server = _server(tmp_path)
    command = server.command(tmp_path / "repo", tmp_path / "backends")
    for name in ("http-address", "grpc-address", "metrics-address"):
        assert _flag(command, name) == "127.0.0.1"
    assert server.http_url.startswith("http://127.0.0.1:")
    assert not caplog.records


def test_the_admin_groups_need_the_key_and_the_public_ones_do_not(tmp_path: Path):
    server = _server(tmp_path, admin_key=KEY)
    command = server.command(tmp_path / "repo", tmp_path / "backends")
    expected = f"model-repository,logging,trace,shared-memory,statistics:{ADMIN_KEY_HEADER}={KEY}"
    assert _flag(command, "http-restricted-api") == expected
    assert _flag(command, "grpc-restricted-protocol") == expected
    groups = expected.split(":")[0].split(",")
    assert not {"health", "metadata", "inference", "model-config"} & set(groups)
    assert ADMIN_KEY_HEADER == ADMIN_KEY_HEADER.lower()  # gRPC metadata keys must be lowercase
    assert server.admin_headers == {ADMIN_KEY_HEADER: KEY}
    assert server.admin_grpc_metadata == {ADMIN_KEY_GRPC_METADATA: KEY}


def test_without_a_key_each_server_gets_its_own(tmp_path: Path):
    first, second = _server(tmp_path / "a"), _server(tmp_path / "b")
    assert len(first.admin_key) >= 40 and first.admin_key != second.admin_key
    assert f":{ADMIN_KEY_HEADER}={first.admin_key}" in _flag(first.command(tmp_path, tmp_path), "http-restricted-api")


@pytest.mark.parametrize("key", ["", "short", "has space in it here", "a:b" * 10, "k=v" * 10, "a,b" * 10])
def test_a_key_triton_cannot_carry_is_refused_without_being_shown(tmp_path: Path, key: str):
    with pytest.raises(ValueError) as error:
        _server(tmp_path, admin_key=key)
    assert not key or key not in str(error.value)


@pytest.mark.parametrize("address", ["0.0.0.0", "", "10.1.2.3", "::", "2001:db8::1", "example.internal"])
def test_an_address_beyond_loopback_logs_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture, address: str):
    with caplog.at_level(logging.WARNING, logger="serving.launcher"):
        server = _server(tmp_path, address=address, admin_key=KEY)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "crashed" in message and "gateway" in message and "admin" in message
    assert KEY not in caplog.text
    assert _flag(server.command(tmp_path, tmp_path), "metrics-address") == address


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1", "localhost"])
def test_loopback_addresses_are_recognised(address: str):
    assert is_loopback(address)
    assert exposure_warning(address) is None


def test_urls_bracket_an_ipv6_address(tmp_path: Path):
    assert _server(tmp_path, address="::1").http_url.startswith("http://[::1]:")
    assert _server(tmp_path, address="::", admin_key=KEY).grpc_url.startswith("[::1]:")


def test_the_key_file_is_owner_only_even_over_a_world_readable_one(tmp_path: Path):
    path = tmp_path / "work" / "admin_key"
    path.parent.mkdir()
    path.write_text("old\n")
    path.chmod(0o644)
    old_umask = os.umask(0)  # the widest umask: the mode must not depend on it
    try:
        write_admin_key(path, KEY)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == f"{KEY}\n"
    assert [p.name for p in path.parent.iterdir()] == ["admin_key"]  # no temporary file left


def _args(key_file: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(admin_key_file=key_file)


def test_serve_takes_the_key_from_the_file_then_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    assert _admin_key_from_args(_args()) is None
    monkeypatch.setenv(ADMIN_KEY_ENV, f"  {KEY}env\n")
    assert _admin_key_from_args(_args()) == f"{KEY}env"
    key_file = tmp_path / "key"
    key_file.write_text(f"{KEY}file\n")
    assert _admin_key_from_args(_args(str(key_file))) == f"{KEY}file"
    with pytest.raises(SystemExit, match="--admin-key-file"):
        _admin_key_from_args(_args(str(tmp_path / "missing")))
