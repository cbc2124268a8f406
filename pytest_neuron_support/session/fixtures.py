"""Public fixtures and markers: the pieces a catalog item is made of, for a user's own test.

A test composes what it needs: ``neuron_cores`` (an exclusive lease, and the environment that pins
a child process to it), ``neuron_model`` (the spec, from ``@pytest.mark.neuron_model``),
``neuron_plan``, ``neuron_run`` (run.py on the device under the lease), ``neuron_reference`` (the
same spec on CPU, cached), ``neuron_judge``, and a whole check of a kind (``neuron_check``,
``neuron_pipeline_check``, ``neuron_train_check``: one fixture per kind of ``checks.registry.KINDS``).
What the fixtures saw is kept in the item's stash (:mod:`.evidence`), and the test's report carries one
row built from it (:mod:`.reporting`), with the test's node id in the ``test`` column and its outcome as the result.

A session that collects no catalog resolves its settings only when a fixture first needs them (a
plain ``pytest`` run where the plugin is installed probes nothing and writes nothing); the
controller makes its results writer on the first row it receives.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pytest_neuron_support.base.model import DTYPES, ModelSpec
from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.catalog.load import MODEL_FIELDS, TASKS, CatalogError, check_cores, cli_model
from pytest_neuron_support.checks.kind import CheckKind
from pytest_neuron_support.checks.plan import plan_model
from pytest_neuron_support.checks.registry import INFERENCE, KINDS
from pytest_neuron_support.checks.rows import base_row, gate, planned_row, with_expectation
from pytest_neuron_support.checks.run import run_check
from pytest_neuron_support.cpu.judge import judge
from pytest_neuron_support.cpu.reference import ReferenceRun, reference_result
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.execution import ProcessOutcome, failure_of, stage_name
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.run.settings import Settings, core_pool, run_dir
from pytest_neuron_support.session.evidence import Evidence, evidence_of
from pytest_neuron_support.session.handles import CoreLease, CpuReference, DeviceRun, JudgeVerdict, ModelCheck, Timings
from pytest_neuron_support.session.keys import cost_key, model_key, plan_key, recorded_key, session_id_key
from pytest_neuron_support.session.reporting import RESULTS_PLUGIN, LazyResults, mark_started, user_test_dir
from pytest_neuron_support.session.resolve import session_settings

#: The ledger session of a session that runs no catalog, handed from the controller to its workers.
WORKERINPUT_SESSION = "neuron_support_fixture_session"


class MarkerError(ValueError):
    """A ``neuron_model`` / ``neuron_cores`` marker that cannot be used, with the fix."""


def configure(config: pytest.Config) -> None:
    """The markers, and this session's id in the core ledger (a worker takes its controller's); on the
    controller of a session that runs no catalog, the results writer made on the first row (called
    after the session's setup, which decides whether a sweep writes rows)."""
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
    if not config.pluginmanager.has_plugin(RESULTS_PLUGIN):
        config.pluginmanager.register(LazyResults(config), "neuron-support-fixture-results")


def configure_node(node: Any) -> None:
    """xdist controller: every worker leases under this session's id, so --neuron-cores caps them together."""
    node.workerinput[WORKERINPUT_SESSION] = node.config.stash[session_id_key]


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
        # A text has no tokens to precheck: only its text is checked before the judge reads it.
        judged = judge(
            self.settings,
            self._workdir,
            self._environ,
            text,
            tokens,
            result,
            text_only=not isinstance(subject, DeviceRun),
        )
        failure = judged.failure
        if failure is not None and failure.result != "FAIL":  # the judge itself broke: not a verdict on the text
            self._evidence.failure = (failure.result, "judge", str(failure.error))
            pytest.fail(f"the judge {self.model} failed: {failure.error}", pytrace=False)
        verdict = JudgeVerdict(
            text=text,
            fluent=failure is None,
            verdict=judged.verdict,
            score=judged.score,
            judge_model=self.model,
            judge_revision=judged.judge_revision,
        )
        self._evidence.verdicts.append(verdict)
        return verdict


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
    # A local folder stays "local": the planner and run.py read it from disk by that source, and the Hub
    # would refuse its path as a repo id. The row says "test" either way (session/evidence.py).
    return replace(model, **dict(kwargs), source="local" if model.source == "local" else "test")


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
        or model_key in node.stash
    )


def _workdir(settings: Settings, item: pytest.Item) -> Path:
    """A user test's runs live beside the catalog's, under ``runs/tests/<node id>/<device>``."""
    return user_test_dir(settings.results_dir, item.nodeid) / settings.device.name


def _started(request: pytest.FixtureRequest, settings: Settings, model_id: str | None = None) -> None:
    """A user's test starts its first neuron fixture: leave the marker its crash row is made from."""
    node: pytest.Item = request.node
    evidence = evidence_of(node)
    # Written by the test's first fixture, and again only when neuron_model names the model after a
    # fixture that could not; a catalog item's crash row comes from the catalog.
    if model_key in node.stash:
        return
    if not evidence.started or (model_id is not None and evidence.started_model is None):
        mark_started(settings.results_dir, node.nodeid, model_id)
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
    model = node.stash.get(model_key, None)
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
    plan = node.stash.get(plan_key, None)
    if plan is None:
        try:
            count = marker_cores(node)
        except MarkerError as exc:
            _fail_marker(exc)
        model = neuron_model if count is None else replace(neuron_model, cores=count)
        # A check kind that trains plans by its own memory model (weights, gradients, optimizer state).
        check = next(
            (name for name, kind in KINDS.items() if kind.training and kind.fixture in request.fixturenames),
            "inference",
        )
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
            f"needs {count} cores but the pool has {settings.neuron_cores}"
            + (f" (at most {fits} contiguous)" if fits < settings.neuron_cores else "")
            + f"; pass --neuron-cores={count} or more on a machine that has them"
        )
    # Leases are granted in cost order, like catalog items (a catalog item's cost, else none).
    priority = node.stash.get(cost_key, 0.0)
    lease = CoreLease(pool, pool.acquire(count, holder=node.nodeid, priority=priority), settings.device)
    evidence.lease = lease
    try:
        yield lease
    finally:
        lease.release()


