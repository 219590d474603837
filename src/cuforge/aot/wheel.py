"""``cuforge bundle wheel``: a warm set (a ``.cfb`` bundle) as a pip-installable wheel.

The wheel ``<name>-<version>-py3-none-any.whl`` holds one package, ``<name>`` with ``-``
and ``.`` made ``_``: the bundle (``bundle.cfb``), ``cuforge-bundle.json`` (the archs,
toolchain, cuforge version and key schema it serves, from the bundle's index) and an
empty ``__init__.py``. It registers the package in the entry point group
``cuforge.bundles``; cuforge serves it on the default cache's first miss
(:mod:`cuforge.core.bundle_wheels`). The wheel's METADATA says the same in its summary and
``Keywords``. No dependency is declared: ``pip install --no-deps`` and a pinned cuforge
are the user's (a mismatching wheel is skipped, with one line in ``cuforge doctor``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import zipfile

from cuforge.base.errors import CuforgeError
from cuforge.core.bundle_wheels import BUNDLE_FILE, GROUP, INFO_FILE

__all__ = ["build_wheel"]

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+!]*$")


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def check_name(name: str) -> str:
    """``name`` when a wheel can carry it as its distribution name; else ValueError."""
    if not _NAME.match(name):
        raise ValueError(
            f"name must be a distribution name (letters, digits, '-', '_', '.'), not {name!r}"
        )
    return name


def check_version(version: str) -> str:
    """``version`` when a wheel can carry it; else ValueError."""
    if not _VERSION.match(version):
        raise ValueError(f"version must be a version such as 1.0, not {version!r}")
    return version


def build_wheel(
    bundle: str | os.PathLike[str], *, name: str, version: str, out_dir: str | os.PathLike[str]
) -> str:
    """Write the wheel of ``bundle`` as distribution ``name`` ``version`` into
    ``out_dir``; returns its path. Raises ValueError for a name or version a wheel cannot
    carry, and :class:`~cuforge.store.bundle.BundleError` for a bundle that is not one."""
    from cuforge.store.bundle import BundleStore

    check_name(name)
    check_version(version)
    store = BundleStore(bundle)
    try:
        index = dict(store.info)
        entries = len(store)
    finally:
        store.close()
    with open(os.fspath(bundle), "rb") as f:
        data = f.read()
    info = {
        "name": name,
        "version": version,
        "cuforge_version": index.get("cuforge_version"),
        "key_schema": index.get("key_schema"),
        "toolchain": index.get("toolchain") or {},
        "archs": index.get("archs") or [],
        "entries": entries,
    }
    package = re.sub(r"[-_.]+", "_", name).lower()
    dist = f"{package}-{version}"
    archs = ", ".join(info["archs"]) or "any arch"
    nvrtc = info["toolchain"].get("nvrtc", "unknown")
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {name}\n"
        f"Version: {version}\n"
        f"Summary: cuforge warm set ({entries} entries) for {archs}; NVRTC {nvrtc}; "
        f"cuforge {info['cuforge_version']}\n"
        f"Keywords: cuforge-bundle,{','.join(info['archs'])}\n"
    )
    files = {
        f"{package}/__init__.py": b'"""A cuforge warm set (cuforge bundle wheel)."""\n',
        f"{package}/{BUNDLE_FILE}": data,
        f"{package}/{INFO_FILE}": (json.dumps(info, indent=1, sort_keys=True) + "\n").encode(),
        f"{dist}.dist-info/METADATA": metadata.encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: cuforge bundle wheel\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
        f"{dist}.dist-info/entry_points.txt": f"[{GROUP}]\n{name} = {package}\n".encode(),
    }
    record = "".join(f"{path},{_digest(body)},{len(body)}\n" for path, body in files.items())
    files[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    os.makedirs(os.fspath(out_dir), exist_ok=True)
    path = os.path.abspath(os.path.join(os.fspath(out_dir), f"{dist}-py3-none-any.whl"))
    tmp = path + ".tmp"
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for arc, body in files.items():
                zi = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))  # reproducible
                zi.external_attr = 0o644 << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(zi, body)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CuforgeError(f"cannot write the wheel {path}: {exc.strerror or exc}") from exc
    return path
