"""docs/guarantees.md names, for every promise the pages make, the tests
that attack it: each promise must name at least one (but those listed under
"Promises without a test yet"), and each test named must exist. Test node
ids are found by reading the test files' syntax trees, without running
pytest; a parametrised test is named without its parameters."""

from __future__ import annotations

import ast
import pathlib
import re
from dataclasses import dataclass, field

from .conftest import ROOT

PAGE = ROOT / "docs" / "guarantees.md"
UNTESTED = "Promises without a test yet"
HEADING = re.compile(r"^### (?P<title>.+?)\s*(?:\{#(?P<anchor>[^}]*)\})?\s*$")
ANCHOR = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
NODE_ID = re.compile(r"tests/[\w/]+\.py::(?:\w+::)?\w+")
NONE_YET = "none yet"


@dataclass
class Promise:
    title: str
    anchor: str | None
    section: str
    line: int
    tests: list[str] = field(default_factory=list)
    tests_lines: int = 0  # how many "Tests:" lines it has: one is right
    none_yet: bool = False


def parse(text: str) -> list[Promise]:
    """The promises of the page: each ``###`` heading with its ``Tests:``
    line, and the ``##`` section it is in."""
    promises: list[Promise] = []
    section = ""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("## "):
            section = line[3:].strip()
        elif heading := HEADING.match(line):
            promises.append(Promise(heading["title"], heading["anchor"], section, number))
        elif line.startswith("Tests:") and promises:
            promise = promises[-1]
            promise.tests_lines += 1
            value = line[len("Tests:"):].strip()
            if value == NONE_YET:
                promise.none_yet = True
            else:
                promise.tests += [name.strip().strip("`").strip()
                                  for name in value.split(",") if name.strip()]
    return promises


def node_ids(root: pathlib.Path = ROOT) -> set[str]:
    """``tests/test_x.py::test_name`` (and ``::TestClass::test_name``) of
    every test function in the test files."""
    ids = set()
    for path in sorted((root / "tests").rglob("test_*.py")):
        module = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    and node.name.startswith("test")):
                ids.add(f"{module}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids.update(f"{module}::{node.name}::{item.name}" for item in node.body
                           if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                           and item.name.startswith("test"))
    return ids


def problems(promises: list[Promise], known: set[str]) -> list[str]:
    """What is wrong with the page, one line each (empty: nothing)."""
    found: list[str] = []
    anchors: dict[str, int] = {}
    for p in promises:
        where = f"line {p.line} ({p.title!r})"
        if p.anchor is None or not ANCHOR.fullmatch(p.anchor):
            found.append(f"{where}: the heading needs an anchor {{#topic-what}} "
                         f"(lower case, digits, dashes), not {p.anchor!r}")
        elif p.anchor in anchors:
            found.append(f"{where}: anchor #{p.anchor} is already line {anchors[p.anchor]}'s")
        else:
            anchors[p.anchor] = p.line
        if p.tests_lines != 1:
            found.append(f"{where}: {p.tests_lines} 'Tests:' lines, one expected")
            continue
        untested = p.section == UNTESTED
        if p.none_yet and not untested:
            found.append(f"{where}: names no test; list it under {UNTESTED!r} "
                         "or name the tests that attack it")
        if not p.none_yet and not p.tests:
            found.append(f"{where}: 'Tests:' names nothing (write 'Tests: none yet' "
                         f"under {UNTESTED!r})")
        for name in p.tests:
            bare = re.sub(r"\[.*\]$", "", name)  # parameters: the function counts
            if not NODE_ID.fullmatch(bare):
                found.append(f"{where}: {name!r} is not a node id "
                             "(tests/test_x.py::test_name)")
            elif bare not in known:
                found.append(f"{where}: {name} does not exist")
    return found


def test_every_promise_names_tests_that_exist():
    promises = parse(PAGE.read_text())
    assert len(promises) >= 30
    found = problems(promises, node_ids())
    assert not found, "\n".join(found)


def test_promises_without_a_test_are_listed_last():
    promises = parse(PAGE.read_text())
    sections = [p.section for p in promises]
    if UNTESTED not in sections:
        return  # every promise names its tests
    assert sections[sections.index(UNTESTED):] == [UNTESTED] * sections.count(UNTESTED)


def test_the_page_is_in_the_site():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = re.search(r"^nav:\n((?:[ #].*\n|\n)*)", config, re.M)
    assert nav and re.search(r":\s*guarantees\.md$", nav[1], re.M)


def test_the_checks_catch_what_they_must():
    """The checks themselves, on a page with one of each mistake."""
    page = """\
## Delivery

### Fine {#delivery-fine}

Tests: `tests/test_a.py::test_one`, tests/test_a.py::TestB::test_two[x-1]

### No tests {#delivery-none}

Tests: none yet

### Missing test {#delivery-missing}

Tests: `tests/test_a.py::test_gone`

### No anchor

Tests: `tests/test_a.py::test_one`

### Twice {#delivery-fine}

Tests: `tests/test_a.py::test_one`

### No line {#delivery-no-line}

```text
Tests: `tests/test_a.py::test_one` (in a code block: not a Tests line)
```

### Not an id {#delivery-not-an-id}

Tests: test_one

## Promises without a test yet

### Untested {#delivery-untested}

Tests: none yet
"""
    known = {"tests/test_a.py::test_one", "tests/test_a.py::TestB::test_two"}
    found = problems(parse(page), known)
    assert len(found) == 6, found
    for words in ("'No tests'", "test_gone does not exist", "'No anchor'",
                  "anchor #delivery-fine is already", "0 'Tests:' lines",
                  "'test_one' is not a node id"):
        assert any(words in line for line in found), (words, found)


def test_node_ids_come_from_the_syntax_tree(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_a(): pass\n"
        "async def test_b(): pass\n"
        "def helper(): pass\n"
        "class TestC:\n"
        "    def test_d(self): pass\n"
        "    def helper(self): pass\n")
    (tmp_path / "tests" / "helpers.py").write_text("def test_e(): pass\n")
    assert node_ids(tmp_path) == {"tests/test_x.py::test_a", "tests/test_x.py::test_b",
                                  "tests/test_x.py::TestC::test_d"}
