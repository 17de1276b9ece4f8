"""Matrix analysis of position tables: singular values, rank, low-rank approximation, Gram and covariance.

A table of absolute position codes is a matrix ``P`` of shape ``(N, C)`` (``N`` positions, ``C``
model width; see the shape legend in :mod:`posenc`) whose row ``p_i`` is the code of position
``i``: a learned embedding table or a sinusoidal table. The sinusoidal and learned-encoding
chapters use these functions to ask how many directions a table really uses, how well a rank-``k``
factorisation could replace it, and how the positions sit relative to one another (source 000
§6.3.1–6.3.3, eqs. 6.3.3–6.3.14).

Every function is pure, takes a 2-D floating tensor ``table`` ``(N, C)`` of any floating dtype,
and computes in float64 on the table's device (on the CPU for a device without float64, such as
MPS). Tensor results are float64 on the table's device (on the CPU where the device has no
float64); scalar results are Python ``float``/``int``.

The squared Frobenius norm is the sum of squared singular values, ``||P||_F^2 = sum_i sigma_i^2``
(eq. 6.3.10), and the spectral norm is the largest, ``||P||_2 = sigma_1`` (eq. 6.3.11); use
``torch.linalg.norm`` for both, there is no wrapper here.

Two functions ask what adding the table to token embeddings ``(V, C)`` (``V`` tokens) does to the
tokens (chapter 1, "Addition or concatenation?"): :func:`token_readout_accuracy` measures how often a
linear read-out finds the token in ``x_v + rho * p_n``, and :func:`complement_projector` gives the
linear map that removes every position code, which exists, and leaves something, only when the
table's rank is below ``C``.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from posenc.absolute import _has_float64


def _as_float64(table: Tensor, name: str = "table", rows: str = "N") -> Tensor:
    """Validate ``table`` and return it as float64, on its device if that supports float64, else on the CPU.

    ``name`` and ``rows`` (the letter of its first dimension) are used in the error messages.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if it is not 2-D, is empty, or has a non-finite entry.
    """
    if not isinstance(table, Tensor) or not table.dtype.is_floating_point:
        got = table.dtype if isinstance(table, Tensor) else type(table).__name__
        raise TypeError(f"{name} must be a floating-point tensor, got {got}")
    if table.dim() != 2:
        raise ValueError(f"{name} must be 2-D ({rows}, C), got shape {tuple(table.shape)}")
    if table.numel() == 0:
        raise ValueError(f"{name} must be non-empty ({rows} >= 1 and C >= 1), got shape {tuple(table.shape)}")
    device = table.device if _has_float64(table.device.type) else torch.device("cpu")
    p = table.to(device=device, dtype=torch.float64)  # (rows, C)
    if not bool(torch.isfinite(p).all()):
        raise ValueError(f"{name} must have only finite entries, got NaN or infinity")
    return p


def _check_int_in(name: str, value, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")


def singular_values(table: Tensor) -> Tensor:
    """The singular values ``sigma_1 >= sigma_2 >= ... >= 0`` of the table (source 000 eq. 6.3.3).

    Args:
        table: ``(N, C)`` floating tensor, rows are position codes ``p_i``.

    Returns:
        ``(min(N, C),)`` float64, descending, on the table's device.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, or has a non-finite entry.
    """
    return torch.linalg.svdvals(_as_float64(table))  # (min(N, C),)


def numerical_rank(table: Tensor, rtol: float | None = None) -> int:
    """The number of singular values above ``rtol * sigma_1``: the rank up to a tolerance.

    In exact arithmetic the rank is the number of non-zero singular values, but a table stored in
    floating point is only known up to the rounding of its entries, which moves every singular value
    by up to about ``max(N, C) * eps * sigma_1``. A rank-deficient table therefore has tiny, not zero,
    trailing singular values, and the numerical rank *depends on the tolerance*. The default
    ``rtol = max(N, C) * eps``, with ``eps`` the machine epsilon of the table's own dtype
    (``torch.finfo(table.dtype).eps``), is the convention of ``numpy.linalg.matrix_rank`` and LAPACK:
    the tolerance that makes the rank stable against the rounding of the input (a float32 table of
    rank ``r`` has rank ``r``, not ``min(N, C)``). Pass a larger ``rtol`` to ignore directions that
    are present but weak; :func:`effective_rank` measures that in terms of energy instead.

    Args:
        table: ``(N, C)`` floating tensor.
        rtol: relative tolerance ``>= 0``; ``None`` for ``max(N, C) * finfo(table.dtype).eps``.

    Returns:
        ``#{i : sigma_i > rtol * sigma_1}``, an int in ``0..min(N, C)`` (0 for the zero table).

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, or has a non-finite entry; if ``rtol`` is
            not a real number ``>= 0``.
    """
    s = singular_values(table)  # (min(N, C),)
    if rtol is None:
        rtol = max(table.shape) * torch.finfo(table.dtype).eps
    elif not isinstance(rtol, Real) or isinstance(rtol, bool) or not rtol >= 0:
        raise ValueError(f"rtol must be a real number >= 0 or None, got {rtol!r}")
    return int((s > float(rtol) * s[0]).sum())


def effective_rank(table: Tensor, energy: float = 0.99) -> int:
    """The fewest singular directions that hold a fraction ``energy`` of the table's squared norm.

    The smallest ``k`` with ``sum_{i<=k} sigma_i^2 >= energy * sum_i sigma_i^2``, that is, the rank
    of the best approximation (:func:`best_rank_k`) whose squared error is at most
    ``(1 - energy) * ||P||_F^2`` (source 000 eqs. 6.3.10, 6.3.14). The sums are float64, so a
    singular value whose square is below the rounding of the running sum (``sigma_i^2 <
    eps_64 * ||P||_F^2``) adds nothing: ``energy=1`` can return less than :func:`numerical_rank`.

    Args:
        table: ``(N, C)`` floating tensor.
        energy: fraction of the squared Frobenius norm to keep, in ``(0, 1]``.

    Returns:
        ``k``, an int in ``1..min(N, C)``; 0 for the zero table.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, or has a non-finite entry; if ``energy`` is
            not a real number in ``(0, 1]``.
    """
    if not isinstance(energy, Real) or isinstance(energy, bool) or not 0 < energy <= 1:
        raise ValueError(f"energy must be a real number in (0, 1], got {energy!r}")
    s = singular_values(table)  # (min(N, C),)
    cumulative = torch.cumsum(s**2, dim=0)  # (min(N, C),)
    total = cumulative[-1]  # the total as the last running sum: energy=1 always finds an index
    if float(total) == 0.0:
        return 0
    target = (float(energy) * total).reshape(1)
    return int(torch.searchsorted(cumulative, target)) + 1  # first index with cumulative >= target


def best_rank_k(table: Tensor, k: int) -> tuple[Tensor, float]:
    """The best rank-``k`` approximation of the table and its Frobenius error (Eckart and Young, 1936).

    ``P_k = sum_{i<=k} sigma_i u_i v_i^T`` (source 000 eq. 6.3.13), the truncated SVD, minimises
    ``||P - Q||_F`` (and ``||P - Q||_2``) over all ``Q`` of rank at most ``k``; its error is
    ``sqrt(sum_{i>k} sigma_i^2)`` (eq. 6.3.14). The error returned here is computed directly as
    ``||P - P_k||_F`` from the difference, not from that formula, so the two can be compared.

    Args:
        table: ``(N, C)`` floating tensor.
        k: rank of the approximation, an int in ``0..min(N, C)``; 0 gives the zero matrix and
            ``min(N, C)`` gives ``P`` up to rounding.

    Returns:
        ``(approx, error)``: ``approx`` ``(N, C)`` float64 on the table's device, and the Python float
        ``||P - P_k||_F``.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, or has a non-finite entry; if ``k`` is not an
            int in ``0..min(N, C)``.
    """
    p = _as_float64(table)  # (N, C)
    _check_int_in("k", k, 0, min(p.shape))
    u, s, vh = torch.linalg.svd(p, full_matrices=False)  # (N, R), (R,), (R, C) with R = min(N, C)
    approx = (u[:, :k] * s[:k]) @ vh[:k]  # (N, k) @ (k, C) -> (N, C)
    return approx, float(torch.linalg.norm(p - approx))


def gram(table: Tensor) -> Tensor:
    """The Gram matrix of the position codes, ``G_ij = p_i . p_j``, i.e. ``G = P P^T`` (source 000 eq. 6.3.5).

    Symmetric positive semi-definite; its diagonal holds the squared row norms ``||p_i||^2``, and it
    is positive definite exactly when the ``N`` codes are linearly independent (possible only if
    ``N <= C``).

    Args:
        table: ``(N, C)`` floating tensor.

    Returns:
        ``(N, N)`` float64 on the table's device.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, or has a non-finite entry.
    """
    p = _as_float64(table)  # (N, C)
    return p @ p.T  # (N, N)


def covariance(table: Tensor) -> Tensor:
    """The population covariance of the position codes over positions (source 000 eqs. 6.3.4, 6.3.6).

    ``Sigma_P = (1/N) P~^T P~`` with ``P~ = P - 1 c^T`` the table with its mean row
    ``c = (1/N) sum_i p_i`` subtracted. The divisor is ``N`` (population covariance, as in the
    source), not ``N - 1``: ``torch.cov`` and ``numpy.cov`` divide by ``N - 1`` by default and agree
    with this function only with ``correction=0`` / ``bias=True``. A single position (``N = 1``)
    gives the zero matrix.

    Args:
        table: ``(N, C)`` floating tensor; rows are observations, columns are variables.

    Returns:
        ``(C, C)`` float64 symmetric positive semi-definite, on the table's device.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, or has a non-finite entry.
    """
    p = _as_float64(table)  # (N, C)
    centred = p - p.mean(dim=0, keepdim=True)  # (N, C)
    return centred.T @ centred / p.shape[0]  # (C, C)


def condition_number(table: Tensor) -> float:
    """The 2-norm condition number ``kappa(P) = sigma_1 / sigma_min`` (source 000 eq. 6.3.12).

    ``sigma_min`` is the smallest of the ``min(N, C)`` singular values (the source writes
    ``sigma_d``, which assumes ``N >= C``). It is ``math.inf`` when ``sigma_min`` is exactly 0
    (this includes the zero table). A table that is singular only up to rounding has a tiny
    non-zero ``sigma_min`` and gets a large finite value, about ``1 / eps`` or more; compare with
    :func:`numerical_rank` to decide whether it is rank-deficient.

    Args:
        table: ``(N, C)`` floating tensor.

    Returns:
        ``kappa >= 1`` as a Python float, or ``math.inf``.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, or has a non-finite entry.
    """
    s = singular_values(table)  # (min(N, C),)
    largest, smallest = float(s[0]), float(s[-1])
    return math.inf if smallest == 0.0 else largest / smallest


def cosine_matrix(table: Tensor) -> Tensor:
    """Cosine similarity between the centred codes of every pair of positions.

    ``S_ij = cos(p~_i, p~_j)`` with ``p~_i = p_i - c`` and ``c`` the mean row (as in
    :func:`covariance`). Centring removes the part every code shares, which no attention score can
    use to tell positions apart; a row equal to the mean (a zero centred code) has no direction and
    gives ``nan``.

    Args:
        table: ``(N, C)`` floating tensor, ``N >= 2``.

    Returns:
        ``(N, N)`` float64 on the table's device, ones on the diagonal.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, has a non-finite entry, or has one row.
    """
    p = _as_float64(table)  # (N, C)
    if p.shape[0] < 2:
        raise ValueError(f"table must have at least 2 rows to centre, got shape {tuple(table.shape)}")
    centred = p - p.mean(dim=0, keepdim=True)  # (N, C)
    unit = centred / centred.norm(dim=1, keepdim=True)  # (N, C)
    return unit @ unit.T  # (N, N)


def neighbour_cosine(table: Tensor) -> float:
    """Mean cosine between the centred codes of neighbouring positions ``t`` and ``t + 1``.

    A measure of smoothness: about 0 for independent random rows, 1 when each code is close to the
    next one. Centred as in :func:`cosine_matrix`.

    Args:
        table: ``(N, C)`` floating tensor, ``N >= 2``.

    Returns:
        ``mean_t cos(p~_t, p~_{t+1})`` as a Python float, in ``[-1, 1]``.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, has a non-finite entry, or has one row.
    """
    return float(cosine_matrix(table).diagonal(1).mean())


def complement_projector(table: Tensor, rtol: float | None = None) -> Tensor:
    """The orthogonal projector onto the directions no position code uses, ``Pi = I - V_r V_r^T``.

    ``V_r`` ``(C, r)`` holds the right singular vectors of the ``r = numerical_rank(table, rtol)``
    largest singular values, an orthonormal basis of the space the codes ``p_n`` span. Every code is
    removed, ``p_n Pi = 0`` (up to the tolerance), so ``(x + rho p_n) Pi = x Pi`` for every vector
    ``x`` and every scale ``rho``: a read-out that looks at ``h Pi`` sees no position, however large
    the codes. What is left of
    the tokens is their part in the other ``C - r`` directions. When the codes span all of ``R^C``
    (``r = C``; a random table with ``N >= C`` rows, almost surely) ``Pi = 0`` and nothing is left:
    no linear map removes every code without removing every token too. The zero table gives ``I``.

    Args:
        table: ``(N, C)`` floating tensor, rows are position codes ``p_n``.
        rtol: the tolerance of :func:`numerical_rank` (``None`` for its default); directions whose
            singular value is below ``rtol * sigma_1`` are kept in ``Pi``, not removed.

    Returns:
        ``(C, C)`` float64 on the table's device: symmetric, idempotent, of trace ``C - r``.

    Raises:
        TypeError: if ``table`` is not a floating-point tensor.
        ValueError: if ``table`` is not 2-D, is empty, or has a non-finite entry; if ``rtol`` is
            not a real number ``>= 0``.
    """
    p = _as_float64(table)  # (N, C)
    r = numerical_rank(table, rtol)
    basis = torch.linalg.svd(p, full_matrices=False).Vh[:r]  # (r, C), orthonormal rows
    return torch.eye(p.shape[1], dtype=p.dtype, device=p.device) - basis.T @ basis  # (C, C)


READOUTS = ("nearest", "fitted")


def token_readout_accuracy(tokens: Tensor, table: Tensor, scale: float = 1.0, *, readout: str = "nearest") -> float:
    """The fraction of (token, position) pairs whose token a linear read-out finds in ``h = x_v + scale * p_n``.

    All ``V N`` sums of a token embedding ``x_v`` and a scaled position code are formed and each is
    read in one of two ways; both give one affine score per token and take the largest.

    * ``"nearest"``: the nearest token embedding, ``argmin_v ||h - x_v||``, i.e. the largest of the
      scores ``h . x_v - ||x_v||^2 / 2``. It knows the tokens only, not the position table.
    * ``"fitted"``: an affine map ``h -> h W + b`` fitted by least squares to the one-hot token of
      every sum (the normal equations over all ``V N`` sums, solved with a pseudo-inverse), then the
      largest output. It sees the sums, so it can learn to ignore directions that carry only
      position (:func:`complement_projector`). Least squares is not the best linear classifier, so
      this is a lower bound on what a linear read-out can do.

    Args:
        tokens: ``(V, C)`` floating tensor, the token embeddings ``x_v``.
        table: ``(N, C)`` floating tensor, the position codes ``p_n``.
        scale: ``rho >= 0``, the factor on every code.
        readout: ``"nearest"`` or ``"fitted"``.

    Returns:
        The fraction of the ``V N`` pairs read as their own token, a Python float in ``[0, 1]``
        (a tie goes to the lower token index). Computed in float64, with memory ``O(V N (V + C))``.

    Raises:
        TypeError: if ``tokens`` or ``table`` is not a floating-point tensor.
        ValueError: if either is not 2-D, is empty, or has a non-finite entry; if their widths ``C``
            or devices differ; if ``scale`` is not a finite real number ``>= 0``; if ``readout`` is
            unknown.
    """
    x = _as_float64(tokens, "tokens", "V")  # (V, C)
    p = _as_float64(table)  # (N, C)
    if x.shape[1] != p.shape[1]:
        raise ValueError(
            f"tokens and table must have the same width C, got shapes {tuple(x.shape)} and {tuple(p.shape)}"
        )
    if x.device != p.device:
        raise ValueError(f"tokens and table must be on the same device, got {x.device} and {p.device}")
    if not isinstance(scale, Real) or isinstance(scale, bool) or not 0 <= scale < math.inf:
        raise ValueError(f"scale must be a finite real number >= 0, got {scale!r}")
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    num_tokens, num_positions = x.shape[0], p.shape[0]
    tok = torch.arange(num_tokens, device=x.device).repeat_interleave(num_positions)  # (V N,): v of each pair
    pos = torch.arange(num_positions, device=x.device).repeat(num_tokens)  # (V N,): n of each pair
    h = x[tok] + float(scale) * p[pos]  # (V N, C)
    if readout == "nearest":
        found = torch.cdist(h, x).argmin(dim=1)  # (V N,)
    else:
        design = torch.cat([h, h.new_ones(len(h), 1)], dim=1)  # (V N, C + 1), the last column for the bias
        moments = design.new_zeros(design.shape[1], num_tokens).index_add_(1, tok, design.T)  # X^T Y: (C + 1, V)
        weights = torch.linalg.pinv(design.T @ design, hermitian=True) @ moments  # (C + 1, V)
        found = (design @ weights).argmax(dim=1)  # (V N,)
    return float((found == tok).double().mean())
