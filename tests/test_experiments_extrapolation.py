"""posenc.lab.experiments.extrapolation (the length-extrapolation study), with its helpers
posenc.lab.experiments.variants (RoPE scalings and log-n on a trained model), .options (the command line
from the config dataclass), .records (stored JSON) and .extrapolation_plots (figures)."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex

import pytest
import torch

from posenc.lab.experiments import extrapolation as ex
from posenc.lab.experiments.extrapolation import ExtrapolationStudy, build_model, cell_cost, run_cell, run_study
from posenc.lab.experiments.options import command_for
from posenc.lab.experiments.records import load_records
from posenc.lab.experiments.variants import SCALINGS, rope_variant, scaling_config, variant
from posenc.lab.lm import TinyLM
from posenc.method import METHODS
from posenc.rope import rope_cos_sin, yarn_mscale


def tiny(**kw) -> ExtrapolationStudy:
    """A study that runs in about a second: 80-token training windows (the shortest a 2-digit passkey
    with some filler fits in), evaluation at 80 and 160, a 16-wide one-layer model, 3 steps."""
    base = dict(methods=("rope", "learned", "t5"), seeds=(0,), train_length=80, multiples=(1, 2), d_model=16,
                n_layer=1, n_head=2, lm_steps=3, lm_batch=2, passkey_steps=3, passkey_batch=2, warmup_steps=1,
                finetune_steps=2, eval_windows=2, eval_examples=2, eval_batch=2, depths=(0.0, 1.0), curve_windows=2)
    return ExtrapolationStudy(**{**base, **kw})


def by_key(records):
    return {ex.record_key(r): r for r in records}


# --- the grid and the models ---------------------------------------------------------------------


def test_the_grid_is_every_method_seed_and_task_and_defaults_to_every_registered_method():
    study = tiny(seeds=(0, 1))
    assert study.cells() == [(m, s, t) for t in ("lm", "passkey") for s in (0, 1) for m in ("rope", "learned", "t5")]
    assert ExtrapolationStudy().method_names == tuple(sorted(METHODS))
    assert ExtrapolationStudy().eval_lengths == (128, 256, 512, 1024)
    assert len(ExtrapolationStudy().cells()) == len(METHODS) * 3 * 2


def test_every_registered_method_is_built_to_run_at_the_longest_length():
    """Finite tables and caches cover 8 L; the other methods keep the hyper-parameters of length L."""
    study = tiny(train_length=32, multiples=(1, 4), tasks=("lm",))
    idx = torch.randint(0, 256, (1, 128))
    for name in METHODS:
        model = build_model(study, name, 0)
        assert model.config.max_len == 128 and model(idx).shape == (1, 128, 256), name
        covers = model.position.max_positions
        assert covers is None or covers >= 128, name
    assert build_model(study, "learned", 0).position.table().shape[0] == 128
    assert build_model(study, "t5", 0).position.max_distance == 32       # T5's buckets are set by L, as pre-trained
    assert build_model(study, "deberta", 0).position.max_position == 32
    assert build_model(study, "rope", 0).position.max_positions == 128


def test_a_cell_is_seeded_and_repeatable():
    study = tiny(methods=("learned",), tasks=("lm",), logn=False)
    a, b = run_cell(study, "learned", 0, "lm"), run_cell(study, "learned", 0, "lm")
    torch.manual_seed(123)  # the global RNG plays no part
    c = run_cell(study, "learned", 0, "lm")
    strip = lambda rs: [{k: v for k, v in r.items() if "seconds" not in k} for r in rs]  # noqa: E731
    assert strip(a) == strip(b) == strip(c)
    assert run_cell(study, "learned", 1, "lm")[1]["loss"] != a[1]["loss"]
    records, model = run_cell(study, "learned", 0, "lm", return_model=True)  # the trained model, for inspection
    assert strip(records) == strip(a) and isinstance(model, TinyLM) and not model.training
    from posenc.lab.train import evaluate
    from posenc.lab.data import load_stdlib_corpus
    again = evaluate(model, load_stdlib_corpus().val, 80, num_windows=2, batch_size=2).loss
    assert abs(again - a[1]["loss"]) < 1e-6


def test_records_of_a_study_with_their_provenance(tmp_path):
    study, out = tiny(), tmp_path / "x.json"
    data = run_study(study, out, command="python -m posenc.lab.experiments.extrapolation --x", progress=False)
    records = data["records"]
    assert len(by_key(records)) == len(records)                                   # one record per key
    train = [r for r in records if r["kind"] == "train"]
    assert sorted((r["method"], r["task"], r["finetune"] or "") for r in train) == sorted(
        [(m, t, "") for m in ("rope", "learned", "t5") for t in ("lm", "passkey")]
        + [("rope", t, f) for t in ("lm", "passkey") for f in ("default", "linear", "yarn")])
    for r in records:
        assert {"commit", "dirty", "torch", "machine", "device", "threads", "finished"} <= r.keys()
        assert r["command"] == "python -m posenc.lab.experiments.extrapolation --x" and r["trained_length"] == 80
    learned = next(r for r in train if r["method"] == "learned" and r["task"] == "lm")
    assert learned["position_covers"] == 160 and learned["untrained_table_rows"] == 80  # rows past L never trained
    assert next(r for r in train if r["method"] == "t5")["untrained_table_rows"] == 0
    key = lambda m, task, n, logn=False, scaling="none", ft=None, depth=None: (  # noqa: E731
        "eval", m, 0, task, logn, scaling, ft, n, depth, None)
    found = by_key(records)
    for m in ("rope", "learned", "t5"):
        for n in (80, 160):
            lm = found[key(m, "lm", n)]
            assert len(lm["loss_per_position"]) == n and math.isclose(lm["loss"], sum(lm["loss_per_position"]) / n,
                                                                      rel_tol=1e-3)
            for depth in (0.0, 1.0):
                pk = found[key(m, "passkey", n, depth=depth)]
                assert 0 <= pk["exact_match"] <= pk["token_accuracy"] + 1e-9 <= 1 + 1e-9 and pk["num_examples"] == 2
        assert key(m, "lm", 160, logn=True) in found and key(m, "lm", 80, logn=True) not in found  # log-n past L only
    for s in SCALINGS:  # every zero-shot scaling of the RoPE model, past L, factor = length / L
        assert found[key("rope", "lm", 160, scaling=s)]["factor"] == 2.0
        assert key("rope", "lm", 80, scaling=s) not in found
        assert key("learned", "lm", 160, scaling=s) not in found
    for ft in ("linear", "yarn"):  # fine-tuned at the longest length (factor 2), evaluated at every length
        assert all(found[key("rope", "lm", n, scaling=ft, ft=ft)]["factor"] == 2.0 for n in (80, 160))
    # the control: fine-tuned the same way with RoPE's own frequencies (factor 1)
    assert all(found[key("rope", "lm", n, scaling="default", ft="default")]["factor"] == 1.0 for n in (80, 160))
    assert data["meta"]["command"] == command_for(study, ex.COMMAND) and data["meta"]["cells"] == 6
    assert data["meta"]["config"]["methods"] == ["rope", "learned", "t5"]


def test_an_interrupted_study_resumes_without_recomputing_finished_cells(tmp_path):
    study, out = tiny(methods=("learned", "t5"), tasks=("lm",)), tmp_path / "x.json"
    logs = []
    run_study(study, out, progress=False, log=logs.append)
    assert len(logs) == 2
    before = out.read_text()
    run_study(study, out, progress=False, log=logs.append)                # nothing left to do
    assert out.read_text() == before and len(logs) == 2
    data = json.loads(before)  # the interruption: one cell's records lost
    data["records"] = [r for r in data["records"] if r["cell"] != "t5|0|lm"]
    out.write_text(json.dumps(data))
    after = run_study(study, out, progress=False, log=logs.append)
    assert len(logs) == 3 and logs[-1].startswith("t5|0|lm")
    assert {r["cell"] for r in after["records"]} == {"learned|0|lm", "t5|0|lm"}
    assert sorted(map(ex.record_key, after["records"]), key=str) == sorted(
        map(ex.record_key, json.loads(before)["records"]), key=str)


def test_logn_is_the_identity_at_L_so_its_evaluations_start_past_L():
    model = build_model(tiny(), "alibi", 0)
    logn = variant(model, logn_length=80)
    assert logn.config.logn_length == 80 and model.config.logn_length is None
    idx = torch.randint(0, 256, (2, 160))
    a, b = model(idx), logn(idx)
    assert torch.equal(a[:, :80], b[:, :80]) and not torch.equal(a[:, 80:], b[:, 80:])


def test_cell_cost_orders_rope_above_the_others():
    study = tiny()
    assert cell_cost(study, "rope", "lm") > cell_cost(study, "learned", "lm") > 0
    assert cell_cost(study, "learned", "passkey") != cell_cost(study, "learned", "lm")


def test_the_gpu_preset_is_larger_and_one_flag_away():
    cpu, gpu = ex.PRESETS["cpu"], ex.PRESETS["gpu"]
    assert cpu == ExtrapolationStudy()
    assert gpu.train_length >= 1024 and gpu.d_model > cpu.d_model and gpu.n_layer > cpu.n_layer
    assert gpu.lm_steps > cpu.lm_steps and gpu.passkey_steps > cpu.passkey_steps
    args = ex.parser().parse_args(["--preset", "gpu", "--seeds", "4"])
    assert ex.from_args(ex.PRESETS[args.preset], args) == dataclasses.replace(gpu, seeds=(4,))


# --- RoPE scalings on a trained model --------------------------------------------------------------


def test_scaling_configs_are_those_of_posenc_rope():
    assert scaling_config("default", 4.0, 128) is None
    assert scaling_config("linear", 4, 128) == {"rope_type": "linear", "factor": 4.0}
    assert scaling_config("yarn", 2.0, 128) == {"rope_type": "yarn", "factor": 2.0,
                                                "original_max_position_embeddings": 128}
    assert scaling_config("llama3", 8.0, 64)["high_freq_factor"] == 4.0
    with pytest.raises(ValueError, match=r"scaling must be 'default' or one of .*got 'longrope'"):
        scaling_config("longrope", 2.0, 128)


def test_a_rope_variant_applies_the_attention_scale_to_cos_and_sin_as_hugging_face_does():
    study = tiny()
    model = build_model(study, "rope", 0)
    yarn = rope_variant(model, scaling_config("yarn", 4.0, 80), 320)
    assert yarn.position.attention_scale == pytest.approx(yarn_mscale(4.0)) and yarn_mscale(4.0) > 1
    cos, sin = rope_cos_sin(torch.arange(320), yarn.position.inv_freq)
    torch.testing.assert_close(yarn.position.cos_cached, cos * yarn_mscale(4.0))
    torch.testing.assert_close(yarn.position.sin_cached, sin * yarn_mscale(4.0))
    linear = rope_variant(model, scaling_config("linear", 2.0, 80), 160)  # PI: position m rotates as m / 2
    torch.testing.assert_close(linear.position.cos_cached[2::2][:10], model.position.cos_cached[1:11])
    for name, p in model.state_dict().items():  # the trained weights are carried over, the model untouched
        assert torch.equal(p, yarn.state_dict()[name])
    assert model.position.scaling is None and model.position.max_positions == 160
    with pytest.raises(TypeError, match="rope_variant needs a model whose position is a RotaryEmbedding, got Learned"):
        rope_variant(build_model(study, "learned", 0), None, 160)


# --- bad inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, allowed", [
    ("train_length", 0, "a positive int"), ("lm_steps", 2.5, "a positive int"), ("finetune_length", 0, "or None"),
    ("finetune_steps", -1, "an int >= 0"), ("lr", 0, "a number > 0"), ("logn", 1, "a bool"),
    ("tasks", ("lm", "copy"), "names from"), ("tasks", (), "non-empty"), ("scalings", ("longrope",), "names from"),
    ("finetune_scalings", ("linear", "linear"), "distinct"), ("seeds", (), "non-empty tuple of distinct ints"),
    ("multiples", (2, 1), "increasing"), ("depths", (0.5, 2.0), r"in \[0, 1\]"), ("methods", ["rope"], "tuple"),
    ("n_head", 3, "divide d_model=16"), ("train_length", 60, ">= 74 for the passkey task"),
    ("warmup_steps", 5, "<= lm_steps and passkey_steps"),
    ("lm_mults", ("sinusoidal=3", "sinusoidal=1"), "distinct METHOD=VALUE"), ("passkey_mults", ("xpos=3",), "registered"),
    ("lm_mults", ("learned=0",), "values > 0"), ("lm_mults", ("learned",), "METHOD=VALUE"), ("curve_points", 0, "positive"),
    ("protocol", 1, "a bool"),
])
def test_bad_study_fields_are_named(field, value, allowed):
    with pytest.raises(ValueError, match=rf"ExtrapolationStudy\.{field} must .*{allowed}.*got {re_repr(value)}"):
        tiny(**{field: value})


def re_repr(value) -> str:
    import re

    return re.escape(repr(value))


def test_other_bad_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"methods has 'xpos', which is not registered; registered methods: \["):
        tiny(methods=("xpos",)).method_names
    with pytest.raises(ValueError, match=r"task must be one of the study's tasks \('lm',\), got 'passkey'"):
        run_cell(tiny(tasks=("lm",)), "rope", 0, "passkey")
    with pytest.raises(ValueError, match=r"method must be one of the study's methods \('rope', 'learned', 't5'\), got 'al"):
        run_cell(tiny(), "alibi", 0, "lm")
    with pytest.raises(SystemExit):
        ex.main(["--methods", "xpos", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        ex.main(["--train-length", "0", "--out", str(tmp_path / "x.json")])


# --- the command line and the figures ------------------------------------------------------------


def test_the_command_line_writes_the_study_and_its_figures(tmp_path):
    out, plots = tmp_path / "x.json", tmp_path / "plots"
    argv = ["--methods", "rope", "alibi", "--seeds", "0", "--train-length", "80", "--multiples", "1", "2",
            "--d-model", "16", "--n-layer", "1", "--n-head", "2", "--lm-steps", "3", "--lm-batch", "2",
            "--passkey-steps", "3", "--passkey-batch", "2", "--warmup-steps", "1", "--finetune-steps", "1",
            "--finetune-scalings", "yarn", "--scalings", "--depths", "0.5", "--eval-windows", "2",
            "--eval-examples", "2", "--eval-batch", "2", "--no-logn", "--quiet",
            "--out", str(out), "--plots", str(plots)]
    threads = torch.get_num_threads()
    try:
        ex.main(argv)
    finally:
        torch.set_num_threads(threads)
    data = load_records(out)
    study = ex.from_args(ExtrapolationStudy(), ex.parser().parse_args(argv))
    assert study.scalings == () and study.finetune_scalings == ("yarn",) and study.logn is False
    assert data["meta"]["command"] == command_for(study, ex.COMMAND)
    assert ex.from_args(ExtrapolationStudy(), ex.parser().parse_args(shlex.split(data["meta"]["command"])[3:])) == study
    assert {r["command"] for r in data["records"]} == {shlex.join([*ex.COMMAND, *argv])}
    assert not any(r.get("logn") for r in data["records"])
    assert sorted(p.name for p in plots.iterdir()) == ["extrapolation_length_sweep.png",
                                                       "extrapolation_loss_vs_position.png",
                                                       "extrapolation_passkey_grid.png"]


def test_the_figures_draw_chosen_panels_and_a_live_overlay_and_refuse_unknown_labels():
    """The figure functions the chapter draws with: chosen panels and labels, the live run's points
    on top of the stored means, and a clear error for a label with no records."""
    from posenc.lab.experiments.extrapolation_plots import length_sweep_figure, loss_vs_position_figure, passkey_grid_figure

    def rec(method, seed, n, task="lm", value=1.0, depth=None, scaling="none"):
        score = {"loss": value, "loss_per_position": [value] * n} if task == "lm" else {"exact_match": value}
        return {"kind": "eval", "task": task, "method": method, "seed": seed, "logn": False, "scaling": scaling,
                "finetune": None, "eval_length": n, "depth": depth, "trained_length": 8, **score}

    records = [rec(m, seed, n, value=1.0 + seed + n / 8) for m in ("rope", "alibi") for seed in (0, 1) for n in (8, 16)]
    records += [rec("rope", seed, 16, scaling="yarn") for seed in (0, 1)]
    records += [rec(m, 0, n, "passkey", 0.5, d) for m in ("rope", "alibi") for n in (8, 16) for d in (0.0, 1.0)]
    live = [rec("rope", 0, n, value=9.0) for n in (8, 16)]
    try:
        fig = length_sweep_figure(records, panels={"a": ["alibi"], "b": ["rope", "rope, yarn zero-shot"]}, live=live)
        assert fig.axes[0].get_title() == "a" and fig.axes[1].get_title() == "b"
        lm_rope = fig.axes[1]
        assert [t.get_text() for t in lm_rope.get_legend().get_texts()] == ["rope", "rope, yarn zero-shot"]
        diamonds = [c for c in lm_rope.collections if c.get_offsets().shape == (2, 2)
                    and list(c.get_offsets()[:, 1]) == [9.0, 9.0]]
        assert len(diamonds) == 1 and list(diamonds[0].get_offsets()[:, 0]) == [1.0, 2.0]   # live, at 1 L and 2 L
        assert not any(list(c.get_offsets()[:, 1]) == [9.0, 9.0] for c in fig.axes[0].collections)  # not on alibi's
        grid = passkey_grid_figure(records, ["alibi"])
        assert grid.axes[0].get_title() == "alibi" and grid.axes[0].texts[0].get_text() == ".50"
        position = loss_vs_position_figure(records, 16, panels={"x": ["rope"]}, smooth=2, live=live)
        assert len(position.axes[0].lines) == 3                                   # the curve, the live one, the L line
        assert set(position.axes[0].lines[1].get_ydata()) == {9.0} and position.axes[0].lines[1].get_linestyle() == ":"
        with pytest.raises(ValueError, match="'transformer_xl'"):
            length_sweep_figure(records, panels={"a": ["transformer_xl"]})
        with pytest.raises(ValueError, match="'rope, yarn zero-shot'.*available"):
            passkey_grid_figure(records, ["rope, yarn zero-shot"])
        assert passkey_grid_figure([r for r in records if r["task"] == "lm"]) is None   # nothing to draw
    finally:
        import matplotlib.pyplot as plt

        plt.close("all")


def test_summaries_for_the_figures_reduce_over_seeds_and_fill_identity_variants_at_L():
    from posenc.lab.experiments.extrapolation_plots import identity_at_training_length, per_seed, summarize, variant_label

    def rec(seed, loss, n=8, logn=False):
        return {"kind": "eval", "task": "lm", "method": "rope", "seed": seed, "logn": logn, "scaling": "none",
                "finetune": None, "eval_length": n, "depth": None, "loss": loss}

    records = [rec(0, 1.0), rec(1, 3.0), rec(0, 5.0, 16, True), {"kind": "train", "task": "lm"}]
    s = summarize(records, "lm", "loss")
    assert list(s) == ["rope", "rope + log-n"] and s["rope"][(8, None)]["mean"] == 2.0
    assert (s["rope"][(8, None)]["min"], s["rope"][(8, None)]["max"], s["rope"][(8, None)]["n"]) == (1.0, 3.0, 2)
    filled = identity_at_training_length(s, 8)
    assert list(filled["rope + log-n"]) == [(8, None), (16, None)] and filled["rope + log-n"][(8, None)]["mean"] == 2.0
    depths = [dict(rec(seed, 0.0), task="passkey", depth=d, exact_match=x) for seed, d, x in
              [(0, 0.0, 1.0), (0, 1.0, 0.5), (1, 0.0, 0.0), (1, 1.0, 0.5)]]
    pooled = summarize(depths, "passkey", "exact_match", over_depths=True)["rope"][(8, None)]
    assert (pooled["mean"], pooled["min"], pooled["max"], pooled["n"]) == (0.5, 0.25, 0.75, 2)  # seed means, then seeds
    assert per_seed(depths, "passkey", "exact_match", over_depths=True) == {"rope": {(8, None): {0: 0.75, 1: 0.25}}}
    assert per_seed(records, "lm", "loss")["rope"] == {(8, None): {0: 1.0, 1: 3.0}}   # seed by seed, for pairing
    assert variant_label({"method": "rope", "finetune": "yarn", "scaling": "yarn"}) == "rope, yarn fine-tuned"
    assert variant_label({"method": "rope", "finetune": "default", "scaling": "default"}) == "rope, unscaled fine-tuned"
    assert variant_label({"method": "rope", "finetune": None, "scaling": "linear"}) == "rope, linear zero-shot"


# --- the stored study ----------------------------------------------------------------------------


def test_the_stored_study_is_complete_and_says_where_it_came_from():
    """book/results/extrapolation.json holds every cell of the default study, each with every
    evaluation its model gets, once, with the provenance of its run."""
    from collections import Counter
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "book" / "results" / "extrapolation.json"
    data = load_records(path)
    study = ExtrapolationStudy()
    # stored before the lab split (0.2.0), when the module was posenc.experiments.extrapolation
    assert data["meta"]["command"] in ("python -m posenc.lab.experiments.extrapolation",
                                       "python -m posenc.experiments.extrapolation")
    resolved = dataclasses.replace(study, methods=study.method_names)   # the default () means every method
    expected = json.loads(json.dumps(dataclasses.asdict(resolved)))
    stored = json.loads(json.dumps(data["meta"]["config"]))
    # the protocol's fields came after this study was stored; their defaults are what it ran with
    assert set(expected) - set(stored) == {"protocol", "curve_points", "lm_mults", "passkey_mults", "curve_windows",
                                           "curve_examples", "finetune_control_steps"}
    assert stored == {k: v for k, v in expected.items() if k in stored}
    records = data["records"]
    keys = [ex.record_key(r) for r in records]
    assert len(keys) == len(set(keys))                                   # once each
    trained = {(r["method"], r["seed"], r["task"]) for r in records if r["kind"] == "train"}
    assert trained == set(study.cells())
    evals = Counter((r["method"], r["task"], r["seed"]) for r in records if r["kind"] == "eval")
    for method, seed, task in study.cells():                             # every seed got the same evaluations
        assert evals[method, task, seed] == evals[method, task, study.seeds[0]] > 0
    for method, seed, task in study.cells():
        lengths = {r["eval_length"] for r in records if r["kind"] == "eval" and r["scaling"] == "none"
                   and not r["logn"] and r["finetune"] is None and (r["method"], r["seed"], r["task"]) == (method, seed, task)}
        assert lengths == set(study.eval_lengths), (method, seed, task)
    for r in records:
        assert r["commit"] and r["torch"] and r["machine"] and r["command"] and r["dirty"] is False


def test_every_option_of_the_study_has_its_field_comment_as_help():
    """The command line's help comes from each field's ``#:`` comment, at the end of its line or on the line above."""
    from posenc.lab.experiments.options import field_comments

    comments = field_comments(ExtrapolationStudy)
    assert set(comments) == {f.name for f in dataclasses.fields(ExtrapolationStudy)}
    assert "control" in comments["finetune_scalings"]                       # the comment on the line above
    assert comments["train_length"] == "L, the training window in tokens"  # the comment at the end of the line
    helps = {a.dest: a.help for a in ex.parser()._actions}
    assert all(helps[f.name] for f in dataclasses.fields(ExtrapolationStudy))


