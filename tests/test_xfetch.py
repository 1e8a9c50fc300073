"""Unit tests of redmutex._xfetch: the XFetch early-recomputation decision."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redmutex._xfetch import refresh_probability, should_refresh, validate_beta

EXPIRY = 1_000.0
TRIALS = 20_000


def _never_called() -> float:
    raise AssertionError("rand() must not be called when the answer does not depend on it")


def _constant(value: float) -> Callable[[], float]:
    return lambda: value


def _refresh_rate(gap: float, delta: float, beta: float, rng: random.Random) -> float:
    """The fraction of TRIALS readers `gap` seconds before expiry that refresh."""
    now = EXPIRY - gap
    hits = sum(should_refresh(now, EXPIRY, delta, beta, rng.random) for _ in range(TRIALS))
    return hits / TRIALS


# --------------------------------------------------------------------------------------------
# The rule itself
# --------------------------------------------------------------------------------------------


def test_the_formula_on_known_draws() -> None:
    # now - delta*beta*ln(r) >= expiry  <=>  gap <= delta*beta*(-ln r)
    draw = math.exp(-2.0)  # -ln(draw) == 2
    assert should_refresh(EXPIRY - 1.9, EXPIRY, 1.0, 1.0, _constant(draw))
    assert not should_refresh(EXPIRY - 2.1, EXPIRY, 1.0, 1.0, _constant(draw))
    assert should_refresh(EXPIRY - 3.9, EXPIRY, 2.0, 1.0, _constant(draw))  # slower fill
    assert should_refresh(EXPIRY - 3.9, EXPIRY, 1.0, 2.0, _constant(draw))  # larger beta
    assert not should_refresh(EXPIRY - 4.1, EXPIRY, 1.0, 2.0, _constant(draw))


@pytest.mark.parametrize("now", [EXPIRY, EXPIRY + 1e-9, EXPIRY + 1, math.inf])
@pytest.mark.parametrize(("delta", "beta"), [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (0.0, 0.0)])
def test_always_refresh_at_and_after_expiry(now: float, delta: float, beta: float) -> None:
    assert should_refresh(now, EXPIRY, delta, beta, _never_called)


@pytest.mark.parametrize("draw", [0.0, 5e-324, 1e-300, 0.5, 1.0])
@pytest.mark.parametrize("gap", [1e-9, 0.001, 1.0, 1e6])
def test_beta_zero_never_refreshes_early(draw: float, gap: float) -> None:
    assert not should_refresh(EXPIRY - gap, EXPIRY, 5.0, 0.0, _never_called)
    assert not should_refresh(EXPIRY - gap, EXPIRY, 5.0, 0, _constant(draw))


def test_a_fill_that_took_no_time_never_refreshes_early() -> None:
    assert not should_refresh(EXPIRY - 1e-9, EXPIRY, 0.0, 1.0, _never_called)
    assert not should_refresh(EXPIRY - 1e-9, EXPIRY, math.nan, 1.0, _never_called)


def test_a_draw_of_zero_is_guarded() -> None:
    """random.random() can return 0.0; ln(0) must not blow up, it is a very eager draw."""
    assert should_refresh(EXPIRY - 700.0, EXPIRY, 1.0, 1.0, _constant(0.0))
    assert not should_refresh(EXPIRY - 710.0, EXPIRY, 1.0, 1.0, _constant(0.0))
    assert should_refresh(EXPIRY - 1.0, EXPIRY, 1.0, 1.0, _constant(0))


def test_a_subnormal_draw_keeps_its_own_log() -> None:
    """Only 0.0 is replaced: 5e-324 has ln of about -744.4, more eager than the 0.0 guard's -708
    (hypothesis found the two mixed up: delta * beta = 1.55e6 makes the gap 5.6e7 s)."""
    assert should_refresh(-801559783.0, 352366971.0, 303.0, 5116.0, _constant(5e-324))
    assert not should_refresh(EXPIRY - 720.0, EXPIRY, 1.0, 1.0, _constant(0.0))
    assert should_refresh(EXPIRY - 720.0, EXPIRY, 1.0, 1.0, _constant(5e-324))


def test_a_draw_of_one_means_no_early_refresh() -> None:
    assert not should_refresh(EXPIRY - 1e-9, EXPIRY, 100.0, 100.0, _constant(1.0))


@pytest.mark.parametrize("draw", [-0.1, 1.5, math.nan, math.inf])
def test_rand_out_of_range_is_a_value_error(draw: float) -> None:
    with pytest.raises(ValueError, match=r"^rand\(\) must return"):
        should_refresh(EXPIRY - 1.0, EXPIRY, 1.0, 1.0, _constant(draw))


_times = st.floats(min_value=-1e9, max_value=1e9)
_durations = st.floats(min_value=0.0, max_value=1e4)
_draws = st.floats(min_value=0.0, max_value=1.0, exclude_min=True)


@given(_times, _times, _durations, _durations, _draws)
def test_matches_the_paper_formula(
    now: float, expiry: float, delta: float, beta: float, draw: float
) -> None:
    expected = now >= expiry or now - delta * beta * math.log(draw) >= expiry
    assert should_refresh(now, expiry, delta, beta, _constant(draw)) == expected


@given(_times, _times, st.floats(min_value=0, max_value=1e6), _durations, _durations, _draws)
def test_monotonic_in_time_for_one_draw(
    now: float, expiry: float, later: float, delta: float, beta: float, draw: float
) -> None:
    """A reader that would refresh now would also refresh at any later moment."""
    if should_refresh(now, expiry, delta, beta, _constant(draw)):
        assert should_refresh(now + later, expiry, delta, beta, _constant(draw))


# --------------------------------------------------------------------------------------------
# Statistics with a seeded random.Random
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("delta", "beta"), [(0.2, 1.0), (2.0, 1.0), (0.5, 3.0)])
def test_refresh_rate_matches_exp_of_minus_gap_over_delta_beta(delta: float, beta: float) -> None:
    rng = random.Random(20150901)
    for ratio in (0.05, 0.25, 0.5, 1.0, 2.0, 4.0):
        gap = ratio * delta * beta
        expected = refresh_probability(gap, delta, beta)
        assert expected == pytest.approx(math.exp(-ratio))
        sigma = math.sqrt(expected * (1 - expected) / TRIALS)
        assert abs(_refresh_rate(gap, delta, beta, rng) - expected) < 5 * sigma + 1e-3


def test_refresh_becomes_more_likely_as_expiry_approaches() -> None:
    rng = random.Random(7)
    gaps = [8.0, 4.0, 2.0, 1.0, 0.5, 0.1, 0.0]  # seconds before expiry, approaching it
    rates = [_refresh_rate(gap, 1.0, 1.0, rng) for gap in gaps]
    assert rates == sorted(rates)
    assert len(set(rates)) == len(rates)  # strictly increasing
    assert rates[0] < 0.01
    assert rates[-1] == 1.0


def test_larger_beta_and_slower_fills_refresh_earlier() -> None:
    rng = random.Random(11)
    base = _refresh_rate(1.0, 1.0, 1.0, rng)
    assert _refresh_rate(1.0, 1.0, 2.0, rng) > base + 0.1
    assert _refresh_rate(1.0, 2.0, 1.0, rng) > base + 0.1
    assert _refresh_rate(1.0, 1.0, 0.5, rng) < base - 0.1


def test_many_readers_usually_refresh_shortly_before_expiry() -> None:
    """The stampede case: readers every millisecond; the first refresh is early but not much."""
    rng = random.Random(3)
    delta, beta = 0.1, 1.0
    firsts = []
    for _ in range(200):
        now = EXPIRY - 2.0
        while not should_refresh(now, EXPIRY, delta, beta, rng.random):
            now += 0.001
        firsts.append(EXPIRY - now)
    assert all(0 < early < 2.0 for early in firsts)  # always before expiry with 1000 reads/s
    assert sorted(firsts)[len(firsts) // 2] < 1.0  # typically within ten fill durations


def test_refresh_probability_edges() -> None:
    assert refresh_probability(0.0, 1.0, 1.0) == 1.0
    assert refresh_probability(-1.0, 0.0, 0.0) == 1.0
    assert refresh_probability(1.0, 1.0, 0.0) == 0.0
    assert refresh_probability(1.0, 0.0, 1.0) == 0.0
    assert refresh_probability(1.0, 1.0, 1.0) == pytest.approx(math.exp(-1))


# --------------------------------------------------------------------------------------------
# validate_beta
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0, 0.0, 1, 1.0, 0.5, 1e6])
def test_valid_betas(beta: float) -> None:
    assert validate_beta(beta) == float(beta)
    assert type(validate_beta(beta)) is float


@pytest.mark.parametrize("beta", [-1, -1e-9, -0.0 - 1e-300, math.nan, math.inf, -math.inf])
def test_invalid_beta_values(beta: float) -> None:
    with pytest.raises(ValueError, match="^beta must be"):
        validate_beta(beta)


@pytest.mark.parametrize("beta", ["1", None, True, [1], 1j])
def test_invalid_beta_types(beta: Any) -> None:
    with pytest.raises(TypeError, match="^beta must be"):
        validate_beta(beta)
