"""Registry coverage: which of the installed libraries' architectures the catalog checks.

For each task with a registry (the task table's ``registry``: transformers' auto-model mapping for
it, or diffusers' text-to-image AutoPipeline mapping), every architecture it maps is

- **covered**: a Selected entry of that task (not excluded) carries the architecture's name as a tag
  (the shipped catalog tags each entry with its ``model_type`` first);
- **excluded**: the catalog's top-level ``coverage:`` leaves it out, with a reason, or only entries the
  catalog excludes (too large, remote code) carry it, with theirs;
- **missing**: neither. A new transformers release adds architectures silently; here each one shows up
  as missing until someone selects a checkpoint or says why not (as vLLM's registry-coverage test does).

An exclusion naming an architecture the library no longer maps is **stale**, and one that a Selected
entry covers too **contradicts** it: both are reported, so the list stays true.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_neuron_support.catalog.load import Catalog
from pytest_neuron_support.tasks.table import TASKS

COVERED, EXCLUDED, MISSING = "covered", "excluded", "missing"


@dataclass(frozen=True)
class Architecture:
    """One architecture a task's registry maps, and where the catalog stands on it.

    Attributes:
        name: its registry key (transformers' ``model_type``, or diffusers' pipeline family).
        model_class: the class the registry maps it to.
        status: covered, excluded or missing.
        entries: the Selected entries that cover it.
        reason: why the catalog leaves it out (excluded only).
    """

    name: str
    model_class: str
    status: str
    entries: tuple[str, ...] = ()
    reason: str | None = None


@dataclass(frozen=True)
class TaskCoverage:
    """A task's registry against the catalog.

    Attributes:
        task: the catalog task.
        registry: the registry read, e.g. ``transformers 5.24.0 MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``; None
            for a task without one (then ``architectures`` is empty).
        architectures: every architecture the registry maps, by name.
        stale: excluded names the registry does not map (left over from an older release).
        contradictions: excluded names a Selected entry covers too.
    """

    task: str
    registry: str | None
    architectures: tuple[Architecture, ...] = ()
    stale: tuple[str, ...] = ()
    contradictions: tuple[str, ...] = ()

    def named(self, status: str) -> tuple[Architecture, ...]:
        """Its architectures of one status."""
        return tuple(a for a in self.architectures if a.status == status)

    @property
    def complete(self) -> bool:
        """Nothing missing, stale or contradicted."""
        return not (self.named(MISSING) or self.stale or self.contradictions)


def registry_of(task: str) -> tuple[str, Mapping[str, str]] | None:
    """The installed registry of ``task`` (its description and name -> class), None where it has none."""
    where = TASKS[task].registry
    if where is None:
        return None
    module_name, mapping_name = where
    module = importlib.import_module(module_name)
    library = module_name.split(".", 1)[0]
    version = importlib.import_module(library).__version__
    mapping = getattr(module, mapping_name)
    # transformers maps names to class names; diffusers to the classes themselves.
    names = {str(key): value if isinstance(value, str) else value.__name__ for key, value in mapping.items()}
    return f"{library} {version} {mapping_name}", names


def task_coverage(catalog: Catalog, task: str) -> TaskCoverage:
    """Where ``catalog`` stands on every architecture ``task``'s registry maps."""
    registry = registry_of(task)
    if registry is None:
        return TaskCoverage(task=task, registry=None)
    described, mapping = registry
    entries_of_task = [m for m in catalog.models if m.task == task]
    excluded = catalog.coverage.get(task, {})
    architectures = []
    for name in sorted(mapping):
        tagged = [m for m in entries_of_task if name in m.tags]
        entries = tuple(m.id for m in tagged if m.exclude is None)
        if entries:
            architectures.append(Architecture(name, mapping[name], COVERED, entries))
        elif name in excluded:
            architectures.append(Architecture(name, mapping[name], EXCLUDED, reason=excluded[name]))
        elif tagged:
            # Only entries the catalog excludes (too large, remote code, ...) carry it: their exclusions say why.
            said = "; ".join(f"{m.id} excluded ({m.exclude.reason}: {m.exclude.note})" for m in tagged if m.exclude)
            architectures.append(Architecture(name, mapping[name], EXCLUDED, tuple(m.id for m in tagged), said))
        else:
            architectures.append(Architecture(name, mapping[name], MISSING))
    covered = {a.name for a in architectures if a.status == COVERED}
    return TaskCoverage(
        task=task,
        registry=described,
        architectures=tuple(architectures),
        stale=tuple(sorted(set(excluded) - set(mapping))),
        contradictions=tuple(sorted(set(excluded) & covered)),
    )


def coverage(catalog: Catalog, tasks: Sequence[str] | None = None) -> list[TaskCoverage]:
    """Each task's coverage (``tasks``, else every task the catalog has an entry of), in table order."""
    wanted = set(tasks) if tasks is not None else {m.task for m in catalog.models}
    return [task_coverage(catalog, name) for name in TASKS if name in wanted]
