"""The catalog as pytest items: :class:`CatalogFile` collects :mod:`.suite` (one test per check kind,
parametrized over the catalog) from the catalog file; :func:`plan_models` plans the models that survive
selection, once (on the xdist controller, or once selection is done); :func:`order_items` orders them
by cost and splits them by ``--shard``.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_neuron_support import hub
from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.checks.plan import plan_checks, prior_seconds
from pytest_neuron_support.checks.registry import KINDS, check_of, checks_of, item_name, model_id_of
from pytest_neuron_support.checks.rows import gate
from pytest_neuron_support.data.dataset import expected_seconds_from_dataset
from pytest_neuron_support.planning.planner import Plan, describe_plan
from pytest_neuron_support.session import suite
from pytest_neuron_support.session.handles import ExpectedFailure
from pytest_neuron_support.session.keys import (
    catalog_key,
    check_key,
    cost_key,
    history_key,
    model_key,
    options_key,
    plan_key,
    plans_key,
    resolved_key,
    settings_key,
    virtual_catalog_key,
)
from pytest_neuron_support.session.progress import PROGRESS_PLUGIN, Planned
from pytest_neuron_support.session.sharding import assign
from pytest_neuron_support.verdict import expected


def collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """The catalog file of a sweep, as the collector of the catalog suite; None for any other file."""
    config = parent.config
    if catalog_key not in config.stash:
        return None
    if file_path.resolve() != config.stash[options_key].models_file:
        return None
    return CatalogFile.from_parent(parent, path=file_path)


def _history(config: pytest.Config) -> Mapping[str, float]:
    """Each model's last run time in the dataset, read once per process (the order and the progress
    lines both need it)."""
    if history_key not in config.stash:
        settings = config.stash[settings_key]
        config.stash[history_key] = expected_seconds_from_dataset(settings.results_dir, settings.device.name)
    return config.stash[history_key]


def expected_seconds(history: Mapping[str, float], model_id: str, plan: Plan) -> float:
    """How long a model is expected to take: its last run in the dataset, else the planner's prior."""
    return history.get(model_id, prior_seconds(plan))


def progress_plan(config: pytest.Config, items: Sequence[tuple[str, Plan | None]]) -> dict[str, Planned]:
    """What the progress lines expect of each catalog item (node id, its plan or None)."""
    history = _history(config)
    planned = {}
    for nodeid, plan in items:
        model_id = model_id_of(nodeid) or nodeid
        runs = plan is not None and plan.skip is None and plan.error is None
        cores, expected = (
            (plan.cores, expected_seconds(history, model_id, plan)) if plan is not None and runs else (0, 0.0)
        )
        planned[nodeid] = Planned(nodeid, model_id, cores, expected)
    return planned


def expect_progress(session: pytest.Session) -> None:
    """Without xdist: the progress lines learn the session's items once they are collected."""
    progress = session.config.pluginmanager.get_plugin(PROGRESS_PLUGIN)
    if progress is None or not hasattr(session, "items"):
        return
    models = catalog_items(session.items)
    progress.expect(progress_plan(session.config, [(item.nodeid, item.stash.get(plan_key, None)) for item in models]))


def report_plans(config: pytest.Config, items: Sequence[pytest.Item]) -> list[str]:
    """``pytest --collect-only -v``: every selected catalog item's plan (cores, tp/ep, memory per core and
    the reason, :func:`.planning.describe_plan`), or why it has none, before anything runs; nothing
    otherwise (a sweep's own lines say what runs). The lines ``pytest_report_collectionfinish`` prints."""
    settings = config.stash.get(settings_key, None)
    models = catalog_items(items)
    if settings is None or not models or not config.option.collectonly or config.get_verbosity() < 1:
        return []
    lines = [f"neuron-support plans ({settings.device.name}, pool of {settings.neuron_cores} core(s)):"]
    for item in models:
        plan = item.stash.get(plan_key, None)
        if plan is None:
            gated = gate(item.stash[model_key], settings)
            why = gated.error if gated is not None else "planned when it runs (its worker plans it)"
            lines.append(f"  {item.nodeid}: not planned: {why}")
            continue
        text = describe_plan(plan)
        if plan.skip is None and plan.error is None and plan.cores > settings.neuron_cores:
            # rows.planned_row skips it when it runs: said here too, with the option that changes it.
            text += (
                f"; SKIPPED here: the pool has {settings.neuron_cores} core(s); "
                f"pass --neuron-cores={plan.cores} or more"
            )
        lines.append(f"  {item.nodeid}: {text}")
    return lines


def collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Where no catalog file exists and ``--model`` names the models: the rootdir's collector also
    yields the catalog suite, so ``pytest --model org/name`` works wherever the plugin is installed."""
    config = parent.config
    if not config.stash.get(virtual_catalog_key, False):
        return None
    if path != config.stash[options_key].models_file.parent:
        return None
    return CatalogDir.from_parent(parent, path=path)


# Dir is final in pytest's typing, not at run time: a Dir that adds one child is the least that
# reuses how pytest walks a directory (ignores, conftests, norecursedirs) rather than copying it.
class CatalogDir(pytest.Dir):  # type: ignore[misc]
    """A directory that holds the ``--model`` catalog besides its own files."""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        catalog = CatalogFile.from_parent(self, path=self.config.stash[options_key].models_file)
        return [*super().collect(), catalog]


def catalog_items(items: Iterable[pytest.Item]) -> list[pytest.Item]:
    return [item for item in items if model_key in item.stash]


def order_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs after selection (-k, -m): plans the surviving catalog items that have no plan yet, then
    orders them largest work first (cores x expected seconds), so the sweep's makespan stays short,
    and keeps this shard's share (``--shard``)."""
    settings = config.stash.get(settings_key, None)
    models = catalog_items(items)
    if settings is None or not models:
        return
    if plans_key in config.stash:
        # xdist: the controller planned the selection once; a worker asks the Hub nothing, so every
        # worker orders the same items the same way. (A model it did not plan is planned by its
        # item's neuron_plan fixture when it runs, at cost 0 here.)
        plans = config.stash[plans_key]
    else:
        unique = {item.stash[model_key].id: item.stash[model_key] for item in models}
        plans = plan_models(config, list(unique.values()))
    for item in models:
        plan = plans.get(item_name(item.stash[model_key].id, item.stash[check_key]))
        if plan is not None:
            item.stash[plan_key] = plan
    history = _history(config)

    def cost(item: pytest.Item) -> float:
        plan = item.stash.get(plan_key, None)
        if plan is None or plan.skip is not None or plan.error is not None:
            return 0.0
        return plan.cores * expected_seconds(history, item.stash[model_key].id, plan)

    for item in models:
        item.stash[cost_key] = cost(item)
    ordered = sorted(models, key=cost, reverse=True)
    others = [item for item in items if model_key not in item.stash]
    shard = config.stash[options_key].shard
    if shard is not None and shard.count > 1:
        owner = assign([(item.nodeid, cost(item)) for item in ordered], shard.count)
        mine = [item for item in ordered if owner[item.nodeid] == shard.index]
        dropped = [item for item in ordered if owner[item.nodeid] != shard.index]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        ordered = mine
    items[:] = ordered + others


class CatalogFile(pytest.Module):
    """A models.yaml, collected as the module :mod:`.suite`: its one test, parametrized over the
    catalog's models (then the ``--model`` additions), each item tagged with its entry's tags."""

    def _getobj(self) -> ModuleType:
        # The suite's code is the package's, not the YAML file's (pytest would import the path).
        return importlib.import_module(suite.__name__)

    def istestfunction(self, obj: object, name: str) -> bool:
        # Whatever the user's python_functions says, the suite is exactly its tests (one per check).
        return name in {kind.test for kind in KINDS.values()} and callable(obj)

    def istestclass(self, obj: object, name: str) -> bool:
        return False

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        if not self.config.stash[catalog_key]:
            return []  # an empty catalog is no item (not pytest's "empty parameter set" skip)
        collected = []
        for node in super().collect():
            spec = _param(node)
            if spec is None:
                continue  # a check no entry asks for: pytest's "empty parameter set" item, dropped
            if isinstance(node, pytest.Item):
                node.stash[model_key] = spec
                node.stash[check_key] = check_of(node.nodeid) or "inference"
                node.extra_keyword_matches.update(spec.tags)
                expect = spec.expect
                if expect is not None and expect.check == node.stash[check_key] and expect.result != "PASS":
                    # A known failure: an XFAIL while it fails as expected, a failed XPASS(strict) once it
                    # passes; any other failure is not ExpectedFailure and fails as it is.
                    reason = expected.message(expect, expected.MET, expect.result, None, None)
                    node.add_marker(pytest.mark.xfail(reason=reason, strict=True, raises=ExpectedFailure))
            collected.append(node)
        return collected


