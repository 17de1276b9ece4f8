"""Multimodal RoPE (M-RoPE): each frequency pair turns with one of three position axes.

Qwen2-VL (Wang et al. 2024, arXiv:2409.12191, §2.1) gives every token three positions: temporal,
height and width. A text token has the same value on all three; an image patch has the frame, row
and column of its place in the grid. The head's ``R/2`` frequency pairs are split into three
sections ``(t, h, w)`` (``mrope_section`` in the config, e.g. ``(16, 24, 24)`` for a head of 128):
pairs of the first section turn with the temporal position, the next with the height and the last
with the width. The frequencies themselves are RoFormer's (or a scaling's), unchanged.

Two arrangements are in use, both Hugging Face's:

* contiguous (Qwen2-VL, Qwen2.5-VL): pairs ``0 .. t-1`` temporal, ``t .. t+h-1`` height, the rest
  width;
* interleaved (Qwen3-VL, ``mrope_interleaved``): pairs ``1, 4, 7, ...`` (the first ``h`` of them)
  height, ``2, 5, 8, ...`` (the first ``w``) width, every other pair temporal, so that each axis
  has both high and low frequencies.

For a text token (three equal positions) either arrangement is exactly plain RoPE. The rotation is
:func:`~posenc.rope.rotation.apply_rope` with the ``"half"`` layout; only cos and sin differ.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posenc.rope.rotation import rope_cos_sin


def mrope_axes(pairs: int, sections: Sequence[int], interleaved: bool = False) -> Tensor:
    """The position axis (0 temporal, 1 height, 2 width) each frequency pair turns with.

    Args:
        pairs: ``R/2``, the number of frequency pairs.
        sections: ``(t, h, w)``, pairs per axis; they sum to ``pairs``.
        interleaved: Qwen3-VL's arrangement instead of Qwen2-VL's (see the module docstring).

    Returns:
        ``(R/2,)`` int64.

    Raises:
        ValueError: ``sections`` not three non-negative ints summing to ``pairs``; an interleaved
            arrangement whose height or width pairs do not fit.
    """
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs must be a positive int, got {pairs!r}")
    if (isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence) or len(sections) != 3
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in sections)):
        raise ValueError(f"sections must be three non-negative ints (temporal, height, width), got {sections!r}")
    if sum(sections) != pairs:
        raise ValueError(f"sections {tuple(sections)} must sum to the number of frequency pairs R/2 = {pairs}")
    if not interleaved:
        return torch.repeat_interleave(torch.arange(3), torch.tensor(list(sections)))
    t, h, w = sections
    if max(3 * h - 2, 3 * w - 1) > pairs:
        raise ValueError(f"interleaved sections {tuple(sections)} do not fit in {pairs} pairs (height and width take every third)")
    axes = torch.zeros(pairs, dtype=torch.long)
    axes[1 : 3 * h : 3] = 1
    axes[2 : 3 * w : 3] = 2
    return axes


def mrope_cos_sin(
    positions: Tensor,
    inv_freq: Tensor,
    sections: Sequence[int],
    *,
    interleaved: bool = False,
    attention_scale: float = 1.0,
    arithmetic: str = "exact",
) -> tuple[Tensor, Tensor]:
    """cos and sin of M-RoPE's angles: pair ``i`` at ``positions[axis_i] * inv_freq[i]``.

    Args:
        positions: ``(3, ...)``, e.g. ``(3, T)`` or ``(3, B, T)``: the temporal, height and width
            positions of each token (Hugging Face's ``position_ids`` of Qwen2-VL).
        inv_freq: ``(R/2,)`` frequencies (:func:`~posenc.rope.frequencies.inverse_frequencies`).
        sections: ``(t, h, w)``, the config's ``mrope_section``; sums to ``R/2``.
        interleaved: Qwen3-VL's arrangement (``mrope_interleaved``).
        attention_scale: multiplies cos and sin, as in :func:`~posenc.rope.rotation.rope_cos_sin`.
        arithmetic: of the angles, as in :func:`~posenc.rope.rotation.rope_cos_sin`.

    Returns:
        ``(cos, sin)``, float32, each ``positions.shape[1:] + (R/2,)``: what
        :func:`~posenc.rope.rotation.apply_rope` takes (``"half"`` layout).

    Raises:
        TypeError: as :func:`~posenc.rope.rotation.rope_cos_sin`.
        ValueError: ``positions`` whose first dimension is not 3; bad ``sections``.
    """
    if not isinstance(positions, Tensor) or positions.dim() < 2 or positions.shape[0] != 3:
        got = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
        raise ValueError(f"positions must have shape (3, ..., T): temporal, height and width positions; got {got}")
    cos3, sin3 = rope_cos_sin(positions, inv_freq, attention_scale, arithmetic=arithmetic)  # (3, ..., R/2) each
    axes = mrope_axes(cos3.shape[-1], sections, interleaved).to(cos3.device)  # (R/2,)
    index = axes.expand(1, *cos3.shape[1:])  # (1, ..., R/2)
    return cos3.gather(0, index).squeeze(0), sin3.gather(0, index).squeeze(0)
