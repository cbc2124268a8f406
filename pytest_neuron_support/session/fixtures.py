"""Public fixtures and markers: the pieces a catalog item is made of, for a user's own test.

A test composes what it needs: ``neuron_cores`` (an exclusive lease, and the environment that pins
a child process to it), ``neuron_model`` (the spec, from ``@pytest.mark.neuron_model``),
``neuron_plan``, ``neuron_run`` (run.py on the device under the lease), ``neuron_reference`` (the
same spec on CPU, cached) and ``neuron_judge``. What the fixtures saw is kept in the item's stash,
and the test's report carries one row built from it (``plugin.ROW_PROPERTY`` in
``user_properties``, so it travels from xdist workers like a catalog item's), with the test's node
id in the ``test`` column and its outcome as the result.

A session that collects no catalog resolves its settings only when a fixture first needs them (a
plain ``pytest`` run where the plugin is installed probes nothing and writes nothing); the
controller makes its results writer on the first row it receives.
"""

from __future__ import annotations

import inspect
import os
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import pytest

from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.catalog.load import DTYPES, TASKS, CatalogError, ModelSpec, check_cores, cli_model
from pytest_neuron_support.checks.pipeline import (
    ReferenceRun,
    device_run_env,
    judge_row,
    plan_model,
    run_model,
    run_spec,
    run_training,
)
from pytest_neuron_support.checks.rows import (
    base_row,
    failure_of,
    gate,
    planned_row,
    stage_name,
    training_row,
    with_cache_counts,
    with_device_result,
    with_parity,
)
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run.caches import ReferenceCache
from pytest_neuron_support.run.cores import SLICE_ENV, CorePool, Lease
from pytest_neuron_support.run.devices import DeviceKind
from pytest_neuron_support.run.execution import ProcessOutcome
from pytest_neuron_support.run.runscript import RunSpec, render_and_run
from pytest_neuron_support.run.settings import Settings, core_pool, min_cosine_of, run_dir, settings_hash, timeout_of
from pytest_neuron_support.session import controller, reporting
from pytest_neuron_support.session import items as catalog_items
from pytest_neuron_support.session import options as cli_options
from pytest_neuron_support.session.explain import Verdict
from pytest_neuron_support.verdict.checks import DEFAULT_MIN_COSINE, compare_embeddings

#: The fixtures this module provides; a test that uses any of them gets a row.
FIXTURES: tuple[str, ...] = (
    "neuron_cores",
    "neuron_model",
    "neuron_plan",
    "neuron_run",
    "neuron_reference",
    "neuron_judge",
    "neuron_check",
    "neuron_train_check",
)
#: ``@pytest.mark.neuron_model`` keywords: the catalog fields a test may set.
MODEL_FIELDS: tuple[str, ...] = (
    "task",
    "revision",
    "dtype",
    "prompt",
    "cores",
    "trust_remote_code",
    "min_cosine",
    "timeout",
)
#: The ledger session of a session that runs no catalog, handed from the controller to its workers.
WORKERINPUT_SESSION = "neuron_support_fixture_session"
#: Characters of a failed test's exception kept in its row.
ERROR_CHARS = 4000

#: Settings resolved on first use in a session that runs no catalog (a sweep has its own).
lazy_settings_key = pytest.StashKey[Settings]()
#: This session's id in the host-wide core ledger (the controller's, on every worker).
session_id_key = pytest.StashKey[str]()
#: What the neuron fixtures of one item saw, for its row.
evidence_key = pytest.StashKey["Evidence"]()


class MarkerError(ValueError):
    """A ``neuron_model`` / ``neuron_cores`` marker that cannot be used, with the fix."""


@pytest.hookimpl(trylast=True)  # after plugin.pytest_configure: it decides whether a sweep writes rows
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "neuron_cores(n): the neuron_cores fixture leases n cores for this test, n one of 1, 2, 4, 8, 16 as a "
        "catalog's cores: (default: the model's plan, else 1)",
    )
    config.addinivalue_line(
        "markers",
        "neuron_model(id, *, prompt=None, task='text-generation', revision='main', dtype='bfloat16', cores=None, "
        "trust_remote_code=False, min_cosine=None, timeout=None): the model the neuron_model, neuron_run and "
        "neuron_reference fixtures check (a Hub id org/name, or ./dir for a local checkpoint)",
    )
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        config.stash[session_id_key] = workerinput.get(WORKERINPUT_SESSION) or uuid.uuid4().hex[:12]
        return
    config.stash[session_id_key] = uuid.uuid4().hex[:12]
    if reporting.writer_key not in config.stash:
        config.pluginmanager.register(LazyResults(config), "neuron-support-fixture-results")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker leases under this session's id, so --neuron-cores caps them together."""
    node.workerinput[WORKERINPUT_SESSION] = node.config.stash[session_id_key]


def session_settings(config: pytest.Config) -> Settings:
    """The session's settings: a sweep's, else resolved here once (device, pool, ledger) from the options."""
    settings = config.stash.get(controller.settings_key, None) or config.stash.get(lazy_settings_key, None)
    if settings is None:
        options = config.stash[cli_options.options_key]
        resolved = replace(controller.resolve_device(options), session=config.stash[session_id_key])
        settings = controller.settings_for(controller.with_judge(options), resolved)
        config.stash[lazy_settings_key] = settings
    return settings