# --- the experiments protocol ---------------------------------------------------------------------


def test_a_protocol_cell_uses_the_same_windows_at_every_length_and_keeps_what_the_statistics_need(monkeypatch):
    spans = []
    real = ex.evaluate
    monkeypatch.setattr(ex, "evaluate", lambda *a, **kw: spans.append(kw.get("span")) or real(*a, **kw))
    study = tiny(methods=("sinusoidal", "learned"), protocol=True, curve_points=2, lm_steps=4, passkey_steps=4,
                 lm_mults=("sinusoidal=3", "learned=10"), passkey_mults=("learned=0.5",), logn=False)
    lm = run_cell(study, "sinusoidal", 0, "lm")
    assert set(spans) == {160}  # every LM evaluation (the curve's too) places its windows for the longest length
    train_record, evals = lm[0], [r for r in lm if r["kind"] == "eval"]
    assert [c["step"] for c in train_record["curve"]] == [2, 4]
    assert set(train_record["curve"][0]) == {"step", "val_loss_80", "val_loss_160"}  # at L and at the longest length
    assert train_record["knob"] == "code_scale" and train_record["mult"] == 3.0 and train_record["tuned"]
    assert all(len(r["loss_per_window"]) == 2 and r["mult"] == 3.0 for r in evals)
    assert math.isclose(sum(evals[0]["loss_per_window"]) / 2, evals[0]["loss"], abs_tol=1e-4)
    # the multiplier is what the cell trains with: sinusoidal's code scale, learned's position step size
    plain = run_cell(dataclasses.replace(study, lm_mults=()), "sinusoidal", 0, "lm")
    assert plain[0]["mult"] == 1.0 and plain[1]["loss"] != evals[0]["loss"]
    bands = evals[1]["loss_per_window_band"]  # at 160: per window, over [0, 80) and [80, 160)
    assert len(bands) == 2 and len(bands[0]) == 2 and bands[0][0] == evals[0]["loss_per_window"][0]  # same prefix
    assert len(evals[0]["loss_per_window_chunk_of_longest"][0]) == 2  # the 160-token windows cut in two
    assert evals[0]["loss_per_window_chunk_of_longest"][0][0] == bands[0][0]  # the first piece has the same context
    passkey = run_cell(study, "learned", 0, "passkey")
    assert passkey[0]["knob"] == "position_lr" and passkey[0]["mult"] == 0.5
    shifted = [r for r in passkey if r.get("position_offset")]
    assert {(r["eval_length"], r["position_offset"]) for r in shifted} == {(80, 80)} and len(shifted) == len(study.depths)
    assert all(len(r["row_answer_loss"]) == 2 for r in passkey if r["kind"] == "eval")
    assert {"exact_match_80", "exact_match_160", "answer_loss_80", "answer_loss_160"} <= set(passkey[0]["curve"][0])
    assert all(len(r["row_exact"]) == 2 and set(r["row_exact"]) <= {"0", "1"} for r in passkey if r["kind"] == "eval")


