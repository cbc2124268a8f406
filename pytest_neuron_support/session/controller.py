"""The session's setup, once: options and catalog read, the device probed (on the controller only),
settings built, the results folder checked, caches cleaned, parts of a killed session recovered,
resume data loaded; and, on the xdist controller only (like xdist's own ``DSession``), the plugin
that hands the resolved device to every worker (``workerinput``) and makes the scheduler.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_support.base.names import item_name, model_id_of
from pytest_neuron_support.catalog.load import Catalog, CatalogError, ModelSpec, checks_of, load_catalog, merge_models
from pytest_neuron_support.checks.pipeline import plan_checks
from pytest_neuron_support.checks.rows import gate
from pytest_neuron_support.data import hub
from pytest_neuron_support.data.dataset import check_writable, read_dataset, recover_parts
from pytest_neuron_support.data.records import current_stack
from pytest_neuron_support.planning.planner import Plan, cpu_threads, usable_cpus
from pytest_neuron_support.run import neffcache
from pytest_neuron_support.run.caches import clean_compile_cache
from pytest_neuron_support.run.cores import session_cores
from pytest_neuron_support.run.devices import (
    DEVICES,
    DeviceNotFound,
    compiler_version,
    fallback_core_bytes,
    find_device,
)
from pytest_neuron_support.run.execution import end_with_parent
from pytest_neuron_support.run.settings import Settings, read_self_check
from pytest_neuron_support.session.options import Options, options_key, parse_options
from pytest_neuron_support.session.progress import Progress
from pytest_neuron_support.session.reporting import ResultsWriter, writer_key
from pytest_neuron_support.verdict.checks import DEFAULT_JUDGE

#: The plugin name of the progress lines (controller only).
PROGRESS_PLUGIN = "neuron-support-progress"
WORKERINPUT_KEY = "neuron_support"
WORKERINPUT_PLANS = "neuron_support_plans"
#: model id -> its plan, made once per session for the selected models (on the xdist controller; without
#: xdist once selection is done).
plans_key = pytest.StashKey[dict[str, Plan]]()

resolved_key = pytest.StashKey["Resolved"]()
settings_key = pytest.StashKey[Settings]()
catalog_key = pytest.StashKey[tuple[ModelSpec, ...]]()
#: The session checks only --model entries, with no catalog file (it is collected all the same).
virtual_catalog_key = pytest.StashKey[bool]()
#: (model id, device) -> (result, settings hash) of rows already in the dataset (--resume).
recorded_key = pytest.StashKey[dict[tuple[str, str, str], tuple[str, str]]]()


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


@dataclass(frozen=True)
class Resolved:
    """What the controller finds out once and hands to every xdist worker (``workerinput``).

    Attributes:
        device: the device kind runs use.
        cores: the host cores this session may lease (its slice, host numbering).
        pool: most cores it holds at once (``--neuron-cores``, default the whole slice).
        core_bytes: memory of one core the planner fills.
        neuronx_cc: the device compiler's version (its own ``__version__``), ``none`` off Trainium.
        session: this session's id in the host-wide core ledger.
        self_check: the host's doctor self-check of this device found in the results folder, or None.
        hub_unreachable: why the Hub was found unreachable when the controller planned (set by
            :func:`plan_models`), None when it answered; the workers' settings carry it, so their runs
            are offline too.
        cpu_threads: the intra-op CPU threads of every process run for a model (:func:`resolve_cpu_threads`),
            None to leave the environment's OMP_NUM_THREADS as the user set it.
    """

    device: str
    cores: tuple[int, ...]
    pool: int
    core_bytes: int
    neuronx_cc: str
    session: str
    self_check: str | None = None
    hub_unreachable: str | None = None
    cpu_threads: int | None = None

    def to_workerinput(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cores": list(self.cores)}

    @classmethod
    def from_workerinput(cls, data: dict[str, Any]) -> Resolved:
        return cls(**{**data, "cores": tuple(data["cores"])})


def resolve_device(options: Options) -> Resolved:
    """The device kind, this session's slice of its cores, the pool, bytes per core and the
    compiler version, from the options and, where needed, probe subprocesses."""
    try:
        found = find_device(options.device)
    except DeviceNotFound as exc:
        raise pytest.UsageError(str(exc)) from None
    except Exception as exc:  # a broken torch install is the user's to fix, said plainly
        raise pytest.UsageError(f"could not probe devices: {exc}") from None
    core_memory, available = found.core_memory, found.available
    options = Options(**{**options.__dict__, "device": found.kind.name})
    kind = DEVICES[options.device]
    # cpu "cores" are slots for ranks (max_pool of them), any number of which a session may use.
    try:
        cores = session_cores(kind.visible_env_vars, kind.max_pool or available)
    except ValueError as exc:
        raise pytest.UsageError(f"the slice of cores this session was given is unreadable: {exc}") from None
    limit = len(cores)
    if options.neuron_cores is not None and options.neuron_cores > limit:
        raise pytest.UsageError(
            f"--neuron-cores={options.neuron_cores} is more than the {limit} core(s) this session may use on the "
            f"{options.device} device; pass at most {limit}"
        )
    if options.core_memory_gib is not None:
        core_bytes = int(options.core_memory_gib * (1 << 30))
    else:
        core_bytes = core_memory or fallback_core_bytes(kind)
    default_pool = min(limit, available) if kind.max_pool else limit
    return Resolved(
        device=options.device,
        cores=cores,
        pool=options.neuron_cores or default_pool,
        core_bytes=core_bytes,
        neuronx_cc=compiler_version(kind),
        session=uuid.uuid4().hex[:12],
        self_check=read_self_check(options.results_dir, options.device),
    )


def resolve_cpu_threads(
    config: pytest.Config, options: Options, environ: Mapping[str, str], cpus: int | None = None
) -> int | None:
    """``--cpu-threads``; else, where the environment sets OMP_NUM_THREADS, None (the runs inherit the
    user's choice); else the usable CPUs (``cpus``, default :func:`usable_cpus`) shared among the
    session's workers (``planning.cpu_threads``; ``-n N`` is N workers, none is one). Decided once, on
    the controller, which alone knows how many xdist workers there are."""
    if options.cpu_threads is not None:
        return options.cpu_threads
    if environ.get("OMP_NUM_THREADS"):
        return None
    workers = max(1, int(config.getoption("numprocesses", 0) or 0))
    return cpu_threads(usable_cpus() if cpus is None else cpus, workers)


def with_judge(options: Options, catalog: Catalog | None = None) -> Options:
    """The judge, decided here only: ``--judge-model``, else the catalog's ``judge:``, else the default
    (a session without a catalog: the default)."""
    if options.judge_model is not None:
        model, revision = options.judge_model, "main"
    elif catalog is not None and catalog.judge_model:
        model, revision = catalog.judge_model, catalog.judge_revision
    else:
        model, revision = DEFAULT_JUDGE, "main"
    return dataclasses.replace(options, judge_model=model, judge_revision=options.judge_revision or revision)


def settings_for(options: Options, resolved: Resolved) -> Settings:
    """The session's settings from the options (their judge resolved by :func:`with_judge`) and what
    the controller found out."""
    kind = DEVICES[resolved.device]
    if options.judge_model is None or options.judge_revision is None:
        raise ValueError("settings_for needs the judge resolved first: with_judge(options, catalog)")
    return Settings(
        device=kind,
        pool_cores=resolved.pool,
        pool_slice=resolved.cores,
        session=resolved.session,
        self_check=resolved.self_check,
        hub_unreachable=resolved.hub_unreachable,
        cpu_threads=resolved.cpu_threads,
        max_new_tokens=options.max_new_tokens,
        prompt=options.prompt,
        model_timeout=options.model_timeout,
        results_dir=options.results_dir,
        compile_backend=options.compile_backend or kind.compile_backend,
        reference_dtype=options.reference_dtype,
        allow_remote_code=options.allow_remote_code,
        judge_model=options.judge_model,
        judge_revision=options.judge_revision,
        parity=options.parity,
        reference_cache=options.reference_cache,
        compile_cache=neffcache.session_cache_base(kind, options.neff_cache, os.environ),
        host_memory_limit=None if options.host_memory_gib is None else int(options.host_memory_gib * (1 << 30)),
        cpu_check_memory=None
        if options.cpu_check_memory_gib is None
        else int(options.cpu_check_memory_gib * (1 << 30)),
        stack=dataclasses.replace(current_stack(), neuronx_cc=resolved.neuronx_cc),
        core_bytes=resolved.core_bytes,
        headroom=options.memory_headroom,
        max_cores=options.max_cores,
        lease_dir=options.core_ledger,
    )


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
    writer = ResultsWriter(config.stash[settings_key], config.stash[catalog_key])
    config.stash[writer_key] = writer
    config.pluginmanager.register(writer, "neuron-support-results-writer")
    if config.getoption("dist", "no") != "no":
        # xdist: plan the selected models here, once, and hand the plans to the workers (workerinput).
        models = config.stash[catalog_key]
        config.stash[plans_key] = plan_models(config, selected_models(config, models))
    settings = config.stash[settings_key]
    progress = Progress(
        config,
        settings.results_dir,
        settings.device.name,
        settings.pool_cores,
        settings.lease_dir,
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
        from pytest_neuron_support.session.items import progress_plan

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
    process started for a model then runs with ``HF_HUB_OFFLINE=1`` (``pipeline.session_env``): a
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
