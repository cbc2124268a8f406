"""Command-line options: declared with argparse ``type=`` validators that raise ``UsageError``
naming the flag, the value and the fix, and read once into one :class:`Options`.

Validators return plain values (int, float, str): xdist ships ``config.option`` to its workers,
and only plain values travel. Paths, the shard and ``--model`` entries are built in
:func:`parse_options`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_support.base.model import DEFAULT_PROMPT, DTYPES, ModelSpec
from pytest_neuron_support.base.storage import cache_home
from pytest_neuron_support.catalog.load import CatalogError, cli_model
from pytest_neuron_support.checks.registry import CHECKS
from pytest_neuron_support.devices.table import AUTO_ORDER
from pytest_neuron_support.planning.planner import CORE_CHOICES, DEFAULT_HEADROOM, DEFAULT_MAX_CORES
from pytest_neuron_support.run.cores import default_ledger_dir
from pytest_neuron_support.session.sharding import Shard, ShardError, parse_shard, shard_from_env
from pytest_neuron_support.verdict.fluency import DEFAULT_JUDGE
from pytest_neuron_support.verdict.tokens import PARITY_MODES

DEFAULT_CACHE_HOME = cache_home()


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
    progress_interval: float = 60.0
    #: ``--cpu-threads``: intra-op CPU threads of each process run for a model; None: ``auto``.
    cpu_threads: int | None = None
    #: ``--check``: the checks every entry gets this run (None: each entry's own ``checks:``).
    checks: tuple[str, ...] | None = None
    #: ``--cpu-side-starts``: ``warm`` (CPU-side scripts fork a warm interpreter, on Linux) or ``fresh``.
    cpu_side_starts: str = "warm"


#: The plugin's options that take a value (filled by :func:`add_options`).
VALUE_OPTIONS: set[str] = set()


def add_options(parser: pytest.Parser) -> None:
    """The plugin's command-line options (``pytest --help`` lists them under neuron-support)."""
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
        type=positive_int("--neuron-cores"),
        default=None,
        metavar="N",
        help="size of the core pool items lease from (default: every core the device reports)",
    )
    group.addoption(
        "--max-new-tokens",
        type=positive_int("--max-new-tokens", 4096),
        default="32",
        metavar="N",
        help="greedy tokens per run (default 32)",
    )
    group.addoption("--prompt", type=prompt_text, default=DEFAULT_PROMPT, help="prompt for entries that set none")
    group.addoption(
        "--model-timeout",
        type=seconds("--model-timeout"),
        default="3600",
        metavar="SECONDS",
        help="seconds one run.py may take before its process group is killed (default 3600)",
    )
    group.addoption(
        "--progress-interval",
        type=non_negative_seconds("--progress-interval"),
        default="60",
        metavar="SECONDS",
        help="seconds between the sweep's status lines (running with their stage, done, left, time left); "
        "0 for none. The start and end line of each model are printed either way; -q silences all of them",
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
        type=core_choice,
        default=str(DEFAULT_MAX_CORES),
        metavar="N",
        help=f"most cores one model may use (default {DEFAULT_MAX_CORES})",
    )
    group.addoption(
        "--core-memory-gib",
        type=positive_float("--core-memory-gib", "24"),
        default=None,
        metavar="GIB",
        help="memory of one core for planning (default: cuda: what the device reports; neuron: LNC x 12, 24 at "
        "the default LNC=2, since reading the device's figure would reserve every core; cpu: 24, as a trn2 "
        "logical core at LNC=2)",
    )
    group.addoption(
        "--memory-headroom",
        type=fraction("--memory-headroom"),
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
        type=judge_model_id,
        default=None,
        metavar="ID",
        help="small instruct model that judges whether a sharded run's text is fluent "
        f"(default: the catalog's 'judge:', else {DEFAULT_JUDGE})",
    )
    group.addoption(
        "--shard",
        type=shard_spec,
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
        type=positive_float("--host-memory-gib", "64"),
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
        type=positive_float("--cpu-check-memory-gib", "512"),
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
        "--check",
        dest="neuron_checks",
        action="append",
        type=check_list,
        default=None,
        metavar="CHECK",
        help="which checks this run makes of every entry: inference (run.py), train (train.py: a few Trainer "
        "steps against CPU; text-generation entries only); repeatable or comma-separated "
        "(default: each entry's own checks:, else inference)",
    )
    group.addoption(
        "--cpu-threads",
        type=cpu_threads,
        default="auto",
        metavar="N",
        help="CPU threads (OMP_NUM_THREADS) of every process run for a model; auto (default): the usable CPUs "
        "shared among the workers' concurrent runs (a device run beside its CPU reference), at least 1, or "
        "OMP_NUM_THREADS where the environment sets it",
    )
    group.addoption(
        "--cpu-side-starts",
        default="warm",
        choices=("warm", "fresh"),
        help="warm (default, on Linux): the CPU side's scripts (reference, CPU check, judge) and the cpu "
        "device's runs of one rank start as forks of an interpreter that imported torch and transformers "
        "once; fresh: each is a new python process, as device runs on neuron and cuda always are",
    )
    group.addoption(
        "--parity",
        default="exact",
        choices=PARITY_MODES,
        help="exact: every token equal (default); near-tie: also pass when the first divergence is a near-tie",
    )
    VALUE_OPTIONS.update(
        name
        for option in group.options
        if option.attrs().get("action") not in ("store_true", "store_false", "count")
        for name in option.names()
    )