def test_a_method_without_a_knob_refuses_a_multiplier():
    with pytest.raises(ValueError, match="method 'rope' has no knob to tune.*must be 1, got 3.0"):
        run_cell(tiny(methods=("rope",), lm_mults=("rope=3",)), "rope", 0, "lm")
    assert tiny(lm_mults=("t5=30",)).mult("t5", "lm") == 30.0 and tiny(lm_mults=("t5=30",)).mult("t5", "passkey") == 1.0


def test_the_protocol_preset_uses_the_methods_studys_budgets():
    from posenc.lab.experiments.compare import PROTOCOL_COPY_STEPS, PROTOCOL_LM_STEPS

    preset = ex.PRESETS["protocol"]
    assert preset.protocol and preset.lm_steps == PROTOCOL_LM_STEPS and preset.passkey_steps == PROTOCOL_COPY_STEPS
    assert dataclasses.replace(preset, protocol=False, lm_steps=250, passkey_steps=500, eval_windows=32, eval_examples=32,
                               finetune_steps=50, finetune_control_steps=None) == ex.PRESETS["cpu"]
    assert preset.finetune_control_steps == 10 * preset.finetune_steps  # as in Chen et al.'s comparison


def test_untrained_table_rows_are_put_back_so_that_weight_decay_and_the_multiplier_do_not_set_them():
    study = tiny(methods=("learned",), tasks=("lm",), protocol=True, curve_points=1, lm_steps=6, logn=False,
                 lm_mults=("learned=10",), finetune_steps=0)
    records, model = run_cell(study, "learned", 0, "lm", return_model=True)
    fresh = build_model(study, "learned", 0).position.table()
    trained = model.position.table()
    assert torch.equal(trained[80:], fresh[80:]) and not torch.equal(trained[:80], fresh[:80])
    ratio = records[0]["untrained_rows_norm_ratio"]
    assert records[0]["untrained_rows_restored"] and 0 < min(ratio.values()) < 1  # weight decay had shrunk them


