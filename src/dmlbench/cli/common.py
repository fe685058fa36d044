"""Argument handling shared by the commands that take ``CONFIG [OVERRIDES]...``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer.core

# The CLI library's usage-error class (click's ``UsageError``, vendored by newer typer releases):
# reached through the public ``typer.BadParameter`` so that both layouts work.
USAGE_ERROR: type[Exception] = typer.BadParameter.__bases__[0]

CONFIG_HELP = "YAML config file."
OVERRIDES_HELP = "Dotted overrides KEY=VALUE, e.g. training.epochs=3 loss.name=contrastive."


def config_and_overrides(config_path: Path | None, overrides: list[str] | None) -> tuple[Path | None, list[str]]:
    """``CONFIG`` is optional: a first argument that looks like ``key=value`` and is no file is an override."""
    overrides = list(overrides or [])
    if config_path is not None and "=" in config_path.name and not config_path.exists():
        return None, [str(config_path), *overrides]
    return config_path, overrides


class Command(typer.core.TyperCommand):
    """A command whose parse errors all print its usage hint: the parser raises some (an option
    missing its value) without the command's context, and those would print the error line alone."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except USAGE_ERROR as error:
            if getattr(error, "ctx", None) is None:
                error.ctx = ctx  # type: ignore[attr-defined]
                error.cmd = ctx.command  # type: ignore[attr-defined]
            raise
