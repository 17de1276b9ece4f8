"""Tests of posenc.attention: the two backends, masks, the symmetry of attention, validation."""

import math

import pytest
import torch

from posenc.attention import SelfAttention, attention, causal_mask
from posenc.method import NoPE, PositionMethod

TOL = {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=1e-5, rtol=1e-5)}


def qkv(B=2, H=3, T=5, S=7, D=8, Dv=None, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).to(device)  # noqa: E731
    return make(B, H, T, D), make(B, H, S, D), make(B, H, S, Dv or D)


def naive_attention(q, k, v, bias=None, mask=None):
    """Independent formulation: explicit loops over batch, head and query."""
    B, H, T, D = q.shape
    out = torch.zeros(B, H, T, v.shape[-1], dtype=q.dtype)
    if bias is not None:
        bias = bias.expand(B, H, T, k.shape[2])
    for b in range(B):
        for h in range(H):
            for t in range(T):
                logits = [
                    float(q[b, h, t] @ k[b, h, s]) / math.sqrt(D) + (0.0 if bias is None else float(bias[b, h, t, s]))
                    for s in range(k.shape[2])
                ]
                keep = [mask is None or not bool(mask[b, h, t, s]) for s in range(k.shape[2])]
                if not any(keep):
                    continue
                m = max(x for x, kp in zip(logits, keep) if kp)
                w = [math.exp(x - m) if kp else 0.0 for x, kp in zip(logits, keep)]
                z = sum(w)
                for s, ws in enumerate(w):
                    out[b, h, t] += ws / z * v[b, h, s].cpu()
    return out


def test_causal_mask_frozen_values():
    expected = torch.tensor([[False, False, True, True], [False, False, False, True], [False, False, False, False]])
    assert torch.equal(causal_mask(3, 4), expected)
    assert torch.equal(causal_mask(3, 3), torch.triu(torch.ones(3, 3, dtype=torch.bool), diagonal=1))


@pytest.mark.parametrize("t,s", [(0, 3), (4, 3)])
def test_causal_mask_rejects_bad_sizes(t, s):
    with pytest.raises(ValueError, match="1 <= t <= s"):
        causal_mask(t, s)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_padding", [False, True])
def test_reference_matches_naive_loops(causal, with_bias, with_padding):
    q, k, v = qkv(T=4, S=6)
    bias = torch.randn(1, 3, 4, 6, dtype=torch.float64) if with_bias else None
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :2] = True
    mask = torch.zeros(2, 3, 4, 6, dtype=torch.bool)
    if causal:
        mask |= causal_mask(4, 6)
    if with_padding:
        mask |= pad[:, None, None, :]
    out = attention(q, k, v, bias=bias, causal=causal, key_padding_mask=pad if with_padding else None)
    torch.testing.assert_close(out, naive_attention(q, k, v, bias, mask), **TOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S", [(5, 5), (3, 7), (1, 6)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_padding", [False, True])
def test_backends_agree(device, dtype, causal, T, S, with_bias, with_padding):
    q, k, v = qkv(T=T, S=S, Dv=5, dtype=dtype, device=device)
    bias = torch.randn(2, 1, T, S, dtype=dtype).to(device) if with_bias else None
    pad = None
    if with_padding:
        pad = torch.zeros(2, S, dtype=torch.bool, device=device)
        pad[0, -2:] = True
    kw = dict(bias=bias, causal=causal, key_padding_mask=pad)
    ref = attention(q, k, v, backend="reference", **kw)
    fast = attention(q, k, v, backend="sdpa", **kw)
    assert ref.shape == fast.shape == (2, 3, T, 5)
    torch.testing.assert_close(ref, fast, **TOL[dtype])


@pytest.mark.parametrize("bias_shape", [(5, 7), (3, 5, 7), (2, 1, 1, 7)])
def test_backends_agree_for_any_broadcastable_bias_with_masks(bias_shape):
    q, k, v = qkv()
    bias = torch.randn(*bias_shape, dtype=torch.float64)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 3:] = True
    kw = dict(bias=bias, causal=True, key_padding_mask=pad)
    torch.testing.assert_close(attention(q, k, v, backend="sdpa", **kw), attention(q, k, v, **kw))


