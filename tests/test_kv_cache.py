"""Tests of posenc.kv_cache and incremental decoding through the tiny LM."""

import pytest
import torch

from posenc import METHODS, LMConfig, TinyLM
from posenc.kv_cache import KVCache, cache_for
from posenc.rope import apply_rope

CACHEABLE = sorted(name for name in METHODS if name != "normalized")


def decode(model, idx, cache, prefill: int):
    """Logits of ``idx`` computed as one prefill of ``prefill`` tokens, then one token at a time."""
    outs = [model(idx[:, :prefill], cache=cache)]
    outs += [model(idx[:, t : t + 1], cache=cache) for t in range(prefill, idx.shape[1])]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("name", CACHEABLE)
def test_token_by_token_decoding_equals_full_sequence(name, device):
    cfg = LMConfig(vocab_size=40, d_model=32, n_head=4, n_layer=2, max_len=32)
    model = TinyLM(cfg, name).to(device).eval()
    idx = torch.randint(0, 40, (2, 14), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        full = model(idx)
        cache = cache_for(model, batch=2)
        inc = decode(model, idx, cache, prefill=5)
    assert cache.length == 14 and cache.positions[:14].tolist() == list(range(14))
    torch.testing.assert_close(inc, full, atol=2e-5, rtol=1e-5)


def test_rope_cache_holds_keys_rotated_once():
    # what is cached is R_n k_n: keys rotated by their own positions, never rotated again
    cfg = LMConfig(vocab_size=30, d_model=16, n_head=2, n_layer=1, max_len=16)
    model = TinyLM(cfg, "rope").eval()
    idx = torch.randint(0, 30, (1, 9))
    with torch.no_grad():
        cache = cache_for(model, batch=1)
        decode(model, idx, cache, prefill=3)
        x = model.blocks[0].ln1(model.tok(idx))  # (1, T, C): layer 0's input
        _, k, _ = model.blocks[0].attn.qkv(x).split(16, dim=2)
        k = k.view(1, 9, 2, 8).transpose(1, 2)  # (1, H, T, D), unrotated
        c, s = model.position.cos_sin(torch.arange(9))
    torch.testing.assert_close(cache.k[0, :, :, :9], apply_rope(k, c, s), atol=1e-6, rtol=1e-6)


def test_cache_can_be_reset_and_reused():
    cfg = LMConfig(vocab_size=30, d_model=16, n_head=2, n_layer=2, max_len=16)
    model = TinyLM(cfg, "rope").eval()
    idx = torch.randint(0, 30, (1, 6))
    cache = cache_for(model, batch=1, max_len=8)
    with torch.no_grad():
        first = decode(model, idx, cache, prefill=2)
        cache.reset()
        second = decode(model, idx, cache, prefill=4)
    torch.testing.assert_close(first, second, atol=1e-5, rtol=1e-5)
    assert cache.nbytes() == 2 * 2 * 1 * 2 * 8 * 8 * 4


def test_full_cache_raises():
    cfg = LMConfig(vocab_size=30, d_model=16, n_head=2, n_layer=1, max_len=16)
    model = TinyLM(cfg, "rope").eval()
    cache = cache_for(model, batch=1, max_len=4)
    model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="KV cache is full: it holds 3 of max_len=4 tokens and cannot take 2 more"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=cache)


def test_length_dependent_method_refuses_a_cache():
    cfg = LMConfig(vocab_size=30, d_model=16, n_head=2, n_layer=1, max_len=16)
    model = TinyLM(cfg, "normalized")
    with pytest.raises(ValueError, match="NormalizedPE cannot be used with a KV cache"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache_for(model, batch=1))


def test_kv_cache_bad_input():
    with pytest.raises(ValueError, match="max_len must be a positive int, got 0"):
        KVCache(1, 1, 2, 0, 8)
    cache = KVCache(1, 1, 2, 4, 8)
    with pytest.raises(ValueError, match="do not fit a cache of \\(B, H, D\\) = \\(1, 2, 8\\)"):
        cache.update(0, torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, 8))
