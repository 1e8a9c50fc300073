"""The XFetch early-recomputation decision (Vattani, Chierichetti, Lowenstein, VLDB 2015).

A cache entry that expires makes every reader miss at once: the stampede. XFetch lets each
reader, before expiry, volunteer to refresh with a probability that grows as expiry nears and
with the cost of the refill: a reader refreshes when

    now - delta * beta * ln(rand()) >= expiry

where ``delta`` is how long the last fill took, ``beta`` (default 1) scales the eagerness and
``rand()`` is uniform on [0, 1). Since ``-ln(rand())`` is exponentially distributed with mean 1,
a reader ``gap = expiry - now`` seconds before expiry refreshes with probability
``exp(-gap / (delta * beta))`` (``refresh_probability``). The paper shows this choice is
optimal: one refresh happens, close to expiry, regardless of how many readers there are.

Everything here is pure (the clock and the random source are arguments), so it is exact to
test; the cache supplies Redis's idea of the time left and ``random.random``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

__all__ = ["refresh_probability", "should_refresh", "validate_beta"]

# rand() may return exactly 0.0 (random.random's range is [0, 1)); ln(0) is -inf, so 0 is read
# as the smallest positive normal float: -ln of it is about 708, a finite, absurdly eager draw.
_SMALLEST_DRAW = sys.float_info.min


def validate_beta(beta: float) -> float:
    """``beta`` as a float: a finite number >= 0 (0 turns early recomputation off)."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)):
        raise TypeError(f"beta must be a number, not {type(beta).__name__}")
    value = float(beta)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"beta must be a finite number >= 0, not {beta!r}")
    return value


def should_refresh(
    now: float, expiry: float, delta: float, beta: float, rand: Callable[[], float]
) -> bool:
    """True when this reader should recompute the value now, before (or at) its expiry.

    ``now`` and ``expiry`` are on one clock (seconds), ``delta`` is the last fill's duration.
    At or after expiry the answer is always True; with ``beta == 0`` or ``delta <= 0`` it is
    never True before expiry. ``rand`` is only called when the answer depends on it.
    """
    if now >= expiry:
        return True
    if not (beta > 0 and delta > 0):  # also False for NaN: no evidence, no early refresh
        return False
    draw = rand()
    if not 0.0 <= draw <= 1.0:
        raise ValueError(f"rand() must return a number in [0, 1], not {draw!r}")
    # Only an exact 0.0 is replaced: a subnormal draw has a finite log (about -744) of its own.
    return now - delta * beta * math.log(draw if draw > 0.0 else _SMALLEST_DRAW) >= expiry


def refresh_probability(gap: float, delta: float, beta: float) -> float:
    """The probability that ``should_refresh`` says True ``gap`` seconds before expiry."""
    if gap <= 0:
        return 1.0
    if not (beta > 0 and delta > 0):
        return 0.0
    return math.exp(-gap / (delta * beta))
