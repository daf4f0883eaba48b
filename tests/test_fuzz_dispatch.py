"""The atheris harness of the frame dispatch (fuzz/dispatch.py) runs only in
`make test`'s last step and `make fuzz`; replaying its seeds and kept corpus
here, without atheris, fails `make unit` as soon as the harness no longer
matches the code it drives."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    atheris = types.ModuleType("atheris")
    atheris.instrument_imports = contextlib.nullcontext  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "atheris", atheris)
    spec = importlib.util.spec_from_file_location("fuzz_dispatch", ROOT / "fuzz" / "dispatch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(tmp_path: Path) -> list[bytes]:
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    subprocess.run([sys.executable, str(ROOT / "fuzz" / "seed.py"),
                    str(ROOT / "tests" / "data" / "golden"), str(seeds), "--frames"],
                   check=True)
    found = [path.read_bytes() for path in sorted(seeds.iterdir())]
    with tarfile.open(ROOT / "fuzz" / "dispatch-corpus.tar.xz") as kept:
        for member in kept.getmembers():
            data = kept.extractfile(member) if member.isfile() else None
            if data is not None:
                found.append(data.read())
    return found


def test_the_dispatch_harness_runs_its_seeds_and_kept_corpus(
        harness: types.ModuleType, tmp_path: Path) -> None:
    found = inputs(tmp_path)
    assert len(found) > 20
    for data in [b"", *found]:
        harness.test_one_input(data)


def test_inputs_that_once_crashed_the_harness_are_typed_errors_now(
        harness: types.ModuleType) -> None:
    """Each file in tests/data/fuzz-crashes is an input the fuzzer found (a
    broker offering a null SASL mechanism, ...): replayed on every run."""
    crashes = sorted((ROOT / "tests" / "data" / "fuzz-crashes").glob("dispatch-*"))
    assert crashes
    for path in crashes:
        harness.test_one_input(path.read_bytes())
