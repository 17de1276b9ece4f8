"""Tests of the RoPE scalings (posenc.rope.frequencies) and of reading them from a Hugging Face config
(posenc.rope.hf_config): identities between variants, closed forms from the papers in fp64, small
frozen values, a KV cache under dynamic scaling, RotaryEmbedding with every scaling, and one test per
validation rule. Parity with transformers itself is in test_rope_scaling_hf_parity.py."""

import math

import pytest
import torch

from posenc.lab import LMConfig, TinyLM
from posenc.kv_cache import KVCache, cache_for
from posenc.rope import (
    LENGTH_DEPENDENT,
    ROPE_SCALINGS,
    HFRope,
    RotaryEmbedding,
    apply_rope,
    inverse_frequencies,
    rope_cos_sin,
    scaling_from_hf,
    yarn_mscale,
)

FP32 = 2.0**-24  # half an fp32 ulp, relative: one rounding
D, BASE = 64, 10000.0

LINEAR = {"rope_type": "linear", "factor": 4.0}
NTK = {"rope_type": "ntk_aware", "factor": 4.0}
DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 256}
YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
SHORT = [1.0 + 0.02 * i for i in range(D // 2)]
LONG = [1.0 + 1.5 * i for i in range(D // 2)]
LONGROPE = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
            "original_max_position_embeddings": 4096, "factor": 32.0}
SCALINGS = {"default": {"rope_type": "default"}, "linear": LINEAR, "ntk_aware": NTK, "dynamic": DYNAMIC,
            "yarn": YARN, "llama3": LLAMA3, "longrope": LONGROPE,
            "proportional": {"rope_type": "proportional", "factor": 2.0, "proportion": 0.25}}


def theta64(head_dim: int = D, base: float = BASE) -> torch.Tensor:
    """RoFormer's θ_i = base^(-2i/D) in fp64 (RoFormer eq. 15)."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def freqs(scaling, seq_len=None, head_dim=D, base=BASE, device=None):
    return inverse_frequencies(head_dim, base, scaling, seq_len=seq_len, device=device)


def default(head_dim=D, base=BASE):
    return inverse_frequencies(head_dim, base)[0].double()


# ----------------------------------------------------------------- the table


def test_the_table_has_every_variant():
    assert set(ROPE_SCALINGS) == set(SCALINGS) and set(LENGTH_DEPENDENT) <= set(ROPE_SCALINGS)


@pytest.mark.parametrize("rope_type", sorted(SCALINGS))
def test_every_variant_gives_fp32_frequencies_on_the_device(rope_type, device):
    inv, scale = freqs(SCALINGS[rope_type], seq_len=5000, device=device)
    assert inv.shape == (D // 2,) and inv.dtype == torch.float32 and inv.device.type == device.type
    assert isinstance(scale, float) and scale >= 1.0
    rotating = inv[: int(0.25 * D // 2)] if rope_type == "proportional" else inv  # the others have frequency 0
    assert bool((rotating > 0).all()) and bool((rotating[1:] < rotating[:-1]).all())  # one per pair, decreasing
    cpu, _ = freqs(SCALINGS[rope_type], seq_len=5000)
    assert torch.equal(inv.cpu(), cpu)  # computed on the CPU, then moved: the same bits on every device


@pytest.mark.parametrize("rope_type", sorted(SCALINGS))
def test_no_variant_raises_a_frequency(rope_type):
    # every scaling interpolates (or keeps) a frequency; none extrapolates past RoFormer's
    inv, _ = freqs(SCALINGS[rope_type], seq_len=5000)
    assert bool((inv.double() <= default() * (1 + FP32)).all())


# ----------------------------------------------------------------- linear (position interpolation)


def test_linear_is_default_over_factor():
    inv, scale = freqs(LINEAR)
    torch.testing.assert_close(inv.double(), default() / 4.0, rtol=FP32, atol=0)
    assert scale == 1.0
    # dividing θ by s is the same as squeezing positions m -> m / s (PI, arXiv:2306.15595)
    pos = torch.arange(0, 4000, 4)
    c, s = rope_cos_sin(pos, inv)
    c2, s2 = rope_cos_sin(pos / 4.0, inverse_frequencies(D, BASE)[0])
    torch.testing.assert_close(c, c2, atol=2e-6, rtol=0)
    torch.testing.assert_close(s, s2, atol=2e-6, rtol=0)


# ----------------------------------------------------------------- NTK-aware


def test_ntk_aware_is_the_closed_form_base_change():
    inv, scale = freqs(NTK)
    expected = theta64(D, BASE * 4.0 ** (D / (D - 2)))  # YaRN eq. 16: b' = b s^(D/(D-2))
    torch.testing.assert_close(inv.double(), expected, rtol=4 * FP32, atol=0)
    assert scale == 1.0


def test_ntk_aware_keeps_the_highest_frequency_and_divides_the_lowest_by_factor():
    inv = freqs(NTK)[0].double()
    assert inv[0] == 1.0  # b'^0
    torch.testing.assert_close(inv[-1], default()[-1] / 4.0, rtol=4 * FP32, atol=0)
    ratio = inv / default()
    assert bool((ratio[1:] < ratio[:-1]).all())  # high frequencies scaled less, low ones more


# ----------------------------------------------------------------- dynamic NTK


@pytest.mark.parametrize("seq_len", [1, 100, 256])
def test_dynamic_is_default_up_to_the_original_length(seq_len):
    inv, scale = freqs(DYNAMIC, seq_len=seq_len)
    assert torch.equal(inv, inverse_frequencies(D, BASE)[0]) and scale == 1.0


def test_dynamic_past_the_original_length_is_the_closed_form():
    L, s = 256, 4.0
    previous = freqs(DYNAMIC, seq_len=L)[0]
    for n in (257, 512, 1024, 4096):
        inv = freqs(DYNAMIC, seq_len=n)[0]
        base = BASE * (s * n / L - (s - 1)) ** (D / (D - 2))  # Hugging Face's 'dynamic'
        torch.testing.assert_close(inv.double(), theta64(D, base), rtol=4 * FP32, atol=0)
        assert bool((inv[1:] < previous[1:]).all()) and inv[0] == 1.0  # longer: lower frequencies
        previous = inv


def test_a_kv_cache_is_exact_up_to_the_original_length_and_stale_past_it(device):
    # decode one token at a time, computing the frequencies for the current length as dynamic scaling
    # does, and caching keys after rotation (as posenc.kv_cache and Hugging Face do)
    L, T, H = 8, 14, 2
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, generator=gen, dtype=torch.float64).to(device) for _ in range(3))
    cache = KVCache(1, 1, H, T, D, dtype=torch.float64, device=device)
    scaling = {**DYNAMIC, "original_max_position_embeddings": L}
    gaps = []
    for t in range(T):
        n = t + 1
        inv, _ = freqs(scaling, seq_len=n, device=device)
        c, s = rope_cos_sin(torch.tensor([t], device=device), inv)  # (1, D/2)
        cache.reserve(torch.tensor([t], device=device))
        keys, _ = cache.update(0, apply_rope(k[:, :, t : t + 1], c, s), v[:, :, t : t + 1])  # (1, H, n, D)
        query = apply_rope(q[:, :, t : t + 1], c, s)  # (1, H, 1, D)
        c_all, s_all = rope_cos_sin(torch.arange(n, device=device), inv)  # every key with today's frequencies
        fresh = apply_rope(k[:, :, :n], c_all, s_all)
        gaps.append(((query @ keys.transpose(-1, -2)) - (query @ fresh.transpose(-1, -2))).abs().max().item())
    assert max(gaps[:L]) < 1e-12  # lengths 1 .. L: the frequencies never changed
    assert min(gaps[L:]) > 1e-2  # past L the cached keys were rotated with older frequencies
    # what is stale: keys cached while the length was <= L carry RoFormer's rotation
    c0, s0 = rope_cos_sin(torch.arange(L, device=device), inverse_frequencies(D, BASE, device=device)[0])
    torch.testing.assert_close(cache.k[0, :, :, :L], apply_rope(k[:, :, :L], c0, s0), atol=1e-12, rtol=0)


# ----------------------------------------------------------------- YaRN


def yarn_reference(head_dim, base, s, L, fast=32.0, slow=1.0, truncate=True):
    """YaRN (arXiv:2309.00071) eqs. 17-20 in fp64, with the ramp linear in the pair index as in the
    authors' code: pair i turns r_i = L θ_i / 2π times over L positions."""
    theta = theta64(head_dim, base)
    index_where = lambda r: head_dim * math.log(L / (2 * math.pi * r)) / (2 * math.log(base))  # r_i = r
    lo, hi = index_where(fast), index_where(slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    gamma = 1 - ((torch.arange(head_dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    return (1 - gamma) * theta / s + gamma * theta  # eq. 20


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize(
    "head_dim,base,s,L", [(64, 10000.0, 8.0, 4096), (128, 1e6, 4.0, 32768), (64, 150000.0, 32.0, 4096)]
)
def test_yarn_is_the_closed_form(head_dim, base, s, L, truncate):
    scaling = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L, "truncate": truncate}
    inv, scale = freqs(scaling, head_dim=head_dim, base=base)
    expected = yarn_reference(head_dim, base, s, L, truncate=truncate)
    torch.testing.assert_close(inv.double(), expected, rtol=4 * FP32, atol=0)
    assert scale == pytest.approx(0.1 * math.log(s) + 1)  # eq. 22


def test_yarn_lies_between_interpolation_and_extrapolation():
    inv, d = freqs(YARN)[0].double(), default()
    assert bool((inv <= d * (1 + FP32)).all()) and bool((inv >= d / 8.0 * (1 - FP32)).all())
    assert torch.equal(inv[:4], d[:4])  # highest frequencies: unchanged
    torch.testing.assert_close(inv[-4:], d[-4:] / 8.0, rtol=FP32, atol=0)  # lowest: default / s


def test_yarn_frozen_bands():
    # D=128, b=1e4, L=4096: pair i turns 32 times over L at i = 20.9 and once at i = 45.0; rounded
    # outwards, pairs 0..20 keep θ, pairs 46..63 get θ/s, and the 25 between are blended
    inv = freqs({**YARN, "factor": 4.0}, head_dim=128)[0].double()
    d = default(128)
    same, scaled = inv == d, torch.isclose(inv, d / 4.0, rtol=FP32, atol=0)
    assert same.nonzero().flatten().tolist() == list(range(21))
    assert scaled.nonzero().flatten().tolist() == list(range(46, 64))


def test_yarn_with_factor_one_is_default():
    inv, scale = freqs({**YARN, "factor": 1.0})
    assert torch.equal(inv, inverse_frequencies(D, BASE)[0]) and scale == 1.0


def test_yarn_attention_scale_variants():
    assert yarn_mscale(1.0) == 1.0 and yarn_mscale(0.5) == 1.0
    assert yarn_mscale(40.0) == pytest.approx(0.1 * math.log(40) + 1)
    assert yarn_mscale(40.0, 0.707) == pytest.approx(0.0707 * math.log(40) + 1)
    # DeepSeek: the ratio of the two mscales (1.0 when they are equal, as in DeepSeek-V3)
    _, scale = freqs({**YARN, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.8})
    assert scale == pytest.approx((0.1 * math.log(40) + 1) / (0.08 * math.log(40) + 1))
    assert freqs({**YARN, "mscale": 0.707, "mscale_all_dim": 0.707})[1] == 1.0
    # an explicit attention_factor wins, and leaves the frequencies alone
    inv, scale = freqs({**YARN, "attention_factor": 0.9})
    assert scale == 0.9 and torch.equal(inv, freqs(YARN)[0])


def test_yarn_betas_move_the_ramp():
    wide = freqs({**YARN, "beta_fast": 64.0, "beta_slow": 0.5})[0]
    d = inverse_frequencies(D, BASE)[0]
    assert int((wide == d).sum()) < int((freqs(YARN)[0] == d).sum())  # more rotations needed to stay unscaled


# ----------------------------------------------------------------- Llama 3


def test_llama3_bands_by_wavelength():
    L, s, low, high = 8192, 8.0, 1.0, 4.0
    inv, scale = freqs(LLAMA3, head_dim=128, base=500000.0)
    inv, d = inv.double(), default(128, 500000.0)
    wavelength = 2 * math.pi / theta64(128, 500000.0)
    short, long_ = wavelength < L / high, wavelength > L / low
    assert torch.equal(inv[short], d[short])  # short wavelengths (high frequencies): unchanged
    torch.testing.assert_close(inv[long_], d[long_] / s, rtol=FP32, atol=0)  # long ones: default / factor
    mid = ~short & ~long_
    w = (L / wavelength[mid] - low) / (high - low)
    torch.testing.assert_close(inv[mid], (1 - w) * d[mid] / s + w * d[mid], rtol=4 * FP32, atol=0)
    assert (int(short.sum()), int(mid.sum()), int(long_.sum())) == (29, 6, 29)  # Llama 3.1's 128-dim heads
    assert scale == 1.0


def test_llama3_is_continuous_at_both_cutoffs():
    # a base chosen so that wavelengths sweep the whole range: the scaled/θ ratio never jumps
    inv = freqs(LLAMA3, head_dim=512, base=500000.0)[0].double()
    ratio = inv / default(512, 500000.0)
    assert float((ratio[1:] - ratio[:-1]).abs().max()) < 0.2 and ratio[0] == 1 and ratio[-1] == pytest.approx(1 / 8)


# ----------------------------------------------------------------- LongRoPE


@pytest.mark.parametrize("seq_len,factors", [(1, SHORT), (4096, SHORT), (4097, LONG), (100000, LONG)])
def test_longrope_picks_short_factors_up_to_the_original_length_and_long_past_it(seq_len, factors):
    inv, scale = freqs(LONGROPE, seq_len=seq_len)
    torch.testing.assert_close(inv.double(), default() / torch.tensor(factors, dtype=torch.float64), rtol=FP32, atol=0)
    assert scale == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))  # Phi-3's


def test_longrope_attention_factor():
    assert freqs({**LONGROPE, "attention_factor": 1.5}, seq_len=10)[1] == 1.5
    assert freqs({**LONGROPE, "factor": 1.0}, seq_len=10)[1] == 1.0
    without_factor = {k: v for k, v in LONGROPE.items() if k != "factor"}
    assert freqs({**without_factor, "attention_factor": 1.25}, seq_len=10)[1] == 1.25


# ----------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize("rope_type", sorted(SCALINGS))
def test_rotary_embedding_takes_every_scaling_at_max_positions(rope_type, device):
    rope = RotaryEmbedding(D, 300, BASE, scaling=SCALINGS[rope_type]).to(device)
    inv, scale = freqs(SCALINGS[rope_type], seq_len=300)
    assert torch.equal(rope.inv_freq.cpu(), inv) and rope.attention_scale == scale
    c, s = rope_cos_sin(torch.arange(300), inv, scale)
    torch.testing.assert_close(rope.cos_cached.cpu(), c, atol=1e-6, rtol=0)
    torch.testing.assert_close(rope.sin_cached.cpu(), s, atol=1e-6, rtol=0)
    assert rope_type in repr(rope) or rope_type == "default"


def test_rotary_embedding_rebuilds_length_dependent_scalings():
    rope = RotaryEmbedding(D, 200, BASE, scaling=DYNAMIC)  # 200 <= 256: RoFormer's frequencies
    assert torch.equal(rope.inv_freq, inverse_frequencies(D, BASE)[0])
    rope.build_cache(1024)
    assert torch.equal(rope.inv_freq, freqs(DYNAMIC, seq_len=1024)[0])
    before = rope.cos_cached.clone()
    rope.to(torch.bfloat16)  # a model-wide cast rebuilds at the same length
    assert torch.equal(rope.inv_freq, freqs(DYNAMIC, seq_len=1024)[0]) and torch.equal(rope.cos_cached, before)
    longrope = RotaryEmbedding(D, 5000, BASE, scaling=LONGROPE)
    assert torch.equal(longrope.inv_freq, freqs(LONGROPE, seq_len=5000)[0])


@pytest.mark.parametrize("scaling", [DYNAMIC, YARN, LONGROPE], ids=["dynamic", "yarn", "longrope"])
def test_decoding_with_a_kv_cache_stays_exact_under_rotary_embedding(scaling, device):
    # RotaryEmbedding fixes the frequencies per cache, so incremental decoding equals the full pass
    cfg = LMConfig(vocab_size=40, d_model=128, n_head=2, n_layer=1, max_len=32)
    small = {**scaling, "original_max_position_embeddings": 16}
    model = TinyLM(cfg, RotaryEmbedding(64, 32, scaling=small)).to(device).eval()
    idx = torch.randint(0, 40, (1, 24), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        full = model(idx)
        cache = cache_for(model, batch=1)
        steps = [model(idx[:, :4], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(4, 24)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-5)


# ----------------------------------------------------------------- scaling_from_hf

THETA = 500000.0
LLAMA31 = {  # Llama 3.1 8B's config.json (RoPE keys), legacy form
    "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": THETA,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "vocab_size": 128256, "model_type": "llama",
}
LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}


def test_scaling_from_a_legacy_config():
    assert scaling_from_hf(LLAMA31) == HFRope(THETA, LLAMA31_SCALING, 128, layout="half")  # model_type llama
    base, scaling, rotary_dim = scaling_from_hf(LLAMA31)
    inv, _ = inverse_frequencies(rotary_dim, base, scaling)
    assert torch.equal(inv, freqs(LLAMA31_SCALING, head_dim=128, base=THETA)[0])


def test_scaling_from_a_rope_parameters_config_and_from_the_rope_dict_alone():
    rope_parameters = {**LLAMA31["rope_scaling"], "rope_theta": THETA}
    newer = {k: v for k, v in LLAMA31.items() if k not in ("rope_scaling", "rope_theta")}
    assert scaling_from_hf({**newer, "rope_parameters": rope_parameters}) == HFRope(THETA, LLAMA31_SCALING, 128,
                                                                                     layout="half")
    assert scaling_from_hf(rope_parameters) == HFRope(THETA, LLAMA31_SCALING, None)
    assert scaling_from_hf(LLAMA31["rope_scaling"], rope_theta=THETA) == HFRope(THETA, LLAMA31_SCALING, None)


def test_scaling_from_an_object_with_to_dict():
    class Config:
        def to_dict(self):
            return LLAMA31

    assert scaling_from_hf(Config()) == scaling_from_hf(LLAMA31)


def test_default_rope_gives_no_scaling():
    config = {"hidden_size": 512, "num_attention_heads": 8, "rope_theta": 1e6, "rope_scaling": None}
    assert scaling_from_hf(config) == HFRope(1e6, None, 64)
    assert scaling_from_hf({"rope_type": "default", "rope_theta": 1e4}) == HFRope(1e4, None, None)


def test_head_dim_and_partial_rotary_factor():
    config = {"hidden_size": 1024, "num_attention_heads": 16, "head_dim": 128, "rope_theta": 1e6}
    assert scaling_from_hf(config).rotary_dim == 128  # head_dim wins over hidden_size / heads
    assert scaling_from_hf({**config, "partial_rotary_factor": 0.25}).rotary_dim == 32
    inner = {**config, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}}
    assert scaling_from_hf(inner).rotary_dim == 64


def test_dynamic_reads_its_original_length_from_max_position_embeddings():
    config = {"rope_theta": 1e4, "max_position_embeddings": 2048, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    expected = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2048}
    assert scaling_from_hf(config).scaling == expected
    assert scaling_from_hf(config["rope_scaling"], 2048, rope_theta=1e4) == scaling_from_hf(config)


def test_yarn_defaults_and_derived_factor():
    rope = {"rope_type": "yarn", "factor": None, "rope_theta": 1e4, "beta_fast": None, "truncate": False}
    config = {"max_position_embeddings": 32768, "original_max_position_embeddings": 4096, "rope_parameters": rope}
    expected = {"rope_type": "yarn", "factor": 8.0, "truncate": False, "original_max_position_embeddings": 4096}
    assert scaling_from_hf(config).scaling == expected
    # original_max_position_embeddings defaults to max_position_embeddings
    plain = scaling_from_hf({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}, 32768)
    assert plain.scaling["original_max_position_embeddings"] == 32768


def test_longrope_in_phi3_layout():
    # Phi-3 keeps original_max_position_embeddings beside the rope dict, and has no factor
    rope = {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}
    config = {"hidden_size": 2048, "num_attention_heads": 32, "max_position_embeddings": 131072,
              "original_max_position_embeddings": 4096, "rope_theta": BASE, "rope_scaling": rope}
    base, scaling, rotary_dim = scaling_from_hf(config)
    assert (base, rotary_dim) == (BASE, 64) and scaling["factor"] == 32.0
    assert scaling == {**LONGROPE, "factor": 32.0}


# ----------------------------------------------------------------- bad input: inverse_frequencies


@pytest.mark.parametrize(
    "scaling,seq_len,head_dim,match",
    [
        (None, 0, D, "seq_len must be None or a positive int .* got 0"),
        ({"factor": 4.0}, None, D, r"scaling has no 'rope_type' key \(keys: \['factor'\]\)"),
        ({"rope_type": "linear", "type": "yarn", "factor": 2.0}, None, D,
         "scaling has rope_type='linear' and type='yarn'"),
        ({**LINEAR, "rope_theta": 1e4}, None, D, "scaling has rope_theta=10000.0: pass it as base"),
        ({**LINEAR, "partial_rotary_factor": 0.5}, None, D,
         "partial_rotary_factor=0.5: pass the rotated dims as head_dim"),
        ({**LINEAR, "beta_fast": 32}, None, D,
         r"scaling of rope_type 'linear' does not take the key 'beta_fast' \(value 32\)"),
        ({"rope_type": "default", "factor": 2.0}, None, D,
         "scaling of rope_type 'default' does not take the key 'factor'"),
        ({"rope_type": "yarn", "factor": 4.0}, None, D,
         "scaling of rope_type 'yarn' needs the key 'original_max_position_embeddings'"),
        ({**LINEAR, "factor": 0.5}, None, D, "factor of a 'linear' scaling must be a finite number >= 1.0, got 0.5"),
        ({**NTK, "factor": "4"}, None, D, "factor of a 'ntk_aware' scaling must be a finite number >= 1.0, got '4'"),
        ({**YARN, "original_max_position_embeddings": 4096.0}, None, D,
         "original_max_position_embeddings of a 'yarn' scaling must be an int >= 1, got 4096.0"),
        ({**LONGROPE, "original_max_position_embeddings": 1}, 10, D,
         "original_max_position_embeddings of a 'longrope' scaling must be an int >= 2"),
        (DYNAMIC, None, D, "rope_type 'dynamic' depends on the current length: pass seq_len"),
        (LONGROPE, None, D, "rope_type 'longrope' depends on the current length: pass seq_len"),
        (NTK, None, 2, r"rope_type 'ntk_aware' changes the base by s\^\(D/\(D-2\)\) and needs head_dim > 2, got 2"),
        ({**YARN, "beta_slow": 0}, None, D, "beta_slow of a 'yarn' scaling must be a finite number > 0.0, got 0"),
        ({**YARN, "beta_fast": 0.5}, None, D,
         "beta_fast of a 'yarn' scaling must be >= beta_slow, got beta_fast=0.5, beta_slow=1.0"),
        ({**YARN, "truncate": "yes"}, None, D, "truncate of a 'yarn' scaling must be a bool, got 'yes'"),
        ({**YARN, "mscale": 0.707}, None, D,
         "takes mscale and mscale_all_dim together or neither, got mscale=0.707 and mscale_all_dim=None"),
        ({**YARN, "mscale": 1.0, "mscale_all_dim": 1.0, "attention_factor": 1.1}, None, D,
         "takes attention_factor or mscale/mscale_all_dim, not both"),
        ({**YARN, "attention_factor": -1.0}, None, D,
         "attention_factor of a 'yarn' scaling must be a finite number > 0.0, got -1.0"),
        ({**YARN, "mscale": 0.0, "mscale_all_dim": 1.0}, None, D,
         "mscale of a 'yarn' scaling must be a finite number > 0.0, got 0.0"),
        ({**LLAMA3, "high_freq_factor": 0.5}, None, D,
         "high_freq_factor of a 'llama3' scaling must be >= low_freq_factor, got 0.5 and 1.0"),
        ({**LLAMA3, "low_freq_factor": float("nan")}, None, D,
         "low_freq_factor of a 'llama3' scaling must be a finite number > 0.0"),
        ({**LONGROPE, "short_factor": [1.0] * 3}, 10, D,
         r"short_factor of a 'longrope' scaling must be a list of head_dim/2 = 32 positive numbers"),
        ({**LONGROPE, "long_factor": [-1.0] * 32}, 10, D,
         "long_factor of a 'longrope' scaling must be a list of head_dim/2 = 32 positive"),
        ({k: v for k, v in LONGROPE.items() if k != "factor"}, 10, D,
         r"needs 'factor' \(for the attention scale\) or 'attention_factor'"),
    ],
)
def test_inverse_frequencies_scaling_bad_input(scaling, seq_len, head_dim, match):
    with pytest.raises(ValueError, match=match):
        inverse_frequencies(head_dim, BASE, scaling, seq_len=seq_len)


def test_rotary_embedding_reports_a_bad_scaling():
    with pytest.raises(ValueError, match="scaling of rope_type 'yarn' needs the key 'factor'"):
        RotaryEmbedding(D, 16, scaling={"rope_type": "yarn", "original_max_position_embeddings": 8})


# ----------------------------------------------------------------- bad input: scaling_from_hf

YARN_DICT = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "rope_theta": 1e4}


@pytest.mark.parametrize(
    "config,kwargs,exc,match",
    [
        ([("rope_theta", 1e4)], {}, TypeError, "config must be a mapping .* got list"),
        ({"rope_theta": 1e4, "rope_scaling": "linear"}, {}, TypeError,
         "rope_parameters / rope_scaling must be a dict, got str"),
        ({"rope_parameters": YARN_DICT, "rope_scaling": {**YARN_DICT, "factor": 2.0}}, {}, ValueError,
         "the rope dict is .* in rope_parameters but .* in rope_scaling; give one value"),
        ({"rope_parameters": {"full_attention": YARN_DICT, "sliding_attention": {"rope_type": "default"}}}, {},
         ValueError,
         r"the config has a rope per layer type \(\['full_attention', 'sliding_attention'\]\) and no layer_type was "
         "given; pass layer_type=, or read them all with scaling_by_layer_type"),
        ({**YARN_DICT, "type": "linear"}, {}, ValueError, "rope_type is 'yarn' in rope_type but 'linear' in type"),
        ({"type": "su", "rope_theta": 1e4}, {}, ValueError,
         r"rope_type 'su' is not one posenc reads; known: \['default', 'dynamic'"),
        ({"type": "linear", "factor": 2.0, "beta_fast": 32, "rope_theta": 1e4}, {}, ValueError,
         r"key 'beta_fast' \(value 32\) is not read by rope_type 'linear'; it reads \['factor'\]"),
        ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "rope_theta": 1e4}, {}, ValueError,
         "rope_type 'llama3' needs the key 'low_freq_factor' in the rope dict"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, {}, ValueError,
         "rope_theta is in neither the rope dict nor the config; pass rope_theta="),
        ({"rope_theta": 5e5, "rope_parameters": YARN_DICT}, {}, ValueError,
         "rope_theta is 10000.0 in the rope dict but 500000.0 in the config"),
        ({"type": "linear", "factor": 2.0}, {"rope_theta": "1e4"}, TypeError, "rope_theta must be a number, got '1e4'"),
        ({"max_position_embeddings": 2048, "rope_parameters": YARN_DICT}, {"max_position_embeddings": 4096}, ValueError,
         "max_position_embeddings is 2048 in the config but 4096 in the argument"),
        ({"type": "dynamic", "factor": 2.0, "rope_theta": 1e4}, {}, ValueError,
         "rope_type 'dynamic' scales past max_position_embeddings: pass max_position_embeddings="),
        ({"max_position_embeddings": 2048, "original_max_position_embeddings": 1024, "rope_theta": 1e4,
          "rope_scaling": {"type": "dynamic", "factor": 2.0}}, {}, ValueError,
         "original_max_position_embeddings=1024 is not read by it"),
        ({"original_max_position_embeddings": 8192, "rope_parameters": YARN_DICT}, {}, ValueError,
         "original_max_position_embeddings is 4096 in the rope dict but 8192 in the config"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_theta": 1e4}, {},
         ValueError,
         r"rope_type 'llama3' needs original_max_position_embeddings \(or max_position_embeddings\)"),
        ({**YARN_DICT, "factor": None}, {}, ValueError,
         "rope_type 'yarn' has factor null: pass max_position_embeddings= to derive it"),
        ({"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 4096,
          "rope_theta": 1e4},
         {}, ValueError, "rope_type 'longrope' has neither factor nor attention_factor"),
        ({"hidden_size": 64, "num_attention_heads": 1, "partial_rotary_factor": 0.5,
          "rope_parameters": {**YARN_DICT, "partial_rotary_factor": 0.25}},
         {}, ValueError, "partial_rotary_factor is 0.25 in the rope dict but 0.5 in the config"),
        ({**YARN_DICT, "partial_rotary_factor": 0.5}, {}, ValueError, "partial_rotary_factor=0.5 needs the head size"),
        ({"hidden_size": 64, "num_attention_heads": 1, "partial_rotary_factor": 1.5, "rope_theta": 1e4}, {}, ValueError,
         r"partial_rotary_factor must be a number in \(0, 1\], got 1.5"),
    ],
)
def test_scaling_from_hf_bad_input(config, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        scaling_from_hf(config, **kwargs)
