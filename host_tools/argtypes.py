"""argparse types for numbers with a rule: a bad value is one line naming it and the rule."""

from __future__ import annotations

import argparse
import math


def seconds(text: str) -> float:
    """A timeout or interval: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} seconds: must be a finite number above 0")
    return value


def count(text: str) -> int:
    """A number of things to start: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value
