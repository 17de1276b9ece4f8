"""posenc.lab.experiments.budget: one run per (method, seed, budget) with its curve; the stored study resumes."""

import dataclasses

from posenc.lab.experiments.budget import BudgetStudy, main, run_cell, run_study
from posenc.lab.experiments.records import load_records
from posenc.lab.lm import LMConfig
from posenc.lab.train import TrainConfig


def tiny(**kw) -> BudgetStudy:
    return BudgetStudy(methods=("nope", "rope"), budgets=(4, 8), seeds=(0,),
                       model=LMConfig(d_model=16, n_layer=1, n_head=2, max_len=16),
                       lm=TrainConfig(steps=8, batch_size=2, seq_len=16, warmup_steps=1, progress=False),
                       curve_points=4, curve_windows=2, eval_windows=3, **kw)


def test_a_run_records_its_curve_score_and_items():
    r = run_cell(tiny(), "rope", 0, 8)
    assert [p["step"] for p in r["curve"]] == [2, 4, 6, 8]
    assert len(r["loss_per_window"]) == 3 and abs(sum(r["loss_per_window"]) / 3 - r["val_loss"]) < 1e-4
    assert r["steps"] == 8 and r["lm"]["steps"] == 8 and r["steps_per_second"] > 0
    assert run_cell(tiny(), "rope", 0, 8)["val_loss"] == r["val_loss"]  # repeatable


def test_the_study_stores_each_run_once_and_resumes(tmp_path):
    out, logs = tmp_path / "b.json", []
    run_study(tiny(), out, shard=(0, 2), log=logs.append)
    run_study(tiny(), out, shard=(1, 2), log=logs.append)
    data = load_records(out)
    assert sorted((r["method"], r["steps"]) for r in data["records"]) == [("nope", 4), ("nope", 8), ("rope", 4), ("rope", 8)]
    assert data["meta"]["budgets"] == [4, 8] and len(logs) == 4
    run_study(tiny(), out, log=logs.append)
    assert len(logs) == 4


def test_the_command_line(tmp_path, monkeypatch):
    import posenc.lab.experiments.budget as budget

    monkeypatch.setattr(budget, "STUDY", dataclasses.replace(tiny(), budgets=(4,)))
    main(["--methods", "nope", "--budgets", "4", "--out", str(tmp_path / "c.json")])
    assert load_records(tmp_path / "c.json")["records"][0]["command"].startswith("python -m posenc.lab.experiments.budget")
