"""The house's rules, checked: no module imports in a circle, the check kinds are listed once and every
consumer reads that list, and every setting flows by one name from the command line to the settings."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

import pytest_neuron_support
from pytest_neuron_support.catalog import load as catalog
from pytest_neuron_support.checks.registry import CHECKS, KINDS, check_of, item_name, model_id_of
from pytest_neuron_support.run.settings import Resolved, Settings
from pytest_neuron_support.session import fixtures, suite
from pytest_neuron_support.session.options import Options
from pytest_neuron_support.session.resolve import settings_for

PACKAGE = Path(pytest_neuron_support.__file__).parent


def _imports(path: Path, module: str) -> set[str]:
    """The package's modules ``module`` imports (every import: lazy and type-checking ones too)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")
            if node.level:
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            found |= {prefix, *(f"{prefix}.{alias.name}" for alias in node.names)}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        if "templates" in path.parts or (path.parent.name == "scripts" and path.parent.parent.name == "doctor"):
            continue  # scripts rendered for other processes, never imported by the package
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path, name):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported not in (name, pytest_neuron_support.__name__):
                targets.add(imported)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_package_imports_in_a_circle() -> None:
    graph = import_graph()
    assert len(graph) > 60  # the walk found the package
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    graph = import_graph()
    # Plant one: the lowest room importing the session's controller closes a circle through it.
    graph["pytest_neuron_support.base.model"].add("pytest_neuron_support.session.controller")
    assert any("pytest_neuron_support.base.model" in component for component in cycles(graph))


def test_the_rooms_import_each_other_one_way() -> None:
    # The journey's rooms, lowest first: a room imports only rooms before it (and itself).
    order = [
        "base",
        "devices",
        "hub",
        "verdict",
        "data",
        "planning",
        "run",
        "cpu",
        "tasks",
        "checks",
        "catalog",
        "session",
    ]
    rank = {room: i for i, room in enumerate(order)}
    upward = []
    for module, targets in import_graph().items():
        room = module.split(".")[1] if module.count(".") else ""
        for target in targets:
            other = target.split(".")[1] if target.count(".") else ""
            if room in rank and other in rank and rank[other] > rank[room]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_every_check_kind_has_its_catalog_test_and_its_public_fixture() -> None:
    assert catalog.CHECKS == CHECKS == tuple(KINDS)
    for name, kind in KINDS.items():
        test = getattr(suite, kind.test)
        assert kind.fixture in inspect.signature(test).parameters, (name, kind.fixture)
        assert callable(getattr(fixtures, kind.fixture)), kind.fixture
        assert item_name("org/m", name) == f"{kind.test}[org/m]"
        assert (model_id_of(f"models.yaml::{kind.test}[org/m]"), check_of(f"x::{kind.test}[org/m]")) == ("org/m", name)
    # The suite holds exactly the kinds' tests.
    tests = {name for name, value in vars(suite).items() if name.startswith("test_") and callable(value)}
    assert tests == {kind.test for kind in KINDS.values()}


def _distinct(annotation: Any, i: int) -> Any:
    """A value of a field's type that no other field has (so a copy by the wrong name shows)."""
    text = str(annotation)
    if text.startswith("Path"):
        return Path(f"/p{i}")
    if text.startswith("bool"):
        return bool(i % 2)
    if text.startswith("int"):
        return 1000 + i
    if text.startswith("float"):
        return 0.5 + i / 1000
    if text.startswith("tuple[int"):
        return (i,)
    if text.startswith("str"):
        return f"v{i}"
    return None


def test_every_setting_named_like_an_option_or_a_resolved_fact_takes_its_value() -> None:
    values = {f.name: _distinct(f.type, i) for i, f in enumerate(dataclasses.fields(Options))}
    values.update(device="cpu", compile_backend="b", neff_cache=None, judge_model="j", judge_revision="r")
    values.update(extra_models=(), shard=None, checks=None)
    options = Options(**values)
    resolved = Resolved(
        device="cpu", cores=(3, 4), neuron_cores=2, core_bytes=7, neuronx_cc="none", session="s", cpu_threads=5
    )
    settings = settings_for(options, resolved)
    shared = {f.name for f in dataclasses.fields(Settings)}
    derived = {"device", "compile_backend", "neff_cache", "stack"}
    by_option = (shared & set(values)) - derived - {f.name for f in dataclasses.fields(Resolved)}
    assert by_option >= {"max_new_tokens", "memory_headroom", "core_ledger", "host_memory_gib", "parity"}
    for name in by_option:
        assert getattr(settings, name) == values[name], name
    for name in shared & {f.name for f in dataclasses.fields(Resolved)} - derived:
        assert getattr(settings, name) == getattr(resolved, name), name
    # Every field of the settings comes from somewhere: an option, a resolved fact, or a derivation.
    assert shared <= set(values) | {f.name for f in dataclasses.fields(Resolved)} | derived


@pytest.mark.parametrize("name", ["compile_cache", "lease_dir", "headroom", "pool_cores", "pool_slice"])
def test_the_settings_keep_no_second_name_for_an_option(name: str) -> None:
    assert name not in {f.name for f in dataclasses.fields(Settings)}
