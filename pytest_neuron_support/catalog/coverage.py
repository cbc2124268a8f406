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

A tag is the catalog's word, so each covering tag is checked against what its checkpoint says it is,
read from the checkpoint's own metadata and never its weights: ``config.json``'s ``model_type`` for
transformers, ``model_index.json``'s ``_class_name`` for a diffusers pipeline (whose family, as
``AutoPipelineForText2Image`` finds it, must be the tag). Each is read from the Hugging Face cache, else
from the Hub API's model info (its ``config``, public for gated repositories too). A tag the checkpoint
contradicts is a **mismatch**: it covers nothing (its architecture is covered only by another entry, or
is missing) and the report is not complete. A tag whose checkpoint could not be read (offline and not
cached, a repository the Hub does not know) is **unverified**: it still covers, on the catalog's word,
and is reported as such.
"""

from __future__ import annotations

import importlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pytest_neuron_support import hub
from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.catalog.load import Catalog
from pytest_neuron_support.tasks.table import TASKS

COVERED, EXCLUDED, MISSING = "covered", "excluded", "missing"
#: What a covering tag is against its checkpoint's own reading.
VERIFIED, MISMATCH, UNVERIFIED = "verified", "mismatch", "unverified"
#: Seconds one model-info request may take: the catalog's ~90 entries are asked side by side, and one
#: that does not answer must not hold the command for the client's retries.
HUB_TIMEOUT_S = 10.0
#: Model-info requests in flight at once.
HUB_WORKERS = 8


@dataclass(frozen=True)
class Reading:
    """What a checkpoint says it is, from its metadata (never its weights).

    Attributes:
        found: ``config.json``'s ``model_type`` (transformers), or ``model_index.json``'s ``_class_name``
            (a diffusers pipeline); None when neither could be read.
        source: where it was read: ``the Hugging Face cache`` or ``the Hub API``.
        error: why it could not be read (``found`` is None).
    """

    found: str | None
    source: str = ""
    error: str | None = None


@dataclass(frozen=True)
class TagCheck:
    """One covering entry's architecture tag against its checkpoint.

    Attributes:
        entry: the catalog entry's id.
        tag: the registry name it carries as a tag.
        status: verified, mismatch or unverified.
        what: what was read, e.g. ``config.json's model_type``.
        found: what the checkpoint says (None: unverified).
        source: where it was read.
        error: why it could not be read (unverified only).
        family: a diffusers pipeline's family, as AutoPipeline finds it from ``found`` (diffusers only).
    """

    entry: str
    tag: str
    status: str
    what: str
    found: str | None = None
    source: str = ""
    error: str | None = None
    family: str | None = None

    def describe(self) -> str:
        """One line saying what the checkpoint says against the tag."""
        if self.status == UNVERIFIED:
            return f"{self.entry}: {self.what} not read ({self.error}): the tag is the catalog's word"
        said = f"its {self.what} is {self.found!r}"
        if self.what.startswith("model_index"):
            said += f" (the family {self.family})" if self.family else " (a class no AutoPipeline family maps)"
        if self.status == MISMATCH:
            return (
                f"{self.entry} is tagged {self.tag}, but {said}, read from {self.source}: it does not cover {self.tag}"
            )
        return f"{self.entry}: {said}, read from {self.source}"


@dataclass(frozen=True)
class Architecture:
    """One architecture a task's registry maps, and where the catalog stands on it.

    Attributes:
        name: its registry key (transformers' ``model_type``, or diffusers' pipeline family).
        model_class: the class the registry maps it to.
        status: covered, excluded or missing.
        entries: the Selected entries that cover it.
        reason: why the catalog leaves it out (excluded only).
        unverified: those of ``entries`` whose checkpoint could not be read, so they cover on the
            catalog's word.
        mismatched: the Selected entries tagged with it whose checkpoint says it is another
            architecture (they cover nothing).
    """

    name: str
    model_class: str
    status: str
    entries: tuple[str, ...] = ()
    reason: str | None = None
    unverified: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()


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
        tags: every Selected entry's architecture tag checked against its checkpoint.
    """

    task: str
    registry: str | None
    architectures: tuple[Architecture, ...] = ()
    stale: tuple[str, ...] = ()
    contradictions: tuple[str, ...] = ()
    tags: tuple[TagCheck, ...] = ()

    def named(self, status: str) -> tuple[Architecture, ...]:
        """Its architectures of one status."""
        return tuple(a for a in self.architectures if a.status == status)

    def checked(self, status: str) -> tuple[TagCheck, ...]:
        """Its tag checks of one status (verified, mismatch, unverified)."""
        return tuple(t for t in self.tags if t.status == status)

    @property
    def complete(self) -> bool:
        """Nothing missing, stale, contradicted or tagged against its checkpoint (an unverified tag is
        reported, not counted against it: offline, no checkpoint of the shipped catalog is cached)."""
        return not (self.named(MISSING) or self.stale or self.contradictions or self.checked(MISMATCH))


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
    # transformers maps names to class names (a tuple of them where one architecture has several heads for the
    # task, as image classification's vit, convnext or levit do); diffusers to the classes themselves.
    names = {str(key): class_names(value) for key, value in mapping.items()}
    return f"{library} {version} {mapping_name}", names


