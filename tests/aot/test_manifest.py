"""Issue 13, section 1: manifest expansion, placeholders, and bad manifests that name the
file and the line."""

from __future__ import annotations

import pytest

from cuforge.aot.manifest import ManifestError, load_manifest, parse_manifest
from cuforge.base.errors import CuforgeError
from tests.aot.conftest import MANIFEST


def write(project, text: str, name: str = "cuforge.toml"):
    path = project / name
    path.write_text(text)
    return path


def test_the_issue_example_expands_to_8_variants(project):
    m = load_manifest(str(project))
    assert len(m.tasks) == 8
    assert m.archs == ["sm_80", "sm_90"]
    specs = {(t.spec["name_expressions"][0], t.spec["arch"]) for t in m.tasks}
    assert specs == {
        (f"blk<{b}, {t}>", a)
        for b in (128, 256)
        for t in ("float", "double")
        for a in ("sm_80", "sm_90")
    }
    for task in m.tasks:
        block = task.spec["name_expressions"][0].split("<")[1].split(",")[0]
        assert task.spec["defines"] == {"TILE": block}  # placeholders work in defines
        assert task.spec["include_dirs"] == ["include"]
        assert task.kind == "kernel"
        assert task.line == 4  # the source line of the [[kernel]]
        # the files that travel: the source and the header it includes, by content
        assert set(task.files) == {"red.cu", "include/tile.cuh"}
        assert all(len(sha) == 64 for sha in task.files.values())
    assert len({t.label for t in m.tasks}) == 8
    assert "red.cu  blk<128, float>  sm_80" in {t.label for t in m.tasks}


def test_placeholders_in_options_and_a_per_entry_arch(project):
    write(
        project,
        """
arch = "sm_80"
[[kernel]]
source = "red.cu"
arch = ["sm_90"]
include_dirs = ["include"]
options = ["-DEXTRA={N}", "-lineinfo"]
[kernel.grid]
N = [1, 2, 3]
""",
    )
    m = load_manifest(str(project))
    assert [t.spec["options"] for t in m.tasks] == [
        ["-DEXTRA=1", "-lineinfo"],
        ["-DEXTRA=2", "-lineinfo"],
        ["-DEXTRA=3", "-lineinfo"],
    ]
    assert {t.spec["arch"] for t in m.tasks} == {"sm_90"}
    assert [t.spec["name_expressions"] for t in m.tasks] == [[], [], []]


def test_several_name_expressions_give_one_variant_each(project):
    write(
        project,
        """
arch = ["sm_90"]
[[kernel]]
source = "red.cu"
include_dirs = ["include"]
name_expressions = ["blk<{B}, float>", "blk<{B}, int>"]
defines = { TILE = 1 }
[kernel.grid]
B = [32, 64]
""",
    )
    m = load_manifest(str(project))
    assert sorted(t.spec["name_expressions"][0] for t in m.tasks) == [
        "blk<32, float>",
        "blk<32, int>",
        "blk<64, float>",
        "blk<64, int>",
    ]
    assert all(t.spec["defines"] == {"TILE": "1"} for t in m.tasks)


def test_a_tool_cuforge_table_in_pyproject(project):
    (project / "cuforge.toml").unlink()
    body = MANIFEST.replace("[kernel.grid]", "[tool.cuforge.kernel.grid]").replace(
        "[[kernel]]", "[[tool.cuforge.kernel]]"
    )
    write(project, '[project]\nname = "x"\n\n[tool.cuforge]\n' + body, "pyproject.toml")
    m = load_manifest(str(project))
    assert m.path.endswith("pyproject.toml")
    assert len(m.tasks) == 8


