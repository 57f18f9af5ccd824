"""The package version, in one place: ``pyproject.toml`` reads it (setuptools' dynamic version),
the package root exports it, and provenance and the release record record it without importing
the package root."""

__version__ = "0.1.0"