class LazyResults:
    """Controller of a session without a catalog: the results writer, made when the first row arrives
    (so a session whose tests use no neuron fixture writes nothing and resolves no device)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.writer: reporting.ResultsWriter | None = None
        self.started = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.writer is None:
            if reporting.row_from_report(report) is None:
                return
            self.writer = reporting.ResultsWriter(session_settings(self.config), ())
        self.writer.pytest_runtest_logreport(report)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist: a worker died mid-test; a test that had started a neuron fixture still gets its row."""
        settings = session_settings(self.config)
        row = reporting.crashed_test_row(settings, crashitem, report.longrepr, self.started)
        if row is not None:
            report.user_properties.append((reporting.ROW_PROPERTY, row.to_json()))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.writer is not None:
            self.writer.pytest_sessionfinish(session)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.writer is not None:
            self.writer.pytest_terminal_summary(terminalreporter)


def pinning_env(device: DeviceKind, first: int, count: int) -> dict[str, str]:
    """The environment that keeps a child process on cores ``first .. first+count-1``: the device's own
    variable (``NEURON_RT_VISIBLE_CORES=8-9``; none on cpu), and :data:`~.cores.SLICE_ENV` on every
    device, so a pytest session started in the child leases only inside the lease."""
    span = str(first) if count == 1 else f"{first}-{first + count - 1}"
    return {SLICE_ENV: span, **device.pin_cores(first, count)}


class CoreLease:
    """An exclusive lease of host cores (host numbering), held from the host-wide core ledger.

    Attributes:
        device: the device kind the cores belong to.
        cores: the leased cores, contiguous.
        env: what a child process needs in its environment to be pinned to them
            (``subprocess.run(..., env={**os.environ, **lease.env})``).
        acquired: epoch seconds the lease was granted.
        released_at: epoch seconds it was released, None while held.
    """

    def __init__(self, pool: CorePool, lease: Lease, device: DeviceKind) -> None:
        self._pool = pool
        self._lease = lease
        self.device = device.name
        self.cores: tuple[int, ...] = tuple(lease.cores)
        self.env: Mapping[str, str] = MappingProxyType(pinning_env(device, lease.first, lease.count))
        self.acquired = lease.acquired
        self.released_at: float | None = None

    @property
    def first(self) -> int:
        return self._lease.first

    @property
    def count(self) -> int:
        return self._lease.count

    @property
    def released(self) -> bool:
        return self.released_at is not None

    def release(self) -> None:
        """Hand the cores back now (idempotent): the test is done with them before its teardown."""
        if self.released_at is None:
            self._pool.release(self._lease)
            self.released_at = time.time()

    def __enter__(self) -> CoreLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<CoreLease {self.device} cores {self.cores[0]}-{self.cores[-1]} ({state})>"


@dataclass(frozen=True)
class Timings:
    """Seconds of one device run (None where run.py did not get that far).

    Attributes:
        run_s: the whole run.py process, compile included.
        load_s: ``from_pretrained``.
        first_generate_s: the first ``generate()`` (it compiles).
        generate_s: the second, warm ``generate()``.
        compile_s: first minus second: the compile cost.
    """

    run_s: float
    load_s: float | None
    first_generate_s: float | None
    generate_s: float | None
    compile_s: float | None


@dataclass(frozen=True)
class DeviceRun:
    """One run.py of a model spec on the device, under the test's lease.

    Attributes:
        spec: what run.py was rendered from.
        runscript: the exact run.py that ran (``python3 run.py`` reproduces it).
        directory: where run.py, result.json and log.txt are.
        result: run.py's JSON result (None when it wrote none: killed, crashed).
        status: ``ok``, else ``ERROR`` or ``TIMEOUT``.
        stage: the stage that failed (``load``, ``compile``, ``generate``), None when ok.
        error: the exception or signal, None when ok.
        timings: how long it took, and where.
    """

    spec: RunSpec
    runscript: str
    directory: Path
    result: Mapping[str, Any] | None
    status: str
    stage: str | None
    error: str | None
    timings: Timings

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def tokens(self) -> list[int]:
        """The greedy tokens of the first ``generate()``."""
        return [int(t) for t in (self.result or {}).get("tokens") or ()]

    @property
    def tokens_again(self) -> list[int]:
        """The tokens of the warm second ``generate()`` (equal to :attr:`tokens` on a healthy device)."""
        return [int(t) for t in (self.result or {}).get("tokens_again") or ()]

    @property
    def text(self) -> str:
        return str((self.result or {}).get("text") or "")

    @property
    def embeddings(self) -> list[list[float]]:
        """Embedding tasks: one vector per sentence."""
        return [list(v) for v in (self.result or {}).get("embeddings") or ()]

    @property
    def commit(self) -> str | None:
        """The commit the revision resolved to (a cached CPU reference must be of the same one)."""
        value = (self.result or {}).get("commit")
        return None if value is None else str(value)


@dataclass(frozen=True)
class CpuReference:
    """The same spec on CPU, eager, in the reference dtype: from the reference cache or a run of its own.

    Attributes:
        spec: what its run.py was rendered from.
        directory: where that run.py, result.json and log.txt are (when it ran).
        result: its JSON result.
        cached: it came from the reference cache (same key, same commit as the device run).
        wall_s: seconds it took here (0 when cached).
    """

    spec: RunSpec
    directory: Path
    result: Mapping[str, Any]
    cached: bool
    wall_s: float

    @property
    def tokens(self) -> list[int]:
        return [int(t) for t in self.result.get("tokens") or ()]

    @property
    def text(self) -> str:
        return str(self.result.get("text") or "")

    @property
    def embeddings(self) -> list[list[float]]:
        return [list(v) for v in self.result.get("embeddings") or ()]


