"""One model, from its spec to its row: plan, render, run on the device, check it on CPU, judge.

Nothing here raises for a model's failure: every outcome becomes a :class:`~.records.Row`,
so one broken model never stops a sweep.

The verdict of a generation run rests on CPU evidence wherever the host can give it: a one-core
run is compared with a free-running CPU reference (the seed's exact parity) and, like every run,
sharded included, checked teacher-forced: one CPU forward over the prompt plus the device's own
tokens says, at every position, whether the device's token is the CPU model's top-1. The fluency
judge still reads every sharded run's text and its verdict is kept, but it decides only when the
host cannot hold the model for the CPU check. ``verdict_basis`` names what decided each row.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.catalog.load import ModelSpec
from pytest_neuron_support.checks.rows import (
    failure_of,
    forced_error,
    planned_row,
    repeat_failure,
    single_core_verdict,
    stage_name,
    training_row,
    training_verdict,
    with_cache_counts,
    with_device_result,
    with_embedding_parity,
    with_forced,
    with_parity,
    with_training_result,
)
from pytest_neuron_support.data import hub
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.planning.planner import (
    DTYPE_BYTES,
    Plan,
    PlanningError,
    inspect_model,
    plan_cores,
    training_bytes,
)
from pytest_neuron_support.run import neffcache
from pytest_neuron_support.run.caches import ReferenceCache, reference_key
from pytest_neuron_support.run.devices import DEVICES, NO_DEVICE_ENV, DeviceKind
from pytest_neuron_support.run.execution import ProcessOutcome, run_script
from pytest_neuron_support.run.runscript import JudgeSpec, RunSpec, TrainSpec, render_and_run, render_judge
from pytest_neuron_support.run.settings import IMAGE_SIZE, Settings, prompt_of, run_dir, timeout_of
from pytest_neuron_support.verdict.checks import (
    EMBEDDING_SENTENCES,
    TRAIN_BATCH,
    TRAIN_LEARNING_RATE,
    TRAIN_MAX_LENGTH,
    TRAIN_SEED,
    TRAIN_STEPS,
    TRAIN_TEXTS,
    TeacherForced,
    fluency_precheck,
    teacher_forced,
    text_precheck,
)

#: Host memory the CPU check needs per byte of weights in its dtype (activations, logits, the
#: interpreter and the library around them).
CPU_CHECK_OVERHEAD = 1.25


def plan_model(
    model: ModelSpec,
    settings: Settings,
    *,
    local_only: bool = False,
    check: str = "inference",
    hub_down: str | None = None,
) -> tuple[Plan, bool]:
    """The model's plan for ``check``, and whether the Hub proved unreachable while making it."""
    plans, unreachable = plan_checks(model, settings, (check,), local_only=local_only, hub_down=hub_down)
    return plans[check], unreachable


def plan_checks(
    model: ModelSpec,
    settings: Settings,
    checks: Sequence[str],
    *,
    local_only: bool = False,
    hub_down: str | None = None,
) -> tuple[dict[str, Plan], bool]:
    """The model's plan for each of ``checks`` from one inspection, and whether the Hub proved
    unreachable while making them (the train check plans by the training memory model: weights,
    gradients and optimizer state, :func:`.planning.training_bytes`).

    A model that cannot be inspected runs on its catalog ``cores:`` when the entry sets them (the
    user decided); otherwise its plan carries the error (an ERROR row at stage plan saying what to
    pass), never a guessed core count. A Hub model that is not in the local cache while the Hub
    cannot be asked (``hub_down``: why the caller did not ask it) gets one short error saying so.
    """
    try:
        shape = inspect_model(model, local_only=local_only)
    except PlanningError as exc:
        if model.cores is not None:
            plan = Plan(
                cores=model.cores,
                tp_size=model.cores,
                ep_size=1,
                weight_bytes=0,
                skip=None,
                reason=f"catalog override: {model.cores} core(s), not inspected ({exc})",
            )
            return dict.fromkeys(checks, plan), exc.unreachable
        where = f"its catalog entry (line {model.line})" if model.line else "a catalog entry for it (--models-file)"
        error = _not_cached_offline(model, exc, hub_down) or (
            f"{exc}; to run it without inspecting it, set its core count: 'cores: N' in {where} "
            "(or check the id and the Hub's reachability)"
        )
        plan = Plan(cores=0, tp_size=1, ep_size=1, weight_bytes=0, skip=None, reason=error, error=error)
        return dict.fromkeys(checks, plan), exc.unreachable
    plans = {
        check: plan_cores(
            shape,
            dtype=model.dtype,
            core_bytes=settings.core_bytes,
            headroom=settings.headroom,
            max_cores=settings.max_cores,
            override=model.cores,
            training=check == "train",
        )
        for check in checks
    }
    return plans, False


