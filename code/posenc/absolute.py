"""Absolute position encodings added to the token embeddings: sinusoidal, learned, low-rank, hybrid.

The sinusoidal table of Vaswani et al. (2017, arXiv:1706.03762, §3.5) and the learned table of
GPT-2/BERT, with the matrix view of source 000 (§6.3): a learned table is a matrix
``P`` of shape ``(N, C)`` whose row ``t`` is added to the token embedding at position ``t``.

Math lives in pure functions (:func:`inverse_frequencies`, :func:`sinusoidal_table`,
:func:`offset_matrix`, and the regularisers :func:`l2_penalty`, :func:`difference_penalty`,
:func:`spectral_penalty`); the modules only hold parameters. Angles are computed in float64 and
cast at the end, so a table is exact to the output dtype at any position a float64 can count.

Layouts of the sinusoidal table (``layout=``):

* ``"interleaved"`` (Vaswani et al.): column ``2i`` is ``sin(t ω_i)``, column ``2i + 1`` is ``cos(t ω_i)``;
* ``"half"``: the first ``C/2`` columns are the sines, the last ``C/2`` the cosines, ``[sin | cos]``;
  the same numbers, permuted (:func:`layout_permutation`).

with ``ω_i = base ** (-2i / C)`` for ``i = 0 .. C/2 - 1``.
"""

from __future__ import annotations

import functools

import math
from typing import Optional

import torch
from torch import Tensor, nn

from posenc.method import PositionMethod, check_positions, register_method


@functools.lru_cache(maxsize=None)
def _has_float64(device_type: str) -> bool:
    """Whether tensors of ``device_type`` can be float64 (MPS cannot)."""
    if device_type in ("cpu", "cuda"):
        return True
    try:
        torch.zeros(1, dtype=torch.float64, device=device_type)
    except (TypeError, RuntimeError):
        return False
    return True


LAYOUTS = ("interleaved", "half")
INITS = ("normal", "uniform", "zeros")
EXTEND_INITS = ("normal", "zeros", "copy")


def _check_dim(dim: int, *, even: bool = True) -> None:
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1 or (even and dim % 2):
        raise ValueError(f"dim must be a positive {'even ' if even else ''}int, got {dim!r}")


def _check_base(base: float) -> None:
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def inverse_frequencies(dim: int, base: float = 10000.0) -> Tensor:
    """Angular frequencies ``ω_i = base ** (-2i / dim)``, ``i = 0 .. dim/2 - 1`` (Vaswani et al. 2017, §3.5).

    Wavelengths ``2π / ω_i`` run from ``2π`` (``i = 0``) to ``2π · base ** ((dim - 2) / dim)``,
    just short of ``2π · base``.

    Returns:
        ``(dim // 2,)`` float64 tensor on the CPU, decreasing.

    Raises:
        ValueError: if ``dim`` is not a positive even int or ``base <= 1``.
    """
    _check_dim(dim)
    _check_base(base)
    return float(base) ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)


def sinusoidal_table(
    num_positions: int,
    dim: int,
    base: float = 10000.0,
    *,
    layout: str = "interleaved",
    dtype: torch.dtype = torch.float32,
    device=None,
) -> Tensor:
    """The sinusoidal position table of Vaswani et al. (2017), positions ``0 .. num_positions - 1``.

    ``PE[t, 2i] = sin(t ω_i)``, ``PE[t, 2i + 1] = cos(t ω_i)`` for ``layout="interleaved"``;
    ``[sin | cos]`` for ``layout="half"``. Computed in float64, then cast.

    Args:
        num_positions: ``N``, number of rows.
        dim: ``C``, number of columns (even).
        base: frequency base (10000 in the paper).
        layout: ``"interleaved"`` or ``"half"``.
        dtype: floating dtype of the result.
        device: device of the result.

    Returns:
        ``(N, C)`` table.

    Raises:
        ValueError: if ``num_positions < 1``, ``dim`` is not a positive even int, ``base <= 1``,
            or the layout is unknown.
    """
    if not isinstance(num_positions, int) or isinstance(num_positions, bool) or num_positions < 1:
        raise ValueError(f"num_positions must be a positive int, got {num_positions!r}")
    return sinusoidal_code(torch.arange(num_positions), dim, base, layout=layout, dtype=dtype).to(device)


