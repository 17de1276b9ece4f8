"""The chapters as the HTML reader gets them: the set-up cell is removed, and every cell hidden
behind a toggle says, in one line, what it checks (the browser test sees the result in the HTML)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def code_cells(chapter: Path) -> list[dict]:
    return [c for c in json.loads(chapter.read_text())["cells"] if c["cell_type"] == "code"]


def tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_the_set_up_cell_is_removed_from_the_html(chapter):
    first = code_cells(chapter)[0]
    assert "import posenc" in "".join(first["source"])
    assert "remove-cell" in tags(first)
    for cell in code_cells(chapter)[1:]:
        assert "sys.path" not in "".join(cell["source"]) or "remove-cell" in tags(cell)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_collapsed_cells_say_what_they_check(chapter):
    for cell in code_cells(chapter):
        if "hide-input" in tags(cell):
            prompt = cell["metadata"].get("mystnb", {}).get("code_prompt_show", "")
            assert prompt.startswith("Check: ") and "\n" not in prompt and len(prompt) <= 100, (cell.get("id"), prompt)
            assert "assert" in "".join(cell["source"]), f"{chapter.name} {cell.get('id')}: a collapsed check with no assert"


SOURCE_BOX = re.compile(r"^:::\{admonition\} Source claim: (?P<title>[^\n]+)\n:class: source-claim\n(?P<body>.*?)\n:::", re.S | re.M)


def ledger() -> dict[str, dict]:
    return {entry["id"]: entry for entry in yaml.safe_load((ROOT / "book" / "claims.yml").read_text())}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_source_claim_boxes_name_a_ledger_entry_and_its_verdict(chapter):
    """The source material's claims appear in one box style, each naming its ledger entry; the
    box's verdict is the ledger's (so the chapter and the ledger cannot disagree)."""
    entries = ledger()
    markdown = "\n\n".join("".join(c["source"]) for c in json.loads(chapter.read_text())["cells"]
                           if c["cell_type"] == "markdown")
    for box in SOURCE_BOX.finditer(markdown):
        body = box["body"]
        ids = re.findall(r"`(ch\d\d-[a-z0-9-]+)`", body)
        assert ids, f"{chapter.name}: source box {box['title']!r} names no ledger id"
        verdicts = re.findall(r"\*\*Verdict: (holds|false|conditional|not supported|inconclusive)\.\*\*", body)
        assert len(verdicts) == 1, f"{chapter.name}: source box {box['title']!r} needs one '**Verdict: ….**'"
        for claim_id in ids:
            assert claim_id in entries, f"{chapter.name}: {claim_id} is not in book/claims.yml"
        assert entries[ids[0]]["verdict"] == verdicts[0], (chapter.name, ids[0], verdicts[0])
    # any other admonition that mentions the sources is not in the box style
    for block in re.findall(r":::\{admonition\}[^\n]*\n(?!:class: source-claim)", markdown):
        assert "Source claim" not in block, f"{chapter.name}: a 'Source claim' box without :class: source-claim"