# argparse ``type=`` validators. Each raises UsageError (pytest prints it as one ERROR line and exits
# with its usage status) naming the flag, the value and the fix; each returns a plain value.


def positive_int(flag: str, upper: int | None = None) -> Callable[[str], int]:
    """A whole number of at least 1 (and at most ``upper``)."""

    def check(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise pytest.UsageError(f"{flag}={value!r} is not an integer; pass a whole number, e.g. {flag}=4") from None
        if number < 1 or (upper is not None and number > upper):
            bound = f" and at most {upper}" if upper is not None else ""
            raise pytest.UsageError(f"{flag}={value} is out of range; pass a number of at least 1{bound}")
        return number

    return check


def number_in(flag: str, accepts: Callable[[float], bool], must: str) -> Callable[[str], float]:
    """A number ``accepts`` takes; otherwise a UsageError saying what it ``must`` be (with an example)."""

    def check(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = float("nan")  # accepted by no range below
        if not accepts(number):
            raise pytest.UsageError(f"{flag}={value!r} must be {must}")
        return number

    return check


def positive_float(flag: str, example: str, what: str = "number") -> Callable[[str], float]:
    """A number above 0 (``what`` names it in the error, e.g. "number of seconds")."""
    return number_in(flag, lambda n: n > 0, f"a positive {what}, e.g. {flag}={example}")


def seconds(flag: str) -> Callable[[str], float]:
    """A positive number of seconds."""
    return positive_float(flag, "3600", what="number of seconds")


def non_negative_seconds(flag: str) -> Callable[[str], float]:
    """A number of seconds, 0 or more."""
    return number_in(flag, lambda n: n >= 0, f"0 or a positive number of seconds, e.g. {flag}=60")


def fraction(flag: str) -> Callable[[str], float]:
    """A fraction in [0, 1)."""
    return number_in(flag, lambda n: 0 <= n < 1, "a fraction in [0, 1), e.g. 0.25")


def core_choice(value: str) -> int:
    """--max-cores: a core count a plan can have."""
    number = positive_int("--max-cores")(value)
    if number not in CORE_CHOICES:
        raise pytest.UsageError(
            f"--max-cores={value} is not a core count a model can use; pass one of {', '.join(map(str, CORE_CHOICES))}"
        )
    return number


def prompt_text(value: str) -> str:
    """--prompt: some text."""
    if not value.strip():
        raise pytest.UsageError("--prompt is empty; pass some text or leave the option out")
    return value


def judge_model_id(value: str) -> str:
    """--judge-model: a Hub id or an existing directory (its absolute path)."""
    try:
        return cli_model(value).id
    except CatalogError:
        raise pytest.UsageError(
            f"--judge-model={value!r} is not a Hub id or an existing directory; pass e.g. --judge-model={DEFAULT_JUDGE}"
        ) from None


def check_list(value: str) -> tuple[str, ...]:
    """--check: one check, or a comma-separated list of them."""
    names = tuple(part.strip() for part in value.split(","))
    for name in names:
        if name not in CHECKS:
            raise pytest.UsageError(
                f"--check={value!r}: unknown check {name!r}; pass one or more of {', '.join(CHECKS)}, "
                "e.g. --check=train or --check=inference,train"
            )
    return names


def cpu_threads(value: str) -> int | None:
    """--cpu-threads: ``auto`` (None) or a whole number of threads."""
    if value == "auto":
        return None
    try:
        return positive_int("--cpu-threads")(value)
    except pytest.UsageError as exc:
        raise pytest.UsageError(f"{exc}, or --cpu-threads=auto") from None


def shard_spec(value: str) -> str:
    """--shard I/N, checked here and parsed again into a Shard by :func:`parse_options`."""
    try:
        parse_shard(value)
    except ShardError as exc:
        raise pytest.UsageError(str(exc)) from None
    return value


def check_rootdir(config: pytest.Config) -> None:
    """A UsageError when pytest chose its rootdir from the value of one of these options.

    pytest picks its rootdir and configuration file before it loads plugins, so in
    ``pytest --results-dir /some/dir`` it reads ``/some/dir`` as a test path: once that folder exists,
    the rootdir moves there (or to a common ancestor) and the project's configuration is not read,
    so its ``testpaths`` (the catalog) and its node ids are lost. With ``--results-dir=/some/dir``
    nothing is misread. The rootdir pytest would have chosen without the value is worked out the way
    pytest works it out; only where it differs is the run stopped.
    """
    try:
        from _pytest.config.findpaths import determine_setup
    except ImportError:  # pragma: no cover - pytest moved it: nothing to compare with
        return
    args = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *config.invocation_params.args]
    here = config.invocation_params.dir
    spaced = [
        (flag, value) for flag, value in itertools.pairwise(args) if flag in VALUE_OPTIONS and (here / value).exists()
    ]
    if not spaced:
        return
    try:
        rootpath, inipath, _, _ = determine_setup(
            inifile=config.option.inifilename,
            override_ini=config.option.override_ini,
            args=config.option.file_or_dir,
            rootdir_cmd_arg=config.option.rootdir or None,
            invocation_dir=here,
        )
    except Exception:  # pytest will say what is wrong with the arguments itself
        return
    if (rootpath, inipath) == (config.rootpath, config.inipath):
        return
    flag, value = spaced[0]
    found = f"configuration {config.inipath}" if config.inipath is not None else "no configuration file"
    meant = f"{rootpath} ({inipath})" if inipath is not None else str(rootpath)
    raise pytest.UsageError(
        f"{flag} {value}: pytest read {value!r} as a test path when it chose its rootdir, so the rootdir is "
        f"{config.rootpath} with {found} instead of {meant}; write {flag}={value}"
    )


def parse_options(config: pytest.Config) -> Options:
    """Validate every option without touching the device; raise UsageError with the fix.

    Every field of :class:`Options` takes the option of its own name (its ``dest``): a new option is
    its declaration in :func:`add_options` and a field here, and reaches the settings and the rows by
    that same name. Only the values below are built from what argparse returned (paths, the shard,
    the ``--model`` entries: xdist ships ``config.option`` to its workers, which holds plain values)."""
    check_rootdir(config)
    get = config.getoption
    explicit = get("models_file") is not None
    models_file = Path(get("models_file")) if explicit else config.rootpath / "models.yaml"
    try:
        extra = tuple(cli_model(arg) for arg in get("model"))
    except CatalogError as exc:
        raise pytest.UsageError(str(exc)) from None
    built: dict[str, Any] = {
        "models_file": models_file.resolve(),
        "models_file_explicit": explicit,
        "extra_models": extra,
        "results_dir": Path(get("results_dir")).resolve(),
        "shard": _shard(get("shard")),
        "neff_cache": None if get("neff_cache") is None else Path(get("neff_cache")).resolve(),
        "reference_cache": None if get("reference_cache") == "none" else Path(get("reference_cache")).expanduser(),
        "core_ledger": Path(get("core_ledger")).resolve() if get("core_ledger") else default_ledger_dir(),
        "checks": _checks(get("neuron_checks")),
    }
    return Options(**{f.name: built[f.name] if f.name in built else get(f.name) for f in dataclasses.fields(Options)})


def _checks(groups: list[tuple[str, ...]] | None) -> tuple[str, ...] | None:
    """Every --check given (each a tuple from :func:`check_list`), in the table's order; None for none."""
    if groups is None:
        return None
    return tuple(check for check in CHECKS if any(check in group for group in groups))


def _shard(value: str | None) -> Shard | None:
    try:
        return parse_shard(value) if value is not None else shard_from_env(os.environ)
    except ShardError as exc:
        raise pytest.UsageError(str(exc)) from None
