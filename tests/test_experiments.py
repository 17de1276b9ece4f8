"""posenc.experiments.compare: cells, stored studies (resume, shards, provenance), summaries."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex

import pytest
import torch

from posenc.experiments.compare import STUDIES, Arm, Study, load_records, run_cell, run_study, summarize
from posenc.experiments.compare import main
from posenc.lm import LMConfig
from posenc.train import TrainConfig


def tiny_study(**kw) -> Study:
    return Study(
        "tiny", (Arm("nope", "nope"), Arm("rope", "rope")), seeds=(0, 1),
        model=LMConfig(d_model=16, n_layer=1, n_head=2, max_len=16),
        lm=TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1, progress=False),
        copy_length=4, copy=TrainConfig(steps=3, batch_size=4, warmup_steps=1, progress=False),
        eval_windows=2, eval_examples=8, **kw)


def test_every_stored_study_builds_each_arm():
    for study in STUDIES.values():
        assert len(study.seeds) >= 3, f"{study.name}: an empirical comparison needs >= 3 seeds"
        labels = [a.label for a in study.arms]
        assert len(set(labels)) == len(labels)
        for arm in study.arms:
            run_cell(dataclasses.replace(study, model=LMConfig(d_model=16, n_layer=1, n_head=2, max_len=64),
                                         lm=dataclasses.replace(study.lm, seq_len=16, batch_size=2),
                                         copy_length=4, eval_windows=2, eval_examples=4),
                     arm, 0, "lm", steps=1)


@pytest.mark.parametrize("setting", ["lm", "copy"])
def test_a_cell_is_repeatable_and_records_its_score(setting):
    study = tiny_study()
    a, b = run_cell(study, "rope", 1, setting), run_cell(study, "rope", 1, setting)
    score = "val_loss" if setting == "lm" else "token_accuracy"
    assert a[score] == b[score] and a["train_loss_every_10"] == b["train_loss_every_10"]
    assert a["seed"] == 1 and a["setting"] == setting and a["steps"] == 3
    if setting == "copy":
        assert 0.0 <= a["token_accuracy"] <= 1.0 and 0.0 <= a["exact_match"] <= a["token_accuracy"] + 1e-9


def test_a_custom_built_arm_is_seeded_by_the_cell_not_by_the_global_rng():
    from posenc.absolute import LowRankPE
    study = dataclasses.replace(tiny_study(), arms=(Arm("low", "low", lambda c: LowRankPE(c.max_len, c.d_model, rank=2)),))
    torch.manual_seed(1)
    a = run_cell(study, "low", 0, "lm")
    torch.manual_seed(2)
    b = run_cell(study, "low", 0, "lm")
    assert a["val_loss"] == b["val_loss"] and run_cell(study, "low", 1, "lm")["val_loss"] != a["val_loss"]


def test_seeds_change_the_result():
    study = tiny_study()
    assert run_cell(study, "nope", 0, "lm")["val_loss"] != run_cell(study, "nope", 1, "lm")["val_loss"]


def test_run_study_stores_every_cell_once_with_provenance_and_resumes(tmp_path):
    study, out = tiny_study(), tmp_path / "tiny.json"
    logs = []
    run_study(study, out, shard=(0, 2), log=logs.append)
    run_study(study, out, shard=(1, 2), log=logs.append)
    data = load_records(out)
    cells = {(r["arm"], r["seed"], r["setting"]) for r in data["records"]}
    assert len(data["records"]) == len(cells) == 2 * 2 * 2 == len(logs)
    for r in data["records"]:
        assert {"commit", "torch", "machine", "seconds", "finished", "threads"} <= r.keys()
    assert data["meta"]["seeds"] == [0, 1] and data["meta"]["study"] == "tiny"
    before = out.read_text()
    run_study(study, out, log=logs.append)  # nothing left to do
    assert out.read_text() == before and len(logs) == 8


def test_summarize_reads_nested_metrics_by_dotted_path():
    records = [{"arm": "a", "setting": "lm", "control": {"seen": 1.0}}, {"arm": "a", "setting": "lm", "control": {"seen": 3.0}},
               {"arm": "b", "setting": "lm", "control": {}}]
    summary = summarize(records, "control.seen", "lm")
    assert set(summary) == {"a"} and summary["a"]["mean"] == 2.0 and summary["a"]["values"] == [1.0, 3.0]


def test_summarize_gives_mean_spread_and_count():
    records = [{"arm": "a", "setting": "lm", "val_loss": v} for v in (1.0, 2.0, 3.0)]
    records += [{"arm": "b", "setting": "lm", "val_loss": 5.0}, {"arm": "a", "setting": "copy", "token_accuracy": 1.0}]
    s = summarize(records, "val_loss", "lm")
    assert list(s) == ["a", "b"]
    assert s["a"]["mean"] == 2.0 and s["a"]["std"] == 1.0 and (s["a"]["min"], s["a"]["max"], s["a"]["n"]) == (1.0, 3.0, 3)
    assert math.isnan(s["b"]["std"])


def test_bad_inputs_are_named():
    study = tiny_study()
    with pytest.raises(ValueError, match="setting must be one of"):
        run_cell(study, "rope", 0, "passkey")
    with pytest.raises(KeyError, match="no arm 'xpos'"):
        run_cell(study, "xpos", 0, "lm")
    with pytest.raises(KeyError, match="no arm"):
        run_study(study, "unused.json", arms=["xpos"])
    with pytest.raises(ValueError, match="copy-long"):                  # a setting this study does not define
        run_study(study, "unused.json", settings=["copy-long"])
    with pytest.raises(SystemExit):
        main(["methods", "--shard", "2/2"])


def test_the_command_line_writes_the_study(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(STUDIES, "tiny", tiny_study())
    out = tmp_path / "t.json"
    main(["tiny", "--arms", "rope", "--seeds", "3", "--settings", "copy", "--out", str(out)])
    data = json.loads(out.read_text())
    assert [(r["arm"], r["seed"], r["setting"]) for r in data["records"]] == [("rope", 3, "copy")]
    assert data["meta"]["command"] == "python -m posenc.experiments.compare tiny"        # rebuilds the whole study
    assert data["records"][0]["command"] == ("python -m posenc.experiments.compare tiny --arms rope --seeds 3 "
                                             f"--settings copy --out {shlex.quote(str(out))}")
    torch.set_num_threads(torch.get_num_threads())


def test_other_lengths_are_evaluated_too():
    study = dataclasses.replace(tiny_study(), other_lengths=(8,))
    record = run_cell(study, "rope", 0, "lm")
    assert set(record["val_loss_at"]) == {"8"} and len(record["loss_per_position"]) == 16


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_the_stored_study_is_complete_and_says_where_it_came_from(name):
    """Every cell of the study is in book/results/NAME.json, once, with its provenance."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "book" / "results" / f"{name}.json"
    data = load_records(path)
    study = STUDIES[name]
    cells = [(r["arm"], r["seed"], r["setting"]) for r in data["records"]]
    expected = set(study.cells())
    assert len(cells) == len(set(cells)) and set(cells) == expected
    assert data["meta"]["command"] == f"python -m posenc.experiments.compare {name}"
    steps = {"lm": study.lm.steps, "copy": study.copy.steps, "copy-long": getattr(study.copy_long, "steps", None)}
    for r in data["records"]:
        assert r["commit"] and r["torch"] and r["machine"] and r["seconds"] > 0
        assert r["steps"] == steps[r["setting"]]