def sinusoidal_code(
    positions: Tensor, dim: int, base: float = 10000.0, *, layout: str = "interleaved", dtype: torch.dtype = torch.float32
) -> Tensor:
    """Rows of the sinusoidal table for arbitrary integer ``positions`` (any size, no table needed).

    Args:
        positions: ``(N,)`` integer positions.
        dim, base, layout, dtype: as in :func:`sinusoidal_table`.

    Returns:
        ``(N, C)`` on the device of ``positions``.
    """
    check_positions(positions)
    _check_dim(dim)
    _check_layout(layout)
    # float64 on the positions' device (no host round trip on CUDA); on the CPU for devices without float64 (MPS)
    work = positions.device if _has_float64(positions.device.type) else torch.device("cpu")
    angles = positions.to(work, torch.float64)[:, None] * inverse_frequencies(dim, base).to(work)  # (N, C/2)
    sin, cos = angles.sin(), angles.cos()
    if layout == "half":
        table = torch.cat([sin, cos], dim=1)  # (N, C)
    else:
        table = torch.stack([sin, cos], dim=2).flatten(1)  # (N, C): sin, cos, sin, cos, ...
    return table.to(device=positions.device, dtype=dtype)


def layout_permutation(dim: int) -> Tensor:
    """Column permutation taking the interleaved layout to the half layout.

    ``sinusoidal_table(n, dim, layout="half") == sinusoidal_table(n, dim)[:, layout_permutation(dim)]``.

    Returns:
        ``(dim,)`` int64: ``[0, 2, 4, ..., 1, 3, 5, ...]``.
    """
    _check_dim(dim)
    return torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)])


def offset_matrix(k: int, dim: int, base: float = 10000.0, *, layout: str = "interleaved") -> Tensor:
    """The matrix ``M_k`` with ``PE(t + k) = M_k PE(t)`` for every position ``t`` (column vectors).

    Block-diagonal: for each frequency ``ω_i`` the pair ``(sin, cos)`` is multiplied by
    ``[[cos kω_i, sin kω_i], [-sin kω_i, cos kω_i]]``, a rotation by ``-kω_i`` that does not depend
    on ``t``. For a table with positions in rows: ``table[t + k] = table[t] @ M_k.T``.
    ``M_1`` generates the whole table from ``PE(0)`` by the recurrence ``PE(t + 1) = M_1 PE(t)``.

    Args:
        k: offset (any integer, negative included).
        dim, base, layout: as in :func:`sinusoidal_table`.

    Returns:
        ``(dim, dim)`` float64, orthogonal.

    Raises:
        TypeError: if ``k`` is not an int.
    """
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    _check_layout(layout)
    theta = k * inverse_frequencies(dim, base)  # (dim/2,)
    c, s = theta.cos(), theta.sin()
    half = dim // 2
    sin_idx = torch.arange(0, dim, 2) if layout == "interleaved" else torch.arange(half)
    cos_idx = sin_idx + 1 if layout == "interleaved" else torch.arange(half) + half
    m = torch.zeros(dim, dim, dtype=torch.float64)
    m[sin_idx, sin_idx], m[sin_idx, cos_idx] = c, s  # sin(a + b) = sin a cos b + cos a sin b
    m[cos_idx, sin_idx], m[cos_idx, cos_idx] = -s, c  # cos(a + b) = cos a cos b - sin a sin b
    return m


