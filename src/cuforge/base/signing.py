"""Ed25519 signatures for remote entries and bundles: writers hold a private key, readers
hold only a keyring of trusted public keys, so a reader cannot forge what other readers
accept (unlike the shared HMAC key, ``CUFORGE_REMOTE_KEY``, which every reader holds).

Files (plain text, one record per line, ``#`` starts a comment):

* a **private key file** (``cuforge keys generate --name ci`` writes ``ci.key``, mode
  0600; ``CUFORGE_SIGNING_KEY`` names it)::

      cuforge-ed25519-private ci 9f3a...   (the 32-byte seed, hex)

  It must not be readable by group or others (refused, as ssh refuses such keys).
* a **keyring** (``CUFORGE_TRUSTED_KEYS``): one ``NAME ed25519:HEX`` line per trusted
  key; ``NAME ed25519:HEX revoked`` for a revoked one (kept, so a refusal names it). Several
  keys may be trusted at once (rotation). Revocation is of a *key*, not of a name: a key
  with a revoked line is revoked under every name it is listed by, and a keyring that lists
  one key twice without revoking it is refused (naming both lines).

Both files are trusted as the cache dir is (:func:`cuforge.base._fs.file_trust_problem`):
owned by the current user or root, not a symlink, and neither the file nor any directory
above it writable by group or others (unless sticky and owned by the user or root).
Signatures are canonical: 128 lowercase hex digits, nothing else.

What is signed: for a remote entry, the length-prefixed ``(domain, namespace, kind, key,
SHA-256 of the entry bytes)``, so a signature is valid for exactly one ``(kind, key)``
and one payload (a signed entry replayed under another key is refused; a signed
direct-mode manifest names the SHA-256 of the entries it leads to, so a remote hit of a
kernel verifies one signature, the manifest's: :mod:`cuforge.store.remote.tier`); for a
bundle, the SHA-256 of its canonical index without the signature (which lists every
payload's SHA-256 and meta). A signature names its key by ``kid`` (the first 16 hex digits of the SHA-256 of
the public key); the signer's *name* a reader reports is the one in its own keyring.
A verified entry copied into the local cache records both (``meta["signer"]``,
``meta["signer_kid"]``); a local hit verifies nothing, and refuses the copy when the current
keyring revokes that kid (a lookup, :class:`cuforge.store.tiered.TieredStore`).

``cryptography`` (``pip install 'cuforge[sign]'``) is imported on the first signature
made or checked, never by ``import cuforge`` nor by a process without a keyring.

Layer 1: imports :mod:`cuforge.base._fs`, :mod:`cuforge.base.config` and :mod:`cuforge.base.errors` only.
"""

from __future__ import annotations

import os

from cuforge.base.errors import ConfigError

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from cuforge.base.config import Settings

__all__ = [
    "PRIVATE_TAG",
    "SigningKey",
    "TrustedKey",
    "Keyring",
    "Untrusted",
    "generate",
    "kid_of",
    "entry_message",
    "bundle_message",
    "load_signing_key",
    "load_keyring",
    "parse_keyring",
    "configured",
    "configured_keyring",
    "revoke",
]

PRIVATE_TAG = "cuforge-ed25519-private"
_PUBLIC_PREFIX = "ed25519:"
_ENTRY_DOMAIN = b"cuforge-remote-ed25519-v1"
_BUNDLE_DOMAIN = b"cuforge-bundle-ed25519-v1"
_FIX = "pip install 'cuforge[sign]'"
_LOWER_HEX = frozenset("0123456789abcdef")


