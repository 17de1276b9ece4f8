"""Rotating queries and keys: cos/sin of the angles, the rotation in both layouts, converting between
layouts, axial 2-D RoPE and the :class:`~posenc.rope.rotation.RotaryEmbedding` position method.

The conventions (layouts, partial rotary, numerics) are stated in :mod:`posenc.rope`; the
frequencies the angles are made of come from :mod:`posenc.rope.frequencies`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Mapping
from typing import Callable, Optional

import torch
from torch import Tensor

from posenc.method import PositionMethod, register_method
from posenc.rope import kernel, packed
from posenc.rope.frequencies import ARITHMETICS, _check_head_dim, inverse_frequencies

#: The two ways of pairing the dimensions of a head (see the module docstring).
LAYOUTS = ("half", "interleaved")

#: Positions from which :func:`rope_cos_sin` computes angles in fp64 (fp32 below).
#: At position ``p`` an fp32 angle ``p * θ_0`` (``θ_0 = 1``) is off by up to ``p * 2**-24``: under
#: ``2**-12 ≈ 2.4e-4`` rad below 4096, 0.06 rad at one million (measured in the RoPE chapter).
FP64_ANGLES_FROM = 4096

# --------------------------------------------------------------------------- angles


def rope_cos_sin(
    positions: Tensor, inv_freq: Tensor, attention_scale: float = 1.0, *, arithmetic: str = "exact"
) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotation angles ``positions[..., None] * inv_freq``.

    With ``arithmetic="exact"`` angles are computed in fp32 for positions ``|p| < FP64_ANGLES_FROM``
    and in fp64 from there on (see the module docstring), per position; with ``"transformers"``
    all in fp32, as Hugging Face's rotary embeddings (and the checkpoints trained with them) do.

    Args:
        positions: integer or float tensor of any shape ``P`` (e.g. ``(T,)`` or ``(B, T)``).
        inv_freq: ``(R/2,)`` inverse frequencies (:func:`~posenc.rope.frequencies.inverse_frequencies`).
        attention_scale: factor multiplying cos and sin (YaRN's ``mscale``; 1.0 for plain RoPE).
        arithmetic: ``"exact"`` or ``"transformers"`` (:data:`~posenc.rope.frequencies.ARITHMETICS`).

    Returns:
        ``(cos, sin)``, float32, each of shape ``P + (R/2,)``, on ``positions``' device.

    Raises:
        TypeError: non-tensor arguments, a bool ``positions``, an integer ``inv_freq``.
        ValueError: ``inv_freq`` that is not 1-D, non-finite positions, an unknown ``arithmetic``.
    """
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic must be one of {ARITHMETICS}, got {arithmetic!r}")
    if not isinstance(positions, Tensor) or positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be an integer or float tensor, got {getattr(positions, 'dtype', type(positions).__name__)}")
    if not isinstance(inv_freq, Tensor) or not inv_freq.dtype.is_floating_point:
        raise TypeError(f"inv_freq must be a float tensor, got {getattr(inv_freq, 'dtype', type(inv_freq).__name__)}")
    if inv_freq.dim() != 1:
        raise ValueError(f"inv_freq must be 1-D (R/2,), got shape {tuple(inv_freq.shape)}")
    compiling = torch.compiler.is_compiling()
    if (not compiling and positions.dtype.is_floating_point and positions.numel()
            and not bool(torch.isfinite(positions).all())):
        raise ValueError("positions must be finite")
    device = positions.device
    inv32 = inv_freq.to(device=device, dtype=torch.float32)
    angles = positions.to(torch.float32)[..., None] * inv32  # P + (R/2,)
    cos, sin = angles.cos(), angles.sin()
    if arithmetic == "exact" and compiling:  # no data-dependent branch: fp64 angles everywhere, kept where far
        far = (positions.abs() >= FP64_ANGLES_FROM)[..., None]  # P + (1,)
        a64 = positions.to(torch.float64)[..., None] * inv32.to(torch.float64)
        cos = torch.where(far, a64.cos().to(torch.float32), cos)
        sin = torch.where(far, a64.sin().to(torch.float32), sin)
    elif arithmetic == "exact" and positions.numel() and bool((far := positions.abs() >= FP64_ANGLES_FROM).any()):
        # fp64 where fp32 angles lose accuracy; MPS has no fp64, so that part runs on the CPU.
        work = torch.device("cpu") if device.type == "mps" else device
        p64 = positions[far].to(work, torch.float64)  # (F,)
        a64 = p64[:, None] * inv32.to(work, torch.float64)  # (F, R/2)
        cos[far], sin[far] = a64.cos().to(device, torch.float32), a64.sin().to(device, torch.float32)
    if attention_scale != 1.0:
        cos, sin = cos * attention_scale, sin * attention_scale
    return cos, sin


