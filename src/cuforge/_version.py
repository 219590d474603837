"""cuforge's version: the one place it is written (pyproject.toml reads it from here;
CHANGELOG.md has a section per release)."""

__version__ = "0.1.0"
