"""pytest wiring only: options, collection of catalog entries, and the row writer.

The work itself lives in modules named by concern (catalog, pipeline, execution, checks,
dataset, ...). torch and transformers are never imported here: ``pytest --help`` stays
fast, and the controller process never initialises a device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from . import hooks
from .caches import clean_compile_cache
from .catalog import DEFAULT_PROMPT, DTYPES, CatalogError, ModelSpec, cli_model, load_catalog, merge_models
from .checks import DEFAULT_JUDGE, PARITY_MODES
from .cores import default_ledger_dir, session_cores
from .dataset import (
    PartWriter,
    check_writable,
    dump_rows,
    expected_seconds_from_dataset,
    read_dataset,
    recover_parts,
    write_rows,
)
from .devices import AUTO_ORDER, DEVICES, DeviceNotFound, compiler_version, fallback_core_bytes, find_device
from .execution import end_with_parent
from .pipeline import (
    Settings,
    base_row,
    core_pool,
    gate,
    plan_model,
    planned_row,
    prior_seconds,
    read_self_check,
    run_model,
    settings_hash,
    slug,
)
from .planning import CORE_CHOICES, DEFAULT_HEADROOM, DEFAULT_MAX_CORES, Plan
from .records import Row, current_stack
from .sharding import Shard, ShardError, assign, parse_shard, shard_from_env

ROW_PROPERTY = "neuron_support_row"
DEFAULT_CACHE_HOME = Path(os.environ.get("NEURON_SUPPORT_CACHE", "~/.cache/neuron-support"))
WORKERINPUT_KEY = "neuron_support"


@dataclass(frozen=True)
class Options:
    """Validated command-line options (before the device is probed)."""

    models_file: Path
    models_file_explicit: bool
    extra_models: tuple[ModelSpec, ...]
    device: str
    neuron_cores: int | None
    max_new_tokens: int
    prompt: str
    model_timeout: float
    results_dir: Path
    compile_backend: str | None
    reference_dtype: str | None
    allow_remote_code: bool
    judge_model: str | None
    judge_revision: str | None
    parity: str
    shard: Shard | None
    resume: bool
    neff_cache: Path | None
    reference_cache: Path | None
    host_memory_gib: float | None
    cpu_check_memory_gib: float | None
    core_ledger: Path
    core_memory_gib: float | None
    memory_headroom: float
    max_cores: int


options_key = pytest.StashKey[Options]()
resolved_key = pytest.StashKey["Resolved"]()
settings_key = pytest.StashKey[Settings]()
catalog_key = pytest.StashKey[tuple[ModelSpec, ...]]()
writer_key = pytest.StashKey["ResultsWriter"]()
model_key = pytest.StashKey[ModelSpec]()
plan_key = pytest.StashKey[Plan]()
#: cores x expected seconds: the item's place in the sweep and in the core ledger's queue.
cost_key = pytest.StashKey[float]()
#: (model id, device) -> (result, settings hash) of rows already in the dataset (--resume).
recorded_key = pytest.StashKey[dict[tuple[str, str], tuple[str, str]]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)
    # The public fixtures and markers; fixtures.py builds on this module, so it is imported once this one is.
    from . import fixtures

    pluginmanager.register(fixtures, "neuron-support-fixtures")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("neuron-support", "model support on AWS Trainium (pytest-neuron-support)")
    group.addoption(
        "--models-file",
        default=None,
        metavar="PATH",
        help="catalog of models to check (default: models.yaml in the rootdir)",
    )
    group.addoption(
        "--model",
        action="append",
        default=[],
        metavar="ID",
        help="also check this Hub id (org/name) or local checkpoint (./dir); repeatable",
    )
    group.addoption(
        "--device",
        default="auto",
        choices=("auto", *AUTO_ORDER),
        help="device to run on; auto = neuron if torch-neuronx sees cores, else cuda, else cpu",
    )
    group.addoption(
        "--neuron-cores",
        default=None,
        metavar="N",
        help="size of the core pool items lease from (default: every core the device reports)",
    )
    group.addoption("--max-new-tokens", default="32", metavar="N", help="greedy tokens per run (default 32)")
    group.addoption("--prompt", default=DEFAULT_PROMPT, help="prompt for entries that set none")
    group.addoption(
        "--model-timeout",
        default="3600",
        metavar="SECONDS",
        help="seconds one run.py may take before its process group is killed (default 3600)",
    )
    group.addoption(
        "--results-dir",
        default="results",
        metavar="DIR",
        help="dataset folder: Parquet under DIR/data, run.py and logs under DIR/runs (default results)",
    )
    group.addoption(
        "--compile-backend",
        default=None,
        metavar="NAME",
        help="torch.compile backend for device runs (default: the device's: neuron, inductor)",
    )
    group.addoption(
        "--reference-dtype",
        default=None,
        choices=DTYPES,
        help="dtype of the CPU reference run (default: the device run's dtype)",
    )
    group.addoption(
        "--max-cores",
        default=str(DEFAULT_MAX_CORES),
        metavar="N",
        help=f"most cores one model may use (default {DEFAULT_MAX_CORES})",
    )
    group.addoption(
        "--core-memory-gib",
        default=None,
        metavar="GIB",
        help="memory of one core for planning (default: what the device reports; 24 on cpu, as a trn2 "
        "logical core at LNC=2)",
    )
    group.addoption(
        "--memory-headroom",
        default=str(DEFAULT_HEADROOM),
        metavar="FRACTION",
        help=f"fraction of each core kept free for KV cache, activations and runtime (default {DEFAULT_HEADROOM})",
    )
    group.addoption(
        "--allow-remote-code",
        action="store_true",
        default=False,
        help="run Hub repository code for catalog entries that set trust_remote_code: true",
    )
    group.addoption(
        "--judge-model",
        default=None,
        metavar="ID",
        help="small instruct model that judges whether a sharded run's text is fluent "
        f"(default: the catalog's 'judge:', else {DEFAULT_JUDGE})",
    )
    group.addoption(
        "--shard",
        default=None,
        metavar="I/N",
        help="run shard I of N (0-based), balanced by expected cost; also read from SLURM_ARRAY_TASK_ID/COUNT "
        "and JOB_COMPLETION_INDEX with NEURON_SUPPORT_SHARDS",
    )
    group.addoption(
        "--resume",
        action="store_true",
        default=False,
        help="skip models that already have a row for this stack and the same settings",
    )
    group.addoption(
        "--host-memory-gib",
        default=None,
        metavar="GIB",
        help="cap each run.py's address space (host memory exhaustion becomes that model's ERROR row)",
    )
    group.addoption(
        "--core-ledger",
        default=None,
        metavar="DIR",
        help="where every pytest session on this host keeps its core leases (default: $NEURON_SUPPORT_CORE_LEDGER, "
        "else <tmp>/neuron-support-cores); sessions sharing it never lease the same core",
    )
    group.addoption(
        "--cpu-check-memory-gib",
        default=None,
        metavar="GIB",
        help="host memory the teacher-forced CPU check of a sharded run may take (default: what the host has "
        "available); a model that needs more is judged by the fluency judge alone, and its row says so",
    )
    group.addoption(
        "--neff-cache",
        default=None,
        metavar="DIR",
        help="compile cache for run.py: TORCH_NEURONX_NEFF_CACHE_DIR on neuron, TORCHINDUCTOR_CACHE_DIR elsewhere; "
        "stale locks and failed entries are cleaned before the sweep",
    )
    group.addoption(
        "--reference-cache",
        default=str(DEFAULT_CACHE_HOME / "reference"),
        metavar="DIR",
        help="where CPU reference results are cached ('none' to always rerun them)",
    )
    group.addoption("--judge-revision", default=None, metavar="REV", help="revision of --judge-model (default main)")
    group.addoption(
        "--parity",
        default="exact",
        choices=PARITY_MODES,
        help="exact: every token equal (default); near-tie: also pass when the first divergence is a near-tie",
    )


def _positive_int(value: str, flag: str, upper: int | None = None) -> int:
    try:
        number = int(value)
    except ValueError:
        raise pytest.UsageError(f"{flag}={value!r} is not an integer; pass a whole number, e.g. {flag}=4") from None
    if number < 1 or (upper is not None and number > upper):
        bound = f" and at most {upper}" if upper is not None else ""
        raise pytest.UsageError(f"{flag}={value} is out of range; pass a number of at least 1{bound}")
    return number


def parse_options(config: pytest.Config) -> Options:
    """Validate every option without touching the device; raise UsageError with the fix."""
    get = config.getoption
    explicit = get("models_file") is not None
    models_file = Path(get("models_file")) if explicit else config.rootpath / "models.yaml"
    try:
        extra = tuple(cli_model(arg) for arg in get("model"))
    except CatalogError as exc:
        raise pytest.UsageError(str(exc)) from None
    timeout_text = get("model_timeout")
    try:
        timeout = float(timeout_text)
    except ValueError:
        timeout = -1.0
    if not timeout > 0:
        raise pytest.UsageError(f"--model-timeout={timeout_text!r} must be a positive number of seconds, e.g. 3600")
    prompt = get("prompt")
    if not prompt.strip():
        raise pytest.UsageError("--prompt is empty; pass some text or leave the option out")
    cores = get("neuron_cores")
    memory = get("core_memory_gib")
    return Options(
        models_file=models_file.resolve(),
        models_file_explicit=explicit,
        extra_models=extra,
        device=get("device"),
        neuron_cores=None if cores is None else _positive_int(cores, "--neuron-cores"),
        max_new_tokens=_positive_int(get("max_new_tokens"), "--max-new-tokens", 4096),
        prompt=prompt,
        model_timeout=timeout,
        results_dir=Path(get("results_dir")).resolve(),
        compile_backend=get("compile_backend"),
        reference_dtype=get("reference_dtype"),
        allow_remote_code=get("allow_remote_code"),
        judge_model=None if get("judge_model") is None else _judge_model(get("judge_model")),
        judge_revision=get("judge_revision"),
        parity=get("parity"),
        core_memory_gib=None if memory is None else _positive_float(memory, "--core-memory-gib", "24"),
        memory_headroom=_fraction(get("memory_headroom")),
        max_cores=_core_choice(get("max_cores")),
        shard=_shard(get("shard")),
        resume=get("resume"),
        neff_cache=None if get("neff_cache") is None else Path(get("neff_cache")).resolve(),
        reference_cache=None if get("reference_cache") == "none" else Path(get("reference_cache")).expanduser(),
        host_memory_gib=None
        if get("host_memory_gib") is None
        else _positive_float(get("host_memory_gib"), "--host-memory-gib", "64"),
        cpu_check_memory_gib=None
        if get("cpu_check_memory_gib") is None
        else _positive_float(get("cpu_check_memory_gib"), "--cpu-check-memory-gib", "512"),
        core_ledger=Path(get("core_ledger")).resolve() if get("core_ledger") else default_ledger_dir(),
    )


def _shard(value: str | None) -> Shard | None:
    try:
        return parse_shard(value) if value is not None else shard_from_env(os.environ)
    except ShardError as exc:
        raise pytest.UsageError(str(exc)) from None


def _judge_model(value: str) -> str:
    try:
        return cli_model(value).id
    except CatalogError:
        raise pytest.UsageError(
            f"--judge-model={value!r} is not a Hub id or an existing directory; pass e.g. --judge-model={DEFAULT_JUDGE}"
        ) from None


def _positive_float(value: str, flag: str, example: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0:
        raise pytest.UsageError(f"{flag}={value!r} must be a positive number, e.g. {flag}={example}")
    return number


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number < 1:
        raise pytest.UsageError(f"--memory-headroom={value!r} must be a fraction in [0, 1), e.g. 0.25")
    return number


def _core_choice(value: str) -> int:
    number = _positive_int(value, "--max-cores")
    if number not in CORE_CHOICES:
        raise pytest.UsageError(
            f"--max-cores={value} is not a core count a model can use; pass one of {', '.join(map(str, CORE_CHOICES))}"
        )
    return number


def _sweep_requested(config: pytest.Config, options: Options) -> bool:
    """Whether this session will collect the catalog (so the device must be resolved)."""
    if options.models_file_explicit or options.extra_models:
        return True
    target = options.models_file
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
    """

    device: str
    cores: tuple[int, ...]
    pool: int
    core_bytes: int
    neuronx_cc: str
    session: str
    self_check: str | None = None

    def to_workerinput(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cores": list(self.cores)}

    @classmethod
    def from_workerinput(cls, data: dict[str, Any]) -> Resolved:
        return cls(**{**data, "cores": tuple(data["cores"])})


def _resolve_device(options: Options) -> Resolved:
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


def _settings(options: Options, resolved: Resolved) -> Settings:
    kind = DEVICES[resolved.device]
    return Settings(
        device=kind,
        pool_cores=resolved.pool,
        pool_slice=resolved.cores,
        session=resolved.session,
        self_check=resolved.self_check,
        max_new_tokens=options.max_new_tokens,
        prompt=options.prompt,
        model_timeout=options.model_timeout,
        results_dir=options.results_dir,
        compile_backend=options.compile_backend or kind.compile_backend,
        reference_dtype=options.reference_dtype,
        allow_remote_code=options.allow_remote_code,
        judge_model=options.judge_model or DEFAULT_JUDGE,
        judge_revision=options.judge_revision or "main",
        parity=options.parity,
        reference_cache=options.reference_cache,
        compile_cache=options.neff_cache,
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


def pytest_configure(config: pytest.Config) -> None:
    options = parse_options(config)
    config.stash[options_key] = options
    if options.models_file_explicit and config.args_source != pytest.Config.ArgsSource.ARGS:
        # `pytest --models-file=x.yaml` collects that file instead of the default test paths.
        config.args = [str(options.models_file)]
    if not _sweep_requested(config, options):
        return
    if options.extra_models and not options.models_file.exists():
        raise pytest.UsageError(
            f"--model needs a catalog to add to, and {options.models_file} does not exist; "
            "pass --models-file=FILE (a file holding just 'models: []' works)"
        )
    try:
        catalog = load_catalog(options.models_file)
    except CatalogError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[catalog_key] = merge_models(catalog.models, options.extra_models)
    # The judge: --judge-model, else the catalog's 'judge:', else the default.
    if options.judge_model is None:
        judge = (catalog.judge_model, catalog.judge_revision) if catalog.judge_model else (DEFAULT_JUDGE, "main")
    else:
        judge = (options.judge_model, "main")
    options = dataclasses.replace(options, judge_model=judge[0], judge_revision=options.judge_revision or judge[1])
    config.stash[options_key] = options
    if _is_worker(config):
        # A worker ends with its controller: its run.py (and that run's ranks) then end with it.
        end_with_parent()
        shared = config.workerinput[WORKERINPUT_KEY]  # type: ignore[attr-defined]
        config.stash[settings_key] = _settings(options, Resolved.from_workerinput(shared))
        _load_recorded(config)
        return
    resolved = _resolve_device(options)
    config.stash[resolved_key] = resolved
    config.stash[settings_key] = _settings(options, resolved)
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
            recorded[(row.model_id, row.device)] = (row.result, row.settings_hash)
    config.stash[recorded_key] = recorded


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand the resolved device to workers so they never probe it."""
    resolved = node.config.stash.get(resolved_key, None)
    if resolved is not None:
        node.workerinput[WORKERINPUT_KEY] = resolved.to_workerinput()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """A model sweep under the default ``--dist load`` deals items out in cost order."""
    if config.stash.get(settings_key, None) is None or config.getvalue("dist") != "load":
        return None
    from .scheduling import CostOrderScheduling

    return CostOrderScheduling(config, log)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    config = parent.config
    if catalog_key not in config.stash:
        return None
    if file_path.resolve() != config.stash[options_key].models_file:
        return None
    return CatalogFile.from_parent(parent, path=file_path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
        if plan is None or plan.skip is not None:
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
        settings = self.config.stash[settings_key]
        local_only = False
        for model in self.config.stash[catalog_key]:
            item = ModelItem.from_parent(self, name=model.id)
            item.stash[model_key] = model
            if gate(model, settings) is None:
                plan, unreachable = plan_model(model, settings, local_only=local_only)
                # Once the Hub proved unreachable, plan the rest from the local cache only:
                # otherwise every model would wait through the client's retries.
                local_only = local_only or unreachable
                item.stash[plan_key] = plan
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
            if row.result != "SKIPPED":
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
        if plan.skip is not None:
            return f"<ModelItem {self.name} skipped: {plan.skip}>"
        return f"<ModelItem {self.name} cores={plan.cores} tp={plan.tp_size} ep={plan.ep_size}: {plan.reason}>"

    def reportinfo(self) -> tuple[Path, int, str]:
        model = self.stash[model_key]
        return self.path, max(model.line - 1, 0), f"{model.id} [{model.task}]"


def _row_from_report(report: pytest.TestReport) -> Row | None:
    # Every phase's report carries a catalog item's user_properties (read its call's); a user's test
    # attaches its row to the report that decided it: its call, or a setup that failed or skipped.
    # xdist's report of a crashed worker (when "???") carries the row pytest_handlecrashitem made.
    if report.when not in ("call", "setup", "???"):
        return None
    for name, value in report.user_properties:
        if name == ROW_PROPERTY:
            return Row.from_json(str(value))
    return None


class ResultsWriter:
    """Controller-only: collects rows from (xdist worker) reports, like pytest's junitxml.

    Each row is written crash-safely the moment its item reports; at session end the rows
    are merged into the Parquet dataset.
    """

    def __init__(self, settings: Settings, models: tuple[ModelSpec, ...]) -> None:
        self.settings = settings
        self.models = {model.id: model for model in models}
        self.parts = PartWriter(settings.results_dir)
        self.rows: list[Row] = []
        self.written: list[Path] = []
        # Rows the results directory refused (disk filled mid-sweep): kept in memory, never dropped.
        self.unsaved: list[Row] = []
        self.write_error: OSError | None = None
        self.rescued: Path | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist: a worker died while running ``crashitem`` (its report follows). A catalog item's row
        never reached the controller, so the controller writes one; the sweep goes on with a new worker."""
        model = self.models.get(crashitem.rsplit("::", 1)[-1])  # a catalog item is named by its model id
        if model is None:
            return  # not a catalog item (a user's test attaches its own row; a plain test has none)
        row = replace(
            base_row(model, self.settings),
            failure_stage="harness",
            verdict_basis="run",
            error=f"the pytest worker died while checking this model: {report.longrepr}",
        )
        report.user_properties.append((ROW_PROPERTY, row.to_json()))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = _row_from_report(report)
        if row is None:
            return
        self.rows.append(row)
        try:
            self.parts.add(row)
        except OSError as exc:
            self.unsaved.append(row)
            self.write_error = exc

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        try:
            self.written = write_rows(self.settings.results_dir, [*self.parts.rows(), *self.unsaved])
            shutil.rmtree(self.parts.directory, ignore_errors=True)
        except OSError as exc:
            self.write_error = exc
            self._rescue(session)

    def _rescue(self, session: pytest.Session) -> None:
        """The results directory refused the dataset: put every row somewhere else, and fail."""
        rows = [*self.parts.rows(), *self.unsaved]
        with contextlib.suppress(OSError):
            self.rescued = dump_rows(rows, Path(tempfile.mkdtemp(prefix="neuron-support-unsaved-")))
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        tr = terminalreporter
        tr.section("neuron-support results")
        width = max(len(r.model_id) for r in self.rows)
        tr.write_line(
            f"{'model':<{width}}  {'result':<8} {'stage':<9} {'cores':>5} {'run_s':>8} {'compile_s':>9}  evidence"
        )
        for row in sorted(self.rows, key=lambda r: r.model_id):
            run_s = f"{row.run_s:.1f}" if row.run_s is not None else "-"
            compile_s = f"{row.compile_s:.1f}" if row.compile_s is not None else "-"
            cores = row.neuron_cores if row.neuron_cores is not None else "-"
            # A PASS that ran operations on the host says so on its own line of the table.
            host = (
                f"; {len(row.fallback_ops)} op(s) ran on the host: {', '.join(row.fallback_ops)}"
                if row.fallback_ops
                else ""
            )
            tr.write_line(
                f"{row.model_id:<{width}}  {row.result:<8} {row.failure_stage or '-':<9} "
                f"{cores:>5} {run_s:>8} {compile_s:>9}  {row.verdict_basis or '-'}{host}"
            )
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.result] = counts.get(row.result, 0) + 1
        tr.write_line(", ".join(f"{n} {result}" for result, n in sorted(counts.items())))
        for path in self.written:
            tr.write_line(f"Parquet: {path}")
        if self.write_error is not None:
            results = self.settings.results_dir
            tr.write_line(f"could not write rows to {results}: {self.write_error}", red=True, bold=True)
            if self.rescued is not None:
                tr.write_line(
                    f"all {len(self.rows)} rows were saved in {self.rescued}; free space, then recover them with: "
                    f"neuron-support merge {self.rescued} --into {results}",
                    red=True,
                )
            else:
                tr.write_line("no other directory took them either; the rows, one JSON per line:", red=True)
                for row in self.rows:
                    tr.write_line(row.to_json())
        data = self.settings.results_dir / "data"
        tr.write_line(f"Read it back: pandas.read_parquet({json.dumps(str(data))})")
