"""A tiny decoder-only Transformer language model with a pluggable position method.

Pre-LayerNorm GPT blocks (Radford et al. 2019; the layout of nanoGPT), byte vocabulary by
default, tied input/output embeddings. Position enters only through the
:class:`~posenc.method.PositionMethod` given to the constructor, so every chapter trains the
same model and changes one argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.attention import BACKENDS, SelfAttention, check_logn_length
from posenc.kv_cache import KVCache
from posenc.method import PositionMethod, build_method, check_positions


@dataclass
class LMConfig:
    """Size of the tiny LM. Defaults train in about a minute on two CPU cores."""

    vocab_size: int = 256  #: vocabulary size V (bytes)
    d_model: int = 64  #: model width C
    n_layer: int = 2  #: number of Transformer blocks
    n_head: int = 4  #: heads per block H (head dim D = C / H)
    max_len: int = 128  #: training context length; finite position tables are sized from it
    mlp_ratio: int = 4  #: MLP hidden width = mlp_ratio * C
    dropout: float = 0.0  #: dropout after attention and MLP (0 keeps training deterministic)
    attn_backend: str = "sdpa"  #: "sdpa" or "reference" (see posenc.attention.attention)
    seed: int = 0  #: seed of the parameter initialisation (does not touch the global RNG)
    #: the training length L of log-n attention scaling, which multiplies the query at position n by
    #: max(1, log(n + 1) / log L) (posenc.attention.logn_query_scale); None turns it off. It is the
    #: identity up to L, so it changes nothing in training on windows of at most L tokens.
    logn_length: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layer", "n_head", "max_len", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LMConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"LMConfig.n_head={self.n_head} must divide d_model={self.d_model}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LMConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.attn_backend not in BACKENDS:
            raise ValueError(f"LMConfig.attn_backend must be one of {BACKENDS}, got {self.attn_backend!r}")
        check_logn_length(self.logn_length, "LMConfig.logn_length")

    @property
    def head_dim(self) -> int:
        """``D = C / H``."""
        return self.d_model // self.n_head


class Block(nn.Module):
    """Pre-LN Transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: LMConfig):
        super().__init__()
        c = config.d_model
        self.ln1 = nn.LayerNorm(c)
        self.attn = SelfAttention(c, config.n_head, backend=config.attn_backend, logn_length=config.logn_length)
        self.ln2 = nn.LayerNorm(c)
        self.mlp = nn.Sequential(
            nn.Linear(c, config.mlp_ratio * c, bias=False),
            nn.GELU(),
            nn.Linear(config.mlp_ratio * c, c, bias=False),
        )
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, positions, method, layer, key_padding_mask=None, return_weights=False, cache=None, key_positions=None):
        out = self.attn(
            self.ln1(x), positions, method, layer=layer, key_padding_mask=key_padding_mask,
            return_weights=return_weights, cache=cache, key_positions=key_positions,
        )
        a, w = out if return_weights else (out, None)
        x = x + self.drop(a)  # (B, T, C)
        x = x + self.drop(self.mlp(self.ln2(x)))  # (B, T, C)
        return x, w


