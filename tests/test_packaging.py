"""Packaging: the wheel holds the extension, the stubs and the py.typed
marker, and installs and works in a fresh venv; the conda recipe
(conda/meta.yaml) renders and agrees with setup.py."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import jinja2
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import pystream

from .conftest import ROOT
from .golden import GOLDEN, require

RECIPE = ROOT / "conda" / "meta.yaml"
SMOKE_TEST = ROOT / "conda" / "test_decode.py"
# setup.py's Extension(libraries=[...]) -> the conda-forge package of each
CONDA_LIBRARIES = {"isal": "isa-l", "z": "zlib", "lz4": "lz4-c",
                   "zstd": "zstd", "snappy": "snappy"}


# --- setup.py, read without running it -----------------------------------------

def _setup_calls() -> dict[str, dict]:
    """The literal keyword arguments of setup.py's ``setup(...)`` and
    ``Extension(...)`` calls (those that are literals)."""
    calls: dict[str, dict] = {}
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setup", "Extension"):
            kwargs = calls.setdefault(node.func.id, {})
            for kw in node.keywords:
                try:
                    kwargs[kw.arg] = ast.literal_eval(kw.value)
                except ValueError:      # not a literal (VERSION, glob...)
                    pass
    return calls


# --- the recipe, rendered as conda-build would for linux-64 ---------------------

def _select(text: str, namespace: dict) -> str:
    """conda-build's line selectors: a line ending in ``# [expr]`` is kept
    only where ``expr`` holds."""
    lines = []
    for line in text.splitlines():
        m = re.match(r"(.*?)\s*#\s*\[([^\[\]]+)\]\s*$", line)
        if m is None:
            lines.append(line)
        elif eval(m.group(2), {"__builtins__": {}}, dict(namespace)):
            lines.append(m.group(1))
    return "\n".join(lines) + "\n"


def render_recipe(py: int = 311, platform: str = "linux-64") -> dict:
    """conda/meta.yaml rendered with jinja2 (conda-build's functions
    stubbed) and its selectors applied, parsed as YAML."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    context = {
        "compiler": lambda lang: f"{lang}_compiler_stub",
        "stdlib": lambda lang: f"{lang}_stdlib_stub",
        "pin_compatible": lambda name, *a, **kw: name,
        "pin_subpackage": lambda name, *a, **kw: name,
        "load_setup_py_data": lambda *a, **kw: {},
        "load_file_data": lambda *a, **kw: {},
        "environ": dict(os.environ),
        "os": os,
        "PYTHON": "python",
        "target_platform": platform,
        "build_platform": platform,
    }
    text = env.from_string(RECIPE.read_text()).render(**context)
    system = platform.split("-")[0]
    namespace = {"linux": system == "linux", "osx": system == "osx",
                 "win": system == "win", "unix": system != "win",
                 "py": py, "target_platform": platform,
                 "build_platform": platform,
                 "x86_64": platform.endswith("-64"),
                 "aarch64": platform.endswith("aarch64")}
    return yaml.safe_load(_select(text, namespace))


def _conda_spec(spec: str) -> tuple[str, SpecifierSet]:
    """``"numpy >=1.26"`` -> ("numpy", SpecifierSet(">=1.26"))."""
    name, _, version = spec.strip().partition(" ")
    return name.lower(), SpecifierSet(version.replace(" ", ""))


def _pip_spec(spec: str) -> tuple[str, SpecifierSet]:
    req = Requirement(spec)
    return req.name.lower(), req.specifier


@pytest.fixture(scope="module")
def recipe() -> dict:
    return render_recipe()


@pytest.fixture(scope="module")
def setup_kwargs() -> dict:
    return _setup_calls()["setup"]


def test_recipe_renders_with_the_package_version(recipe, setup_kwargs):
    assert recipe["package"]["name"] == setup_kwargs["name"] == "pystream"
    assert str(recipe["package"]["version"]) == pystream.__version__
    assert recipe["source"] == {"path": ".."}
    build = recipe["build"]
    assert build["number"] == 0
    assert "--no-deps" in build["script"] and "--no-build-isolation" in build["script"]
    # built for Linux and Python >= 3.11 only
    assert not build.get("skip", False)
    assert render_recipe(py=310)["build"]["skip"] is True
    assert render_recipe(platform="osx-arm64")["build"]["skip"] is True
    assert recipe["about"]["license"] == setup_kwargs["license"]


