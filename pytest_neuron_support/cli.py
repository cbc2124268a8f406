"""The ``neuron-support`` command: build the tiny zoo, look rows up, group failures by signature,
rerun one, render the viewer, sync NEFF caches."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports its commands' modules lazily, when a command runs
    from pytest_neuron_support.catalog.load import Catalog


def _zoo_build(args: argparse.Namespace) -> int:
    from pytest_neuron_support import zoo

    names = args.only or None
    # The causal LMs by architecture; the text-to-image pipeline, the Whisper, the T5 and the forward tasks' models
    # by their repos' names.
    others = (zoo.PIPELINE_REPO, zoo.WHISPER_REPO, zoo.SEQ2SEQ_REPO, *zoo.FORWARD_REPOS.values())
    known = {a.name for a in zoo.ARCHS} | {repo.split("/")[1] for repo in others}
    unknown = sorted(set(names or ()) - known)
    if unknown:
        print(
            f"neuron-support zoo build: unknown architecture(s) {', '.join(unknown)}; "
            f"choose from {', '.join(sorted(known))}",
            file=sys.stderr,
        )
        return 2
    from pytest_neuron_support.run.caches import hub_cache_dir

    cache = Path(args.cache_dir) if args.cache_dir else hub_cache_dir(os.environ)
    repos = zoo.build_zoo(cache, names)
    print(f"tiny zoo ({len(repos)} checkpoints) installed in {cache}")
    print(f"use it with: HF_HUB_CACHE={cache} HF_HUB_OFFLINE=1")
    return 0


def _expect_update(args: argparse.Namespace) -> int:
    from pytest_neuron_support.catalog.expectations import plan_update, update_catalog
    from pytest_neuron_support.catalog.load import CatalogError
    from pytest_neuron_support.data.dataset import NoDataset, require_dataset

    command = "neuron-support expect update"
    accept, reasons = args.accept or [], args.reason or []
    # Each --accept takes the --reason that follows it: a count that differs cannot be paired.
    if len(accept) != len(reasons):
        print(
            f"{command}: each --accept MODEL needs its own --reason (got {len(accept)} --accept, "
            f"{len(reasons)} --reason); write --accept org/name --reason https://github.com/org/repo/issues/1",
            file=sys.stderr,
        )
        return 2
    if any(not reason.strip() for reason in reasons):
        print(f"{command}: --reason must say why (the upstream issue's URL), not be empty", file=sys.stderr)
        return 2
    try:
        rows = require_dataset(Path(args.results_dir))
        baseline = require_dataset(Path(args.baseline)) if args.baseline else []
    except NoDataset as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    path = Path(args.models_file)
    accepted = {model: reason.strip() for model, reason in zip(accept, reasons, strict=True)}
    try:
        write = plan_update if args.dry_run else update_catalog
        update = write(path, rows, baseline=baseline, accepted=accepted)
    except (CatalogError, OSError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    for change in update.changes:
        print(change)
    for refusal in update.refused:
        print(refusal, file=sys.stderr)
    for model in update.unused:
        print(f"{command}: --accept {model}: no refused or failing row of it to accept", file=sys.stderr)
    if args.dry_run:
        sys.stdout.write(update.diff(path))
        print(f"{path}: {len(update.changes)} expectation(s) would change from {len(rows)} row(s); nothing written")
    else:
        print(f"{path}: {len(update.changes)} expectation(s) changed from {len(rows)} row(s)")
    if update.refused:
        print(f"{path}: {len(update.refused)} row(s) refused (above): their expectations are as they were")
    return 1 if update.refused or update.unused else 0


def _coverage(args: argparse.Namespace) -> int:
    from pytest_neuron_support.catalog.coverage import EXCLUDED, MISSING, coverage, tag_lines
    from pytest_neuron_support.catalog.load import CatalogError, load_catalog

    try:
        catalog = load_catalog(Path(args.models_file))
    except CatalogError as exc:
        print(f"neuron-support coverage: {exc}", file=sys.stderr)
        return 2
    complete = True
    for task in coverage(catalog, args.task or None):
        if task.registry is None:
            print(f"{task.task}: not tracked (no registry says which architectures do this task)")
            continue
        counts = ", ".join(f"{len(task.named(status))} {status}" for status in ("covered", EXCLUDED, MISSING))
        print(f"{task.task} ({task.registry}, {len(task.architectures)} architectures): {counts}")
        for arch in task.architectures if args.list else task.named(MISSING):
            said = arch.reason if arch.status == EXCLUDED else ", ".join(arch.entries) or "neither covered nor excluded"
            print(f"  {arch.status:<8} {arch.name} ({arch.model_class}): {said}")
        for name in task.stale:
            print(f"  stale    {name}: excluded under coverage: {task.task}, but the registry no longer maps it")
        for name in task.contradictions:
            print(f"  both     {name}: excluded under coverage: {task.task}, and a Selected entry covers it")
        for line in tag_lines(task, every=args.list):
            print(line)
        complete = complete and task.complete
    if not args.task:
        complete = _pipeline_coverage(catalog, every=args.list) and complete
    if not complete:
        print(
            f"{args.models_file}: select a checkpoint tagged with each missing architecture, or leave it out with "
            "its reason under the top-level 'coverage:'; drop stale and contradicted exclusions; tag each entry with "
            "its checkpoint's own model_type (a diffusers pipeline: its family)",
            file=sys.stderr,
        )
    return 0 if complete else 1


def _pipeline_coverage(catalog: Catalog, *, every: bool) -> bool:
    """``coverage``'s account of every transformers pipeline task; False on a stale or contradicted exclusion.
    A missing task is listed, not failed: the task table grows task by task (docs/tasks.md), and each one
    missing is said."""
    from pytest_neuron_support.catalog.coverage import EXCLUDED, MISSING, pipeline_coverage

    tasks = pipeline_coverage(catalog)
    counts = ", ".join(f"{len(tasks.named(status))} {status}" for status in ("covered", EXCLUDED, MISSING))
    print(f"pipeline tasks ({tasks.registry}, {len(tasks.tasks)} tasks): {counts}")
    for task in tasks.tasks if every else tasks.named(MISSING) + tasks.named(EXCLUDED):
        print(f"  {task.status:<8} {task.name}: {task.said}")
    for name in tasks.stale:
        print(
            f"  stale    {name}: excluded under coverage: pipeline-tasks, but transformers' pipeline has no such task"
        )
    for name in tasks.contradictions:
        print(
            f"  both     {name}: excluded under coverage: pipeline-tasks, and Selected entries of its task row cover it"
        )
    return not (tasks.stale or tasks.contradictions)


def _show(args: argparse.Namespace) -> int:
    from pytest_neuron_support.checks.registry import named_test
    from pytest_neuron_support.data.dataset import NoDataset, near_tie_pass, require_dataset

    try:
        rows = [r for r in require_dataset(Path(args.results_dir)) if r.model_id == args.model]
    except NoDataset as exc:
        print(f"neuron-support show: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(
            f"neuron-support show: no rows for {args.model} under {Path(args.results_dir) / 'data'}; "
            "pass the --results-dir of a sweep (default results)",
            file=sys.stderr,
        )
        return 1
    for row in sorted(rows, key=lambda r: (r.neuronx_cc, r.library_version, r.device, r.check, r.test)):
        stage = f" at {row.failure_stage}" if row.failure_stage else ""
        # A PASS the tokens reached only through a near-tie is read apart from one whose tokens all agreed.
        tie = " (near-tie)" if near_tie_pass(row) else ""
        parity = f"  parity={row.parity_mode}" if row.parity_mode else ""
        # The test names the row: a catalog item and a user's test of one model are two rows.
        print(
            f"{named_test(row)}  neuronx-cc {row.neuronx_cc}  {row.library} {row.library_version}  {row.device}  "
            f"{row.check}: "
            f"{row.result}{tie}{stage}{parity}  cores={row.neuron_cores}  run_s={row.run_s}  compile_s={row.compile_s}"
        )
        if row.error:
            print(f"    {row.error.splitlines()[0]}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from pytest_neuron_support.data.dataset import read_dataset, recover_parts, write_rows

    target = Path(args.into)
    total = 0
    for source in map(Path, args.parts):
        if not (source / "data").is_dir() and not (source / ".parts").is_dir():
            print(f"neuron-support merge: {source} holds no dataset (no data/ or .parts/)", file=sys.stderr)
            return 2
        recover_parts(source)  # rows of a shard that was killed before it wrote Parquet
        rows = read_dataset(source)
        write_rows(target, rows)
        total += len(rows)
        print(f"{source}: {len(rows)} rows")
    print(f"merged {total} rows into {target / 'data'}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from pytest_neuron_support.data.dataset import (
        GATING,
        NoDataset,
        blocking_summary,
        diff_datasets,
        diff_signatures,
        read_dataset,
        require_dataset,
    )

    old, new = Path(args.old), Path(args.new)
    try:
        new_rows = require_dataset(new)
        # The baseline may be an empty folder made on purpose (no published dataset yet: `mkdir -p`), but
        # not a folder that is not there: a mistyped baseline would make every row "new" and the gate green.
        if not old.is_dir():
            raise NoDataset(
                f"{old} does not exist; pass the baseline's results folder, or an empty folder to diff against "
                "no baseline"
            )
    except NoDataset as exc:
        print(f"neuron-support diff: {exc}", file=sys.stderr)
        return 2
    old_rows = read_dataset(old)
    if not old_rows:
        print(f"{old} holds no dataset: no baseline, so every row is new (only unexpected passes are gated)")
    changes = diff_datasets(old_rows, new_rows)
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.kind] = counts.get(change.kind, 0) + 1
        if change.kind != "unchanged" or args.verbose:
            check = "" if change.check == "inference" else f" ({change.check})"
            # A user's test of a model is a row of its own: named, or it reads as the catalog's.
            test = f" (test {change.test})" if change.test else ""
            results = f"{change.old or '-'} -> {change.new or '-'}"
            known = f" (expected: {change.expected_reason})" if change.expected_reason else ""
            # Rows judged under different --parity modes: say so, rather than let a mode change read as a fix.
            modes = (
                f" (parity mode {change.old_parity} -> {change.new_parity}: judged under different settings)"
                if change.parity_differs
                else ""
            )
            print(f"{change.kind:<10} {change.model_id}{check}{test} [{change.device}]: {results}{known}{modes}")
    moved = diff_signatures(old_rows, new_rows)
    for sig in moved:
        if sig.kind == "persisting" and not args.verbose:
            continue
        if sig.kind == "persisting":
            count = f"{len(sig.old_models)} -> {len(sig.new_models)} model(s)"
        else:
            count = f"{len(sig.new_models if sig.kind == 'appeared' else sig.old_models)} model(s)"
        print(f"{sig.kind:<11} {count}: {sig.signature}")
        print(f"            {', '.join(sig.new_models if sig.kind != 'disappeared' else sig.old_models)}")
    if moved:
        print(blocking_summary(moved, {r.model_id for r in new_rows}))
    # The per-model counts stay the last line: scripts read it.
    print(", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no rows")
    return 1 if any(counts.get(kind) for kind in GATING) else 0


#: Characters of a signature's example error that `failures` prints.
EXAMPLE_CHARS = 300


def _failures(args: argparse.Namespace) -> int:
    """The failure signatures of one stack, by the number of models each blocks."""
    from pytest_neuron_support.data.dataset import DATA_DIR, read_rows
    from pytest_neuron_support.data.signatures import blockers, head

    if _positional_results_dir(args, "failures"):
        return 2
    data = Path(args.results_dir) / DATA_DIR
    files = {path.stem: path for path in sorted(data.glob("*.parquet"))}
    if not files:
        print(
            f"neuron-support failures: no dataset under {data} (no .parquet file); "
            "pass the --results-dir of a sweep (default results)",
            file=sys.stderr,
        )
        return 2
    if args.stack is not None and args.stack not in files:
        print(
            f"neuron-support failures: no stack {args.stack} under {data}; pass one of: {', '.join(files)}",
            file=sys.stderr,
        )
        return 2
    by_stack = {stem: read_rows(path) for stem, path in files.items() if args.stack in (None, stem)}
    # Without --stack, the stack with the newest row: the one the viewer opens on, too.
    stem = args.stack or max(by_stack, key=lambda s: (max((r.timestamp for r in by_stack[s]), default=""), s))
    rows = by_stack[stem]
    found = blockers(rows)
    models = {r.model_id for r in rows}
    blocked = {m for b in found for m in b.models}
    print(f"{stem}: {len(found)} failure signature(s) block {len(blocked)} of {len(models)} model(s) ({files[stem]})")
    if args.stack is None and len(files) > 1:
        print(f"(the newest of {len(files)} stacks; --stack picks another: {', '.join(s for s in files if s != stem)})")
    for blocker in found:
        example = head(blocker.example)
        if len(example) > EXAMPLE_CHARS:
            example = example[:EXAMPLE_CHARS].rstrip() + "..."
        print()
        print(f"{len(blocker.models)} model(s)  {blocker.signature}")
        print(f"  models: {', '.join(blocker.models)}")
        print(f"  e.g. {blocker.example_model}: {example}")
    return 0


def _catalog_extra_packages(models_file: str | None, model: str) -> tuple[str, ...]:
    """The catalog entry's extra_packages, when a catalog is at hand (a missing one costs nothing)."""
    from pytest_neuron_support.catalog.load import CatalogError, load_catalog

    path = Path(models_file or "models.yaml")
    if not path.is_file():
        return ()
    try:
        catalog = load_catalog(path)
    except CatalogError:
        return ()  # `runscript` prints what ran; a broken catalog only loses the extra packages
    return next((spec.extra_packages for spec in catalog.models if spec.id == model), ())