def test_extensions_expand_over_their_grid(project):
    (project / "ext.cpp").write_text("int f() { return 1; }\n")
    write(
        project,
        """
arch = ["sm_80", "sm_90"]
[[extension]]
name = "ext_{TILE}"
sources = ["ext.cpp"]
extra_cflags = ["-DTILE={TILE}"]
[extension.grid]
TILE = [16, 32]
""",
    )
    m = load_manifest(str(project))
    assert [t.spec["name"] for t in m.tasks] == ["ext_16", "ext_32"]
    assert [t.spec["extra_cflags"] for t in m.tasks] == [["-DTILE=16"], ["-DTILE=32"]]
    assert all(t.kind == "extension" and t.spec["arch"] == ["sm_80", "sm_90"] for t in m.tasks)
    assert all(set(t.files) == {"ext.cpp"} for t in m.tasks)


# -- bad manifests: each error names the file and the line --------------------------------


BAD = [
    (
        "unknown top-level key",
        'arch = ["sm_90"]\ncolour = "red"\n[[kernel]]\nsource = "red.cu"\n',
        2,
        "unknown key 'colour'",
    ),
    (
        "unknown key in a kernel",
        '[[kernel]]\nsource = "red.cu"\narch = "sm_90"\nsorce = "x.cu"\n',
        4,
        "unknown key 'sorce'",
    ),
    (
        "empty grid",
        '[[kernel]]\nsource = "red.cu"\narch = "sm_90"\n[kernel.grid]\n',
        4,
        "[kernel.grid] is empty",
    ),
    (
        "grid variable with no values",
        '[[kernel]]\nsource = "red.cu"\narch = "sm_90"\n'
        'name_expressions = ["blk<{B}, float>"]\n[kernel.grid]\nB = []\n',
        6,
        "grid variable B is an empty array",
    ),
    (
        "missing source file",
        '[[kernel]]\narch = "sm_90"\nsource = "nope.cu"\n',
        3,
        "source 'nope.cu' does not exist",
    ),
    (
        "no source at all",
        'arch = "sm_90"\n\n[[kernel]]\ninclude_dirs = ["include"]\n',
        3,
        "has no source",
    ),
    (
        "unknown placeholder",
        '[[kernel]]\nsource = "red.cu"\narch = "sm_90"\n'
        'name_expressions = ["blk<{B}, {TYPE}>"]\n[kernel.grid]\nB = [1]\n',
        4,
        "unknown placeholder {TYPE}",
    ),
    (
        "wrong type",
        '[[kernel]]\nsource = "red.cu"\narch = "sm_90"\ninclude_dirs = "include"\n',
        4,
        "include_dirs must be an array of strings",
    ),
    (
        "a bad arch",
        '[[kernel]]\nsource = "red.cu"\narch = ["sm_90", "banana"]\n',
        3,
        "banana",
    ),
    (
        "a grid variable nothing uses",
        '[[kernel]]\nsource = "red.cu"\narch = "sm_90"\n[kernel.grid]\nUNUSED = [1, 2]\n',
        5,
        "grid variable UNUSED is used by no placeholder",
    ),
    (
        "second kernel's unknown key",
        '[[kernel]]\nsource = "red.cu"\narch = "sm_90"\n\n'
        '[[kernel]]\nsource = "red.cu"\narch = "sm_80"\nbogus = 1\n',
        8,
        "unknown key 'bogus'",
    ),
    (
        "not TOML",
        '[[kernel]]\nsource = "red.cu"\narch = [\n',
        3,
        "not valid TOML",
    ),
    ("nothing to build", 'arch = "sm_90"\n', 0, "lists nothing to build"),
]


