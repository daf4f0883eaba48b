"""Packaging: the conda recipe (conda/meta.yaml) renders and agrees with
pyproject.toml and setup.py; the version has one definition; `make wheel`
(scripts/build-wheel) makes an sdist and a manylinux wheel bundling the
native libraries, which installs and works in a fresh venv here (in other
CPythons: tests/test_other_pythons.py) and with exactly the declared
minimum numpy and pyarrow; the sdist builds against this machine's
libraries."""

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
from tools.sources import source_tree

from .conftest import ROOT
from .golden import GOLDEN, require

RECIPE = ROOT / "conda" / "meta.yaml"
SMOKE_TEST = ROOT / "conda" / "test_decode.py"
# the distribution's name: "pystream" on the package index is another project
DIST_NAME = "pystream-rabbitmq"
# setup.py's Extension(libraries=[...]) -> the conda-forge package of each
CONDA_LIBRARIES = {"isal": "isa-l", "z": "zlib", "lz4": "lz4-c",
                   "zstd": "zstd", "snappy": "snappy"}


# --- pyproject.toml's [project], and setup.py read without running it ----------

def _project() -> dict:
    """pyproject.toml's ``[project]`` table: the distribution's metadata."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _setup_optional() -> dict[str, tuple[str, str]]:
    """setup.py's ``OPTIONAL``: the libraries it links where it finds them."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "OPTIONAL":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no OPTIONAL")


def _setup_calls() -> dict[str, dict]:
    """The literal keyword arguments of setup.py's ``setup(...)`` and
    ``Extension(...)`` calls (those that are literals: the libraries)."""
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


def _load_file_regex(load_file: str, regex_pattern: str,
                     from_recipe_dir: bool = False) -> re.Match[str] | None:
    """conda-build's: the pattern searched in a file of the source (here,
    this checkout) or of the recipe's folder."""
    base = RECIPE.parent if from_recipe_dir else ROOT
    return re.search(regex_pattern, (base / load_file).read_text())


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
        "load_file_regex": _load_file_regex,
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
def project() -> dict:
    return _project()


def test_version_has_one_definition():
    """pystream/_version.py holds the version; pyproject.toml reads it
    from there, and no other file of the package sets one."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in build["project"]
    assert "version" in build["project"]["dynamic"]
    assert build["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "pystream._version.__version__"}
    defined = [p.relative_to(ROOT).as_posix()
               for p in [ROOT / "setup.py", *(ROOT / "pystream").rglob("*.py")]
               if re.search(r"^\s*__version__\s*=", p.read_text(), re.M)]
    assert defined == ["pystream/_version.py"], defined
    assert "version=" not in (ROOT / "setup.py").read_text()
    from pystream import _version, handshake
    assert pystream.__version__ is _version.__version__
    assert handshake.__version__ is _version.__version__


def test_recipe_renders_with_the_package_version(recipe, project):
    assert recipe["package"]["name"] == project["name"] == DIST_NAME
    assert str(recipe["package"]["version"]) == pystream.__version__
    assert recipe["source"] == {"path": ".."}
    build = recipe["build"]
    assert build["number"] == 0
    assert "--no-deps" in build["script"] and "--no-build-isolation" in build["script"]
    # built for Linux and Python >= 3.11 only
    assert not build.get("skip", False)
    assert render_recipe(py=310)["build"]["skip"] is True
    assert render_recipe(platform="osx-arm64")["build"]["skip"] is True
    assert recipe["about"]["license"] == project["license"]


def test_recipe_requirements_match_pyproject(recipe, project):
    reqs = recipe["requirements"]
    # the one it needs, and those it links when the build finds them
    libraries = [*_setup_calls()["Extension"]["libraries"], *_setup_optional()]
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
    assert host["cython"] == SpecifierSet(">=3.1")
    assert "c_compiler_stub" in reqs["build"]
    # run: requires-python and the dependencies, exactly
    assert run.pop("python") == SpecifierSet(project["requires-python"])
    python_run = {n: s for n, s in run.items() if n not in native}
    assert python_run == dict(_pip_spec(s) for s in project["dependencies"])
    # the spark extra's pyspark, as a constraint
    spark = dict(_pip_spec(s) for s in project["optional-dependencies"]["spark"])
    constrained = dict(_conda_spec(s) for s in reqs.get("run_constrained", []))
    assert constrained["pyspark"] == spark["pyspark"]


def test_recipe_entry_point_and_tests(recipe, project):
    def norm(entries):
        return sorted(re.sub(r"\s+", "", e) for e in entries)
    scripts = [f"{name} = {target}" for name, target in project["scripts"].items()]
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


# --- make wheel: the sdist and the manylinux wheel ------------------------------

BUILD_CACHE = Path(os.environ.get("PYSTREAM_BUILD_CACHE")
                   or Path.home() / ".cache" / "pystream" / "build")
BULLSEYE_ROOT = BUILD_CACHE / "bullseye-root"
BROKER_CACHE = Path(os.environ.get("PYSTREAM_BROKER_CACHE")
                    or Path.home() / ".cache" / "pystream" / "brokers")
# the modern broker's root: Debian trixie, its own Python, no -dev packages
OTHER_ROOT = BROKER_CACHE / "trixie-root"
# copied into the wheel; zlib is linked in statically (manylinux counts
# libz.so.1 as part of the system, so auditwheel would not copy it)
BUNDLED = ("libisal", "liblz4", "libzstd", "libsnappy")
DEV_PACKAGES = ("libisal-dev", "zlib1g-dev", "liblz4-dev", "libzstd-dev",
                "libsnappy-dev")


def _clean_env(venv: Path | None = None) -> dict[str, str]:
    """This process's environment without what would leak this checkout or
    the test venv into a child."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
                        "PYTHONSTARTUP", "PYTHONSAFEPATH")}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(*args, cwd: Path, env=None, timeout: float = 600):
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env or _clean_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def _in_root(root: Path, work: Path, *cmd: str, timeout: float = 600) -> str:
    """Run CMD chrooted in ROOT with WORK bound at /work (scripts/lib)."""
    script = (". scripts/lib/debian-mirror.sh; . scripts/lib/debian-root.sh; "
              'in_debian_root "$@"')
    return _run("bash", "-c", script, "bash", root, work, *cmd, cwd=ROOT,
                timeout=timeout)


