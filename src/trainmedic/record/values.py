"""Checked and rounded JSON values of the run record's codecs.

Decoders take what ``json.loads`` returned from a file a user may have
edited: each reader here raises ``TypeError`` on a value of the wrong type
instead of letting it through. Encoders round times and percentages to the
resolution the record keeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Times keep microseconds: finer than any step or sample period we record.
TIME_DIGITS = 6
# Percentages and rates to a resolution far below their measurement noise.
PCT_DIGITS = 1


def rounded(value: float | None, digits: int) -> float | None:
    if value is None or isinstance(value, int) or not math.isfinite(value):
        return value
    rounded = round(value, digits)
    # ``1.0`` and ``1`` decode to the same float; the shorter form saves bytes.
    return int(rounded) if rounded.is_integer() and abs(rounded) < 2**53 else rounded


def opt_float(raw: Any) -> float | None:
    return None if raw is None else float(raw)


def opt_int(raw: Any) -> int | None:
    return None if raw is None else int_value(raw)


def int_value(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError(f"expected an integer, got {raw!r}")
    return raw


def opt_bool(raw: Any) -> bool | None:
    if raw is None:
        return None
    if not isinstance(raw, bool):
        raise TypeError(f"expected true/false, got {raw!r}")
    return raw


def str_value(raw: Any) -> str:
    if not isinstance(raw, str):
        raise TypeError(f"expected a string, got {raw!r}")
    return raw


def mapping(raw: Any) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"expected an object, got {raw!r}")
    return raw
