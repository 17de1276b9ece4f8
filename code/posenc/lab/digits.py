"""Integers as digit vectors: the digit/base analogy for length extrapolation, and a toy learner.

Source 004 §4 explains RoPE's context extension with an analogy (after Su 2023, "RoPE is a
beta-base encoding", kexue.fm/archives/9675). Write a position ``n`` in base ``beta`` as the vector of
its digits ``(d_0, d_1, ...)``, lowest first, ``d_j = floor(n / beta^j) mod beta``. A learner trained on
``0 <= n < beta^k`` has seen every value of the ``k`` low digits and only 0 in the digits above. To
handle numbers up to ``s`` times larger:

- ``"direct"`` (direct extrapolation): keep the representation; the digit ``k`` now takes values
  the learner only ever saw as 0;
- ``"interpolate"`` (interpolation): feed ``n / s``; every digit stays in its trained range, but the
  lowest one becomes fractional and neighbours ``n, n + 1`` differ by ``1 / s`` there;
- ``"convert"`` (base conversion): write ``n`` in a larger base ``beta'`` with ``beta'^k >= s beta^k``;
  every digit stays an integer (neighbours still differ by 1 in the lowest), no new digit is used,
  but each digit can now exceed ``beta - 1``.

For RoPE, pair ``i`` turns by ``n theta_i`` with ``theta_i = b^(-2i/D) = beta^(-i)``, ``beta =
b^(2/D)``: its angle is digit-like (``n / beta^i`` on a circle). Position interpolation divides every
``n`` by ``s`` (interpolation); NTK-aware scaling enlarges the base ``b`` (base conversion).

:func:`to_digits` and :func:`represent` are pure functions; :class:`DigitPairNet` is a small MLP
that reads the representations of two numbers ``a``, ``b`` and is trained (:func:`train_digit_learner`)
on one of two tasks that mirror what attention needs from positions: ``"order"`` (is ``a < b``?)
and ``"near"`` (is ``|a - b| <= window``?). :func:`digit_accuracy` scores it on a range of numbers
under each strategy.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor, nn

#: How numbers beyond the trained range are represented.
STRATEGIES = ("direct", "interpolate", "convert")
#: What the toy learner is asked about a pair ``(a, b)``.
TASKS = ("order", "near")


def _check_base_places(base, places) -> None:
    if not isinstance(base, int) or isinstance(base, bool) or base < 2:
        raise ValueError(f"base must be an int >= 2, got {base!r}")
    if not isinstance(places, int) or isinstance(places, bool) or places < 1:
        raise ValueError(f"places must be a positive int, got {places!r}")


def _check_factor(factor) -> None:
    if not isinstance(factor, Real) or isinstance(factor, bool) or not factor >= 1:
        raise ValueError(f"factor must be a number >= 1, got {factor!r}")


def to_digits(x: Tensor, base: int, places: int) -> Tensor:
    """The ``places`` lowest base-``base`` digits of non-negative numbers, lowest first.

    ``d_0 = x mod base`` keeps the fractional part of ``x`` (an interpolated position has a
    fractional lowest digit); ``d_j = floor(x / base^j) mod base`` for ``j >= 1``. For
    ``0 <= x < base^places``, ``sum_j d_j base^j = x``.

    Args:
        x: ``(...)`` non-negative numbers (any real dtype).
        base: the base, an int ``>= 2``.
        places: how many digits.

    Returns:
        ``(..., places)`` float64 digits.

    Raises:
        TypeError: if ``x`` is not a real tensor.
        ValueError: for a negative ``x``, a ``base`` below 2 or ``places`` below 1.
    """
    if not isinstance(x, Tensor) or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"x must be a real tensor, got {x.dtype if isinstance(x, Tensor) else type(x).__name__}")
    _check_base_places(base, places)
    v = x.double()
    if bool((v < 0).any()):
        raise ValueError(f"x must be non-negative, got minimum {float(v.min())}")
    powers = torch.tensor([float(base) ** j for j in range(places)], dtype=torch.float64, device=v.device)
    scaled = v[..., None] / powers  # (..., places)
    whole = torch.cat([scaled[..., :1], torch.floor(scaled[..., 1:])], -1)
    return torch.remainder(whole, base)  # (..., places)


def converted_base(base: int, used_places: int, factor: float) -> int:
    """The smallest integer base ``beta'`` whose ``used_places`` digits cover ``factor`` times as many numbers.

    ``beta'^used_places >= factor * base^used_places``, so numbers below ``factor * base^used_places``
    need no new digit.

    Raises:
        ValueError: for a ``base`` below 2, ``used_places`` below 1 or a ``factor`` below 1.
    """
    _check_base_places(base, used_places)
    _check_factor(factor)
    new = math.ceil(base * factor ** (1 / used_places) - 1e-9)
    while new ** used_places < factor * base ** used_places:
        new += 1
    return new


def represent(n: Tensor, strategy: str, factor: float, *, base: int = 10, places: int = 4,
              used_places: int = 3) -> Tensor:
    """The learner's input for numbers ``n``: their digits under ``strategy``, divided by ``base``.

    The learner was trained on ``0 <= n < base^used_places`` with ``places`` digit inputs (the
    digits above ``used_places`` always 0). Dividing by the training ``base`` keeps the scale the
    learner was trained on, for every strategy.

    Args:
        n: ``(...)`` non-negative integers (any dtype).
        strategy: ``"direct"``, ``"interpolate"`` (``n / factor``) or ``"convert"`` (base
            :func:`converted_base`).
        factor: how many times the trained range is to be covered, ``>= 1``.
        base: the training base.
        places: digit inputs of the learner.
        used_places: digits the training numbers use.

    Returns:
        ``(..., places)`` float64.

    Raises:
        ValueError: for an unknown ``strategy`` or a ``factor`` below 1, or from :func:`to_digits`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    _check_factor(factor)
    if strategy == "interpolate":
        return to_digits(n.double() / factor, base, places) / base
    if strategy == "convert":
        return to_digits(n, converted_base(base, used_places, factor), places) / base
    return to_digits(n, base, places) / base


