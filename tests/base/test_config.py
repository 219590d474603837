"""Settings and arch parsing."""

from __future__ import annotations

import pytest

from cuforge.base.arch import ArchError, normalize_arch, parse_arch_list
from cuforge.base.config import ConfigError, parse_size, settings
from cuforge.base.errors import CuforgeError


@pytest.mark.parametrize(
    "text, arch",
    [
        ("sm_90", "sm_90"),
        ("9.0", "sm_90"),
        ("90", "sm_90"),
        (90, "sm_90"),
        ("sm_90a", "sm_90a"),
        ("12.0", "sm_120"),
        ("compute_80", "compute_80"),
        ("SM_86", "sm_86"),
    ],
)
def test_normalize_arch_accepts_common_spellings(text, arch):
    assert normalize_arch(text) == arch


@pytest.mark.parametrize("bad", ["hopper", "9", "sm_", "", "9.0.1", "sm_20"])
def test_bad_arch_says_how_to_write_it(bad):
    with pytest.raises(ArchError, match="sm_90"):
        normalize_arch(bad)


def test_arch_list():
    assert parse_arch_list("8.0;9.0+PTX") == ("sm_80", "sm_90")
    assert parse_arch_list("8.0 8.0 9.0") == ("sm_80", "sm_90")


def test_sizes():
    assert parse_size("5GiB") == 5 * 1024**3
    assert parse_size("512m") == 512 * 1024**2
    assert parse_size("1000") == 1000
    with pytest.raises(ValueError, match="unit"):
        parse_size("5 parsecs")


