"""Every ```python block of README.md runs, against the test broker."""

from __future__ import annotations

import re

import pytest

from .conftest import MODERN_URI, ROOT

DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"
BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(),
                    re.S | re.M)


def test_readme_has_examples():
    assert BLOCKS


@pytest.mark.broker
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example(index):
    code = BLOCKS[index].replace(DEFAULT_URI, MODERN_URI)
    exec(compile(code, f"README.md example {index + 1}", "exec"), {})