@pytest.mark.parametrize(("what", "text", "line", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_manifests_name_the_file_and_line(project, what, text, line, words):
    path = write(project, text)
    with pytest.raises(ManifestError) as info:
        load_manifest(str(path))
    err = info.value
    assert isinstance(err, CuforgeError) and isinstance(err, ValueError)
    assert words in str(err), str(err)
    assert err.path == str(path)
    assert err.line == line, str(err)
    assert str(err).startswith(f"{path}:{line}: " if line else f"{path}: ")


def test_an_unknown_key_in_pyproject_names_its_line(project):
    (project / "cuforge.toml").unlink()
    text = (
        '[project]\nname = "x"\n\n[tool.cuforge]\narch = "sm_90"\n\n'
        '[[tool.cuforge.kernel]]\nsource = "red.cu"\nwat = 1\n'
    )
    path = write(project, text, "pyproject.toml")
    with pytest.raises(ManifestError) as info:
        load_manifest(str(project))
    assert info.value.line == 9 and "unknown key 'wat'" in str(info.value)
    assert str(info.value).startswith(f"{path}:9: ")


def test_no_manifest_says_how_to_write_one(tmp_path):
    with pytest.raises(ManifestError, match="no cuforge.toml here"):
        load_manifest(str(tmp_path))


def test_parse_without_hashing_files(project):
    m = parse_manifest(MANIFEST, str(project / "cuforge.toml"), with_files=False)
    assert len(m.tasks) == 8 and all(t.files == {} for t in m.tasks)


# -- issue 20, item 14: a grid too big to expand, an extension name that is a path ----------


def test_a_grid_past_the_variant_cap_is_refused_before_expanding(project, monkeypatch):
    """10^6 variants used 1.1 GB and printed nothing for 100 s: the size (grid points x
    archs x name expressions) is checked first, and the error names the entry, its line
    and the count. The grid here is 100 x 100 x 100 x 2 archs = 2,000,000 variants."""
    import tracemalloc

    axis = ", ".join(str(i) for i in range(100))
    write(
        project,
        f"""\
arch = ["sm_80", "sm_90"]

[[kernel]]
source = "red.cu"
include_dirs = ["include"]
name_expressions = ["blk<{{A}}, float>"]
defines = {{ B = "{{B}}", C = "{{C}}" }}
[kernel.grid]
A = [{axis}]
B = [{axis}]
C = [{axis}]
""",
    )
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as err:
            load_manifest(str(project))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    assert "cuforge.toml:4:" in msg and "[[kernel]] #1" in msg, msg
    assert "2,000,000 variants" in msg and "100 A x 100 B x 100 C" in msg, msg
    assert "at most 100,000" in msg, msg
    assert peak < 20 << 20, peak  # nothing was expanded


def test_the_variant_cap_counts_every_entry(project, monkeypatch):
    from cuforge.aot import manifest

    monkeypatch.setattr(manifest, "MAX_VARIANTS", 10)
    entry = """
[[kernel]]
source = "red.cu"
name_expressions = ["blk<{B}, float>"]
[kernel.grid]
B = [1, 2, 3, 4, 5, 6]
"""
    write(project, 'arch = ["sm_90"]\n' + entry)
    assert len(load_manifest(str(project)).tasks) == 6
    write(project, 'arch = ["sm_90"]\n' + entry + entry.replace("float", "double"))
    with pytest.raises(ManifestError, match=r"cuforge.toml:10: \[\[kernel\]\] #2 expands to 6 "):
        load_manifest(str(project))


@pytest.mark.parametrize("name", ["../../x", "ext/sub", "1ext", "", "class", "ext_{T}"])
def test_an_extension_name_must_be_a_python_identifier(project, name):
    """``name = "../../x"`` built outside the cache dir: the name (after its placeholders)
    must be an identifier; the error names the file and line."""
    (project / "ext.cpp").write_text("int f() { return 0; }\n")
    write(
        project,
        f"""\
[[extension]]
name = "{name}"
sources = ["ext.cpp"]
arch = ["sm_90"]
[extension.grid]
T = ["a-b"]
"""
        if "{T}" in name
        else f"""\
[[extension]]
name = "{name}"
sources = ["ext.cpp"]
arch = ["sm_90"]
""",
    )
    with pytest.raises(
        ManifestError, match=r"cuforge.toml:2: .*(not a Python identifier|needs name)"
    ):
        load_manifest(str(project))
