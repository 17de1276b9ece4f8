""":func:`~posenc.rope.rotation.apply_rope` as one Triton kernel on a GPU: the rotation at the memory's speed.

The rotation reads ``x`` once and writes the result once, so its floor is a copy of ``x``; the
eager formulation launches about six kernels and moves ``x`` several times. This module computes
:func:`~posenc.rope.rotation.apply_rope_eager`'s arithmetic in one pass, with the same operations
in the same order (products and differences each rounded to fp32, no fused multiply-add, one
rounding to ``x``'s dtype), so its output is **bit-identical** to the eager function's; the tests
assert ``torch.equal`` for every layout and dtype.

How the work is split: each program of the kernel takes a tile of ``BLOCK_H`` heads ×
``BLOCK_T`` positions of one batch element and loads that tile's cos/sin once for all its heads
(they do not depend on the head). Pairs are read in the layout's natural order: the two contiguous
halves of a head (``"half"``), or whole rows split into even and odd members in registers
(``"interleaved"``), so that every load and store is contiguous (strided 16-bit loads are what
make an interleaved bf16 rotation slow). Rotated dims past ``R`` (partial rotary) are copied.

The backward pass is the same kernel rotating the incoming gradient by ``-θ`` (``sin`` negated,
exactly): ``dx_a = dy_a cos + dy_b sin``, ``dx_b = dy_b cos - dy_a sin``, in fp32 and rounded
once.

Triton is optional: :func:`unsupported_reason` says why a call cannot use the kernel (no Triton,
not a CUDA tensor, fp64, cos/sin that need gradients, a layout that cannot be indexed as
``(B, H, T, D)``), and :func:`~posenc.rope.rotation.apply_rope` then runs the eager function.
``apply_rope`` takes the kernel by default only once :data:`DEFAULT_ON_CUDA` is set (see there).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

try:  # Triton ships with PyTorch's CUDA builds; CPU-only installs run apply_rope without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

#: Whether ``apply_rope(backend="auto")`` takes the kernel for the CUDA tensors it can take. Off
#: until the kernel's CUDA tests (``tests/test_rope_kernel.py``) and ``benchmarks/rope.py`` have run
#: on a GPU: so far it has been checked only under Triton's CPU interpreter, which runs its index
#: arithmetic, masks and layouts but not the GPU compiler. ``backend="triton"`` asks for it by name.
DEFAULT_ON_CUDA = False

#: dtypes of ``x`` the kernel handles (fp64 runs eagerly, since the kernel computes in fp32).
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: Pairs per program (``BLOCK_H * BLOCK_T * BLOCK_HALF``) and warps per program. Measured on an
#: H200 by ``benchmarks/rope.py --tile-sweep`` (see the Performance notes).
PAIRS_PER_PROGRAM = 2048
NUM_WARPS = 4

if triton is not None:

    @triton.jit
    def _rope_kernel(
        X, COS, SIN, Y,
        H, T,
        sxb, sxh, sxt,  # x strides of (B, H, T); the last dim has stride 1
        scb, sch, sct,  # cos/sin strides of (B, H, T) (0 where broadcast); last dim stride 1
        syb, syh, syt,  # y strides
        HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,  # R/2 and its power-of-two tile width
        REST: tl.constexpr, BLOCK_REST: tl.constexpr,  # D - R pass-through dims and their tile width
        BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
        INTERLEAVED: tl.constexpr, COS_PER_HEAD: tl.constexpr, CONJUGATE: tl.constexpr,
    ):
        pid_t, pid_h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)[:, None, None]  # (BH, 1, 1)
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)[None, :, None]  # (1, BT, 1)
        j = tl.arange(0, BLOCK_HALF)[None, None, :]  # (1, 1, BHALF) pair index
        row_ok = (h < H) & (t < T)  # (BH, BT, 1)
        ok = row_ok & (j < HALF)  # (BH, BT, BHALF)
        x_row = X + b * sxb + h * sxh + t * sxt  # (BH, BT, 1) pointers to row starts
        y_row = Y + b * syb + h * syh + t * syt
        if COS_PER_HEAD:
            c_off = b * scb + h * sch + t * sct + j  # (BH, BT, BHALF)
            c_ok = ok
        else:  # one cos/sin tile serves every head of the program
            c_off = b * scb + t * sct + j  # (1, BT, BHALF)
            c_ok = (t < T) & (j < HALF)
        cos = tl.load(COS + c_off, mask=c_ok, other=0.0).to(tl.float32)
        sin = tl.load(SIN + c_off, mask=c_ok, other=0.0).to(tl.float32)
        if CONJUGATE:
            sin = -sin
        if INTERLEAVED:  # rows of R values a0 b0 a1 b1 ...: load whole rows, split in registers
            k = tl.arange(0, 2)[None, None, None, :]  # (1, 1, 1, 2)
            off = 2 * j[:, :, :, None] + k  # (1, 1, BHALF, 2)
            pair = tl.load(x_row[:, :, :, None] + off, mask=ok[:, :, :, None], other=0.0)
            xa, xb = tl.split(pair.to(tl.float32))  # 2 x (BH, BT, BHALF)
        else:  # a's are dims 0 .. R/2 - 1, b's are R/2 .. R - 1
            xa = tl.load(x_row + j, mask=ok, other=0.0).to(tl.float32)
            xb = tl.load(x_row + HALF + j, mask=ok, other=0.0).to(tl.float32)
        # the eager function's operations in its order: two products, one difference (or sum),
        # each rounded to fp32 (launched with enable_fp_fusion=False: no fused multiply-add)
        ya = (xa * cos - xb * sin).to(Y.dtype.element_ty)  # round to nearest even (Triton's default)
        yb = (xb * cos + xa * sin).to(Y.dtype.element_ty)  # round to nearest even (Triton's default)
        if INTERLEAVED:
            tl.store(y_row[:, :, :, None] + off, tl.join(ya, yb), mask=ok[:, :, :, None])
        else:
            tl.store(y_row + j, ya, mask=ok)
            tl.store(y_row + HALF + j, yb, mask=ok)
        if REST > 0:  # partial rotary: dims R .. D - 1 pass through
            r = tl.arange(0, BLOCK_REST)[None, None, :]
            r_ok = row_ok & (r < REST)
            tl.store(y_row + 2 * HALF + r, tl.load(x_row + 2 * HALF + r, mask=r_ok), mask=r_ok)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _bht_strides(t: Tensor) -> Optional[tuple[int, int, int, int, int, int]]:
    """``(B, H, T, stride_B, stride_H, stride_T)`` of ``t``'s leading dims ``(..., T)`` viewed as
    ``(B, H, T)``: dims before the last two are merged into ``B`` where their strides allow (None
    where they do not, or where the last dim is not contiguous)."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return None
    lead = list(zip(t.shape[:-1], t.stride()[:-1]))  # (size, stride) of (..., H, T)
    while len(lead) < 3:
        lead.insert(0, (1, 0))
    *outer, (H, sh), (T, st) = lead
    size, stride = outer[-1]
    for n, s in reversed(outer[:-1]):  # merge into one batch dim: needs s == stride * size
        if n == 1:
            continue
        if size == 1:
            size, stride = n, s
        elif s == stride * size:
            size *= n
        else:
            return None
    return size, H, T, stride, sh, st


