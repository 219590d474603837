"""``cuforge keys``: Ed25519 signing keys for remote entries and bundles.

=============================== ========================================================
``generate --name ci``          a new key pair: ``ci.key`` (private, 0600) and ``ci.pub``
                                (its keyring line, printed too); ``--keyring FILE`` also
                                appends that line to a keyring
``list``                        the keys of the keyring (``CUFORGE_TRUSTED_KEYS`` or
                                ``--keyring``) and the signing key (``CUFORGE_SIGNING_KEY``)
``revoke NAME``                 mark NAME revoked in the keyring and drop the local cache's
                                entries NAME signed (``--keep-local``: keep them)
=============================== ========================================================

The work is done by :mod:`cuforge.base.signing`; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cuforge.base.config import settings
from cuforge.cli import output

__all__ = ["add_parser"]


def _default_dir() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "cuforge", "keys")


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    keys = subparsers.add_parser(
        "keys",
        help="Ed25519 keys: writers sign remote entries and bundles, readers trust a keyring",
        description="Writers (CI) sign with a private key (CUFORGE_SIGNING_KEY=FILE); readers "
        "hold only a keyring of public keys (CUFORGE_TRUSTED_KEYS=FILE) and refuse anything "
        "else. See docs/remote.md, 'Trust'.",
    )
    sub = keys.add_subparsers(dest="keys_command", metavar="SUBCOMMAND")

    def _no_subcommand(args: argparse.Namespace) -> int:
        keys.print_help(sys.stderr)
        return 2

    keys.set_defaults(func=_no_subcommand)
    p = sub.add_parser("generate", parents=[common], help="make a new key pair")
    p.add_argument("--name", required=True, help="the key's name (e.g. ci, ci-2025)")
    p.add_argument(
        "--dir",
        default=None,
        help="where to write NAME.key and NAME.pub (default: ~/.config/cuforge/keys)",
    )
    p.add_argument("--keyring", default=None, help="also append the public key to this keyring")
    p.set_defaults(func=run_generate)
    p = sub.add_parser("list", parents=[common], help="the keyring's keys and the signing key")
    p.add_argument("--keyring", default=None, help="the keyring (default: CUFORGE_TRUSTED_KEYS)")
    p.set_defaults(func=run_list)
    p = sub.add_parser("revoke", parents=[common], help="revoke a key of the keyring")
    p.add_argument("name", help="the key's name")
    p.add_argument("--keyring", default=None, help="the keyring (default: CUFORGE_TRUSTED_KEYS)")
    p.add_argument(
        "--keep-local",
        action="store_true",
        help="keep the local cache's entries this key signed (default: delete them)",
    )
    p.set_defaults(func=run_revoke)


def _keyring_path(args: argparse.Namespace) -> str | None:
    path = args.keyring or settings().trusted_keys
    if not path:
        output.error("no keyring: pass --keyring FILE or set CUFORGE_TRUSTED_KEYS=FILE")
        return None
    return os.path.abspath(os.path.expanduser(path))


def run_generate(args: argparse.Namespace) -> int:
    from cuforge.base import _fs
    from cuforge.base.signing import generate, load_keyring_text, parse_keyring

    directory = os.path.abspath(os.path.expanduser(args.dir or _default_dir()))
    try:
        key_path, pub_path, key = generate(args.name, directory)
    except FileExistsError:
        output.error(
            f"{os.path.join(directory, args.name + '.key')} exists; pick another --name "
            "(keys are never overwritten)"
        )
        return 1
    line = key.public_line()
    keyring = None
    if args.keyring:
        keyring = os.path.abspath(os.path.expanduser(args.keyring))
        text = load_keyring_text(keyring)
        if any(k.name == key.name for k in parse_keyring(text, keyring).keys):
            output.error(f"{keyring} already has a key named {key.name!r}; not added")
            return 1
        _fs.append_line(keyring, line + "\n", mode=0o644)
    if args.json:
        output.emit_json(
            {
                "command": "keys generate",
                "name": key.name,
                "kid": key.kid,
                "private_key": key_path,
                "public_key": pub_path,
                "public_line": line,
                "keyring": keyring,
            }
        )
        return 0
    print(f"private key  {key_path}  (secret: CUFORGE_SIGNING_KEY={key_path} on writers)")
    print(f"public key   {pub_path}")
    if keyring:
        print(f"added to     {keyring}")
    print("\nreaders trust it with this line in their CUFORGE_TRUSTED_KEYS file:")
    print(line)
    return 0


def run_list(args: argparse.Namespace) -> int:
    from cuforge.base.signing import load_keyring, load_signing_key

    path = args.keyring or settings().trusted_keys
    keys = load_keyring(path).keys if path else []
    signing = settings().signing_key
    signer = load_signing_key(signing) if signing else None
    rows = [
        {"name": k.name, "kid": k.kid, "status": "revoked" if k.revoked else "trusted"}
        for k in keys
    ]
    mine = None
    if signer is not None:
        mine = {"name": signer.name, "kid": signer.kid, "file": signing}
    if args.json:
        output.emit_json(
            {"command": "keys list", "keyring": path or None, "keys": rows, "signing_key": mine}
        )
        return 0
    if path:
        print(f"keyring {path}:")
        output.table(["name", "kid", "status"], [(r["name"], r["kid"], r["status"]) for r in rows])
    else:
        print("no keyring (CUFORGE_TRUSTED_KEYS is not set): signatures are not required")
    if mine is not None:
        print(f"signing key: {mine['name']} ({mine['kid']}) from {signing}")
    return 0


def _drop_local(args: argparse.Namespace, name: str, path: str) -> int:
    """Delete the local cache's entries the key ``name`` (a name or a kid of the keyring
    at ``path``) signed, found by the signer's kid they recorded (or, for entries copied
    before kids were recorded, by its name); how many."""
    from cuforge.base.signing import load_keyring_text, parse_keyring
    from cuforge.cli.cache import _store

    ring = parse_keyring(load_keyring_text(path), path)
    kids = {k.kid for k in ring.keys if k.name == name or k.kid == name}
    names = {k.name for k in ring.keys if k.kid in kids}
    store = _store(args)
    doomed = []
    for info in store.iterate():
        meta = info.meta or {}
        kid = meta.get("signer_kid")
        signed_by_it = kid in kids if isinstance(kid, str) else meta.get("signer") in names
        if signed_by_it:
            doomed.append(info.key)
    return sum(1 for key in doomed if store.delete(key))


def run_revoke(args: argparse.Namespace) -> int:
    from cuforge.base.signing import revoke

    path = _keyring_path(args)
    if path is None:
        return 1
    changed = revoke(path, args.name)
    if not changed:
        output.error(f"{path} has no trusted key named {args.name!r} (`cuforge keys list`)")
        return 1
    dropped = 0 if args.keep_local else _drop_local(args, args.name, path)
    if args.json:
        output.emit_json(
            {"command": "keys revoke", "name": args.name, "keyring": path, "dropped": dropped}
        )
        return 0
    print(f"revoked {args.name!r} in {path}: entries it signed are refused from now on")
    if not args.keep_local:
        print(f"deleted {dropped} local cache entries it signed")
    return 0
