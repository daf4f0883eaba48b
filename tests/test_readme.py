"""Every example of README.md and of the documentation pages (docs/*.md)
runs against the test broker: each ```python block, and each ```sh block
of ``pystream`` commands (the install and maintenance commands, such as
``make test``, are what CI itself runs).

An example followed by a ```text title="Output" block must print exactly
that; ``...`` in it stands for any text (what differs between runs: times,
versions, ids). A Python example that prints must show its output so."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

import pystream

from . import brokers
from .conftest import MODERN_URI, ROOT

DEFAULT_URI = brokers.MODERN.uri()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
FENCE = re.compile(r"^```(?P<info>[^`\n]*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
OUTPUT = 'text title="Output"'


@dataclass(frozen=True)
class Example:
    page: str          # relative to the repository
    line: int
    lang: str          # "python" or "sh"
    code: str
    output: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def examples() -> list[Example]:
    found = []
    for path in PAGES:
        text = path.read_text()
        blocks = list(FENCE.finditer(text))
        for i, m in enumerate(blocks):
            lang = m["info"].strip()
            if lang != "python" and not (lang == "sh" and m["body"].startswith("pystream ")):
                continue
            output = None
            if (i + 1 < len(blocks) and blocks[i + 1]["info"].strip() == OUTPUT
                    and not text[m.end():blocks[i + 1].start()].strip()):
                output = blocks[i + 1]["body"]
            found.append(Example(str(path.relative_to(ROOT)),
                                 text.count("\n", 0, m.start()) + 1, lang,
                                 m["body"], output))
    return found


EXAMPLES = examples()
PYTHON = [e for e in EXAMPLES if e.lang == "python"]
COMMANDS = [e for e in EXAMPLES if e.lang == "sh"]


def matches(expected: str, printed: str) -> bool:
    """``printed`` is ``expected``, ``...`` standing for any text; trailing
    blanks of each line do not count."""
    def tidy(s: str) -> str:
        return "\n".join(line.rstrip() for line in s.strip("\n").split("\n"))
    pattern = ".*?".join(re.escape(part) for part in tidy(expected).split("..."))
    return re.fullmatch(pattern, tidy(printed), re.S) is not None


def check_output(example: Example, printed: str) -> None:
    if example.output is not None:
        assert matches(example.output, printed), (
            f"{example.id} printed\n{printed}\ninstead of its Output block\n{example.output}")


def test_pages_have_examples():
    assert {e.page for e in PYTHON} >= {"README.md", "docs/consuming.md",
                                         "docs/producing.md", "docs/spark.md"}
    assert COMMANDS


def test_every_printing_example_shows_its_output():
    silent = [e.id for e in PYTHON if re.search(r"\bprint\(|\.show\(", e.code)
              and e.output is None]
    assert not silent, f"examples that print without an Output block: {silent}"


def test_output_blocks_follow_an_example():
    """An Output block belongs to the example just before it."""
    shown = sum(e.output is not None for e in EXAMPLES)
    blocks = sum(len(re.findall(rf"^```{re.escape(OUTPUT)}$", p.read_text(), re.M))
                 for p in PAGES)
    assert shown == blocks


def test_matches():
    assert matches("a ... c\n", "a b b c")
    assert matches("4.0.5", "4.0.5  \n")
    assert not matches("3", "30")


def fresh_streams(code: str) -> None:
    """Delete the streams an example creates: an example that failed before
    deleting them (or a run killed midway) must not change the counts the
    next run prints."""
    names = re.findall(r"""create_stream\(\s*["']([^"']+)["']""", code)
    if names:
        with pystream.connect(MODERN_URI) as client:
            for name in names:
                client.delete_stream(name, missing_ok=True)


@pytest.mark.broker
@pytest.mark.parametrize("example", [  # the Spark pages' examples start Spark
    pytest.param(e, id=e.id, marks=[pytest.mark.spark] if "pyspark" in e.code else [])
    for e in PYTHON])
def test_python_example(example, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples read the repository's test data
    code = example.code.replace(DEFAULT_URI, MODERN_URI)
    fresh_streams(code)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"{example.id} example", "exec"), {})
    check_output(example, printed.getvalue())


@pytest.mark.broker
@pytest.mark.parametrize("example", COMMANDS, ids=lambda e: e.id)
def test_commands(example, tmp_path):
    bin_dir = pathlib.Path(sys.executable).parent  # the venv's pystream script
    env = {**os.environ, "PYSTREAM_URI": MODERN_URI,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", example.code],
                            cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    check_output(example, result.stdout)


def test_readme_links_reach_the_pages():
    """README.md is read outside the site (on a forge, in an editor): its
    links name files of the repository, which must exist (mkdocs --strict
    checks the pages' own links)."""
    text = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)]+)\)", text)
               if "://" not in t and not t.startswith("#")]
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing
