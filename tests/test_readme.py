"""The README's Python examples run as written: every ```python block, top to bottom, in one fresh
interpreter started outside the repository, so the README cannot drift from the API."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    """The bodies of the fenced ```python blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_readme_has_python_examples():
    assert len(python_blocks(README.read_text(encoding="utf-8"))) >= 4


def test_python_blocks_are_found_exactly():
    text = "intro\n```python\na = 1\n```\n```bash\nnot python\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == ["a = 1\n", "b = a\n"]


def test_readme_python_blocks_run_top_to_bottom_in_a_fresh_interpreter(tmp_path):
    script = "\n".join(python_blocks(README.read_text(encoding="utf-8")))
    (tmp_path / "readme_examples.py").write_text(script, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "readme_examples.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"README examples failed:\n{result.stderr[-3000:]}"