@dataclass(frozen=True)
class JudgeVerdict:
    """What the fluency judge said about one text.

    Attributes:
        text: the text judged.
        fluent: the cheap checks passed and the judge's P(yes) reached its threshold.
        verdict: ``fluent``, ``not fluent`` or ``precheck: <why>``.
        score: the judge's P(yes | yes or no), None when a cheap check decided.
        judge_model / judge_revision: the judge (its resolved revision).
    """

    text: str
    fluent: bool
    verdict: str
    score: float | None
    judge_model: str
    judge_revision: str


class Judge:
    """The session's fluency judge (``--judge-model``): call it with a text or a :class:`DeviceRun`."""

    def __init__(self, settings: Settings, workdir: Path, environ: Mapping[str, str], evidence: Evidence) -> None:
        self.settings = settings
        self.model = settings.judge_model
        self.revision = settings.judge_revision
        self._workdir = workdir
        self._environ = environ
        self._evidence = evidence

    def __call__(self, subject: str | DeviceRun) -> JudgeVerdict:
        if isinstance(subject, DeviceRun):
            text, tokens, result = subject.text, tuple(subject.tokens), subject.result or {}
        else:
            text, tokens, result = subject, (), {}
        probe = Row(model_id=self.model, result="PASS", text=text, tokens=tokens)
        # A text has no tokens to precheck: only its text is checked before the judge reads it.
        judged, failure = judge_row(
            probe, self.settings, self._workdir, self._environ, result, text_only=not isinstance(subject, DeviceRun)
        )
        if failure and failure["result"] != "FAIL":  # the judge itself broke: not a verdict on the text
            self._evidence.failure = (failure["result"], "judge", str(failure["error"]))
            pytest.fail(f"the judge {self.model} failed: {failure['error']}", pytrace=False)
        verdict = JudgeVerdict(
            text=text,
            fluent=not failure,
            verdict=str(judged.judge_verdict),
            score=judged.judge_score,
            judge_model=self.model,
            judge_revision=str(judged.judge_revision),
        )
        self._evidence.verdicts.append(verdict)
        return verdict


@dataclass
class Evidence:
    """What one item's neuron fixtures saw (mutable: filled in as they run, read for its row).

    Attributes:
        model / plan / lease / run / reference: what each fixture produced.
        verdicts: every judge call, in order (the row keeps the last).
        failure: (result, stage, error) a fixture recorded before failing the test.
        skip_stage: the stage that skipped the test (``plan``: more cores than the pool).
        gated: the catalog's row for a model that must not run (remote code not allowed): the test's
            row is that EXCLUDED row.
        reference_run: the CPU reference started beside the device run.
        row: the row ``neuron_check`` made (a catalog item's row is exactly this).
        resumed: ``--resume`` found this catalog item's row already recorded: it gets no new one.
        started / started_model: the marker its crash row is made from has been written (naming
            this model).
    """

    model: ModelSpec | None = None
    plan: Plan | None = None
    lease: CoreLease | None = None
    run: DeviceRun | None = None
    reference: CpuReference | None = None
    verdicts: list[JudgeVerdict] = field(default_factory=list)
    failure: tuple[str, str, str] | None = None
    skip_stage: str | None = None
    gated: Row | None = None
    reference_run: ReferenceRun | None = None
    row: Row | None = None
    resumed: bool = False
    started: bool = False
    started_model: str | None = None


def evidence_of(item: pytest.Item) -> Evidence:
    if evidence_key not in item.stash:
        item.stash[evidence_key] = Evidence()
    return item.stash[evidence_key]


def model_from_marker(args: Sequence[Any], kwargs: Mapping[str, Any]) -> ModelSpec:
    """The :class:`ModelSpec` of ``@pytest.mark.neuron_model(id, **fields)``; :class:`MarkerError` says
    what is wrong with it."""
    if len(args) != 1 or not isinstance(args[0], str):
        raise MarkerError(f"neuron_model takes one model id, e.g. neuron_model('org/name'); got {tuple(args)!r}")
    try:
        model = cli_model(args[0])
    except CatalogError as exc:
        raise MarkerError(f"neuron_model({args[0]!r}): {exc}".replace("--model: ", "")) from None
    unknown = sorted(set(kwargs) - set(MODEL_FIELDS))
    if unknown:
        raise MarkerError(f"neuron_model: unknown field(s) {', '.join(unknown)}; use {', '.join(MODEL_FIELDS)}")
    try:
        check_cores(kwargs.get("cores"), f"@pytest.mark.neuron_model({args[0]!r})")
    except CatalogError as exc:
        raise MarkerError(str(exc)) from None
    allowed: Mapping[str, Sequence[object]] = {"task": TASKS, "dtype": DTYPES}
    for name, choices in allowed.items():
        if name in kwargs and kwargs[name] not in choices:
            shown = ", ".join(str(c) for c in choices if c is not None)
            raise MarkerError(f"neuron_model: {name}={kwargs[name]!r} is not allowed; use one of {shown}")
    prompt = kwargs.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise MarkerError(f"neuron_model: prompt={prompt!r} must be non-empty text (or leave it out: --prompt)")
    timeout = kwargs.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise MarkerError(f"neuron_model: timeout={timeout!r} must be a positive number of seconds (or leave it out)")
    return replace(model, **dict(kwargs), source="test")


