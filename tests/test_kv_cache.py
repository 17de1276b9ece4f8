"""Tests of posenc.kv_cache and incremental decoding through the tiny LM."""

import pytest
import torch

from posenc import METHODS
from posenc.lab import LMConfig, TinyLM
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
    cache.reserve(torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="do not fit a cache of \\(B, H, D\\) = \\(1, 2, 8\\)"):
        cache.update(0, torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, 8))


def _manual_decode(model, idx, cache):
    """Decode ``idx`` one token at a time through the cache by hand, as an engineer's loop would:
    one ``reserve`` per step, one ``update`` per layer, nothing else."""
    outs = []
    for t in range(idx.shape[1]):
        positions = torch.tensor([t])
        key_positions = cache.reserve(positions)
        x = model.position.transform_input(model.tok(idx[:, t : t + 1]), positions)
        for layer, block in enumerate(model.blocks):
            x, _ = block(x, positions, model.position, layer, None, False, cache, key_positions)
        outs.append(model.head(model.ln_f(x)))
    return torch.cat(outs, dim=1)


def _rope_model_ids_cache(n_layer: int, T: int, seed: int):
    """A small RoPE model, ``(1, T)`` token ids and an empty cache for it."""
    model = TinyLM(LMConfig(vocab_size=30, d_model=16, n_head=2, n_layer=n_layer, max_len=16), "rope").eval()
    idx = torch.randint(0, 30, (1, T), generator=torch.Generator().manual_seed(seed))
    return model, idx, cache_for(model, batch=1)


def test_a_step_closes_when_every_layer_has_written():
    # a decode loop with no third call: the cache advances by itself once the last layer has
    # written (a cache that had to be told to advance attended to the same keys at every step)
    model, idx, cache = _rope_model_ids_cache(n_layer=3, T=7, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(_manual_decode(model, idx, cache), model(idx), atol=2e-5, rtol=1e-5)
    assert cache.length == 7 and not cache.in_step


def test_a_step_cannot_be_skipped_or_written_twice():
    cache = KVCache(2, 1, 2, 8, 4)
    k = torch.ones(1, 2, 1, 4)
    with pytest.raises(ValueError, match=r"no open step: call reserve\(positions\)"):
        cache.update(0, k, k)
    cache.reserve(torch.tensor([0]))
    cache.update(0, k, k)
    assert cache.length == 0 and cache.in_step  # layer 1 has not written: nothing is cached yet
    with pytest.raises(ValueError, match="layer 0 has already written its keys in this step"):
        cache.update(0, k, k)
    with pytest.raises(ValueError, match=r"the previous step \(1 tokens\) is still open: layers \[1\] of 2"):
        cache.reserve(torch.tensor([1]))
    with pytest.raises(ValueError, match="k/v hold T=2 new tokens but the step reserved 1"):
        cache.update(1, torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4))
    with pytest.raises(ValueError, match=r"layer must be an int in 0..1, got 2"):
        cache.update(2, k, k)
    k_all, _ = cache.update(1, k, k)
    assert k_all.shape == (1, 2, 1, 4) and cache.length == 1 and not cache.in_step
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        cache.reserve(torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"positions must be a non-empty \(T,\) or, per batch row, \(1, T\) tensor; "
                       r"got shape \(1, 1, 1\)"):
        cache.reserve(torch.tensor([[[1]]]))


def test_an_error_inside_a_layer_leaves_the_cache_usable():
    model, idx, cache = _rope_model_ids_cache(n_layer=2, T=5, seed=2)
    with torch.no_grad():
        model(idx[:, :3], cache=cache)
        bad = torch.ones(2, 3, dtype=torch.bool)  # padding mask of the wrong batch size: layer 0 raises
        with pytest.raises(ValueError, match="key_padding_mask must have shape"):
            model(idx[:, 3:4], cache=cache, key_padding_mask=bad)
        assert cache.length == 3 and not cache.in_step
        rest = torch.cat([model(idx[:, 3:4], cache=cache), model(idx[:, 4:5], cache=cache)], dim=1)
        torch.testing.assert_close(rest, model(idx)[:, 3:], atol=2e-5, rtol=1e-5)


def test_a_cache_refuses_keys_of_another_dtype():
    cache = KVCache(1, 1, 2, 4, 8)  # fp32
    cache.reserve(torch.tensor([0]))
    k = torch.ones(1, 2, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not match the cache's torch.float32"):
        cache.update(0, k, k)


def test_a_left_padded_batch_decodes_with_positions_per_row():
    # row 1 is left-padded by two: its positions count from its first real token, per row through the
    # cache; every real token's logits equal those of the row run alone without padding
    model, _, _ = _rope_model_ids_cache(n_layer=2, T=1, seed=0)
    ids = torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(4))
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, :2] = True
    positions = ((~pad).long().cumsum(-1) - 1).clamp(min=0)  # (B, T): row 1 is 0, 0, 0, 1, 2, 3, 4
    cache = cache_for(model, batch=2)
    outs = []
    with torch.no_grad():
        for lo, hi in [(0, 3), (3, 4), (4, 5), (5, 7)]:  # a prefill of three tokens, then decoding
            p = positions[:, lo:hi]
            key_positions = cache.reserve(p)  # (B, S)
            x = model.tok(ids[:, lo:hi])
            for layer, block in enumerate(model.blocks):
                x, _ = block(x, p, model.position, layer, pad[:, :hi], False, cache, key_positions)
            outs.append(model.head(model.ln_f(x)))
        got = torch.cat(outs, dim=1)
        assert cache.row_positions[1, :7].tolist() == positions[1].tolist()
        torch.testing.assert_close(got[0], model(ids[:1])[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got[1, 2:], model(ids[1:, 2:])[0], atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"positions must be a non-empty \(T,\) or, per batch row, \(2, T\)"):
        cache.reserve(torch.zeros(3, 1, dtype=torch.long))
