"""The key/value cache of incremental decoding: what each layer has computed for earlier tokens.

When a decoder generates one token at a time, the keys and values of the tokens before it do not
change, so each layer stores them once and every new query attends to the stored ones plus its own.
What is stored is exactly what attention reads: the keys *after* the position method's query/key
transform. For RoPE that means keys rotated by their own positions; a new query at position ``m`` is
rotated by ``m`` and ``<R_m q, R_n k> = <q, R_{n-m} k>`` holds with the stored ``R_n k`` as it is, so
nothing in the cache is ever rotated again. Methods that add a bias read the positions of the
cached keys (:attr:`KVCache.positions`).

The cache is preallocated (``max_len`` slots) and explicit. Decoding a step takes one call by the
model and one per layer, in a state that cannot be skipped: :meth:`KVCache.reserve` opens the step
with the new tokens' positions, each layer stores its keys and values once with
:meth:`KVCache.update`, and the step closes by itself when the last layer has written (nothing
is cached before that). Opening a step before every layer of the previous one has written, writing
a layer twice in a step, or writing outside a step raises ``ValueError``, as does exceeding
``max_len``. :meth:`posenc.lab.lm.TinyLM.forward` does all of this when it is given a cache.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor


class KVCache:
    """Preallocated keys, values and key positions for ``n_layer`` attention layers.

    One decoding step (``T`` new tokens) is ``reserve(positions)`` then ``update(layer, k, v)`` for
    every layer, in any order; the ``T`` tokens count as cached (:attr:`length` grows by ``T``)
    when the last layer has written::

        key_positions = cache.reserve(positions)         # (S,) = earlier tokens' positions + the new ones
        for layer in range(n_layer):
            k_all, v_all = cache.update(layer, k, v)      # (B, H, S, D): attend to these

    Args:
        n_layer: number of layers.
        batch: batch size ``B``.
        n_head: key/value heads ``H`` (with grouped-query attention, the number of key heads).
        max_len: number of slots (the longest sequence the cache can hold).
        head_dim: ``D``.
        dtype: dtype of the stored keys and values (that of the model's activations).
        device: device of the buffers.

    Attributes:
        k, v: ``(n_layer, B, H, max_len, D)`` buffers; slots ``0 .. length-1`` are filled.
        positions: ``(max_len,)`` int64 positions of the cached tokens, shared by every row.
        row_positions: ``None``, or ``(B, max_len)`` int64 positions per batch row once a step has
            given them per row (a left-padded batch: each row counts its positions after its padding).
        length: number of cached tokens (those of finished steps).

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
        self.row_positions: Optional[Tensor] = None
        self.length = 0
        self.max_len = max_len
        self.n_layer = n_layer
        self._step: Optional[int] = None  # T of the open step, None between steps
        self._written: set[int] = set()  # layers that have written in the open step

    @property
    def in_step(self) -> bool:
        """``True`` while a step is open (reserved, and not yet written by every layer)."""
        return self._step is not None

    def reserve(self, positions: Tensor) -> Tensor:
        """Open a step: record the positions of ``T`` new tokens; return the positions of all keys.

        ``positions`` is ``(T,)`` (the same in every row) or ``(B, T)`` (per batch row, for the
        position methods that take them: RoPE, ALiBi, T5). Returns ``(S,)``, ``S = length + T``: the
        cached tokens' positions followed by the new ones; ``(B, S)`` once any step has given
        positions per row (:attr:`row_positions`).

        Raises:
            TypeError: ``positions`` that is not an integer tensor.
            ValueError: ``positions`` that is not ``(T,)`` or ``(B, T)`` or is empty, new tokens that
                do not fit in the cache, or a step still open (a layer of the previous step has not
                written).
        """
        if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or positions.dtype == torch.bool:
            raise TypeError(f"positions must be an integer tensor, got {getattr(positions, 'dtype', type(positions).__name__)}")
        B = self.k.shape[1]
        if positions.numel() == 0 or not (positions.dim() == 1 or (positions.dim() == 2 and positions.shape[0] == B)):
            raise ValueError(
                f"positions must be a non-empty (T,) or, per batch row, ({B}, T) tensor; got shape {tuple(positions.shape)}"
            )
        if self._step is not None:
            missing = sorted(set(range(self.n_layer)) - self._written)
            raise ValueError(
                f"the previous step ({self._step} tokens) is still open: layers {missing} of {self.n_layer} have not "
                "written their keys with update(); write them, or call cancel_step() to drop the step"
            )
        T = positions.shape[-1]
        if self.length + T > self.max_len:
            raise ValueError(
                f"KV cache is full: it holds {self.length} of max_len={self.max_len} tokens and "
                f"cannot take {T} more; build a larger cache"
            )
        end = self.length + T
        if positions.dim() == 2 and self.row_positions is None:  # from now on per row, the shared ones copied
            self.row_positions = self.positions.expand(B, -1).clone()
        if self.row_positions is not None:
            self.row_positions[:, self.length : end] = positions.to(self.positions.device)  # (T,) broadcasts
        else:
            self.positions[self.length : end] = positions.to(self.positions.device)
        self._step, self._written = T, set()
        return self.positions[:end] if self.row_positions is None else self.row_positions[:, :end]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store layer ``layer``'s keys/values ``(B, H, T, D)`` of the open step after the cached ones.

        The last layer to write closes the step: :attr:`length` grows by ``T``.

        Returns:
            ``(k_all, v_all)``, each ``(B, H, S, D)`` with ``S = length + T``: views of the cache.

        Raises:
            ValueError: no open step (call :meth:`reserve` first), a layer outside ``0 .. n_layer-1``
                or written twice in the step, or shapes or dtypes that do not match the cache and the
                step.
        """
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layer:
            raise ValueError(f"layer must be an int in 0..{self.n_layer - 1}, got {layer!r}")
        if self._step is None:
            raise ValueError("no open step: call reserve(positions) with the new tokens' positions before update()")
        if layer in self._written:
            raise ValueError(f"layer {layer} has already written its keys in this step")
        B, H, T, D = k.shape
        if (B, H, D) != (self.k.shape[1], self.k.shape[2], self.k.shape[4]) or v.shape != k.shape:
            raise ValueError(
                f"k/v of shapes {tuple(k.shape)}/{tuple(v.shape)} do not fit a cache of (B, H, D) = "
                f"{(self.k.shape[1], self.k.shape[2], self.k.shape[4])}"
            )
        if k.dtype != self.k.dtype or v.dtype != self.k.dtype:
            raise ValueError(
                f"k/v of dtype {k.dtype}/{v.dtype} do not match the cache's {self.k.dtype} (it would convert them "
                "silently); build the cache with the model's dtype"
            )
        if T != self._step:
            raise ValueError(f"k/v hold T={T} new tokens but the step reserved {self._step}")
        end = self.length + T
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        k_all, v_all = self.k[layer, :, :, :end], self.v[layer, :, :, :end]
        self._written.add(layer)
        if len(self._written) == self.n_layer:  # every layer has written: the step is cached
            self.length, self._step, self._written = end, None, set()
        return k_all, v_all

    def cancel_step(self) -> None:
        """Close the open step without caching its tokens (after an error in one of the layers).

        What its layers wrote lies past :attr:`length` and is overwritten by the next step.
        """
        self._step, self._written = None, set()

    def reset(self) -> None:
        """Forget every cached token, any open step and positions per row (the buffers are kept)."""
        self.length, self._step, self._written, self.row_positions = 0, None, set(), None

    def nbytes(self) -> int:
        """Memory held by the key and value buffers, in bytes."""
        return self.k.numel() * self.k.element_size() * 2


def cache_for(model, batch: int, max_len: Optional[int] = None, *, dtype: Optional[torch.dtype] = None) -> KVCache:
    """An empty :class:`KVCache` sized for ``model`` (a :class:`posenc.lab.lm.TinyLM`), on its device."""
    cfg = model.config
    p = next(model.parameters())
    return KVCache(
        cfg.n_layer, batch, cfg.n_head, max_len or cfg.max_len, cfg.d_model // cfg.n_head,
        dtype=dtype or p.dtype, device=p.device,
    )