def test_weights_are_a_distribution_and_reproduce_output():
    q, k, v = qkv()
    out, w = attention(q, k, v, causal=True, return_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64))
    assert (w[..., causal_mask(5, 7)] == 0).all()
    torch.testing.assert_close(out, w @ v)


def test_fully_masked_query_gives_zero_not_nan(device):
    q, k, v = qkv(T=3, S=3, device=device)
    pad = torch.zeros(2, 3, dtype=torch.bool, device=device)
    pad[1, 0] = True  # with causal, query 0 of row 1 sees nothing
    for backend in ("reference", "sdpa"):
        out = attention(q, k, v, causal=True, key_padding_mask=pad, backend=backend)
        assert torch.isfinite(out).all()
        assert (out[1, :, 0] == 0).all()
    q.requires_grad_(True)
    attention(q, k, v, causal=True, key_padding_mask=pad).sum().backward()
    assert torch.isfinite(q.grad).all()


def test_custom_scale():
    q, k, v = qkv()
    torch.testing.assert_close(attention(q, k, v, scale=1.0), attention(q * math.sqrt(8), k, v))
    torch.testing.assert_close(attention(q, k, v, scale=0.5, backend="sdpa"), attention(q, k, v, scale=0.5))


def test_half_precision_reference_computes_in_fp32():
    q, k, v = qkv(dtype=torch.float32)
    out = attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), attention(q, k, v), atol=5e-2, rtol=5e-2)


def test_bias_shifts_attention():
    q, k, v = qkv(T=1, S=2)
    bias = torch.tensor([0.0, -1e9], dtype=torch.float64)  # remove key 1
    out = attention(q, k, v, bias=bias)
    torch.testing.assert_close(out, v[:, :, :1].expand_as(out))


def test_permutation_equivariance_without_mask():
    """Attention without position is permutation-equivariant: attention(P X) = P attention(X)."""
    q, k, v = qkv(T=6, S=6)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(1))
    out = attention(q, k, v)
    out_perm = attention(q[:, :, perm], k[:, :, perm], v[:, :, perm])
    torch.testing.assert_close(out_perm, out[:, :, perm])
    assert not torch.allclose(out_perm, out)  # the outputs move with the inputs: not invariant


def test_causal_attention_is_not_equivariant_but_prefix_invariant():
    q, k, v = qkv(T=6, S=6)
    perm = torch.tensor([3, 1, 0, 2, 4, 5])  # shuffles the prefix of position 4
    out = attention(q, k, v, causal=True)
    out_perm = attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], causal=True)
    assert not torch.allclose(out_perm, out[:, :, perm])
    torch.testing.assert_close(out_perm[:, :, 4:], out[:, :, 4:])  # tokens 4, 5 see the same set


