"""The type stubs of the extension match it: `_core.pyi` names every class, function, method and
property of `redmutex._core` (private ones too, which stubtest does not ask for), and stubtest
finds no difference in signatures."""

from __future__ import annotations

import ast
import gc
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import redmutex
from redmutex import _core

PACKAGE = Path(redmutex.__file__).resolve().parent
STUB = PACKAGE / "_core.pyi"
# What every class has without defining it (or pyo3 adds on its own).
IMPLICIT = {"__doc__", "__module__", "__new__", "__repr__", "__dict__", "__weakref__"}


def _stub_tree() -> ast.Module:
    # CPython 3.11 (this machine's 3.11.7) can raise "AST constructor recursion depth mismatch"
    # when a garbage collection inside the parse runs Python finalizers (an earlier test's leftover
    # asyncio tasks logging their destruction): no collection while parsing.
    gc.collect()
    gc.disable()
    try:
        return ast.parse(STUB.read_text(encoding="utf-8"))
    finally:
        gc.enable()


def _stub_classes() -> dict[str, set[str]]:
    classes: dict[str, set[str]] = {}
    for node in _stub_tree().body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {
                item.name for item in node.body if isinstance(item, ast.FunctionDef)
            }
    return classes


def _stub_module_names() -> set[str]:
    names: set[str] = set()
    for node in _stub_tree().body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_package_is_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()
    assert STUB.is_file()


def test_stub_names_every_public_object_of_the_module() -> None:
    runtime = {n for n in dir(_core) if not n.startswith("__")} | {"__version__"}
    assert runtime <= _stub_module_names()
    assert set(_core.__all__) <= _stub_module_names()


@pytest.mark.parametrize("cls", [c for c in vars(_core).values() if inspect.isclass(c)])
def test_stub_names_every_method_and_property(cls: type) -> None:
    stub = _stub_classes()[cls.__name__]
    runtime = set(vars(cls)) - IMPLICIT
    assert runtime - stub == set(), f"missing from _core.pyi: {sorted(runtime - stub)}"
    assert stub - runtime - {"__new__"} == set(), f"not in the module: {sorted(stub - runtime)}"


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_stubtest() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "redmutex._core"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
