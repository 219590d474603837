"""cuforge.keys.fingerprint against the holes of the attack pass (issue 20, items 1, 5 and 10):
a checkout keyed by an unrelated install, a module edited while the process runs, and the
state and values the fingerprint missed or refused. Real files and real processes."""

from __future__ import annotations

import base64
import collections
import decimal
import fractions
import functools
import hashlib
import importlib
import inspect
import logging
import os
import sys
import textwrap
import types
import typing
import uuid
import weakref
from typing import Any

import numpy as np
import pytest

from cuforge.keys.fingerprint import MAX_DEPTH, UnstableKeyError, fingerprint, module_fingerprint
from tests.conftest import child_env, run_python


def fp(obj):
    return fingerprint(obj, what="op")


def _child(code: str, *args: str, seed: str = "0") -> Any:
    """Run ``code`` in a fresh interpreter with ``args`` as ``sys.argv[1:]``; the JSON it
    prints last."""
    argv = f"import sys; sys.argv[1:] = {list(args)!r}\n"
    return run_python(argv + textwrap.dedent(code), env=child_env(PYTHONHASHSEED=seed))


# -- item 1: a module is keyed by a distribution only when that distribution installed it --

_KEY_MYPKG = """
import json, sys
sys.path[:0] = [p for p in sys.argv[1:] if p]
import mypkg
from cuforge.keys.fingerprint import fingerprint, module_fingerprint
print(json.dumps({"module": module_fingerprint(mypkg), "op": fingerprint(mypkg.f, what="op"),
                  "file": mypkg.__file__}))
"""

_SOURCE = "SCALE = {}\n\n\ndef f(x):\n    return x * SCALE\n"


def _fake_dist(site, listed: dict[str, bytes]) -> None:
    """A wheel-installed ``mypkg 0.1.0`` in ``site`` whose RECORD lists ``listed``."""
    info = site / "mypkg-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1.0\n")
    (info / "top_level.txt").write_text("mypkg\n")
    lines = []
    for rel, data in listed.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{rel},sha256={digest},{len(data)}")
    lines += ["mypkg-0.1.0.dist-info/METADATA,,", "mypkg-0.1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(lines) + "\n")


def test_a_checkout_beside_an_older_install_is_keyed_by_its_source(tmp_path):
    """``pip install .`` once, then edit and run from the checkout: the checkout's module is
    not the one the wheel's RECORD lists, so an edit changes the key (it was "mypkg==0.1.0")."""
    site, checkout = tmp_path / "site-packages", tmp_path / "checkout"
    installed = _SOURCE.format(1).encode()
    (site / "mypkg").mkdir(parents=True)
    (site / "mypkg" / "__init__.py").write_bytes(installed)
    _fake_dist(site, {"mypkg/__init__.py": installed})
    (checkout / "mypkg").mkdir(parents=True)
    (checkout / "mypkg" / "__init__.py").write_text(_SOURCE.format(1))
    first = _child(_KEY_MYPKG, str(checkout), str(site))
    assert first["file"].startswith(str(checkout))
    assert "sha256:" in first["module"] and "mypkg==" not in first["module"]
    (checkout / "mypkg" / "__init__.py").write_text(_SOURCE.format(2))
    edited = _child(_KEY_MYPKG, str(checkout), str(site))
    assert edited["module"] != first["module"]
    assert edited["op"] != first["op"]


def test_a_module_its_wheel_lists_is_keyed_by_the_version(tmp_path):
    site = tmp_path / "site-packages"
    data = _SOURCE.format(1).encode()
    (site / "mypkg").mkdir(parents=True)
    (site / "mypkg" / "__init__.py").write_bytes(data)
    _fake_dist(site, {"mypkg/__init__.py": data})
    assert _child(_KEY_MYPKG, str(site))["module"] == "mypkg mypkg==0.1.0"
    # edited in place to another size: no longer what the wheel installed
    (site / "mypkg" / "__init__.py").write_text(_SOURCE.format(12345))
    assert "sha256:" in _child(_KEY_MYPKG, str(site))["module"]


def test_a_leftover_egg_info_in_the_checkout_does_not_key_it(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "mypkg").mkdir(parents=True)
    (checkout / "mypkg" / "__init__.py").write_text(_SOURCE.format(1))
    egg = checkout / "mypkg.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1.0\n")
    (egg / "top_level.txt").write_text("mypkg\n")
    (egg / "SOURCES.txt").write_text("mypkg/__init__.py\n")
    first = _child(_KEY_MYPKG, str(checkout))
    assert "mypkg==" not in first["module"]
    (checkout / "mypkg" / "__init__.py").write_text(_SOURCE.format(2))
    assert _child(_KEY_MYPKG, str(checkout))["op"] != first["op"]