class DigitPairNet(nn.Module):
    """The toy learner: an MLP reading the digit vectors of two numbers and returning one logit.

    Args:
        places: digit inputs per number.
        width: hidden width of the two hidden layers.
        base: the base of the numbers it is trained on.
        used_places: digits those numbers use (``places`` minus the unused ones).
    """

    def __init__(self, places: int = 4, width: int = 64, base: int = 10, used_places: int = 3):
        super().__init__()
        self.places, self.base, self.used_places = places, base, used_places
        self.net = nn.Sequential(nn.Linear(2 * places, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, 1))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        """``(..., places)`` and ``(..., places)`` representations to ``(...)`` logits."""
        return self.net(torch.cat([a, b], -1).float())[..., 0]


def digit_pairs(task: str, count: int, low: int, high: int, generator: torch.Generator,
                window: int = 3) -> tuple[Tensor, Tensor, Tensor]:
    """``count`` pairs of integers in ``[low, high)`` and their labels for ``task``.

    Half of the pairs are close (``0 < |a - b| <= 4 window``) and half are, for ``"order"``,
    independent uniform draws, for ``"near"``, split evenly between near (``|a - b| <= window``)
    and far-but-close (``window < |a - b| <= 4 window``), so that always answering "near" or "far"
    scores 50%.

    Returns:
        ``(a, b, label)``: ``(count,)`` int64, int64 and float32 (1.0 for ``a < b``, or for near).

    Raises:
        ValueError: for an unknown task, ``count < 1``, ``window < 1`` or a range shorter than ``8 window + 2``.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    if not (isinstance(low, int) and isinstance(high, int)) or low < 0 or high - low < 8 * window + 2:
        raise ValueError(f"low, high must be ints with 0 <= low and high - low >= 8 * window + 2, got {low!r}, {high!r}")
    a_all, b_all = [], []
    have = 0
    while have < count:
        m = 2 * (count - have) + 16
        a = torch.randint(low, high, (m,), generator=generator)
        if task == "near":
            d = torch.where(torch.arange(m) % 2 == 0, torch.randint(1, window + 1, (m,), generator=generator),
                            torch.randint(window + 1, 4 * window + 1, (m,), generator=generator))
        else:
            d = torch.randint(1, 4 * window + 1, (m,), generator=generator)
        d = d * (2 * torch.randint(0, 2, (m,), generator=generator) - 1)
        b = a + d
        if task == "order":
            far = torch.arange(m) % 2 == 1
            b = torch.where(far, torch.randint(low, high, (m,), generator=generator), b)
        keep = (b >= low) & (b < high) & (a != b)
        a_all.append(a[keep])
        b_all.append(b[keep])
        have += int(keep.sum())
    a, b = torch.cat(a_all)[:count], torch.cat(b_all)[:count]
    label = (a < b) if task == "order" else ((a - b).abs() <= window)
    return a, b, label.float()


def train_digit_learner(task: str, seed: int, *, numbers: int = 1000, base: int = 10, places: int = 4,
                        steps: int = 2000, batch_size: int = 512, lr: float = 3e-3, window: int = 3) -> DigitPairNet:
    """Train a :class:`DigitPairNet` on ``task`` over the numbers ``0 .. numbers - 1`` in base ``base``.

    ``numbers`` must be a power of ``base`` (``base^used_places``). Seeded by ``seed`` (the global
    RNG is untouched); Adam at a constant learning rate, binary cross-entropy.

    Raises:
        ValueError: if ``numbers`` is not a power of ``base`` below ``base^places``, or from
            :func:`digit_pairs`.
    """
    used = round(math.log(numbers, base)) if numbers >= base else 0
    if base ** used != numbers or used >= places:
        raise ValueError(f"numbers must be base**k with 1 <= k < places={places}, got {numbers!r} (base {base})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = DigitPairNet(places, base=base, used_places=used)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr)
    for _ in range(steps):
        a, b, y = digit_pairs(task, batch_size, 0, numbers, gen, window)
        loss = nn.functional.binary_cross_entropy_with_logits(
            net(represent(a, "direct", 1, base=base, places=places, used_places=used),
                represent(b, "direct", 1, base=base, places=places, used_places=used)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


@torch.no_grad()
def digit_accuracy(net: DigitPairNet, task: str, strategy: str, factor: float, *, low: int, high: int,
                   count: int = 20000, seed: int = 1234, window: int = 3) -> float:
    """Fraction of ``count`` pairs in ``[low, high)`` that ``net`` labels right, numbers represented by ``strategy``.

    Raises:
        ValueError: from :func:`digit_pairs` or :func:`represent`.
    """
    a, b, y = digit_pairs(task, count, low, high, torch.Generator().manual_seed(seed), window)
    kw = dict(base=net.base, places=net.places, used_places=net.used_places)
    logits = net(represent(a, strategy, factor, **kw), represent(b, strategy, factor, **kw))
    return float(((logits > 0).float() == y).float().mean())