def marker_cores(item: pytest.Item) -> int | None:
    """``@pytest.mark.neuron_cores(n)``'s n, None without the marker."""
    mark = item.get_closest_marker("neuron_cores")
    if mark is None:
        return None
    if len(mark.args) != 1 or mark.kwargs:
        raise MarkerError(f"neuron_cores takes one core count, e.g. neuron_cores(2); got {mark.args!r}")
    # The catalog's rule for `cores:`, so a count no plan can have is the same error in both places.
    try:
        return check_cores(mark.args[0], f"@pytest.mark.neuron_cores({mark.args[0]!r})", field=None)
    except CatalogError as exc:
        raise MarkerError(str(exc)) from None


def _fail_marker(exc: MarkerError) -> NoReturn:
    # Called in the handler of the MarkerError: pytest.fail there would chain the two exceptions and
    # print the message twice ("During handling of the above exception ..."), so the context is dropped.
    raise pytest.fail.Exception(str(exc), pytrace=False) from None


def _wants_model(request: pytest.FixtureRequest) -> bool:
    node: pytest.Item = request.node
    return (
        "neuron_model" in request.fixturenames
        or node.get_closest_marker("neuron_model") is not None
        or catalog_items.model_key in node.stash
    )


def _workdir(settings: Settings, item: pytest.Item) -> Path:
    """A user test's runs live beside the catalog's, under ``runs/tests/<node id>/<device>``."""
    return reporting.user_test_dir(settings.results_dir, item.nodeid) / settings.device.name


def _started(request: pytest.FixtureRequest, settings: Settings, model_id: str | None = None) -> None:
    """A user's test starts its first neuron fixture: leave the marker its crash row is made from."""
    node: pytest.Item = request.node
    evidence = evidence_of(node)
    # Written by the test's first fixture, and again only when neuron_model names the model after a
    # fixture that could not; a catalog item's crash row comes from the catalog.
    if catalog_items.model_key in node.stash:
        return
    if not evidence.started or (model_id is not None and evidence.started_model is None):
        reporting.mark_started(settings.results_dir, node.nodeid, model_id)
        evidence.started, evidence.started_model = True, model_id


@pytest.fixture
def neuron_model(request: pytest.FixtureRequest) -> ModelSpec:
    """The model spec (``catalog.ModelSpec``) this test checks.

    From ``@pytest.mark.neuron_model("org/name", prompt=..., task=..., dtype=..., revision=..., cores=...)``
    (a Hub id, or ``./dir`` for a local checkpoint), from indirect parametrization
    (``@pytest.mark.parametrize("neuron_model", ["org/a", "org/b"], indirect=True)``), or a catalog
    item's entry. A model that needs remote code runs only with ``trust_remote_code=True`` and
    ``--allow-remote-code``; otherwise the test is skipped saying so.
    """
    node: pytest.Item = request.node
    evidence = evidence_of(node)
    model = node.stash.get(catalog_items.model_key, None)
    param = getattr(request, "param", None)
    try:
        if model is None and isinstance(param, ModelSpec):
            model = param
        elif model is None and isinstance(param, str):
            model = model_from_marker((param,), {})
        elif model is None:
            mark = node.get_closest_marker("neuron_model")
            if mark is None:
                raise MarkerError(
                    "neuron_model needs a model: mark the test with @pytest.mark.neuron_model('org/name', prompt=...)"
                )
            model = model_from_marker(mark.args, mark.kwargs)
    except MarkerError as exc:
        _fail_marker(exc)
    assert model is not None
    evidence.model = model
    _started(request, session_settings(request.config), model.id)
    gated = gate(model, session_settings(request.config))
    if gated is not None:
        evidence.gated = gated
        pytest.skip(str(gated.error))
    return model


@pytest.fixture
def neuron_plan(request: pytest.FixtureRequest, neuron_model: ModelSpec) -> Plan:
    """The model's plan (``planning.Plan``: cores, tp_size, ep_size, reason), as a catalog item gets it.

    ``@pytest.mark.neuron_cores(n)`` overrides the core count, checked against the same rules. A plan
    that cannot run (more cores than ``--max-cores``, a model that cannot be sharded) skips the test
    with the planner's reason.
    """
    node: pytest.Item = request.node
    evidence = evidence_of(node)
    plan = node.stash.get(catalog_items.plan_key, None)
    if plan is None:
        try:
            count = marker_cores(node)
        except MarkerError as exc:
            _fail_marker(exc)
        model = neuron_model if count is None else replace(neuron_model, cores=count)
        # The training check plans by its own memory model (weights, gradients, optimizer state).
        check = "train" if "neuron_train_check" in request.fixturenames else "inference"
        settings = session_settings(request.config)
        # A Hub the session found unreachable is not asked again: the plan comes from the cache.
        plan, _ = plan_model(
            model,
            settings,
            check=check,
            local_only=settings.hub_unreachable is not None,
            hub_down=settings.hub_unreachable,
        )
    evidence.plan = plan
    if plan.skip is not None:
        evidence.skip_stage = "plan"
        pytest.skip(f"plan: {plan.skip}")
    if plan.error is not None and "neuron_check" not in request.fixturenames:
        # neuron_check turns a plan error into its row (ERROR at plan); anything else cannot go on.
        evidence.failure = ("ERROR", "plan", plan.error)
        pytest.fail(f"ERROR at stage plan: {plan.error}", pytrace=False)
    return plan