# make wheel's output, built once for the session: tests/test_platforms.py
# imports the fixture, which pytest sets up again for that module.
_BUILT: dict[str, Path] = {}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """``make wheel``'s output for this checkout: the sdist, the wheel for
    this Python's version, the stable-ABI one and the stable-ABI one for
    aarch64 (tests/test_platforms.py runs it)."""
    if not _BUILT:
        _BUILT.update(_make_wheel(tmp_path_factory.mktemp("dist")))
    return dict(_BUILT)


def _make_wheel(out: Path) -> dict[str, Path]:
    env = _clean_env()
    env["PYTHON"] = sys.executable
    log = _run(ROOT / "scripts" / "build-wheel", out, cwd=ROOT, env=env,
               timeout=1200)
    print(log)
    (wheel,) = out.glob(f"*-{CPYTHON}-{CPYTHON}-*.whl")
    (abi3,) = out.glob("*-cp311-abi3-*_x86_64.whl")
    (aarch64,) = out.glob("*-cp311-abi3-*_aarch64.whl")
    (sdist,) = out.glob("*.tar.gz")
    assert len(list(out.iterdir())) == 4, list(out.iterdir())
    return {"wheel": wheel, "abi3": abi3, "aarch64": aarch64, "sdist": sdist}


CPYTHON = "cp{}{}".format(*sys.version_info[:2])
# the extension's file name in each wheel
CORE = {"wheel": f"_core.cpython-{CPYTHON[2:]}-x86_64-linux-gnu.so",
        "abi3": "_core.abi3.so", "aarch64": "_core.abi3.so"}
# ELF e_machine of each wheel's extension
ELF_MACHINE = {"wheel": 62, "abi3": 62, "aarch64": 183}


def _platform_tags(wheel: Path) -> list[str]:
    # name-version-python-abi-platform(.platform...).whl
    return wheel.name.removesuffix(".whl").split("-")[-1].split(".")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "abi3", "aarch64"])
