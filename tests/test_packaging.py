"""The package builds as a wheel holding the extension, the stubs and the
py.typed marker."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from .conftest import ROOT


def test_wheel_builds(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                   check=True, timeout=600)
    (wheel,) = tmp_path.glob("pystream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("pystream/_core") and n.endswith(".so") for n in names)
    assert "pystream/py.typed" in names
    assert "pystream/_core.pyi" in names
    assert "pystream/protocol.py" in names