# --------------------------------------------------------------------------- rotation


def _check_apply_args(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> int:
    """Validate :func:`apply_rope`'s arguments; return the number of rotated pairs ``R/2``.

    A model passes the same ``(cos, sin)`` to the queries and keys of every layer, so the verdict
    is remembered per table (:func:`_per_table`) and per layout, shape and dtype of ``x``: checking
    again would cost more than a decoding step's arithmetic on the CPU. Inside ``torch.compile``
    only the shapes are checked (they are constants there).
    """
    if torch.compiler.is_compiling() or not (isinstance(x, Tensor) and isinstance(cos, Tensor) and isinstance(sin, Tensor)):
        return _check_shapes(x, cos, sin, layout)
    key = ("valid for", layout, x.shape, x.dtype, cos.shape, sin.shape)
    return _per_table(cos, sin, key, _check_all, x, cos, sin, layout)


def _check_all(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> int:
    half = _check_shapes(x, cos, sin, layout)
    _check_not_full_width(cos, sin, half, x.shape[-1])
    return half


def _check_shapes(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a float tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., T, D), got {tuple(x.shape)}")
    D = x.shape[-1]
    if D % 2:
        raise ValueError(f"x's last dim (the head dim D) must be even to be rotated in pairs, got D={D}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    half = cos.shape[-1] if cos.dim() else 0
    if cos.dim() < 2 or half < 1 or 2 * half > D:
        raise ValueError(
            f"cos/sin must have shape (..., T, R/2) with 1 <= R/2 <= D/2 = {D // 2} (R = rotated dims), "
            f"got {tuple(cos.shape)} for x of shape {tuple(x.shape)}"
        )
    lead, xlead = cos.shape[:-1], x.shape[:-1]  # cos/sin must broadcast to x's leading dims, not beyond
    if len(lead) > len(xlead) or any(c != 1 and c != n for c, n in zip(reversed(lead), reversed(xlead))):
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x's {tuple(xlead)} + (R/2,) "
            f"(x has shape {tuple(x.shape)})"
        )
    return half


def _check_not_full_width(cos: Tensor, sin: Tensor, half: int, D: int) -> None:
    if _repeats_itself(cos, sin, whole=2 * half == D):
        raise ValueError(
            f"cos/sin of width {half} repeat themselves (two equal halves, or equal neighbours): the full-width "
            f"form of Hugging Face's rotary embedding, which would rotate {2 * half} of x's {D} dims instead of "
            f"{half}. Pass posenc's (..., T, R/2): cos[..., :{half // 2}] and sin[..., :{half // 2}] for the "
            f"'half' layout (torch.cat form), or cos[..., ::2] and sin[..., ::2] for repeat_interleave"
        )


def _repeats_itself(cos: Tensor, sin: Tensor, whole: bool = False) -> bool:
    """Whether ``cos``/``sin`` (``(..., R/2)``) are a full-width table: halves or neighbours equal.

    Hugging Face models build ``cos = cat([c, c], -1)`` (or ``repeat_interleave(c, 2, -1)``) of width
    ``R``; posenc takes ``c`` alone. Every row of a full-width table repeats itself and no row of a
    1-D RoPE table does, so one row decides; with ``whole`` (a table as wide as full rotary, where
    axial 2-D RoPE's rows repeat for patches on the diagonal) every row must repeat, and a single
    row is not judged. A table whose angles are all zero is the identity at any width and is never
    refused.
    """
    h = cos.shape[-1]
    if h % 2 or cos.numel() == 0 or (whole and cos.numel() == h):  # one row at full width: ambiguous
        return False
    c, s = (cos, sin) if whole else (cos.reshape(-1, h)[-1], sin.reshape(-1, h)[-1])
    if bool((s == 0).all()) and bool((c == 1).all()):
        c, s = cos, sin
        if bool((s == 0).all()) and bool((c == 1).all()):
            return False
    halves = torch.equal(c[..., : h // 2], c[..., h // 2 :]) and torch.equal(s[..., : h // 2], s[..., h // 2 :])
    pairs = torch.equal(c[..., 0::2], c[..., 1::2]) and torch.equal(s[..., 0::2], s[..., 1::2])
    return halves or pairs


def _pairs(x: Tensor, half: int, layout: str) -> tuple[Tensor, Tensor]:
    """The two members ``(x_a, x_b)`` of every rotated pair, as views of ``x`` of shape ``(..., T, R/2)``."""
    if layout == "half":
        return x[..., :half], x[..., half : 2 * half]
    return x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]


def apply_rope_eager(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half") -> Tensor:
    """:func:`apply_rope` in plain eager PyTorch: the fallback, and the function that is compiled.

    ``y_a = x_a cos - x_b sin`` and ``y_b = x_b cos + x_a sin`` are computed on the pair views of
    ``x`` in fp32 (fp64 for fp64 ``x``) and put back in the layout's order; no full-width cos/sin and
    no rotated copy of ``x`` (``rotate_half``) are built. No input checks (see :func:`apply_rope`).
    """
    half = cos.shape[-1]
    work = torch.promote_types(x.dtype, torch.float32)
    xa, xb = _pairs(x, half, layout)  # 2 x (..., T, R/2), views of x
    cos, sin = cos.to(work), sin.to(work)
    # (..., T, R/2) each; computed in `work` by type promotion and rounded to x's dtype before they
    # are joined, so that a compiled kernel writes x's dtype directly: no `work`-sized intermediate
    # of the whole result (twice the memory of a bf16 result, and a second pass to round it)
    ya = (xa * cos - xb * sin).to(x.dtype)
    yb = (xb * cos + xa * sin).to(x.dtype)
    if layout == "half":
        y = torch.cat([ya, yb], dim=-1)  # (..., T, R)
    else:
        y = torch.stack([ya, yb], dim=-1).flatten(-2)  # (..., T, R): a0 b0 a1 b1 ...
    if 2 * half < x.shape[-1]:  # partial rotary: the remaining dims pass through
        y = torch.cat([y, x[..., 2 * half :]], dim=-1)  # (..., T, D)
    return y


#: ``apply_rope(backend="auto")`` compiles for inputs with at least this many elements (a
#: ``(1, 32, 2048, 128)`` prefill has 8.4M) and runs eagerly below, where a compiled call's fixed
#: overhead (about 50 µs on the CPU) exceeds the work.
COMPILE_MIN_NUMEL = 1 << 20

APPLY_BACKENDS = ("auto", "eager", "compiled", "triton")

#: The variants of the arguments (layout, dtypes, ranks, widths, device type, the words path) that
#: :func:`_apply_compiled` has compiled, with the compiled function each runs. torch.compile keeps
#: its graphs per code object, and past a code object's recompile limit (8 by default) runs it
#: eagerly without a word: posenc compiles functions of its own (:func:`_rotate_half`,
#: :func:`_rotate_interleaved`, :func:`_rotate_words`), so that its variants never count against the
#: limit of a function the user compiles (a ``functools.partial`` would share one code object with
#: every partial in the process), raises their limit to 64 and makes hitting it an error, which
#: :func:`_apply_compiled` reports with a warning, answering eagerly for that variant.
_compiled: dict[tuple, Callable] = {}
#: Variants whose compile failed (or hit the recompile limit), with the reason: eager from then on.
_compile_failed: dict[tuple, str] = {}
_COMPILED_FUNCTIONS: dict[str, Callable] = {}


def _rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return apply_rope_eager(x, cos, sin, "half")


def _rotate_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return apply_rope_eager(x, cos, sin, "interleaved")


def _rotate_words(w: Tensor, cos: Tensor, sin: Tensor, dtype: torch.dtype) -> Tensor:
    return packed.rotate_words(w, cos, sin, dtype)


def _compiled_function(name: str) -> Callable:
    if name not in _COMPILED_FUNCTIONS:  # on first use: importing the compiler takes a while
        fn = {"half": _rotate_half, "interleaved": _rotate_interleaved, "words": _rotate_words}[name]
        _COMPILED_FUNCTIONS[name] = torch.compile(fn)
    return _COMPILED_FUNCTIONS[name]


def _variant(x: Tensor, cos: Tensor, layout: str) -> tuple:
    return (layout, x.dtype, cos.dtype, x.dim(), cos.dim(), cos.shape[-1], x.shape[-1], x.device.type)


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _apply_compiled(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """The compiled kernel of this variant of the arguments: on the CPU, interleaved ``x`` read with a
    pair per word (:func:`~posenc.rope.packed.rotate_words`, where
    :func:`~posenc.rope.packed.words_reason` allows and no gradient is needed), else
    :func:`apply_rope_eager`; eager, with a warning, if compiling fails."""
    words = (layout == "interleaved" and x.device.type == "cpu" and not _needs_grad(x, cos, sin)
             and packed.words_reason(x) is None)
    key = (*_variant(x, cos, layout), words)
    if key not in _compile_failed:
        if key not in _compiled:
            _compiled[key] = _compiled_function("words" if words else layout)
        try:
            # never fall back silently (past the limit torch would run the function uncompiled)
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=64):
                if words:
                    return _compiled[key](x.view(packed.WORD_DTYPES[x.dtype]), cos, sin, x.dtype).view(x.dtype)
                return _compiled[key](x, cos, sin)
        except Exception as err:  # no compiler, unsupported platform, the recompile limit: say so once
            _compile_failed[key] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            warnings.warn(
                f"posenc.rope: torch.compile failed for {key} ({_compile_failed[key]}); apply_rope runs eagerly "
                "for these arguments from now on (same results, slower)",
                RuntimeWarning,
                stacklevel=3,
            )
    return apply_rope_eager(x, cos, sin, layout)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", *, backend: str = "auto") -> Tensor:
    """Rotate the dimension pairs of ``x`` by the angles whose cos and sin are given.

    RoFormer, arXiv:2104.09864, eq. (34): ``y_a = x_a cos - x_b sin``, ``y_b = x_b cos + x_a sin``
    for every pair ``(a, b)`` of the layout. Only the first ``R = 2 * cos.shape[-1]`` dimensions are
    rotated (partial rotary); the rest are copied.

    Args:
        x: ``(..., T, D)`` queries or keys, e.g. ``(B, H, T, D)``; any float dtype.
        cos, sin: ``(..., T, R/2)`` from :func:`rope_cos_sin`, broadcastable to ``x[..., :R/2]``
            (e.g. ``(T, R/2)``, or ``(B, 1, T, R/2)`` for positions per batch row: a ``(B, T, R/2)``
            table would broadcast its batch against the heads).
        layout: ``"half"`` (pairs ``(i, i + R/2)``) or ``"interleaved"`` (pairs ``(2i, 2i + 1)``).
        backend: ``"eager"`` (:func:`apply_rope_eager`'s results from fewer kernels),
            ``"compiled"`` (the same function under ``torch.compile``: one fused pass over ``x``;
            on the CPU, interleaved fp32/bf16/fp16 ``x`` is read a pair per word,
            :func:`~posenc.rope.packed.rotate_words`; falling back to eager with a
            ``RuntimeWarning`` if compiling fails), ``"triton"`` (:func:`~posenc.rope.kernel.rope_kernel`:
            one Triton kernel on CUDA, bit-identical to eager) or ``"auto"``: the Triton kernel for
            CUDA tensors it takes (:func:`~posenc.rope.kernel.unsupported_reason`) once
            :data:`~posenc.rope.kernel.DEFAULT_ON_CUDA` is set, otherwise compiled from
            :data:`~posenc.rope.rotation.COMPILE_MIN_NUMEL` elements on and eager below; eager
            inside an outer compile, which fuses the rotation into its own kernels.

    Returns:
        Tensor of ``x``'s shape and dtype. The rotation is computed in fp32 (fp64 for fp64 ``x``)
        and rounded once.

    Raises:
        TypeError: non-float tensors.
        ValueError: unknown layout or backend, odd ``D``, ``R > D``, shapes that do not broadcast;
            ``backend="triton"`` for arguments the kernel cannot take (e.g. CPU tensors); cos/sin
            in Hugging Face's full width (two equal halves or
            equal neighbours, which would rotate twice the dims, also where ``R = D/2`` makes the
            shapes look like full rotary (there a table of two or more rows that all repeat is
            refused, and a single row is not judged: axial 2-D RoPE of patches on the diagonal has
            that form; rotate such a table with :func:`apply_rope_eager`); not checked inside
            torch.compile).
    """
    if backend not in APPLY_BACKENDS:
        raise ValueError(f"backend must be one of {APPLY_BACKENDS}, got {backend!r}")
    _check_apply_args(x, cos, sin, layout)
    if backend == "auto":
        if torch.compiler.is_compiling():
            backend = "eager"
        elif x.is_cuda and kernel.DEFAULT_ON_CUDA and kernel.unsupported_reason(x, cos, sin) is None:
            backend = "triton"
        else:
            backend = "compiled" if x.numel() >= COMPILE_MIN_NUMEL else "eager"
    if backend == "triton":
        return kernel.rope_kernel(x, cos, sin, layout)
    if backend == "compiled":
        return _apply_compiled(x, cos, sin, layout)
    if torch.compiler.is_compiling():  # an outer compile fuses the reference formulation
        return apply_rope_eager(x, cos, sin, layout)
    return _apply_full_width(x, cos, sin, layout)


# What apply_rope derives from one (cos, sin) pair (whether the arguments are valid, full-width
# tables): a model passes the same cos and sin to the queries and keys of every layer, so
# each is computed once. id(cos) -> (ref(cos), ref(sin), versions, {what: value})
_PER_TABLE: dict[int, tuple] = {}


def _per_table(cos: Tensor, sin: Tensor, what: tuple, compute: Callable, *args):
    """``compute(*args)``, remembered for this ``(cos, sin)`` pair while neither is modified in place
    (tables that need gradients, and inference tensors, which keep no version counter: computed
    every time). The memo holds weak references to the tables, so it never keeps one alive (and
    ``torch.utils.swap_tensors`` refuses a table that has been passed to :func:`apply_rope`)."""
    if cos.is_inference() or sin.is_inference() or cos.requires_grad or sin.requires_grad:
        return compute(*args)
    # the version counters see every in-place write through PyTorch; the addresses see a new
    # storage put under the same tensor (``t.data = ...``, ``torch.utils.swap_tensors``). Writes that
    # bypass both (through ``t.data``'s or numpy's view of the memory) are not seen, as autograd
    # does not see them either.
    versions = (cos._version, sin._version, cos.data_ptr(), sin.data_ptr())
    entry = _PER_TABLE.get(id(cos))
    if entry is None or entry[0]() is not cos or entry[1]() is not sin or entry[2] != versions:
        if id(cos) not in _PER_TABLE:
            weakref.finalize(cos, _PER_TABLE.pop, id(cos), None)
        entry = _PER_TABLE[id(cos)] = (weakref.ref(cos), weakref.ref(sin), versions, {})
    values = entry[3]
    if what not in values:
        values[what] = compute(*args)
    return values[what]


def _full_width_tables(cos: Tensor, sin: Tensor, layout: str, work: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(c, s)`` of width ``R`` such that the rotation is ``x * c + swap(x) * s``: cos repeated as the
    layout pairs the dims, sin with the sign of each pair member (``-sin`` for ``a``, ``+sin`` for ``b``)."""
    return _per_table(cos, sin, ("full", layout, work), _build_full_width, cos, sin, layout, work)


def _build_full_width(cos: Tensor, sin: Tensor, layout: str, work: torch.dtype) -> tuple[Tensor, Tensor]:
    c, s = cos.to(work), sin.to(work)
    if layout == "half":
        return torch.cat([c, c], -1), torch.cat([-s, s], -1)  # (..., R)
    return c.repeat_interleave(2, -1), torch.stack([-s, s], -1).flatten(-2)  # (..., R)


#: The dtype the rotation is computed in, per dtype of ``x`` (``promote_types(x.dtype, float32)``,
#: looked up rather than computed: at a decoding step every microsecond of Python shows).
_WORK = {dt: torch.promote_types(dt, torch.float32) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def _apply_full_width(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """:func:`apply_rope_eager`'s numbers bit for bit in fewer kernels, for the eager path.

    ``y = x * c + swap(x) * s`` over the rotated dims, with the full-width tables of
    :func:`_full_width_tables` (built once per ``(cos, sin)``) and ``swap`` exchanging the members of
    each pair: every element is the same fp32 product-and-sum as ``y_a = x_a cos - x_b sin``,
    ``y_b = x_b cos + x_a sin`` (``a - b = a + (-b)`` exactly), rounded once. A 16-bit ``x`` is
    widened once and the products are taken in place where no gradient is needed: each kernel is
    then a same-dtype one, faster on the CPU than mixed bf16 × fp32 products (six kernels for a
    bf16 decoding step and four for fp32, against five for Hugging Face's
    ``x * cos + rotate_half(x) * sin`` in bf16 and seven for :func:`apply_rope_eager`). Where a
    gradient is needed, a 16-bit ``x``'s gradient is summed in fp32 and rounded once, as the
    compiled path's is (autograd through :func:`apply_rope_eager` rounds each of its two parts).
    """
    R, D = 2 * cos.shape[-1], x.shape[-1]
    work = _WORK.get(x.dtype) or torch.promote_types(x.dtype, torch.float32)
    c, s = _full_width_tables(cos, sin, layout, work)
    xr = x if R == D else x[..., :R]
    widened = x.dtype != work
    # a new tensor where x is narrower than `work` (``.float()`` is a little cheaper than ``.to``)
    xw = (xr.float() if work == torch.float32 else xr.to(work)) if widened else xr
    # ``roll`` rather than ``cat`` of the two halves or ``flip`` of each pair: a single copy kernel,
    # the fastest of those on the CPU (``flip`` is twice as slow at a decoding step)
    swapped = xw.roll(R // 2, -1) if layout == "half" else xw.unflatten(-1, (R // 2, 2)).roll(1, -1).flatten(-2)
    if _needs_grad(x, cos, sin):
        y = xw * c + swapped * s
    else:  # in place on the new tensors only: x is never written
        y = (xw.mul_(c) if widened else xw * c).add_(swapped.mul_(s))
    if widened:
        y = y.to(x.dtype)  # (..., T, R)
    return y if R == D else torch.cat([y, x[..., R:]], -1)  # (..., T, D)


# --------------------------------------------------------------------------- layouts


def layout_permutation(head_dim: int, rotary_dim: Optional[int] = None) -> Tensor:
    """Index permutation ``p`` with ``x_half = x_interleaved[..., p]``.

    Interleaved pair ``(2i, 2i + 1)`` becomes half pair ``(i, i + R/2)``:
    ``p = [0, 2, ..., R-2, 1, 3, ..., R-1, R, R+1, ..., D-1]`` (dims past ``R`` are not rotated and
    stay in place). The inverse (half -> interleaved) is ``torch.argsort(p)``. With ``p`` and
    ``cos``/``sin`` of the same positions, ``apply_rope(x[..., p], "half") ==
    apply_rope(x, "interleaved")[..., p]``, and attention scores are unchanged.

    Args:
        head_dim: ``D``.
        rotary_dim: ``R`` (default ``D``); even, ``<= D``.

    Returns:
        ``(D,)`` int64 permutation.

    Raises:
        ValueError: odd ``R`` or ``R > D``.
    """
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    _check_head_dim(rotary_dim, "rotary_dim")
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
    rot = torch.arange(rotary_dim).view(rotary_dim // 2, 2).t().reshape(-1)  # (R,) 0,2,4,..,1,3,5,..
    return torch.cat([rot, torch.arange(rotary_dim, head_dim)])


def permute_qk_weight(
    weight: Tensor, n_head: int, *, source: str, target: str, rotary_dim: Optional[int] = None
) -> Tensor:
    """Convert a query or key projection from one RoPE layout to the other.

    The rows of ``weight`` (``nn.Linear`` layout, ``(n_head * D, in_features)``; a bias of shape
    ``(n_head * D,)`` works too) are permuted within each head by :func:`layout_permutation`, so that
    the projected queries/keys come out in the ``target`` layout. This is the permutation Hugging
    Face's Llama conversion applies to Meta's (interleaved) checkpoints.

    Args:
        weight: ``(n_head * D, ...)`` projection weight or bias.
        n_head: number of heads the rows are split into (key/value heads for ``k`` under GQA).
        source, target: layouts, each ``"half"`` or ``"interleaved"``.
        rotary_dim: ``R`` for partial rotary (default ``D``).

    Returns:
        The permuted tensor (a copy), same shape and dtype.

    Raises:
        ValueError: unknown layouts, rows not divisible into ``n_head`` heads.
    """
    for name, lay in (("source", source), ("target", target)):
        if lay not in LAYOUTS:
            raise ValueError(f"{name} must be one of {LAYOUTS}, got {lay!r}")
    if not isinstance(n_head, int) or n_head < 1 or weight.shape[0] % n_head:
        raise ValueError(f"n_head must be a positive int dividing weight.shape[0]={weight.shape[0]}, got {n_head!r}")
    D = weight.shape[0] // n_head
    if source == target:
        return weight.clone()
    perm = layout_permutation(D, rotary_dim).to(weight.device)
    if source == "half":
        perm = torch.argsort(perm)
    w = weight.reshape(n_head, D, *weight.shape[1:])  # (H, D, ...)
    return w[:, perm].reshape(weight.shape)


# --------------------------------------------------------------------------- 2-D (axial) RoPE


def axial_rope_cos_sin(
    rows: Tensor, cols: Tensor, head_dim: int, base: float = 100.0
) -> tuple[Tensor, Tensor]:
    """cos/sin of axial 2-D RoPE: half of the pairs turn with the row, half with the column.

    Heo et al. 2024, arXiv:2403.13298, "RoPE-Axial" (eq. 10): pairs ``0 .. D/4 - 1`` use angles
    ``row * θ_j`` and pairs ``D/4 .. D/2 - 1`` use ``col * θ_j``, with ``θ_j`` the 1-D frequencies
    of a head of size ``D/2``. Scores then depend on ``(Δrow, Δcol)`` only. Use the result with
    :func:`apply_rope` in either layout.

    Args:
        rows, cols: ``(N,)`` integer grid coordinates of the ``N`` patches.
        head_dim: ``D``, a multiple of 4.
        base: frequency base (the paper uses 100 for images).

    Returns:
        ``(cos, sin)``, float32, each ``(N, D/2)``.

    Raises:
        ValueError: ``D`` not a multiple of 4, ``rows``/``cols`` of different shapes.
    """
    if not isinstance(head_dim, int) or head_dim % 4 or head_dim < 4:
        raise ValueError(f"head_dim must be a positive multiple of 4 for axial 2-D RoPE, got {head_dim!r}")
    if rows.shape != cols.shape:
        raise ValueError(f"rows and cols must have the same shape, got {tuple(rows.shape)} and {tuple(cols.shape)}")
    inv_freq, _ = inverse_frequencies(head_dim // 2, base, device=rows.device)  # (D/4,)
    cr, sr = rope_cos_sin(rows, inv_freq)  # (N, D/4)
    cc, sc = rope_cos_sin(cols, inv_freq)
    return torch.cat([cr, cc], dim=-1), torch.cat([sr, sc], dim=-1)  # (N, D/2)


# --------------------------------------------------------------------------- the module


class RotaryEmbedding(PositionMethod):
    """RoPE as a position method: rotates queries and keys in every layer; no parameters.

    cos/sin of positions ``0 .. max_positions - 1`` are cached as non-persistent fp32 buffers,
    built in ``__init__`` or by :meth:`build_cache`; positions outside the cache raise
    ``ValueError`` (call :meth:`build_cache` with a larger size). The cache stays fp32 when the
    model is cast (``model.to(torch.bfloat16)``): it is rebuilt instead of rounded. Built on the
    meta device (``with torch.device("meta")``, deferred or FSDP initialisation) it holds shapes
    only, and ``to_empty(device=...)`` computes its values on the new device.

    With a KV cache, keys are stored rotated by their own positions, and a new query at position
    ``m`` is rotated by ``m``: nothing stored is ever rotated again (see the RoPE chapter).

    Every scaling of :data:`~posenc.rope.frequencies.ROPE_SCALINGS` works here, evaluated once per
    cache at ``seq_len = max_positions``: the length-dependent ones (``"dynamic"``, ``"longrope"``)
    use, for every position, the frequencies Hugging Face uses once a sequence reaches
    ``max_positions`` (``"longrope"``: its long factors if ``max_positions`` exceeds the original
    length, else its short ones). Within one cache the frequencies never change, so decoding with a
    KV cache stays exact; for Hugging Face's per-length behaviour at a length ``n``, build the cache
    with ``max_positions = n`` or call :func:`~posenc.rope.frequencies.inverse_frequencies` with
    ``seq_len=n``.

    Args:
        head_dim: ``D``.
        max_positions: size of the cos/sin cache, and the ``seq_len`` of length-dependent scalings.
        base: frequency base (``rope_theta``).
        rotary_dim: ``R``, number of rotated dims per head (default ``D``).
        layout: ``"half"`` or ``"interleaved"``.
        scaling: as in :func:`~posenc.rope.frequencies.inverse_frequencies` (for a Hugging Face
            checkpoint, from :func:`~posenc.rope.hf_config.scaling_from_hf`).
        arithmetic: ``"exact"`` (default) or ``"transformers"``: the frequencies and angles of
            :func:`~posenc.rope.frequencies.inverse_frequencies` and :func:`rope_cos_sin` in that
            arithmetic (``"transformers"`` reproduces a Hugging Face model's cos/sin bit for bit).

    Raises:
        ValueError: invalid sizes, base, layout, scaling or arithmetic.
    """

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        base: float = 10000.0,
        *,
        rotary_dim: Optional[int] = None,
        layout: str = "half",
        scaling: Optional[Mapping] = None,
        arithmetic: str = "exact",
    ):
        super().__init__()
        if arithmetic not in ARITHMETICS:
            raise ValueError(f"arithmetic must be one of {ARITHMETICS}, got {arithmetic!r}")
        self.arithmetic = arithmetic
        _check_head_dim(head_dim)
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        _check_head_dim(rotary_dim, "rotary_dim")
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.head_dim, self.rotary_dim, self.base, self.layout, self.scaling = head_dim, rotary_dim, base, layout, scaling
        self.build_cache(max_positions)

    def build_cache(self, max_positions: int) -> None:
        """(Re)build ``inv_freq``, ``attention_scale`` and the fp32 cos/sin cache for positions
        ``0 .. max_positions - 1``, on the device the module is on (length-dependent scalings are
        evaluated at ``seq_len = max_positions``)."""
        if not isinstance(max_positions, int) or isinstance(max_positions, bool) or max_positions < 1:
            raise ValueError(f"max_positions must be a positive int, got {max_positions!r}")
        device = self.inv_freq.device if "inv_freq" in self._buffers else torch.empty(0).device  # or the ambient one
        work = torch.device("cpu") if device.type == "meta" else device
        with torch.device(work):  # on the meta device (deferred init) the values are computed, then dropped
            inv_freq, self.attention_scale = inverse_frequencies(
                self.rotary_dim, self.base, self.scaling, seq_len=max_positions, device=work, arithmetic=self.arithmetic
            )
            positions = torch.arange(max_positions, device=work)
            cos, sin = rope_cos_sin(positions, inv_freq, self.attention_scale, arithmetic=self.arithmetic)  # (N, R/2)
        if device.type == "meta":
            inv_freq, cos, sin = (t.to("meta") for t in (inv_freq, cos, sin))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (R/2,)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)
        self.max_positions = max_positions

    def _apply(self, fn, recurse=True):
        was_meta = self.cos_cached.is_meta
        super()._apply(fn, recurse)
        # a model-wide cast: rebuild, never round; leaving the meta device (to_empty after deferred
        # initialisation): the buffers hold no values yet, so compute them
        if self.cos_cached.dtype != torch.float32 or (was_meta and not self.cos_cached.is_meta):
            self.build_cache(self.max_positions)
        return self

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Cached ``(cos, sin)`` of ``positions``, each ``positions.shape + (R/2,)``, fp32."""
        self.check(positions)
        return self.cos_cached[positions], self.sin_cached[positions]

    per_row_positions = True

    def transform_qk(self, q, k, q_positions, k_positions, layer):
        """Rotate ``q`` ``(B, H, T, D)`` by ``q_positions`` and ``k`` ``(B, H, S, D)`` by ``k_positions``,
        each ``(T,)``/``(S,)`` or per batch row ``(B, T)``/``(B, S)``."""
        cq, sq = self.cos_sin(q_positions)  # (T, R/2) or (B, T, R/2)
        ck, sk = (cq, sq) if k_positions is q_positions else self.cos_sin(k_positions)  # (S, R/2) or (B, S, R/2)
        if cq.dim() == 3:
            cq, sq = cq[:, None], sq[:, None]  # (B, 1, T, R/2): the same rotation for every head
        if ck.dim() == 3:
            ck, sk = ck[:, None], sk[:, None]
        return apply_rope(q, cq, sq, self.layout), apply_rope(k, ck, sk, self.layout)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"layout={self.layout!r}, max_positions={self.max_positions}"
            + ("" if self.scaling is None else f", scaling={dict(self.scaling)!r}")
            + ("" if self.arithmetic == "exact" else f", arithmetic={self.arithmetic!r}")
        )


@register_method("rope")
def _rope(config) -> RotaryEmbedding:
    return RotaryEmbedding(config.d_model // config.n_head, config.max_len)