# -- item 5: a local module edited while the process runs ---------------------------------


def test_a_module_edited_after_import_is_refused_in_that_process(tmp_path, monkeypatch):
    name = f"edited_{uuid.uuid4().hex}"
    src = tmp_path / f"{name}.py"
    src.write_text(_SOURCE.format(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)

    def op(a):
        return module.f(a)  # the module is keyed (by its source), then its attribute read

    try:
        before = module_fingerprint(module)
        assert fp(op) == fp(op)
        src.write_text(_SOURCE.format(22))  # the process still runs SCALE = 1
        with pytest.raises(UnstableKeyError) as info:
            fp(op)
        assert "changed since" in info.value.reason and name in str(info.value)
        with pytest.raises(UnstableKeyError):  # still refused: nothing was re-keyed
            fp(op)
        # a fresh process loads the new text and keys it
        fresh = _child(
            f"import json, sys; sys.path.insert(0, sys.argv[1]); import {name}\n"
            "from cuforge.keys.fingerprint import module_fingerprint\n"
            f"print(json.dumps(module_fingerprint({name})))\n",
            str(tmp_path),
        )
        assert fresh != before
        # so does this process once the module is reloaded
        importlib.reload(module)
        assert module_fingerprint(module) == fresh
        fp(op)
    finally:
        sys.modules.pop(name, None)


def test_a_touched_module_or_an_unimported_submodule_edit_is_not_refused(tmp_path, monkeypatch):
    name = f"touched_{uuid.uuid4().hex}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(_SOURCE.format(1))
    (pkg / "later.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    try:
        before = fp(module)
        (pkg / "__init__.py").write_text(_SOURCE.format(1))  # same text, new mtime
        assert fp(module) == before
        (pkg / "later.py").write_text("X = 2\n")  # not imported: an import reads the new text
        assert fp(module) != before
    finally:
        sys.modules.pop(name, None)


# -- item 10: state trace-time Python reads ------------------------------------------------


def _plain(x):
    return x


def test_function_attributes_and_annotations_are_keyed():
    def make(**attrs):
        def f(x):
            return x

        f.__dict__.update(attrs)
        return f

    assert fp(make(tile=1)) == fp(make(tile=1)) != fp(make(tile=2))
    assert fp(make()) != fp(make(tile=1))
    a, b = make(), make()
    a.__annotations__ = {"x": int}
    b.__annotations__ = {"x": float}
    assert fp(a) != fp(b)
    # typing constructs are keyed too (written the old way on purpose)
    b.__annotations__ = {"x": typing.Optional[list[int]]}  # noqa: UP045
    c = make()
    c.__annotations__ = {"x": typing.Optional[list[float]]}  # noqa: UP045
    assert fp(b) != fp(c)
    c.__annotations__ = {"x": list[int] | None, "T": typing.TypeVar("T", bound=int)}
    b.__annotations__ = {"x": list[int] | None, "T": typing.TypeVar("T", bound=float)}
    assert fp(b) != fp(c)


def test_masked_arrays_and_ndarray_subclasses_are_keyed_by_what_they_hold():
    data = np.arange(4.0)
    assert fp(np.ma.masked_array(data, mask=[0, 1, 0, 0])) != fp(
        np.ma.masked_array(data, mask=[0, 0, 1, 0])
    )
    assert fp(np.ma.masked_array(data, mask=[0, 1, 0, 0])) == fp(
        np.ma.masked_array(data.copy(), mask=[0, 1, 0, 0])
    )
    assert fp(np.ma.masked_array(data)) != fp(data)

    class Tagged(np.ndarray):
        pass

    assert fp(data.view(Tagged)) != fp(data)


def test_metaclass_attributes_are_keyed():
    def make(scale):
        meta = type("Meta", (type,), {"SCALE": scale})
        return meta("Kernel", (), {})

    assert fp(make(1)) == fp(make(1)) != fp(make(2))


def test_a_cycle_through_a_set_is_keyed_and_deep_nesting_is_refused_with_the_path():
    box: set = set()

    def reads_box():
        return box

    box.add(reads_box)  # reads_box -> box -> reads_box: a RecursionError before
    assert fp(reads_box) == fp(reads_box)

    deep: list = []
    for _ in range(3000):
        deep = [deep]
    with pytest.raises(UnstableKeyError) as info:
        fp(deep)
    assert "nested" in info.value.reason and info.value.path.startswith("op[0][0][0]")
    assert str(MAX_DEPTH) in info.value.reason

    # under MAX_DEPTH but past Python's recursion limit: still an UnstableKeyError
    shallow: list = []
    for _ in range(MAX_DEPTH - 10):
        shallow = [shallow]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)
    try:
        with pytest.raises(UnstableKeyError) as info:
            fp(shallow)
    finally:
        sys.setrecursionlimit(limit)
    assert "recursion limit" in info.value.reason and info.value.path.startswith("op[0]")


Pt = collections.namedtuple("Pt", "x y")


class TypedPt(typing.NamedTuple):
    x: int
    y: float = 0.0

    def norm(self):
        return self.x + self.y


class Name(str):
    pass


class Count(int):
    pass


@functools.lru_cache(maxsize=8)
def cached_op(x):
    return x + 1


def test_common_standard_library_values_are_keyed_by_value():
    same = [
        (Pt(1, 2), Pt(1, 2)),
        (TypedPt(1, 2.0), TypedPt(1, 2.0)),
        (types.SimpleNamespace(a=1, b="x"), types.SimpleNamespace(b="x", a=1)),
        (collections.OrderedDict(a=1), collections.OrderedDict(a=1)),
        (collections.defaultdict(list, a=[1]), collections.defaultdict(list, a=[1])),
        (fractions.Fraction(1, 3), fractions.Fraction(2, 6)),
        (decimal.Decimal("1.5"), decimal.Decimal("1.5")),
        (Name("tile"), Name("tile")),
        (Count(3), Count(3)),
        (cached_op, cached_op),
    ]
    for a, b in same:
        assert fp(a) == fp(b), a
    differ = [
        (Pt(1, 2), Pt(1, 3)),
        (Pt(1, 2), (1, 2)),
        (TypedPt(1, 2.0), Pt(1, 2.0)),
        (types.SimpleNamespace(a=1), types.SimpleNamespace(a=2)),
        (collections.OrderedDict(a=1, b=2), collections.OrderedDict(b=2, a=1)),
        (collections.OrderedDict(a=1), {"a": 1}),
        (collections.defaultdict(list, a=[1]), collections.defaultdict(tuple, a=[1])),
        (fractions.Fraction(1, 3), fractions.Fraction(1, 4)),
        (decimal.Decimal("1.0"), decimal.Decimal("1.00")),
        (Name("tile"), "tile"),
        (Name("tile"), Name("tiles")),
        (Count(3), 3),
        (Count(3), Count(4)),
        (cached_op, cached_op.__wrapped__),
        (cached_op, functools.lru_cache(maxsize=9)(cached_op.__wrapped__)),
    ]
    for a, b in differ:
        assert fp(a) != fp(b), (a, b)


def test_the_new_values_key_the_same_in_every_process():
    code = """
    import collections, decimal, fractions, json, sys, types, typing
    from cuforge.keys.fingerprint import fingerprint
    class P(typing.NamedTuple):
        x: int
        y: typing.Optional[list[int]] = None
    value = (P(1), collections.namedtuple("Q", "a b")(1, 2), types.SimpleNamespace(z=1, a=2),
             collections.OrderedDict(b=1, a=2), collections.defaultdict(int, {"k": 1}),
             fractions.Fraction(3, 7), decimal.Decimal("2.50"))
    print(json.dumps(fingerprint(value, what="v")))
    """
    assert _child(code, seed="1") == _child(code, seed="2")


def test_loggers_weakrefs_and_plain_objects_stay_refused():
    log = logging.getLogger("cuforge.test.attack")

    def logs(x):
        log.info("x")
        return x

    with pytest.raises(UnstableKeyError) as info:
        fp(logs)
    assert "logging.Logger" in info.value.reason and "log" in info.value.path

    class Thing:
        pass

    thing = Thing()
    with pytest.raises(UnstableKeyError) as info:
        fp(weakref.ref(thing))
    assert "weak reference" in info.value.reason
    with pytest.raises(UnstableKeyError):
        fp(weakref.proxy(thing))
    with pytest.raises(UnstableKeyError):
        fp(thing)


def test_a_module_attribute_changed_at_run_time_changes_the_key(tmp_path, monkeypatch):
    """``cfg.TILE = 256`` before a compile: the module is keyed by its source, so its
    attributes' current values (plain data the code reads) are keyed too."""
    import importlib
    import sys

    (tmp_path / "tilecfg_mod.py").write_text("TILE = 64\nNAME = 'a'\n")
    (tmp_path / "tileop_mod.py").write_text(
        "import tilecfg_mod\n\ndef op(x):\n    return x * tilecfg_mod.TILE\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = importlib.import_module("tilecfg_mod")
    op = importlib.import_module("tileop_mod").op
    try:
        before = fingerprint(op, what="op")
        cfg.TILE = 256
        assert fingerprint(op, what="op") != before
        cfg.TILE = 64
        assert fingerprint(op, what="op") == before
        cfg.NAME = "b"  # an attribute the code does not read: the same key
        assert fingerprint(op, what="op") == before
    finally:
        sys.modules.pop("tilecfg_mod", None)
        sys.modules.pop("tileop_mod", None)


def test_a_same_size_edit_of_an_installed_module_with_its_mtime_put_back_changes_its_key(
    tmp_path,
):
    """Issue 35 item 1: ``SCALE = 1`` edited to ``SCALE = 3`` in site-packages keeps the
    file's size, and ``touch -r`` puts its mtime back: the module is no longer the one its
    wheel's RECORD lists (its contents do not hash to RECORD's sha256), so it is keyed by
    its contents -- in a fresh process whose toolchain memo remembered the installed answer."""
    site = tmp_path / "site-packages"
    data = _SOURCE.format(1).encode()
    module = site / "mypkg" / "__init__.py"
    module.parent.mkdir(parents=True)
    module.write_bytes(data)
    _fake_dist(site, {"mypkg/__init__.py": data})
    first = _child(_KEY_MYPKG, str(site))
    assert first["module"] == "mypkg mypkg==0.1.0"
    assert _child(_KEY_MYPKG, str(site)) == first  # from the memo: the same answer
    before = module.stat()
    edited = _SOURCE.format(3).encode()
    assert len(edited) == len(data)
    module.write_bytes(edited)  # in place: the same inode
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))  # touch -r
    after = module.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )
    second = _child(_KEY_MYPKG, str(site))
    assert "mypkg==" not in second["module"] and "sha256:" in second["module"]
    assert second["op"] != first["op"]
    # put back as installed: the wheel's version again
    module.write_bytes(data)
    assert _child(_KEY_MYPKG, str(site))["op"] == first["op"]
