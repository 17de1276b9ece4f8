"""The statistics every comparison in the book uses: intervals over seeds, the uncertainty of the
evaluation sample, and the one test behind the word "separated".

Two sources of variation are reported apart, because they answer different questions:

* **Seeds** (training variation: initialisation and data order). A method's score is the mean over
  its seeds with a 95 % Student-t interval (:func:`seed_interval`): where would the mean of many
  more training runs fall?
* **The evaluation sample** (which windows or examples were scored). For one trained model, a 95 %
  percentile bootstrap over the scored items (:func:`bootstrap_interval`): how much would the score
  move on other text of the same kind? Averaged over a method's seeds (:func:`eval_half_width`).

**Separated** means one thing everywhere (:func:`separated`): the Welch interval of the difference
of two methods' seed means at level :data:`SEPARATION_LEVEL` (96.5 %) excludes zero. A pair may be
looked at twice: at three seeds and, where the margin is under twice the larger seed standard
deviation (:func:`needs_more_seeds`; paired, twice the standard deviation of the per-seed
differences), again at five. Looking twice at 95 % would call identical
methods separated about 7 % of the time; at 96.5 % per look the two looks together stay under 5 %
(4.4 % for normally distributed scores, simulated in the protocol chapter). Paired by seed
(``paired=True``) where two runs share a seed's initialisation and data order, as a method tuned
and untuned do; the paired test looks at :data:`PAIRED_SEPARATION_LEVEL` (97 %), where its two
looks stay under 5 % too. "Not separated" says the data cannot tell the methods apart at this number of
seeds; it never says they are equal.

No SciPy: the t distribution comes from the regularized incomplete beta function
(:func:`t_cdf`, :func:`t_quantile`), checked against tabulated quantiles in the tests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

#: The confidence level of every interval the book reports.
LEVEL = 0.95

#: The level of the Welch interval behind "separated"; two looks (3, then 5 seeds) at this level each
#: call identical methods separated less than 5 % of the time.
SEPARATION_LEVEL = 0.965

#: The level of the paired interval behind "separated" (``paired=True``). The paired test has fewer
#: degrees of freedom and its rule for a second look reads the differences, so two looks at
#: :data:`SEPARATION_LEVEL` call identical methods separated 5.4 % of the time; at this level, 4.5 %
#: (normally distributed scores, simulated in the tests).
PAIRED_SEPARATION_LEVEL = 0.97


@dataclass(frozen=True)
class Interval:
    """A mean and a two-sided interval around it."""

    mean: float  #: the point estimate
    low: float  #: lower end of the interval
    high: float  #: upper end
    n: int  #: values (seeds or items) it rests on
    method: str  #: how the interval was made, e.g. "t, 3 seeds" or "bootstrap, 256 windows"

    @property
    def half_width(self) -> float:
        """Half the width of the interval (the ``±`` of ``mean ± half_width`` for a symmetric one)."""
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        return f"{self.mean:.4g} [{self.low:.4g}, {self.high:.4g}]"


@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)`` with its interval and the test behind it."""

    mean: float  #: difference of the means
    low: float  #: lower end of the 95 % interval
    high: float  #: upper end
    p: float  #: two-sided p-value of "no difference"
    df: float  #: degrees of freedom of the t statistic (Welch's, or n - 1 paired)
    test: str  #: "Welch t" or "paired t"

    @property
    def separated(self) -> bool:
        """Whether the interval excludes zero (the book's "separated")."""
        return self.low > 0 or self.high < 0


def _check_values(values: Sequence[float], name: str, at_least: int) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of numbers, got {values!r}") from None
    if len(out) < at_least:
        raise ValueError(f"{name} needs at least {at_least} values, got {len(out)}")
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


def _check_level(level: float) -> None:
    if not (isinstance(level, float) and 0 < level < 1):
        raise ValueError(f"level must be a float in (0, 1), got {level!r}")


