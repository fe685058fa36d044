"""Small argument checks that raise ``UserInputError`` naming the offending parameter."""

from __future__ import annotations

import math
import re

from dmlbench.errors import UserInputError


def check_positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UserInputError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def check_non_negative(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise UserInputError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def check_probability(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise UserInputError(f"{name} must lie in [0, 1], got {value!r}")
    return value


def check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserInputError(f"{name} must be an integer > 0, got {value!r}")
    return value


def check_seed(seed: int) -> int:
    """A seed is a non-negative integer (``bool`` is refused although it is an ``int``)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserInputError(f"seed must be an integer >= 0, got {seed!r}")
    return seed


def check_flag(name: str, value: bool) -> bool:
    if not isinstance(value, bool):
        raise UserInputError(f"{name} must be true or false, got {value!r}")
    return value


DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def duration_seconds(text: str) -> float:
    """Seconds of a duration written ``30m``, ``2h``, ``1h30m`` or ``90s``; ``ValueError`` for anything else."""
    match = DURATION.fullmatch(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"must be a duration such as 30m, 2h, 1h30m or 90s, got {text!r}")
    hours, minutes, seconds = (float(part or 0) for part in match.groups())
    if 3600 * hours + 60 * minutes + seconds <= 0:
        raise ValueError(f"must be longer than 0 s, got {text!r}")
    return 3600 * hours + 60 * minutes + seconds
