"""posenc.rope.packed: interleaved pairs read as words, bit for bit the eager rotation."""

import pytest
import torch

from posenc.rope import apply_rope, apply_rope_eager, inverse_frequencies, rope_cos_sin
from posenc.rope import packed
from posenc.rope import rotation

HALF_DTYPES = [torch.bfloat16, torch.float16]
WORD_DTYPES = [torch.float32, *HALF_DTYPES]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN where the other is NaN (NaN payloads may differ between conversions)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])


def table(T: int, R: int, start: int = 0):
    """cos/sin ``(T, R/2)`` of positions ``start .. start + T - 1`` (as tests/test_rope.py's ``cos_sin``)."""
    return rope_cos_sin(torch.arange(start, start + T), inverse_frequencies(R)[0])


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_widen_is_exact_on_every_16_bit_pattern(dtype):
    h = torch.arange(0, 1 << 16, dtype=torch.int32)
    expected = h.to(torch.int16).view(dtype).float()
    assert same_bits(packed.widen(h, dtype), expected)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_narrow_rounds_as_pytorch_does(dtype):
    # every rounding boundary (the fp32 midpoint between two neighbouring 16-bit values, and its
    # neighbours) plus random bit patterns of every exponent, sign and NaN
    h = torch.arange(0, (1 << 16) - 1, dtype=torch.int32)
    lo = packed.widen(h, dtype).view(torch.int32).long()
    hi = packed.widen(h + 1, dtype).view(torch.int32).long()
    mid = (lo + hi) // 2
    g = torch.Generator().manual_seed(0)
    random = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=g, dtype=torch.int64)
    bits = torch.cat([random, lo, mid - 1, mid, mid + 1, lo + 1, lo - 1])
    bits = ((bits + 2**31) % 2**32 - 2**31).to(torch.int32)  # wrap into int32
    y = bits.view(torch.float32)
    expected = y.to(dtype).view(torch.int16).to(torch.int32) & 0xFFFF
    got = packed.narrow(y, dtype)
    finite = ~y.isnan()
    assert torch.equal(got[finite], expected[finite])
    assert bool(got[~finite].view(torch.int32).lt(1 << 16).all())
    assert bool(got[~finite].to(torch.int16).view(dtype).isnan().all())


def special_values(dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    return torch.tensor([0.0, -0.0, info.tiny, -info.tiny, info.tiny / 4, info.max, -info.max, float("inf"),
                         -float("inf"), float("nan"), 1.0, -1.5, 3e-5, 60000.0 if dtype == torch.float16 else 1e30],
                        dtype=torch.float64)


@pytest.mark.parametrize("dtype", WORD_DTYPES)
@pytest.mark.parametrize("D,R", [(64, 64), (40, 32), (10, 2)])
@pytest.mark.parametrize("compiled", [False, True])
def test_rotate_words_gives_the_eager_bits(dtype, D, R, compiled):
    torch.manual_seed(0)
    T = 9
    x = (torch.randn(2, 3, T, D) * 4).to(dtype)
    sv = special_values(dtype)
    x.view(-1)[: len(sv)] = sv.to(dtype)  # overflow, subnormals, inf and NaN among the pairs
    cos, sin = table(T, R, start=1000)
    fn = torch.compile(packed.rotate_words) if compiled else packed.rotate_words
    got = fn(x.view(packed.WORD_DTYPES[dtype]), cos, sin, dtype).view(dtype)
    assert same_bits(got, apply_rope_eager(x, cos, sin, "interleaved"))


@pytest.mark.parametrize("dtype", WORD_DTYPES)
def test_compiled_backend_reads_interleaved_x_as_words(dtype):
    torch.manual_seed(1)
    B, T, H, D = 2, 17, 4, 32
    cos, sin = table(T, D)
    rows = torch.stack([table(T, D, start=s)[0] for s in (0, 5)])[:, None]  # (B, 1, T, D/2): per-row positions
    rows_sin = torch.stack([table(T, D, start=s)[1] for s in (0, 5)])[:, None]
    rotation._compiled.clear()
    x = torch.randn(B, T, H, D).to(dtype).transpose(1, 2)  # (B, H, T, D) seen through a projection's layout
    for c, s in ((cos, sin), (rows, rows_sin)):
        assert same_bits(apply_rope(x, c, s, "interleaved", backend="compiled"), apply_rope_eager(x, c, s, "interleaved"))
    assert any(key[-1] for key in rotation._compiled), "the words path was not taken"


def test_words_path_is_not_taken_where_it_cannot_be():
    x = torch.randn(1, 1, 4, 9, dtype=torch.bfloat16)[..., 1:]  # odd offset: pairs straddle words
    assert "not whole words" in packed.words_reason(x)
    assert "float64" in packed.words_reason(torch.randn(2, 4, dtype=torch.float64))
    cos, sin = table(4, 8)
    assert torch.equal(apply_rope(x, cos, sin, "interleaved", backend="compiled"), apply_rope_eager(x, cos, sin, "interleaved"))
    # gradients: the compiled eager function, not the words
    xg = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16, requires_grad=True)
    apply_rope(xg, cos, sin, "interleaved", backend="compiled").float().sum().backward()
    assert xg.grad is not None
    with pytest.raises(ValueError, match="dtype must be one of"):
        packed.rotate_words(torch.zeros(2, 4, dtype=torch.int64), cos, sin, torch.float64)