def extend_table(
    table: Tensor, num_positions: int, *, init: str = "copy", std: float = 0.02, generator: Optional[torch.Generator] = None
) -> Tensor:
    """A learned table grown to ``num_positions`` rows: the old rows unchanged, new rows appended.

    A learned table has nothing to say about positions it has no row for; growing it means
    choosing the new rows, then training them. The choices:

    * ``"copy"``: tile the existing rows, so row ``t`` of the result is row ``t mod N`` of the
      table (how Longformer, Beltagy et al. 2020, arXiv:2004.05150, grew RoBERTa's 512 rows to 4,096);
    * ``"normal"``: independent ``N(0, std²)`` entries, like a fresh table;
    * ``"zeros"``: zero rows (the new positions start with no position signal).

    Args:
        table: ``(N, C)`` floating tensor, the table to extend (not modified).
        num_positions: ``N' >= N``, rows of the result.
        init: ``"copy"``, ``"normal"`` or ``"zeros"``.
        std: standard deviation of ``"normal"``.
        generator: random generator for ``"normal"`` (default: the global one).

    Returns:
        ``(N', C)``, same dtype and device as ``table``, detached from its graph.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not a non-empty 2-D tensor, ``num_positions < N``, ``init`` is
            unknown, or ``std <= 0``.
    """
    _check_table(table)
    n = table.shape[0]
    if not isinstance(num_positions, int) or isinstance(num_positions, bool) or num_positions < n:
        raise ValueError(f"num_positions must be an int >= the table's {n} rows, got {num_positions!r}")
    if init not in EXTEND_INITS:
        raise ValueError(f"init must be one of {EXTEND_INITS}, got {init!r}")
    _check_scale(std, "std")
    old = table.detach()
    extra = num_positions - n
    if init == "copy":
        new = old[torch.arange(n, num_positions, device=old.device) % n]  # (N' - N, C)
    elif init == "normal":
        new = torch.randn(extra, old.shape[1], generator=generator, dtype=torch.float64).to(old) * std
    else:
        new = old.new_zeros(extra, old.shape[1])
    return torch.cat([old, new])  # (N', C)


# --- regularisers of a position table (source 000, eqs. 6.3.22-6.3.24) ---------------------------


def interpolate_table(table: Tensor, num_positions: int) -> Tensor:
    """A learned table resampled to ``num_positions`` rows by linear interpolation between its rows.

    Row ``t`` of the result is the table read at the fractional row ``s = t (N - 1) / (N' - 1)``:
    ``(1 - f) P[⌊s⌋] + f P[⌊s⌋ + 1]`` with ``f = s - ⌊s⌋``, so the first and last rows are kept and
    every row of the result lies between two trained rows. This is the 1-D form of how ViT carries
    its position embeddings to a longer sequence before fine-tuning at a higher resolution
    (Dosovitskiy et al. 2021, arXiv:2010.11929, §3.2, which interpolates in 2-D over the patch grid); it squeezes ``N'``
    positions into the span the table was trained on, as position interpolation does for RoPE
    (Chen et al. 2023, arXiv:2306.15595). ``num_positions < N`` subsamples.

    Args:
        table: ``(N, C)`` floating tensor with ``N >= 2`` (not modified).
        num_positions: ``N' >= 2``, rows of the result.

    Returns:
        ``(N', C)``, same dtype and device as ``table``, detached; computed in float64 where the
        device has it.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not a 2-D tensor of at least 2 rows, or ``num_positions`` is not an int >= 2.
    """
    _check_table(table)
    n = table.shape[0]
    if n < 2:
        raise ValueError(f"table must have at least 2 rows to interpolate between, got {n}")
    if not isinstance(num_positions, int) or isinstance(num_positions, bool) or num_positions < 2:
        raise ValueError(f"num_positions must be an int >= 2, got {num_positions!r}")
    work = torch.float64 if _has_float64(table.device.type) else torch.float32
    old = table.detach().to(work)
    s = torch.arange(num_positions, device=table.device, dtype=work) * ((n - 1) / (num_positions - 1))  # (N',)
    lo = s.floor().long().clamp(max=n - 2)  # (N',) the last row is reached with f = 1
    f = (s - lo.to(work)).unsqueeze(1)  # (N', 1)
    return ((1 - f) * old[lo] + f * old[lo + 1]).to(table.dtype)  # (N', C)


def _check_table(table: Tensor) -> None:
    if not isinstance(table, Tensor) or not table.dtype.is_floating_point:
        got = table.dtype if isinstance(table, Tensor) else type(table).__name__
        raise TypeError(f"table must be a floating-point tensor, got {got}")
    if table.dim() != 2 or table.numel() == 0:
        raise ValueError(f"table must be a non-empty 2-D (N, C) tensor, got shape {tuple(table.shape)}")


def l2_penalty(table: Tensor) -> Tensor:
    """``‖P‖_F² = Σ_t ‖p_t‖²`` (source 000, eq. 6.3.22 without its weight λ).

    Args:
        table: ``(N, C)``.

    Returns:
        Scalar, differentiable, in the dtype of ``table``.
    """
    _check_table(table)
    return table.pow(2).sum()


