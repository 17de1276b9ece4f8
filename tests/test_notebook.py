"""Tests of posenc.notebook: glue with and without MyST-NB, the claims table, and time_ms."""

import builtins
from pathlib import Path

import pytest
import yaml

from posenc.notebook import claims_table, glue, time_ms

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
    entries = yaml.safe_load(LEDGER.read_text())
    table = claims_table(str(LEDGER), prefix="ch01-").data
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == sum(e["id"].startswith("ch01-") for e in entries)
    assert all(row.count(" | ") == 5 for row in rows)
    for entry in entries:
        if entry["id"].startswith("ch01-"):
            assert f"| {entry['id']} |" in table and f"**{entry['verdict']}**" in table


def test_claims_table_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no claims ledger at"):
        claims_table(str(tmp_path / "missing.yml"))
    with pytest.raises(ValueError, match="no claim id starts with prefix='zz-'"):
        claims_table(str(LEDGER), prefix="zz-")


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
