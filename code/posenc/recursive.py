"""Recursive and multiplicative absolute encodings (source 004 §1.1(3)-(4)).

**Recursive.** Instead of a table, generate the codes by a recurrence ``p_{t+1} = f(p_t)`` from a
start vector ``p_0``. FLOATER (Liu et al. 2020, arXiv:2003.09229) makes ``f`` the flow of an ODE
``dp/dt = h(p, t)``. The linear, time-invariant case ``h(p) = S p`` with a skew-symmetric ``S``
has the solution ``p_t = exp(t S) p_0``: a rotation by ``t`` times a fixed angle per plane, which
is exactly how the sinusoidal table is generated (:func:`posenc.absolute.offset_matrix` is
``exp(S)``). :class:`RecurrentPE` learns ``p_0`` and ``S``, starting from the sinusoidal solution.

**Multiplicative.** Multiply the token embedding by the position code instead of adding it,
``x_t ⊙ m_t``. :class:`MultiplicativePE` uses ``m_t = 1 + scale · PE(t)`` with the sinusoidal
``PE``, so that ``scale = 0`` is the identity and the factors stay in ``[1 - scale, 1 + scale]``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.absolute import _check_base, _check_dim, _check_scale, _check_width, inverse_frequencies, sinusoidal_code
from posenc.method import PositionMethod, register_method


def sinusoidal_generator(dim: int, base: float = 10000.0) -> Tensor:
    """The skew-symmetric ``S`` with ``exp(S) = offset_matrix(1, dim, base)`` (interleaved layout).

    Block ``i`` is ``[[0, ω_i], [-ω_i, 0]]``, so ``exp(t S)`` rotates each (sin, cos) pair by ``-t ω_i``
    and ``exp(t S) PE(0) = PE(t)``.

    Returns:
        ``(dim, dim)`` float64.
    """
    w = inverse_frequencies(dim, base)  # (dim/2,)
    s = torch.zeros(dim, dim, dtype=torch.float64)
    idx = torch.arange(0, dim, 2)
    s[idx, idx + 1], s[idx + 1, idx] = w, -w
    return s


def recurrent_codes(p0: Tensor, generator: Tensor, positions: Tensor) -> Tensor:
    """``p_t = exp(t S) p_0`` for each position ``t``: the solution of ``dp/dt = S p`` (linear FLOATER).

    Equivalent to applying the one-step recurrence ``p_{t+1} = R p_t``, ``R = exp(S)``, ``t``
    times, but computed for all positions at once by binary powers: ``R^t`` is the product of the
    ``R^(2^j)`` over the set bits ``j`` of ``t``, so ``log2(max t)`` matrix products serve every
    position. Runs in the dtype of ``p0``.

    Args:
        p0: ``(C,)`` start vector.
        generator: ``(C, C)`` matrix ``S`` (skew-symmetric for a norm-preserving flow).
        positions: ``(N,)`` integer positions.

    Returns:
        ``(N, C)``.
    """
    t = positions.to(p0.device).long()  # (N,)
    codes = p0.expand(t.numel(), -1)  # (N, C)
    power = torch.linalg.matrix_exp(generator.to(p0.dtype))  # R^(2^0)
    top = int(t.max()).bit_length() if t.numel() else 0
    for j in range(top):
        bit = ((t >> j) & 1).bool()[:, None]  # (N, 1)
        codes = torch.where(bit, codes @ power.T, codes)  # apply R^(2^j) where bit j of t is set
        power = power @ power  # R^(2^(j+1))
    return codes  # (N, C)


class RecurrentPE(PositionMethod):
    """A learned linear recurrence ``p_{t+1} = exp(A - Aᵀ) p_t``, added to the token embeddings.

    ``S = A - Aᵀ`` is skew-symmetric, so ``exp(S)`` is a rotation: every code has the norm of
    ``p_0``, at any position. Initialised at the sinusoidal solution (``p_0 = scale · PE(0)``,
    ``S`` = :func:`sinusoidal_generator`), so before training it equals
    ``SinusoidalPE(dim, base, scale=scale)``. Defined at every position. The codes are computed
    in float64 and cast to the input's dtype.

    Args:
        dim: model width ``C`` (even).
        base: frequency base of the initial (sinusoidal) solution.
        scale: norm scale of ``p_0``.
    """

    def __init__(self, dim: int, base: float = 10000.0, *, scale: float = 1.0):
        super().__init__()
        _check_dim(dim)
        _check_base(base)
        _check_scale(scale)
        self.dim = dim
        p0 = scale * sinusoidal_code(torch.zeros(1, dtype=torch.long), dim, base, dtype=torch.float64)[0]
        self.p0 = nn.Parameter(p0.float())
        self.a = nn.Parameter((sinusoidal_generator(dim, base) / 2).float())  # A - Aᵀ = S

    def generator(self) -> Tensor:
        """``(C, C)``: ``S = A - Aᵀ``."""
        return self.a - self.a.T

    def codes(self, positions: Tensor) -> Tensor:
        """``(N, C)`` float64 codes at ``positions``."""
        self.check(positions)
        return recurrent_codes(self.p0.double(), self.generator().double(), positions)

    def transform_input(self, x: Tensor, positions: Tensor) -> Tensor:
        _check_width(x, self.dim)
        return x + self.codes(positions.to(self.p0.device)).to(x.dtype)  # (B, T, C)


class MultiplicativePE(PositionMethod):
    """Multiplies the token embeddings by ``1 + scale · PE(t)`` (sinusoidal ``PE``; source 004 §1.1(4)).

    Args:
        dim: model width ``C`` (even).
        base: frequency base.
        scale: amplitude of the modulation, in ``(0, 1]``; ``1`` lets a factor reach 0.
    """

    def __init__(self, dim: int, base: float = 10000.0, *, scale: float = 0.5):
        super().__init__()
        _check_dim(dim)
        _check_base(base)
        _check_scale(scale)
        if scale > 1:
            raise ValueError(f"scale must be in (0, 1] so that no factor changes sign, got {scale!r}")
        self.dim, self.base, self.scale = dim, float(base), float(scale)

    def factors(self, positions: Tensor) -> Tensor:
        """``(N, C)`` float64 multipliers ``1 + scale · PE(t)``."""
        return 1.0 + self.scale * sinusoidal_code(positions, self.dim, self.base, dtype=torch.float64)

    def transform_input(self, x: Tensor, positions: Tensor) -> Tensor:
        _check_width(x, self.dim)
        return x * self.factors(positions).to(device=x.device, dtype=x.dtype)  # (B, T, C)


@register_method("recurrent")
def _recurrent(config) -> PositionMethod:
    return RecurrentPE(config.d_model, scale=0.02 * 2**0.5)  # RMS entry 0.02, as the token embeddings


@register_method("multiplicative")
def _multiplicative(config) -> PositionMethod:
    return MultiplicativePE(config.d_model)
