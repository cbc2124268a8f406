"""The catalog's entries as pytest items: one :class:`ModelItem` per model (planned at collection,
run through the pipeline, its row attached), ordered by cost and split by ``--shard``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from .catalog import ModelSpec
from .controller import catalog_key, plan_catalog, plans_key, recorded_key, settings_key
from .dataset import (
    expected_seconds_from_dataset,
)
from .options import options_key
from .pipeline import (
    core_pool,
    gate,
    planned_row,
    prior_seconds,
    run_model,
    settings_hash,
    slug,
)
from .planning import Plan
from .reporting import ROW_PROPERTY
from .sharding import assign

model_key = pytest.StashKey[ModelSpec]()
plan_key = pytest.StashKey[Plan]()
#: cores x expected seconds: the item's place in the sweep and in the core ledger's queue.
cost_key = pytest.StashKey[float]()


def collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """The catalog file of a sweep, as a collector of its models; None for any other file."""
    config = parent.config
    if catalog_key not in config.stash:
        return None
    if file_path.resolve() != config.stash[options_key].models_file:
        return None
    return CatalogFile.from_parent(parent, path=file_path)


def order_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Largest work first (cores x expected seconds), so the sweep's makespan stays short."""
    settings = config.stash.get(settings_key, None)
    if settings is None:
        return
    models = [item for item in items if isinstance(item, ModelItem)]
    if not models:
        return
    history = expected_seconds_from_dataset(settings.results_dir, settings.device.name)

    def cost(item: ModelItem) -> float:
        plan = item.stash.get(plan_key, None)
        if plan is None or plan.skip is not None or plan.error is not None:
            return 0.0
        return plan.cores * history.get(item.name, prior_seconds(plan))

    for item in models:
        item.stash[cost_key] = cost(item)
    ordered = sorted(models, key=cost, reverse=True)
    others = [item for item in items if not isinstance(item, ModelItem)]
    shard = config.stash[options_key].shard
    if shard is not None and shard.count > 1:
        owner = assign([(item.nodeid, cost(item)) for item in ordered], shard.count)
        mine = [item for item in ordered if owner[item.nodeid] == shard.index]
        dropped = [item for item in ordered if owner[item.nodeid] != shard.index]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        ordered = mine
    items[:] = ordered + others


class CatalogFile(pytest.File):
    """A models.yaml: one :class:`ModelItem` per entry, then the ``--model`` additions."""

    def collect(self) -> Iterator[pytest.Item]:
        # Under xdist the controller planned every model once and handed the plans over: a worker
        # asks the Hub nothing, so every worker collects the same items in the same order.
        # (An empty dict handed over is an answer too: every model was gated, nothing to plan.)
        plans = self.config.stash[plans_key] if plans_key in self.config.stash else plan_catalog(self.config)
        for model in self.config.stash[catalog_key]:
            item = ModelItem.from_parent(self, name=model.id)
            item.stash[model_key] = model
            if model.id in plans:
                item.stash[plan_key] = plans[model.id]
            item.extra_keyword_matches.update(model.tags)
            yield item


class ModelCheckFailed(Exception):
    """The model's row is not a PASS; the message says why."""


class ModelItem(pytest.Item):
    """One model: runs the pipeline, attaches its row, and maps the result to an outcome."""

    def runtest(self) -> None:
        model = self.stash[model_key]
        settings = self.config.stash[settings_key]
        done = self.config.stash.get(recorded_key, {}).get((model.id, settings.device.name))
        if done is not None and done[1] == settings_hash(model, settings):
            pytest.skip(f"resumed: {done[0]} already recorded for this stack and settings")
        row = gate(model, settings)
        plan = self.stash.get(plan_key, None)
        if row is None and plan is not None:
            row = planned_row(model, settings, plan)
            if row.failure_stage != "plan":  # SKIPPED or ERROR at plan: nothing to run
                post_load = self.config.hook.pytest_neuron_support_post_load(config=self.config, model=model) or ""
                pool = core_pool(settings)
                # Leases are granted in cost order too, so the largest work is not starved.
                priority = self.stash.get(cost_key, 0.0)
                planned = row
                try:
                    with pool.lease(plan.cores, holder=self.nodeid, priority=priority) as lease:
                        row = run_model(
                            model,
                            settings,
                            plan,
                            cores=(lease.first, lease.count),
                            post_load=post_load,
                            # The verdict needs no cores: free them once the device run ends.
                            release=lambda: pool.release(lease),
                        )
                except Exception as exc:  # the harness itself broke (disk full, ...): still a row
                    row = replace(
                        planned,
                        result="ERROR",
                        failure_stage="harness",
                        verdict_basis="run",
                        error=f"{type(exc).__name__}: {exc}",
                    )
        assert row is not None
        self.user_properties.append((ROW_PROPERTY, row.to_json()))
        if row.result in ("EXCLUDED", "SKIPPED"):
            pytest.skip(f"{row.result.lower()}: {row.error}")
        if row.result != "PASS":
            raise ModelCheckFailed(f"{row.result} at stage {row.failure_stage}: {row.error}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ModelCheckFailed):
            model = self.stash[model_key]
            runs = self.config.stash[settings_key].results_dir / "runs" / slug(model.id)
            return f"{excinfo.value}\n(run.py, result.json and log.txt: {runs})"
        return str(super().repr_failure(excinfo, style=style))

    def __repr__(self) -> str:
        # `--collect-only -q -v` prints this: the plan is visible before anything runs.
        plan = self.stash.get(plan_key, None)
        if plan is None:
            return f"<ModelItem {self.name}>"
        if plan.error is not None:
            return f"<ModelItem {self.name} error: {plan.error}>"
        if plan.skip is not None:
            return f"<ModelItem {self.name} skipped: {plan.skip}>"
        return f"<ModelItem {self.name} cores={plan.cores} tp={plan.tp_size} ep={plan.ep_size}: {plan.reason}>"

    def reportinfo(self) -> tuple[Path, int, str]:
        model = self.stash[model_key]
        return self.path, max(model.line - 1, 0), f"{model.id} [{model.task}]"