def _not_cached_offline(model: ModelSpec, exc: PlanningError, hub_down: str | None) -> str | None:
    """The short, true error of a Hub model that is neither in the local cache nor reachable, or None
    when that is not why it could not be inspected (a local folder, a cached config, a Hub that answered).

    The inspection's own error says everything it tried and the client's offline help, and a core
    count would not help: the run would fail loading the same missing files."""
    if model.source == "local" or hub.cached_file(model.id, "config.json", revision=model.revision) is not None:
        return None
    # hub.unreachable() says at once when the client is offline, else tries one connection.
    why = hub_down or ("the Hub could not be reached" if exc.unreachable else hub.unreachable())
    if why is None:
        return None
    return (
        f"{model.id} (revision {model.revision}) is not in the local Hugging Face cache and the Hub cannot be "
        f"asked ({why}); check the id, or download it where the Hub is reachable (hf download {model.id}) and rerun"
    )


def prior_seconds(plan: Plan) -> float:
    """Expected seconds of a model never run before: compile dominates and grows with size.

    A rough prior (60 s plus 25 s per GiB of weights), only used to order the sweep.
    """
    return 60.0 + 25.0 * plan.weight_bytes / (1 << 30)


def distributed_configs(plan: Plan) -> tuple[dict[str, Any], ...]:
    """``DistributedConfig`` keyword sets run.py tries in order for a sharded plan.

    Which of them loads differs between transformers versions (5.24 on gloo: experts-only
    ``ep_size=n, tp_plan={}`` raises "Pass `tp_plan` in `DistributedConfig`" while
    ``tp_size=n, ep_size=n`` and ``fsdp_size=n, ep_size=n`` work; tests/test_sharded.py keeps this
    premise per release), so run.py detects it and the row records the one used.
    """
    if plan.tp_size > 1:
        return ({"tp_size": plan.tp_size}, {"tp_size": plan.tp_size, "ep_size": plan.tp_size})
    if plan.ep_size > 1:
        n = plan.ep_size
        return ({"ep_size": n, "tp_plan": {}}, {"tp_size": n, "ep_size": n}, {"fsdp_size": n, "ep_size": n})
    return ()


def run_spec(
    model: ModelSpec,
    settings: Settings,
    *,
    device: DeviceKind,
    reference: bool,
    post_load: str,
    plan: Plan | None = None,
) -> RunSpec:
    return RunSpec(
        model=model.id,
        revision=model.revision,
        task=model.task,
        dtype=(settings.reference_dtype or model.dtype) if reference else model.dtype,
        prompt=prompt_of(model, settings) or "",
        max_new_tokens=settings.max_new_tokens,
        device=device,
        compile=not reference,
        compile_backend=device.compile_backend if reference else settings.compile_backend,
        trust_remote_code=model.trust_remote_code and settings.allow_remote_code,
        post_load="" if reference else post_load,
        world_size=1 if reference or plan is None else max(plan.cores, 1),
        distributed_configs=() if reference or plan is None else distributed_configs(plan),
        sentences=EMBEDDING_SENTENCES if model.embedding else (),
        image_size=IMAGE_SIZE,
        score_own_tokens=reference and not model.embedding,
    )