class Untrusted(Exception):
    """A signature a keyring does not accept; ``reason`` says why (unsigned, unknown key,
    revoked key, bad signature)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise ConfigError(
            f"Ed25519 signatures need the 'cryptography' package ({exc}); {_FIX}"
        ) from None
    return ed25519


def kid_of(public: bytes) -> str:
    """The key id of a raw 32-byte public key: 16 hex digits of its SHA-256."""
    import hashlib

    return hashlib.sha256(public).hexdigest()[:16]


def _framed(domain: bytes, *fields: str) -> bytes:
    return b"".join(
        len(part).to_bytes(4, "little") + part for part in (domain, *(f.encode() for f in fields))
    )


#: the first frame of every entry message (its domain), framed once
_ENTRY_FRAME = len(_ENTRY_DOMAIN).to_bytes(4, "little") + _ENTRY_DOMAIN


def entry_message(ns: str, kind: str, key: str, sha256: str) -> bytes:
    """What an entry's signature covers: the exact namespace, kind, key and entry digest
    (``_framed(_ENTRY_DOMAIN, ns, kind, key, sha256)``, spelled out: it runs on every
    verified hit)."""
    a, b, c, d = ns.encode(), kind.encode(), key.encode(), sha256.encode()
    return b"".join(
        (
            _ENTRY_FRAME,
            len(a).to_bytes(4, "little"),
            a,
            len(b).to_bytes(4, "little"),
            b,
            len(c).to_bytes(4, "little"),
            c,
            len(d).to_bytes(4, "little"),
            d,
        )
    )


def bundle_message(index_sha256: str) -> bytes:
    """What a bundle's signature covers: the digest of its canonical unsigned index."""
    return _framed(_BUNDLE_DOMAIN, index_sha256)


def _check_name(name: str) -> str:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise ConfigError(
            f"key name {name!r}: use letters, digits, '-', '_' or '.' (e.g. 'ci-2025')"
        )
    return name


