"""The one small interface every position method implements, and the table of methods.

A position method can act at any of the three places position enters a Transformer
(source 002 §1.3); it overrides only the hooks it needs and inherits the identity for the rest:

=====================  ====================================================  ========================
hook                   what it changes                                       examples
=====================  ====================================================  ========================
``transform_input``    token embeddings ``(B, T, C)``, once                  sinusoidal, learned
``transform_qk``       queries ``(B, H, T, D)`` and keys ``(B, H, S, D)``    RoPE
``attention_bias``     attention logits, via a tensor broadcastable          ALiBi, T5, Shaw
                       to ``(B, H, T, S)``, in every layer                   (keys), Transformer-XL,
                                                                             DeBERTa, TUPE
``value_term``         attention outputs ``(B, H, T, D)``: adds              Shaw (values)
                       ``sum_s weights[t, s] * a[t, s]``
=====================  ====================================================  ========================

``attention_bias_fn`` is an optional second form of ``attention_bias`` for the flex backend of
:func:`posenc.attention.attention`: the same bias as a function of ``(b, h, q_idx, kv_idx)``, so
that no ``T x S`` tensor is built. Methods that do not provide it still run on that backend (their
materialised bias is read inside the kernel).

Methods are ``nn.Module`` only so that they can hold parameters or buffers; the math lives in
pure functions next to each method. :data:`~posenc.method.METHODS` maps a name to a factory that builds the
method for a model configuration, so experiments can loop over every method with no special
cases::

    model = TinyLM(cfg, build_method("binary", cfg))
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import torch
from torch import Tensor, nn


class ModelShape(Protocol):
    """What a method factory may read from a model configuration (see :class:`posenc.lab.lm.LMConfig`)."""

    d_model: int
    n_head: int
    n_layer: int
    max_len: int


def check_positions(
    positions: Tensor, name: str = "positions", max_positions: Optional[int] = None, *, per_row: bool = False
) -> None:
    """Validate a vector of integer positions (or, with ``per_row``, one row of them per sequence).

    Args:
        positions: ``(N,)`` integer tensor of positions; with ``per_row`` also ``(B, N)``.
        name: the argument name used in error messages.
        max_positions: if given, every position must be ``< max_positions``.
        per_row: accept ``(B, N)``: positions per batch row (a left-padded row, or packed sequences).

    Raises:
        TypeError: if ``positions`` is not an integer tensor.
        ValueError: if it is not 1-D (or 2-D with ``per_row``), has a negative entry, or exceeds
            ``max_positions``.
    """
    if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or positions.dtype == torch.bool:
        got = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
        raise TypeError(f"{name} must be an integer tensor, got {got}")
    if positions.dim() != 1 and not (per_row and positions.dim() == 2):
        allowed = "(N,) or per batch row (B, N)" if per_row else "1-D (N,)"
        raise ValueError(f"{name} must be {allowed}, got shape {tuple(positions.shape)}")
    if positions.numel() == 0:
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0:
        raise ValueError(f"{name} must be non-negative, got minimum {lo}")
    if max_positions is not None and hi >= max_positions:
        raise ValueError(
            f"{name} has maximum {hi}, but this method only covers positions 0..{max_positions - 1} "
            f"(max_positions={max_positions}); it does not wrap or clamp"
        )


class PositionMethod(nn.Module):
    """Base class of position methods: the identity at all three hooks (that is, no position).

    Subclasses override one or more hooks. ``max_positions`` is ``None`` for methods defined at
    every position, or the size of a finite table; :meth:`check` enforces it.
    """

    #: Number of positions the method covers, or ``None`` if it is defined everywhere.
    max_positions: Optional[int] = None
    #: Whether the hooks take positions per batch row, ``(B, T)`` and ``(B, S)``, besides ``(T,)``.
    per_row_positions: bool = False

    def check(self, positions: Tensor, name: str = "positions") -> None:
        """Raise ``ValueError`` if ``positions`` is outside what this method covers."""
        check_positions(positions, name, self.max_positions, per_row=self.per_row_positions)

    def transform_input(self, x: Tensor, positions: Tensor) -> Tensor:
        """Put position into the token embeddings.

        Args:
            x: ``(B, T, C)`` token embeddings.
            positions: ``(T,)`` integer positions of the tokens.

        Returns:
            ``(B, T, C)``, same dtype and device as ``x``.
        """
        return x

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        """Put position into queries and keys.

        Args:
            q: ``(B, H, T, D)`` queries.
            k: ``(B, H, S, D)`` keys.
            q_positions: ``(T,)`` query positions.
            k_positions: ``(S,)`` key positions.
            layer: index of the attention layer (for methods with per-layer parameters).

        Returns:
            ``(q, k)`` with unchanged shapes.
        """
        return q, k

    def attention_bias(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, layer: int
    ) -> Optional[Tensor]:
        """Return an additive bias for the attention logits, or ``None`` for no bias.

        Args: as :meth:`~posenc.method.PositionMethod.transform_qk`.

        Returns:
            ``None`` or a tensor broadcastable to ``(B, H, T, S)``; entry ``[..., t, s]``
            may depend on the relative position ``k_positions[s] - q_positions[t]``.
        """
        return None

    def attention_bias_fn(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, layer: int
    ) -> Optional[Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]]:
        """Return :meth:`attention_bias` as a function ``fn(b, h, q_idx, kv_idx)``, or ``None``.

        ``q_idx``/``kv_idx`` index ``q_positions``/``k_positions``. The function must give the
        same values as :meth:`attention_bias` (tests check this for every method that has one)
        and must use only indexing and elementwise operations on its arguments (see
        :mod:`posenc.attention`). The default ``None`` means "materialise the bias".
        """
        return None

    #: ``False`` for methods whose encoding of a token changes as the sequence grows (a token's code
    #: depends on the final length), so that keys computed earlier cannot be cached.
    supports_kv_cache: bool = True

    #: ``True`` for methods with a :meth:`value_term`; their attention runs on the reference backend.
    needs_attention_weights: bool = False

    def value_term(self, weights: Tensor, q_positions: Tensor, k_positions: Tensor, layer: int) -> Tensor:
        """Position's contribution to the attention output (only if :attr:`~posenc.method.PositionMethod.needs_attention_weights`).

        Args:
            weights: ``(B, H, T, S)`` attention weights.
            q_positions, k_positions, layer: as :meth:`~posenc.method.PositionMethod.transform_qk`.

        Returns:
            ``(B, H, T, D)``, added to ``weights @ v``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no value term")

    def extra_repr(self) -> str:
        return "" if self.max_positions is None else f"max_positions={self.max_positions}"


class NoPE(PositionMethod):
    """No position information at all: the identity at every hook."""


Factory = Callable[[ModelShape], PositionMethod]

#: Name -> factory building the method for a model configuration. Filled by :func:`register_method`.
METHODS: dict[str, Factory] = {}


def register_method(name: str) -> Callable[[Factory], Factory]:
    """Decorator adding a factory to :data:`~posenc.method.METHODS` under ``name``.

    Raises:
        ValueError: if ``name`` is already registered.
    """

    def decorator(factory: Factory) -> Factory:
        if name in METHODS:
            raise ValueError(f"position method name {name!r} is already registered")
        METHODS[name] = factory
        return factory

    return decorator


def build_method(name: str, config: ModelShape) -> PositionMethod:
    """Build the position method registered as ``name`` for a model configuration.

    Raises:
        ValueError: if ``name`` is not registered (the message lists the registered names).
    """
    if name not in METHODS:
        raise ValueError(f"unknown position method {name!r}; registered methods: {sorted(METHODS)}")
    return METHODS[name](config)


register_method("nope")(lambda config: NoPE())
