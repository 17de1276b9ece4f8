"""posenc.lab.experiments.compare: cells, stored studies (resume, shards, provenance), summaries."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex

import pytest
import torch

from posenc.lab.experiments.compare import STUDIES, Arm, Study, load_records, run_cell, run_study, summarize
from posenc.lab.experiments.compare import main
from posenc.lab.lm import LMConfig
from posenc.lab.train import TrainConfig


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
    assert data["meta"]["command"] == "python -m posenc.lab.experiments.compare tiny"        # rebuilds the whole study
    assert data["records"][0]["command"] == ("python -m posenc.lab.experiments.compare tiny --arms rope --seeds 3 "
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
    # studies stored before the lab split (0.2.0) were made by posenc.experiments.compare, the same code then
    assert data["meta"]["command"] in (f"python -m posenc.lab.experiments.compare {name}",
                                       f"python -m posenc.experiments.compare {name}")
    steps = {"lm": study.lm.steps, "copy": study.copy.steps, "copy-long": getattr(study.copy_long, "steps", None)}
    for r in data["records"]:
        assert r["commit"] and r["torch"] and r["machine"] and r["seconds"] > 0
        assert r["steps"] == steps[r["setting"]]


# --- the experiments protocol ----------------------------------------------------------------------


def tiny_protocol_study(**kw) -> Study:
    kw.setdefault("grid", (1.0, 10.0))
    return dataclasses.replace(
        tiny_study(protocol=True, tuning_seed=9, curve_points=2, curve_windows=2, curve_examples=4, **kw),
        arms=(Arm("nope", "nope"), Arm("learned", "learned"), Arm("sinusoidal", "sinusoidal")))


def test_the_knob_is_the_position_step_size_or_the_code_scale_or_nothing():
    from posenc.lab.experiments.compare import arm_grid, arm_knob

    study = tiny_protocol_study()
    assert [arm_knob(study, a) for a in ("nope", "learned", "sinusoidal")] == [None, "position_lr", "code_scale"]
    assert arm_grid(study, "nope") == (1.0,) and arm_grid(study, "learned") == (1.0, 10.0)
    assert arm_knob(study, Arm("x", "learned", knob=None)) is None


def test_a_protocol_cell_applies_its_multiplier_and_records_curve_and_items():
    study = tiny_protocol_study()
    r1 = run_cell(study, "sinusoidal", 0, "lm")
    r10, model = run_cell(study, "sinusoidal", 0, "lm", mult=10.0, return_model=True)
    from posenc.method import build_method
    assert model.position.scale == pytest.approx(10 * build_method("sinusoidal", study.model).scale)
    assert r10["knob"] == "code_scale" and r10["mult"] == 10.0 and r1["val_loss"] != r10["val_loss"]
    assert [p["step"] for p in r1["curve"]] == [2, 3] and len(r1["loss_per_window"]) == study.eval_windows
    tune = run_cell(study, "learned", study.tuning_seed, "copy", mult=10.0)
    assert tune["tune_answer_loss"] != tune["answer_loss"]  # other examples than the reported ones
    copy = run_cell(study, "learned", 0, "copy", mult=10.0)
    assert len(copy["row_exact"]) == study.eval_examples and set(copy["row_exact"]) <= {"0", "1"}
    assert copy["row_exact"].count("1") / study.eval_examples == copy["exact_match"]
    assert {"token_accuracy", "exact_match", "answer_loss"} <= copy["curve"][-1].keys()
    with pytest.raises(ValueError, match="has no knob to tune, so mult must be 1"):
        run_cell(study, "nope", 0, "lm", mult=3.0)
    with pytest.raises(ValueError, match="mult must be a number > 0"):
        run_cell(study, "nope", 0, "lm", mult=0)


def test_a_protocol_study_tunes_on_its_own_seed_then_runs_every_seed_at_the_choice_and_at_1(tmp_path):
    from posenc.lab.experiments.compare import TIE, chosen_mult, select

    study, out = tiny_protocol_study(), tmp_path / "p.json"
    logs = []
    run_study(study, out, settings=["lm"], log=logs.append, poll_seconds=0.01)
    records = load_records(out)["records"]
    tuning = select(records, study, "tuning")
    # the grid (1, 10) for each tuned arm, and the step beyond the end it chose (0.1 or 100)
    for arm in ("learned", "sinusoidal"):
        mults = sorted(r["mult"] for r in tuning if r["arm"] == arm)
        assert len(mults) == 3 and {1.0, 10.0} < set(mults) and set(mults) - {1.0, 10.0} <= {0.1, 100.0}
        low = min(r["tune_val_loss"] for r in tuning if r["arm"] == arm)
        best = min((r for r in tuning if r["arm"] == arm and r["tune_val_loss"] < low + TIE), key=lambda r: abs(math.log(r["mult"])))
        assert chosen_mult(records, study, arm, "lm") == best["mult"]
    assert not any(r["arm"] == "nope" for r in tuning)
    # the choice is made on held-out windows: the tuning runs score them, the reported runs do not
    assert all("tune_val_loss" in r for r in tuning) and not any("tune_val_loss" in r for r in select(records, study))
    tuned, untuned = select(records, study, "tuned"), select(records, study, "untuned")
    assert sorted((r["arm"], r["seed"]) for r in tuned) == sorted((a, s) for a in ("nope", "learned", "sinusoidal") for s in (0, 1))
    assert all(r["mult"] == 1.0 for r in untuned) and len(untuned) == 6
    meta = load_records(out)["meta"]["protocol"]
    assert meta["tuning_seed"] == 9 and meta["chosen"]["nope / lm"] == 1.0
    assert set(meta["chosen"]) == {"nope / lm", "learned / lm", "sinusoidal / lm"}


def test_a_shard_waits_for_the_other_shards_tuning_runs(tmp_path, monkeypatch):
    import posenc.lab.experiments.compare as compare

    study, out = tiny_protocol_study(), tmp_path / "p.json"
    study = dataclasses.replace(study, arms=tuple(dataclasses.replace(a, extend=False) for a in study.arms))
    logs, sleeps = [], []

    poll, real_sleep = 0.0137, compare.time.sleep  # a poll no other caller of time.sleep (subprocess) uses

    def sleep(seconds):  # while shard 0 waits, "shard 1" stores its tuning runs
        if seconds != poll:
            return real_sleep(seconds)
        sleeps.append(seconds)
        run_study(study, out, settings=["lm"], shard=(1, 2), log=lambda *a: None, poll_seconds=poll)

    monkeypatch.setattr(compare.time, "sleep", sleep)
    run_study(study, out, settings=["lm"], shard=(0, 2), log=logs.append, poll_seconds=poll)
    assert sleeps and any("waiting for" in line for line in logs)


def test_protocol_studies_are_the_legacy_arms_at_the_protocols_budgets():
    from posenc.lab.experiments.compare import PROTOCOL_LM_STEPS, PROTOCOL_STUDIES, arm_grid

    for name, study in PROTOCOL_STUDIES.items():
        assert study.protocol and study.lm.steps == PROTOCOL_LM_STEPS and study.copy_long is None
        assert [a.label for a in study.arms] == [a.label for a in STUDIES[name].arms]
        assert study.tuning_seed not in study.seeds and len(study.seeds) >= 3
        assert str(study.out_path()).endswith(f"results/protocol/{name}.json")
        for arm in study.arms:  # every multiplier builds a valid method
            for mult in arm_grid(study, arm):
                small = dataclasses.replace(study, model=LMConfig(d_model=16, n_layer=1, n_head=2, max_len=64),
                                            lm=dataclasses.replace(study.lm, seq_len=16, batch_size=2),
                                            copy_length=4, eval_windows=2, eval_examples=4, curve_points=1,
                                            curve_windows=2)
                run_cell(small, arm, 0, "lm", steps=1, mult=mult)
    # the copy task sits clear of Shaw's clip (16) and T5's exact buckets
    assert PROTOCOL_STUDIES["methods"].copy_length < 16


def test_the_copy16_control_is_chapter_7s_copy_task_at_the_legacy_length(tmp_path, monkeypatch):
    from posenc.lab.experiments import compare
    from posenc.lab.experiments.compare import PROTOCOL_CONTROLS, PROTOCOL_STUDIES, arm_grid

    control, methods = PROTOCOL_CONTROLS["copy16"], PROTOCOL_STUDIES["methods"]
    assert control.settings == ("copy",) and control.copy_length == STUDIES["methods"].copy_length == 16
    assert control.copy == methods.copy and control.model == methods.model and len(control.seeds) == 5
    assert [a.label for a in control.arms] == ["nope", "alibi", "alibi, bias inside the scaling", "sinusoidal, scale x1"]
    assert arm_grid(control, "sinusoidal, scale x1") == (1.0,)          # untuned: the legacy scale
    assert str(control.out_path()).endswith("results/protocol/copy16.json")
    with pytest.raises(ValueError, match="setting must be one of"):
        run_cell(control, "alibi", 0, "lm")
    with pytest.raises(SystemExit):                      # a control runs under the protocol only
        main(["copy16"])
    # the whole control, shrunk: only copy cells, every seed
    small = dataclasses.replace(control, model=LMConfig(d_model=16, n_layer=1, n_head=2, max_len=64), copy_length=4,
                                copy=dataclasses.replace(control.copy, steps=2, batch_size=2, warmup_steps=1),
                                eval_examples=4, curve_points=1, curve_examples=2, seeds=(0, 1))
    monkeypatch.setitem(PROTOCOL_CONTROLS, "copy16", small)
    out = tmp_path / "c.json"
    main(["copy16", "--protocol", "--arms", "nope", "alibi", "--out", str(out)])
    data = json.loads(out.read_text())
    assert sorted((r["arm"], r["seed"], r["setting"]) for r in data["records"]) == [
        ("alibi", 0, "copy"), ("alibi", 1, "copy"), ("nope", 0, "copy"), ("nope", 1, "copy")]
    assert data["meta"]["command"] == "python -m posenc.lab.experiments.compare copy16 --protocol"
    assert compare.PROTOCOL_CONTROLS is PROTOCOL_CONTROLS
    torch.set_num_threads(torch.get_num_threads())


def test_a_live_check_reproduces_a_stored_curve_point_from_the_first_steps():
    study = tiny_protocol_study()
    full = run_cell(study, "learned", 0, "lm", mult=10.0)
    part = run_cell(study, "learned", 0, "lm", mult=10.0, stop_after=2)
    assert part["curve"] == full["curve"][:1] and part["stopped_after"] == 2


def test_ties_go_to_1_and_a_choice_at_an_end_of_the_grid_is_tried_one_step_further():
    from posenc.lab.experiments.compare import TIE, chosen_mult, grid_extension, pending_extension

    study = tiny_protocol_study(grid=(0.3, 1.0, 3.0, 10.0))
    rec = lambda arm, m, v: {"arm": arm, "setting": "lm", "seed": study.tuning_seed, "mult": m, "tune_val_loss": v}  # noqa: E731
    # scores within TIE of the best tie, broken toward 1
    flat = [rec("learned", 0.3, 1.7), rec("learned", 1.0, 1.5 + TIE / 2), rec("learned", 3.0, 1.5), rec("learned", 10.0, 1.6)]
    assert chosen_mult(flat, study, "learned", "lm") == 1.0
    flat[1]["tune_val_loss"] = 1.5 + 2 * TIE
    assert chosen_mult(flat, study, "learned", "lm") == 3.0
    # best at the top end: one more step (10 * 10 / 3) is needed before the choice is made
    edge = [rec("learned", 0.3, 1.7), rec("learned", 1.0, 1.6), rec("learned", 3.0, 1.5), rec("learned", 10.0, 1.4)]
    assert grid_extension((1.0, 3.0, 10.0), 10.0) == pytest.approx(100 / 3) and grid_extension((1.0, 3.0, 10.0), 3.0) is None
    assert chosen_mult(edge, study, "learned", "lm") is None
    assert pending_extension(edge, study, "learned", "lm") == pytest.approx(100 / 3)
    done = edge + [rec("learned", 100 / 3, 1.45)]
    assert chosen_mult(done, study, "learned", "lm") == 10.0 and pending_extension(done, study, "learned", "lm") is None
    # an arm that cannot go further keeps its end
    capped = dataclasses.replace(study, arms=tuple(dataclasses.replace(a, extend=False) for a in study.arms))
    assert chosen_mult(edge, capped, "learned", "lm") == 10.0


def test_run_study_runs_the_extension_before_the_reported_seeds(tmp_path, monkeypatch):
    import posenc.lab.experiments.compare as compare

    study, out = tiny_protocol_study(grid=(1.0, 10.0)), tmp_path / "e.json"
    real = compare.run_cell

    def fake(st, arm, seed, setting, **kw):  # the learned arm is best at the top of the grid, then at the extension
        record = real(st, arm, seed, setting, **kw)
        if seed == st.tuning_seed and arm == "learned":
            record["tune_val_loss"] = {1.0: 3.0, 10.0: 2.0, 100.0: 1.0}[kw["mult"]]
        return record

    monkeypatch.setattr(compare, "run_cell", fake)
    run_study(study, out, settings=["lm"], log=lambda *a: None, poll_seconds=0.01)
    records = load_records(out)["records"]
    assert sorted(r["mult"] for r in records if r["arm"] == "learned" and r["seed"] == study.tuning_seed) == [1.0, 10.0, 100.0]
    assert {r["mult"] for r in records if r["arm"] == "learned" and r["seed"] != study.tuning_seed} == {1.0, 100.0}


def test_two_shards_share_the_extensions_of_the_grid_and_both_finish(tmp_path):
    import threading

    from posenc.lab.experiments.compare import select

    study, out = tiny_protocol_study(), tmp_path / "s.json"  # grid (1, 10): every choice is at an end
    errors = []

    def shard(i):
        try:
            run_study(study, out, settings=["lm"], shard=(i, 2), log=lambda *a: None, poll_seconds=0.01)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=shard, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in threads)
    records = load_records(out)["records"]
    assert sorted(r["arm"] for r in select(records, study, "tuning")) == ["learned"] * 3 + ["sinusoidal"] * 3
    assert len(select(records, study, "tuned")) == 6


def test_check_rerun_holds_the_early_losses_everywhere_and_the_final_value_by_processor():
    from posenc.lab.experiments.records import (EARLY_TOLERANCE, OTHER_PROCESSOR_TOLERANCE, SAME_PROCESSOR_TOLERANCE,
                                                check_rerun, cpu_name)

    losses = [5.0 - 0.01 * i for i in range(30)]
    here = {"machine": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    stored = dict(here, train_loss_every_10=losses)
    live = {"train_loss_every_10": [x + 1e-4 for x in losses]}
    ok = check_rerun(live, stored, 2.0, 2.0)
    assert ok.same_processor and ok.tolerance == SAME_PROCESSOR_TOLERANCE and ok.gap == 0 and ok.early_gap < 2e-4
    with pytest.raises(AssertionError, match="final values by 1.00e-02"):
        check_rerun(live, stored, 2.01, 2.0)                              # same processor: 2e-3
    assert not check_rerun(live, dict(stored, cpu_capability="another set"), 2.01, 2.0).same_processor
    other = dict(stored, machine="another CPU")
    assert check_rerun(live, other, 2.01, 2.0).tolerance == OTHER_PROCESSOR_TOLERANCE
    with pytest.raises(AssertionError, match="another CPU"):
        check_rerun(live, other, 2.1, 2.0)
    wrong_seed = {"train_loss_every_10": [x + 2 * EARLY_TOLERANCE for x in losses]}
    with pytest.raises(AssertionError, match="first 200 steps"):
        check_rerun(wrong_seed, other, 2.0, 2.0)                          # early losses: on any processor
    assert check_rerun({"train_loss_every_10": losses[:5] + [0.0] * 25}, stored, 2.0, 2.0, early_steps=50).early_gap == 0
    for bad in (0, 15, 2.5, True):
        with pytest.raises(ValueError, match="early_steps must be a positive multiple of 10"):
            check_rerun(live, stored, 2.0, 2.0, early_steps=bad)
    with pytest.raises(ValueError, match="the live record has 3"):
        check_rerun({"train_loss_every_10": losses[:3]}, stored, 2.0, 2.0)
    # another Python's standard library is another corpus: said before any loss is compared
    with pytest.raises(AssertionError, match="another corpus.*fingerprint aaaa.*bbbb"):
        check_rerun(dict(live, corpus="aaaa"), dict(stored, corpus="bbbb", python="3.11.7"), 2.0, 2.0)
    assert check_rerun(dict(live, corpus="aaaa"), dict(stored, corpus="aaaa"), 2.0, 2.0).gap == 0