def _param(node: Any) -> ModelSpec | None:
    """The catalog entry an item of the suite was parametrized with."""
    callspec = getattr(node, "callspec", None)
    spec = None if callspec is None else callspec.params.get("neuron_model")
    return spec if isinstance(spec, ModelSpec) else None


def plan_models(config: pytest.Config, models: Iterable[ModelSpec]) -> dict[str, Plan]:
    """The plans of these models' items, by item name (``test_model[<id>]``, ``test_training[<id>]``:
    one per check the run makes of it; models that must not run have none), asking the Hub at most
    once per model; once it proved unreachable, the rest are planned from the local cache only, so a
    sweep never waits through the client's retries model after model.

    A Hub found unreachable up front (not the user's own ``HF_HUB_OFFLINE=1``) is also recorded in the
    session's settings (:func:`record_hub_unreachable`): every run the session starts is then offline."""
    settings = config.stash[settings_key]
    plans: dict[str, Plan] = {}
    models = [model for model in models if gate(model, settings) is None]
    # Asked once, up front: without network the whole plan comes from the local cache in seconds.
    down = hub.unreachable() if models else None
    local_only = down is not None
    if down is not None and down != "HF_HUB_OFFLINE=1":
        sys.stderr.write(
            f"neuron-support: the Hub is not reachable: {down}; planning {len(models)} model(s) from the local "
            "cache only (a model not in it is an ERROR at stage plan), and running them offline "
            "(HF_HUB_OFFLINE=1)\n"
        )
        record_hub_unreachable(config, down)
    selected = config.stash[options_key].checks
    for model in models:
        checks = checks_of(model, selected)
        found, unreachable = plan_checks(model, settings, checks, local_only=local_only, hub_down=down)
        for check, plan in found.items():
            if plan.error is not None and down is not None and down not in plan.error:
                # Its row says why the Hub was not asked, not only what the local cache lacked.
                plan = dataclasses.replace(plan, error=f"{plan.error}; the Hub was not asked: {down}")
            plans[item_name(model.id, check)] = plan
        local_only = local_only or unreachable
    return plans


def record_hub_unreachable(config: pytest.Config, reason: str) -> None:
    """The session found the Hub unreachable (``reason``, one line): its settings say so, and so does the
    :class:`Resolved` handed to xdist workers (``workerinput``), whose settings are made from it. Every
    process started for a model then runs with ``HF_HUB_OFFLINE=1`` (``run.context.session_env``): a
    checkpoint not in the cache fails at once instead of through the client's connection retries."""
    config.stash[settings_key] = dataclasses.replace(config.stash[settings_key], hub_unreachable=reason)
    resolved = config.stash.get(resolved_key, None)
    if resolved is not None:
        config.stash[resolved_key] = dataclasses.replace(resolved, hub_unreachable=reason)


def selected_models(config: pytest.Config, models: Iterable[ModelSpec]) -> list[ModelSpec]:
    """The catalog models whose items ``-k`` and ``-m`` keep, decided on the xdist controller (which
    collects nothing) with the names pytest matches on each item: the item's name
    (``test_model[<id>]``), its file and folders, its entry's tags; the suite's items carry no marks.

    pytest's expression language is not public API: if it moves, every model is kept (planned),
    which costs Hub requests, never a wrong selection (the workers still select themselves)."""
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # pragma: no cover - depends on the pytest release
        return list(models)
    keyword = (config.option.keyword or "").strip()
    markexpr = (config.option.markexpr or "").strip()
    if not keyword and not markexpr:
        return list(models)
    try:
        keyword_expr = Expression.compile(keyword) if keyword else None
        mark_expr = Expression.compile(markexpr) if markexpr else None
    except Exception:  # a malformed expression: pytest's own selection says so on every worker
        return list(models)
    path = config.stash[options_key].models_file
    selected = config.stash[options_key].checks
    try:
        parts = path.relative_to(config.rootpath).parts
    except ValueError:
        parts = (path.name,)
    kept = []
    for model in models:
        names = {*parts, *(item_name(model.id, c) for c in checks_of(model, selected)), *model.tags}

        def matches(subname: str, /, **kwargs: object) -> bool:
            return any(subname.lower() in name.lower() for name in names)  # noqa: B023 (used at once)

        if keyword_expr is not None and not keyword_expr.evaluate(matches):
            continue
        if mark_expr is not None and not mark_expr.evaluate(lambda name, /, **kwargs: False):
            continue
        kept.append(model)
    return kept
