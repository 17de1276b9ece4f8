"""The chapters as the HTML reader gets them: the set-up cell is removed, and every cell hidden
behind a toggle says, in one line, what it checks (the browser test sees the result in the HTML)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