# ----------------------------------------------------------------- the t distribution


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function ``I_x(a, b)``."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom (``df`` may be fractional, as Welch's is).

    Raises:
        ValueError: if ``df <= 0``.
    """
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_pdf(t: float, df: float) -> float:
    """The density of Student's t with ``df`` degrees of freedom at ``t``."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom.

    Newton's method on :func:`t_cdf` from the bracket that bisection keeps, so that every step
    stays inside it (a bisection step replaces a Newton step that would leave it).

    Raises:
        ValueError: if ``p`` is not in (0, 1) or ``df <= 0``.
    """
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    t = (lo + hi) / 2
    for _ in range(100):
        f = t_cdf(t, df) - p
        if f < 0:
            lo = t
        else:
            hi = t
        step = f / max(t_pdf(t, df), 1e-300)
        nxt = t - step
        t_new = nxt if lo < nxt < hi else (lo + hi) / 2
        if abs(t_new - t) < 1e-13 * max(1.0, abs(t)):
            return t_new
        t = t_new
    return t


# ----------------------------------------------------------------- intervals


def seed_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean over seeds with its Student-t interval: ``mean ± t_{(1+level)/2, n-1} · s / √n``.

    Args:
        values: one score per seed (at least 2).
        level: confidence level (0.95).

    Raises:
        ValueError: fewer than 2 values, non-finite values, a level outside (0, 1).
    """
    v = _check_values(values, "values", 2)
    _check_level(level)
    n = len(v)
    mean = math.fsum(v) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / (n - 1))
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, f"t, {n} seeds")


def bootstrap_interval(items: Sequence[float], level: float = LEVEL, *, resamples: int = 2000,
                       seed: int = 0) -> Interval:
    """Mean over evaluation items (windows, examples) with a percentile bootstrap interval.

    The items are resampled with replacement ``resamples`` times (a seeded generator, so the
    interval is reproducible); the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of the resampled means.

    Args:
        items: one score per scored item of one trained model (e.g. the loss of each window, or 0/1
            per passkey example); at least 2.
        level: confidence level.
        resamples: bootstrap resamples.
        seed: seed of the resampling.

    Raises:
        ValueError: fewer than 2 items, non-finite items, a bad level or resample count.
    """
    v = _check_values(items, "items", 2)
    _check_level(level)
    if not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples must be an int >= 100, got {resamples!r}")
    n = len(v)
    rng = random.Random(seed)
    means = sorted(math.fsum(rng.choices(v, k=n)) / n for _ in range(resamples))
    lo_i = int(math.floor((1 - level) / 2 * (resamples - 1)))
    hi_i = int(math.ceil((1 + level) / 2 * (resamples - 1)))
    return Interval(math.fsum(v) / n, means[lo_i], means[hi_i], n, f"bootstrap, {n} items")


def eval_half_width(per_seed_items: Sequence[Sequence[float]], level: float = LEVEL, *, resamples: int = 2000,
                    proportions: Optional[bool] = None) -> float:
    """The evaluation-sample uncertainty of a method: the mean over its seeds of each seed's
    half-width, a bootstrap over that seed's scored items (:func:`bootstrap_interval`), or, for 0/1
    items, Wilson's interval (:func:`wilson_interval`), which stays open at 0 and 1.

    Args:
        per_seed_items: each seed's scored items.
        level: confidence level.
        resamples: bootstrap resamples.
        proportions: whether the items are successes (0/1) of one model, for Wilson's interval;
            ``None`` decides by the values. Pass ``False`` for differences of two models' 0/1 items
            (which may all be 0 or 1 and are still not a proportion).

    Raises:
        ValueError: no seeds, a seed with fewer than 2 items, or ``proportions=True`` with an item
            that is not 0 or 1.
    """
    if not per_seed_items:
        raise ValueError("per_seed_items needs at least one seed's items")
    widths = []
    for i, items in enumerate(per_seed_items):
        v = _check_values(items, "items", 2)
        binary = all(x in (0.0, 1.0) for x in v)
        if proportions and not binary:
            raise ValueError(f"proportions=True needs items of 0 or 1, got {sorted(set(v) - {0.0, 1.0})[:3]} in seed {i}")
        if binary if proportions is None else proportions:
            widths.append(wilson_interval(int(sum(v)), len(v), level).half_width)
        else:
            widths.append(bootstrap_interval(v, level, resamples=resamples, seed=i).half_width)
    return math.fsum(widths) / len(widths)


def difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL, *, paired: bool = False) -> Difference:
    """``mean(a) - mean(b)`` over seeds, with a two-sided interval and p-value.

    Unpaired (the default): Welch's t, which does not assume equal variances, with
    Welch-Satterthwaite degrees of freedom. Paired (``a[i]`` and ``b[i]`` share seed ``i``'s data
    order and evaluation items): a one-sample t on the differences.

    Args:
        a, b: one score per seed for each method (at least 2 each; equal lengths when paired).
        level: confidence level.
        paired: use the paired test.

    Where the seeds do not vary at all (every seed of each method scores the same, or every paired
    difference is the same), the standard error is 0 and the test has no spread to weigh: the
    interval is the point ``mean``, with ``p = 0`` for any non-zero difference and ``p = 1`` for
    none. That is the limit of the t statistic, not evidence about the evaluation sample: a
    saturated score (every passkey right) should be read with its evaluation uncertainty
    (:func:`eval_half_width`).

    Raises:
        ValueError: too few values, unequal lengths when paired, a bad level.
    """
    x, y = _check_values(a, "a", 2), _check_values(b, "b", 2)
    _check_level(level)
    q = (1 + level) / 2
    if paired:
        if len(x) != len(y):
            raise ValueError(f"paired values need equal lengths, got {len(x)} and {len(y)}")
        d = [u - v for u, v in zip(x, y)]
        n = len(d)
        mean = math.fsum(d) / n
        sd = math.sqrt(math.fsum((u - mean) ** 2 for u in d) / (n - 1))
        se, df, test = sd / math.sqrt(n), float(n - 1), "paired t"
    else:
        mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
        vx = math.fsum((u - mx) ** 2 for u in x) / (len(x) - 1) / len(x)
        vy = math.fsum((u - my) ** 2 for u in y) / (len(y) - 1) / len(y)
        mean, se, test = mx - my, math.sqrt(vx + vy), "Welch t"
        df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1)) if vx + vy > 0 else float(len(x) + len(y) - 2)
    if se == 0:
        p = 1.0 if mean == 0 else 0.0
        return Difference(mean, mean, mean, p, df, test)
    half = t_quantile(q, df) * se
    p = 2 * (1 - t_cdf(abs(mean) / se, df))
    return Difference(mean, mean - half, mean + half, p, df, test)


def separated(a: Sequence[float], b: Sequence[float], *, paired: bool = False) -> bool:
    """The book's "separated": the interval of ``mean(a) - mean(b)`` excludes zero, Welch's at
    :data:`SEPARATION_LEVEL` or, paired, at :data:`PAIRED_SEPARATION_LEVEL` (see the module docstring)."""
    return difference(a, b, PAIRED_SEPARATION_LEVEL if paired else SEPARATION_LEVEL, paired=paired).separated