def test_recipe_requirements_match_setup_py(recipe, setup_kwargs):
    reqs = recipe["requirements"]
    libraries = _setup_calls()["Extension"]["libraries"]
    # every library the extension links has its conda package ...
    assert set(libraries) == set(CONDA_LIBRARIES), \
        "setup.py links a library CONDA_LIBRARIES does not know"
    native = {CONDA_LIBRARIES[lib] for lib in libraries}
    host = dict(_conda_spec(s) for s in reqs["host"])
    run = dict(_conda_spec(s) for s in reqs["run"])
    # ... to build against and to run with
    assert native <= set(host), native - set(host)
    assert native <= set(run), native - set(run)
    # what the build imports: pyproject's build-system requires
    build_system = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for spec in build_system["build-system"]["requires"]:
        name, _ = _pip_spec(spec)
        assert name in host, f"{name} (pyproject build-system) not in host"
    assert host["cython"] == SpecifierSet(">=3.0")
    assert "c_compiler_stub" in reqs["build"]
    # run: python_requires and install_requires, exactly
    assert run.pop("python") == SpecifierSet(setup_kwargs["python_requires"])
    python_run = {n: s for n, s in run.items() if n not in native}
    assert python_run == dict(_pip_spec(s) for s in setup_kwargs["install_requires"])
    # the spark extra's pyspark, as a constraint
    spark = dict(_pip_spec(s) for s in setup_kwargs["extras_require"]["spark"])
    constrained = dict(_conda_spec(s) for s in reqs.get("run_constrained", []))
    assert constrained["pyspark"] == spark["pyspark"]


def test_recipe_entry_point_and_tests(recipe, setup_kwargs):
    def norm(entries):
        return sorted(re.sub(r"\s+", "", e) for e in entries)
    scripts = setup_kwargs["entry_points"]["console_scripts"]
    assert norm(recipe["build"]["entry_points"]) == norm(scripts)
    test = recipe["test"]
    assert {"pystream", "pystream._core", "pystream.spark"} <= set(test["imports"])
    assert "pystream --help" in test["commands"]
    assert "python test_decode.py" in test["commands"]
    for name in test["files"]:
        assert (RECIPE.parent / name).is_file(), name


# --- conda/test_decode.py: real frames, real values ----------------------------

def _smoke_module():
    spec = importlib.util.spec_from_file_location("conda_test_decode", SMOKE_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_test_frames_are_golden():
    """The frames and values in conda/test_decode.py are the golden
    capture's, and the script passes here."""
    smoke = _smoke_module()
    capture = GOLDEN / "deliver" / "rabbitmq-3.10.8-v1"
    wire = require(capture / "frames.bin").read_bytes()
    records = json.loads(require(capture / "expected.json").read_text())["records"]
    frames, pos = [], 0
    while pos < len(wire):
        (size,) = struct.unpack_from(">I", wire, pos)
        frames.append(wire[pos:pos + 4 + size])
        pos += 4 + size
    assert smoke.GZIP_FRAME in frames and smoke.AMQP091_FRAME in frames
    offsets = pystream.decode(wire, error_policy="raw").column("offset").to_pylist()
    for exp in smoke.EXPECTED:
        golden = dict(records[offsets.index(exp["offset"])])
        golden["body"] = hashlib.sha256(bytes.fromhex(golden["body"])).hexdigest()
        assert {k: v for k, v in exp.items() if k != "offset"} == golden
    smoke.main()


# --- the wheel ------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built once for the module."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
                   check=True, timeout=600)
    (path,) = out.glob("pystream-*.whl")
    return path


def test_wheel_builds(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("pystream/_core") and n.endswith(".so") for n in names)
    assert "pystream/py.typed" in names
    assert "pystream/_core.pyi" in names
    assert "pystream/protocol.py" in names
    assert "pystream/spark/__init__.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert re.search(r"^pystream\s*=\s*pystream\.cli:main$",
                     zipfile.ZipFile(wheel).read(entry_points).decode(), re.M)


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv(wheel, tmp_path):
    """pip installs the wheel and its dependencies (numpy, pyarrow, from the
    index pip is configured with) into a new venv, where the C core decodes
    the golden frames and the ``pystream`` command runs."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                   timeout=120)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    # nothing of this checkout or of the test venv may leak in
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
                        "PYTHONSTARTUP", "PYTHONSAFEPATH")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"

    def run(*args, **kw):
        return subprocess.run([str(a) for a in args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, **kw)

    done = run(python, "-m", "pip", "install", "-q", "--only-binary", ":all:", wheel)
    assert done.returncode == 0, done.stdout + done.stderr
    done = run(python, "-c", "import pystream, pystream._core, pystream.spark; "
                             "print(pystream.__file__)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(venv), done.stdout
    done = run(python, SMOKE_TEST)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "decodes golden frames" in done.stdout
    assert (bin_dir / "pystream").is_file()
    done = run(bin_dir / "pystream", "--help")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "usage" in done.stdout.lower()
