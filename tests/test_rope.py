"""Tests of posenc.rope: frequencies, angles, the rotation in both layouts, layouts' permutation,
2-D axial RoPE, the RotaryEmbedding module and the compiled path."""

import math

import pytest
import torch

from posenc.lab import LMConfig, TinyLM
from posenc.rope import (
    FP64_ANGLES_FROM,
    ROPE_SCALINGS,
    RotaryEmbedding,
    apply_rope,
    apply_rope_eager,
    axial_rope_cos_sin,
    inverse_frequencies,
    layout_permutation,
    permute_qk_weight,
    rope_cos_sin,
    wavelengths,
)

LAYOUTS = ["half", "interleaved"]


# ----------------------------------------------------------------- independent formulations


def pairs_of(D: int, R: int, layout: str) -> list[tuple[int, int]]:
    """The rotated pairs, written out: (i, i + R/2) or (2i, 2i + 1)."""
    return [(i, i + R // 2) for i in range(R // 2)] if layout == "half" else [(2 * i, 2 * i + 1) for i in range(R // 2)]


def rope_per_pair(x: torch.Tensor, positions, base: float, layout: str, R: int | None = None) -> torch.Tensor:
    """Naive RoPE in fp64: a 2x2 rotation matrix per (token, pair), RoFormer eq. (13)."""
    D = x.shape[-1]
    R = D if R is None else R
    out = x.double().clone()
    for t, m in enumerate(positions):
        for i, (a, b) in enumerate(pairs_of(D, R, layout)):
            theta = m * base ** (-2.0 * i / R)
            rot = torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]], dtype=torch.float64)
            vec = torch.stack([x[..., t, a].double(), x[..., t, b].double()], dim=-1)  # (..., 2)
            res = vec @ rot.T
            out[..., t, a], out[..., t, b] = res[..., 0], res[..., 1]
    return out