def two_looks(a: Sequence[float], b: Sequence[float], *, paired: bool = False, first: int = 3,
              at_least: int = 5) -> dict:
    """The protocol's decision for a pair of methods, whose scores are given in seed order.

    First look: :func:`separated` on the first ``first`` seeds of each (the same seeds, run alike).
    Where that does not separate them and the margin is under twice the seeds' spread
    (:func:`needs_more_seeds`, paired or not as the test), a second look on the first ``at_least`` seeds of each, if both have
    them; if one does not, the pair is ``"pending"``. A pair that the first look leaves clear of the
    five-seed margin is decided at ``first`` seeds even when more exist, so that the two looks keep
    the error rate :data:`SEPARATION_LEVEL` was chosen for. A study planned with ``at_least`` seeds
    from the start (``first >= at_least``) has one look, at ``first`` seeds.

    Args:
        a, b: each method's scores, in seed order (seeds ``0, 1, 2, ...``; at least ``first`` each).
        paired: the paired test at each look (``a[i]`` and ``b[i]`` share seed ``i``).
        first: seeds of the first look (the seeds the study planned).
        at_least: seeds of the second look.

    Returns:
        ``{"separated": bool, "seeds": the number of seeds the decision used, "pending": bool}``:
        ``pending`` when the rule asks for a second look that the data cannot give yet.

    Raises:
        ValueError: fewer than ``first`` values in either, or ``first`` or ``at_least`` not an int >= 2.
    """
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 2 for n in (first, at_least)):
        raise ValueError(f"first and at_least must be ints >= 2, got first={first!r}, at_least={at_least!r}")
    x, y = _check_values(a, "a", first), _check_values(b, "b", first)
    if separated(x[:first], y[:first], paired=paired):
        return {"separated": True, "seeds": first, "pending": False}
    if first >= at_least or not needs_more_seeds(x[:first], y[:first], at_least=at_least, paired=paired):
        return {"separated": False, "seeds": first, "pending": False}
    if min(len(x), len(y)) < at_least:
        return {"separated": False, "seeds": first, "pending": True}
    return {"separated": separated(x[:at_least], y[:at_least], paired=paired), "seeds": at_least, "pending": False}


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> Interval:
    """A proportion ``successes / n`` with Wilson's score interval.

    Unlike a bootstrap of 0/1 items, it does not collapse to zero width at 0 or ``n`` successes
    (all ``n`` right still leaves room for a rate below 1).

    Raises:
        ValueError: ``n < 1`` or ``successes`` outside ``0 .. n``, or a bad level.
    """
    if not isinstance(n, int) or n < 1 or not isinstance(successes, int) or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n with n >= 1, got successes={successes!r}, n={n!r}")
    _check_level(level)
    z = t_quantile((1 + level) / 2, 1e9)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, centre - half, centre + half, n, f"Wilson, {n} items")


def needs_more_seeds(a: Sequence[float], b: Sequence[float], *, at_least: int = 5, paired: bool = False) -> bool:
    """The protocol's rule: a conclusion from ``a`` against ``b`` needs ``at_least`` seeds when the
    margin is under twice the spread the test reads, and either has fewer seeds than that.

    Unpaired (Welch), the margin is ``|mean(a) - mean(b)|`` and the spread the larger of the two
    seed standard deviations. Paired (``a[i]`` and ``b[i]`` share seed ``i``), the paired test reads
    the differences ``a[i] - b[i]``: the margin is their mean's size and the spread their standard
    deviation, which is larger than either arm's when the two move in opposite directions from seed
    to seed and smaller when they move together.

    Raises:
        ValueError: fewer than 2 values in either, or ``paired`` with unequal lengths.
    """
    x, y = _check_values(a, "a", 2), _check_values(b, "b", 2)
    sd = lambda v, m: math.sqrt(math.fsum((u - m) ** 2 for u in v) / (len(v) - 1))  # noqa: E731
    if paired:
        if len(x) != len(y):
            raise ValueError(f"paired needs a and b of equal length, got {len(x)} and {len(y)}")
        d = [u - v for u, v in zip(x, y)]
        md = math.fsum(d) / len(d)
        return abs(md) < 2 * sd(d, md) and len(d) < at_least
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    return abs(mx - my) < 2 * max(sd(x, mx), sd(y, my)) and min(len(x), len(y)) < at_least


def describe(values: Sequence[float], items: Optional[Sequence[Sequence[float]]] = None, digits: int = 3) -> str:
    """``"mean [low, high]"`` over seeds, and ``"± e (eval)"`` when the per-seed items are given: the
    form the book's tables print."""
    iv = seed_interval(values)
    text = f"{iv.mean:.{digits}f} [{iv.low:.{digits}f}, {iv.high:.{digits}f}]"
    if items is not None:
        text += f" ± {eval_half_width(items):.{digits}f}"
    return text