def class_names(value: object) -> str:
    """A registry value's class name(s): ``ViTForImageClassification``, ``A / B`` for a tuple of them."""
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return " / ".join(class_names(v) for v in value)
    return str(getattr(value, "__name__", value))


def task_coverage(catalog: Catalog, task: str, readings: Mapping[str, Reading] | None = None) -> TaskCoverage:
    """Where ``catalog`` stands on every architecture ``task``'s registry maps.

    ``readings``: what each covering entry's checkpoint says it is, by entry id (:func:`read_checkpoints`);
    read here when not given. An entry missing from it is unverified.
    """
    registry = registry_of(task)
    if registry is None:
        return TaskCoverage(task=task, registry=None)
    described, mapping = registry
    entries_of_task = [m for m in catalog.models if m.task == task]
    excluded = catalog.coverage.get(task, {})
    if readings is None:
        readings = read_checkpoints(covering_entries(catalog, task), TASKS[task].library)
    checks = {
        (m.id, tag): check_tag(m.id, tag, readings.get(m.id), TASKS[task].library, mapping)
        for m in entries_of_task
        if m.exclude is None
        for tag in m.tags
        if tag in mapping
    }
    architectures = []
    for name in sorted(mapping):
        tagged = [m for m in entries_of_task if name in m.tags]
        selected = [m.id for m in tagged if m.exclude is None]
        # A tag its checkpoint contradicts covers nothing; one that could not be read covers on its word.
        mismatched = tuple(e for e in selected if checks[e, name].status == MISMATCH)
        entries = tuple(e for e in selected if e not in mismatched)
        unverified = tuple(e for e in entries if checks[e, name].status == UNVERIFIED)
        if entries:
            architectures.append(Architecture(name, mapping[name], COVERED, entries, unverified=unverified))
        elif name in excluded:
            architectures.append(
                Architecture(name, mapping[name], EXCLUDED, reason=excluded[name], mismatched=mismatched)
            )
        elif any(m.exclude for m in tagged):
            # Only entries the catalog excludes (too large, remote code, ...) carry it: their exclusions say why.
            said = "; ".join(f"{m.id} excluded ({m.exclude.reason}: {m.exclude.note})" for m in tagged if m.exclude)
            entries = tuple(m.id for m in tagged if m.exclude)
            architectures.append(Architecture(name, mapping[name], EXCLUDED, entries, said, mismatched=mismatched))
        else:
            architectures.append(Architecture(name, mapping[name], MISSING, mismatched=mismatched))
    covered = {a.name for a in architectures if a.status == COVERED}
    return TaskCoverage(
        task=task,
        registry=described,
        architectures=tuple(architectures),
        stale=tuple(sorted(set(excluded) - set(mapping))),
        contradictions=tuple(sorted(set(excluded) & covered)),
        tags=tuple(checks[key] for key in sorted(checks)),
    )


def coverage(catalog: Catalog, tasks: Sequence[str] | None = None) -> list[TaskCoverage]:
    """Each task's coverage (``tasks``, else every task the catalog has an entry of), in table order."""
    wanted = [name for name in TASKS if name in (set(tasks) if tasks is not None else {m.task for m in catalog.models})]
    by_library: dict[str, list[ModelSpec]] = {}
    for name in wanted:
        if TASKS[name].registry is not None:
            by_library.setdefault(TASKS[name].library, []).extend(covering_entries(catalog, name))
    readings: dict[str, Reading] = {}
    for library, entries in by_library.items():
        readings.update(read_checkpoints(entries, library))
    return [task_coverage(catalog, name, readings) for name in wanted]


#: Where the installed transformers lists the tasks ``transformers.pipeline(task)`` takes.
PIPELINE_REGISTRY = ("transformers.pipelines", "SUPPORTED_TASKS")