@pytest.fixture
def neuron_cores(request: pytest.FixtureRequest) -> Iterator[CoreLease]:
    """An exclusive lease of N contiguous cores from the host-wide core ledger (a ``CoreLease``).

    N is ``@pytest.mark.neuron_cores(N)``, else the model's plan when the test checks a model, else 1;
    the marker's N follows the catalog's ``cores:`` rule (1, 2, 4, 8 or 16; anything else is an ERROR
    naming the allowed counts, as ``cores: 3`` in a catalog is a usage error).
    ``lease.cores`` are the cores (host numbering) and ``lease.env`` the environment that pins a child
    process to them: ``subprocess.run(cmd, env={**os.environ, **lease.env})``. No other test, worker or
    session on the host gets these cores while the lease is held. It is released at teardown, or as
    soon as the test calls ``lease.release()`` (or leaves ``with lease:``). A test that asks for more
    cores than the pool has is skipped, never left waiting.
    """
    node: pytest.Item = request.node
    evidence = evidence_of(node)
    settings = session_settings(request.config)
    _started(request, settings)
    try:
        count = marker_cores(node)
    except MarkerError as exc:
        _fail_marker(exc)
    if count is None:
        count = request.getfixturevalue("neuron_plan").cores if _wants_model(request) else 1
    assert count is not None
    pool = core_pool(settings)
    fits = pool.largest_block()
    if count > fits:
        evidence.skip_stage = "plan"
        pytest.skip(
            f"needs {count} cores but the pool has {settings.pool_cores}"
            + (f" (at most {fits} contiguous)" if fits < settings.pool_cores else "")
            + f"; pass --neuron-cores={count} or more on a machine that has them"
        )
    # Leases are granted in cost order, like catalog items (a catalog item's cost, else none).
    priority = node.stash.get(catalog_items.cost_key, 0.0)
    lease = CoreLease(pool, pool.acquire(count, holder=node.nodeid, priority=priority), settings.device)
    evidence.lease = lease
    try:
        yield lease
    finally:
        lease.release()


def _asks_for_lease(request: pytest.FixtureRequest) -> bool:
    """Whether the test function itself takes ``neuron_cores`` (not only through ``neuron_run``)."""
    function = getattr(request, "function", None)
    return function is not None and "neuron_cores" in inspect.signature(function).parameters


def _device_run(
    spec: RunSpec, source: str, outcome: ProcessOutcome, directory: Path, offline: str | None = None
) -> DeviceRun:
    result = outcome.result
    first_s = None if result is None else result.get("first_generate_s")
    second_s = None if result is None else result.get("generate_s")
    timings = Timings(
        run_s=round(outcome.wall_s, 3),
        load_s=None if result is None else result.get("load_s"),
        first_generate_s=first_s,
        generate_s=second_s,
        compile_s=round(first_s - second_s, 3) if first_s is not None and second_s is not None else None,
    )
    if result is not None and result.get("ok"):
        return DeviceRun(spec, source, directory, result, "ok", None, None, timings)
    status, stage, error = failure_of(outcome, "run.py", offline=offline, checkpoint=spec.model)
    return DeviceRun(spec, source, directory, result, status, stage_name(stage, False), scrub(error) or "", timings)


@pytest.fixture
def neuron_run(
    request: pytest.FixtureRequest, neuron_model: ModelSpec, neuron_plan: Plan, neuron_cores: CoreLease
) -> DeviceRun:
    """The model spec run on the device under the test's lease (a ``DeviceRun``), before the test body.

    run.py is rendered as for a catalog item (its ``SPEC`` holds every setting, the
    ``pytest_neuron_support_post_load`` hook included) and run isolated in a process group of its own
    under ``--model-timeout``; it lives in ``<results>/runs/tests/<test>/<device>/device/``. The result:
    ``tokens``, ``tokens_again`` (the warm second generate), ``text``, ``embeddings``, ``timings``
    (run, load, compile, generate seconds), ``runscript`` and the raw ``result``. A run that does not
    finish fails the test (ERROR at its stage, with the exception). The cores are handed back when the
    run ends, unless the test takes ``neuron_cores`` itself (then they are its own until teardown or
    ``release()``).
    """
    node: pytest.Item = request.node
    config = request.config
    evidence = evidence_of(node)
    settings = session_settings(config)
    workdir = _workdir(settings, node)
    environ = dict(os.environ)
    if "neuron_reference" in request.fixturenames and evidence.reference_run is None:
        # The CPU reference needs no cores: it runs beside the device run (unless the cache has it).
        evidence.reference_run = ReferenceRun(neuron_model, settings, workdir, environ)
    post_load = config.hook.pytest_neuron_support_post_load(config=config, model=neuron_model) or ""
    spec = run_spec(
        neuron_model, settings, device=settings.device, reference=False, post_load=post_load, plan=neuron_plan
    )
    device_env = device_run_env(settings, environ, neuron_cores.env)
    try:
        source, outcome = render_and_run(
            spec,
            workdir / "device",
            env=device_env,
            timeout=timeout_of(neuron_model, settings),
            memory_limit=settings.host_memory_limit,
        )
    except BaseException:
        if evidence.reference_run is not None:
            evidence.reference_run.cancel()
        raise
    finally:
        if not _asks_for_lease(request):
            neuron_cores.release()  # the checks after the run need no cores
    run = _device_run(spec, source, outcome, workdir / "device", settings.hub_unreachable)
    evidence.run = run
    if not run.ok:
        if evidence.reference_run is not None:
            evidence.reference_run.cancel()
        evidence.failure = (run.status, str(run.stage), str(run.error))
        pytest.fail(
            f"{run.status} at stage {run.stage}: {run.error}\n(run.py, result.json, log.txt: {run.directory})",
            pytrace=False,
        )
    return run