class SigningKey:
    """A writer's private key (``name``; ``public`` raw bytes and ``kid``, computed on
    first use); :meth:`sign`. Building one imports nothing: a writer whose compiles all hit
    never imports ``cryptography``."""

    __slots__ = ("name", "seed", "_private", "_public")

    def __init__(self, name: str, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError("an Ed25519 seed is 32 bytes")
        self.name = _check_name(name)
        self.seed = seed
        self._private = None
        self._public = b""

    def _key(self):
        private = self._private
        if private is None:
            private = self._private = _ed25519().Ed25519PrivateKey.from_private_bytes(self.seed)
        return private

    @property
    def public(self) -> bytes:
        if not self._public:
            from cryptography.hazmat.primitives import serialization

            self._public = (
                self._key()
                .public_key()
                .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            )
        return self._public

    @property
    def kid(self) -> str:
        return kid_of(self.public)

    def sign(self, message: bytes) -> str:
        """The hex Ed25519 signature of ``message``."""
        return self._key().sign(message).hex()

    def public_line(self) -> str:
        """This key's keyring line, ``NAME ed25519:HEX``."""
        return f"{self.name} {_PUBLIC_PREFIX}{self.public.hex()}"


class TrustedKey:
    """One keyring line: ``name``, raw ``public`` key, ``kid``, ``revoked``."""

    __slots__ = ("name", "public", "kid", "revoked", "_verifier")

    def __init__(self, name: str, public: bytes, revoked: bool = False) -> None:
        self.name, self.public, self.revoked = name, public, revoked
        self.kid = kid_of(public)
        self._verifier = None

    def verify(self, signature: bytes, message: bytes) -> bool:
        verifier = self._verifier
        if verifier is None:
            verifier = self._verifier = _ed25519().Ed25519PublicKey.from_public_bytes(self.public)
        try:
            verifier.verify(signature, message)
        except Exception:  # noqa: BLE001 - cryptography raises InvalidSignature; any failure is "not valid"
            return False
        return True


class Keyring:
    """The public keys a reader trusts (``path``: where they came from). Parsing imports
    nothing; the first :meth:`check` imports ``cryptography``."""

    def __init__(self, keys: list[TrustedKey], path: str = "") -> None:
        self.keys = keys
        self.path = path
        # a revoked line wins: a key is revoked under every name it is listed by
        revoked = {k.kid for k in keys if k.revoked}
        for k in keys:
            k.revoked = k.kid in revoked
        self._by_kid: dict[str, TrustedKey] = {}
        for k in keys:
            self._by_kid.setdefault(k.kid, k)

    def check(self, signature: object, kid: object, message: bytes) -> str:
        """The trusted name of the key that made ``signature`` (hex) over ``message``;
        raises :class:`Untrusted` naming why not."""
        if not isinstance(signature, str) or not isinstance(kid, str):
            raise Untrusted("unsigned, and CUFORGE_TRUSTED_KEYS requires signed entries")
        key = self._by_kid.get(kid)
        if key is None:
            raise Untrusted(f"signed by key {kid[:16]!r}, which is not in the keyring {self.path}")
        if key.revoked:
            raise Untrusted(f"signed by the revoked key {key.name!r}")
        if len(signature) != 128 or not _LOWER_HEX.issuperset(signature):
            # canonical only: bytes.fromhex would also take uppercase digits and spaces
            raise Untrusted("the signature is not 128 lowercase hex digits")
        raw = bytes.fromhex(signature)
        if not key.verify(raw, message):
            raise Untrusted(f"bad signature (it does not match key {key.name!r} for this entry)")
        return key.name

    def trusted_name(self, name: object) -> bool:
        """Whether ``name`` is a key of this keyring that is not revoked."""
        return any(k.name == name and not k.revoked for k in self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def parse_keyring(text: str, path: str = "<keyring>") -> Keyring:
    """The keyring in ``text`` (see the module doc); raises ConfigError naming the line."""
    keys: list[TrustedKey] = []
    lines: dict[bytes, list[tuple[int, str, bool]]] = {}  # public key -> (line, name, revoked)
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        ok = len(fields) in (2, 3) and fields[1].startswith(_PUBLIC_PREFIX)
        if ok and len(fields) == 3:
            ok = fields[2] == "revoked"
        public = b""
        if ok:
            try:
                public = bytes.fromhex(fields[1][len(_PUBLIC_PREFIX) :])
            except ValueError:
                ok = False
        if not ok or len(public) != 32:
            raise ConfigError(
                f"{path} line {n}: expected 'NAME ed25519:<64 hex digits> [revoked]' "
                "(the line `cuforge keys generate` prints)"
            )
        keys.append(TrustedKey(_check_name(fields[0]), public, len(fields) == 3))
        lines.setdefault(public, []).append((n, fields[0], len(fields) == 3))
    for public, seen in lines.items():
        if len(seen) > 1 and not any(revoked for _, _, revoked in seen):
            (n1, a, _), (n2, b, _) = seen[:2]
            raise ConfigError(
                f"{path} lines {n1} and {n2} list the same key (kid {kid_of(public)}) as "
                f"{a!r} and {b!r}: a key has one name. Keep one of the lines (or revoke the "
                f"key: `cuforge keys revoke {a}` marks every line of it)"
            )
    return Keyring(keys, path)


def _untrusted_file(variable: str, path: str, full: str, why: str) -> ConfigError | None:
    """The error for a keyring or key file the trust rule refuses, or None."""
    from cuforge.base import _fs

    problem = _fs.file_trust_problem(full)
    if problem is None:
        return None
    return ConfigError(f"{variable}={path!r} cannot be trusted: {problem} ({why})")


def load_keyring(path: str) -> Keyring:
    """The keyring file at ``path``; raises ConfigError for one that cannot be read or
    trusted (:func:`cuforge.base._fs.file_trust_problem`: whoever can change it can make
    this process run their code)."""
    from cuforge.base import _fs

    full = os.path.expanduser(path)
    error = _untrusted_file(
        "CUFORGE_TRUSTED_KEYS",
        path,
        full,
        "anyone who can add a line to a keyring can make this process run their code",
    )
    if error is not None:
        raise error
    try:
        text = _fs.read_bytes(full, max_bytes=1 << 20).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"CUFORGE_TRUSTED_KEYS={path!r} cannot be read ({exc}); point it at a file of "
            "'NAME ed25519:HEX' lines (`cuforge keys generate` prints them), or unset it"
        ) from None
    return parse_keyring(text, full)


def load_signing_key(path: str) -> SigningKey:
    """The private key file at ``path``; raises ConfigError for one that cannot be read,
    is malformed, is readable by group or others, or cannot be trusted
    (:func:`cuforge.base._fs.file_trust_problem`)."""
    from cuforge.base import _fs

    full = os.path.expanduser(path)
    error = _untrusted_file(
        "CUFORGE_SIGNING_KEY",
        path,
        full,
        "whoever can replace a signing key chooses what this process signs",
    )
    if error is not None:
        raise error
    try:
        fd = _fs.open_regular(full)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if st.st_mode & 0o077:
            raise ConfigError(
                f"CUFORGE_SIGNING_KEY={path!r} is readable by others (mode "
                f"{st.st_mode & 0o777:o}); whoever reads it can sign entries every reader "
                f"runs. Fix: chmod 600 {full}"
            )
        text = _fs.read_bytes(full, max_bytes=1 << 16).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"CUFORGE_SIGNING_KEY={path!r} cannot be read ({exc}); point it at the file "
            "`cuforge keys generate` wrote, or unset it"
        ) from None
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) == 3 and fields[0] == PRIVATE_TAG and len(fields[2]) == 64:
            try:
                return SigningKey(fields[1], bytes.fromhex(fields[2]))
            except ValueError:
                break
        break
    raise ConfigError(
        f"CUFORGE_SIGNING_KEY={path!r} is not a cuforge private key file "
        f"('{PRIVATE_TAG} NAME <64 hex digits>'; `cuforge keys generate` writes one)"
    )