def test_wheel_is_manylinux_and_bundles_the_libraries(dist, kind):
    wheel = dist[kind]
    name, version, python, abi, _ = wheel.name.split("-")
    assert (name, version) == (DIST_NAME.replace("-", "_"), pystream.__version__)
    assert (python, abi) == ((CPYTHON, CPYTHON) if kind == "wheel" else ("cp311", "abi3"))
    for tag in _platform_tags(wheel):
        arch = "aarch64" if kind == "aarch64" else "x86_64"
        m = re.fullmatch(rf"manylinux_(\d+)_(\d+)_{arch}", tag)
        assert m and (int(m[1]), int(m[2])) <= (2, 31), tag
    names = zipfile.ZipFile(wheel).namelist()
    libs = [n.split("/")[-1] for n in names if n.startswith("pystream_rabbitmq.libs/")]
    for lib in BUNDLED:
        assert any(n.startswith(lib + "-") for n in libs), (lib, libs)
    assert f"pystream/{CORE[kind]}" in names
    elf = zipfile.ZipFile(wheel).read(f"pystream/{CORE[kind]}")
    assert struct.unpack_from("<H", elf, 18)[0] == ELF_MACHINE[kind]
    assert "pystream/py.typed" in names and "pystream/_core.pyi" in names
    assert "pystream/spark/__init__.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert re.search(r"^pystream\s*=\s*pystream\.cli:main$",
                     zipfile.ZipFile(wheel).read(entry_points).decode(), re.M)
    print(f"{wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "abi3"])
def test_wheel_links_on_glibc_2_31(dist, tmp_path, kind):
    """In the Debian bullseye root (glibc 2.31), the extension and its
    bundled libraries resolve with no symbol version missing, zlib needs no
    shared library, and only Python's own symbols stay undefined (the
    interpreter provides them)."""
    zipfile.ZipFile(dist[kind]).extractall(tmp_path / "wheel")
    out = _in_root(BULLSEYE_ROOT, tmp_path, "ldd", "-r",
                   f"/work/wheel/pystream/{CORE[kind]}")
    check_ldd(out, "/work/wheel/")


def check_ldd(out: str, wheel: str) -> None:
    """``ldd -r``'s account of the extension of a wheel unpacked at
    ``wheel``: no symbol version or library missing, no shared zlib, the
    bundled libraries from the wheel, only Python's symbols undefined."""
    assert "GLIBC" not in out and "not found" not in out, out
    assert "libz.so" not in out, out
    for lib in BUNDLED:
        assert re.search(rf"^\s*{lib}-\w+\.so\S* => {re.escape(wheel)}\S*pystream_rabbitmq\.libs/",
                         out, re.M), (lib, out)
    undefined = re.findall(r"undefined symbol: (\S+)", out)
    assert undefined and all(s.startswith(("Py", "_Py")) for s in undefined), undefined


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv(dist, tmp_path):
    """pip installs the package from make wheel's folder, as the README
    says, and its dependencies (numpy, pyarrow, from the index pip is
    configured with) into a new venv: it picks the wheel for this Python's
    version, where the C core decodes the golden frames and the ``pystream``
    command runs."""
    python = _fresh_venv(tmp_path / "venv")
    env = _clean_env(tmp_path / "venv")
    _run(python, "-m", "pip", "install", "-q", "--only-binary", ":all:",
         DIST_NAME, "--find-links", dist["wheel"].parent, cwd=tmp_path, env=env)
    where = Path(_run(python, "-c", "import pystream, pystream._core, pystream.spark; "
                                    "print(pystream._core.__file__)",
                      cwd=tmp_path, env=env).strip())
    assert where.is_relative_to(tmp_path / "venv") and where.name == CORE["wheel"], where
    assert "decodes golden frames" in _run(python, SMOKE_TEST, cwd=tmp_path, env=env)
    assert "usage" in _run(tmp_path / "venv" / "bin" / "pystream", "--help",
                           cwd=tmp_path, env=env).lower()


# the C core's broker-free tests that need nothing beyond pytest and hypothesis
ENGINE_TESTS = ("tests/test_core_decode.py", "tests/test_core_encode.py",
                "tests/test_core_errors.py", "tests/test_core_frame.py")


def debian_root(suite: str, root: Path, *packages: str) -> Path:
    """``root``, debootstrapped with ``packages`` the first time."""
    _run("bash", "-c", ". scripts/lib/debian-mirror.sh; . scripts/lib/debian-root.sh; "
         'debian_root "$@"', "bash", suite, root, *packages, cwd=ROOT, timeout=1800)
    return root


@pytest.mark.slow
def test_sdist_builds_and_installs(dist, tmp_path):
    """pip builds the sdist in a fresh venv against this machine's libraries
    (csrc/DEPENDENCIES) and the installed package decodes the golden frames."""
    python = _fresh_venv(tmp_path / "venv")
    env = _clean_env(tmp_path / "venv")
    _run(python, "-m", "pip", "install", "-q", dist["sdist"], cwd=tmp_path, env=env,
         timeout=900)
    core = _run(python, "-c", "import pystream._core as c; print(c.__file__)",
                cwd=tmp_path, env=env).strip()
    assert Path(core).is_relative_to(tmp_path / "venv"), core
    # the system's libraries, not bundled copies
    assert re.search(r"libisal\.so\.2 => /(usr/)?lib/", _run("ldd", core, cwd=tmp_path))
    assert "decodes golden frames" in _run(python, SMOKE_TEST, cwd=tmp_path, env=env)


def _declared_minimums() -> list[str]:
    """pyproject.toml's dependencies, each ``>=`` made ``==``."""
    pins = []
    for spec in _project()["dependencies"]:
        req = Requirement(spec)
        (low,) = [s.version for s in req.specifier if s.operator == ">="]
        pins.append(f"{req.name}=={low}")
    return pins


# broker-free tests that need more than the package and pytest: the spark
# extra, this file's renderers (and the files that import this file), the
# documentation's broker
ORACLES = ("rbfly", "rstream", "python-qpid-proton", "opentelemetry-sdk")
NOT_WITH_MINIMUMS = ("test_spark_*.py", "test_packaging.py", "test_readme.py")


def _not_with_minimums() -> list[Path]:
    """The test files NOT_WITH_MINIMUMS names, and every one importing this."""
    tests = ROOT / "tests"
    return sorted({*(p for pattern in NOT_WITH_MINIMUMS for p in tests.glob(pattern)),
                   *(p for p in tests.glob("test_*.py")
                     if "from .test_packaging import" in p.read_text())})


@pytest.mark.slow
def test_declared_minimum_versions(dist, tmp_path):
    """With exactly the minimum numpy and pyarrow pyproject.toml declares, the
    wheel passes the broker-free tests. They run from this checkout, which
    comes last on the path (python -P, pytest's append import mode), so that
    the installed package is the one imported."""
    pins = _declared_minimums()
    assert {p.split("==")[0] for p in pins} == {"numpy", "pyarrow"}, pins
    python = _fresh_venv(tmp_path / "venv")
    env = _clean_env(tmp_path / "venv")
    # The oracles the broker-free tests import (rbfly and rstream decode the
    # same AMQP bytes; the metrics tests need the SDK); rbfly is an sdist.
    _run(python, "-m", "pip", "install", "-q", "--only-binary", "numpy,pyarrow",
         dist["wheel"], *pins, "pytest", "hypothesis", *ORACLES,
         cwd=tmp_path, env=env, timeout=900)
    found = _run(python, "-P", "-c", "import numpy, pyarrow, pystream; print("
                 "f'numpy=={numpy.__version__} pyarrow=={pyarrow.__version__}', "
                 "pystream.__file__)", cwd=ROOT, env=env).split()
    assert sorted(found[:2]) == sorted(pins), found
    assert Path(found[2]).is_relative_to(tmp_path / "venv"), found
    ignore = [f"--ignore={p.relative_to(ROOT)}" for p in _not_with_minimums()]
    out = _run(python, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--import-mode=append", "-m", "not broker and not slow", *ignore,
               "tests", cwd=ROOT, env=env, timeout=900)
    assert re.search(r"\d+ passed", out) and "failed" not in out, out



# --- make build: a warning in csrc/ is an error there, and only there -----------

@pytest.mark.slow
def test_development_build_fails_on_a_csrc_warning(tmp_path):
    """``make build`` (PYSTREAM_DEV=1) stops at a warning in csrc/; a
    release build (no PYSTREAM_DEV: make wheel, pip) takes the same
    warning. (The C that Cython generates has warnings of its own, which
    make build passes: it builds this checkout.)"""
    src = source_tree(tmp_path / "src")
    with open(src / "csrc" / "buf.c", "a") as f:
        f.write("\nstatic int never_called(void) { return 0; }\n")
    build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
    env = _clean_env()
    failed = subprocess.run(build, cwd=src, env={**env, "PYSTREAM_DEV": "1"},
                            capture_output=True, text=True, timeout=900)
    assert failed.returncode != 0
    assert re.search(r"buf\.c:\d+:\d+: error: .*never_called.*-Werror=unused-function",
                     failed.stderr), failed.stderr[-3000:]
    _run(*build, cwd=src, env=env, timeout=900)
    assert list((src / "pystream").glob("_core*.so"))