def difference_penalty(table: Tensor) -> Tensor:
    """``Σ_t ‖p_{t+1} - p_t‖²``: smoothness across neighbouring positions (source 000, eq. 6.3.23).

    Args:
        table: ``(N, C)``; a single row gives 0.

    Returns:
        Scalar, differentiable.
    """
    _check_table(table)
    return (table[1:] - table[:-1]).pow(2).sum()


def spectral_penalty(table: Tensor, eps: float = 1e-3) -> Tensor:
    """``Σ_i 1 / (σ_i² + eps)`` over the ``min(N, C)`` singular values (source 000, eq. 6.3.24).

    Large when some singular value is small: it pushes the table away from rank deficiency.
    Singular values are computed in at least float32; the gradient of an SVD is undefined at
    repeated singular values, so use it on tables whose spectrum is not degenerate.

    Args:
        table: ``(N, C)``.
        eps: positive constant keeping the penalty finite at ``σ_i = 0``.

    Returns:
        Scalar, differentiable.

    Raises:
        ValueError: if ``eps <= 0``.
    """
    _check_table(table)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    work = torch.promote_types(table.dtype, torch.float32)
    sigma = torch.linalg.svdvals(table.to(work))  # (min(N, C),)
    return (1.0 / (sigma.pow(2) + eps)).sum().to(table.dtype)


# --- modules -------------------------------------------------------------------------------------


class SinusoidalPE(PositionMethod):
    """Adds ``scale * sinusoidal_code(positions)`` to the token embeddings; defined at every position.

    No table is stored: the rows needed are computed from the positions in float64 (a stored
    buffer would be rounded by a model-wide ``.to(torch.bfloat16)``).

    Args:
        dim: model width ``C`` (even).
        base: frequency base.
        layout: ``"interleaved"`` or ``"half"``.
        scale: multiplies the code (the tiny LM's token embeddings have std 0.02).
    """

    def __init__(self, dim: int, base: float = 10000.0, *, layout: str = "interleaved", scale: float = 1.0):
        super().__init__()
        _check_dim(dim)
        _check_base(base)
        _check_layout(layout)
        _check_scale(scale)
        self.dim, self.base, self.layout, self.scale = dim, float(base), layout, float(scale)

    def table(self, num_positions: int) -> Tensor:
        """``(N, C)`` float32: the code added at positions ``0 .. num_positions - 1``."""
        return self.scale * sinusoidal_table(num_positions, self.dim, self.base, layout=self.layout)

    def transform_input(self, x: Tensor, positions: Tensor) -> Tensor:
        _check_width(x, self.dim)
        code = self.scale * sinusoidal_code(positions, self.dim, self.base, layout=self.layout, dtype=torch.float64)
        return x + code.to(device=x.device, dtype=x.dtype)  # (B, T, C)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}, layout={self.layout!r}, scale={self.scale:g}"


class LearnedPE(PositionMethod):
    """A learned table ``P`` ``(N, C)`` (GPT-2, BERT; source 000 eq. 6.3.1) added to the embeddings.

    Positions ``>= num_positions`` raise a ``ValueError``: a learned table has no row for them,
    and this module neither wraps nor clamps.

    Args:
        num_positions: ``N``, rows of the table.
        dim: ``C``.
        init: ``"normal"`` (std ``std``), ``"uniform"`` (on ``[-a, a]``) or ``"zeros"``.
        std: standard deviation of the normal initialisation.
        a: half-width of the uniform initialisation; default ``sqrt(3) * std`` (same variance).
    """

    def __init__(
        self, num_positions: int, dim: int, *, init: str = "normal", std: float = 0.02, a: Optional[float] = None
    ):
        super().__init__()
        _check_positive_int(num_positions, "num_positions")
        _check_dim(dim, even=False)
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        _check_scale(std, "std")
        a = math.sqrt(3.0) * std if a is None else a
        _check_scale(a, "a")
        self.max_positions, self.dim = num_positions, dim
        self.weight = nn.Parameter(torch.empty(num_positions, dim))
        if init == "normal":
            nn.init.normal_(self.weight, std=std)
        elif init == "uniform":
            nn.init.uniform_(self.weight, -a, a)
        else:
            nn.init.zeros_(self.weight)

    def table(self) -> Tensor:
        """``(N, C)``: the learned table."""
        return self.weight

    def extended(self, num_positions: int, *, init: str = "copy", std: float = 0.02, generator=None) -> "LearnedPE":
        """A new :class:`LearnedPE` with ``num_positions`` rows, the first ``N`` equal to this table's.

        See :func:`extend_table` for ``init``, ``std`` and ``generator``. This module is not changed
        (an optimizer holding its weight is unaffected); the new one is on the same device and dtype.
        """
        weight = extend_table(self.weight, num_positions, init=init, std=std, generator=generator)
        grown = LearnedPE(num_positions, self.dim, init="zeros")
        grown.weight = nn.Parameter(weight)
        return grown

    def transform_input(self, x: Tensor, positions: Tensor) -> Tensor:
        self.check(positions)
        _check_width(x, self.dim)
        return x + self.weight[positions.to(self.weight.device)].to(x.dtype)  # (B, T, C)