def test_the_control_fine_tune_gets_its_own_budget_and_every_fine_tune_a_curve():
    study = tiny(methods=("rope",), tasks=("lm",), protocol=True, curve_points=2, logn=False, scalings=(),
                 finetune_steps=2, finetune_control_steps=4, finetune_scalings=("default", "linear"))
    records = run_cell(study, "rope", 0, "lm")
    fine = {r["finetune"]: r for r in records if r["kind"] == "train" and r["finetune"]}
    assert fine["default"]["steps"] == 4 and fine["linear"]["steps"] == 2
    assert [c["step"] for c in fine["default"]["curve"]] == [2, 4] and [c["step"] for c in fine["linear"]["curve"]] == [1, 2]


def test_a_stored_file_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "x.json"
    study = tiny(methods=("learned",), tasks=("lm",), logn=False, finetune_steps=0)
    run_study(study, out, progress=False, log=lambda line: None)
    run_study(dataclasses.replace(study, seeds=(0, 1)), out, progress=False, log=lambda line: None)  # the grid may grow
    with pytest.raises(ValueError, match=r"holds a study with other settings \(lm_mults\)"):
        run_study(dataclasses.replace(study, lm_mults=("learned=3",)), out, progress=False, log=lambda line: None)


def test_tuned_multipliers_come_from_the_methods_protocol_study(tmp_path, monkeypatch):
    import posenc.lab.experiments.compare as compare

    partial = tmp_path / "methods.json"
    partial.write_text(json.dumps({"meta": {}, "records": []}))
    with pytest.raises(ValueError, match="has not chosen the multiplier of 'sinusoidal' for its 'lm' setting yet"):
        ex.tuned_mults(partial)
    choice = {"sinusoidal": 3.0, "learned": 10.0}
    monkeypatch.setattr(ex, "chosen_mult", lambda records, study, arm, setting: choice.get(arm, 1.0))
    mults = ex.tuned_mults(partial)
    assert mults[:2] == ("sinusoidal=3", "learned=10") and "transformer_xl=1" in mults  # a choice of 1 is listed
    assert not any(m.startswith(("nope=", "rope=", "alibi=")) for m in mults)  # nothing to tune there
    labels = [a.label for a in compare.PROTOCOL_STUDIES["methods"].arms]
    assert "alibi, bias inside the scaling" in labels  # a variant, not a registered method: never listed
    parse = lambda argv: ex.study_from_args(ex.parser(), ex.parser().parse_args(argv))  # noqa: E731
    study = parse(["--preset", "protocol", "--tuned-from", str(partial)])
    assert study.lm_mults == mults and study.passkey_mults == ()
    assert parse(["--preset", "protocol", "--lm-mults"]).lm_mults == ()  # the untuned sensitivity, said explicitly
    for argv in (["--preset", "protocol"], ["--preset", "protocol", "--tuned-from", str(partial), "--lm-mults"]):
        with pytest.raises(SystemExit):
            parse(argv)


