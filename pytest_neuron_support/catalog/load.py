"""The model catalog: ``models.yaml`` parsed once into frozen, typed specs.

A malformed file stops the run with one :class:`CatalogError` that names the file, the
line, the entry, the field, the bad value and what is allowed, so the fix is obvious
without reading this code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from pytest_neuron_support.base.model import (
    CORE_COUNTS,
    DEFAULT_CHECKS,
    DEFAULT_DTYPE,
    DEFAULT_REVISION,
    DTYPES,
    EXCLUDE_REASONS,
    EXPECTED_RESULTS,
    Exclusion,
    Expectation,
    ModelSpec,
)
from pytest_neuron_support.checks.registry import CHECKS, KINDS
from pytest_neuron_support.data.records import STAGES
from pytest_neuron_support.tasks.table import TASKS as TASK_TABLE

#: The catalog's task names, from the one task table (tasks/table.py).
TASKS: tuple[str, ...] = tuple(TASK_TABLE)

# The Hub's repo-name rules: letters, digits, '-', '_', '.'; no leading/trailing '-' or '.',
# no '--' or '..', at most 96 characters per part. Anchored so no entry can be a path.
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^{_HUB_PART}/{_HUB_PART}$")

#: What a catalog's rows say they came from (its top-level ``source:``): the Selected catalog and its like,
#: or the compile-readiness census (benchmarks/census.py), whose rows the viewer shows apart.
SOURCES: tuple[str, ...] = ("catalog", "census")

#: The fields a catalog entry may set.
ENTRY_FIELDS: tuple[str, ...] = (
    "id",
    "task",
    "revision",
    "dtype",
    "prompt",
    "cores",
    "trust_remote_code",
    "extra_packages",
    "exclude",
    "tags",
    "min_cosine",
    "timeout",
    "checks",
    "expect",
)
_EXCLUDE_FIELDS: tuple[str, ...] = ("reason", "note")
_EXPECT_FIELDS: tuple[str, ...] = ("result", "reason", "check", "stage", "signature", "recompiles")
#: How an ``expect:`` is written (the errors' fix).
EXPECT_EXAMPLE = (
    "write e.g. 'expect: {result: FAIL, stage: parity, reason: \"https://github.com/org/repo/issues/1\"}', or "
    "'expect: {result: PASS, recompiles: true, reason: ...}' for a known recompile"
)
#: The entry fields that say how one model is checked (what ``@pytest.mark.neuron_model`` may set too);
#: the others place it in a catalog (its id, exclusion, tags, packages, checks).
MODEL_FIELDS: tuple[str, ...] = tuple(
    name for name in ENTRY_FIELDS if name not in ("id", "extra_packages", "exclude", "tags", "checks", "expect")
)


class CatalogError(ValueError):
    """A catalog or command-line value that cannot be used, with everything needed to fix it."""

    def __init__(
        self,
        file: str,
        message: str,
        *,
        line: int | None = None,
        entry: str | None = None,
        field: str | None = None,
        value: object = None,
        fix: str | None = None,
    ) -> None:
        where = file if line is None else f"{file}:{line}"
        parts = [where]
        if entry is not None:
            parts.append(f"entry {entry!r}")
        if field is not None:
            parts.append(f"field {field!r}")
        text = ": ".join(parts) + f": {message}"
        if value is not None:
            text += f" (got {value!r})"
        if fix:
            text += f"; {fix}"
        super().__init__(text)
        self.file, self.line, self.entry, self.field, self.value, self.fix = file, line, entry, field, value, fix


def is_hub_id(text: str) -> bool:
    """True for ``org/name`` in the Hub's character set (never a filesystem path)."""
    return bool(_HUB_ID.match(text)) and ".." not in text and "--" not in text


