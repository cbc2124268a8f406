"""Render a doctor check's script (``doctor/scripts/<name>.py``) into the standalone program it runs as.

A check script is a real file that ruff reads: it imports what it shares with the other checks from
``harness`` (scripts/harness.py) and what it takes from run.py's code from ``common``
(templates/common.py), each on a line that ends with its marker. Rendering splices both in, the way
runscript renders run.py: the harness's body replaces the ``# @@HARNESS@@`` import, the definitions
of templates/common.py that the ``# @@COMMON@@`` imports name (with the constants, functions and
modules they use in turn) replace those, and runscript's ``_fill()`` writes the check's arguments into
``SPEC = {}  # @@SPEC@@``. So a check runs run.py's own code (its launcher, its way of dying with its
parent, of writing a result), never a copy, and the rendered file stays in the work directory, to be
rerun by hand.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Collection, Iterable, Mapping
from importlib import resources
from typing import Any

from pytest_neuron_support.run.runscript import _COMMON_MARKER, _fill, template

#: Ends the line of a check script's ``from harness import`` and, in scripts/harness.py, the line after
#: which what is spliced starts.
HARNESS_MARKER = "# @@HARNESS@@"
#: Where the script's own file name goes (its docstring says how to rerun it).
FILE_MARKER = "@@FILE@@"
#: What every check script shares; not a check's script itself.
HARNESS = "harness"
_PACKAGE = "pytest_neuron_support.doctor"


def script_source(name: str) -> str:
    """The text of ``scripts/<name>.py`` as it ships in the package."""
    return resources.files(_PACKAGE).joinpath(f"scripts/{name}.py").read_text(encoding="utf-8")


def script_names() -> tuple[str, ...]:
    """Every check script the package ships (the harness aside), sorted."""
    folder = resources.files(_PACKAGE).joinpath("scripts")
    names = (entry.name.removesuffix(".py") for entry in folder.iterdir() if entry.name.endswith(".py"))
    return tuple(sorted(name for name in names if name != HARNESS))


def render(name: str, spec: Mapping[str, Any], *, file: str) -> str:
    """The standalone program of check script ``name``: harness and common.py code spliced in, ``spec``
    written into its ``SPEC``, ``file`` (the name it is written under) into its docstring."""
    script = script_source(name)
    # The modules the script imports itself are not imported a second time by the harness's code.
    harness = _without_imports(script_source(HARNESS).split(f"{HARNESS_MARKER}\n", 1)[1], _top_level_names(script))
    source = _splice(script, "harness", HARNESS_MARKER, lambda _: harness, required=True)
    # The script's own common.py imports and the harness's, spliced once, where the first one was.
    defined = _top_level_names(source)
    source = _splice(source, "common", _COMMON_MARKER, lambda names: common_parts(names, defined))
    # SPEC last, as runscript does: no value in it can be mistaken for a placeholder.
    return _fill(source.replace(FILE_MARKER, file), dict(spec))


def common_parts(names: Iterable[str], defined: Collection[str] = ()) -> str:
    """The top-level definitions ``names`` of templates/common.py as source, with the constants and
    functions of common.py they use (transitively) and the modules those import, so the text runs as
    is; in common.py's order. Names in ``defined`` (what the script the text goes into defines or
    imports itself: a check's own ``rank_entry``, which common.py's ``spawn_ranks`` starts) are not
    taken from common.py."""
    source = template("common.py")
    marker = next(i for i, line in enumerate(source.splitlines(), start=1) if line == _COMMON_MARKER)
    # Only what runscript splices into run.py (below the marker): the header imports the host's names.
    body = [node for node in ast.parse(source).body if node.lineno > marker]
    parts = {name: node for node in body for name in _bound(node) if not isinstance(node, ast.Import)}
    unknown = sorted(set(names) - set(parts))
    if unknown:
        raise ValueError(f"templates/common.py defines no {', '.join(unknown)}")
    wanted: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name not in wanted:
            wanted.add(name)
            used = {n.id for n in ast.walk(parts[name]) if isinstance(n, ast.Name)}
            pending.extend(n for n in used if n in parts and n not in defined)
    chosen = [node for node in body if not isinstance(node, ast.Import) and wanted & set(_bound(node))]
    used = {n.id for node in chosen for n in ast.walk(node) if isinstance(n, ast.Name)}
    imports = [
        node
        for node in body
        if isinstance(node, ast.Import) and any(n in used and n not in defined for n in _bound(node))
    ]
    segments = [str(ast.get_source_segment(source, node)) for node in chosen]
    if imports:
        segments.insert(0, "\n".join(str(ast.get_source_segment(source, node)) for node in imports))
    return "\n\n\n".join(segments)


def _bound(node: ast.stmt) -> list[str]:
    """The names a top-level statement binds (a definition, an assignment, an import)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(alias.asname or alias.name).partition(".")[0] for alias in node.names]
    return []


def _top_level_names(source: str) -> set[str]:
    """What ``source`` binds at its top level, its imports from the spliced modules aside."""
    return {
        name
        for node in ast.parse(source).body
        if not (isinstance(node, ast.ImportFrom) and node.module in ("common", "harness"))
        for name in _bound(node)
    }


def _without_imports(source: str, names: Collection[str]) -> str:
    """``source`` without its top-level ``import`` statements of modules bound in ``names`` already."""
    lines = source.split("\n")
    for node in reversed(ast.parse(source).body):
        if isinstance(node, ast.Import) and set(_bound(node)) <= set(names):
            del lines[node.lineno - 1 : node.end_lineno]
    return "\n".join(lines)


def _splice(source: str, module: str, marker: str, text: Callable[[list[str]], str], *, required: bool = False) -> str:
    """``source`` with its top-level ``from <module> import ...`` statements (each one's first line ending
    with ``marker``) replaced: the first by ``text(the names they import)``, the others removed."""
    statements = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom) and n.module == module]
    lines = source.split("\n")
    if not statements:
        if required:
            raise ValueError(f"no `from {module} import ...  {marker}` line")
        return source
    for statement in statements:
        if not lines[statement.lineno - 1].endswith(marker):
            raise ValueError(f"line {statement.lineno}: an import from {module} must end with {marker}")
    names = [alias.name for statement in statements for alias in statement.names]
    for statement in reversed(statements):
        # Set apart by blank lines: the rendered script is read by whoever reruns it.
        spliced = ["", text(names).strip("\n"), ""] if statement is statements[0] else []
        lines[statement.lineno - 1 : statement.end_lineno] = spliced
    return "\n".join(lines)