class TinyLM(nn.Module):
    """Decoder-only Transformer LM whose only source of position is ``position``.

    Args:
        config: model size (:class:`LMConfig`).
        position: a :class:`~posenc.method.PositionMethod`, or the name of a registered one
            (see :data:`posenc.method.METHODS`), built for ``config``.

    Raises:
        TypeError: if ``position`` is neither a method nor a string.
        ValueError: if the name is not registered.
    """

    def __init__(self, config: LMConfig, position: Union[PositionMethod, str] = "nope"):
        super().__init__()
        if not isinstance(config, LMConfig):
            raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
        if not isinstance(position, (PositionMethod, str)):
            raise TypeError(f"position must be a PositionMethod or a registered name, got {type(position).__name__}")
        self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            if isinstance(position, str):  # a method built here is seeded with the model
                position = build_method(position, config)
            self.tok = nn.Embedding(config.vocab_size, config.d_model)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.d_model)
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
            self.head.weight = self.tok.weight  # weight tying
            self.apply(self._init_weights)
            for block in self.blocks:  # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer)
                std = 0.02 / math.sqrt(2 * config.n_layer)
                nn.init.normal_(block.attn.proj.weight, std=std)
                nn.init.normal_(block.mlp[2].weight, std=std)
            self.position = position

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(
        self,
        idx: Tensor,
        positions: Optional[Tensor] = None,
        *,
        key_padding_mask: Optional[Tensor] = None,
        return_weights: bool = False,
        cache: Optional[KVCache] = None,
    ) -> Union[Tensor, tuple[Tensor, list[Tensor]]]:
        """Next-token logits for every position.

        Args:
            idx: ``(B, T)`` token ids.
            positions: ``(T,)`` integer positions; default ``0 .. T-1``, or with a cache
                ``cache.length .. cache.length + T - 1``.
            key_padding_mask: optional ``(B, S)`` bool, ``True`` at padding tokens (``S`` = all keys:
                ``T``, or ``cache.length + T`` with a cache).
            return_weights: also return the attention weights of every layer.
            cache: optional :class:`~posenc.kv_cache.KVCache` (see :func:`posenc.kv_cache.cache_for`)
                holding earlier tokens; ``idx`` are the next tokens. Decoding one token at a time
                gives the same logits as one call on the whole sequence.

        Returns:
            ``(B, T, V)`` logits; with ``return_weights``, also a list of ``n_layer`` tensors
            ``(B, H, T, T)``.

        Raises:
            TypeError: if ``idx`` is not an integer tensor.
            ValueError: ``idx`` not of shape ``(B, T)``, ids outside the vocabulary, positions that do
                not match ``T`` or fall outside what the position method covers, a full cache, or a
                cache with a method that cannot use one.
        """
        if not isinstance(idx, Tensor) or idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise TypeError(f"idx must be an integer tensor of token ids, got {getattr(idx, 'dtype', type(idx))}")
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        B, T = idx.shape
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size):
            raise ValueError(f"idx must be in 0..{self.config.vocab_size - 1}, got range {int(idx.min())}..{int(idx.max())}")
        if positions is None:
            start = 0 if cache is None else cache.length
            positions = torch.arange(start, start + T, device=idx.device)
        check_positions(positions)
        if positions.numel() != T:
            raise ValueError(f"positions has {positions.numel()} entries but idx has T={T}")
        self.position.check(positions)
        if cache is not None and not self.position.supports_kv_cache:
            raise ValueError(f"{type(self.position).__name__} cannot be used with a KV cache (supports_kv_cache is False)")
        x = self.tok(idx)  # (B, T, C)
        x = self.position.transform_input(x, positions)  # (B, T, C)
        key_positions = None if cache is None else cache.reserve(positions)  # (S,)
        weights = []
        try:
            for layer, block in enumerate(self.blocks):
                x, w = block(x, positions, self.position, layer, key_padding_mask, return_weights, cache, key_positions)
                weights.append(w)
        except BaseException:
            if cache is not None:  # the step's tokens are not cached; the cache stays usable
                cache.cancel_step()
            raise
        logits = self.head(self.ln_f(x))  # (B, T, V)
        return (logits, weights) if return_weights else logits

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def next_token_loss(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy (nats) of next-token predictions.

    Args:
        logits: ``(B, T, V)``.
        targets: ``(B, T)`` the token that follows each input token.
        reduction: ``"mean"`` (scalar) or ``"none"`` (``(B, T)``, the loss at every position).

    Returns:
        Scalar or ``(B, T)`` loss in nats, computed in fp32 or wider.
    """
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree on (B, T)")
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    B, T, V = logits.shape
    work = torch.promote_types(logits.dtype, torch.float32)
    loss = F.cross_entropy(logits.reshape(B * T, V).to(work), targets.reshape(B * T), reduction=reduction)
    return loss if reduction == "mean" else loss.view(B, T)
