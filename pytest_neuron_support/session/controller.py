"""The session's setup, once: options and catalog read, the device probed (on the controller only),
settings built, the results folder checked, caches cleaned, parts of a killed session recovered,
resume data loaded; and, on the xdist controller only (like xdist's own ``DSession``), the plugin
that hands the resolved device to every worker (``workerinput``) and makes the scheduler.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_support.catalog.load import Catalog, CatalogError, load_catalog, merge_models
from pytest_neuron_support.checks.registry import model_id_of
from pytest_neuron_support.data.dataset import check_writable, read_dataset, recover_parts
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run import forkserver
from pytest_neuron_support.run.caches import clean_compile_cache
from pytest_neuron_support.run.execution import end_with_parent
from pytest_neuron_support.run.settings import Resolved
from pytest_neuron_support.session.items import plan_models, progress_plan, selected_models
from pytest_neuron_support.session.keys import (
    catalog_key,
    options_key,
    plans_key,
    recorded_key,
    resolved_key,
    settings_key,
    virtual_catalog_key,
)
from pytest_neuron_support.session.options import Options, parse_options
from pytest_neuron_support.session.progress import PROGRESS_PLUGIN, Progress
from pytest_neuron_support.session.reporting import RESULTS_PLUGIN, ResultsWriter
from pytest_neuron_support.session.resolve import resolve_cpu_threads, resolve_device, settings_for, with_judge

WORKERINPUT_KEY = "neuron_support"
WORKERINPUT_PLANS = "neuron_support_plans"


def _sweep_requested(config: pytest.Config, options: Options) -> bool:
    """Whether this session will collect the catalog (so the device must be resolved)."""
    if options.models_file_explicit or options.extra_models:
        return True
    target = options.models_file
    if not target.exists():
        # The default catalog is absent (a project of the user's own): its tests run, no sweep.
        return False
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == target or (path.is_dir() and target.is_relative_to(path)):
            return True
    return False


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def configure(config: pytest.Config) -> None:
    """Everything a session needs before collection, on the controller and on each xdist worker (which
    takes the resolved device from ``workerinput`` instead of probing it)."""
    options = parse_options(config)
    config.stash[options_key] = options
    if options.models_file_explicit and config.args_source != pytest.Config.ArgsSource.ARGS:
        # `pytest --models-file=x.yaml` collects that file instead of the default test paths.
        config.args = [str(options.models_file)]
    if not _sweep_requested(config, options):
        return
    if options.extra_models and not options.models_file_explicit and not options.models_file.exists():
        # `pytest --model org/name` where there is no catalog: the --model entries are the catalog,
        # collected as if a models.yaml stood in the rootdir (items.collect_directory).
        catalog = Catalog(options.models_file, ())
        config.stash[virtual_catalog_key] = True
    else:
        try:
            catalog = load_catalog(options.models_file)
        except CatalogError as exc:
            raise pytest.UsageError(str(exc)) from None
    config.stash[catalog_key] = merge_models(catalog.models, options.extra_models)
    options = with_judge(options, catalog)
    config.stash[options_key] = options
    runs_checks = _is_worker(config) or config.getoption("dist", "no") == "no"
    if runs_checks and options.cpu_side_starts == "warm" and sys.platform == "linux":
        # This process runs the checks: their CPU-side scripts may start from a warm interpreter. Linux
        # only: macOS's system libraries are not safe to use in a fork of a process that loaded them.
        forkserver.enable()
        config.add_cleanup(forkserver.disable)
    if _is_worker(config):
        # A worker ends with its controller: its run.py (and that run's ranks) then end with it.
        end_with_parent()
        shared = config.workerinput[WORKERINPUT_KEY]  # type: ignore[attr-defined]
        config.stash[settings_key] = settings_for(options, Resolved.from_workerinput(shared))
        config.stash[plans_key] = {
            model_id: Plan(**fields)
            for model_id, fields in config.workerinput[WORKERINPUT_PLANS].items()  # type: ignore[attr-defined]
        }
        _load_recorded(config)
        return
    resolved = dataclasses.replace(
        resolve_device(options), cpu_threads=resolve_cpu_threads(config, options, os.environ)
    )
    config.stash[resolved_key] = resolved
    config.stash[settings_key] = settings_for(options, resolved)
    try:
        check_writable(options.results_dir)
    except OSError as exc:
        raise pytest.UsageError(
            f"--results-dir={options.results_dir} is not writable ({exc.strerror or exc}); "
            "pass a directory you can write to with free space"
        ) from None
    if options.neff_cache is not None:
        clean_compile_cache(options.neff_cache)
    # Rows of a killed session are merged first: --resume then counts them as done.
    recover_parts(options.results_dir)
    _load_recorded(config)
    config.pluginmanager.register(ResultsWriter(config.stash[settings_key], config.stash[catalog_key]), RESULTS_PLUGIN)
    if config.getoption("dist", "no") != "no":
        # xdist: plan the selected models here, once, and hand the plans to the workers (workerinput).
        models = config.stash[catalog_key]
        config.stash[plans_key] = plan_models(config, selected_models(config, models))
    settings = config.stash[settings_key]
    progress = Progress(
        config,
        settings.results_dir,
        settings.device.name,
        settings.neuron_cores,
        settings.core_ledger,
        options.progress_interval,
    )
    config.pluginmanager.register(progress, PROGRESS_PLUGIN)
    config.pluginmanager.register(Controller(config), "neuron-support-controller")


def _load_recorded(config: pytest.Config) -> None:
    """For --resume: which models already have a row for this stack (read once per process)."""
    if not config.stash[options_key].resume:
        return
    settings = config.stash[settings_key]
    stack = settings.stack
    recorded = {}
    for row in read_dataset(settings.results_dir):
        same_stack = (row.neuronx_cc, row.library, row.library_version) == (
            stack.neuronx_cc,
            stack.library,
            stack.library_version,
        )
        if same_stack and not row.test:  # a user's test of a model does not stand for its catalog item
            recorded[(row.model_id, row.device, row.check)] = (row.result, row.settings_hash)
    config.stash[recorded_key] = recorded


class Controller:
    """Registered on the controller only (the process that runs no item under xdist): hands the
    resolved device to each worker and makes the cost-order scheduler."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist: hand the resolved device to a worker so it never probes it."""
        resolved = self.config.stash.get(resolved_key, None)
        if resolved is not None:
            node.workerinput[WORKERINPUT_KEY] = resolved.to_workerinput()
            plans = self.config.stash.get(plans_key, {})
            node.workerinput[WORKERINPUT_PLANS] = {
                model_id: dataclasses.asdict(plan) for model_id, plan in plans.items()
            }

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """xdist: the progress lines learn the items from the first worker's collection (all agree)."""
        progress = self.config.pluginmanager.get_plugin(PROGRESS_PLUGIN)
        if progress is None or progress.planned:
            return
        plans = self.config.stash.get(plans_key, {})
        catalog = [(nodeid, plans.get(nodeid.rsplit("::", 1)[-1])) for nodeid in ids if model_id_of(nodeid) is not None]
        progress.expect(progress_plan(self.config, catalog))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """A model sweep under the default ``--dist load`` deals items out in cost order."""
        if config.getvalue("dist") != "load":
            return None
        from pytest_neuron_support.session.scheduling import CostOrderScheduling

        return CostOrderScheduling(config, log)
