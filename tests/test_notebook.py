"""Tests of posenc.lab.notebook: glue with and without MyST-NB, the claims table, and time_ms."""

import builtins
import math
from pathlib import Path

import pytest
import yaml

from posenc.lab.notebook import claims_table, glue, time_ms

LEDGER = Path(__file__).resolve().parents[1] / "book" / "claims.yml"


@pytest.mark.filterwarnings("ignore:Attempting to work in a virtualenv")  # IPython, outside a kernel
def test_glue_returns_nothing_and_validates_name():
    assert glue("a-number", 3.5) is None
    with pytest.raises(ValueError, match="name must be a non-empty string without whitespace, got 'a b'"):
        glue("a b", 1)
    with pytest.raises(ValueError, match="got ''"):
        glue("", 1)


def test_glue_without_myst_nb_displays_the_value(monkeypatch):
    shown = []
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "myst_nb":
            raise ImportError("no myst_nb")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.setattr("IPython.display.display", lambda value: shown.append(value))
    glue("x", 42)
    glue("s", "2.50 nats")
    assert shown[0] == 42 and repr(shown[1]) == "2.50 nats"  # strings display without quotes


def test_glue_closes_matplotlib_figures():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    glue("fig-test", fig)
    assert not plt.fignum_exists(fig.number)


def test_claims_table_renders_every_matching_entry():
    entries = [e for e in yaml.safe_load(LEDGER.read_text()) if e["id"].startswith("ch01-")]
    for full in (False, True):
        table = claims_table(str(LEDGER), prefix="ch01-", full=full).data
        rows = table.splitlines()[2:]
        assert len(rows) == len(entries)
        assert all(row.count(" | ") == 3 for row in rows)
        for entry, row in zip(entries, rows):
            assert f"`{entry['id']}`)" in row and f"**{entry['verdict']}**" in row
            why = entry["note"] if full else entry["reason"]
            assert " ".join(why.split()).replace("|", "\\|") in row
            assert ".ipynb#" not in row, "evidence is shown as a section link, never as a cell tag"
            links = row.rsplit(" | ", 1)[1].rstrip(" |").split("; ")
            assert len(links) == len(set(links)), f"{entry['id']}: a link repeated"


def test_claims_table_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no claims ledger at"):
        claims_table(str(tmp_path / "missing.yml"))
    with pytest.raises(ValueError, match="no claim id starts with prefix='zz-'"):
        claims_table(str(LEDGER), prefix="zz-")