# --- durability, provenance, the curve's windows, a live rerun of the first steps -------------------


def lm_study(**kw) -> ExtrapolationStudy:
    return tiny(**{**dict(methods=("learned", "t5"), tasks=("lm",), logn=False, finetune_steps=0), **kw})


def test_a_cell_finished_but_not_stored_is_kept_by_the_rerun_and_not_run_again(tmp_path, monkeypatch):
    """A run killed while a finished cell waits for rank 0 (here: the queue fails as the second cell is
    posted) leaves the cell in a pending file; the rerun stores it first and runs nothing again."""
    study, out = lm_study(), tmp_path / "x.json"
    real_put = ex.distributed.WorkQueue.put

    def put(queue, index, result):
        if index == 1:
            raise KeyboardInterrupt  # killed after the cell finished, before rank 0 stored it
        real_put(queue, index, result)

    monkeypatch.setattr(ex.distributed.WorkQueue, "put", put)
    with pytest.raises(KeyboardInterrupt):
        run_study(study, out, progress=False, log=lambda line: None)
    monkeypatch.setattr(ex.distributed.WorkQueue, "put", real_put)
    stored = {r["cell"] for r in load_records(out)["records"]}
    pending = list(ex.pending_dir(out).glob("*.json"))
    assert len(stored) == 1 and len(pending) == 1
    left = json.loads(pending[0].read_text())["records"]
    ran = []
    monkeypatch.setattr(ex, "run_cell", lambda *a, **kw: ran.append(a) or [])
    data = run_study(study, out, progress=False, log=lambda line: None)
    assert ran == [] and not ex.pending_dir(out).exists()
    assert {r["cell"] for r in data["records"]} == {"learned|0|lm", "t5|0|lm"} and data["meta"]["cells"] == 2
    assert [r for r in data["records"] if r["cell"] == left[0]["cell"]] == left