def cpu_check_spec(model: ModelSpec, settings: Settings, tokens: tuple[int, ...]) -> RunSpec:
    """The teacher-forced CPU check of a device run's ``tokens``: the reference's spec (CPU, eager,
    the reference dtype, the same inputs) scoring those tokens instead of generating."""
    spec = run_spec(model, settings, device=DEVICES["cpu"], reference=True, post_load="")
    return replace(spec, forced_tokens=tokens, score_own_tokens=False)


def train_distributed_configs(plan: Plan) -> tuple[dict[str, Any], ...]:
    """``DistributedConfig`` keyword sets train.py tries in order for a sharded training plan: the plan's
    first choice (tensor parallel; an expert-parallel plan's list as inference tries it, which ends with
    FSDP over the experts' ranks), then FSDP over the same ranks (``fsdp_size=n``: it shards weights,
    gradients and optimizer state, the training memory model / n). Accelerate 1.15 refuses a
    tensor-parallel model under the Trainer on CPU processes (``MULTI_CPU``, gloo) but accepts FSDP
    there; train.py records the one that trained and why the others did not."""
    if plan.tp_size > 1:
        return ({"tp_size": plan.tp_size}, {"fsdp_size": plan.tp_size})
    if plan.ep_size == 1 and plan.cores > 1:  # the planner's FSDP layout (a dense model without a TP plan)
        return ({"fsdp_size": plan.cores},)
    return distributed_configs(plan)


def train_spec(
    model: ModelSpec, settings: Settings, *, device: DeviceKind, reference: bool, post_load: str, plan: Plan | None
) -> TrainSpec:
    """train.py's spec: on the device compiled with the session's backend and sharded by the plan; the
    CPU side eager, one process, in the reference dtype, with the same data, steps and seed."""
    return TrainSpec(
        model=model.id,
        revision=model.revision,
        dtype=(settings.reference_dtype or model.dtype) if reference else model.dtype,
        device=device,
        compile=not reference,
        compile_backend=device.compile_backend if reference else settings.compile_backend,
        steps=TRAIN_STEPS,
        batch_size=TRAIN_BATCH,
        max_length=TRAIN_MAX_LENGTH,
        learning_rate=TRAIN_LEARNING_RATE,
        seed=TRAIN_SEED,
        texts=TRAIN_TEXTS,
        trust_remote_code=model.trust_remote_code and settings.allow_remote_code,
        post_load="" if reference else post_load,
        world_size=1 if reference or plan is None else max(plan.cores, 1),
        distributed_configs=() if reference or plan is None else train_distributed_configs(plan),
    )


def _execute(
    spec: RunSpec | TrainSpec,
    directory: Path,
    env: Mapping[str, str],
    settings: Settings,
    model: ModelSpec,
    cancel: threading.Event | None = None,
) -> tuple[str, ProcessOutcome]:
    return render_and_run(
        spec,
        directory,
        env=env,
        timeout=timeout_of(model, settings),
        memory_limit=settings.host_memory_limit,
        cancel=cancel,
    )


