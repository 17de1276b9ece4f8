"""Naive absolute position codes: the raw integer, the normalised position, and the binary code.

These are the first ideas one has (the design story of source 001, which follows them to the
sinusoidal table), and chapter 1 shows what is wrong with each. Each code is a pure function
``(positions, dim, ...) -> (N, dim)``; each has a :class:`~posenc.method.PositionMethod` that
adds it to the token embeddings.

A scalar code ``c(t)`` (integer, normalised) needs a direction in the ``dim``-dimensional space:

* ``direction="ones"`` adds ``c(t)`` to every coordinate. LayerNorm subtracts the mean over
  coordinates, so it removes this code completely: a pre-LN Transformer never sees it.
* ``direction="alternating"`` adds ``+c(t), -c(t), +c(t), ...``: zero mean over coordinates,
  so LayerNorm keeps it. This is the default.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.method import PositionMethod, check_positions, register_method

DIRECTIONS = ("alternating", "ones")


def _check_dim(dim: int) -> None:
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise ValueError(f"dim must be a positive int, got {dim!r}")


def _direction(dim: int, direction: str, dtype: torch.dtype, device) -> Tensor:
    if direction == "ones":
        return torch.ones(dim, dtype=dtype, device=device)  # (dim,)
    if direction == "alternating":
        signs = torch.ones(dim, dtype=dtype, device=device)
        signs[1::2] = -1.0
        return signs  # (dim,)
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def integer_code(
    positions: Tensor, dim: int, *, direction: str = "alternating", dtype: torch.dtype = torch.float32
) -> Tensor:
    """The raw integer position ``t`` written into every coordinate (with the sign pattern of ``direction``).

    Args:
        positions: ``(N,)`` integer positions.
        dim: code width.
        direction: ``"alternating"`` (``+t, -t, ...``) or ``"ones"`` (``t, t, ...``).
        dtype: floating dtype of the result.

    Returns:
        ``(N, dim)``; row ``n`` has every entry of magnitude ``positions[n]``.

    Raises:
        TypeError: if ``positions`` is not an integer tensor.
        ValueError: invalid positions, ``dim`` or ``direction``.
    """
    check_positions(positions)
    _check_dim(dim)
    u = _direction(dim, direction, dtype, positions.device)
    return positions.to(dtype)[:, None] * u  # (N, dim)


def normalized_code(
    positions: Tensor,
    dim: int,
    length: int,
    *,
    direction: str = "alternating",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The position divided by the last position of the sequence, ``t / (length - 1)``, in ``[0, 1]``.

    The same position gets a different code in sequences of different lengths (and the code of an
    early token reveals the length of the whole sequence). For ``length == 1`` the code is 0.

    Args:
        positions: ``(N,)`` integer positions, each ``< length``.
        dim: code width.
        length: number of tokens of the sequence the positions belong to.
        direction: as in :func:`integer_code`.
        dtype: floating dtype of the result.

    Returns:
        ``(N, dim)``.

    Raises:
        TypeError: if ``positions`` is not an integer tensor.
        ValueError: invalid positions, ``dim``, ``direction``, or ``length`` not above every position.
    """
    check_positions(positions)
    _check_dim(dim)
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    if positions.numel() and int(positions.max()) >= length:
        raise ValueError(f"every position must be < length={length}, got maximum {int(positions.max())}")
    u = _direction(dim, direction, dtype, positions.device)
    return (positions.to(dtype) / max(length - 1, 1))[:, None] * u  # (N, dim)