def test_the_pending_file_of_another_rank_is_stored_by_the_rerun(tmp_path, monkeypatch):
    """What a killed rank 1 leaves: its finished cell in a file of its own beside the study."""
    study, out = lm_study(), tmp_path / "x.json"
    run_study(lm_study(methods=("learned",)), out, progress=False, log=lambda line: None)
    origin = {**ex.provenance("cpu"), "rank": 1}
    records = [ex.stamp(r, origin, "rank 1") for r in run_cell(study, "t5", 0, "lm")]
    path = ex.park(study, out, records)
    assert path.parent == tmp_path / "x.json.pending" and json.loads(path.read_text())["records"] == records
    ran = []
    monkeypatch.setattr(ex, "run_cell", lambda *a, **kw: ran.append(a) or [])
    data = run_study(study, out, progress=False, log=lambda line: None)
    assert ran == [] and not path.exists()
    assert [r for r in data["records"] if r["cell"] == "t5|0|lm"] == records
    kept = ex.park(study, tmp_path / "y.json", records)  # a pending cell of a study with other settings is refused
    with pytest.raises(ValueError, match=r"y\.json\.pending/t5\+0\+lm\.json holds a study with other settings \(lr\)"):
        run_study(dataclasses.replace(study, lr=1e-3), tmp_path / "y.json", progress=False)
    assert kept.exists() and not (tmp_path / "y.json").exists() and ran == []