def test_validation_messages():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        attention(q.numpy(), k, v)
    with pytest.raises(TypeError, match="k must be a floating-point"):
        attention(q, k.long(), v)
    with pytest.raises(ValueError, match=r"v must have shape \(B, H, L, D\)"):
        attention(q, k, v[0])
    with pytest.raises(TypeError, match="share a dtype"):
        attention(q, k.float(), v)
    with pytest.raises(ValueError, match=r"which divides q's H.*q \(2, 3, 5, 8\), k \(2, 2, 7, 8\)"):
        attention(q, k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match="share the head dim D"):
        attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="share the key length S"):
        attention(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="backend must be one of"):
        attention(q, k, v, backend="flash")
    with pytest.raises(ValueError, match="causal attention needs T <= S"):
        attention(k, q, q, causal=True)
    with pytest.raises(TypeError, match="bias must be a floating-point"):
        attention(q, k, v, bias=torch.ones(5, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"does not broadcast to \(B, H, T, S\)"):
        attention(q, k, v, bias=torch.ones(5, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor.*as attention_mask= instead"):
        attention(q, k, v, key_padding_mask=torch.ones(2, 7))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, S\)"):
        attention(q, k, v, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="return_weights=True needs backend='reference'"):
        attention(q, k, v, backend="sdpa", return_weights=True)


class Recorder(PositionMethod):
    """Adds a bias on the logits and scales queries; records what it was called with."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def transform_qk(self, q, k, q_positions, k_positions, layer):
        self.calls.append(("qk", layer, q_positions.tolist()))
        return 2 * q, k

    def attention_bias(self, q, k, q_positions, k_positions, layer):
        self.calls.append(("bias", layer, k_positions.tolist()))
        rel = (k_positions[None, :] - q_positions[:, None]).to(q.dtype)  # key - query
        return -0.5 * rel.abs()


def test_self_attention_uses_method_hooks(device):
    torch.manual_seed(0)
    layer = SelfAttention(16, 4, backend="reference").to(device).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, device=device)
    pos = torch.arange(5, device=device)
    rec = Recorder()
    y = layer(x, pos, rec, layer=3)
    assert [c[:2] for c in rec.calls] == [("qk", 3), ("bias", 3)]
    # the same computation by hand
    q, k, v = layer.qkv(x).split(16, dim=2)
    q, k, v = (z.view(2, 5, 4, 4).transpose(1, 2) for z in (q, k, v))
    rel = (pos[None, :] - pos[:, None]).double()
    ref = attention(2 * q, k, v, bias=-0.5 * rel.abs(), causal=True)
    torch.testing.assert_close(y, layer.proj(ref.transpose(1, 2).reshape(2, 5, 16)))
    # backends agree through the module, and NoPE is the identity hook
    fast = SelfAttention(16, 4, backend="sdpa").to(device).double()
    fast.load_state_dict(layer.state_dict())
    torch.testing.assert_close(fast(x, pos, rec), y)
    y_nope, w = layer(x, pos, NoPE(), return_weights=True)
    assert w.shape == (2, 4, 5, 5)


def test_self_attention_validation():
    with pytest.raises(ValueError, match="n_head must be a positive divisor of d_model=10"):
        SelfAttention(10, 4)
    with pytest.raises(ValueError, match="backend must be one of"):
        SelfAttention(8, 2, backend="xformers")
    layer = SelfAttention(8, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, C\)"):
        layer(torch.randn(3, 8), torch.arange(3), NoPE())
    with pytest.raises(ValueError, match=r"positions of shape \(4,\) do not match x's \(B, T\) = \(1, 3\)"):
        layer(torch.randn(1, 3, 8), torch.arange(4), NoPE())
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        layer(torch.randn(1, 3, 8), torch.arange(3.0), NoPE())


# ---- bias functions and the flex backend -------------------------------------------------------

def t5_like_bias_fn(H, T, S, dtype, device, seed=0):
    """A bias of (head, key - query) read from a lookup table, as RelativeScalarBias builds it."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(H, T + S - 1, generator=g, dtype=dtype).to(device)  # relative -(T-1)..S-1

    def bias_fn(b, h, q_idx, kv_idx):
        return table[h, kv_idx - q_idx + T - 1]

    dense = table[:, torch.arange(S, device=device)[None, :] - torch.arange(T, device=device)[:, None] + T - 1]
    return bias_fn, dense  # dense: (H, T, S)


def test_materialize_bias_is_the_dense_bias():
    from posenc.attention import materialize_bias

    fn, dense = t5_like_bias_fn(3, 4, 6, torch.float64, "cpu")
    bias = materialize_bias(fn, 2, 3, 4, 6)
    assert bias.shape == (1, 3, 4, 6)  # the batch index is unused, so it stays 1
    torch.testing.assert_close(bias[0], dense, rtol=0, atol=0)
    q, k, v = qkv(H=3, T=4, S=6)
    for backend in ("reference", "sdpa"):
        torch.testing.assert_close(
            attention(q, k, v, bias_fn=fn, causal=True, backend=backend),
            attention(q, k, v, bias=dense, causal=True, backend=backend),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T,S", [(6, 6), (1, 6)])
def test_plain_causal_sdpa_builds_no_mask(monkeypatch, device, dtype, T, S):
    """T = S (SDPA's is_causal) and T = 1 (the query sees every key): no (T, S) mask is built."""
    import sys

    attn_mod = sys.modules["posenc.attention"]  # the module (the package exports a function of that name)
    q, k, v = qkv(T=T, S=S, dtype=dtype, device=device)
    expected = naive_attention(q.cpu(), k.cpu(), v.cpu(), mask=causal_mask(T, S)[None, None].expand(2, 3, T, S))
    ref = attention(q, k, v, causal=True, backend="reference")

    def no_mask(*args, **kwargs):
        raise AssertionError("a (T, S) causal mask was built")

    monkeypatch.setattr(attn_mod, "causal_mask", no_mask)
    out = attention(q, k, v, causal=True, backend="sdpa")
    torch.testing.assert_close(out.cpu(), expected, **TOL[dtype])
    torch.testing.assert_close(out, ref, **TOL[dtype])
    if T == S:  # the same numbers as SDPA with is_causal=True and no mask
        plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(out, plain, **TOL[dtype])


def test_causal_sdpa_with_fewer_queries_than_keys_is_aligned_bottom_right():
    """SDPA's is_causal aligns top-left; the wrapper must keep the bottom-right (KV-cache) alignment."""
    q, k, v = qkv(T=3, S=7)
    out = attention(q, k, v, causal=True, backend="sdpa")
    expected = naive_attention(q, k, v, mask=causal_mask(3, 7)[None, None].expand(2, 3, 3, 7))
    torch.testing.assert_close(out, expected, **TOL[torch.float64])
    top_left = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(out, top_left)


def test_sdpa_masks_a_bias_built_from_bias_fn_in_place_but_never_the_callers_bias():
    fn, dense = t5_like_bias_fn(3, 5, 7, torch.float64, "cpu")
    q, k, v = qkv(T=5, S=7)
    kept = dense.clone()
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, -3:] = True
    for kw in (dict(causal=True), dict(causal=True, key_padding_mask=pad), dict(key_padding_mask=pad)):
        from_tensor = attention(q, k, v, bias=dense, backend="sdpa", **kw)
        from_fn = attention(q, k, v, bias_fn=fn, backend="sdpa", **kw)
        assert torch.equal(dense, kept)  # the caller's bias is not modified
        torch.testing.assert_close(from_fn, from_tensor, **TOL[torch.float64])
        torch.testing.assert_close(from_fn, attention(q, k, v, bias=dense, **kw), **TOL[torch.float64])
    # with autograd on a bias that needs a gradient, the masked copy is taken instead
    table = torch.randn(3, 11, dtype=torch.float64, requires_grad=True)
    grad_fn = lambda b, h, i, j: table[h, j - i + 4]  # noqa: E731
    attention(q, k, v, bias_fn=grad_fn, causal=True, backend="sdpa").sum().backward()
    assert torch.isfinite(table.grad).all()


def test_bias_fn_validation():
    from posenc.attention import materialize_bias

    q, k, v = qkv()
    fn, dense = t5_like_bias_fn(3, 5, 7, torch.float64, "cpu")
    with pytest.raises(ValueError, match="either as a tensor .* or as a function .*not both"):
        attention(q, k, v, bias=dense, bias_fn=fn)
    with pytest.raises(TypeError, match="bias_fn must be callable"):
        materialize_bias("not a function", 1, 1, 2, 2)
    with pytest.raises(TypeError, match="bias_fn must return a floating-point tensor"):
        materialize_bias(lambda b, h, i, j: i - j, 1, 1, 2, 2)
    with pytest.raises(ValueError, match=r"bias_fn returned shape \(1, 1, 3, 3\), which does not broadcast"):
        materialize_bias(lambda b, h, i, j: torch.zeros(1, 1, 3, 3), 1, 1, 2, 2)


def _flex_available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


needs_flex = pytest.mark.skipif(not _flex_available(), reason="torch has no flex_attention")


@needs_flex
@pytest.mark.parametrize(
    "B,H,T,S,causal,padding,as_tensor",
    [
        (2, 2, 200, 300, True, True, False),  # partial tiles, bottom-right causal, left padding, dead queries
        (1, 2, 256, 256, True, False, False),  # full tiles below the diagonal
        (2, 2, 64, 96, False, False, True),  # a materialised bias read inside the kernel
    ],
)
def test_flex_matches_reference(device, B, H, T, S, causal, padding, as_tensor):
    import warnings

    q, k, v = qkv(B=B, H=H, T=T, S=S, D=32, dtype=torch.float32, device=device)
    fn, dense = t5_like_bias_fn(H, T, S, torch.float32, device)
    pad = None
    if padding:
        pad = torch.zeros(B, S, dtype=torch.bool, device=device)
        pad[-1, : S - T + 5] = True  # the first 5 queries of the last row see only padding
    kwargs = dict(bias=dense) if as_tensor else dict(bias_fn=fn)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback allowed here
        out = attention(q, k, v, causal=causal, key_padding_mask=pad, backend="flex", **kwargs)
    ref = attention(q, k, v, causal=causal, key_padding_mask=pad, backend="reference", **kwargs)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    if padding:
        assert torch.all(out[-1, :, :5] == 0)  # queries with no visible key give 0, as the other backends


def test_flex_block_mask_structure():
    from posenc.attention import FLEX_BLOCK, flex_block_mask

    if not _flex_available():
        pytest.skip("torch has no flex_attention")
    n = FLEX_BLOCK
    T, S = 3 * n, 4 * n  # queries are the last 3 tiles of 4 key tiles
    bm = flex_block_mask(1, T, S, causal=True)
    partial = bm.kv_num_blocks[0, 0].tolist()
    full = bm.full_kv_num_blocks[0, 0].tolist()
    # query tile i (key tile i + 1) sees key tiles 0..i+1: the diagonal tile is partial, the rest full
    assert full == [1, 2, 3] and partial == [1, 1, 1]
    assert flex_block_mask(1, T, S, causal=False) is None
    pad = torch.zeros(1, S, dtype=torch.bool)
    bm = flex_block_mask(1, T, S, causal=True, key_padding_mask=pad)
    assert bm.full_kv_num_blocks[0, 0].tolist() == [0, 0, 0] and bm.kv_num_blocks[0, 0].tolist() == [2, 3, 4]


@needs_flex
def test_flex_falls_back_loudly_on_cpu_backward():
    q, k, v = qkv(dtype=torch.float32)
    q.requires_grad_(True)
    fn, dense = t5_like_bias_fn(3, 5, 7, torch.float32, "cpu")
    with pytest.warns(RuntimeWarning, match="fell back to 'sdpa'.*no backward on the CPU"):
        out = attention(q, k, v, bias_fn=fn, causal=True, backend="flex")
    torch.testing.assert_close(out, attention(q, k, v, bias=dense, causal=True, backend="reference"))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


@needs_flex
@pytest.mark.parametrize("T", [8, 24, 40])
def test_flex_with_small_heads(device, T):
    """torch 2.13's CPU kernel was wrong for D = 16 at these lengths: posenc must fall back there, loudly."""
    q, k, v = qkv(B=2, H=2, T=T, S=T, D=16, dtype=torch.float32, device=device)
    with torch.no_grad():
        if device.type == "cpu":
            with pytest.warns(RuntimeWarning, match="head dim 16 < 32"):
                out = attention(q, k, v, causal=True, backend="flex")
        else:
            out = attention(q, k, v, causal=True, backend="flex")
    torch.testing.assert_close(out, attention(q, k, v, causal=True), atol=2e-5, rtol=2e-5)


# --- log-n scaling -----------------------------------------------------------------------------


def test_logn_query_scale_frozen_values():
    """max(1, log(n + 1) / log L): exactly 1 up to position L - 1, log_L(n + 1) after (Qwen's logn_list)."""
    from posenc.attention import logn_query_scale

    scale = logn_query_scale(torch.arange(8), 4)
    assert scale.dtype == torch.float32 and scale.shape == (8,)
    assert scale[:4].tolist() == [1.0, 1.0, 1.0, 1.0]
    expected = torch.tensor([math.log(n + 1, 4) for n in range(4, 8)])
    torch.testing.assert_close(scale[4:], expected)
    assert logn_query_scale(torch.tensor([15]), 4).item() == pytest.approx(2.0)  # 16 keys = L^2


def test_logn_self_attention_is_the_identity_up_to_L_and_scales_logits_after(device):
    """Up to L the layer is unchanged to the bit; past L each query's logits are multiplied by its factor."""
    from posenc.attention import logn_query_scale

    torch.manual_seed(0)
    L, T = 4, 9
    plain = SelfAttention(16, 4, backend="reference").to(device).double()
    logn = SelfAttention(16, 4, backend="reference", logn_length=L).to(device).double()
    logn.load_state_dict(plain.state_dict())
    x = torch.randn(2, T, 16, dtype=torch.float64, device=device)
    pos = torch.arange(T, device=device)
    assert torch.equal(logn(x[:, :L], pos[:L], NoPE()), plain(x[:, :L], pos[:L], NoPE()))
    _, w = logn(x, pos, NoPE(), return_weights=True)
    q, k, _ = plain.qkv(x).split(16, dim=2)
    q, k = (z.view(2, T, 4, 4).transpose(1, 2) for z in (q, k))
    logits = (q @ k.transpose(-2, -1)) / 2.0 * logn_query_scale(pos, L).double()[:, None]  # (B, H, T, S)
    expected = logits.masked_fill(causal_mask(T, T, device=device), float("-inf")).softmax(-1)
    torch.testing.assert_close(w, expected)
    _, w_plain = plain(x, pos, NoPE(), return_weights=True)
    assert torch.equal(w[:, :, :L], w_plain[:, :, :L]) and not torch.allclose(w[:, :, L:], w_plain[:, :, L:])


@pytest.mark.parametrize("bad", [1, 0, 2.5, True, "64"])
def test_logn_length_validation(bad):
    from posenc.attention import logn_query_scale

    with pytest.raises(ValueError, match=rf"logn_length must be None \(off\) or an int >= 2 .*got {bad!r}"):
        SelfAttention(8, 2, logn_length=bad)
    with pytest.raises(ValueError, match=rf"length must be None \(off\) or an int >= 2 .*got {bad!r}"):
        logn_query_scale(torch.arange(3), bad)


# ------------------------------------------------------------------ Hugging Face's attention_mask


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_a_hugging_face_mask_passed_as_a_padding_mask_is_refused(backend):
    # transformers' attention_mask (1 = keep) turned into booleans has the opposite polarity of
    # key_padding_mask (True = padding); passed as one it would attend to the padding alone. A row
    # without padding then removes every key, which is refused.
    q, k, v = qkv(B=2, T=4, S=4)
    hf = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])  # row 1 left-padded by two
    with pytest.raises(ValueError, match=r"key_padding_mask removes every key of batch rows \[0\].*attention_mask="):
        attention(q, k, v, key_padding_mask=hf.bool(), causal=True, backend=backend)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.long, torch.bool, torch.float32])
