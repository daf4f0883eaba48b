"""pystream/_core.pyi describes the compiled pystream._core: the same
functions and classes, the same members, and the same parameters (names,
kinds, defaults) as the extension reports through inspect.

What the extension exports: the functions and classes it defines
(``__module__ == "pystream._core"``). Its module-level tables (CODECS,
PROPERTIES, ...) and the names it imports (np, pa, the errors) are not in
the stub on purpose; were the Python layer to import one, mypy would fail
on it (make lint)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from pystream import _core

STUB = Path(_core.__file__).parent / "_core.pyi"
#: (name, inspect.Parameter kind, default) of each parameter
Params = list[tuple[str, Any, Any]]


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def exported() -> dict[str, Any]:
    return {name: obj for name, obj in vars(_core).items()
            if not name.startswith("_") and callable(obj)
            and getattr(obj, "__module__", None) == _core.__name__}


def stub_definitions(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The public functions, classes and annotated attributes of a module or
    class body in the stub (type aliases, which the module has not, aside)."""
    out: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return {name: node for name, node in out.items() if not name.startswith("_")}


def stub_parameters(fn: ast.FunctionDef) -> Params:
    """(name, kind, default) of each parameter, defaults evaluated."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[Any] = [inspect.Parameter.empty] * (len(positional) - len(a.defaults))
    defaults += [evaluate(d) for d in a.defaults]
    out = [(p.arg, inspect.Parameter.POSITIONAL_ONLY if i < len(a.posonlyargs)
            else inspect.Parameter.POSITIONAL_OR_KEYWORD, d)
           for i, (p, d) in enumerate(zip(positional, defaults, strict=True))]
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    out += [(p.arg, inspect.Parameter.KEYWORD_ONLY,
             inspect.Parameter.empty if d is None else evaluate(d))
            for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return out


def evaluate(node: ast.expr) -> Any:
    # stub defaults are constant expressions such as 64 << 20
    return eval(compile(ast.Expression(node), str(STUB), "eval"), {})


def runtime_parameters(obj: Any) -> Params:
    return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]


def test_stub_names_are_the_module_names():
    stub = stub_definitions(stub_tree().body)
    assert sorted(stub) == sorted(exported()), (
        f"only in _core.pyi: {sorted(set(stub) - set(exported()))}; "
        f"only in the extension: {sorted(set(exported()) - set(stub))}")


@pytest.mark.parametrize("name", sorted(n for n, o in exported().items()
                                        if not isinstance(o, type)))
def test_function_signature(name):
    node = stub_definitions(stub_tree().body)[name]
    assert isinstance(node, ast.FunctionDef)
    assert stub_parameters(node) == runtime_parameters(getattr(_core, name))


@pytest.mark.parametrize("name", sorted(n for n, o in exported().items()
                                        if isinstance(o, type)))
def test_class_members(name):
    node = stub_definitions(stub_tree().body)[name]
    assert isinstance(node, ast.ClassDef)
    cls = getattr(_core, name)
    # the stub's base classes are the extension's
    assert [ast.unparse(b) for b in node.bases] == [
        b.__name__ for b in cls.__bases__ if b is not object]
    stub = stub_definitions(node.body)
    runtime = {n: v for n, v in vars(cls).items() if not n.startswith("_")}
    assert sorted(stub) == sorted(runtime), (
        f"only in _core.pyi: {sorted(set(stub) - set(runtime))}; "
        f"only in the extension: {sorted(set(runtime) - set(stub))}")
    for member, value in runtime.items():
        if inspect.isroutine(value):
            fn = stub[member]
            assert isinstance(fn, ast.FunctionDef), member
            is_property = any(ast.unparse(d) == "property" for d in fn.decorator_list)
            assert not is_property, f"{name}.{member} is a method, not a property"
            assert stub_parameters(fn) == runtime_parameters(value), member
        else:
            # a C attribute or property: an annotation or @property in the stub
            assert not isinstance(stub[member], ast.ClassDef), member


def source_constructor(name: str) -> Params | None:
    """The parameters of ``cdef class name``'s __init__ (else __cinit__)
    in the Cython sources, without self; None when it defines neither.
    Extension types report no signature for their constructors to inspect."""
    for path in sorted(STUB.parent.glob("_core*.p[xy][ix]")):
        text = path.read_text()
        start = re.search(rf"^cdef class {name}\b.*:$", text, re.M)
        if start is None:
            continue
        end = re.search(r"^\S", text[start.end():], re.M)
        body = text[start.end():start.end() + end.start() if end else len(text)]
        for method in ("__init__", "__cinit__"):
            m = re.search(rf"^    def {method}\(self,?([^)]*)\):", body, re.M)
            if m:
                # "int n=1" -> "n=1": Cython's C types go
                params = [re.sub(r"^(?:[\w.]+\s+)+(?=[*\w])", "", p.strip())
                          for p in m.group(1).split(",") if p.strip()]
                fn = ast.parse(f"def f(self, {', '.join(params)}): pass").body[0]
                assert isinstance(fn, ast.FunctionDef)
                return stub_parameters(fn)[1:]
        return None
    raise AssertionError(f"cdef class {name} not in the Cython sources")


def stub_constructor(tree: ast.Module, name: str) -> Params | None:
    """The stub's __init__ parameters of class name, inherited ones too."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    node = classes[name]
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return stub_parameters(item)[1:]
    for base in node.bases:
        if ast.unparse(base) in classes:
            return stub_constructor(tree, ast.unparse(base))
    return None


@pytest.mark.parametrize("name", sorted(n for n, o in exported().items()
                                        if isinstance(o, type)))
def test_class_constructor(name):
    cls = getattr(_core, name)
    want = source_constructor(name)
    for base in cls.__mro__[1:]:
        if want is not None or base is object:
            break
        want = source_constructor(base.__name__)
    assert stub_constructor(stub_tree(), name) == want