def test_a_rerun_at_another_commit_or_dirty_flag_is_refused_unless_allowed(tmp_path, monkeypatch):
    study, out = lm_study(methods=("learned",)), tmp_path / "x.json"
    run_study(study, out, progress=False, log=lambda line: None)
    here = load_records(out)["records"][0]
    real = ex.provenance
    monkeypatch.setattr(ex, "provenance", lambda device: {**real(device), "commit": "f" * 40, "dirty": False})
    grown = dataclasses.replace(study, seeds=(0, 1))
    with pytest.raises(ValueError, match=rf"x\.json holds records made at commit {here['commit']} \(dirty="
                                         rf"{here['dirty']}\), and this run is at commit f{{40}} \(dirty=False\).*"
                                         r"--allow-mixed-commits"):
        run_study(grown, out, progress=False, log=lambda line: None)
    assert {r["seed"] for r in load_records(out)["records"]} == {0}  # nothing added
    data = run_study(grown, out, progress=False, log=lambda line: None, allow_mixed=True)
    assert {(r["seed"], r["commit"]) for r in data["records"]} == {(0, here["commit"]), (1, "f" * 40)}
    monkeypatch.setattr(ex, "provenance", lambda device: {**real(device), "commit": here["commit"],
                                                          "dirty": not here["dirty"]})
    with pytest.raises(ValueError, match=rf"dirty={not here['dirty']}"):  # the dirty flag alone differs
        run_study(dataclasses.replace(study, seeds=(0, 1, 2)), out, progress=False, log=lambda line: None)
    # the processes of one run must agree too; the same version passes
    from posenc.lab.experiments.records import check_provenance
    with pytest.raises(ValueError, match=r"the processes of this run, adding to x\.json, are at commit a \(dirty=False\) "
                                         r"and commit b \(dirty=False\)"):
        check_provenance([], [{"commit": "a", "dirty": False}, {"commit": "b", "dirty": False}], "x.json")
    check_provenance([{"commit": "a", "dirty": True}], [{"commit": "a", "dirty": True}] * 2, "x.json")
    calls = []
    monkeypatch.setattr(ex, "run_study", lambda *a, **kw: calls.append(kw) or None)
    ex.main(["--methods", "learned", "--out", str(out), "--quiet", "--allow-mixed-commits"])
    ex.main(["--methods", "learned", "--out", str(out), "--quiet"])
    assert [kw["allow_mixed"] for kw in calls] == [True, False]


