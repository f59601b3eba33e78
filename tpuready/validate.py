"""One check for what the calculators are given, and one error family for what they refuse.

The calculators (`tpuready.calc.alignment`, `tpuready.calc.buckets`, `tpuready.calc.roofline`,
`tpuready.calc.ici`, `tpuready.calc.plan`) check every argument here, so one bad value gets one kind
of error wherever it goes in: an `InputError` (a `ValueError`) whose message names the argument, the
value and the fix. Each calculator raises its own subclass (`AlignmentError`, `BucketError`,
`RooflineError`, `IciModelError`, `PlanError`), so `except tpuready.validate.InputError` catches
them all.

Whole numbers are Python ints or NumPy integers (`np.int64(4)` from an array works as `4`);
booleans are refused although Python counts them as ints (`True` is never meant as a mesh size
or a layer count), and so are floats, even `4.0`: a size of `4.5` is a bug upstream, and
rounding it here would hide it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

__all__ = [
    "InputError",
    "number",
    "one_of",
    "whole_number",
]


class InputError(ValueError):
    """A calculator was given a value it cannot use; the message names the argument, the value
    and the fix."""


def _describe(value: object) -> str:
    """`value!r` with its type where the repr alone hides it ('4' the string, np.int64(4))."""
    return f"{value!r} ({type(value).__name__})"


def whole_number(
    name: str,
    value: object,
    *,
    fix: str,
    minimum: int = 1,
    error: type[InputError] = InputError,
) -> int:
    """`value` as an int if it is a whole number >= `minimum` (NumPy integers too; bools and
    floats refused), else `error` naming `name`, the value and `fix`."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise error(f"{name} must be a whole number, got {_describe(value)}: {fix}")
    if value < minimum:
        raise error(f"{name} must be at least {minimum}, got {int(value)}: {fix}")
    return int(value)


def number(
    name: str,
    value: object,
    *,
    fix: str,
    allow_zero: bool = False,
    error: type[InputError] = InputError,
) -> float:
    """`value` as a float if it is a finite real number above zero (or at least zero with
    `allow_zero`; NumPy numbers too, bools refused), else `error` naming `name`, the value and
    `fix`."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a number, got {_describe(value)}: {fix}")
    try:
        converted = float(value)
    except OverflowError:  # an int beyond float's range
        converted = math.inf
    lowest_ok = converted >= 0 if allow_zero else converted > 0
    if not math.isfinite(converted) or not lowest_ok:
        bound = "at least zero" if allow_zero else "above zero"
        raise error(f"{name} must be a finite number {bound}, got {value!r}: {fix}")
    return converted


def one_of(
    name: str,
    value: object,
    choices: Sequence[str],
    *,
    error: type[InputError] = InputError,
) -> str:
    """`value` if it is one of `choices`, else `error` naming `name`, the value and the choices."""
    if not isinstance(value, str) or value not in choices:
        raise error(f"{name} must be one of {list(choices)}, got {_describe(value)}")
    return value