# path -> (mtime_ns, size, object): read once per process while the file is unchanged
_loaded: dict[tuple[str, str], tuple[tuple[int, int], object]] = {}


def _cached(kind: str, path: str, load):
    full = os.path.expanduser(path)
    try:
        st = os.stat(full)
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = (-1, -1)
    hit = _loaded.get((kind, full))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    value = load(path)
    _loaded[(kind, full)] = (stamp, value)
    return value


def configured(current: Settings | None = None) -> tuple[SigningKey | None, Keyring | None]:
    """``(signing key, keyring)`` of ``CUFORGE_SIGNING_KEY`` / ``CUFORGE_TRUSTED_KEYS``
    (None for an unset one), each read once per process while its file is unchanged (a
    changed keyring is read again by the next call: tiers built after a revocation refuse
    the revoked key). Raises ConfigError for a bad file."""
    if current is None:
        from cuforge.base.config import settings

        current = settings()
    signer = _cached("key", current.signing_key, load_signing_key) if current.signing_key else None
    keyring = configured_keyring(current.trusted_keys) if current.trusted_keys else None
    return signer, keyring  # type: ignore[return-value]


def configured_keyring(path: str) -> Keyring:
    """The keyring file at ``path``, read again only when it changed (mtime, size)."""
    return _cached("ring", path, load_keyring)  # type: ignore[return-value]


def generate(name: str, directory: str) -> tuple[str, str, SigningKey]:
    """A new key pair named ``name`` in ``directory``: ``NAME.key`` (mode 0600, the private
    key) and ``NAME.pub`` (its keyring line). Returns ``(key path, pub path, key)``.
    Refuses to replace an existing key file (FileExistsError)."""
    _check_name(name)
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives import serialization

    from cuforge.base import _fs

    seed = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    key = SigningKey(name, seed)
    _fs.makedirs_private(directory)
    key_path = os.path.join(directory, f"{name}.key")
    pub_path = os.path.join(directory, f"{name}.pub")
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        _fs.write_all(
            fd,
            (
                "# cuforge signing key (Ed25519). Secret: whoever holds it writes entries "
                f"every reader runs.\n{PRIVATE_TAG} {name} {seed.hex()}\n"
            ).encode(),
        )
    finally:
        os.close(fd)
    _fs.atomic_write(pub_path, key.public_line() + "\n", mode=0o644)
    return key_path, pub_path, key


def revoke(path: str, name: str) -> int:
    """Revoke the key named ``name`` (or whose kid is ``name``) in the keyring file
    ``path``: every line that lists that key is marked revoked, whatever name it gives it
    (a line stays, so refusals name it). Returns how many lines changed (0: no such key,
    or already revoked)."""
    from cuforge.base import _fs

    full = os.path.expanduser(path)
    text = load_keyring_text(full)
    parsed: list[tuple[str, list[str], bytes]] = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        public = b""
        if len(fields) in (2, 3) and fields[1].startswith(_PUBLIC_PREFIX):
            try:
                public = bytes.fromhex(fields[1][len(_PUBLIC_PREFIX) :])
            except ValueError:
                public = b""
        parsed.append((line, fields, public))
    doomed = {
        public
        for _, fields, public in parsed
        if public and (fields[0] == name or kid_of(public) == name)
    }
    out, changed = [], 0
    for line, fields, public in parsed:
        if public in doomed and len(fields) == 2:
            code, sep, comment = line.partition("#")
            line = f"{code.rstrip()} revoked" + (f"  {sep}{comment}" if sep else "")
            changed += 1
        out.append(line)
    if changed:
        new = "\n".join(out) + "\n"
        parse_keyring(new, full)  # never write a keyring this module cannot read back
        _fs.atomic_write(full, new, mode=0o644, makedirs=False)
    return changed


def load_keyring_text(full: str) -> str:
    from cuforge.base import _fs

    try:
        return _fs.read_bytes(full, max_bytes=1 << 20, follow=True).decode("utf-8")
    except FileNotFoundError:
        return ""