def test_evidence_anchor_links_the_section_and_names_the_check(tmp_path):
    import json

    from posenc.lab.notebook import evidence_anchor

    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["(sec-one)=\n", "## One"]},
        {"cell_type": "code", "metadata": {"tags": ["plain"]}, "source": ["assert 1"]},
        {"cell_type": "markdown", "metadata": {}, "source": ["(sec-two)=\n## Two"]},
        {"cell_type": "code", "metadata": {"tags": ["hidden"], "mystnb": {"code_prompt_show": "Check: a | b"}}, "source": []},
    ]
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "03_x.ipynb").write_text(json.dumps({"cells": cells}))
    assert evidence_anchor("book/03_x.ipynb#plain", tmp_path) == "ch. 3, {ref}`sec-one`"
    assert evidence_anchor("book/03_x.ipynb#hidden", tmp_path) == "ch. 3, {ref}`sec-two` (“Check: a \\| b”)"
    assert evidence_anchor("tests/test_rope.py::test_x[cpu]", tmp_path) == "test `test_rope.py::test_x[cpu]`"
    for ref, match in [
        ("book/03_x.ipynb#nope", "no cell of 03_x.ipynb is tagged 'nope'"),
        ("book/04_y.ipynb#plain", "no notebook"),
        ("book/03_x.ipynb", "ref must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            evidence_anchor(ref, tmp_path)
    (tmp_path / "book" / "05_z.ipynb").write_text(json.dumps({"cells": cells[1:2]}))
    with pytest.raises(ValueError, match="no section label"):
        evidence_anchor("book/05_z.ipynb#plain", tmp_path)


def test_range_text_reads_as_the_prose_needs():
    import torch

    from posenc.lab.notebook import range_text

    assert range_text([1.234, 1.5, 1.31]) == "1.23–1.50"
    assert range_text([1.501, 1.499]) == "1.50"  # equal once printed: one number
    assert range_text([1500, 250], ",") == "250–1,500"
    assert range_text(torch.tensor([[0.25], [0.5]]), ".0%") == "25%–50%"
    with pytest.raises(ValueError, match="values must not be empty"):
        range_text([])


def test_time_ms_runs_warmup_plus_repeats_and_returns_the_median():
    calls = []
    ms = time_ms(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and isinstance(ms, float) and ms >= 0
    import time

    assert 15 <= time_ms(lambda: time.sleep(0.02), repeats=3, warmup=0) < 1000
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        time_ms(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0, got -1"):
        time_ms(lambda: None, warmup=-1)


def _summary(values):
    from posenc.lab.experiments.compare import summarize
    return summarize([{"arm": arm, "setting": "lm", "val_loss": v} for arm, vs in values.items() for v in vs],
                     "val_loss", "lm")


def test_separated_only_when_no_seed_overlaps():
    from posenc.lab.notebook import separated
    s = _summary({"a": [1.0, 1.1, 1.2], "b": [1.3, 1.4, 1.5], "c": [1.15, 1.6, 1.7]})
    assert separated(s["a"], s["b"]) and separated(s["b"], s["a"])
    assert not separated(s["a"], s["c"]) and not separated(s["b"], s["c"])


def test_study_table_and_plot_seeds():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from posenc.lab.notebook import plot_seeds, study_table
    s = _summary({"a": [1.0, 2.0, 3.0], "b": [4.0, 4.0, 4.0]})
    table = study_table({"loss": s}, ["b", "a", "missing"], digits={"loss": 1}, extra={"x": {"a": "7"}}).data
    assert "| b | 4.0 ± 0.0 [4.0, 4.0] | – |" in table and "| a | 2.0 ± 1.0 [1.0, 3.0] | 7 |" in table and "| missing | – | – |" in table
    fig, ax = plt.subplots()
    plot_seeds(ax, s, ["a", "b"], live={"b": 4.1})
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert len(ax.collections) == 3  # two arms' dots and one live diamond
    plt.close(fig)


def test_stored_study_reads_the_file_or_says_how_to_make_it(tmp_path):
    import json
    from posenc.lab.notebook import stored_study
    (tmp_path / "book" / "results").mkdir(parents=True)
    (tmp_path / "book" / "results" / "x.json").write_text(json.dumps({"meta": {}, "records": []}))
    assert stored_study("x", root=str(tmp_path)) == {"meta": {}, "records": []}
    with pytest.raises(FileNotFoundError, match="python -m posenc.lab.experiments.compare y"):
        stored_study("y", root=str(tmp_path))


def test_protocol_summary_table_and_separation():
    from posenc.lab.experiments.compare import Arm, Study
    from posenc.lab.notebook import interval_text, protocol_separated, protocol_summary, protocol_table

    study = Study("t", (Arm("a", "nope"), Arm("b", "learned")), seeds=(0, 1, 2), protocol=True, tuning_seed=9,
                  grid=(1.0, 10.0))
    recs = [{"arm": "a", "setting": "lm", "seed": s, "mult": 1.0, "val_loss": 2.0 + 0.01 * s,
             "loss_per_window": [2.0 + 0.01 * s + d for d in (-0.1, 0.1)]} for s in (0, 1, 2)]
    recs += [{"arm": "b", "setting": "lm", "seed": s, "mult": m, "val_loss": v + 0.01 * s,
              "loss_per_window": [v, v]} for s in (0, 1, 2) for m, v in ((1.0, 1.9), (10.0, 1.5))]
    recs += [{"arm": "b", "setting": "lm", "seed": 9, "mult": m, "val_loss": v, "tune_val_loss": v}
             for m, v in ((1.0, 1.9), (10.0, 1.5), (100.0, 1.7))]  # 10 is at the grid's end: one step beyond tried
    tuned = protocol_summary(recs, study, "val_loss", "lm")
    untuned = protocol_summary(recs, study, "val_loss", "lm", role="untuned")
    assert tuned["b"]["mult"] == 10.0 and untuned["b"]["mult"] == 1.0
    assert tuned["b"]["values"] == [1.5, 1.51, 1.52] and tuned["b"]["seeds"] == [0, 1, 2] and tuned["a"]["n"] == 3
    assert tuned["a"]["low"] < tuned["a"]["mean"] < tuned["a"]["high"] and tuned["a"]["eval"] > 0
    assert protocol_separated(tuned["a"], tuned["b"])
    text = protocol_table({"loss": tuned}, ["a", "b"]).data
    assert "| a | 2.010 [" in text and "] ± " in text
    a = tuned["a"]
    assert interval_text(a) == f"2.010 [{a['low']:.3f}, {a['high']:.3f}]" and interval_text(a, 1).startswith("2.0 [")
    assert interval_text(a) in text                                  # the table writes the same text
    # a fraction's interval stays in [0, 1]; its values, which the tests of separation use, are untouched
    frac = [{"arm": "a", "setting": "copy", "seed": s, "mult": 1.0, "token_accuracy": v} for s, v in enumerate((0.2, 0.6, 0.99))]
    wide = protocol_summary(frac, study, "token_accuracy", "copy")["a"]
    assert (wide["low"], wide["high"]) == (0.0, 1.0) and wide["values"] == [0.2, 0.6, 0.99]
    assert math.isclose(wide["mean"], 0.5966666, rel_tol=1e-6)


def test_plot_intervals_and_curves_draw_every_arm():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.lab.experiments.compare import Arm, Study
    from posenc.lab.notebook import plot_curves, plot_intervals, protocol_summary

    study = Study("t", (Arm("a", "nope"), Arm("b", "learned")), seeds=(0, 1, 2), protocol=True, tuning_seed=9,
                  grid=(1.0, 10.0))
    curve = lambda v: [{"step": 5, "val_loss": v + 1}, {"step": 10, "val_loss": v}]  # noqa: E731
    recs = [{"arm": "a", "setting": "lm", "seed": s, "mult": 1.0, "val_loss": 2.0 + 0.01 * s, "curve": curve(2.0)}
            for s in (0, 1, 2)]
    recs += [{"arm": "b", "setting": "lm", "seed": s, "mult": m, "val_loss": v + 0.01 * s, "tune_val_loss": v,
              "curve": curve(v)} for s in (0, 1, 2, 9) for m, v in ((1.0, 1.9), (10.0, 1.5))]
    recs += [{"arm": "b", "setting": "lm", "seed": 9, "mult": 100.0, "val_loss": 1.7, "tune_val_loss": 1.7, "curve": curve(1.7)}]
    fig, (ax1, ax2) = plt.subplots(1, 2)
    tuned = protocol_summary(recs, study, "val_loss", "lm")
    plot_intervals(ax1, tuned, ["a", "b"], untuned=protocol_summary(recs, study, "val_loss", "lm", role="untuned"),
                   live={"b": 1.5})
    plot_curves(ax2, recs, study, "lm", "val_loss", ["a", "b"])
    labels = ax1.get_legend_handles_labels()[1]
    assert "untuned (multiplier 1), mean" in labels and "live run (this notebook)" in labels
    assert [line.get_label() for line in ax2.get_lines()] == ["a", "b"]
    assert list(ax2.get_lines()[1].get_ydata()) == [2.5, 1.5]
    plt.close(fig)


def test_protocol_summary_reads_nested_and_derived_metrics():
    from posenc.lab.experiments.compare import Arm, Study
    from posenc.lab.notebook import protocol_summary

    study = Study("t", (Arm("a", "nope"),), seeds=(0, 1, 2), protocol=True, tuning_seed=9, grid=(1.0,))
    recs = [{"arm": "a", "setting": "lm", "seed": s, "mult": 1.0, "control": {"seen": 1.0 + s, "long": 3.0 + 2 * s},
             "per_window": {"seen": [1.0 + s, 1.2 + s], "long": [3.0 + 2 * s, 3.5 + 2 * s]},
             "trained_rows": {"eff99": 10 + s}} for s in (2, 0, 1)]
    long = protocol_summary(recs, study, "control.long", "lm")["a"]
    assert long["values"] == [3.0, 5.0, 7.0] and long["seeds"] == [0, 1, 2]   # seed order
    assert long["eval"] > 0                                                # from per_window.long by default
    rank = protocol_summary(recs, study, "trained_rows.eff99", "lm")["a"]
    assert rank["values"] == [10.0, 11.0, 12.0] and rank["eval"] is None
    gap = protocol_summary(recs, study, lambda r: r["control"]["long"] - r["control"]["seen"], "lm",
                           items=lambda r: [x - y for x, y in zip(r["per_window"]["long"], r["per_window"]["seen"])])["a"]
    assert gap["values"] == [2.0, 3.0, 4.0] and gap["eval"] > 0
    assert protocol_summary(recs, study, "control.missing", "lm") == {}       # no record holds it: no arm
    with pytest.raises(TypeError, match="metric must be a dotted key"):
        protocol_summary(recs, study, 3, "lm")
    with pytest.raises(TypeError, match="items must be a dotted key"):
        protocol_summary(recs, study, "control.long", "lm", items=3)