def test_attention_mask_takes_the_hugging_face_polarity(backend, dtype):
    q, k, v = qkv(B=2, T=4, S=4)
    hf = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]).to(dtype)
    expected = attention(q, k, v, key_padding_mask=torch.tensor([[False] * 4, [True, True, False, False]]),
                         causal=True, backend=backend)
    got = attention(q, k, v, attention_mask=hf, causal=True, backend=backend)
    torch.testing.assert_close(got, expected, **TOL[torch.float64])


def test_attention_mask_validation():
    from posenc.attention import padding_mask_from_hf

    q, k, v = qkv(B=2, T=4, S=4)
    pad = torch.zeros(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="not both"):
        attention(q, k, v, key_padding_mask=pad, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"attention_mask must be Hugging Face's 2-D \(B, S\) mask.*pass it as bias="):
        attention(q, k, v, attention_mask=torch.zeros(2, 1, 4, 4))
    with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1"):
        padding_mask_from_hf(torch.tensor([[0.0, float("-inf")]]))
    with pytest.raises(ValueError, match="attention_mask keeps no key in some batch row"):
        padding_mask_from_hf(torch.tensor([[1, 1], [0, 0]]))
    with pytest.raises(TypeError, match=r"attention_mask must be a \(B, S\) tensor of 0/1"):
        padding_mask_from_hf([[1, 1]])
    assert padding_mask_from_hf(torch.tensor([[1, 0]])).tolist() == [[False, True]]


