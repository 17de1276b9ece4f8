"""The key/value cache of incremental decoding: what each layer has computed for earlier tokens.

When a decoder generates one token at a time, the keys and values of the tokens before it do not
change, so each layer stores them once and every new query attends to the stored ones plus its own.
What is stored is exactly what attention reads: the keys *after* the position method's query/key
transform. For RoPE that means keys rotated by their own positions; a new query at position ``m`` is
rotated by ``m`` and ``<R_m q, R_n k> = <q, R_{n-m} k>`` holds with the stored ``R_n k`` as it is, so
nothing in the cache is ever rotated again. Methods that add a bias read the positions of the
cached keys (:attr:`KVCache.positions`).

The cache is preallocated (``max_len`` slots) and explicit: :meth:`posenc.lm.TinyLM.forward` writes
the new tokens' keys and values with :meth:`KVCache.update` in every layer, then calls
:meth:`KVCache.advance`. Exceeding ``max_len`` raises ``ValueError``.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor


class KVCache:
    """Preallocated keys, values and key positions for ``n_layer`` attention layers.

    Args:
        n_layer: number of layers.
        batch: batch size ``B``.
        n_head: heads ``H``.
        max_len: number of slots (the longest sequence the cache can hold).
        head_dim: ``D``.
        dtype: dtype of the stored keys and values (that of the model's activations).
        device: device of the buffers.

    Attributes:
        k, v: ``(n_layer, B, H, max_len, D)`` buffers; slots ``0 .. length-1`` are filled.
        positions: ``(max_len,)`` int64 positions of the cached tokens.
        length: number of filled slots.

    Raises:
        ValueError: non-positive sizes.
    """

    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: Union[torch.device, str, None] = None,
    ):
        for name, value in (("n_layer", n_layer), ("batch", batch), ("n_head", n_head), ("max_len", max_len), ("head_dim", head_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        shape = (n_layer, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.zeros(max_len, dtype=torch.long, device=device)
        self.length = 0
        self.max_len = max_len

    def reserve(self, positions: Tensor) -> Tensor:
        """Record the positions of ``T`` new tokens; return all ``(S,)`` key positions, ``S = length + T``.

        Raises:
            ValueError: if the new tokens do not fit in the cache.
        """
        T = positions.numel()
        if self.length + T > self.max_len:
            raise ValueError(
                f"KV cache is full: it holds {self.length} of max_len={self.max_len} tokens and "
                f"cannot take {T} more; build a larger cache"
            )
        self.positions[self.length : self.length + T] = positions.to(self.positions.device)
        return self.positions[: self.length + T]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store layer ``layer``'s keys/values ``(B, H, T, D)`` of the new tokens after the cached ones.

        Returns:
            ``(k_all, v_all)``, each ``(B, H, S, D)`` with ``S = length + T``: views of the cache.

        Raises:
            ValueError: shapes that do not match the cache, or a full cache.
        """
        B, H, T, D = k.shape
        if (B, H, D) != (self.k.shape[1], self.k.shape[2], self.k.shape[4]) or v.shape != k.shape:
            raise ValueError(
                f"k/v of shapes {tuple(k.shape)}/{tuple(v.shape)} do not fit a cache of (B, H, D) = "
                f"{(self.k.shape[1], self.k.shape[2], self.k.shape[4])}"
            )
        if self.length + T > self.max_len:
            raise ValueError(f"KV cache is full ({self.length} + {T} > max_len={self.max_len})")
        end = self.length + T
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, T: int) -> None:
        """Mark the ``T`` tokens written by :meth:`reserve`/:meth:`update` as cached."""
        self.length += T

    def reset(self) -> None:
        """Forget every cached token (the buffers are kept)."""
        self.length = 0

    def nbytes(self) -> int:
        """Memory held by the key and value buffers, in bytes."""
        return self.k.numel() * self.k.element_size() * 2


def cache_for(model, batch: int, max_len: Optional[int] = None, *, dtype: Optional[torch.dtype] = None) -> KVCache:
    """An empty :class:`KVCache` sized for ``model`` (a :class:`posenc.lm.TinyLM`), on its device."""
    cfg = model.config
    p = next(model.parameters())
    return KVCache(
        cfg.n_layer, batch, cfg.n_head, max_len or cfg.max_len, cfg.d_model // cfg.n_head,
        dtype=dtype or p.dtype, device=p.device,
    )
