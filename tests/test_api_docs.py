"""The API reference (book/api/) covers the package: one page per module, found by walking the
source tree, each in the table of contents; the front page lists every module and every top-level
name; the README's module table names every top-level module; every piece of code a chapter shows
by inclusion links to its API entry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import posenc

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "code" / "posenc"
API = ROOT / "book" / "api"
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def modules() -> list[str]:
    names = []
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def toc_files() -> list[str]:
    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                yield node["file"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    return list(walk(yaml.safe_load((ROOT / "_toc.yml").read_text())))


def autosummary_entries(text: str) -> list[list[str]]:
    """The entries of each ``.. autosummary::`` block of a page."""
    blocks = re.findall(r"\.\. autosummary::\n\n((?:   \S+\n)+)", text)
    return [block.split() for block in blocks]


@pytest.mark.parametrize("module", modules())
def test_every_module_has_a_page_in_the_table_of_contents(module):
    page = API / f"{module}.md"
    assert page.is_file(), f"no API page {page.relative_to(ROOT)} for {module}"
    assert f".. automodule:: {module}\n" in page.read_text()
    assert f"book/api/{module}" in toc_files()


def test_the_front_page_lists_every_module_and_every_top_level_name():
    text = (API / "posenc.md").read_text()
    names, mods = autosummary_entries(text)
    assert sorted("posenc." + m for m in mods) == sorted(m for m in modules() if m != "posenc")
    exported = set()
    for name in posenc.__all__:
        obj = getattr(posenc, name)
        module = getattr(obj, "__module__", None)
        if module is None or not isinstance(obj, type) and not callable(obj):
            assert f"{{py:data}}`posenc.method.{name}`" in text, name  # METHODS: a dict, named in the prose
            continue
        exported.add(f"{module.removeprefix('posenc.')}.{name}")
    assert exported == set(names)


def test_readme_module_table_names_every_top_level_module():
    readme = (ROOT / "README.md").read_text()
    table = set(re.findall(r"^\| `(posenc\.\w+)` \|", readme, flags=re.M))
    top_level = {m for m in modules() if m.count(".") == 1}
    assert table == top_level


def literalincludes():
    """(chapter, pyobject path, options) of every ``literalinclude`` of a function or class."""
    pattern = re.compile(r"```\{literalinclude\} \.\./code/(posenc/[\w/]+)\.py\n((?::[\w-]+:[^\n]*\n)*)```")
    for chapter in CHAPTERS:
        for cell in json.loads(chapter.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                for match in pattern.finditer("".join(cell["source"])):
                    yield chapter.name, match.group(1).replace("/", "."), match.group(2)


@pytest.mark.parametrize("chapter, module, options", list(literalincludes()))
def test_code_shown_by_inclusion_links_to_its_api_entry(chapter, module, options):
    obj = re.search(r":pyobject: (\S+)", options).group(1)
    caption = re.search(r":caption: (.*)", options)
    assert caption, f"{chapter}: the inclusion of {module}.{obj} has no caption linking to the API"
    assert re.search(rf"\{{py:(func|class|meth)\}}`{re.escape(module)}\.{re.escape(obj)}`", caption.group(1)), caption.group(1)


def attribute_comment_first_lines() -> list[tuple[str, int, str]]:
    """The first line of the ``#:`` comment of every public attribute in the package (file, line
    number, text); a private name gets no API entry."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            stripped = line.strip()
            previous = lines[number - 2].strip() if number > 1 else ""
            if not stripped.startswith("#:") or previous.startswith("#:"):
                continue
            following = number
            while following < len(lines) and lines[following].strip().startswith("#:"):
                following += 1
            name = lines[following].strip() if following < len(lines) else ""
            if not name.startswith("_"):
                found.append((str(path.relative_to(ROOT)), number, stripped[2:].strip()))
    return found


def test_attribute_comments_do_not_open_with_a_type():
    """Napoleon reads ``words: more`` on the first line of an attribute's ``#:`` comment as the type
    ``words`` (rendered as "Type: words", and reported by the strict build (``-n``) as a missing
    reference when it is plain text), so the first line has no colon outside roles and literals."""
    roles_and_literals = re.compile(r":\w+:`[^`]*`|``[^`]*``|`[^`]*`")
    bad = []
    for file, number, text in attribute_comment_first_lines():
        plain = roles_and_literals.sub("", text)
        if re.search(r"(?<!:):(?!:)", plain):
            bad.append(f"{file}:{number}: {text}")
    assert not bad, "attribute comments with a colon on their first line:\n" + "\n".join(bad)