@dataclass(frozen=True)
class PipelineTask:
    """One task of the installed transformers' pipeline, against the catalog.

    Attributes:
        name: the pipeline task (``fill-mask``).
        status: covered (the suite has a task row of that name and the catalog Selected entries of it),
            excluded (the catalog's ``coverage: pipeline-tasks:`` leaves it out) or missing.
        said: the entries that cover it, the exclusion's reason, or why it is missing.
    """

    name: str
    status: str
    said: str


@dataclass(frozen=True)
class PipelineCoverage:
    """Every task of the installed transformers' pipeline (:data:`PIPELINE_REGISTRY`), covered, excluded or
    missing; ``stale``: exclusions naming a task the installed transformers has not; ``contradictions``:
    exclusions of a covered task."""

    registry: str
    tasks: tuple[PipelineTask, ...]
    stale: tuple[str, ...] = ()
    contradictions: tuple[str, ...] = ()

    def named(self, status: str) -> tuple[PipelineTask, ...]:
        return tuple(t for t in self.tasks if t.status == status)


def pipeline_coverage(catalog: Catalog) -> PipelineCoverage:
    """Where ``catalog`` stands on each task the installed ``transformers.pipeline`` takes. A task is covered
    only by a row of the suite's task table with Selected entries: a task with no row is missing, however many
    architectures it has, until its row and its checkpoints are added or the catalog says why not."""
    module_name, mapping_name = PIPELINE_REGISTRY
    supported = getattr(importlib.import_module(module_name), mapping_name)
    version = importlib.import_module("transformers").__version__
    excluded = catalog.pipeline_coverage
    tasks = []
    # A task's rows: more than one where a pipeline tag has two paths (Whisper's and a CTC recogniser's).
    tags = {task.pipeline_tag for task in TASKS.values()}
    for name in sorted(supported):
        selected = [m.id for m in catalog.models if TASKS[m.task].pipeline_tag == name and m.exclude is None]
        if name in tags and selected:
            shown = ", ".join(selected[:3]) + (f" and {len(selected) - 3} more" if len(selected) > 3 else "")
            tasks.append(PipelineTask(name, COVERED, shown))
        elif name in excluded:
            tasks.append(PipelineTask(name, EXCLUDED, excluded[name]))
        elif name in tags:
            tasks.append(PipelineTask(name, MISSING, "the suite has its task row, but no Selected entry of it"))
        else:
            tasks.append(PipelineTask(name, MISSING, "no task row in the suite's task table (tasks/table.py)"))
    covered = {t.name for t in tasks if t.status == COVERED}
    return PipelineCoverage(
        registry=f"transformers {version} {mapping_name}",
        tasks=tuple(tasks),
        stale=tuple(sorted(set(excluded) - set(supported))),
        contradictions=tuple(sorted(set(excluded) & covered)),
    )


def covering_entries(catalog: Catalog, task: str) -> list[ModelSpec]:
    """The Selected entries of ``task`` that carry one of its registry's names as a tag: those whose
    checkpoint is read."""
    registry = registry_of(task)
    if registry is None:
        return []
    names = registry[1]
    return [m for m in catalog.models if m.task == task and m.exclude is None and any(t in names for t in m.tags)]


def metadata_file(library: str) -> tuple[str, str]:
    """(the file, its field) that says what a checkpoint of ``library`` is."""
    return ("model_index.json", "_class_name") if library == "diffusers" else ("config.json", "model_type")


def read_checkpoints(models: Iterable[ModelSpec], library: str) -> dict[str, Reading]:
    """What each model's checkpoint says it is, by id: from the Hugging Face cache, else (when the Hub
    can be reached) from the Hub API's model info, side by side. Never a weight file."""
    filename, key = metadata_file(library)
    readings: dict[str, Reading] = {}
    uncached: list[ModelSpec] = []
    for model in models:
        cached = hub.cached_file(model.id, filename, revision=model.revision)
        if cached is None:
            uncached.append(model)
        else:
            readings[model.id] = _read_cached(cached, filename, key)
    if not uncached:
        return readings
    # Asked once: without a network (or offline) every entry is told why at once, not after its retries.
    why = hub.unreachable()
    if why is not None:
        said = f"not in the Hugging Face cache, and the Hub was not asked: {why}"
        return {**readings, **{m.id: Reading(None, error=said) for m in uncached}}
    with ThreadPoolExecutor(max_workers=HUB_WORKERS) as pool:
        for model, reading in zip(uncached, pool.map(lambda m: _hub_reading(m, library), uncached), strict=True):
            readings[model.id] = reading
    return readings