@contextlib.contextmanager
def _lease_again(settings: Settings, node: pytest.Item, count: int) -> Iterator[tuple[int, int]]:
    """``count`` cores from the host-wide ledger again, for one more device run of ``node``'s check, held
    while the block runs: (first core, count)."""
    pool = core_pool(settings)
    lease = pool.acquire(count, holder=node.nodeid, priority=node.stash.get(cost_key, 0.0))
    try:
        yield lease.first, lease.count
    finally:
        pool.release(lease)


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
    job = Job(neuron_model, settings, neuron_plan, _workdir(settings, node), dict(os.environ))
    if "neuron_reference" in request.fixturenames and evidence.reference_run is None:
        # The CPU reference needs no cores: it runs beside the device run (unless the cache has it).
        evidence.reference_run = ReferenceRun(job, INFERENCE.reference_spec(job))
    post_load = config.hook.pytest_neuron_support_post_load(config=config, model=neuron_model) or ""
    spec = INFERENCE.device_spec(job, post_load)
    try:
        source, outcome = job.execute_on_device(spec, "device", neuron_cores.env)
    except BaseException:
        if evidence.reference_run is not None:
            evidence.reference_run.cancel()
        raise
    finally:
        if not _asks_for_lease(request):
            neuron_cores.release()  # the checks after the run need no cores
    run = _device_run(spec, source, outcome, job.workdir / "device", settings.hub_unreachable)
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
    beside = "neuron_run" in request.fixturenames
    commit = request.getfixturevalue("neuron_run").commit if beside else None
    workdir = _workdir(settings, node)
    run = evidence.reference_run
    if run is None:
        job = Job(neuron_model, settings, Plan(1, 1, 1, "", None, 0), workdir, dict(os.environ))
        run = ReferenceRun(job, INFERENCE.reference_spec(job))
    # Beside neuron_run, the entry the run decided not to start for is used exactly as a catalog item
    # uses it (ReferenceRun.cached: of the device run's commit, None for a model that records none).
    found = reference_result(run, commit, use_cache=beside)
    if found.failure is not None:
        status, error = found.failure
        evidence.failure = (status, "reference", error)
        pytest.fail(f"{status} at stage reference: {error}", pytrace=False)
    assert found.result is not None
    reference = CpuReference(run.spec, workdir / "reference", found.result, found.cached, found.wall_s)
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
    return _check(request, neuron_model, neuron_plan, KINDS["inference"])


@pytest.fixture
def neuron_pipeline_check(request: pytest.FixtureRequest, neuron_model: ModelSpec, neuron_plan: Plan) -> ModelCheck:
    """The pipeline check of the test's model (a ``ModelCheck``, its row's ``check`` is ``pipeline``), as a
    catalog ``test_pipeline`` item runs it.

    run.py loads the model with ``transformers.pipeline(<task>, model=<id>, device=<device>)`` and calls the
    pipeline twice with the direct path's generation settings. The row FAILs at ``load`` (basis
    ``placement``) when the pipeline left the model anywhere but on the device, and is otherwise decided as
    the inference check's is: its tokens against the direct path's free-running CPU reference (exact
    parity: ``reference_match`` says whether the two paths agree) and the teacher-forced CPU check. A model
    whose plan needs more than one core is SKIPPED at ``plan``: a pipeline runs in one process.
    """
    return _check(request, neuron_model, neuron_plan, KINDS["pipeline"])


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
    return _check(request, neuron_model, neuron_plan, KINDS["train"])


def _check(request: pytest.FixtureRequest, neuron_model: ModelSpec, neuron_plan: Plan, kind: CheckKind) -> ModelCheck:
    """One check of the test's model, as a catalog item runs it: resumed (skipped) when this stack
    already has its row with the same settings, else the plan's lease, the run, and the row; a
    harness failure is a row too (ERROR at ``harness``)."""
    node: pytest.Item = request.node
    config = request.config
    evidence = evidence_of(node)
    settings = session_settings(config)
    if model_key in node.stash:
        done = config.stash.get(recorded_key, {}).get((neuron_model.id, settings.device.name, kind.name))
        if (
            done is not None
            and done[1] == kind.planned(base_row(neuron_model, settings), neuron_model, settings).settings_hash
        ):
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
            row = run_check(
                kind,
                neuron_model,
                settings,
                neuron_plan,
                cores=(lease.first, lease.count),
                post_load=post_load,
                workdir=directory,
                planned=row,
                # The verdict needs no cores: free them once the device run ends.
                release=lease.release,
                # A numerics FAIL's module search runs on the device once more, under a lease of its own.
                relet=partial(_lease_again, settings, node, lease.count),
            )
        except Exception as exc:  # the harness itself broke (disk full, ...): still a row
            row = replace(
                planned,
                result="ERROR",
                failure_stage="harness",
                verdict_basis="run",
                error=f"{type(exc).__name__}: {exc}",
            )
    # The entry's expectation (expect:), if any: the row keeps its real result and says how it compares.
    row = with_expectation(row, neuron_model.expect)
    evidence.row = row
    if row.result == "SKIPPED":
        evidence.skip_stage = row.failure_stage
        pytest.skip(f"skipped: {row.error}")
    return ModelCheck(row, directory)
