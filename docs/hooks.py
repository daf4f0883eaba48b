"""MkDocs hooks of the documentation site (mkdocs.yml names this file).

- Every public name has a docstring: the names that ``pystream``,
  ``pystream.aio``, ``pystream.spark`` and ``pystream.metrics`` export, and
  the public methods and properties of their classes. A name without one
  is a warning, which ``mkdocs build --strict`` (``make docs``) turns into a
  failure. The names are read the way the API reference reads them (griffe,
  from the sources and ``_core.pyi``), so what is checked is what is shown.
- Every public name appears in the API reference: a ``::: NAME`` line of a
  page in ``docs/reference`` for each.
- The plots in ``bench/results`` join the site under ``bench/``, so that the
  Benchmarks page shows the stored ones and no copy sits in ``docs/``; the
  pages link them as ``../bench/results/NAME.png``, which also works where
  the Markdown is read in the repository.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "bench" / "results"
# The modules whose public names the API reference documents, and for a
# module without ``__all__`` whose other public names are the library's own
# plumbing, the names that are its API.
MODULES = {"pystream": None, "pystream.aio": None, "pystream.spark": None,
           "pystream.metrics": ["set_meter_provider"]}
# pystream.spark loads these on first use (its __getattr__), so griffe sees
# them in the module that defines them.
LAZY = ("pystream.spark.datasource.RabbitMQStreamDataSource",
        "pystream.spark.datasource.arrow_schema")

log = logging.getLogger("mkdocs.plugins.pystream")


def public_names(module, names: list[str] | None) -> list[str]:
    """What ``module`` exports: ``names``, else its ``__all__``, else the
    public names it defines (not the ones it imports)."""
    if names is not None:
        return names
    if module.exports is not None:
        return [str(n) for n in module.exports]
    return [n for n, m in module.members.items()
            if not n.startswith("_") and not m.is_alias]


def missing_docstrings() -> list[str]:
    """The dotted names of public objects that have no docstring."""
    import griffe
    pkg = griffe.load("pystream", search_paths=[str(ROOT)], allow_inspection=False,
                      resolve_aliases=True, resolve_external=False)
    objects = {path: pkg[path.removeprefix("pystream.")] for path in LAZY}
    for dotted, names in MODULES.items():
        module = pkg if dotted == "pystream" else pkg[dotted.removeprefix("pystream.")]
        objects[dotted] = module
        for name in public_names(module, names):
            # __version__ is a string; lazy names are in LAZY
            if not name.startswith("__") and name in module.members:
                objects[f"{dotted}.{name}"] = module.members[name]
    missing = []
    for path, obj in objects.items():
        target = obj.final_target if obj.is_alias else obj
        if not target.docstring:
            missing.append(path)
        if target.is_class:
            for name, member in target.all_members.items():
                if name.startswith("_") or member.is_alias and not member.inherited:
                    continue
                if member.is_attribute and "property" not in member.labels:
                    continue  # fields, documented by the class
                if not member.docstring:  # an inherited one: where it is defined
                    missing.append(member.final_target.path if member.is_alias
                                   else f"{path}.{name}")
    return sorted(set(missing))


def public_objects() -> list[str]:
    """The dotted names the API reference must show."""
    import griffe
    pkg = griffe.load("pystream", search_paths=[str(ROOT)], allow_inspection=False,
                      resolve_aliases=True, resolve_external=False)
    names = []
    for dotted, only in MODULES.items():
        module = pkg if dotted == "pystream" else pkg[dotted.removeprefix("pystream.")]
        names += [f"{dotted}.{n}" for n in public_names(module, only)
                  if not n.startswith("__") and n in module.members
                  and not module.members[n].is_module]
    return names + list(LAZY)


def unreferenced(reference: Path) -> list[str]:
    """The public names no ``::: NAME`` line of the reference pages shows."""
    shown = {m for page in reference.glob("*.md")
             for m in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)}
    return [n for n in public_objects() if n not in shown]


def on_pre_build(config) -> None:
    for name in missing_docstrings():
        log.warning("public name without a docstring: %s", name)
    for name in unreferenced(Path(config["docs_dir"]) / "reference"):
        log.warning("public name missing from the API reference: %s", name)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace("](../bench/results/", "](bench/")


def on_files(files, config):
    from mkdocs.structure.files import File
    for plot in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"bench/{plot.name}", abs_src_path=str(plot)))
    return files
