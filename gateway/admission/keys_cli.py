"""`python -m gateway keys create|list|revoke`: the API key store's CLI.

`create` prints the new key once, alone on stdout (`KEY=$(... keys create
--tier free)` works); what it says about it goes to stderr. `list` shows key
ids, tiers, labels, creation times and revocations, never a key or a hash.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TextIO

from ..config import GatewayConfig
from .keys import KeyStore, KeyStoreError, resolve_keys_file


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gateway keys", description="Manage the gateway's API keys.")
    parser.add_argument(
        "--keys-file",
        default=None,
        help="the key store (default: the gateway settings' keys_file, else <build dir>/gateway_keys.json)",
    )
    # also accepted after the subcommand (`keys list --keys-file F`)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--keys-file", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", parents=[common], help="create a key (printed once)")
    create.add_argument("--tier", required=True, help="the key's tier (one of the configured tiers)")
    create.add_argument("--label", default="", help="a note for humans: owner, purpose")
    listing = sub.add_parser("list", parents=[common], help="list keys (ids, tiers, labels, created, revoked)")
    listing.add_argument("--json", action="store_true", help="one JSON array instead of a table")
    revoke = sub.add_parser(
        "revoke", parents=[common], help="revoke a key by its id (holds from the gateway's next request)"
    )
    revoke.add_argument("key_id", help="the id shown by `list` (sk-<key_id>.…)")
    return parser


def main(
    argv: Sequence[str] | None = None,
    config: GatewayConfig | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Exit status: 0 done, 1 refused (unknown tier or key id, bad store), 2 usage."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    config = config or GatewayConfig()
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors: a status, not an exit
        return int(exc.code or 0)
    store = KeyStore(resolve_keys_file(args.keys_file if args.keys_file is not None else config.keys_file))
    try:
        if args.command == "create":
            return _create(store, config, args.tier, args.label, out, err)
        if args.command == "list":
            return _list(store, args.json, out)
        return _revoke(store, args.key_id, out, err)
    except KeyStoreError as exc:
        print(f"error: {exc}", file=err)
        return 1


def _create(store: KeyStore, config: GatewayConfig, tier: str, label: str, out: TextIO, err: TextIO) -> int:
    if tier not in config.tiers:
        print(f"error: unknown tier {tier!r}; configured tiers: {', '.join(sorted(config.tiers))}", file=err)
        return 1
    new = store.create(tier, label)
    print(new.key, file=out)
    print(
        f"created key {new.record.key_id} (tier {tier}) in {store.path}; "
        "the key above is shown only now: store it safely",
        file=err,
    )
    return 0


def _list(store: KeyStore, as_json: bool, out: TextIO) -> int:
    records = store.records()
    if as_json:
        rows = [{k: v for k, v in asdict(r).items() if k != "key_hash"} for r in records]
        print(json.dumps(rows, indent=2), file=out)
        return 0
    header = ("KEY_ID", "TIER", "CREATED", "REVOKED", "LABEL")
    rows_text = [(r.key_id, r.tier, r.created, "yes" if r.revoked else "no", r.label) for r in records]
    widths = [max(len(row[i]) for row in [header, *rows_text]) for i in range(len(header) - 1)]
    for row in [header, *rows_text]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1], file=out)
    return 0


def _revoke(store: KeyStore, key_id: str, out: TextIO, err: TextIO) -> int:
    if key_id.startswith("sk-"):
        # someone pasted a whole key: refuse rather than echo it anywhere
        print("error: give the key id (the part after 'sk-' and before '.'), not the key", file=err)
        return 1
    try:
        store.revoke(key_id)
    except KeyError:
        print(f"error: no key with id {key_id!r}", file=err)
        return 1
    print(f"revoked {key_id}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