def _span(t: Tensor) -> int:
    """One more than the largest element offset ``t`` reaches from its first element."""
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 0)


def unsupported_reason(x: Tensor, cos: Tensor, sin: Tensor) -> Optional[str]:
    """Why :func:`rope_kernel` cannot take these arguments, or None if it can."""
    if triton is None:
        return "Triton is not installed"
    if x.device.type != "cuda" and not _interpreting():
        return f"x is on {x.device.type}, the kernel runs on CUDA"
    if x.dtype not in KERNEL_DTYPES:
        return f"x is {x.dtype}, the kernel takes {KERNEL_DTYPES}"
    if cos.dtype not in KERNEL_DTYPES or sin.dtype not in KERNEL_DTYPES:
        return f"cos/sin are {cos.dtype}/{sin.dtype}, the kernel takes {KERNEL_DTYPES}"
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return "cos/sin require gradients, which the kernel does not compute"
    if x.numel() == 0:
        return "x is empty"
    half = cos.shape[-1]
    lead = x.shape[:-1]
    if max(_span(x), _span(cos), _span(sin), x.numel()) >= 2**31:
        return "offsets past 2**31 elements (the kernel indexes with 32-bit offsets)"
    bht = _bht_strides(x)
    if bht is None or _bht_strides(cos.expand(*lead, half)) is None or sin.stride() != cos.stride():
        return "x or cos/sin cannot be indexed as (B, H, T, D) with a contiguous last dim"
    if bht[0] > 65535:
        return f"{bht[0]} batch rows (the kernel's grid takes at most 65535)"
    return None


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def _launch(x: Tensor, cos: Tensor, sin: Tensor, layout: str, conjugate: bool, tile: Optional[tuple[int, int]] = None) -> Tensor:
    """Run the kernel: ``y`` (contiguous, ``x``'s shape and dtype) = ``x`` rotated by the angles."""
    half, D = cos.shape[-1], x.shape[-1]
    lead = x.shape[:-1]
    cos_e, sin_e = cos.expand(*lead, half), sin.expand(*lead, half)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, as the eager function's
    B, H, T, sxb, sxh, sxt = _bht_strides(x)
    _, _, _, syb, syh, syt = _bht_strides(y)
    _, _, _, scb, sch, sct = _bht_strides(cos_e)
    pairs, warps = tile or (PAIRS_PER_PROGRAM, NUM_WARPS)
    block_half = _next_pow2(half)
    block_h = max(1, min(_next_pow2(H), pairs // block_half, 16))
    block_t = max(1, min(_next_pow2(T), pairs // (block_half * block_h)))
    rest = D - 2 * half
    grid = (triton.cdiv(T, block_t), triton.cdiv(H, block_h), B)
    _rope_kernel[grid](
        x, cos_e, sin_e, y, H, T, sxb, sxh, sxt, scb, sch, sct, syb, syh, syt,
        HALF=half, BLOCK_HALF=block_half, REST=rest, BLOCK_REST=_next_pow2(rest) if rest else 1,
        BLOCK_H=block_h, BLOCK_T=block_t, INTERLEAVED=layout == "interleaved", COS_PER_HEAD=sch != 0,
        CONJUGATE=conjugate, num_warps=warps, enable_fp_fusion=False,
    )
    return y


class _RopeFunction(torch.autograd.Function):
    """The kernel with its backward (the rotation by ``-θ``); cos/sin get no gradient."""

    @staticmethod
    def forward(ctx, x, cos, sin, layout):
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout
        return _launch(x, cos, sin, layout, conjugate=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        if _bht_strides(grad) is None:
            grad = grad.contiguous()
        return _launch(grad, cos, sin, ctx.layout, conjugate=True), None, None, None


def rope_kernel(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half") -> Tensor:
    """The rotation of :func:`~posenc.rope.rotation.apply_rope_eager` in one Triton kernel.

    Args:
        x: ``(..., T, D)`` on CUDA, fp32, bf16 or fp16, whose leading dims can be indexed as
            ``(B, H, T)`` (any strides from a ``view``/``transpose`` of a projection, e.g.
            ``(B, T, H, D)`` memory seen as ``(B, H, T, D)``) and whose last dim is contiguous.
        cos, sin: ``(..., T, R/2)``, broadcastable to ``x[..., :R/2]``; fp32 (or bf16/fp16).
        layout: ``"half"`` or ``"interleaved"``.

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype, bit-identical to
        ``apply_rope_eager(x, cos, sin, layout)``; differentiable in ``x``.

    Raises:
        ValueError: arguments the kernel cannot take (:func:`unsupported_reason` says which;
            ``apply_rope(backend="auto")`` checks first and runs eagerly instead).
    """
    reason = unsupported_reason(x, cos, sin)
    if reason is not None:
        raise ValueError(f"the Triton RoPE kernel cannot take these arguments: {reason}")
    if torch.is_grad_enabled() and x.requires_grad:
        return _RopeFunction.apply(x, cos, sin, layout)
    return _launch(x, cos, sin, layout, conjugate=False)