def _chosen_row(args: argparse.Namespace, command: str) -> tuple[Any, list[Any]] | None:
    """The row ``runscript`` and ``explain`` are about (the model's newest, narrowed by --stack, --device, --check
    and --test) and every row of its stack; None after saying on stderr why there is none."""
    from pytest_neuron_support.checks.registry import named_test
    from pytest_neuron_support.data.dataset import NoDataset, require_dataset, stack_stem

    results = Path(args.results_dir)
    try:
        rows = require_dataset(results)
    except NoDataset as exc:
        print(f"neuron-support {command}: {exc}", file=sys.stderr)
        return None
    stacks = sorted({stack_stem(r) for r in rows})
    shown = ", ".join(stacks) or "none"
    if args.stack is not None and args.stack not in stacks:
        print(
            f"neuron-support {command}: no stack {args.stack} under {results / 'data'}; stacks there: {shown}",
            file=sys.stderr,
        )
        return None
    mine = [r for r in rows if r.model_id == args.model]
    if not mine:
        print(
            f"neuron-support {command}: no row for {args.model} under {results / 'data'} (stacks there: {shown})",
            file=sys.stderr,
        )
        return None
    candidates = [r for r in mine if args.stack is None or stack_stem(r) == args.stack]
    if args.device is not None:
        candidates = [r for r in candidates if r.device == args.device]
    candidates = [r for r in candidates if r.check == args.check]
    if args.test is not None:
        candidates = [r for r in candidates if _names_test(r, args.test)]
    if not candidates:
        # A training row says so; an inference row is the default and reads as before.
        where = ", ".join(
            sorted({f"{stack_stem(r)} ({r.device}{'' if r.check == 'inference' else ', ' + r.check})" for r in mine})
        )
        known = ", ".join(sorted({named_test(r) for r in mine}))
        print(
            f"neuron-support {command}: {args.model} has no row for stack {args.stack or 'any'}"
            f"{' on ' + args.device if args.device else ''}"
            f"{'' if args.check == 'inference' else ' of check ' + args.check}"
            f"{'' if args.test is None else ' of test ' + args.test}; it has rows on: {where}; of tests: {known}",
            file=sys.stderr,
        )
        return None
    tests = sorted({named_test(r) for r in candidates})
    if len(tests) > 1:
        # A catalog item and a user's test of one model ran different scripts: which one is the user's call.
        listing = "".join(f"\n  --test {shlex.quote(name)}" for name in tests)
        print(
            f"neuron-support {command}: {args.model} has rows of {len(tests)} tests; choose one with --test:{listing}",
            file=sys.stderr,
        )
        return None
    # Without --stack, the newest run is what people ask about.
    row = max(candidates, key=lambda r: (r.timestamp, stack_stem(r)))
    return row, [r for r in rows if stack_stem(r) == stack_stem(row)]


