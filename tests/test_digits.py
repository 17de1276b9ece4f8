"""Tests of posenc.lab.digits: digit vectors, the three strategies, the toy learner."""

import math

import pytest
import torch

from posenc.lab.digits import (STRATEGIES, TASKS, DigitPairNet, converted_base, digit_accuracy, digit_pairs, represent,
                           to_digits, train_digit_learner)


@pytest.mark.parametrize("base", [2, 10, 13])
def test_digits_of_integers_rebuild_them(base):
    x = torch.arange(0, base ** 3)
    d = to_digits(x, base, 3)
    assert d.shape == (base ** 3, 3) and d.dtype == torch.float64
    assert bool(((d >= 0) & (d < base) & (d == d.floor())).all())
    powers = torch.tensor([base ** j for j in range(3)], dtype=torch.float64)
    assert torch.equal(d @ powers, x.double())
    assert to_digits(torch.tensor(1234), 10, 4).tolist() == [4, 3, 2, 1]


def test_fractional_numbers_keep_their_fraction_in_the_lowest_digit():
    d = to_digits(torch.tensor([7.5, 12.25]), 10, 2)
    assert d.tolist() == [[7.5, 0.0], [2.25, 1.0]]


def test_converted_base_is_the_smallest_that_covers():
    for base, k, s in [(10, 3, 4), (10, 3, 2), (10, 3, 8), (2, 5, 3), (16, 2, 1.5)]:
        b = converted_base(base, k, s)
        assert b ** k >= s * base ** k and (b - 1) ** k < s * base ** k
    assert converted_base(10, 3, 1) == 10 and converted_base(10, 3, 8) == 20


def test_what_each_strategy_preserves():
    n = torch.arange(0, 4000)
    direct, interp, conv = (represent(n, s, 4) * 10 for s in STRATEGIES)  # digits, training scale undone
    # direct: integers, but the fourth digit takes values the learner saw only as 0
    assert direct[:1000, 3].max() == 0 and direct[:, 3].max() == 3
    # interpolation: no new digit, every digit in the trained range, neighbours 1/4 apart in the lowest
    assert interp[:, 3].max() == 0 and interp.max() < 10
    steps = interp[1:, 0] - interp[:-1, 0]  # 0.25, except where the lowest digit wraps from 9.75 to 0
    assert bool(((steps - 0.25).abs() < 1e-12).sum() == len(steps) - 3999 // 40)
    # base conversion: integers, no new digit, digits above 9 (base 16)
    assert bool((conv == conv.floor()).all()) and conv[:, 3].max() == 0 and conv.max() == 15


def test_pairs_are_balanced_and_labelled():
    gen = torch.Generator().manual_seed(0)
    a, b, y = digit_pairs("near", 4000, 100, 200, gen)
    assert bool(((a >= 100) & (a < 200) & (b >= 100) & (b < 200) & (a != b)).all())
    assert torch.equal(y, ((a - b).abs() <= 3).float()) and 0.45 < float(y.mean()) < 0.55
    assert int((a - b).abs().max()) <= 12
    a, b, y = digit_pairs("order", 4000, 0, 1000, gen)
    assert torch.equal(y, (a < b).float()) and 0.45 < float(y.mean()) < 0.55


def test_a_learner_learns_its_range_and_is_deterministic():
    net = train_digit_learner("order", 0, steps=300)
    assert isinstance(net, DigitPairNet) and not net.training
    assert digit_accuracy(net, "order", "direct", 1, low=0, high=1000) > 0.95
    again = train_digit_learner("order", 0, steps=300)
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), again.parameters()))


@pytest.mark.parametrize("call, match", [
    (lambda: to_digits(torch.tensor([-1.0]), 10, 2), "non-negative"),
    (lambda: to_digits([1.0], 10, 2), "real tensor"),
    (lambda: to_digits(torch.tensor([1.0]), 1, 2), "base"),
    (lambda: to_digits(torch.tensor([1.0]), 10, 0), "places"),
    (lambda: converted_base(10, 3, 0.5), "factor"),
    (lambda: represent(torch.tensor([1]), "stretch", 2), "strategy"),
    (lambda: represent(torch.tensor([1]), "direct", 0), "factor"),
    (lambda: digit_pairs("sum", 10, 0, 100, torch.Generator()), "task"),
    (lambda: digit_pairs("near", 0, 0, 100, torch.Generator()), "count"),
    (lambda: digit_pairs("near", 10, 0, 20, torch.Generator()), "low, high"),
    (lambda: train_digit_learner("near", 0, numbers=999), "numbers"),
    (lambda: train_digit_learner("near", 0, numbers=10000, places=4), "numbers"),
])
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
