"""Settings and arch parsing."""

from __future__ import annotations

import pytest

from cuforge.config import ArchError, normalize_arch, parse_arch_list, parse_size, settings


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