def _runscript(args: argparse.Namespace) -> int:
    from pytest_neuron_support.viewer.report import reproduction

    chosen = _chosen_row(args, "runscript")
    if chosen is None:
        return 2
    row = chosen[0]
    if args.reproducer:
        why = row.reproducer_note or f"only a compile ERROR or a numerics FAIL has one, this row is {row.result}"
        return _standalone(args, "reproducer", row.reproducer, why)
    if args.fallbacks:
        why = row.fallback_note or "only a run whose device ran operations on the host has one (fallback_ops is empty)"
        return _standalone(args, "fallback reproducer", row.fallback_reproducer, why)
    again = reproduction(row, _catalog_extra_packages(args.models_file, args.model))
    if args.script_only:
        if again.runscript is None:
            print(f"neuron-support runscript: no run.py was recorded for {args.model} ({row.result})", file=sys.stderr)
            return 1
        sys.stdout.write(again.runscript)
        return 0
    sys.stdout.write(again.instructions())
    if again.runscript is None:
        print(f"# no run.py was recorded: nothing ran for this row ({row.result}: {row.error or row.exclude_reason})")
        return 1
    print(f"# ---- {again.script} ----")
    sys.stdout.write(again.runscript if again.runscript.endswith("\n") else again.runscript + "\n")
    return 0