def check_tag(entry: str, tag: str, reading: Reading | None, library: str, mapping: Mapping[str, str]) -> TagCheck:
    """``entry``'s tag ``tag`` against its checkpoint's reading: transformers' ``model_type`` must be the
    tag; a diffusers pipeline's ``_class_name`` must be the class the tag's family maps to, or a class
    AutoPipeline files under that family (a decoder or connected pipeline)."""
    filename, key = metadata_file(library)
    what = f"{filename}'s {key}"
    if reading is None or reading.found is None:
        error = reading.error if reading is not None else "not read"
        return TagCheck(entry, tag, UNVERIFIED, what, error=error or "not read")
    found = reading.found
    if library == "diffusers":
        family = diffusers_family(found)
        status = VERIFIED if found == mapping[tag] or family == tag else MISMATCH
        return TagCheck(entry, tag, status, what, found, reading.source, family=family)
    return TagCheck(entry, tag, VERIFIED if found == tag else MISMATCH, what, found, reading.source)


def diffusers_family(class_name: str) -> str | None:
    """The family AutoPipeline files a pipeline class under (the first of its task mappings that has it,
    as ``diffusers.pipelines.auto_pipeline`` looks it up), None for a class none maps."""
    from diffusers.pipelines import auto_pipeline

    # Typed as a list of objects in diffusers; each is an OrderedDict of family -> pipeline class.
    mappings: list[Mapping[str, type]] = auto_pipeline.SUPPORTED_TASKS_MAPPINGS  # type: ignore[assignment]
    for mapping in mappings:
        for family, pipeline in mapping.items():
            if pipeline.__name__ == class_name:
                return str(family)
    return None


def tag_lines(task: TaskCoverage, *, every: bool) -> list[str]:
    """What ``neuron-support coverage`` prints about a task's tags: every mismatch; the unverified ones
    one by one with ``every`` (``--list``), else one line counting them by reason."""
    lines = [f"  mismatch {t.tag}: {t.describe()}" for t in task.checked(MISMATCH)]
    unverified = task.checked(UNVERIFIED)
    if every:
        lines += [f"  unverified {t.tag}: {t.describe()}" for t in unverified]
    elif unverified:
        reasons = Counter(t.error for t in unverified)
        said = "; ".join(f"{n} {why}" for why, n in reasons.most_common(3))
        more = f"; {len(reasons) - 3} other reason(s)" if len(reasons) > 3 else ""
        lines.append(
            f"  unverified {len(unverified)} tag(s) not checked against their checkpoint, counted covered on the "
            f"catalog's word ({said}{more}); --list names each"
        )
    return lines


def _read_cached(path: Path, filename: str, key: str) -> Reading:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Reading(None, error=f"{filename} in the Hugging Face cache is unreadable: {type(exc).__name__}")
    value = document.get(key) if isinstance(document, dict) else None
    if not isinstance(value, str) or not value:
        return Reading(None, error=f"{filename} in the Hugging Face cache has no {key}")
    return Reading(value, "the Hugging Face cache")


def _hub_reading(model: ModelSpec, library: str) -> Reading:
    """The model info's ``config`` (the Hub's reading of config.json, with a diffusers pipeline's
    model_index.json under ``diffusers``): public for gated repositories, and no file is downloaded."""
    from huggingface_hub import HfApi

    key = metadata_file(library)[1]
    try:
        info = HfApi(endpoint=hub.hub_endpoint()).model_info(
            model.id, revision=model.revision, expand=["config"], timeout=HUB_TIMEOUT_S
        )
    # The client raises a zoo of types here (not found, revision not found, HTTP, timeouts); each
    # means the same: this checkpoint's tag cannot be checked.
    except Exception as exc:
        return Reading(None, error=f"not in the Hugging Face cache, and the Hub API answered {_brief(exc)}")
    config: Mapping[str, object] = info.config if isinstance(info.config, dict) else {}
    if library == "diffusers":
        inner = config.get("diffusers")
        config = inner if isinstance(inner, dict) else {}
    value = config.get(key)
    if not isinstance(value, str) or not value:
        return Reading(None, error=f"not in the Hugging Face cache, and the Hub API's model info has no {key}")
    return Reading(value, "the Hub API")


def _brief(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{'HTTP ' + str(status) + ' ' if isinstance(status, int) else ''}{type(exc).__name__}: {first}"[:200]