def test_a_remembered_signature_still_checks_each_table():
    # apply_rope remembers argument signatures it has checked, but a full-width table of the same
    # shape (or a table modified in place into one) is still refused
    torch.manual_seed(2)
    x = torch.randn(1, 2, 5, 16)
    cos, sin = table(5, 8)  # (5, 4): 8 of 16 dims rotated
    apply_rope(x, cos, sin)
    full_cos, full_sin = torch.cat([cos[:, :2]] * 2, -1), torch.cat([sin[:, :2]] * 2, -1)  # (5, 4), HF's form of R = 4
    with pytest.raises(ValueError, match="repeat themselves"):
        apply_rope(x, full_cos, full_sin)
    cos.copy_(full_cos), sin.copy_(full_sin)
    with pytest.raises(ValueError, match="repeat themselves"):
        apply_rope(x, cos, sin)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_eager_path_under_vmap_and_forward_mode_ad(dtype):
    # functorch's batched tensors and forward-mode dual tensors report requires_grad=False: the
    # eager path's in-place branch must still work under them
    torch.manual_seed(4)
    cos, sin = table(5, 16)
    x = torch.randn(3, 2, 5, 16).to(dtype)
    batched = torch.func.vmap(lambda v: apply_rope(v, cos, sin, backend="eager"))(x)
    assert same_bits(batched, apply_rope_eager(x, cos, sin))
    tangent = torch.randn_like(x)
    out, jvp = torch.func.jvp(lambda v: apply_rope(v, cos, sin, backend="eager"), (x,), (tangent,))
    assert same_bits(out, apply_rope_eager(x, cos, sin))
    assert same_bits(jvp, apply_rope_eager(tangent, cos, sin))  # the rotation is linear in x


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_eager_gradient_of_16_bit_x_is_the_compiled_one(dtype):
    # summed in fp32 and rounded once (autograd through apply_rope_eager rounds each of its parts)
    torch.manual_seed(5)
    cos, sin = table(7, 16)
    grads = []
    for backend in ("eager", "compiled"):
        x = torch.randn(2, 2, 7, 16, generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_()
        (apply_rope(x, cos, sin, backend=backend).float() * torch.linspace(-1, 1, 16)).sum().backward()
        grads.append(x.grad)
    assert torch.equal(*grads)


def test_a_table_given_new_storage_is_checked_again():
    # ``t.data = ...`` keeps the tensor (and its version counter) but changes its memory
    torch.manual_seed(6)
    x = torch.randn(1, 2, 5, 16)
    cos, sin = table(5, 8)
    apply_rope(x, cos, sin)
    cos.data = torch.cat([cos[:, :2]] * 2, -1).clone()
    sin.data = torch.cat([sin[:, :2]] * 2, -1).clone()
    with pytest.raises(ValueError, match="repeat themselves"):
        apply_rope(x, cos, sin)
    new_cos, new_sin = table(5, 8, start=3)
    cos.data, sin.data = new_cos.clone(), new_sin.clone()  # valid again, other angles: no stale tables
    assert torch.equal(apply_rope(x, cos, sin, backend="eager"), apply_rope_eager(x, new_cos, new_sin))


def test_posenc_variants_do_not_use_up_a_user_functions_recompile_limit():
    import functools

    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    rotation._compiled.clear()
    rotation._compile_failed.clear()
    cos, sin = table(3, 8)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # 12 posenc variants, past the default limit of 8
        for layout in ("half", "interleaved"):
            for table_dtype in (torch.float32, torch.float64):
                x = torch.randn(1, 2, 3, 8).to(dtype)
                apply_rope(x, cos.to(table_dtype), sin.to(table_dtype), layout, backend="compiled")
    def scaled_sum(a, b, alpha):
        return a + alpha * b

    counter = CompileCounter()
    user = torch.compile(functools.partial(scaled_sum, alpha=2), backend=counter)
    user(torch.ones(3), torch.ones(3))
    assert counter.frame_count == 1  # compiled, not run eagerly past an exhausted limit