def test_self_attention_takes_attention_mask():
    torch.manual_seed(0)
    layer = SelfAttention(16, 2).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    hf = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    pos = torch.arange(5)
    torch.testing.assert_close(layer(x, pos, NoPE(), attention_mask=hf),
                               layer(x, pos, NoPE(), key_padding_mask=hf == 0), **TOL[torch.float64])


# ------------------------------------------------------------------ positions per batch row


@pytest.mark.parametrize("name", ["rope", "alibi", "t5"])
def test_positions_per_row_give_each_row_its_own_positions(name):
    # a left-padded row starts its positions after the padding: one (B, T) tensor instead of a loop
    from posenc.lab import LMConfig, TinyLM

    torch.manual_seed(0)
    model = TinyLM(LMConfig(vocab_size=20, d_model=32, n_head=2, n_layer=1, max_len=64), name).double()
    layer, method = model.blocks[0].attn, model.position
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    rows = torch.stack([torch.arange(6), torch.arange(6) + 9])  # (B, T)
    both = layer(x, rows, method)
    for b in range(2):
        torch.testing.assert_close(both[b : b + 1], layer(x[b : b + 1], rows[b], method), **TOL[torch.float64])
    if name != "rope":  # the flex backend's bias function reads the same row
        from posenc.attention import materialize_bias

        q = torch.zeros(2, 2, 6, 16, dtype=torch.float64)
        fn = method.attention_bias_fn(q, q, rows, rows, 0)
        torch.testing.assert_close(materialize_bias(fn, 2, 2, 6, 6), method.attention_bias(q, q, rows, rows, 0))