@dataclass(frozen=True)
class Catalog:
    """A parsed catalog file: its entries in file order.

    Attributes:
        path: the file.
        models: entries in file order.
        judge_model: the catalog's fluency judge for sharded runs (top-level ``judge: {model,
            revision}``), None for the default; ``--judge-model`` overrides it. A catalog of
            tiny random models names a judge that exists offline.
        judge_revision: its revision.
        coverage: the architectures the catalog deliberately leaves out, per task (top-level
            ``coverage: {<task>: [{reason, architectures: [...]}, ...]}``): architecture -> reason.
            ``neuron-support coverage`` (catalog/coverage.py) marks them excluded.
        pipeline_coverage: the installed transformers' pipeline tasks the catalog deliberately leaves out
            (``coverage: {pipeline-tasks: [{reason, tasks: [...]}, ...]}``): task -> reason.
    """

    path: Path
    models: tuple[ModelSpec, ...]
    judge_model: str | None = None
    judge_revision: str = DEFAULT_REVISION
    coverage: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    pipeline_coverage: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def load_catalog(path: Path) -> Catalog:
    """Parse and validate a catalog file; raise :class:`CatalogError` on the first problem."""
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError(shown, "file not found", fix="pass an existing file with --models-file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(shown, f"cannot read file: {exc}", fix="check its permissions and encoding") from None
    return parse_catalog(text, shown, path)


def parse_catalog(text: str, shown: str, path: Path | None = None) -> Catalog:
    """Parse catalog YAML ``text``; ``shown`` names the file in errors."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise CatalogError(shown, f"YAML syntax error: {problem}", line=line, fix="fix the YAML syntax") from None
    finally:
        loader.dispose()
    if root is None:
        raise CatalogError(shown, "file is empty", fix="add a top-level 'models:' list")
    if not isinstance(root, yaml.MappingNode):
        raise CatalogError(
            shown, "top level must be a mapping", line=root.start_mark.line + 1, fix="start the file with 'models:'"
        )
    models_node: yaml.Node | None = None
    judge: tuple[str | None, str] = (None, DEFAULT_REVISION)
    coverage: Mapping[str, Mapping[str, str]] = MappingProxyType({})
    pipeline_coverage: Mapping[str, str] = MappingProxyType({})
    source = "catalog"
    for key_node, value_node in root.value:
        if key_node.value == "judge":
            judge = _parse_judge(value_node, shown)
            continue
        if key_node.value == "coverage":
            coverage, pipeline_coverage = _parse_coverage(value_node, shown)
            continue
        if key_node.value == "source":
            source = _construct(value_node)
            if source not in SOURCES:
                raise CatalogError(
                    shown,
                    "unknown catalog source",
                    line=value_node.start_mark.line + 1,
                    field="source",
                    value=source,
                    fix=f"use one of {', '.join(SOURCES)} (census: benchmarks/census.py's catalog)",
                )
            continue
        if key_node.value != "models":
            raise CatalogError(
                shown,
                f"unknown top-level key {key_node.value!r}",
                line=key_node.start_mark.line + 1,
                fix="top-level keys are 'models', 'judge', 'coverage' and 'source'",
            )
        models_node = value_node
    if models_node is None or not isinstance(models_node, yaml.SequenceNode):
        line = None if models_node is None else models_node.start_mark.line + 1
        raise CatalogError(
            shown, "'models' must be a list of entries", line=line, fix="write 'models:' then '- id: org/name' items"
        )
    specs: list[ModelSpec] = []
    seen: dict[str, int] = {}
    for node in models_node.value:
        spec = _parse_entry(node, shown, source)
        if spec.id in seen:
            raise CatalogError(
                shown,
                f"duplicate id (first at line {seen[spec.id]})",
                line=spec.line,
                entry=spec.id,
                field="id",
                value=spec.id,
                fix="list each model once",
            )
        seen[spec.id] = spec.line
        specs.append(spec)
    return Catalog(
        path=path or Path(shown),
        models=tuple(specs),
        judge_model=judge[0],
        judge_revision=judge[1],
        coverage=coverage,
        pipeline_coverage=pipeline_coverage,
    )


#: How a ``coverage:`` exclusion is written (the errors' fix).
COVERAGE_EXAMPLE = (
    "write 'coverage:' then '  text-generation:' then '    - {reason: \"why\", architectures: [bert, bart]}'"
)


#: The ``coverage:`` key whose groups leave out transformers pipeline tasks (``tasks:``), not architectures.
PIPELINE_TASKS_KEY = "pipeline-tasks"


def _parse_coverage(node: yaml.Node, shown: str) -> tuple[Mapping[str, Mapping[str, str]], Mapping[str, str]]:
    """The top-level ``coverage:``: per task, groups of architectures left out with one reason each; under
    :data:`PIPELINE_TASKS_KEY`, groups of transformers pipeline tasks left out with one reason each."""
    if not isinstance(node, yaml.MappingNode):
        raise CatalogError(
            shown, "'coverage' must be a mapping of tasks", line=node.start_mark.line + 1, fix=COVERAGE_EXAMPLE
        )
    tracked = [name for name, task in TASK_TABLE.items() if task.registry is not None]
    coverage: dict[str, Mapping[str, str]] = {}
    pipeline_tasks: Mapping[str, str] = MappingProxyType({})
    for task_node, groups_node in node.value:
        task, line = task_node.value, task_node.start_mark.line + 1
        if task == PIPELINE_TASKS_KEY:
            pipeline_tasks = MappingProxyType(_exclusion_groups(groups_node, shown, task, line, "tasks"))
            continue
        if task not in tracked:
            raise CatalogError(
                shown,
                "not a task whose architectures coverage tracks",
                line=line,
                field="coverage",
                value=task,
                fix=f"use one of {', '.join(tracked)}",
            )
        coverage[task] = MappingProxyType(_exclusion_groups(groups_node, shown, task, line, "architectures"))
    return MappingProxyType(coverage), pipeline_tasks


def _exclusion_groups(groups_node: yaml.Node, shown: str, task: str, line: int, listed: str) -> dict[str, str]:
    """One ``coverage:`` key's groups, each exactly a ``reason`` and a non-empty ``listed`` list of names
    (``architectures``, or ``tasks`` under :data:`PIPELINE_TASKS_KEY`): name -> reason."""
    example = (
        COVERAGE_EXAMPLE
        if listed == "architectures"
        else f"write 'coverage:' then '  {PIPELINE_TASKS_KEY}:' then '    - {{reason: \"why\", tasks: [decision]}}'"
    )
    what = "architecture" if listed == "architectures" else "pipeline task"
    if not isinstance(groups_node, yaml.SequenceNode):
        raise CatalogError(
            shown, f"coverage of {task} must be a list of groups", line=line, field="coverage", fix=example
        )
    reasons: dict[str, str] = {}
    first: dict[str, int] = {}
    for group_node in groups_node.value:
        group, at = _construct(group_node), group_node.start_mark.line + 1
        if not isinstance(group, dict) or set(group) != {"reason", listed}:
            raise CatalogError(
                shown,
                f"each group under coverage: {task} needs exactly 'reason' and '{listed}'",
                line=at,
                field="coverage",
                value=group,
                fix=example,
            )
        reason, names = group["reason"], group[listed]
        if not isinstance(reason, str) or not reason.strip():
            raise CatalogError(
                shown,
                "a coverage exclusion needs its reason",
                line=at,
                field="coverage",
                value=reason,
                fix=f"say why these {what}s are left out",
            )
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise CatalogError(
                shown,
                f"'{listed}' must be a non-empty list of names",
                line=at,
                field="coverage",
                value=names,
                fix="list model_type names, e.g. [bert, bart]"
                if listed == "architectures"
                else "list pipeline task names",
            )
        for name in names:
            if name in first:
                raise CatalogError(
                    shown,
                    f"{what} excluded twice under coverage: {task} (first at line {first[name]})",
                    line=at,
                    field="coverage",
                    value=name,
                    fix=f"list each {what} in one group",
                )
            first[name] = at
            reasons[name] = reason.strip()
    return reasons


def _parse_judge(node: yaml.Node, shown: str) -> tuple[str | None, str]:
    value = _construct(node)
    line = node.start_mark.line + 1
    if not isinstance(value, dict) or set(value) - {"model", "revision"} or not isinstance(value.get("model"), str):
        raise CatalogError(
            shown,
            "'judge' must be a mapping with 'model' (and optionally 'revision')",
            line=line,
            field="judge",
            value=value,
            fix="write 'judge: {model: org/name}'",
        )
    if not is_hub_id(value["model"]):
        raise CatalogError(
            shown, "judge model is not a Hub id", line=line, field="judge", value=value["model"], fix="use 'org/name'"
        )
    revision = value.get("revision", DEFAULT_REVISION)
    if not isinstance(revision, str):
        raise CatalogError(
            shown, "judge revision must be a string", line=line, field="judge", value=revision, fix="quote the revision"
        )
    return value["model"], revision


def _construct(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _parse_entry(node: yaml.Node, shown: str, source: str = "catalog") -> ModelSpec:
    line = node.start_mark.line + 1
    if not isinstance(node, yaml.MappingNode):
        raise CatalogError(
            shown,
            "each entry must be a mapping with at least 'id' and 'task'",
            line=line,
            value=_construct(node),
            fix="write '- id: org/name' then '  task: text-generation'",
        )
    raw: dict[str, tuple[Any, int]] = {}
    for key_node, value_node in node.value:
        raw[str(key_node.value)] = (_construct(value_node), value_node.start_mark.line + 1)
    entry_id = raw.get("id", (None, line))[0]
    entry = entry_id if isinstance(entry_id, str) else None
    for key, (_, key_line) in raw.items():
        if key not in ENTRY_FIELDS:
            raise CatalogError(
                shown,
                "unknown field",
                line=key_line,
                entry=entry,
                field=key,
                fix=f"allowed fields: {', '.join(ENTRY_FIELDS)}",
            )

    def err(fieldname: str, message: str, value: object, fix: str) -> CatalogError:
        return CatalogError(
            shown, message, line=raw.get(fieldname, (None, line))[1], entry=entry, field=fieldname, value=value, fix=fix
        )

    if "id" not in raw:
        raise CatalogError(shown, "missing required field 'id'", line=line, fix="add 'id: org/name'")
    if not isinstance(entry_id, str) or not is_hub_id(entry_id):
        raise err(
            "id",
            "not a Hub model id",
            entry_id,
            "use 'org/name' with letters, digits, '-', '_' or '.' (local checkpoints go through --model ./dir)",
        )
    task = raw.get("task", (None, line))[0]
    if "task" not in raw:
        raise CatalogError(
            shown,
            "missing required field 'task'",
            line=line,
            entry=entry,
            fix=f"add 'task:' with one of {', '.join(TASKS)}",
        )
    if task not in TASKS:
        raise err("task", "unknown task", task, f"use one of {', '.join(TASKS)}")
    revision = _opt_str(raw, "revision", DEFAULT_REVISION, err)
    dtype = _opt_str(raw, "dtype", DEFAULT_DTYPE, err)
    if dtype not in DTYPES:
        raise err("dtype", "unknown dtype", dtype, f"use one of {', '.join(DTYPES)}")
    prompt = _opt_str(raw, "prompt", None, err)
    if prompt is not None and not prompt.strip():
        raise err("prompt", "prompt is empty", prompt, "write some text or drop the field")
    if prompt is not None and not TASK_TABLE[task].takes_prompt:
        raise err(
            "prompt",
            f"a {task} entry takes no prompt: {TASK_TABLE[task].fixed_input}",
            prompt,
            "drop the field (docs/tasks.md says what it is fed)",
        )
    min_cosine = _parse_min_cosine(raw, task, err)
    timeout = raw.get("timeout", (None, line))[0]
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise err("timeout", "must be a positive number of seconds", timeout, "write e.g. 'timeout: 1800', or drop it")
    cores_value, cores_line = raw.get("cores", (None, line))
    cores = check_cores(cores_value, shown, line=cores_line, entry=entry)
    trust = raw.get("trust_remote_code", (False, line))[0]
    if not isinstance(trust, bool):
        raise err("trust_remote_code", "must be true or false", trust, "write true or false")
    extra = _str_list(raw, "extra_packages", err)
    tags = _str_list(raw, "tags", err)
    exclusion = _parse_exclude(raw, err)
    checks = _parse_checks(raw, task, err)
    expect = _parse_expect(raw, checks, err)
    return ModelSpec(
        id=entry_id,
        task=task,
        revision=revision or DEFAULT_REVISION,
        dtype=dtype or DEFAULT_DTYPE,
        prompt=prompt,
        cores=cores,
        trust_remote_code=trust,
        extra_packages=extra,
        exclude=exclusion,
        tags=tags,
        source=source,
        line=line,
        min_cosine=min_cosine,
        timeout=None if timeout is None else float(timeout),
        checks=checks,
        expect=expect,
    )


def _parse_checks(raw: Mapping[str, tuple[Any, int]], task: str, err: Any) -> tuple[str, ...]:
    if "checks" not in raw or raw["checks"][0] is None:
        return DEFAULT_CHECKS
    value = raw["checks"][0]
    allowed = ", ".join(CHECKS)
    if not isinstance(value, list) or not value:
        raise err(
            "checks",
            "must be a non-empty list of checks",
            value,
            f"write e.g. 'checks: [inference, train]' ({allowed})",
        )
    for check in value:
        if check not in CHECKS:
            raise err("checks", "unknown check", check, f"use one of {allowed}")
    if len(set(value)) != len(value):
        raise err("checks", "lists a check twice", value, "list each check once")
    for check in value:
        kind = KINDS[check]
        if not kind.applies_to(TASK_TABLE[task]):
            applies = [name for name, row in TASK_TABLE.items() if kind.applies_to(row)]
            raise err(
                "checks",
                f"the {check} check ({kind.summary}): it applies to {', '.join(applies)} only, not {task}",
                value,
                f"drop '{check}' from this entry's checks",
            )
    # Kept in the table's order, so an entry's items are the same whatever order it lists them in.
    return tuple(check for check in CHECKS if check in value)


def _parse_min_cosine(raw: Mapping[str, tuple[Any, int]], task: str, err: Any) -> float | None:
    if "min_cosine" not in raw or raw["min_cosine"][0] is None:
        return None
    value = raw["min_cosine"][0]
    if not TASK_TABLE[task].cosine:
        cosine = [name for name, row in TASK_TABLE.items() if row.cosine]
        raise err(
            "min_cosine",
            f"only embedding tasks ({', '.join(cosine)}) are judged by cosine similarity",
            value,
            "drop the field, or set the task to one of those",
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise err("min_cosine", "must be a number in (0, 1]", value, "write e.g. 'min_cosine: 0.999'")
    return float(value)


def _opt_str(raw: Mapping[str, tuple[Any, int]], name: str, default: str | None, err: Any) -> str | None:
    if name not in raw or raw[name][0] is None:
        return default
    value = raw[name][0]
    if not isinstance(value, str):
        raise err(name, "must be a string", value, "quote the value")
    return value


def _str_list(raw: Mapping[str, tuple[Any, int]], name: str, err: Any) -> tuple[str, ...]:
    if name not in raw or raw[name][0] is None:
        return ()
    value = raw[name][0]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise err(name, "must be a list of non-empty strings", value, f"write '{name}: [a, b]'")
    return tuple(value)


def _parse_expect(raw: Mapping[str, tuple[Any, int]], checks: Sequence[str], err: Any) -> Expectation | None:
    """An entry's ``expect:`` (its known outcome and why), validated field by field."""
    if "expect" not in raw or raw["expect"][0] is None:
        return None
    value = raw["expect"][0]
    if not isinstance(value, dict):
        raise err("expect", "must be a mapping", value, EXPECT_EXAMPLE)
    for key in value:
        if key not in _EXPECT_FIELDS:
            raise err("expect", f"unknown key {key!r} under expect", key, f"allowed keys: {', '.join(_EXPECT_FIELDS)}")
    result = value.get("result")
    if result not in EXPECTED_RESULTS:
        raise err("expect", "unknown expected result", result, f"use one of {', '.join(EXPECTED_RESULTS)}")
    reason = value.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise err(
            "expect", "an expectation needs its reason", reason, "add 'reason:' with the upstream issue's URL, or why"
        )
    check = value.get("check", "inference")
    if check not in checks:
        raise err("expect", "names a check this entry does not make", check, f"use one of {', '.join(checks)}")
    stage, signature, recompiles = value.get("stage"), value.get("signature"), value.get("recompiles", False)
    if stage is not None and stage not in STAGES:
        raise err("expect", "unknown stage", stage, f"use one of {', '.join(STAGES)}")
    if signature is not None and (not isinstance(signature, str) or not signature.strip()):
        raise err("expect", "signature must be text", signature, "quote the start of the row's failure signature")
    if not isinstance(recompiles, bool):
        raise err("expect", "recompiles must be true or false", recompiles, "write 'recompiles: true'")
    if result == "PASS" and not recompiles:
        raise err("expect", "an expected PASS with nothing known about it is no expectation", value, EXPECT_EXAMPLE)
    if result == "PASS" and (stage is not None or signature is not None):
        raise err("expect", "a PASS has no failure stage or signature", value, "drop stage and signature")
    if result != "PASS" and stage is None and signature is None:
        # Without either, any failure of that result would count as the known one: a new bug at another
        # stage would be an XFAIL, and the gate would call it expected.
        raise err(
            "expect",
            f"an expected {result} must name the stage it fails at or the start of its failure signature",
            value,
            f"add 'stage:' (one of {', '.join(STAGES)}) or 'signature:' (neuron-support failures lists them), "
            "as the failing row's failure_stage and signature say",
        )
    return Expectation(
        result=result, reason=reason.strip(), check=check, stage=stage, signature=signature, recompiles=recompiles
    )


def _parse_exclude(raw: Mapping[str, tuple[Any, int]], err: Any) -> Exclusion | None:
    if "exclude" not in raw or raw["exclude"][0] is None:
        return None
    value = raw["exclude"][0]
    if not isinstance(value, dict):
        raise err("exclude", "must be a mapping", value, "write 'exclude: {reason: too-large, note: ...}'")
    for key in value:
        if key not in _EXCLUDE_FIELDS:
            raise err("exclude", f"unknown key {key!r} under exclude", key, "allowed keys: reason, note")
    reason = value.get("reason")
    if reason not in EXCLUDE_REASONS:
        raise err("exclude", "unknown exclusion reason", reason, f"use one of {', '.join(EXCLUDE_REASONS)}")
    note = value.get("note", "")
    if not isinstance(note, str):
        raise err("exclude", "note must be a string", note, "quote the note")
    return Exclusion(reason=reason, note=note)


def check_cores(
    value: object, source: str, *, line: int | None = None, entry: str | None = None, field: str | None = "cores"
) -> int | None:
    """The core count a catalog entry's ``cores:`` or a marker (``neuron_cores(n)``, ``neuron_model(cores=n)``)
    sets, None when it sets none: one rule wherever the count comes from, so a count the catalog refuses
    is never a marker's SKIP. :class:`CatalogError` names ``source`` (file and line, or the marker) and the
    allowed counts."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in CORE_COUNTS:
        raise CatalogError(
            source,
            "not an allowed core count",
            line=line,
            entry=entry,
            field=field,
            value=value,
            fix=f"use one of {', '.join(map(str, CORE_COUNTS))}",
        )
    return value


def cli_model(arg: str) -> ModelSpec:
    """A ``--model`` argument: a Hub id, or an existing local directory written as a path."""
    if arg.startswith((".", "/", "~")):
        # Absolute but not resolved: a symlink keeps the name the user gave it, which is the item's id
        # (``-k link`` selects ``--model=./link``); loading follows the link all the same.
        directory = Path(os.path.abspath(Path(arg).expanduser()))
        if not directory.is_dir():
            raise CatalogError(
                "--model",
                "local checkpoint directory does not exist",
                value=arg,
                fix="name an existing directory that holds config.json",
            )
        return ModelSpec(id=str(directory), source="local")
    if not is_hub_id(arg):
        raise CatalogError(
            "--model",
            "not a Hub model id",
            value=arg,
            fix="use 'org/name', or './path' for a local checkpoint directory",
        )
    return ModelSpec(id=arg, source="cli")


def merge_models(catalog: Sequence[ModelSpec], extra: Sequence[ModelSpec]) -> tuple[ModelSpec, ...]:
    """Catalog entries followed by ``--model`` additions not already in the catalog."""
    known = {m.id for m in catalog}
    return tuple(catalog) + tuple(m for m in extra if m.id not in known)