def test_the_lm_curve_is_measured_on_every_kth_evaluation_window():
    from posenc.lab.data import eval_windows, load_stdlib_corpus

    val = load_stdlib_corpus().val
    study = lm_study(methods=("learned",), protocol=True, eval_windows=8, curve_windows=4)
    text = ex.curve_text(study, val)
    for n in (80, 160):  # at every length, the windows of the evaluation 0, 2, 4, 6
        assert torch.equal(eval_windows(text, n, 4, span=160)[0], eval_windows(val, n, 8, span=160)[0][::2])
    model = build_model(study, "learned", 0)
    curve = ex._curve_measure(study, "lm")(model)
    for n in (80, 160):
        per_window = ex._evaluate(study, model, "lm", n)[0]["loss_per_window"]
        assert curve[f"val_loss_{n}"] == pytest.approx(sum(per_window[::2]) / 4, abs=2e-5)
    preset = ex.PRESETS["protocol"]  # every one of its 32 curve windows is one of its 256 evaluation windows
    span = preset.eval_lengths[-1]
    windows = {tuple(w) for w in eval_windows(val, span, preset.eval_windows, span=span)[0].tolist()}
    curve_windows = ex.curve_text(preset, val).reshape(preset.curve_windows, span + 1)[:, :-1].tolist()
    assert len(curve_windows) == 32 and all(tuple(w) in windows for w in curve_windows)
    with pytest.raises(ValueError, match=r"ExtrapolationStudy\.curve_windows must be <= eval_windows=2 under the "
                                         r"protocol .*got 3"):
        tiny(protocol=True, curve_windows=3)
    assert tiny(curve_windows=3).curve_windows == 3  # outside the protocol there is no curve


def test_stop_after_reruns_the_first_steps_of_a_stored_cell():
    from posenc.lab.experiments.records import check_rerun

    study = lm_study(methods=("rope",), protocol=True, curve_points=2, lm_steps=20, warmup_steps=2,
                     finetune_steps=2, scalings=("linear",))
    full = run_cell(study, "rope", 0, "lm")
    (part,), model = run_cell(study, "rope", 0, "lm", stop_after=10, return_model=True)
    assert isinstance(model, TinyLM) and part["stopped_after"] == 10 and part["steps"] == 20
    assert part["train_loss_every_10"] == full[0]["train_loss_every_10"][:1]
    assert part["curve"] == full[0]["curve"][:1] and part["curve"][0]["step"] == 10
    check_rerun(part, full[0], part["curve"][0]["val_loss_80"], full[0]["curve"][0]["val_loss_80"], early_steps=10)
    for bad in (0, 21, 2.0, True):
        with pytest.raises(ValueError, match=rf"stop_after must be None or an int in 1\.\.20 \(the study's lm steps\), "
                                             rf"got {re_repr(bad)}"):
            run_cell(study, "rope", 0, "lm", stop_after=bad)