def _row_options(parser: argparse.ArgumentParser) -> None:
    """How ``runscript`` and ``explain`` name the row they are about."""
    from pytest_neuron_support.checks.registry import CHECKS

    parser.add_argument("model", help="Hub id (or local checkpoint path) as recorded in the dataset")
    parser.add_argument("--stack", help="stack file stem, e.g. neuronxcc-2.21.0__transformers-5.24.0 (default: newest)")
    parser.add_argument("--device", help="device kind of the row (default: the newest row's)")
    parser.add_argument(
        "--check",
        choices=CHECKS,
        default="inference",
        help="which check's script: inference (run.py, the default) or train (train.py)",
    )
    parser.add_argument(
        "--test",
        metavar="TEST",
        help="the test whose row to use, when a model has rows of several (a catalog item's test_model[<id>], "
        "or a user's test's node id); without it, several are listed and nothing is picked",
    )
    _results_dir_option(parser, "dataset folder (default results)")
    parser.add_argument(
        "--models-file", help="catalog whose extra_packages to include (default models.yaml when present)"
    )


def _standalone(args: argparse.Namespace, what: str, script: str | None, why: str) -> int:
    """A row's standalone script (``script``, under the results folder), or ``why`` there is none."""
    if not script:
        print(f"neuron-support runscript: no {what} for {args.model}: {why}", file=sys.stderr)
        return 1
    path = Path(args.results_dir) / script
    if not path.is_file():
        print(
            f"neuron-support runscript: {path} is gone (the {what} lives in the sweep's run folders, "
            "which a merged or copied dataset does not carry): rerun the model to write it again",
            file=sys.stderr,
        )
        return 1
    sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0


def _explain(args: argparse.Namespace) -> int:
    from pytest_neuron_support.viewer.report import reproduction
    from pytest_neuron_support.viewer.story import story

    chosen = _chosen_row(args, "explain")
    if chosen is None:
        return 2
    row, stack_rows = chosen
    again = reproduction(row, _catalog_extra_packages(args.models_file, args.model))
    sys.stdout.write(story(row, stack_rows, again.instructions()))
    return 0


def _names_test(row: Any, test: str) -> bool:
    """``--test`` names this row's test: a user's test by its node id, a catalog item by its item name
    (``test_model[<id>]``) or by a node id ending in it (``models.yaml::test_model[<id>]``)."""
    from pytest_neuron_support.checks.registry import named_test

    name = named_test(row)
    return test == name or (not row.test and test.endswith(f"::{name}"))


def _positional_results_dir(args: argparse.Namespace, command: str) -> bool:
    """The results folder given as a positional (as ``failures`` and ``status`` once took it): said,
    with the flag every subcommand takes, rather than silently read or rejected by argparse alone."""
    given = getattr(args, "positional_results_dir", None)
    if given is None:
        return False
    print(
        f"neuron-support {command}: name the results folder with --results-dir {shlex.quote(given)} "
        "(every subcommand takes --results-dir; it is not a positional argument)",
        file=sys.stderr,
    )
    return True