@pytest.fixture
def neuron_reference(request: pytest.FixtureRequest, neuron_model: ModelSpec) -> CpuReference:
    """The CPU reference of the test's model spec (a ``CpuReference``): the same run.py on CPU, eager,
    in ``--reference-dtype`` (default the model's), same prompt and token count.

    Cached like a catalog item's reference (``--reference-cache``, keyed by model, revision, dtype,
    prompt, tokens and the CPU stack; with ``neuron_run`` an entry must be of the commit the device
    run loaded). Beside ``neuron_run`` it runs while the device run does. ``tokens``, ``text``,
    ``embeddings``, ``cached``, ``wall_s``, the raw ``result``. A reference that fails fails the test
    (ERROR at stage ``reference``).
    """
    node: pytest.Item = request.node
    evidence = evidence_of(node)
    settings = session_settings(request.config)
    commit = request.getfixturevalue("neuron_run").commit if "neuron_run" in request.fixturenames else None
    workdir = _workdir(settings, node)
    run = evidence.reference_run or ReferenceRun(neuron_model, settings, workdir, dict(os.environ))
    cache = ReferenceCache(settings.reference_cache) if settings.reference_cache is not None else None
    # Beside neuron_run, the entry the run decided not to start for is used exactly as a catalog item
    # uses it (ReferenceRun.cached: of the device run's commit, None for a model that records none).
    cached = run.cached(commit) if "neuron_run" in request.fixturenames else None
    if cached is not None:
        run.cancel()
        reference = CpuReference(run.spec, workdir / "reference", cached, True, 0.0)
    else:
        outcome = run.outcome()
        if outcome.result is None or not outcome.result.get("ok"):
            status, _, error = failure_of(
                outcome, "CPU reference run.py", offline=settings.hub_unreachable, checkpoint=run.spec.model
            )
            evidence.failure = (status, "reference", scrub(error) or "")
            pytest.fail(f"{status} at stage reference: {scrub(error)}", pytrace=False)
        if cache is not None:
            cache.put(run.key, outcome.result)
        reference = CpuReference(run.spec, workdir / "reference", outcome.result, False, round(outcome.wall_s, 3))
    evidence.reference = reference
    return reference


@pytest.fixture
def neuron_judge(request: pytest.FixtureRequest) -> Judge:
    """The fluency judge (a ``Judge``): ``neuron_judge(neuron_run)`` or ``neuron_judge("some text")``
    returns a ``JudgeVerdict`` (``fluent``, ``verdict``, ``score``).

    A text is judged as it is (only the checks that read text apply before the judge: empty, mostly
    non-printable); a run also gets the token checks. Cheap checks first (empty text, one token
    repeated, special tokens in place of text), then
    ``--judge-model`` (default ``Qwen/Qwen2.5-0.5B-Instruct``) on CPU in its own process as a
    standalone judge.py. A judge that cannot run fails the test (ERROR at stage ``judge``).
    """
    node: pytest.Item = request.node
    settings = session_settings(request.config)
    _started(request, settings)
    return Judge(settings, _workdir(settings, node), dict(os.environ), evidence_of(node))


@dataclass(frozen=True)
class ModelCheck:
    """The whole check a catalog item makes of one model (what ``neuron_check`` returns).

    Attributes:
        row: the row the dataset records: result, stage, error, plan, lease, timings, memory, and
            the evidence that decided it (``verdict_basis``, parity, teacher-forced CPU check, judge).
        directory: the folder of its runs (``device/``, ``reference/``, ``cpu-check/``, ``judge/``,
            each with run.py, result.json and log.txt).
    """

    row: Row
    directory: Path

    @property
    def result(self) -> Verdict:
        """``PASS``, ``FAIL`` or ``ERROR``: a ``str``; ``assert check.result == "PASS"`` explains itself."""
        return Verdict(self.row, self.directory)

    @property
    def passed(self) -> bool:
        return self.row.result == "PASS"

    @property
    def tokens(self) -> list[int]:
        """The device's greedy tokens."""
        return list(self.row.tokens)

    @property
    def text(self) -> str:
        return self.row.text or ""


@pytest.fixture
def neuron_check(request: pytest.FixtureRequest, neuron_model: ModelSpec, neuron_plan: Plan) -> ModelCheck:
    """The catalog's whole check of the test's model (a ``ModelCheck``), exactly as a catalog item runs it.

    The plan's cores are leased (``neuron_cores``), run.py runs on the device, the CPU reference
    beside it (one-core and embedding runs), the teacher-forced CPU check over the device's tokens
    (every generation run) and the judge (sharded runs); the lease is released the moment the
    device run ends. A model that fails is not an exception here but the row's result, so the test
    decides: ``assert neuron_check.result == "PASS"`` shows, when it fails, the stage, the error and
    the evidence (matched prefix, first divergence, both tokens, their gap). A plan that cannot run
    here (more cores than the pool) skips the test, SKIPPED at stage ``plan``.
    """
    return _check(request, neuron_model, neuron_plan, CHECK_KINDS["inference"])


