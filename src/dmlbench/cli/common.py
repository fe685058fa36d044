"""Argument handling shared by the commands that take ``CONFIG [OVERRIDES]...``."""

from __future__ import annotations

from pathlib import Path


def config_and_overrides(config_path: Path | None, overrides: list[str] | None) -> tuple[Path | None, list[str]]:
    """``CONFIG`` is optional: a first argument that looks like ``key=value`` and is no file is an override."""
    overrides = list(overrides or [])
    if config_path is not None and "=" in config_path.name and not config_path.exists():
        return None, [str(config_path), *overrides]
    return config_path, overrides