def binary_code(
    positions: Tensor, dim: int, *, num_bits: int | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The binary digits of the position, least significant bit in column 0, zeros after ``num_bits``.

    Args:
        positions: ``(N,)`` integer positions, each ``< 2**num_bits``.
        dim: code width.
        num_bits: number of bit columns (default ``min(dim, 62)``); at most ``dim`` and at most 62.
        dtype: floating dtype of the result.

    Returns:
        ``(N, dim)`` with entries in ``{0, 1}``: ``code[n, j] = (positions[n] >> j) & 1`` for ``j < num_bits``.

    Raises:
        TypeError: if ``positions`` is not an integer tensor.
        ValueError: invalid positions or ``dim``; ``num_bits`` out of range; a position that needs
            more than ``num_bits`` bits (its code would collide with a smaller position's).
    """
    check_positions(positions)
    _check_dim(dim)
    num_bits = min(dim, 62) if num_bits is None else num_bits
    if not isinstance(num_bits, int) or not 1 <= num_bits <= min(dim, 62):
        raise ValueError(f"num_bits must be an int in 1..min(dim, 62) = 1..{min(dim, 62)}, got {num_bits!r}")
    if positions.numel() and int(positions.max()) >= 2**num_bits:
        raise ValueError(
            f"position {int(positions.max())} needs more than num_bits={num_bits} bits "
            f"(largest representable: {2**num_bits - 1})"
        )
    bits = torch.arange(num_bits, device=positions.device)
    code = torch.zeros(positions.numel(), dim, dtype=dtype, device=positions.device)
    code[:, :num_bits] = ((positions.long()[:, None] >> bits) & 1).to(dtype)  # (N, num_bits)
    return code  # (N, dim)


class _AdditiveCode(PositionMethod):
    """Adds ``scale * code`` ``(T, C)`` to the token embeddings."""

    def __init__(self, dim: int, scale: float = 1.0):
        super().__init__()
        _check_dim(dim)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
            raise ValueError(f"scale must be a positive number, got {scale!r}")
        self.dim, self.scale = dim, float(scale)

    def code(self, positions: Tensor, dtype: torch.dtype) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def transform_input(self, x: Tensor, positions: Tensor) -> Tensor:
        self.check(positions)
        if x.shape[-1] != self.dim:
            raise ValueError(f"x has width {x.shape[-1]} but this method was built for dim={self.dim}")
        code = self.scale * self.code(positions.to(x.device), torch.float32)  # (T, C), computed in fp32
        return x + code.to(x.dtype)  # (B, T, C)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, scale={self.scale:g}" + (f", {super().extra_repr()}" if self.max_positions else "")


class IntegerPE(_AdditiveCode):
    """Adds ``scale * integer_code(positions, dim)`` to the token embeddings."""

    def __init__(self, dim: int, *, direction: str = "alternating", scale: float = 1.0):
        super().__init__(dim, scale)
        _direction(1, direction, torch.float32, None)  # validate early
        self.direction = direction

    def code(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        return integer_code(positions, self.dim, direction=self.direction, dtype=dtype)


class NormalizedPE(_AdditiveCode):
    """Adds ``scale * normalized_code(...)``, the sequence length taken as ``max(positions) + 1``.

    Not usable with a KV cache: every token's code changes when the sequence grows.
    """

    supports_kv_cache = False

    def __init__(self, dim: int, *, direction: str = "alternating", scale: float = 1.0):
        super().__init__(dim, scale)
        _direction(1, direction, torch.float32, None)
        self.direction = direction

    def code(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        length = int(positions.max()) + 1 if positions.numel() else 1
        return normalized_code(positions, self.dim, length, direction=self.direction, dtype=dtype)


class BinaryPE(_AdditiveCode):
    """Adds ``scale * binary_code(...)``; covers positions ``0 .. 2**num_bits - 1``."""

    def __init__(self, dim: int, *, num_bits: int | None = None, scale: float = 1.0):
        super().__init__(dim, scale)
        self.num_bits = min(dim, 62) if num_bits is None else num_bits
        binary_code(torch.zeros(1, dtype=torch.long), dim, num_bits=self.num_bits)  # validate early
        self.max_positions = 2**self.num_bits

    def code(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        return binary_code(positions, self.dim, num_bits=self.num_bits, dtype=dtype)


@register_method("integer")
def _integer(config) -> PositionMethod:
    return IntegerPE(config.d_model)


@register_method("normalized")
def _normalized(config) -> PositionMethod:
    return NormalizedPE(config.d_model)


@register_method("binary")
def _binary(config) -> PositionMethod:
    # 16 bits (65,536 positions) or the model width if smaller: enough for any evaluation length
    # the book uses, and bits above log2(max_len) are never switched on in training.
    return BinaryPE(config.d_model, num_bits=min(config.d_model, 16))