@pytest.fixture
def neuron_train_check(request: pytest.FixtureRequest, neuron_model: ModelSpec, neuron_plan: Plan) -> ModelCheck:
    """The training check of the test's model (a ``ModelCheck``, its row's ``check`` is ``train``), as a
    catalog ``test_training`` item runs it.

    The plan (sized by the training memory model: weights, gradients and AdamW state) is leased, a
    standalone train.py runs a few Trainer steps on the device (``bf16``, ``torch_compile`` with the
    device's backend, fixed-length batches, ``dataloader_drop_last``; sharded with ``DistributedConfig``
    when the plan says so), the same train.py runs eagerly on CPU beside it, and the row is PASS when
    every loss is finite, the per-step losses and gradient norms agree with the CPU's within the
    documented tolerance, and no graph was compiled after the first step; else FAIL at stage ``train``
    naming the first step that went wrong. The lease is released the moment the device run ends.
    """
    return _check(request, neuron_model, neuron_plan, CHECK_KINDS["train"])


@dataclass(frozen=True)
class CheckKind:
    """How one kind of check (a row's ``check``) runs, for the fixture that runs it.

    Attributes:
        name: the row's ``check`` (``inference``, ``train``); also the key ``--resume`` looks up.
        folder: the run folder under the model's, ``""`` for the model's own.
        planned: turns the planned row into this check's planned row.
        run: runs the check under the lease and returns its row (``pipeline.run_model`` or
            ``pipeline.run_training``; same keyword arguments).
    """

    name: str
    folder: str
    planned: Callable[[Row, ModelSpec, Settings], Row]
    run: Callable[..., Row]


#: The check kinds, in one table (``neuron_check`` and ``neuron_train_check`` differ only here).
CHECK_KINDS: Mapping[str, CheckKind] = MappingProxyType(
    {
        "inference": CheckKind("inference", "", lambda row, model, settings: row, run_model),
        "train": CheckKind("train", "train", training_row, run_training),
    }
)


def _check(request: pytest.FixtureRequest, neuron_model: ModelSpec, neuron_plan: Plan, kind: CheckKind) -> ModelCheck:
    """One check of the test's model, as a catalog item runs it: resumed (skipped) when this stack
    already has its row with the same settings, else the plan's lease, the run, and the row; a
    harness failure is a row too (ERROR at ``harness``)."""
    node: pytest.Item = request.node
    config = request.config
    evidence = evidence_of(node)
    settings = session_settings(config)
    if catalog_items.model_key in node.stash:
        done = config.stash.get(controller.recorded_key, {}).get((neuron_model.id, settings.device.name, kind.name))
        if done is not None and done[1] == settings_hash(neuron_model, settings, kind.name):
            evidence.resumed = True
            pytest.skip(f"resumed: {done[0]} already recorded for this stack and settings")
        directory = run_dir(settings.results_dir, settings.device.name, neuron_model.id)
    else:
        directory = _workdir(settings, node)
    if kind.folder:
        directory = directory / kind.folder
    row = kind.planned(planned_row(neuron_model, settings, neuron_plan), neuron_model, settings)
    if row.failure_stage != "plan":  # SKIPPED or ERROR at plan: nothing to run
        post_load = config.hook.pytest_neuron_support_post_load(config=config, model=neuron_model) or ""
        lease: CoreLease = request.getfixturevalue("neuron_cores")
        planned = row
        try:
            row = kind.run(
                neuron_model,
                settings,
                neuron_plan,
                cores=(lease.first, lease.count),
                post_load=post_load,
                workdir=directory,
                planned=row,
                # The verdict needs no cores: free them once the device run ends.
                release=lease.release,
            )
        except Exception as exc:  # the harness itself broke (disk full, ...): still a row
            row = replace(
                planned,
                result="ERROR",
                failure_stage="harness",
                verdict_basis="run",
                error=f"{type(exc).__name__}: {exc}",
            )
    evidence.row = row
    if row.result == "SKIPPED":
        evidence.skip_stage = row.failure_stage
        pytest.skip(f"skipped: {row.error}")
    return ModelCheck(row, directory)


def catalog_row(item: pytest.Item, evidence: Evidence, report: pytest.TestReport, settings: Settings) -> Row:
    """A catalog item's row: the one ``neuron_check`` made; else the reason nothing ran (EXCLUDED,
    SKIPPED or ERROR at plan); else the harness broke before the check (ERROR at ``harness``)."""
    if evidence.row is not None:
        return evidence.row
    model = item.stash[catalog_items.model_key]
    # A training item's row is a training row whatever stopped it (its check is part of its key).
    train = item.stash.get(catalog_items.check_key, "inference") == "train"
    if evidence.gated is not None:
        return training_row(evidence.gated, model, settings) if train else evidence.gated
    row = base_row(model, settings) if evidence.plan is None else planned_row(model, settings, evidence.plan)
    if train:
        row = training_row(row, model, settings)
    if row.failure_stage == "plan":
        return row
    text = scrub(report.longreprtext) or ""
    return replace(row, result="ERROR", failure_stage="harness", verdict_basis="run", error=text[:ERROR_CHARS])


