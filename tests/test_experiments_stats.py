"""Tests of posenc.lab.experiments.stats: the t distribution against tables and SymPy, the intervals'
formulas and coverage, Welch's and the paired difference, and the rules the protocol states."""

import math
import random

import pytest

from posenc.lab.experiments.stats import (
    bootstrap_interval,
    describe,
    difference,
    eval_half_width,
    needs_more_seeds,
    seed_interval,
    t_cdf,
    t_quantile,
    wilson_interval,
)

# two-sided 95 % critical values of Student's t (any statistics table)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 19: 2.093, 30: 2.042, 120: 1.980}


@pytest.mark.parametrize("df,value", sorted(T975.items()))
def test_t_quantile_matches_the_table(df, value):
    assert t_quantile(0.975, df) == pytest.approx(value, abs=5e-4)
    assert t_quantile(0.025, df) == pytest.approx(-value, abs=5e-4)


def test_t_cdf_matches_sympy_at_fractional_degrees_of_freedom():
    from sympy import Rational, N
    from sympy.stats import StudentT, cdf

    for df, t in [(Rational(7, 2), 1.3), (Rational(5, 1), -2.1), (Rational(23, 10), 0.4)]:
        exact = float(N(cdf(StudentT("T", df))(t), 15))
        assert t_cdf(t, float(df)) == pytest.approx(exact, abs=1e-10)


def test_t_cdf_tends_to_the_normal():
    normal = 0.5 * (1 + math.erf(1.5 / math.sqrt(2)))
    assert t_cdf(1.5, 1e6) == pytest.approx(normal, abs=1e-6)
    assert t_cdf(0.0, 3) == 0.5 and t_cdf(math.inf, 3) == 1.0


def test_seed_interval_is_mean_plus_minus_t_times_standard_error():
    values = [2.10, 2.14, 2.12]
    iv = seed_interval(values)
    sd = math.sqrt(sum((v - 2.12) ** 2 for v in values) / 2)
    assert iv.mean == pytest.approx(2.12)
    assert iv.half_width == pytest.approx(4.303 * sd / math.sqrt(3), rel=1e-3)
    assert iv.n == 3 and iv.method == "t, 3 seeds"


def test_seed_interval_covers_the_true_mean_95_percent_of_the_time():
    rng = random.Random(1)
    hits = 0
    for _ in range(4000):
        iv = seed_interval([rng.gauss(1.0, 0.3) for _ in range(3)])
        hits += iv.low <= 1.0 <= iv.high
    assert 0.94 < hits / 4000 < 0.96


def test_bootstrap_interval_is_reproducible_and_near_the_normal_interval():
    rng = random.Random(2)
    items = [rng.gauss(2.0, 0.5) for _ in range(400)]
    a, b = bootstrap_interval(items, seed=3), bootstrap_interval(items, seed=3)
    assert a == b
    se = math.sqrt(sum((v - a.mean) ** 2 for v in items) / 399 / 400)
    assert a.half_width == pytest.approx(1.96 * se, rel=0.1)
    assert a.low < a.mean < a.high and a.method == "bootstrap, 400 items"


def test_eval_half_width_averages_the_seeds_bootstrap_half_widths():
    rng = random.Random(4)
    seeds = [[rng.gauss(0, 1) for _ in range(200)], [rng.gauss(0, 2) for _ in range(200)]]
    expected = (bootstrap_interval(seeds[0], seed=0).half_width + bootstrap_interval(seeds[1], seed=1).half_width) / 2
    assert eval_half_width(seeds) == pytest.approx(expected)


def test_eval_half_width_of_differences_of_zero_one_items_is_a_bootstrap():
    # a passkey difference, method a minus method b per example: here only 0s and 1s, still not a proportion
    diffs = [[1.0] * 10 + [0.0] * 90]
    assert eval_half_width(diffs) == pytest.approx(wilson_interval(10, 100).half_width)     # read as a proportion
    assert eval_half_width(diffs, proportions=False) == pytest.approx(bootstrap_interval(diffs[0], seed=0).half_width)
    assert eval_half_width(diffs, proportions=False) != pytest.approx(eval_half_width(diffs))
    with pytest.raises(ValueError, match="proportions=True needs items of 0 or 1, got \\[-1.0\\]"):
        eval_half_width([[1.0, 0.0, -1.0]], proportions=True)


