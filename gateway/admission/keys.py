"""The API key store: a JSON file of key ids, SHA-256 hashes and tiers.

A key is `sk-<key_id>.<secret>`: the key id is short, random and public (the
lookup handle, safe to log and to show in `keys list`); the secret carries 256
random bits from `secrets`. The store keeps the SHA-256 of the whole key, never
the key, so a leaked store file cannot be replayed. A presented key is looked up
by its id and its hash compared with `hmac.compare_digest` (constant time).

The file is rewritten atomically (a temporary file in the same folder, fsync,
rename) with mode 0600, under an exclusive lock so two `keys create` never lose
each other's key. Readers (the gateway) reload it when its stat changes, so a
revocation holds from the next request without a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from ..lifecycle.state_dir import state_dir

log = logging.getLogger(__name__)

KEY_PREFIX = "sk-"
KEY_ID_HEX_CHARS = 12  # 48 random bits: a handle, not a secret; collisions are re-drawn
SECRET_BYTES = 32  # 256 bits (≥ 128 asked); token_urlsafe → 43 characters
STORE_VERSION = 1
LOCAL_KEY_FILE = "gateway_local_key"  # next to the store: the key `make serve` prints

# generous on lengths so a key made by an older or newer version still parses;
# '.' separates id and secret and appears in neither
_KEY_RE = re.compile(r"^sk-([0-9a-f]{8,32})\.([A-Za-z0-9_-]{22,128})$")


def default_keys_file() -> Path:
    """GatewayConfig.keys_file's default: <build dir>/gateway_keys.json."""
    return state_dir() / "gateway_keys.json"


def resolve_keys_file(configured: str) -> Path:
    return Path(configured).expanduser() if configured else default_keys_file()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_key(key: str) -> tuple[str, str] | None:
    """(key_id, secret) of a well-formed key, else None."""
    match = _KEY_RE.match(key)
    return (match.group(1), match.group(2)) if match else None


def key_id_of(key: str) -> str | None:
    parsed = parse_key(key)
    return parsed[0] if parsed else None


def _now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    key_hash: str  # sha256 hex of the whole key
    tier: str
    created: str  # ISO 8601, UTC
    label: str = ""
    revoked: bool = False

    def matches(self, key: str) -> bool:
        return hmac.compare_digest(self.key_hash, hash_key(key))


@dataclass(frozen=True)
class NewKey:
    key: str  # shown once, then only its hash exists
    record: KeyRecord


class KeyStoreError(Exception):
    """A store file that cannot be read as a key store."""


# compared against when the key id is unknown, so that path costs the same hash
_DUMMY_HASH = hash_key("sk-000000000000.unknown-key-placeholder")


class KeyStore:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._records: dict[str, KeyRecord] = {}
        self._signature: tuple[int, int, int] | None = None

    # reading

    def records(self) -> list[KeyRecord]:
        self._refresh()
        return sorted(self._records.values(), key=lambda r: (r.created, r.key_id))

    def get(self, key_id: str) -> KeyRecord | None:
        self._refresh()
        return self._records.get(key_id)

    def verify(self, key: str) -> KeyRecord | None:
        """The record whose hash matches `key` (revoked or not: the caller
        decides), or None for a malformed, unknown or wrong key."""
        parsed = parse_key(key)
        if parsed is None:
            return None
        record = self.get(parsed[0])
        if record is None:
            hmac.compare_digest(_DUMMY_HASH, hash_key(key))
            return None
        return record if record.matches(key) else None

    def _refresh(self) -> None:
        """Reload when the file changed (one stat per call: the gateway sees
        `keys revoke` from the next request on)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._records, self._signature = {}, None
            return
        signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        if signature == self._signature:
            return
        try:
            self._records = self._read()
        except KeyStoreError:
            if self._signature is None:
                raise
            # a damaged edit must not lock every caller out: keep the last good
            # records, say so once (the signature is taken below)
            log.error("key store %s unreadable; keeping the %d keys read before", self.path, len(self._records))
        self._signature = signature

    def _read(self) -> dict[str, KeyRecord]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise KeyStoreError(f"key store {self.path}: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise KeyStoreError(f"key store {self.path}: expected an object with a 'keys' list")
        records: dict[str, KeyRecord] = {}
        for item in data["keys"]:
            try:
                record = KeyRecord(**item)
            except TypeError as exc:
                raise KeyStoreError(f"key store {self.path}: bad entry: {exc}") from exc
            records[record.key_id] = record
        return records

    # writing (each under the lock, from a fresh read)

    def create(self, tier: str, label: str = "") -> NewKey:
        with self._locked():
            records = self._read()
            key_id = secrets.token_hex(KEY_ID_HEX_CHARS // 2)
            while key_id in records:
                key_id = secrets.token_hex(KEY_ID_HEX_CHARS // 2)
            key = f"{KEY_PREFIX}{key_id}.{secrets.token_urlsafe(SECRET_BYTES)}"
            record = KeyRecord(key_id=key_id, key_hash=hash_key(key), tier=tier, created=_now_iso(), label=label)
            records[key_id] = record
            self._write(records)
        return NewKey(key=key, record=record)

    def revoke(self, key_id: str) -> KeyRecord:
        """KeyError for an unknown id; revoking twice is harmless."""
        with self._locked():
            records = self._read()
            if key_id not in records:
                raise KeyError(key_id)
            records[key_id] = replace(records[key_id], revoked=True)
            self._write(records)
        return records[key_id]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def _write(self, records: dict[str, KeyRecord]) -> None:
        body = {
            "version": STORE_VERSION,
            "keys": [asdict(r) for r in sorted(records.values(), key=lambda r: (r.created, r.key_id))],
        }
        write_private(self.path, json.dumps(body, indent=2) + "\n")
        self._signature = None  # our own write: reload on next read


def write_private(path: Path, text: str) -> None:
    """Atomic write with mode 0600 from the first byte (the temporary file is
    created 0600, so the content is never readable by others, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def ensure_local_key(path: str | os.PathLike[str], tier: str = "paid") -> str | None:
    """The key `make serve` prints in its example requests: created on first
    run, stored (0600) in `gateway_local_key` next to the store and reused.

    None when the operator revoked it: re-creating it would undo the revocation."""
    store = KeyStore(path)
    local = store.path.with_name(LOCAL_KEY_FILE)
    try:
        key = local.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        key = ""
    if key:
        record = store.verify(key)
        if record is not None:
            return None if record.revoked else key
        # the store was replaced or the file damaged: a fresh key below
    new = store.create(tier, label="local (make serve)")
    write_private(local, new.key + "\n")
    return new.key