def test_settings_are_live(monkeypatch, tmp_path):
    monkeypatch.setenv("CUFORGE_CACHE_MAX_BYTES", "1M")
    first = settings()
    assert first.cache_max_bytes == 1024**2
    assert settings() is first  # unchanged environment: the same object
    monkeypatch.setenv("CUFORGE_CACHE_MAX_BYTES", "2M")
    assert settings().cache_max_bytes == 2 * 1024**2
    monkeypatch.setenv("CUFORGE_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="CUFORGE_CACHE_MAX_BYTES"):
        settings()


# -- out-of-range values: an error naming the variable and the range, or a documented meaning


@pytest.mark.parametrize("name", ["CUFORGE_CACHE_MAX_BYTES", "CUFORGE_MEMORY_MAX_BYTES"])
@pytest.mark.parametrize("value", ["1e400", "-5", "-1M", "nan", "inf", "9223372036854775808"])
def test_out_of_range_sizes_name_the_variable_and_the_range(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        settings()
    message = str(info.value)
    assert name in message and repr(value) in message
    assert "0 to" in message or "cannot read size" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, CuforgeError)


def test_sizes_at_the_edges_of_the_range(monkeypatch):
    monkeypatch.setenv("CUFORGE_CACHE_MAX_BYTES", "0")
    assert settings().cache_max_bytes == 0
    monkeypatch.setenv("CUFORGE_CACHE_MAX_BYTES", str(2**63 - 1))
    assert settings().cache_max_bytes == 2**63 - 1
    monkeypatch.setenv("CUFORGE_CACHE_MAX_BYTES", "1.5G")
    assert settings().cache_max_bytes == 3 * 1024**3 // 2
    with pytest.raises(ConfigError, match="out of range"):
        parse_size("-5")


@pytest.mark.parametrize("value", ["nan", "-5", "-inf", "soon"])
def test_bad_lock_timeouts_name_the_variable_and_the_range(monkeypatch, value):
    monkeypatch.setenv("CUFORGE_LOCK_TIMEOUT", value)
    with pytest.raises(ConfigError) as info:
        settings()
    message = str(info.value)
    assert "CUFORGE_LOCK_TIMEOUT" in message and "0 or more" in message and "inf" in message


def test_an_infinite_lock_timeout_waits_forever(monkeypatch):
    import _thread

    monkeypatch.setenv("CUFORGE_LOCK_TIMEOUT", "inf")
    timeout = settings().lock_timeout
    assert timeout == _thread.TIMEOUT_MAX  # the longest wait a lock accepts
    lock = _thread.allocate_lock()
    assert lock.acquire(True, timeout)  # accepted as a timeout (inf itself overflows)
    monkeypatch.setenv("CUFORGE_LOCK_TIMEOUT", "0")
    assert settings().lock_timeout == 0.0
    monkeypatch.setenv("CUFORGE_LOCK_TIMEOUT", "2.5")
    assert settings().lock_timeout == 2.5


@pytest.mark.parametrize(
    "name",
    [
        "CUFORGE_DISABLE_CACHE",
        "CUFORGE_DISABLE_FILE_CACHE",
        "CUFORGE_VERBOSE",
        "CUFORGE_EXPLAIN",
        "CUFORGE_TELEMETRY",
        "CUFORGE_TORCH_SPLIT",
        "CUFORGE_DEBUG",
        "CUFORGE_OFFLINE",
    ],
)
def test_switches_accept_yes_and_no_words_and_reject_the_rest(monkeypatch, name):
    attr = {
        "CUFORGE_DISABLE_CACHE": "disable_cache",
        "CUFORGE_DISABLE_FILE_CACHE": "disable_file_cache",
        "CUFORGE_VERBOSE": "verbose",
        "CUFORGE_EXPLAIN": "explain",
        "CUFORGE_TELEMETRY": "telemetry",
        "CUFORGE_TORCH_SPLIT": "torch_split",
        "CUFORGE_DEBUG": "debug",
        "CUFORGE_OFFLINE": "offline",
    }[name]
    for word in ("1", "true", "Yes", "ON"):
        monkeypatch.setenv(name, word)
        assert getattr(settings(), attr) is True
    for word in ("0", "false", "No", "off"):
        monkeypatch.setenv(name, word)
        assert getattr(settings(), attr) is False
    monkeypatch.setenv(name, "2")
    with pytest.raises(ConfigError, match=f"{name}='2' is not a switch"):
        settings()


def test_switch_defaults(monkeypatch):
    for name in ("CUFORGE_TELEMETRY", "CUFORGE_TORCH_SPLIT", "CUFORGE_VERBOSE"):
        monkeypatch.setenv(name, "")
    current = settings()
    assert current.telemetry is True and current.torch_split is None
    assert current.verbose is False


def test_offline_is_off_by_default(monkeypatch):
    monkeypatch.delenv("CUFORGE_OFFLINE", raising=False)
    assert settings().offline is False
    monkeypatch.setenv("CUFORGE_OFFLINE", "")
    assert settings().offline is False


@pytest.mark.parametrize(
    "name, good, bad",
    [
        ("CUFORGE_FAST_LAUNCH", {"python": "python", "c": "", "PYTHON": "python"}, "fast"),
    ],
)
def test_choices_reject_unknown_values_and_name_the_accepted_ones(monkeypatch, name, good, bad):
    attr = name.removeprefix("CUFORGE_").lower()
    for value, expected in good.items():
        monkeypatch.setenv(name, value)
        assert getattr(settings(), attr) == expected
    monkeypatch.setenv(name, bad)
    with pytest.raises(ConfigError) as info:
        settings()
    assert name in str(info.value)
    assert all(word in str(info.value) for word in good if word.islower())


def test_torch_launcher_keeps_a_program_path_and_reads_off_words(monkeypatch):
    monkeypatch.setenv("CUFORGE_TORCH_LAUNCHER", "/opt/Tools/myLauncher")
    assert settings().torch_launcher == "/opt/Tools/myLauncher"
    monkeypatch.setenv("CUFORGE_TORCH_LAUNCHER", "AUTO")
    assert settings().torch_launcher == "auto"
    monkeypatch.setenv("CUFORGE_TORCH_LAUNCHER", "off")
    assert settings().torch_launcher == ""


def test_the_docstring_table_lists_every_cuforge_variable():
    """Every CUFORGE_* name the package mentions is a watched setting with a table row."""
    import pathlib
    import re

    import cuforge.base.config as config

    doc = config.__doc__ or ""
    src = pathlib.Path(config.__file__).parent.parent  # the whole package, not base/
    mentioned = {
        name
        for path in src.rglob("*.py")
        for name in re.findall(r"CUFORGE_[A-Z0-9_]+", path.read_text(encoding="utf-8"))
    }
    assert len(mentioned) >= 17
    for name in sorted(mentioned):
        assert name in config._WATCHED, name
        assert f"\n{name} " in doc, name


REMOTE_SECONDS = [
    "CUFORGE_REMOTE_CONNECT_TIMEOUT",
    "CUFORGE_REMOTE_TIMEOUT",
    "CUFORGE_REMOTE_TTL",
    "CUFORGE_LEASE_TTL",
]


@pytest.mark.parametrize("name", [*REMOTE_SECONDS, "CUFORGE_LOCK_TIMEOUT"])
@pytest.mark.parametrize("value", ["1e400", "9" * 400])
def test_overflowing_timeouts_are_errors_not_forever(monkeypatch, name, value):
    """Issue 35 item 18: `1e400` read as infinity ("forever") for every timeout, while the
    README (now docs/configuration.md) says it is rejected."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        settings()
    assert name in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize("name", REMOTE_SECONDS)
@pytest.mark.parametrize("value", ["inf", "Infinity", "+inf"])
def test_a_remote_timeout_or_ttl_is_never_infinite(monkeypatch, name, value):
    """A remote "never costs more than its timeout": `inf` is no timeout, refused by name."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}=.*not a finite number of seconds"):
        settings()
    monkeypatch.setenv(name, "2.5")
    assert 2.5 in (
        settings().remote_connect_timeout,
        settings().remote_timeout,
        settings().remote_ttl,
        settings().lease_ttl,
    )