def test_welch_difference_by_hand():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0, 10.0]
    d = difference(a, b)
    va, vb = (5 / 3) / 4, 10.0 / 5  # sample variances over n
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 4)
    assert d.mean == pytest.approx(2.5 - 6.0)
    assert d.df == pytest.approx(df)
    assert (d.high - d.low) / 2 == pytest.approx(t_quantile(0.975, df) * math.sqrt(va + vb))
    assert d.p == pytest.approx(2 * (1 - t_cdf(3.5 / math.sqrt(va + vb), df)))
    assert d.test == "Welch t" and not d.separated  # p = 0.069: a mean difference of 3.5 on 4 and 5 values


def test_paired_difference_uses_the_per_seed_differences():
    a, b = [2.00, 2.10, 2.30], [2.05, 2.16, 2.34]  # b is higher for every seed, by about 0.05
    paired, welch = difference(a, b, paired=True), difference(a, b)
    assert paired.test == "paired t" and paired.df == 2
    assert paired.separated and not welch.separated  # pairing removes the seed-to-seed spread


def test_not_separated_when_the_interval_contains_zero():
    d = difference([1.0, 1.2, 0.9], [1.1, 0.95, 1.05])
    assert d.low < 0 < d.high and not d.separated and d.p > 0.05


def test_needs_more_seeds_below_twice_the_spread():
    assert needs_more_seeds([1.0, 1.1, 1.2], [1.05, 1.15, 1.25])
    assert not needs_more_seeds([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert not needs_more_seeds([1.0, 1.1, 1.2, 1.0, 1.1], [1.05, 1.15, 1.25, 1.05, 1.15])  # already 5 seeds


def test_describe_formats_the_interval_and_the_evaluation_uncertainty():
    text = describe([2.10, 2.14, 2.12], [[2.0, 2.2] * 10] * 3)
    assert text.startswith("2.120 [2.070, 2.170] ± ")


@pytest.mark.parametrize("call,match", [
    (lambda: seed_interval([1.0]), "at least 2"),
    (lambda: seed_interval([1.0, float("nan")]), "finite"),
    (lambda: seed_interval(["a", "b"]), "sequence of numbers"),
    (lambda: seed_interval([1.0, 2.0], level=95), "level"),
    (lambda: bootstrap_interval([1.0, 2.0], resamples=10), "resamples"),
    (lambda: difference([1.0, 2.0], [1.0, 2.0, 3.0], paired=True), "equal lengths"),
    (lambda: t_quantile(1.5, 3), "p must be"),
    (lambda: t_cdf(1.0, 0), "df must be"),
    (lambda: eval_half_width([]), "at least one seed"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_separated_uses_the_two_look_level():
    from posenc.lab.experiments.stats import SEPARATION_LEVEL, separated

    a, b = [1.0, 1.1, 1.2], [1.32, 1.42, 1.52]
    assert separated(a, b) == difference(a, b, SEPARATION_LEVEL).separated
    assert SEPARATION_LEVEL > 0.95


def test_looking_twice_at_the_separation_level_keeps_the_false_positive_rate_under_5_percent():
    from posenc.lab.experiments.stats import separated

    rng = random.Random(3)
    fp, trials = 0, 4000
    for _ in range(trials):
        a, b = [rng.gauss(0, 1) for _ in range(5)], [rng.gauss(0, 1) for _ in range(5)]
        fp += separated(a[:3], b[:3]) or (needs_more_seeds(a[:3], b[:3]) and separated(a, b))
    assert fp / trials < 0.055


def test_wilson_interval_by_hand_and_at_the_ends():
    from posenc.lab.experiments.stats import wilson_interval

    iv = wilson_interval(512, 512)
    assert iv.mean == 1.0 and iv.high == pytest.approx(1.0) and 0.99 < iv.low < 1.0  # open at 1
    z, n, p = 1.959964, 100, 0.3
    centre = (p + z * z / 200) / (1 + z * z / 100)
    half = z * math.sqrt(p * 0.7 / 100 + z * z / 40000) / (1 + z * z / 100)
    iv = wilson_interval(30, 100)
    assert iv.low == pytest.approx(centre - half, rel=1e-5) and iv.high == pytest.approx(centre + half, rel=1e-5)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)
    assert eval_half_width([[1.0] * 50, [1.0] * 49 + [0.0]]) > 0  # 0/1 items never give a zero width


def test_two_looks_follows_the_protocols_rule():
    from posenc.lab.experiments.stats import separated, two_looks

    apart = [1.0, 1.1, 0.9], [3.0, 3.1, 2.9]
    assert two_looks(*apart) == {"separated": True, "seeds": 3, "pending": False}      # the first look decides
    # seeds 3 and 4 do not change a first look that separates, nor one clear of the five-seed margin
    assert two_looks(apart[0] + [9.0, 9.0], apart[1] + [0.0, 0.0])["seeds"] == 3
    wide = [1.0, 2.0, 3.0], [1.5, 2.5, 3.5]                       # margin 0.5 < 2 sd: five seeds are asked for
    assert needs_more_seeds(*wide) and not separated(*wide)
    assert two_looks(*wide) == {"separated": False, "seeds": 3, "pending": True}       # only three seeds so far
    five_apart = two_looks(wide[0] + [1.0, 1.1], wide[1] + [3.0, 3.2])
    assert five_apart["seeds"] == 5 and five_apart["separated"] == separated(wide[0] + [1.0, 1.1], wide[1] + [3.0, 3.2])
    assert two_looks(wide[0] + [2.0, 2.0], wide[1] + [2.5, 2.5]) == {"separated": False, "seeds": 5, "pending": False}
    # a study planned with five seeds has one look, at five
    planned = two_looks(wide[0] + [1.0, 1.1], wide[1] + [3.0, 3.2], first=5)
    assert planned["seeds"] == 5 and planned == five_apart
    assert two_looks(wide[0] + [2.0, 2.0], wide[1] + [2.5, 2.5], first=5)["pending"] is False
    with pytest.raises(ValueError, match="first and at_least must be ints >= 2"):
        two_looks(*apart, first=1)


def test_protocol_decision_takes_the_first_seeds_of_each_arm():
    from posenc.lab.notebook import protocol_decision, protocol_separated

    a = {"values": [1.0, 2.0, 3.0, 1.0, 1.1], "seeds": [0, 1, 2, 3, 4]}
    b = {"values": [1.5, 2.5, 3.5], "seeds": [0, 1, 2]}
    assert protocol_decision(a, b) == {"separated": False, "seeds": 3, "pending": True}
    assert not protocol_separated(a, b)
    with pytest.raises(ValueError, match=r"b must hold seeds 0, 1, 2, ... in order, got seeds \[0, 2, 1\]"):
        protocol_decision(a, {"values": [1.0, 2.0, 3.0], "seeds": [0, 2, 1]})


def test_needs_more_seeds_paired_reads_the_spread_of_the_differences():
    from posenc.lab.experiments.stats import separated, two_looks

    # arms that move in opposite directions from seed to seed: each arm's spread is small, the
    # differences' spread large, so the paired test is undecided where the unpaired rule saw no need
    a, b = [1.0, 1.3, 1.1], [0.2, 0.0, 0.7]
    assert not needs_more_seeds(a, b) and needs_more_seeds(a, b, paired=True)
    assert not separated(a, b, paired=True)
    assert two_looks(a, b, paired=True) == {"separated": False, "seeds": 3, "pending": True}
    assert two_looks(a + [1.2, 1.0], b + [0.1, 0.3], paired=True)["seeds"] == 5
    # arms that move together: the differences are steady, no more seeds asked for
    assert not needs_more_seeds([1.0, 2.0, 3.0], [1.5, 2.5, 3.6], paired=True)
    assert needs_more_seeds([1.0, 2.0, 3.0], [1.5, 2.5, 3.6])
    with pytest.raises(ValueError, match="equal length"):
        needs_more_seeds([1.0, 2.0, 3.0], [1.0, 2.0], paired=True)


def test_paired_looks_keep_the_false_positive_rate_under_5_percent():
    from posenc.lab.experiments.stats import PAIRED_SEPARATION_LEVEL, SEPARATION_LEVEL, difference, separated, two_looks

    a, b = [1.0, 1.2, 1.1], [0.9, 1.05, 1.02]
    assert separated(a, b, paired=True) == difference(a, b, PAIRED_SEPARATION_LEVEL, paired=True).separated
    assert PAIRED_SEPARATION_LEVEL > SEPARATION_LEVEL
    rng = random.Random(7)
    fp, trials = 0, 4000
    for _ in range(trials):                              # identical methods, scores paired by seed
        a, b = [rng.gauss(0, 1) for _ in range(5)], [rng.gauss(0, 1) for _ in range(5)]
        fp += two_looks(a, b, paired=True)["separated"]
    assert fp / trials < 0.05