class LowRankPE(PositionMethod):
    """A learned table of rank at most ``rank``: ``P = U Vᵀ``, ``U`` ``(N, r)``, ``V`` ``(C, r)`` (source 000 §6.3.6).

    ``r (N + C)`` parameters instead of ``N C``. Initialised so that the entries of ``P`` have
    standard deviation ``std``.
    """

    def __init__(self, num_positions: int, dim: int, rank: int, *, std: float = 0.02):
        super().__init__()
        _check_positive_int(num_positions, "num_positions")
        _check_dim(dim, even=False)
        _check_positive_int(rank, "rank")
        if rank > min(num_positions, dim):
            raise ValueError(f"rank must be <= min(num_positions, dim) = {min(num_positions, dim)}, got {rank}")
        _check_scale(std, "std")
        self.max_positions, self.dim, self.rank = num_positions, dim, rank
        factor_std = math.sqrt(std / math.sqrt(rank))  # Var(P_ij) = rank * factor_std**4 = std**2
        self.u = nn.Parameter(torch.randn(num_positions, rank) * factor_std)
        self.v = nn.Parameter(torch.randn(dim, rank) * factor_std)

    def table(self) -> Tensor:
        """``(N, C)``: ``U Vᵀ``."""
        return self.u @ self.v.T

    def transform_input(self, x: Tensor, positions: Tensor) -> Tensor:
        self.check(positions)
        _check_width(x, self.dim)
        rows = self.u[positions.to(self.u.device)] @ self.v.T  # (T, C), only the rows needed
        return x + rows.to(x.dtype)


class HybridPE(PositionMethod):
    """``P_sin + P_learn`` (source 000, eq. 6.3.25): a fixed sinusoidal code plus a learned residual table.

    The residual starts at zero, so the method starts as :class:`SinusoidalPE`. Covers positions
    ``0 .. num_positions - 1`` (the learned part is finite).
    """

    def __init__(self, num_positions: int, dim: int, base: float = 10000.0, *, scale: float = 1.0):
        super().__init__()
        self.sinusoidal = SinusoidalPE(dim, base, scale=scale)
        self.learned = LearnedPE(num_positions, dim, init="zeros")
        self.max_positions, self.dim = num_positions, dim

    def table(self) -> Tensor:
        """``(N, C)``: ``P_sin + P_learn``."""
        n = self.max_positions
        return self.sinusoidal.table(n).to(self.learned.weight) + self.learned.weight

    def transform_input(self, x: Tensor, positions: Tensor) -> Tensor:
        self.check(positions)
        return self.learned.transform_input(self.sinusoidal.transform_input(x, positions), positions)


def _check_positive_int(value, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_scale(value, name: str = "scale") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def _check_width(x: Tensor, dim: int) -> None:
    if x.shape[-1] != dim:
        raise ValueError(f"x has width {x.shape[-1]} but this method was built for dim={dim}")


# The tiny LM initialises token embeddings with std 0.02; the registered methods match that scale
# (chapter 1 shows that codes much larger than the embeddings drown the tokens).
_EMBED_STD = 0.02


@register_method("sinusoidal")
def _sinusoidal(config) -> PositionMethod:
    return SinusoidalPE(config.d_model, scale=_EMBED_STD * math.sqrt(2.0))  # RMS entry of the code = 0.02


@register_method("learned")
def _learned(config) -> PositionMethod:
    return LearnedPE(config.max_len, config.d_model, std=_EMBED_STD)


@register_method("hybrid")
def _hybrid(config) -> PositionMethod:
    return HybridPE(config.max_len, config.d_model, scale=_EMBED_STD * math.sqrt(2.0))