def test_a_method_without_per_row_positions_says_so():
    from posenc.absolute import LearnedPE

    layer = SelfAttention(16, 2)
    method = LearnedPE(8, 16)
    with pytest.raises(ValueError, match=r"LearnedPE takes positions \(T,\), not one row per sequence"):
        layer(torch.randn(2, 3, 16), torch.zeros(2, 3, dtype=torch.long), method)


# ------------------------------------------------------------------ grouped-query attention


@pytest.mark.parametrize("backend", ["reference", "sdpa", "flex"])
@pytest.mark.parametrize("masks", ["none", "causal", "causal+padding+bias"])
def test_grouped_query_attention_is_attention_with_repeated_key_heads(backend, masks):
    # transformers' repeat_kv: key/value head j serves query heads j*G .. j*G+G-1
    import warnings

    q, _, _ = qkv(B=2, H=6, T=5, S=5, D=32)
    _, k, v = qkv(B=2, H=2, T=5, S=5, D=32, seed=1)
    kw = {}
    if masks != "none":
        kw["causal"] = True
    if masks == "causal+padding+bias":
        kw["key_padding_mask"] = torch.tensor([[True, False, False, False, False], [False] * 5])
        kw["bias"] = torch.randn(1, 6, 5, 5, dtype=torch.float64)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # flex may fall back to SDPA on this platform
        got = attention(q, k, v, backend=backend, **kw)
    want = attention(q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), backend="reference", **kw)
    torch.testing.assert_close(got, want, **TOL[torch.float64])


def test_grouped_query_heads_must_divide():
    q, _, _ = qkv(B=1, H=6, T=3, S=3)
    _, k, v = qkv(B=1, H=4, T=3, S=3)
    with pytest.raises(ValueError, match="k and v on H, which divides q's H"):
        attention(q, k, v)


def test_flex_sends_a_decoding_step_to_sdpa(monkeypatch):
    # one query per step against a growing cache would compile flex once per key length
    import importlib

    att = importlib.import_module("posenc.attention")  # the module (posenc.attention is also the function)
    calls = []
    monkeypatch.setattr(att, "_flex_attention", lambda *a: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    q, k, v = qkv(B=1, H=2, T=1, S=9, D=32)
    fn = lambda b, h, qi, ki: (ki - qi - 8).to(torch.float64) * 0.1  # noqa: E731
    with torch.no_grad():
        got = attention(q, k, v, bias_fn=fn, causal=True, backend="flex")
    want = attention(q, k, v, bias=att.materialize_bias(fn, 1, 2, 1, 9), causal=True, backend="reference")
    torch.testing.assert_close(got, want, **TOL[torch.float64])
    assert not calls
