"""The API key store and its CLI: format, hashes only, file mode, atomic
rewrites, revocation seen without a restart, the key shown once."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest

from gateway.admission.keys import (
    LOCAL_KEY_FILE,
    KeyStore,
    KeyStoreError,
    ensure_local_key,
    hash_key,
    key_id_of,
    parse_key,
)
from gateway.admission.keys_cli import main as keys_main
from gateway.config import GatewayConfig


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_key_format_and_store_round_trip(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    new = store.create("free", label="alice")
    key_id, secret = parse_key(new.key) or ("", "")
    assert new.key == f"sk-{key_id}.{secret}"
    assert len(key_id) == 12 and int(key_id, 16) >= 0
    assert len(secret) == 43  # 32 bytes of token_urlsafe: 256 bits
    assert new.record.key_id == key_id and new.record.tier == "free" and new.record.label == "alice"

    text = (tmp_path / "keys.json").read_text()
    assert new.key not in text and secret not in text  # never the key
    assert json.loads(text)["keys"][0]["key_hash"] == hash_key(new.key)
    assert _mode(tmp_path / "keys.json") == 0o600

    reread = KeyStore(tmp_path / "keys.json")  # a fresh process
    assert reread.verify(new.key) == new.record
    assert [r.key_id for r in reread.records()] == [key_id]


def test_verify_refuses_wrong_unknown_and_malformed_keys(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    new = store.create("paid")
    key_id, secret = parse_key(new.key) or ("", "")
    wrong_secret = f"sk-{key_id}.{'A' * len(secret)}"
    unknown_id = f"sk-{'0' * 12}.{secret}"
    for key in (wrong_secret, unknown_id, "sk-nope", "", new.key + "x", new.key.replace("sk-", "pk-")):
        assert store.verify(key) is None, key
    assert key_id_of(new.key) == key_id and key_id_of("garbage") is None


def test_revocation_is_seen_by_a_running_reader(tmp_path: Path) -> None:
    reader = KeyStore(tmp_path / "keys.json")  # the gateway's instance, loaded once
    writer = KeyStore(tmp_path / "keys.json")  # the CLI's
    new = writer.create("free")
    assert reader.verify(new.key) is not None and not reader.verify(new.key).revoked  # type: ignore[union-attr]
    writer.revoke(new.record.key_id)
    assert reader.verify(new.key).revoked  # type: ignore[union-attr]
    with pytest.raises(KeyError):
        writer.revoke("000000000000")


def test_two_writers_do_not_lose_each_others_keys(tmp_path: Path) -> None:
    a, b = KeyStore(tmp_path / "keys.json"), KeyStore(tmp_path / "keys.json")
    a.records(), b.records()  # both loaded the empty store
    k1, k2 = a.create("free"), b.create("paid")
    assert {r.key_id for r in KeyStore(tmp_path / "keys.json").records()} == {k1.record.key_id, k2.record.key_id}


def test_a_damaged_store_keeps_the_last_good_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    store = KeyStore(path)
    new = store.create("free")
    assert store.verify(new.key) is not None
    path.write_text("{not json")
    assert store.verify(new.key) is not None  # a running gateway keeps serving
    with pytest.raises(KeyStoreError, match="key store"):
        KeyStore(path).records()  # a fresh reader says what is wrong


def test_ensure_local_key_creates_once_and_reuses(tmp_path: Path) -> None:
    path = tmp_path / "build" / "gateway_keys.json"
    key = ensure_local_key(path)
    assert key is not None and parse_key(key)
    local = path.with_name(LOCAL_KEY_FILE)
    assert local.read_text().strip() == key and _mode(local) == 0o600
    assert ensure_local_key(path) == key  # reused
    record = KeyStore(path).verify(key)
    assert record is not None and record.tier == "paid"
    assert len(KeyStore(path).records()) == 1

    KeyStore(path).revoke(record.key_id)
    assert ensure_local_key(path) is None  # a revocation is not undone

    path.unlink()  # store wiped: a fresh key
    fresh = ensure_local_key(path, tier="free")
    assert fresh is not None and fresh != key and KeyStore(path).verify(fresh).tier == "free"  # type: ignore[union-attr]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = keys_main(argv, config=GatewayConfig(), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def test_cli_create_list_revoke(tmp_path: Path) -> None:
    store = str(tmp_path / "keys.json")
    status, out, err = _run(["--keys-file", store, "create", "--tier", "free", "--label", "ci bot"])
    key = out.strip()
    key_id = key_id_of(key)
    assert status == 0 and key_id is not None and out == key + "\n"  # the key alone on stdout, once
    assert key_id in err and key not in err

    status, out, _ = _run(["list", "--keys-file", store])
    lines = out.splitlines()
    assert status == 0 and lines[0].split() == ["KEY_ID", "TIER", "CREATED", "REVOKED", "LABEL"]
    assert lines[1].split()[:2] == [key_id, "free"] and lines[1].split()[3:] == ["no", "ci", "bot"]
    assert key not in out and hash_key(key) not in out

    status, out, _ = _run(["--keys-file", store, "list", "--json"])
    rows = json.loads(out)
    assert status == 0 and rows[0]["key_id"] == key_id and "key_hash" not in rows[0] and key not in out

    assert _run(["--keys-file", store, "revoke", key_id]) == (0, f"revoked {key_id}\n", "")
    assert _run(["--keys-file", store, "list", "--json"])[1].count('"revoked": true') == 1


def test_cli_refusals(tmp_path: Path) -> None:
    store = str(tmp_path / "keys.json")
    status, out, err = _run(["--keys-file", store, "create", "--tier", "gold"])
    assert (status, out) == (1, "") and "unknown tier 'gold'; configured tiers: free, paid" in err
    status, _, err = _run(["--keys-file", store, "revoke", "abcdef012345"])
    assert status == 1 and "no key with id 'abcdef012345'" in err
    key = _run(["--keys-file", store, "create", "--tier", "free"])[1].strip()
    status, out, err = _run(["--keys-file", store, "revoke", key])
    assert status == 1 and key not in out + err and "give the key id" in err
    assert _run(["--keys-file", store])[0] == 2  # usage: a status, not an exit