def _uses_fixtures(item: pytest.Item) -> bool:
    return not set(FIXTURES).isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """The row of a test that used the neuron fixtures rides on the report of the phase that decided
    it (the call, or a setup that failed or skipped), as a catalog item's does."""
    report: pytest.TestReport = yield
    deciding = report.when == "call" or (report.when == "setup" and report.outcome != "passed")
    if deciding and _uses_fixtures(item):
        try:
            settings = session_settings(item.config)
        except pytest.UsageError:  # the session cannot run anything; the setup error says why
            return report
        evidence = evidence_of(item)
        if evidence.resumed:  # its row is already in the dataset
            return report
        if catalog_items.model_key in item.stash:
            row = catalog_row(item, evidence, report, settings)
        else:
            row = user_row(item, evidence, report, call, settings)
        report.user_properties.append((reporting.ROW_PROPERTY, row.to_json()))
    return report


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(getattr(report, "wasxfail", "") or longrepr or "")


def user_row(
    item: pytest.Item, evidence: Evidence, report: pytest.TestReport, call: pytest.CallInfo[None], settings: Settings
) -> Row:
    """The row of a user's own test: identity (the model's, else the test's), plan, lease, the device
    run, the reference and the judge as its fixtures saw them, and the test's outcome as the result."""
    model = evidence.model
    if model is not None and evidence.plan is not None:
        row = planned_row(model, settings, evidence.plan)
    elif model is not None:
        row = base_row(model, settings)
    else:
        # No model: the test is the subject (its own process on leased cores, say).
        row = replace(
            base_row(ModelSpec(id=item.nodeid, source="test"), settings),
            task="",
            dtype="",
            prompt=None,
            max_new_tokens=None,
        )
    row = replace(row, test=item.nodeid, source="test", verdict_basis="test")
    if evidence.row is not None:
        # neuron_check made the row; the test's outcome still decides its result (unless the
        # check's own non-PASS result is what failed it).
        checked = replace(evidence.row, test=item.nodeid, source="test")
        if evidence.row.result != "PASS" and report.failed and report.when == "call":
            return checked
        return replace(checked, **_outcome_fields(evidence, report, call))
    lease = evidence.lease
    if lease is not None:
        row = replace(
            row,
            neuron_cores=lease.count,
            first_core=lease.first,
            lease_start=round(lease.acquired, 3),
            # A lease the test still holds is released at its teardown, right after this report.
            lease_end=round(lease.released_at if lease.released_at is not None else report.stop, 3),
        )
    run = evidence.run
    if run is not None:
        row = replace(row, runscript=run.runscript, run_s=run.timings.run_s)
        if run.result is not None:
            row = with_cache_counts(with_device_result(row, run.result), run.result)
    reference = evidence.reference
    if reference is not None:
        row = replace(
            row,
            reference_dtype=reference.spec.dtype,
            reference_s=reference.wall_s,
            reference_cached=reference.cached,
            reference_tokens=tuple(reference.tokens),
        )
        if run is not None and run.ok and run.spec.sentences:
            threshold = min_cosine_of(model) if model is not None else DEFAULT_MIN_COSINE
            cosines = compare_embeddings(run.embeddings, reference.embeddings, threshold)
            row = replace(
                row,
                reference_match=cosines.match,
                min_cosine=None if cosines.min_cosine is None else round(cosines.min_cosine, 8),
                cosine_threshold=threshold,
            )
        if run is not None and run.ok and not run.spec.sentences:
            row = with_parity(row, {**(run.result or {}), "tokens": run.tokens}, reference.result)
    if evidence.verdicts:
        verdict = evidence.verdicts[-1]
        row = replace(
            row,
            judge_model=verdict.judge_model,
            judge_revision=verdict.judge_revision,
            judge_verdict=verdict.verdict,
            judge_score=verdict.score,
        )
    return replace(row, **_outcome_fields(evidence, report, call))


def _outcome_fields(evidence: Evidence, report: pytest.TestReport, call: pytest.CallInfo[None]) -> dict[str, Any]:
    """result, failure_stage, error (and verdict_basis where a run decided) from the test's outcome."""
    if report.passed:
        return {"result": "PASS", "failure_stage": None, "error": None}
    if report.skipped and evidence.gated is not None:
        gated = evidence.gated
        return {
            field: getattr(gated, field)
            for field in ("result", "failure_stage", "verdict_basis", "exclude_reason", "exclude_note", "error")
        }
    if report.skipped:
        return {"result": "SKIPPED", "failure_stage": evidence.skip_stage, "error": _skip_reason(report)}
    if report.when == "setup" and evidence.failure is not None:
        status, stage, error = evidence.failure
        return {"result": status, "failure_stage": stage, "error": error[:ERROR_CHARS], "verdict_basis": "run"}
    excinfo = call.excinfo
    text = excinfo.exconly() if excinfo is not None else report.longreprtext
    # An assertion that failed is a wrong answer (FAIL); anything else raised is an ERROR.
    failed = report.when == "call" and excinfo is not None and isinstance(excinfo.value, AssertionError)
    return {
        "result": "FAIL" if failed else "ERROR",
        "failure_stage": "test",
        "error": (scrub(text) or "")[:ERROR_CHARS],
    }
