"""The interleaved rotation with each pair read as one machine word: the compiled CPU path.

Compiled for the CPU, :func:`~posenc.rope.rotation.apply_rope_eager` is slow in the interleaved
layout, where it reads the two members of a pair at a stride of two elements: the code generator
does not vectorise loads and stores at a stride (a bf16 rotation took about five times a copy of
``x``, an fp32 one 1.3 times). The two members of a pair are one word, though (32 bits for bf16
and fp16, 64 for fp32), and every load and store of whole words is contiguous.
:func:`rotate_words` takes ``x.view(torch.int32)`` (or ``torch.int64``), takes the two halves of
each word apart with integer shifts, converts them to fp32 exactly, rotates them with
:func:`~posenc.rope.rotation.apply_rope_eager`'s operations in its order, rounds each result to
nearest (ties to even) as a conversion to ``x``'s dtype does, and packs the two halves back into
one word. The bits are those of the eager function (the tests compare them, NaN payloads aside).
The half layout's pairs are elements ``R/2`` apart, which load contiguously already; it stays with
the eager function.

The 16-bit conversions are integer arithmetic on the bit patterns:

* **bf16** is the upper half of an fp32, so widening is a shift by 16, and rounding adds
  ``0x7FFF`` plus the lowest kept bit before the shift (ties to even); a NaN becomes ``0x7FC0``.
* **fp16** widens by moving exponent and mantissa up 13 bits and rebiasing the exponent by
  ``127 - 15`` (infinities and NaNs keep an all-ones exponent); a subnormal is its mantissa times
  ``2**-24``. Rounding to fp16 rebiases back and rounds the 13 dropped bits to nearest even; a
  result below fp16's normal range is ``|y| * 2**24`` rounded to an integer. (After F. Giesen's
  branch-free conversions, "Float->half variants", 2016; checked in the tests against PyTorch's
  conversions on every fp16 value and on every rounding boundary.)

Little-endian only: the first member of a pair is the low half of its word.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

#: dtypes of ``x`` :func:`rotate_words` takes, and the integer dtype of their words (a pair each).
WORD_DTYPES = {torch.bfloat16: torch.int32, torch.float16: torch.int32, torch.float32: torch.int64}

_LOW = 0xFFFF
_HIGH = -0x10000  # 0xFFFF0000 as an int32


def _f32(bits: Tensor) -> Tensor:
    return bits.view(torch.float32)


def _bits(y: Tensor) -> Tensor:
    return y.view(torch.int32)


def widen(h: Tensor, dtype: torch.dtype) -> Tensor:
    """fp32 values of the 16-bit patterns of ``dtype`` in the low halves of the int32 ``h``.

    Exact: the value ``torch.tensor(bits).view(dtype).float()`` gives, for every pattern.
    """
    if dtype == torch.bfloat16:
        return _f32(h << 16)
    em = (h & 0x7FFF) << 13  # exponent and mantissa, at fp32's mantissa position
    o = em + ((127 - 15) << 23)  # rebiased: right for normal numbers
    o = torch.where(em >= (0x1F << 23), o + ((128 - 16) << 23), o)  # inf and NaN: all-ones exponent
    # subnormals (exponent 0) are m * 2**-24 for their 10-bit mantissa m: exact in fp32, and computed
    # without a second reinterpretation of bits (the compiler's CPU code stores and reloads a vector
    # for each); the sign is applied by negation, which is exact (and gives -0.0 for -0.0)
    v = torch.where(em < (1 << 23), (h & 0x3FF).float() * 2.0**-24, _f32(o))
    return torch.where((h & 0x8000) != 0, -v, v)


def narrow(y: Tensor, dtype: torch.dtype) -> Tensor:
    """The 16-bit pattern of ``y`` (fp32) rounded to ``dtype``, in the low half of an int32 (upper half 0).

    Rounds to nearest, ties to even, as ``y.to(dtype)`` does; a NaN gives the canonical quiet NaN.
    """
    b = _bits(y)
    if dtype == torch.bfloat16:
        r = (b + (0x7FFF + ((b >> 16) & 1))) >> 16
        return torch.where(y != y, 0x7FC0, r & _LOW)
    sign = (b >> 16) & 0x8000
    a = b & 0x7FFFFFFF  # |y|'s bits
    # below 2**-14, fp16's subnormals count units of 2**-24: |y| * 2**24 (exact) rounded to the
    # nearest integer, ties to even
    small = (y.abs() * 2.0**24).round().to(torch.int32)
    odd = (a >> 13) & 1
    normal = (a + (((15 - 127) << 23) + 0xFFF) + odd) >> 13
    o = torch.where(a < (113 << 23), small, normal)
    o = torch.where(a >= (143 << 23), 0x7C00, o)  # from 2**16 (and from 65520, by the rounding above): inf
    o = torch.where(a > (255 << 23), 0x7E00, o)  # NaN
    return (o | sign) & _LOW


def rotate_words(w: Tensor, cos: Tensor, sin: Tensor, dtype: torch.dtype) -> Tensor:
    """:func:`~posenc.rope.rotation.apply_rope_eager` (interleaved layout) of the ``x`` whose words are ``w``.

    Args:
        w: ``x.view(WORD_DTYPES[dtype])``, ``(..., T, D/2)``: word ``j`` holds the pair
            ``(x_2j, x_2j+1)``, ``x_2j`` in the low half; ``x`` of dtype ``dtype``.
        cos, sin: ``(..., T, R/2)``, broadcastable to ``w[..., :R/2]``; any float dtype (used in fp32).
        dtype: ``x``'s dtype, a key of :data:`WORD_DTYPES`.

    Returns:
        ``(..., T, D/2)`` of ``w``'s dtype: the words of the rotated ``x`` (view them as ``dtype``).
    """
    if dtype not in WORD_DTYPES:
        raise ValueError(f"dtype must be one of {tuple(WORD_DTYPES)}, got {dtype}")
    half = cos.shape[-1]
    cos, sin = cos.float(), sin.float()
    words = w[..., :half]
    if dtype == torch.float32:  # 64-bit words; the int32 conversions keep the low 32 bits
        xa = (words & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
        xb = (words >> 32).to(torch.int32).view(torch.float32)
        ya, yb = xa * cos - xb * sin, xb * cos + xa * sin
        y = (ya.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) | (yb.view(torch.int32).to(torch.int64) << 32)
    else:
        xa, xb = widen(words & _LOW, dtype), widen((words >> 16) & _LOW, dtype)
        y = narrow(xa * cos - xb * sin, dtype) | (narrow(xb * cos + xa * sin, dtype) << 16)
    if half < w.shape[-1]:  # partial rotary: the words past R pass through
        y = torch.cat([y, w[..., half:]], dim=-1)
    return y


def words_reason(x: Tensor) -> str | None:
    """Why :func:`rotate_words` cannot rotate ``x`` (None if it can)."""
    if sys.byteorder != "little":
        return "a big-endian machine"
    if x.dtype not in WORD_DTYPES:
        return f"x is {x.dtype}"
    if x.stride(-1) != 1 or x.storage_offset() % 2 or any(s % 2 for s in x.stride()[:-1]):
        return "x's pairs are not whole words (its last dim is not contiguous, or an offset or stride is odd)"
    return None
