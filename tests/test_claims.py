"""The claims ledger (book/claims.yml): well-formed, and every evidence reference exists and checks something."""

import ast
import json
from pathlib import Path

import pytest
import yaml

from posenc.lab.notebook import evidence_anchor

ROOT = Path(__file__).resolve().parents[1]
LEDGER = yaml.safe_load((ROOT / "book" / "claims.yml").read_text())
FIELDS = {"id", "source", "claim", "verdict", "reason", "evidence", "note"}
VERDICTS = ("holds", "false", "conditional", "not supported", "inconclusive")
SOURCES = ("000", "001", "002", "003", "004")


def evidence_list(entry):
    ev = entry["evidence"]
    return [ev] if isinstance(ev, str) else list(ev)


def test_ledger_is_well_formed():
    assert isinstance(LEDGER, list) and LEDGER
    ids = [e["id"] for e in LEDGER]
    assert len(ids) == len(set(ids)), "duplicate claim ids"
    for entry in LEDGER:
        assert set(entry) == FIELDS, f"{entry.get('id')}: fields {sorted(entry)}"
        assert entry["verdict"] in VERDICTS, f"{entry['id']}: verdict {entry['verdict']!r} not one of {VERDICTS}"
        assert entry["source"].split()[0] in SOURCES, f"{entry['id']}: source {entry['source']!r}"
        assert "§" in entry["source"], f"{entry['id']}: source needs a section"
        assert entry["claim"].strip() and entry["note"].strip() and evidence_list(entry)
        reason = entry["reason"]
        assert "\n" not in reason.strip() and 0 < len(reason.split()) <= 25, f"{entry['id']}: the reason is one line of at most 25 words"


def check_pytest_node(ref):
    path, _, name = ref.partition("::")
    file = ROOT / path
    assert file.is_file(), f"evidence {ref}: no file {path}"
    parts = name.split("[")[0].split("::")
    tree = ast.parse(file.read_text())
    scope = tree.body
    node = None
    for part in parts:
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        assert node is not None, f"evidence {ref}: {part} not defined in {path}"
        scope = node.body
    source = ast.unparse(node)
    assert "assert" in source or "raises" in source, f"evidence {ref}: the test asserts nothing"


def check_notebook_tag(ref):
    path, _, tag = ref.partition("#")
    file = ROOT / path
    assert file.is_file(), f"evidence {ref}: no notebook {path}"
    cells = [c for c in json.loads(file.read_text())["cells"] if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"evidence {ref}: {len(cells)} cells carry tag {tag!r} (need exactly 1)"
    assert cells[0]["cell_type"] == "code" and "assert" in "".join(cells[0]["source"]), (
        f"evidence {ref}: the tagged cell has no assert"
    )
    evidence_anchor(ref, ROOT)  # the reader's link: the cell sits under a labelled section


@pytest.mark.parametrize("entry", LEDGER, ids=[e["id"] for e in LEDGER])
def test_evidence_exists_and_checks_something(entry):
    for ref in evidence_list(entry):
        if "::" in ref:
            check_pytest_node(ref)
        elif ".ipynb#" in ref:
            check_notebook_tag(ref)
        else:
            pytest.fail(f"{entry['id']}: evidence {ref!r} is neither 'tests/x.py::test' nor 'book/x.ipynb#tag'")
