"""Every example of README.md runs against the test broker: each
```python block, and each ```sh block of ``pystream`` commands (the
install and maintenance commands, such as ``make test``, are what CI itself
runs)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from .conftest import MODERN_URI, ROOT

DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
COMMANDS = [block for block in re.findall(r"^```sh\n(.*?)^```", README, re.S | re.M)
            if block.startswith("pystream ")]


def test_readme_has_examples():
    assert BLOCKS and COMMANDS


@pytest.mark.broker
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example(index):
    code = BLOCKS[index].replace(DEFAULT_URI, MODERN_URI)
    exec(compile(code, f"README.md example {index + 1}", "exec"), {})


@pytest.mark.broker
@pytest.mark.parametrize("index", range(len(COMMANDS)))
def test_readme_commands(index, tmp_path):
    bin_dir = pathlib.Path(sys.executable).parent  # the venv's pystream script
    env = {**os.environ, "PYSTREAM_URI": MODERN_URI,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", COMMANDS[index]],
                            cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
