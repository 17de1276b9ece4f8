"""posenc.lab.experiments.tables: what training writes into a position table, measured per seed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc.absolute import LearnedPE, SinusoidalPE, sinusoidal_table
from posenc.lab.data import load_stdlib_corpus
from posenc.lab.experiments.compare import STUDIES, run_cell
from posenc.lab.experiments.tables import (context_control, context_windows, finetune_new_rows, position_table,
                                          table_stats)
from posenc.lab.lm import LMConfig, TinyLM
from posenc.lab.train import TrainConfig

TINY = LMConfig(d_model=16, n_layer=1, n_head=2, max_len=32)


def tiny_tables_study():
    """The chapter's study at a size a test can afford: 32 rows, trained on 16."""
    study = STUDIES["tables"]
    return dataclasses.replace(study, model=TINY, lm=TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1,
                                                                 progress=False), eval_windows=4)


def test_position_table_gives_the_codes_the_method_adds():
    assert torch.equal(position_table(SinusoidalPE(16), 10), sinusoidal_table(10, 16))
    learned = LearnedPE(32, 16)
    table = position_table(learned, 10)
    assert torch.equal(table, learned.weight[:10]) and not table.requires_grad
    with pytest.raises(TypeError, match="absolute table method"):
        position_table(torch.nn.Linear(2, 2), 4)


def test_table_stats_of_known_tables():
    sin = sinusoidal_table(64, 16, dtype=torch.float64)
    stats = table_stats(sin, reference=sin)
    assert stats["like_ref"] == pytest.approx(1.0)
    assert stats["spectrum"][0] == 1.0 and len(stats["spectrum"]) == 16
    assert stats["smooth"] > 0.5 and stats["min_distance"] > 0
    ramp = torch.arange(64, dtype=torch.float64)[:, None] * torch.linspace(1, 2, 16, dtype=torch.float64)
    ramp = ramp + 1e-3 * torch.randn(64, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert table_stats(ramp)["trend"] > 0.999 and table_stats(ramp)["eff99"] == 1
    noise = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    assert table_stats(noise)["rank"] == 16 and abs(table_stats(noise)["trend"]) < 0.5


def test_context_control_is_blind_to_positions_without_an_encoding():
    corpus = load_stdlib_corpus()
    torch.manual_seed(0)
    nope = TinyLM(TINY, "nope")
    out = context_control(nope, corpus.val, 16, num_windows=4)
    assert out["seen"] == pytest.approx(out["unseen"], abs=1e-6)      # NoPE: the positions change nothing
    assert out["restart"] == pytest.approx(out["long"], abs=1e-6)      # ... in the long windows either
    assert "interpolated" not in out
    learned = TinyLM(TINY, LearnedPE(32, 16, std=1.0))
    table = learned.position.weight.detach().clone()
    out = context_control(learned, corpus.val, 16, num_windows=4)
    assert out["seen"] != pytest.approx(out["unseen"], abs=1e-4)      # a table: they do
    assert torch.equal(learned.position.weight, table)                # the interpolated reading restores the table
    # the interpolated reading is the model with rows 0..15 interpolated to 32, on the second halves of the long windows
    from posenc.absolute import interpolate_table
    from posenc.lab.data import eval_windows
    from posenc.lab.lm import next_token_loss

    x, y = eval_windows(corpus.val, 32, 4)
    with torch.no_grad():
        learned.position.weight.copy_(interpolate_table(table[:16], 32))
        losses = next_token_loss(learned.eval()(x), y, reduction="none")
    assert out["interpolated"] == pytest.approx(losses[:, 16:].mean().item(), rel=1e-5)
    assert out["interpolated_first"] == pytest.approx(losses[:, :16].mean().item(), rel=1e-5)
    # the restart reading: the long windows at positions 0..15 twice, scored on their second halves
    with torch.no_grad():
        learned.position.weight.copy_(table)
        restarted = next_token_loss(learned(x, positions=torch.arange(32) % 16), y, reduction="none")
    assert out["restart"] == pytest.approx(restarted[:, 16:].mean().item(), rel=1e-5)
    assert out["restart"] != pytest.approx(out["long"], abs=1e-4)
    # window by window: the same readings, one loss per window
    windows = context_windows(learned, corpus.val, 16, num_windows=4)
    assert set(windows) == set(out) and all(v.shape == (4,) for v in windows.values())
    assert windows["restart"] == pytest.approx(restarted[:, 16:].double().mean(1), rel=1e-5)
    assert {k: float(v.mean()) for k, v in windows.items()} == pytest.approx(out, rel=1e-6)


def test_finetune_new_rows_trains_only_the_new_rows_of_a_copy():
    corpus = load_stdlib_corpus()
    model = TinyLM(TINY, "learned")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=32, warmup_steps=1, weight_decay=0.0, progress=False)
    before, after = finetune_new_rows(model, corpus.train, corpus.val, 16, cfg=cfg, num_windows=4)
    assert isinstance(before, float) and isinstance(after, float) and before != after
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())    # the model given is untouched
    with pytest.raises(ValueError, match="init must be 'as trained' or 'copy', got 'zeros'"):
        finetune_new_rows(model, corpus.train, corpus.val, 16, init="zeros")
    with pytest.raises(TypeError, match="must be a LearnedPE, got SinusoidalPE"):
        finetune_new_rows(TinyLM(TINY, "sinusoidal"), corpus.train, corpus.val, 16)


def test_the_tables_study_measures_each_trained_model():
    study = tiny_tables_study()
    plain = run_cell(study, "learned", 0, "lm")
    for key in ("inside", "outside", "control", "trained_rows", "untrained_rows", "decay", "delta_rows",
                "rank_truncation", "replaced_rows", "finetune", "bf16_delta"):
        assert key in plain, key
    assert plain["penalty_at_start"] == 0.0 and 0 < plain["decay"] < 1
    per_window = plain["per_window"]                          # 128 windows of every reading, for their intervals
    assert set(per_window) == {"inside", "outside", *plain["control"]}
    assert all(len(v) == 128 for v in per_window.values())
    assert sum(per_window["inside"]) / 128 == pytest.approx(plain["inside"], rel=1e-5)
    assert sum(per_window["restart"]) / 128 == pytest.approx(plain["control"]["restart"], rel=1e-5)
    assert plain["untrained_change"] < 1e-6                   # rows 16..31 only decayed: no gradient reached them
    # at a multiplier of the table's learning rate, AdamW decays the table at that rate too
    fast = run_cell(study, "learned", 0, "lm", mult=10.0)
    assert fast["decay"] < plain["decay"] and fast["untrained_change"] < 1e-6
    assert plain["rank_truncation"]["16"] == pytest.approx(0.0, abs=1e-5)   # full rank: the same table
    penalised = run_cell(study, "difference", 0, "lm")
    assert penalised["penalty_at_start"] == pytest.approx(0.1, rel=1e-4)    # the lambda rule
    assert "finetune" not in penalised and penalised["val_loss"] != plain["val_loss"]
    low = run_cell(study, "low rank 2", 0, "lm")
    assert low["trained_rows"]["rank"] == 2 and low["position_parameters"] == 2 * (32 + 16)
    copy = run_cell(dataclasses.replace(study, copy_length=4, eval_examples=8,
                                        copy=TrainConfig(steps=2, batch_size=2, warmup_steps=1, progress=False)),
                    "L2", 0, "copy")
    assert 0.0 <= copy["token_accuracy"] <= 1.0 and copy["table"]["rank"] == 8   # an (8, 16) table