def rope_complex(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Interleaved RoPE as complex multiplication x_c * exp(i m θ) (Meta's reference form), fp64."""
    D = x.shape[-1]
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], D // 2, 2).contiguous())
    rot = torch.polar(torch.ones(len(positions), D // 2, dtype=torch.float64), positions.double()[:, None] * theta)
    return torch.view_as_real(z * rot).reshape(x.shape)


def cos_sin64(positions: torch.Tensor, inv_freq: torch.Tensor):
    """fp64 cos/sin (for properties that hold exactly up to fp64 rounding)."""
    ang = positions.double()[..., None] * inv_freq.double()
    return ang.cos(), ang.sin()


def cos_sin(T: int, R: int, base: float = 10000.0, device="cpu", start: int = 0):
    inv, _ = inverse_frequencies(R, base, device=device)
    return rope_cos_sin(torch.arange(start, start + T, device=device), inv)


# ----------------------------------------------------------------- frequencies and angles


def test_inverse_frequencies_formula_and_frozen_values():
    inv, scale = inverse_frequencies(8, 10000.0)
    assert inv.dtype == torch.float32 and inv.shape == (4,) and scale == 1.0
    torch.testing.assert_close(inv, torch.tensor([1.0, 0.1, 0.01, 0.001]), rtol=1e-6, atol=0)
    inv128, _ = inverse_frequencies(128, 500000.0)
    exact = 500000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    torch.testing.assert_close(inv128.double(), exact, rtol=3e-7, atol=0)  # within fp32 rounding


def test_inverse_frequencies_bit_identical_to_the_reference_formula():
    # GPT-NeoX / Meta Llama / Hugging Face: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in fp32
    for dim, base in [(64, 10000.0), (128, 500000.0), (80, 1e6), (32, 10.0)]:
        ref = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        assert torch.equal(inverse_frequencies(dim, base)[0], ref)


def test_scaling_table_and_default_entry():
    assert "default" in ROPE_SCALINGS
    assert torch.equal(inverse_frequencies(16, scaling={"rope_type": "default"})[0], inverse_frequencies(16)[0])


def test_wavelengths_are_two_pi_over_frequency():
    inv, _ = inverse_frequencies(64)
    w = wavelengths(inv)
    assert w[0] == pytest.approx(2 * math.pi) and w[-1] == pytest.approx(2 * math.pi * 10000 ** (62 / 64), rel=1e-6)
    assert bool((w[1:] > w[:-1]).all())


def test_cos_sin_shape_dtype_and_values(device):
    inv, _ = inverse_frequencies(16, device=device)
    pos = torch.arange(6, device=device).view(2, 3)  # any shape of positions
    c, s = rope_cos_sin(pos, inv)
    assert c.shape == s.shape == (2, 3, 8) and c.dtype == s.dtype == torch.float32 and c.device.type == device.type
    ang = pos.double()[..., None] * inv.double()
    torch.testing.assert_close(c.double(), ang.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(s.double(), ang.sin(), atol=1e-6, rtol=0)
    c2, s2 = rope_cos_sin(pos, inv, attention_scale=0.5)
    torch.testing.assert_close(c2, 0.5 * c)
    torch.testing.assert_close(s2, 0.5 * s)


def test_cos_sin_bit_identical_to_fp32_reference_below_threshold():
    inv, _ = inverse_frequencies(128, 10000.0)
    pos = torch.arange(FP64_ANGLES_FROM)
    ang = pos.float()[:, None] * inv[None, :]  # Hugging Face: inv_freq (x) positions in fp32
    c, s = rope_cos_sin(pos, inv)
    assert torch.equal(c, ang.cos()) and torch.equal(s, ang.sin())


def test_far_positions_use_fp64_angles(device):
    inv, _ = inverse_frequencies(64, device=device)
    pos = torch.tensor([FP64_ANGLES_FROM, 100_000, 1_000_000, 3_000_000], device=device)
    c, s = rope_cos_sin(pos, inv)
    exact = pos.double()[:, None] * inv.double()[None, :]
    torch.testing.assert_close(c.double(), exact.cos(), atol=1.2e-7, rtol=0)
    torch.testing.assert_close(s.double(), exact.sin(), atol=1.2e-7, rtol=0)
    fp32 = (pos.float()[:, None] * inv[None, :]).cos().double()
    assert (fp32 - exact.cos()).abs().max() > 1e-3  # what fp32 angles would have given


def test_a_positions_cos_sin_do_not_depend_on_its_neighbours():
    inv, _ = inverse_frequencies(32)
    alone = rope_cos_sin(torch.tensor([100]), inv)
    with_far = rope_cos_sin(torch.tensor([100, 2 * FP64_ANGLES_FROM]), inv)
    assert torch.equal(alone[0][0], with_far[0][0]) and torch.equal(alone[1][0], with_far[1][0])


# ----------------------------------------------------------------- the rotation


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("D,R", [(8, 8), (12, 8), (16, 4)])
def test_apply_rope_matches_per_pair_rotation(layout, D, R, device):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, D, device=device)
    positions = [0, 1, 7, 100, 4095]
    c, s = rope_cos_sin(torch.tensor(positions, device=device), inverse_frequencies(R, device=device)[0])
    got = apply_rope(x, c, s, layout)
    torch.testing.assert_close(got.double().cpu(), rope_per_pair(x.cpu(), positions, 10000.0, layout, R), atol=2e-5, rtol=0)
    torch.testing.assert_close(got[..., R:], x[..., R:], atol=0, rtol=0)  # partial rotary: the rest pass through


def test_interleaved_matches_complex_multiplication(device):
    torch.manual_seed(1)
    x = torch.randn(2, 4, 9, 32, device=device, dtype=torch.float64)
    pos = torch.arange(3, 12, device=device)
    c, s = rope_cos_sin(pos, inverse_frequencies(32, device=device)[0])
    got = apply_rope(x, c.double(), s.double(), "interleaved")
    torch.testing.assert_close(got.cpu(), rope_complex(x.cpu(), pos.cpu(), 10000.0), atol=1e-6, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_norm_is_preserved(layout, device):
    torch.manual_seed(2)
    x = torch.randn(3, 2, 50, 64, device=device, dtype=torch.float64)
    c, s = cos_sin64(torch.arange(1000, 1050, device=device), inverse_frequencies(64, device=device)[0])
    y = apply_rope(x, c, s, layout)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scores_depend_only_on_offset(layout, device):
    # <R_m q, R_n k> = <q, R_{n-m} k>: shifting both positions by any amount leaves the score unchanged
    torch.manual_seed(3)
    q, k = torch.randn(64, device=device, dtype=torch.float64), torch.randn(64, device=device, dtype=torch.float64)
    inv = inverse_frequencies(64, device=device)[0]

    def score(m, n):
        cm, sm = cos_sin64(torch.tensor([m], device=device), inv)
        cn, sn = cos_sin64(torch.tensor([n], device=device), inv)
        return (apply_rope(q[None], cm, sm, layout) * apply_rope(k[None], cn, sn, layout)).sum()

    for offset in [0, 1, 5, -7, 300]:
        ref = score(0, offset) if offset >= 0 else score(-offset, 0)
        for shift in [1, 17, 1000, 3000]:
            m, n = (shift, shift + offset) if offset >= 0 else (shift - offset, shift)
            torch.testing.assert_close(score(m, n), ref, atol=1e-9, rtol=1e-9)
        # and equals <q, R_{n-m} k> with the query unrotated
        c, s = cos_sin64(torch.tensor([offset], device=device), inv)
        torch.testing.assert_close((q * apply_rope(k[None], c, s, layout)[0]).sum(), ref, atol=1e-9, rtol=1e-9)
    # with the fp32 cos/sin of rope_cos_sin the property holds to fp32 accuracy
    c0, s0 = rope_cos_sin(torch.tensor([0, 3, 2000, 2003], device=device), inv)
    r = apply_rope(torch.stack([q, k, q, k]).float(), c0, s0, layout)
    torch.testing.assert_close((r[0] * r[1]).sum(), (r[2] * r[3]).sum(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_position_zero_is_identity_and_rotations_compose(layout, device):
    torch.manual_seed(4)
    x = torch.randn(1, 1, 1, 16, device=device, dtype=torch.float64)
    inv = inverse_frequencies(16, device=device)[0]
    cs = lambda p: cos_sin64(torch.tensor([p], device=device), inv)  # noqa: E731
    assert torch.equal(apply_rope(x, *cs(0), layout), x)
    torch.testing.assert_close(apply_rope(apply_rope(x, *cs(3), layout), *cs(5), layout), apply_rope(x, *cs(8), layout))
    torch.testing.assert_close(apply_rope(apply_rope(x, *cs(9), layout), *cs(-9), layout), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_dtype_is_kept_and_rotation_rounds_once(dtype, device):
    torch.manual_seed(5)
    x = torch.randn(2, 3, 7, 16, device=device).to(dtype)
    c, s = cos_sin(7, 16, device=device, start=50)
    y = apply_rope(x, c, s)
    assert y.dtype == dtype and y.shape == x.shape
    ref = apply_rope(x.double(), c.double(), s.double())  # exact rotation of the same (rounded) input
    if dtype in (torch.float32, torch.float64):
        torch.testing.assert_close(y.double(), ref, atol=1e-6, rtol=0)
    else:  # computed in fp32 and rounded once: the correctly rounded result (up to rare double-rounding ties)
        assert (y == ref.to(dtype)).double().mean() > 0.99
        eps = torch.finfo(dtype).eps
        assert bool(((y.double() - ref).abs() <= eps * ref.abs().clamp_min(1e-3)).all())


def test_cos_sin_broadcast_over_batch_and_heads(device):
    torch.manual_seed(6)
    x = torch.randn(2, 3, 4, 8, device=device)
    pos = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]], device=device)  # per-batch positions (B, T)
    c, s = rope_cos_sin(pos, inverse_frequencies(8, device=device)[0])  # (B, T, 4)
    y = apply_rope(x, c[:, None], s[:, None])  # (B, 1, T, 4)
    for b in range(2):
        torch.testing.assert_close(y[b], apply_rope(x[b], c[b], s[b]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_is_the_inverse_rotation(layout):
    # d/dx <g, R x> = R^T g = R_{-m} g: gradcheck in fp64, plus the closed form
    x = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    c, s = (t.double() for t in cos_sin(3, 8, start=2))
    assert torch.autograd.gradcheck(lambda z: apply_rope(z, c, s, layout, backend="eager"), (x,))
    g = torch.randn_like(x)
    (apply_rope(x, c, s, layout) * g).sum().backward()
    torch.testing.assert_close(x.grad, apply_rope(g, c, -s, layout))


# ----------------------------------------------------------------- compiled path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_compiled_path_gives_the_eager_results(layout, device):
    torch.manual_seed(7)
    c, s = cos_sin(33, 32, device=device, start=5)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 4, 33, 40, device=device).to(dtype)  # partial rotary: 32 of 40 dims
        eager = apply_rope(x, c[:, :16], s[:, :16], layout, backend="eager")
        compiled = apply_rope(x, c[:, :16], s[:, :16], layout, backend="compiled")
        if device.type == "cpu":
            assert torch.equal(compiled, eager)
        else:  # GPU kernels may fuse a multiply-add: one rounding fewer
            torch.testing.assert_close(compiled, eager, atol=2e-6 if dtype == torch.float32 else 1e-2, rtol=0)


def test_many_variants_each_stay_compiled(recwarn):
    # nine variants of one layout (three dtypes x three rotary widths), each at two lengths: more
    # than torch.compile's recompile limit of 8 for a single compiled function, past which it used
    # to run eagerly without a word. Each variant now has its own compiled function, and hitting the
    # limit would raise inside it and warn.
    import warnings

    import posenc.rope.rotation as rope

    torch._dynamo.reset()
    rope._compiled.clear()
    rope._compile_failed.clear()
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for half in (8, 12, 16):
                for T in (9, 17):
                    c, s = cos_sin(T, 2 * half, start=3)
                    x = torch.randn(1, 2, T, 40).to(dtype)
                    assert torch.equal(apply_rope(x, c, s, backend="compiled"), apply_rope(x, c, s, backend="eager"))
    assert len(rope._compiled) == 9 and not rope._compile_failed


@pytest.mark.parametrize("layout", LAYOUTS)
def test_halves_are_rounded_to_the_input_dtype_before_they_are_joined(layout):
    # so that a compiled kernel writes bf16 directly instead of a full fp32 intermediate (on the CPU
    # this made the bf16 half-layout kernel 3 to 12 times faster); the rotation itself runs in fp32
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("cat", "stack"):
                joins.append([t.dtype for t in args[0]])
            return func(*args, **(kwargs or {}))

    joins = []
    c, s = cos_sin(5, 16)
    x = torch.randn(2, 5, 24, dtype=torch.bfloat16)  # partial rotary: 16 of 24 dims
    with Record():
        apply_rope_eager(x, c, s, layout)
    assert joins and all(d == torch.bfloat16 for dtypes in joins for d in dtypes)


def test_auto_backend_is_eager_for_small_inputs(monkeypatch):
    import posenc.rope.rotation as rope

    calls = []
    monkeypatch.setattr(rope, "_apply_compiled", lambda *a: calls.append(a) or apply_rope_eager(*a))
    c, s = cos_sin(4, 8)
    rope.apply_rope(torch.randn(1, 1, 4, 8), c, s)
    assert not calls
    monkeypatch.setattr(rope, "COMPILE_MIN_NUMEL", 16)
    rope.apply_rope(torch.randn(1, 1, 4, 8), c, s)
    assert len(calls) == 1


# ----------------------------------------------------------------- layouts


def test_layout_permutation_frozen_values():
    assert layout_permutation(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert layout_permutation(6, rotary_dim=4).tolist() == [0, 2, 1, 3, 4, 5]


@pytest.mark.parametrize("D,R", [(16, 16), (24, 16)])
def test_layouts_are_the_same_method_up_to_the_permutation(D, R, device):
    torch.manual_seed(8)
    x = torch.randn(2, 3, 6, D, device=device)
    c, s = cos_sin(6, R, device=device, start=11)
    p = layout_permutation(D, R).to(device)
    torch.testing.assert_close(apply_rope(x[..., p], c, s, "half"), apply_rope(x, c, s, "interleaved")[..., p], atol=0, rtol=0)
    inv = torch.argsort(p)
    torch.testing.assert_close(apply_rope(x[..., inv], c, s, "interleaved"), apply_rope(x, c, s, "half")[..., inv], atol=0, rtol=0)


@pytest.mark.parametrize("source,target", [("interleaved", "half"), ("half", "interleaved")])
def test_converted_projection_gives_identical_scores(source, target, device):
    # a model's q/k projections in one layout, converted, give the same attention scores in the other
    torch.manual_seed(9)
    H, D, C, T = 4, 16, 32, 10
    wq, wk = torch.randn(H * D, C, device=device), torch.randn(H * D, C, device=device)
    x = torch.randn(T, C, device=device)
    c, s = cos_sin(T, D, device=device, start=3)

    def scores(wq, wk, layout):
        q = apply_rope((x @ wq.T).view(T, H, D).transpose(0, 1), c, s, layout)  # (H, T, D)
        k = apply_rope((x @ wk.T).view(T, H, D).transpose(0, 1), c, s, layout)
        return q @ k.transpose(-1, -2)  # (H, T, T)

    before = scores(wq, wk, source)
    after = scores(permute_qk_weight(wq, H, source=source, target=target), permute_qk_weight(wk, H, source=source, target=target), target)
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-5)
    assert not torch.allclose(scores(wq, wk, target), before, atol=1e-2)  # without conversion they differ
    back = permute_qk_weight(permute_qk_weight(wq, H, source=source, target=target), H, source=target, target=source)
    assert torch.equal(back, wq)


# ----------------------------------------------------------------- 2-D axial RoPE


def test_axial_scores_depend_only_on_row_and_column_offsets(device):
    torch.manual_seed(10)
    D = 32
    q, k = torch.randn(D, device=device, dtype=torch.float64), torch.randn(D, device=device, dtype=torch.float64)

    def score(qr, qc, kr, kc):
        c, s = axial_rope_cos_sin(torch.tensor([qr, kr], device=device), torch.tensor([qc, kc], device=device), D)
        rq = apply_rope(q[None], c[:1].double(), s[:1].double())
        rk = apply_rope(k[None], c[1:].double(), s[1:].double())
        return (rq * rk).sum()

    ref = score(0, 0, 2, -3)
    for dr, dc in [(1, 1), (5, 0), (0, 7), (13, 4)]:
        torch.testing.assert_close(score(dr, dc, 2 + dr, -3 + dc), ref, atol=1e-5, rtol=1e-6)  # fp32 cos/sin
    assert not torch.allclose(score(0, 0, 2, -3), score(0, 0, -3, 2))  # rows and columns are not interchangeable
    assert not torch.allclose(score(0, 0, 2, -3), score(0, 0, 2, 3))


def test_axial_first_quarter_of_pairs_follows_rows():
    c, s = axial_rope_cos_sin(torch.tensor([0, 1]), torch.tensor([5, 5]), 16)
    assert c.shape == (2, 8)
    assert torch.equal(c[0, :4], torch.ones(4)) and not torch.equal(c[1, :4], torch.ones(4))
    assert torch.equal(c[0, 4:], c[1, 4:])  # same column: same angles


# ----------------------------------------------------------------- the module


def test_rotary_embedding_cache_and_transform(device):
    rope = RotaryEmbedding(16, 64).to(device)
    assert rope.cos_cached.shape == (64, 8) and rope.cos_cached.dtype == torch.float32
    assert sum(p.numel() for p in rope.parameters()) == 0 and "cos_cached" not in rope.state_dict()
    q, k = torch.randn(2, 2, 5, 16, device=device), torch.randn(2, 2, 7, 16, device=device)
    qp, kp = torch.arange(2, 7, device=device), torch.arange(7, device=device)
    rq, rk = rope.transform_qk(q, k, qp, kp, 0)
    c, s = cos_sin(64, 16, device=device)
    torch.testing.assert_close(rq, apply_rope(q, c[2:7], s[2:7]))
    torch.testing.assert_close(rk, apply_rope(k, c[:7], s[:7]))


def test_rotary_embedding_cache_stays_fp32_under_model_cast():
    rope = RotaryEmbedding(16, 32)
    ref = rope.cos_cached.clone()
    rope.to(torch.bfloat16)
    assert rope.cos_cached.dtype == torch.float32 and torch.equal(rope.cos_cached, ref)
    x = torch.randn(1, 1, 32, 16).to(torch.bfloat16)
    y, _ = rope.transform_qk(x, x, torch.arange(32), torch.arange(32), 0)
    assert y.dtype == torch.bfloat16


def test_rotary_embedding_build_cache_and_limits():
    rope = RotaryEmbedding(8, 4)
    with pytest.raises(ValueError, match="max_positions=4"):
        rope.cos_sin(torch.tensor([4]))
    rope.build_cache(10)
    assert rope.max_positions == 10 and rope.cos_sin(torch.tensor([9]))[0].shape == (1, 4)


def test_rope_in_the_tiny_lm_is_relative():
    # shifting every position by the same amount leaves the logits unchanged (RoPE is the only position signal)
    cfg = LMConfig(vocab_size=20, d_model=32, n_head=2, n_layer=2, max_len=64)
    model = TinyLM(cfg, "rope").eval()
    idx = torch.randint(0, 20, (2, 10))
    with torch.no_grad():
        a = model(idx, torch.arange(10))
        b = model(idx, torch.arange(30, 40))
        spread = model(idx, torch.arange(0, 30, 3))  # other distances: other logits
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    assert (a - spread).abs().max() > 1e-4


def test_partial_rotary_module():
    rope = RotaryEmbedding(16, 8, rotary_dim=8, layout="interleaved")
    x = torch.randn(1, 1, 8, 16)
    y, _ = rope.transform_qk(x, x, torch.arange(8), torch.arange(8), 0)
    assert torch.equal(y[..., 8:], x[..., 8:]) and not torch.equal(y[..., :8], x[..., :8])


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(head_dim=7), ValueError, "head_dim must be a positive even int.*7"),
        (dict(head_dim=0), ValueError, "head_dim"),
        (dict(head_dim=8, base=1.0), ValueError, "base must be a finite number > 1, got 1.0"),
        (dict(head_dim=8, base=float("inf")), ValueError, "base"),
        (dict(head_dim=8, scaling="linear"), TypeError, "scaling must be None or a mapping"),
        (dict(head_dim=8, scaling={"rope_type": "magic"}), ValueError, "unknown rope_type 'magic'"),
    ],
)
def test_inverse_frequencies_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        inverse_frequencies(**kwargs)


def test_cos_sin_bad_input():
    inv = inverse_frequencies(8)[0]
    with pytest.raises(TypeError, match="positions must be an integer or float tensor"):
        rope_cos_sin(torch.tensor([True]), inv)
    with pytest.raises(TypeError, match="inv_freq must be a float tensor"):
        rope_cos_sin(torch.arange(3), torch.arange(4))
    with pytest.raises(ValueError, match="inv_freq must be 1-D"):
        rope_cos_sin(torch.arange(3), inv[None])
    with pytest.raises(ValueError, match="positions must be finite"):
        rope_cos_sin(torch.tensor([float("nan")]), inv)


def test_apply_rope_bad_input():
    x = torch.randn(1, 2, 4, 8)
    c, s = cos_sin(4, 8)
    with pytest.raises(ValueError, match="layout must be one of .* got 'neox'"):
        apply_rope(x, c, s, "neox")
    with pytest.raises(ValueError, match="backend must be one of"):
        apply_rope(x, c, s, backend="fused")
    with pytest.raises(ValueError, match="D=7"):
        apply_rope(torch.randn(1, 4, 7), c[:, :3], s[:, :3])
    with pytest.raises(ValueError, match="R/2 <= D/2 = 4"):
        apply_rope(x, torch.ones(4, 5), torch.ones(4, 5))
    with pytest.raises(ValueError, match="same shape"):
        apply_rope(x, c, s[:3])
    with pytest.raises(ValueError, match="do not broadcast"):
        apply_rope(x, c[:3], s[:3])
    with pytest.raises(ValueError, match="do not broadcast"):
        apply_rope(x, torch.ones(3, 1, 4, 4), torch.ones(3, 1, 4, 4))
    with pytest.raises(TypeError, match="x must be a float tensor"):
        apply_rope(torch.ones(1, 4, 8, dtype=torch.long), c, s)


def test_layout_and_module_bad_input():
    with pytest.raises(ValueError, match="rotary_dim must be <= head_dim=8"):
        layout_permutation(8, 10)
    with pytest.raises(ValueError, match="rotary_dim must be a positive even int"):
        layout_permutation(8, 3)
    with pytest.raises(ValueError, match="target must be one of"):
        permute_qk_weight(torch.ones(8, 4), 2, source="half", target="gptj")
    with pytest.raises(ValueError, match="n_head must be a positive int dividing weight.shape\\[0\\]=8"):
        permute_qk_weight(torch.ones(8, 4), 3, source="half", target="interleaved")
    with pytest.raises(ValueError, match="layout must be one of"):
        RotaryEmbedding(8, 4, layout="gptj")
    with pytest.raises(ValueError, match="max_positions must be a positive int"):
        RotaryEmbedding(8, 0)
    with pytest.raises(ValueError, match="multiple of 4"):
        axial_rope_cos_sin(torch.arange(2), torch.arange(2), 6)


def test_permutation_matches_the_llama_conversion_formula():
    # Meta (interleaved) -> Hugging Face (half): per head, view the rows as (D/2, 2), swap the two axes
    H, D, C = 3, 8, 5
    w = torch.randn(H * D, C)
    expected = w.view(H, D // 2, 2, C).transpose(1, 2).reshape(H * D, C)
    assert torch.equal(permute_qk_weight(w, H, source="interleaved", target="half"), expected)


# ----------------------------------------------------------------- deferred initialisation and compile


def test_rope_cos_sin_compiles_with_fullgraph():
    # no data-dependent branch under torch.compile: fp64 angles are computed for every position and
    # kept past FP64_ANGLES_FROM, giving the eager values (to one ulp: the compiled cos and sin are
    # other implementations); far out the exact angles stay, not the fp32 ones (0.06 rad apart at 1e6)
    inv, _ = inverse_frequencies(64, 500000.0)
    positions = torch.tensor([0, 5, 4095, 4096, 70000, 1_000_000])
    compiled = torch.compile(rope_cos_sin, fullgraph=True)
    for arithmetic in ("exact", "transformers"):
        got = compiled(positions, inv, 1.25, arithmetic=arithmetic)
        want = rope_cos_sin(positions, inv, 1.25, arithmetic=arithmetic)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1.25 * 2**-23, rtol=0)
    fp32 = rope_cos_sin(positions, inv, 1.25, arithmetic="transformers")[0]
    assert (compiled(positions, inv, 1.25)[0][-1] - fp32[-1]).abs().max() > 1e-3


def test_rotary_embedding_can_be_built_on_the_meta_device():
    # deferred (FSDP-style) initialisation: shapes only on meta; to_empty computes the values
    reference = TinyLM(LMConfig(vocab_size=16, d_model=32, n_head=2, n_layer=1, max_len=64), "rope")
    with torch.device("meta"):
        model = TinyLM(LMConfig(vocab_size=16, d_model=32, n_head=2, n_layer=1, max_len=64), "rope")
    assert model.position.cos_cached.is_meta and model.position.cos_cached.shape == (64, 8)
    model.to_empty(device="cpu")
    for name in ("inv_freq", "cos_cached", "sin_cached"):
        assert torch.equal(getattr(model.position, name), getattr(reference.position, name)), name


# ----------------------------------------------------------------- the eager path's full-width form


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_eager_path_gives_the_reference_formulation_bit_for_bit(layout, dtype, device):
    # apply_rope's eager path computes x * c + swap(x) * s with full-width tables built once per (cos, sin):
    # the same products and sums as apply_rope_eager, rounded once
    torch.manual_seed(4)
    for shape, positions in [((8, 4, 1, 32), [32767]), ((2, 4, 9, 40), list(range(3, 12)))]:  # decode; partial 32/40
        c, s = rope_cos_sin(torch.tensor(positions, device=device), inverse_frequencies(32, device=device)[0])
        if dtype == torch.float64:
            c, s = c.double(), s.double()
        x = torch.randn(shape, device=device).to(dtype)
        for _ in range(2):  # the second call reads the cached tables
            assert torch.equal(apply_rope(x, c, s, layout, backend="eager"), apply_rope_eager(x, c, s, layout))


def test_the_cached_tables_follow_in_place_changes_and_inference_tensors():
    c, s = rope_cos_sin(torch.arange(5), inverse_frequencies(8)[0])
    x = torch.randn(1, 5, 8)
    apply_rope(x, c, s, backend="eager")
    c.mul_(0.5)  # in place: the version changes, the tables are rebuilt
    assert torch.equal(apply_rope(x, c, s, backend="eager"), apply_rope_eager(x, c, s))
    with torch.inference_mode():
        ci, si = rope_cos_sin(torch.arange(5), inverse_frequencies(8)[0])
        assert torch.equal(apply_rope(x, ci, si, backend="eager"), apply_rope_eager(x, ci, si))