class ReferenceRun:
    """One item's CPU reference: its spec, its cache key, and its run.

    The run starts at once, in a thread of its own beside the device run, unless the reference
    cache holds an entry the verdict is sure to use. The reference needs no device cores, so the
    item takes about the longer of the two runs instead of their sum, and the cores are free as
    soon as the device run ends. Every caller reads the cache through :meth:`cached` (an entry of
    the device run's commit). Only an entry that records no commit is sure before the device run
    says its commit: the key holds the model, its revision and the stack, so the device run of that
    model records no commit either (a local folder; transformers 5.24 keeps none on the config). An
    entry of a commit may be another commit's than the one the device run loads (a moved branch):
    the reference starts beside the device run all the same and is stopped if the entry proves to
    be of the device's commit, so it never starts after the device run.
    """

    def __init__(self, model: ModelSpec, settings: Settings, workdir: Path, environ: Mapping[str, str]) -> None:
        self.spec = run_spec(model, settings, device=DEVICES["cpu"], reference=True, post_load="")
        self.key = reference_key(self.spec, settings.stack)
        self._directory = workdir / "reference"
        self._env = _cpu_env(settings, environ)
        self._settings = settings
        self._model = model
        self._cancel = threading.Event()
        self._outcome: ProcessOutcome | None = None
        self._thread: threading.Thread | None = None
        #: The reference result the verdict used (cached or run), once :func:`_reference` has it.
        self.result: Mapping[str, Any] | None = None
        if self.cached(None) is None:
            self._thread = threading.Thread(target=self._run, name="neuron-support-reference", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        run = _execute(self.spec, self._directory, self._env, self._settings, self._model, cancel=self._cancel)
        self._outcome = run[1]

    def outcome(self) -> ProcessOutcome:
        """The finished run: waits for the early one, or runs it now if none was started."""
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        assert self._outcome is not None
        return self._outcome

    def cancel(self) -> None:
        """Not needed after all (the device run failed, or the cache had it): stop it now."""
        self._cancel.set()
        if self._thread is not None:
            self._thread.join()

    def cached(self, commit: str | None) -> Mapping[str, Any] | None:
        """The cached result of this reference for a device run that loaded ``commit`` (None for a model
        that records none: a local folder, or a transformers that keeps no commit on the config), or
        None when the cache lacks it or holds another commit's."""
        if self._settings.reference_cache is None:
            return None
        return ReferenceCache(self._settings.reference_cache).get(self.key, commit)


def session_env(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a process the session starts for a model:

    - offline (``HF_HUB_OFFLINE=1``) when the session found the Hub unreachable
      (``settings.hub_unreachable``): ``from_pretrained`` then loads from the cache or fails at once,
      instead of through the client's connection retries (about 50 s a load); otherwise the user's own
      ``HF_HUB_OFFLINE`` as it is;
    - ``OMP_NUM_THREADS`` set to the session's ``settings.cpu_threads`` (``--cpu-threads``): the workers'
      concurrent runs share the CPUs instead of each sizing its thread pool to the whole machine
      (``planning.cpu_threads`` says what that oversubscription costs). None leaves the user's own."""
    env = dict(environ)
    if settings.hub_unreachable is not None:
        env["HF_HUB_OFFLINE"] = "1"
    if settings.cpu_threads is not None:
        env["OMP_NUM_THREADS"] = str(settings.cpu_threads)
    return env


def device_run_env(settings: Settings, environ: Mapping[str, str], pinned: Mapping[str, str]) -> dict[str, str]:
    """The environment of a device run: the caller's (offline when the session found the Hub
    unreachable, with the session's CPU threads: :func:`session_env`), the lease's pinning (the
    device's core variable) and, with ``--neff-cache``, the device's compile cache variable."""
    env = {**session_env(settings, environ), **pinned}
    if settings.compile_cache is not None:
        # neuron: one folder per compiler version (its cache keys hold none), the one neff pull and push use
        cache = neffcache.run_cache_dir(settings.device, settings.compile_cache, settings.stack.neuronx_cc)
        env[settings.device.compile_cache_env] = str(cache)
    return env


def run_model(
    model: ModelSpec,
    settings: Settings,
    plan: Plan,
    *,
    cores: tuple[int, int] = (0, 1),
    post_load: str = "",
    env: Mapping[str, str] | None = None,
    release: Callable[[], None] | None = None,
    workdir: Path | None = None,
    planned: Row | None = None,
) -> Row:
    """Check one model end to end and return its row. ``cores`` is the lease (first, count).

    ``release`` is called the moment the device run ends: the verdict (reference, judge) needs
    no device cores, so the lease's holder can hand them to the next item.
    """
    environ = dict(os.environ if env is None else env)
    first, count = cores
    # The caller that already built the planned row (to see whether it runs at all) hands it over.
    planned = planned_row(model, settings, plan) if planned is None else planned
    row = replace(planned, first_core=first, lease_start=round(time.time(), 3))
    if workdir is None:
        workdir = run_dir(settings.results_dir, settings.device.name, model.id)
    device_env = device_run_env(settings, environ, settings.device.pin_cores(first, count))
    sharded = plan.cores > 1
    # The free-running CPU reference: the seed's exact parity for one-core runs, and the embeddings
    # an embedding task is compared with. A sharded generation run is checked teacher-forced only:
    # a free-running CPU run of a model that needs 16 cores is 32 slow decode steps, one forward is not.
    reference = ReferenceRun(model, settings, workdir, environ) if not sharded or model.embedding else None
    spec = run_spec(model, settings, device=settings.device, reference=False, post_load=post_load, plan=plan)
    try:
        source, outcome = _execute(spec, workdir / "device", device_env, settings, model)
    except BaseException:
        if reference is not None:
            reference.cancel()
        raise
    finally:
        lease_end = round(time.time(), 3)
        if release is not None:
            release()
    row = replace(row, runscript=source, run_s=round(outcome.wall_s, 3), lease_end=lease_end)
    result = outcome.result
    if result is not None:
        row = with_device_result(row, result)
        row = with_cache_counts(row, result)
    if result is None or not result.get("ok"):
        if reference is not None:
            reference.cancel()
        status, stage, error = failure_of(outcome, "run.py", offline=settings.hub_unreachable, checkpoint=model.id)
        return replace(
            row,
            result=status,
            failure_stage=stage_name(stage, False),
            verdict_basis="run",
            error=scrub(error, environ),
        )
    if row.repeat_identical is False:
        if reference is not None:
            reference.cancel()
        return repeat_failure(row, result)

    if model.embedding:
        assert reference is not None
        row, failed = _reference(model, settings, row, result, reference, environ)
        if failed:
            return failed
        return replace(row, result="PASS") if row.reference_match else row
    if reference is not None:
        row, failed = _reference(model, settings, row, result, reference, environ)
        if failed:
            return failed
        row, forced, failed = _cpu_check(model, settings, row, result, workdir, environ, reference.result)
        if failed:
            return failed
        assert forced is not None
        return single_core_verdict(row, settings, forced)
    row, forced, failed = _cpu_check(model, settings, row, result, workdir, environ, None)
    if failed:
        return failed
    row, judged = judge_row(row, settings, workdir, environ, result)
    if forced is None:  # the host could not hold the model: the judge decides alone
        row = replace(row, verdict_basis="judge")
        return replace(row, **judged) if judged else replace(row, result="PASS")
    row = replace(row, verdict_basis="teacher-forced")
    if forced.passes(settings.parity):
        return replace(row, result="PASS")
    return replace(row, result="FAIL", failure_stage="parity", error=forced_error(forced, len(row.tokens)))


def run_training(
    model: ModelSpec,
    settings: Settings,
    plan: Plan,
    *,
    cores: tuple[int, int] = (0, 1),
    post_load: str = "",
    env: Mapping[str, str] | None = None,
    release: Callable[[], None] | None = None,
    workdir: Path | None = None,
    planned: Row | None = None,
) -> Row:
    """The training check of one model end to end (check ``train``): train.py on the device under the
    lease (``cores`` = first, count), the same steps on CPU (``release`` is called the moment the device
    run ends: they need no cores), and the step-by-step verdict. A one-core run's CPU side runs beside
    it; a sharded run's after it, once train.py says how many examples a step took over all its ranks
    (FSDP ranks each take their own batch; the CPU takes them all in one). Never raises for the model's
    failure: every outcome is the row."""
    environ = dict(os.environ if env is None else env)
    first, count = cores
    planned = training_row(planned_row(model, settings, plan), model, settings) if planned is None else planned
    row = replace(planned, first_core=first, lease_start=round(time.time(), 3))
    if workdir is None:
        workdir = run_dir(settings.results_dir, settings.device.name, model.id) / "train"
    device_env = device_run_env(settings, environ, settings.device.pin_cores(first, count))
    cpu_spec = train_spec(model, settings, device=DEVICES["cpu"], reference=True, post_load="", plan=None)
    short = _cpu_train_memory_shortfall(row, cpu_spec, settings)
    cpu_outcome: list[ProcessOutcome] = []
    cancel = threading.Event()

    def start_cpu_side(spec: TrainSpec) -> threading.Thread:
        def run() -> None:
            cpu_outcome.append(
                _execute(spec, workdir / "cpu", _cpu_env(settings, environ), settings, model, cancel=cancel)[1]
            )

        thread = threading.Thread(target=run, name="neuron-support-train-cpu", daemon=True)
        thread.start()
        return thread

    # Beside a one-core device run: the CPU steps need no cores, so the item takes the longer of the two.
    sharded = plan.cores > 1
    cpu_side = start_cpu_side(cpu_spec) if short is None and not sharded else None
    spec = train_spec(model, settings, device=settings.device, reference=False, post_load=post_load, plan=plan)
    try:
        source, outcome = _execute(spec, workdir / "device", device_env, settings, model)
    except BaseException:
        cancel.set()
        raise
    finally:
        lease_end = round(time.time(), 3)
        if release is not None:
            release()
    row = replace(row, runscript=source, run_s=round(outcome.wall_s, 3), lease_end=lease_end)
    result = outcome.result
    if result is not None:
        row = with_training_result(row, result)
    if result is None or not result.get("ok"):
        cancel.set()
        if cpu_side is not None:
            cpu_side.join()
        status, stage, error = failure_of(outcome, "train.py", offline=settings.hub_unreachable, checkpoint=model.id)
        return replace(
            row,
            result=status,
            failure_stage=stage_name(stage, False),
            verdict_basis="run",
            error=scrub(error, environ),
        )
    if short is not None:
        return replace(row, result="ERROR", failure_stage="reference", verdict_basis="run", error=short)
    if cpu_side is None:  # sharded: once train.py said how many examples a step took over its ranks
        cpu_spec = replace(cpu_spec, batch_size=int(result.get("global_batch") or cpu_spec.batch_size))
        cpu_side = start_cpu_side(cpu_spec)
    cpu_side.join()
    cpu = cpu_outcome[0]
    row = replace(row, reference_dtype=cpu_spec.dtype, reference_s=round(cpu.wall_s, 3), reference_cached=False)
    if cpu.result is None or not cpu.result.get("ok"):
        status, _, error = failure_of(cpu, "CPU train.py", offline=settings.hub_unreachable, checkpoint=model.id)
        return replace(row, result=status, failure_stage="reference", verdict_basis="run", error=scrub(error, environ))
    return training_verdict(row, result, cpu.result)


def _cpu_train_memory_shortfall(row: Row, spec: TrainSpec, settings: Settings) -> str | None:
    """Why the host cannot hold the CPU side of a training check (its training state, the same memory
    model the planner uses, x CPU_CHECK_OVERHEAD), or None when it can (or the size is unknown)."""
    if not row.parameters:
        return None
    needed = int(training_bytes(row.parameters, spec.dtype) * CPU_CHECK_OVERHEAD)
    if settings.cpu_check_memory is not None:
        available, what = settings.cpu_check_memory, "--cpu-check-memory-gib allows"
    else:
        import psutil

        available, what = int(psutil.virtual_memory().available), "the host has available"
    if needed <= available:
        return None
    gib = 1 << 30
    return (
        f"the CPU side of the training check needs ~{needed / gib:.1f} GiB of host memory ({spec.dtype} training "
        f"state x {CPU_CHECK_OVERHEAD}), {what} {available / gib:.1f} GiB: no CPU steps to compare with"
    )


def _cpu_check(
    model: ModelSpec,
    settings: Settings,
    row: Row,
    result: Mapping[str, Any],
    workdir: Path,
    environ: Mapping[str, str],
    reference: Mapping[str, Any] | None,
) -> tuple[Row, TeacherForced | None, Row | None]:
    """The teacher-forced CPU check of the device's tokens: (row with its evidence, its summary or
    None when it could not run, a final row if the check's own run failed).

    A free-running reference that generated exactly the device's tokens has already scored them
    teacher-forced (its own pass is this check): that pass is reused. Otherwise the check is a
    run.py of its own, cached like the reference, started only where the host can hold the model.
    """
    tokens = tuple(int(t) for t in result.get("tokens") or ())
    device_top = result.get("top_logprobs") or ()
    if reference is not None and tuple(reference.get("tokens") or ()) == tokens and "forced" in reference:
        forced = teacher_forced(reference["forced"], device_top)
        return with_forced(replace(row, cpu_check="reused", cpu_check_s=0.0), forced), forced, None
    spec = cpu_check_spec(model, settings, tokens)
    short = _cpu_check_memory_shortfall(row, spec, settings)
    if short is not None:
        return replace(row, cpu_check=f"skipped: {short}"), None, None
    key = reference_key(spec, settings.stack)
    cache = ReferenceCache(settings.reference_cache) if settings.reference_cache is not None else None
    cached = cache.get(key, result.get("commit")) if cache is not None else None
    if cached is not None:
        forced = teacher_forced(cached["forced"], device_top)
        return with_forced(replace(row, cpu_check="cached", cpu_check_s=0.0), forced), forced, None
    _, outcome = _execute(spec, workdir / "cpu-check", _cpu_env(settings, environ), settings, model)
    row = replace(row, cpu_check="ran", cpu_check_s=round(outcome.wall_s, 3))
    checked = outcome.result
    if checked is None or not checked.get("ok"):
        status, _, error = failure_of(
            outcome, "teacher-forced CPU check run.py", offline=settings.hub_unreachable, checkpoint=model.id
        )
        failed = replace(
            row, result=status, failure_stage="reference", verdict_basis="run", error=scrub(error, environ)
        )
        return row, None, failed
    if cache is not None:
        cache.put(key, checked)
    forced = teacher_forced(checked["forced"], device_top)
    return with_forced(row, forced), forced, None


def _cpu_check_memory_shortfall(row: Row, spec: RunSpec, settings: Settings) -> str | None:
    """Why the host cannot hold the model for the CPU check, or None when it can (or the size is unknown)."""
    if not row.parameters:
        return None
    needed = int(row.parameters * DTYPE_BYTES[spec.dtype] * CPU_CHECK_OVERHEAD)
    if settings.cpu_check_memory is not None:
        available, what = settings.cpu_check_memory, "--cpu-check-memory-gib allows"
    else:
        import psutil

        available, what = int(psutil.virtual_memory().available), "the host has available"
    if needed <= available:
        return None
    gib = 1 << 30
    return (
        f"needs ~{needed / gib:.1f} GiB of host memory ({spec.dtype} weights x {CPU_CHECK_OVERHEAD}), "
        f"{what} {available / gib:.1f} GiB"
    )


def _reference(
    model: ModelSpec,
    settings: Settings,
    row: Row,
    result: Mapping[str, Any],
    run: ReferenceRun,
    environ: Mapping[str, str],
) -> tuple[Row, Row | None]:
    """The CPU reference (cached, or its run) and the comparison with it; the second value is a
    final row if the reference failed."""
    ref_spec = run.spec
    cache = ReferenceCache(settings.reference_cache) if settings.reference_cache is not None else None
    reference = run.cached(result.get("commit"))
    if reference is not None:
        run.cancel()
        row = replace(row, reference_dtype=ref_spec.dtype, reference_s=0.0, reference_cached=True)
    else:
        ref = run.outcome()
        row = replace(row, reference_dtype=ref_spec.dtype, reference_s=round(ref.wall_s, 3), reference_cached=False)
        if ref.result is None or not ref.result.get("ok"):
            status, _, error = failure_of(
                ref, "CPU reference run.py", offline=settings.hub_unreachable, checkpoint=model.id
            )
            failed = replace(
                row, result=status, failure_stage="reference", verdict_basis="run", error=scrub(error, environ)
            )
            return row, failed
        reference = ref.result
        if cache is not None:
            cache.put(run.key, reference)
    run.result = reference
    if model.embedding:
        return with_embedding_parity(model, row, result, reference), None
    return replace(with_parity(row, result, reference), reference_tokens=tuple(reference["tokens"])), None


def judge_row(
    row: Row,
    settings: Settings,
    workdir: Path,
    environ: Mapping[str, str],
    result: Mapping[str, Any],
    *,
    text_only: bool = False,
) -> tuple[Row, dict[str, Any]]:
    """A sharded run's fluency verdict: cheap checks, then a judge model in its own CPU process.

    ``text_only``: the subject is a text (``neuron_judge("some text")``), not a run's output: it has no
    tokens, so only the checks that read the text apply (the token checks would call it empty).

    Returns the row with the judge's evidence, and the fields (result, failure_stage, error) that
    make it a failure if the judge decides, empty when the judge found the text fluent.
    """
    row = replace(row, judge_model=settings.judge_model, judge_revision=settings.judge_revision)
    text = row.text or ""
    if text_only:
        precheck = text_precheck(text)
    else:
        precheck = fluency_precheck(text, row.tokens, result.get("special_ids") or (), result.get("eos_id"))
    if precheck is not None:
        row = replace(row, judge_verdict=f"precheck: {precheck}")
        return row, {"result": "FAIL", "failure_stage": "judge", "error": precheck}
    directory = workdir / "judge"
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "judge.py"
    script.write_text(render_judge(JudgeSpec(settings.judge_model, settings.judge_revision, text)), encoding="utf-8")
    outcome = run_script(
        script,
        directory / "verdict.json",
        env=_cpu_env(settings, environ),
        timeout=settings.model_timeout,
        log_path=directory / "log.txt",
    )
    verdict = outcome.result
    if verdict is None or not verdict.get("ok"):
        status, _, error = failure_of(
            outcome, f"judge {settings.judge_model}", offline=settings.hub_unreachable, checkpoint=settings.judge_model
        )
        error = scrub(error, environ) or ""
        return replace(row, judge_verdict=f"judge failed: {error[:300]}"), {
            "result": status,
            "failure_stage": "judge",
            "error": error,
        }
    score = float(verdict["score"])
    row = replace(
        row,
        judge_revision=str(verdict.get("resolved_revision") or settings.judge_revision),
        judge_score=round(score, 6),
        judge_verdict="fluent" if verdict["fluent"] else "not fluent",
    )
    if verdict["fluent"]:
        return row, {}
    error = f"judge {settings.judge_model} found the text not fluent (P(yes)={score:.3f}): {text[:200]!r}"
    return row, {"result": "FAIL", "failure_stage": "judge", "error": error}


_PIN_VARS = frozenset(kind.core_env_var for kind in DEVICES.values() if kind.core_env_var)


def _cpu_env(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a CPU-side run (reference, CPU check, judge, training's CPU side): offline
    when the session found the Hub unreachable, with the session's CPU threads (:func:`session_env`),
    no device core pinning, and no device backend autoloaded (importing torch would load torch-neuronx
    on a trn2 host)."""
    env = session_env(settings, environ)
    return {**{k: v for k, v in env.items() if k not in _PIN_VARS}, **NO_DEVICE_ENV}