def _count(n: int) -> str:
    """A parameter count the way model cards write it (0.6B, 135M, 46K)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _plan(args: argparse.Namespace) -> int:
    """Which trn2 sizes hold each model, on how many cores and why, and why not where it does not fit:
    the planner's own rules (:func:`.planning.instance_plan`) on what the cache or the Hub API says of
    the model, without downloading a weight."""
    from pytest_neuron_support import hub
    from pytest_neuron_support.base.model import ModelSpec
    from pytest_neuron_support.catalog.load import is_hub_id
    from pytest_neuron_support.checks.plan import not_cached_offline
    from pytest_neuron_support.planning.planner import (
        CORE_CHOICES,
        DTYPE_BYTES,
        TRN2_INSTANCES,
        PlanningError,
        describe_plan,
        instance_plan,
        size_text,
    )
    from pytest_neuron_support.tasks.table import task_of

    if args.max_cores not in CORE_CHOICES:
        choices = ", ".join(map(str, CORE_CHOICES))
        print(
            f"neuron-support plan: --max-cores={args.max_cores} is not a core count; pass one of {choices}",
            file=sys.stderr,
        )
        return 2
    if not 0 <= args.memory_headroom < 1:
        print(
            f"neuron-support plan: --memory-headroom={args.memory_headroom} must be at least 0 and below 1 "
            "(the share of each core kept free; default 0.25)",
            file=sys.stderr,
        )
        return 2
    down = None if args.local_only else hub.unreachable()
    local_only = args.local_only or down is not None
    if down is not None:
        print(f"the Hub is not asked ({down}): planning from the local Hugging Face cache only")
    catalog_tasks = _catalog_tasks(args.models_file)
    if isinstance(catalog_tasks, str):
        print(f"neuron-support plan: {catalog_tasks}", file=sys.stderr)
        return 2
    failed = 0
    for name in args.models:
        # A folder that exists is a local checkpoint, as `pytest --model ./dir` reads it.
        local = Path(name).expanduser().is_dir()
        if not local and (name.startswith((".", "/", "~")) or not is_hub_id(name)):
            failed += 1
            said = "no such folder" if name.startswith((".", "/", "~")) else "neither a folder nor a Hub id (org/name)"
            print(
                f"neuron-support plan: {name}: {said}; name a local checkpoint folder that exists, or a Hub id",
                file=sys.stderr,
            )
            continue
        model_id = str(Path(name).expanduser().resolve()) if local else name
        task = args.task or catalog_tasks.get(model_id) or _pipeline_task(model_id, local, args.revision)
        model = ModelSpec(
            id=model_id,
            task=task,
            revision=args.revision,
            dtype=args.dtype,
            source="local" if local else "cli",
        )
        try:
            # The task's own reader, as the sweep plans it (a diffusers pipeline reads model_index.json).
            shape = task_of(task).read_shape(model, local_only=local_only)
        except PlanningError as exc:
            failed += 1
            offline = not_cached_offline(model, exc, down)
            # A model the default reader cannot read may be of another task: say how to name it.
            hint = "" if args.task or task != "text-generation" else "; pass --task for a model of another task"
            print(f"neuron-support plan: {offline or f'{exc}{hint}'}", file=sys.stderr)
            continue
        weights = shape.parameters * DTYPE_BYTES[args.dtype]
        layout = f"{shape.num_attention_heads} heads, {shape.num_key_value_heads} kv heads"
        if shape.num_experts:
            layout += f", {shape.num_experts} experts"
        layout += ", a TP plan in transformers" if shape.has_tp_plan else ", no TP plan in transformers"
        revision = "" if local else f" (revision {args.revision})"
        print(
            f"{model.id}{revision}: {_count(shape.parameters)} weights ({shape.weights_source}), "
            f"{size_text(weights)} in {args.dtype}; {shape.model_type}: {layout}"
        )
        fits = []
        for instance in TRN2_INSTANCES:
            plan = instance_plan(
                shape,
                instance,
                dtype=args.dtype,
                headroom=args.memory_headroom,
                max_cores=args.max_cores,
                training=args.check == "train",
            )
            if plan.skip is None:
                fits.append(instance.name)
            size = f"{instance.chips} chip{'s' if instance.chips > 1 else ''}, {instance.cores} cores"
            print(f"  {instance.name} ({size}): {describe_plan(plan)}")
        names = [i.name for i in TRN2_INSTANCES]
        print(f"  fits: {', '.join(fits)}" if fits else f"  fits none of {', '.join(names)}")
    return 1 if failed else 0


def _catalog_tasks(models_file: str | None) -> dict[str, str] | str:
    """Each catalog entry's task (the task the sweep plans it as), from ``models_file`` or models.yaml when
    present; the error when the named catalog cannot be read."""
    from pytest_neuron_support.catalog.load import CatalogError, load_catalog

    path = Path(models_file or "models.yaml")
    if models_file is None and not path.is_file():
        return {}
    try:
        catalog = load_catalog(path)
    except CatalogError as exc:
        return str(exc)
    return {spec.id: spec.task for spec in catalog.models}


def _pipeline_task(model_id: str, local: bool, revision: str) -> str:
    """``text-to-image`` for a diffusers pipeline (its model_index.json in the folder or the Hub cache),
    else the default task; a model that is neither is named with --task."""
    from pytest_neuron_support import hub

    index = "model_index.json"
    found = (Path(model_id) / index).is_file() if local else hub.cached_file(model_id, index, revision=revision)
    return "text-to-image" if found else "text-generation"


def _report(args: argparse.Namespace) -> int:
    from pytest_neuron_support import hub
    from pytest_neuron_support.catalog.load import CatalogError, load_catalog
    from pytest_neuron_support.data.dataset import NoDataset, require_dataset
    from pytest_neuron_support.viewer.report import live_hub_view, no_hub_view, snapshot_hub_view, write_report

    try:
        require_dataset(Path(args.results_dir))  # an empty site from a mistyped folder would publish nothing
    except NoDataset as exc:
        print(f"neuron-support report: {exc}", file=sys.stderr)
        return 2

    catalog = None
    models_file = Path(args.models_file) if args.models_file else Path("models.yaml")
    if args.models_file or models_file.is_file():
        try:
            catalog = load_catalog(models_file)
        except CatalogError as exc:
            print(f"neuron-support report: {exc}", file=sys.stderr)
            return 2
    if args.limit < 1:
        print(f"neuron-support report: --limit must be at least 1 (got {args.limit})", file=sys.stderr)
        return 2
    if args.no_hub:
        hub_view = no_hub_view()
    elif args.hub_snapshot:
        hub_view = snapshot_hub_view(Path(args.hub_snapshot))
    elif (down := hub.unreachable()) is not None:
        # Said once, before any ranking is asked for: each one's own error would repeat its URL.
        hub_view = no_hub_view(f"not fetched: {down}")
    else:
        hub_view = live_hub_view(args.limit, args.hub_timeout)
    report = write_report(Path(args.results_dir), catalog, hub_view, Path(args.out))
    print(f"{report.rows} rows on {len(report.stacks)} stacks; catalog: {models_file if catalog else 'none'}")
    if report.hub_unavailable:
        print(f"Hub rankings unavailable: {report.hub_unavailable}")
    print(f"wrote {report.index} (open it from disk, or upload {report.index.parent} as a static Space)")
    return 0


def _status(args: argparse.Namespace) -> int:
    """A sweep's progress from another shell: status.json of its results folder, and the host's leases."""
    import time

    from pytest_neuron_support.run.cores import CorePool, alive
    from pytest_neuron_support.session.progress import duration, read_status, status_lines

    if _positional_results_dir(args, "status"):
        return 2
    results = Path(args.results_dir)
    state = read_status(results)
    if state is None:
        print(
            f"no sweep has written {results / 'status.json'}; pass the --results-dir of a running sweep",
            file=sys.stderr,
        )
        return 1
    now = time.time()
    if state.finished:
        print(f"the sweep in {results} finished {duration(now - state.updated)} ago")
    elif not alive(state.pid):
        print(
            f"the sweep in {results} is not running: its controller (pid {state.pid}) is gone; last update "
            f"{duration(now - state.updated)} ago"
        )
    else:
        print(
            f"the sweep in {results} is running (controller pid {state.pid}, {state.device}, pool of {state.pool}, "
            f"started {duration(now - state.started)} ago)"
        )
    for line in status_lines(state, results, now):
        print(line)
    if state.ledger:
        pool = CorePool(Path(state.ledger), state.pool, device=state.device)
        leases, waiting = pool.leases(), pool.waiting()
        print(
            f"leases on this host ({state.device}, ledger {state.ledger}): {len(leases)} held, {len(waiting)} waiting"
        )
        for lease in sorted(leases, key=lambda x: x.first):
            span = str(lease.first) if lease.count == 1 else f"{lease.first}-{lease.first + lease.count - 1}"
            print(f"  cores {span}: {lease.holder} (pid {lease.pid}) for {duration(now - lease.acquired)}")
        for waiter in waiting:
            print(f"  waiting for {waiter.count} core(s): pid {waiter.pid} for {duration(now - waiter.since)}")
    return 0


def _neff_target(args: argparse.Namespace, command: str) -> tuple[str, Path] | None:
    """The compiler version and cache directory a ``neff`` command works on, or None (after saying
    why) when no bucket folder can be named for them."""
    from pytest_neuron_support.devices.table import DEVICES, compiler_version
    from pytest_neuron_support.run import neffcache

    version = args.version if args.version is not None else compiler_version(DEVICES["neuron"])
    try:
        neffcache.bucket_prefix(version, args.bucket)
    except neffcache.NeffCacheError as exc:
        print(f"neuron-support neff {command}: {exc}", file=sys.stderr)
        return None
    return version, Path(args.cache)


def _neff_pull(args: argparse.Namespace) -> int:
    from pytest_neuron_support.run import neffcache

    target = _neff_target(args, "pull")
    if target is None:
        return 2
    version, cache = target
    try:
        report = neffcache.pull(version, cache, args.bucket)
    except neffcache.NeffCacheError as exc:
        print(f"neuron-support neff pull: {exc}", file=sys.stderr)
        return 1
    print(report.describe())  # the compiler's own folder, and any file in a layout torch-neuronx never reads
    return 0


def _neff_push(args: argparse.Namespace) -> int:
    from pytest_neuron_support.run import neffcache

    target = _neff_target(args, "push")
    if target is None:
        return 2
    version, cache = target
    # hf reads the token from the environment; say only whether it is there, never what it is.
    if not args.dry_run and not os.environ.get("HF_TOKEN"):
        print("neuron-support neff push: HF_TOKEN is not set: publishing needs a write token", file=sys.stderr)
        return 2
    try:
        report = neffcache.push(version, cache, args.bucket, dry_run=args.dry_run)
    except neffcache.NeffCacheError as exc:
        print(f"neuron-support neff push: {exc}", file=sys.stderr)
        return 1
    if not report.ran:
        print(f"would run (staging folder is temporary): {shlex.join(report.command)}")
        print(f"{report.staged} finished entries staged from {cache} for {report.prefix}")
        return 0
    print(f"published {report.staged} finished entries from {cache} to {report.prefix}")
    return 0


def _results_dir_option(parser: argparse.ArgumentParser, help: str, positional: bool = False) -> None:
    """``--results-dir``, the pytest option's name: the one way every subcommand names a results folder.
    ``positional`` also catches the folder given bare (``failures`` and ``status`` took it so), to say
    which flag to use (:func:`_positional_results_dir`)."""
    parser.add_argument("--results-dir", default="results", help=help)
    if positional:
        parser.add_argument("positional_results_dir", nargs="?", default=None, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    from pytest_neuron_support.checks.registry import CHECKS
    from pytest_neuron_support.devices.table import DEVICES
    from pytest_neuron_support.run import neffcache  # stdlib only, like devices: cheap enough for --help
    from pytest_neuron_support.tasks.table import TASKS

    parser = argparse.ArgumentParser(prog="neuron-support", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    expect_parser = sub.add_parser("expect", help="the catalog's expected outcomes (expect:)")
    expect_sub = expect_parser.add_subparsers(dest="expect_command", required=True)
    update = expect_sub.add_parser(
        "update",
        help="write a sweep's outcomes into the catalog as each entry's expect: (keeping its reason); rows that "
        "meet their expectation, improve on it or are new failures are written, a changed failure or a "
        "PASS -> FAIL is refused unless --accept names it (exit 1 when any row was refused)",
    )
    update.add_argument("results_dir", metavar="RESULTS", help="a results directory (its data/*.parquet)")
    update.add_argument("--models-file", default="models.yaml", help="the catalog to update (default models.yaml)")
    update.add_argument(
        "--baseline",
        metavar="OLD",
        help="an earlier sweep's results directory: a failure of an entry that passed there is a PASS -> FAIL",
    )
    update.add_argument(
        "--accept",
        action="append",
        metavar="MODEL",
        help="write this model's changed failure or PASS -> FAIL as its expectation (repeatable; each with --reason)",
    )
    update.add_argument(
        "--reason",
        action="append",
        metavar="WHY",
        help="why the --accept before it is known: the upstream issue's URL (becomes the expectation's reason)",
    )
    update.add_argument(
        "--dry-run", action="store_true", help="print what would change (a diff of the catalog) and write nothing"
    )
    update.set_defaults(func=_expect_update)
    cover = sub.add_parser(
        "coverage",
        help="every architecture the installed transformers/diffusers map for each catalog task, and every task "
        "of transformers' pipeline: covered by Selected entries, excluded with a reason, or missing (exit 1 when "
        "an architecture is missing)",
    )
    cover.add_argument("--models-file", default="models.yaml", help="the catalog (default models.yaml)")
    cover.add_argument("--task", action="append", metavar="TASK", help="only this task (repeatable)")
    cover.add_argument("--list", action="store_true", help="list every architecture, not only the missing")
    cover.set_defaults(func=_coverage)
    zoo_parser = sub.add_parser("zoo", help="the tiny random-weight checkpoints used to test offline")
    zoo_sub = zoo_parser.add_subparsers(dest="zoo_command", required=True)
    build = zoo_sub.add_parser("build", help="build tiny checkpoints into a Hugging Face hub cache")
    build.add_argument(
        "--cache-dir", help="hub cache to install into (default: HF_HUB_CACHE or ~/.cache/huggingface/hub)"
    )
    build.add_argument(
        "--only",
        action="append",
        metavar="ARCH",
        help="build only this architecture, or stable-diffusion or whisper (repeatable)",
    )
    build.set_defaults(func=_zoo_build)
    show = sub.add_parser("show", help="a model's rows across stacks")
    show.add_argument("model", help="Hub id")
    _results_dir_option(show, "dataset folder (default results)")
    show.set_defaults(func=_show)
    merge = sub.add_parser("merge", help="combine shards' results folders into one dataset")
    merge.add_argument("parts", nargs="+", help="results folders written by shards (--results-dir of each)")
    merge.add_argument("--into", required=True, help="dataset folder to merge into")
    merge.set_defaults(func=_merge)
    diff = sub.add_parser(
        "diff",
        help="per model: regressed / expected / unexpected-pass / fixed / settings-differ / new / missing / unchanged, "
        "and the failure signatures that appeared or disappeared (exit 1 on a regression or an unexpected pass, "
        "2 when NEW holds no dataset or OLD does not exist; an empty OLD folder is no baseline)",
    )
    diff.add_argument("old", help="dataset folder (the baseline)")
    diff.add_argument("new", help="dataset folder (the candidate)")
    diff.add_argument(
        "-v", "--verbose", action="store_true", help="also list unchanged models and persisting signatures"
    )
    diff.set_defaults(func=_diff)
    failures = sub.add_parser(
        "failures", help="failure signatures of one stack, by the number of models each blocks, with an example"
    )
    _results_dir_option(failures, "dataset folder (default results)", positional=True)
    failures.add_argument(
        "--stack", help="stack file stem, e.g. neuronxcc-2.21.0__transformers-5.24.0 (default: the newest)"
    )
    failures.set_defaults(func=_failures)
    runscript = sub.add_parser(
        "runscript", help="the run.py that ran for a model, the packages to install and the NEFF-cache sync command"
    )
    _row_options(runscript)
    runscript.add_argument("--script-only", action="store_true", help="print only run.py (e.g. > run.py)")
    runscript.add_argument(
        "--reproducer",
        action="store_true",
        help="print only the row's standalone reproducer: a compile ERROR's failing graph (> repro.py), a numerics "
        "FAIL's first diverging module alone (> run.py)",
    )
    runscript.add_argument(
        "--fallbacks",
        action="store_true",
        help="print only the row's fallback reproducer (> run.py): the calls of the ops the device ran on the host, "
        "each made again alone with the recorded dtypes and shapes",
    )
    runscript.set_defaults(func=_runscript)
    explain = sub.add_parser(
        "explain",
        help="the whole story of a model's row: plan, stages, evidence, first diverging module, signature, "
        "expectation, how to reproduce it",
    )
    _row_options(explain)
    explain.set_defaults(func=_explain)
    status = sub.add_parser("status", help="a running sweep's progress and the host's core leases, from another shell")
    _results_dir_option(status, "the sweep's --results-dir (default results)", positional=True)
    status.set_defaults(func=_status)
    plan = sub.add_parser(
        "plan",
        help="which trn2 sizes hold a model, on how many cores (tp/ep, memory per core) and why; from the "
        "cache or the Hub API, without downloading weights",
    )
    plan.add_argument("models", nargs="+", metavar="MODEL", help="Hub id (org/name) or local checkpoint folder")
    plan.add_argument("--revision", default="main", help="Hub revision (default main)")
    plan.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16", help="run dtype")
    plan.add_argument(
        "--check", choices=CHECKS, default="inference", help="plan the inference run (default) or the training check"
    )
    plan.add_argument("--memory-headroom", type=float, default=0.25, help="share of each core kept free (default 0.25)")
    plan.add_argument("--max-cores", type=int, default=16, help="most cores the harness gives a model (default 16)")
    plan.add_argument("--local-only", action="store_true", help="ask the Hub nothing: the local cache only")
    plan.add_argument(
        "--task",
        choices=TASKS,
        help="the model's task, whose reader plans it (default: its catalog entry's, else text-to-image for a "
        "diffusers pipeline in the folder or cache, else text-generation)",
    )
    plan.add_argument("--models-file", help="catalog whose entries' tasks to use (default models.yaml when present)")
    plan.set_defaults(func=_plan)
    report = sub.add_parser("report", help="write the self-contained viewer (index.html) for a dataset")
    _results_dir_option(report, "dataset folder (default results)")
    report.add_argument("--models-file", help="catalog for the Selected view (default models.yaml when present)")
    report.add_argument("--out", default="site", help="folder to write index.html into (default site)")
    hub_source = report.add_mutually_exclusive_group()
    hub_source.add_argument("--no-hub", action="store_true", help="do not fetch the Hub's Trending/Downloads rankings")
    hub_source.add_argument("--hub-snapshot", metavar="FILE", help="use rankings saved earlier (hub-rankings.json)")
    report.add_argument("--limit", type=int, default=50, help="models per Hub ranking (default 50)")
    report.add_argument(
        "--hub-timeout", type=float, default=120.0, help="seconds allowed for all Hub rankings (default 120)"
    )
    report.set_defaults(func=_report)
    cache_env = DEVICES["neuron"].compile_cache_env
    neff = sub.add_parser("neff", help="sync the public NEFF cache (compiled graphs) down or publish the local one")
    neff_sub = neff.add_subparsers(dest="neff_command", required=True)
    neff_help = {
        "pull": "sync the bucket folder of this compiler into the local cache (exit 1 when it copied nothing)",
        "push": "publish the local cache's finished entries to the bucket folder of this compiler (needs HF_TOKEN)",
    }
    for name, func in (("pull", _neff_pull), ("push", _neff_push)):
        command = neff_sub.add_parser(name, help=neff_help[name])
        command.add_argument(
            "--cache",
            default=os.environ.get(cache_env) or neffcache.DEFAULT_CACHE_DIR,
            help=(
                f"base of the per-compiler NEFF caches (default ${cache_env}, else {neffcache.DEFAULT_CACHE_DIR});"
                " the compiler's own folder is <base>/neuronxcc-<version>, the one run.py uses"
            ),
        )
        command.add_argument(
            "--version", help="neuronx-cc version with its local label (default: neuronxcc.__version__ here)"
        )
        command.add_argument(
            "--bucket",
            default=neffcache.DEFAULT_BUCKET,
            help="bucket holding one neuronxcc-<version> folder per compiler (default the public one)",
        )
        if name == "push":
            command.add_argument(
                "--dry-run", action="store_true", help="stage and count, print the hf command, do not run it"
            )
        command.set_defaults(func=func)
    from pytest_neuron_support.doctor import command as doctor

    check = sub.add_parser("doctor", help="check on this host every assumption the harness makes about its device")
    doctor.add_arguments(check)
    check.set_defaults(func=doctor.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = int(args.func(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`runscript ... | head`): stop quietly, as `cat` does. Python's documented
        # way: point stdout at devnull so the interpreter's last flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
