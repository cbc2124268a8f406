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

import datetime
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import __version__
from .caches import ReferenceCache, reference_key
from .catalog import DEFAULT_PROMPT, ModelSpec
from .checks import (
    DEFAULT_JUDGE,
    DEFAULT_MIN_COSINE,
    EMBEDDING_SENTENCES,
    TeacherForced,
    compare,
    compare_embeddings,
    fluency_precheck,
    repeat_divergence,
    teacher_forced,
)
from .cores import CorePool, neuron_owners
from .devices import DEVICES, NO_DEVICE_ENV, DeviceKind
from .execution import ProcessOutcome, run_script
from .planning import DEFAULT_HEADROOM, DEFAULT_MAX_CORES, DTYPE_BYTES, Plan, PlanningError, inspect_model, plan_cores
from .records import Row, Stack
from .redaction import scrub
from .runscript import TEST_CARD_SIZE, JudgeSpec, RunSpec, render_and_run, render_judge

#: Environment variables whose values must never reach run.py, rows or logs.


@dataclass(frozen=True)
class Settings:
    """Session-wide choices, fixed at configure time.

    Attributes:
        device: the device kind runs use.
        pool_cores: most cores this session holds at once (``--neuron-cores``).
        pool_slice: the host cores it may lease (its slice, in the host's numbering).
        session: its id in the host-wide core ledger.
        max_new_tokens: greedy tokens per run.
        prompt: default prompt (catalog entries may set their own).
        model_timeout: seconds each run.py process may take before its group is killed.
        results_dir: dataset root (Parquet under ``data/``, run artifacts under ``runs/``).
        compile_backend: torch.compile backend for device runs (the device's by default).
        reference_dtype: dtype of the CPU reference, None = the device run's dtype.
        allow_remote_code: the user opted in to Hub repository code (--allow-remote-code).
        stack: versions of the installed stack.
        core_bytes: memory of one core the planner fills (device-reported or --core-memory-gib).
        headroom: fraction of each core kept free of weights (--memory-headroom).
        max_cores: most cores one model may use (--max-cores).
        lease_dir: directory of the host-wide core ledger (every session on the host shares it).
        judge_model: Hub id (or local path) of the model that judges sharded runs' fluency.
        judge_revision: its revision.
        parity: ``exact`` (every token equal) or ``near-tie`` (a near-tie first divergence passes).
        reference_cache: directory of cached CPU reference results, None to always rerun them.
        compile_cache: directory for the device's compile cache (NEFF cache on neuron, inductor's
            FX graph cache elsewhere), None to leave the environment's choice.
        host_memory_limit: address-space cap (bytes) of every run.py process, None for none.
        cpu_check_memory: host memory (bytes) the teacher-forced CPU check of a sharded run may
            take, None for what the host has available when it starts (--cpu-check-memory-gib).
        self_check: the host's doctor self-check for this device (``results_dir/doctor.json``), as
            every row records it; None when none was run.
    """

    device: DeviceKind
    pool_cores: int
    max_new_tokens: int
    prompt: str
    model_timeout: float
    results_dir: Path
    compile_backend: str
    reference_dtype: str | None
    allow_remote_code: bool
    stack: Stack
    core_bytes: int = 24 << 30
    headroom: float = DEFAULT_HEADROOM
    max_cores: int = DEFAULT_MAX_CORES
    lease_dir: Path | None = None
    judge_model: str = DEFAULT_JUDGE
    judge_revision: str = "main"
    parity: str = "exact"
    reference_cache: Path | None = None
    compile_cache: Path | None = None
    host_memory_limit: int | None = None
    cpu_check_memory: int | None = None
    pool_slice: tuple[int, ...] = ()
    session: str = ""
    self_check: str | None = None


def core_pool(settings: Settings) -> CorePool:
    """The session's view of the host-wide core ledger: its slice, its cap, the device's owners."""
    assert settings.lease_dir is not None
    command = settings.device.owners_command
    return CorePool(
        settings.lease_dir,
        settings.pool_slice or settings.pool_cores,
        limit=settings.pool_cores,
        session=settings.session or None,
        device=settings.device.name,
        owners=None if command is None else neuron_owners(command),
    )


#: Graphs a run with static shapes needs: one decoding-step graph (generate() runs the prefill
#: eagerly), or one forward graph for an embedding task. More is a graph break or a recompile:
#: on neuron each one is another neuronx-cc compile.
EXPECTED_GRAPHS = 1
#: Host memory the CPU check needs per byte of weights in its dtype (activations, logits, the
#: interpreter and the library around them).
CPU_CHECK_OVERHEAD = 1.25


def slug(model_id: str) -> str:
    """A directory name for a model id or local path."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model_id.strip("/")) or "model"


#: The text turn after the image of an image-text-to-text entry that sets no prompt, while the
#: session's --prompt is the default (a text continuation prompt says nothing about an image).
IMAGE_PROMPT = "Describe this image."
#: (width, height) of the test card run.py draws for image-text-to-text runs.
IMAGE_SIZE: tuple[int, int] = TEST_CARD_SIZE


def prompt_of(model: ModelSpec, settings: Settings) -> str | None:
    """The prompt a model's runs use; None for embedding tasks, which embed fixed sentences."""
    if model.embedding:
        return None
    if model.prompt:
        return model.prompt
    if model.task == "image-text-to-text" and settings.prompt == DEFAULT_PROMPT:
        return IMAGE_PROMPT
    return settings.prompt


def min_cosine_of(model: ModelSpec) -> float:
    """The cosine threshold of an embedding task: the entry's ``min_cosine``, else the default."""
    return DEFAULT_MIN_COSINE if model.min_cosine is None else model.min_cosine


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def settings_hash(model: ModelSpec, settings: Settings) -> str:
    """What makes two rows of one model on one stack comparable: a rerun with the same hash
    would repeat the same check (``--resume`` skips it)."""
    parts = [
        model.id,
        model.revision,
        model.task,
        model.dtype,
        str(prompt_of(model, settings)),
        str(model.cores),
        str(settings.max_new_tokens),
        settings.device.name,
        settings.compile_backend,
        str(settings.reference_dtype),
        settings.parity,
        settings.judge_model,
        settings.judge_revision,
        str(settings.core_bytes),
        str(settings.headroom),
        str(settings.max_cores),
    ]
    if model.embedding:
        parts += [repr(min_cosine_of(model)), *EMBEDDING_SENTENCES]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def base_row(model: ModelSpec, settings: Settings) -> Row:
    """A row with the model's and stack's identity filled in, before anything runs."""
    stack = settings.stack
    return Row(
        settings_hash=settings_hash(model, settings),
        model_id=model.id,
        result="ERROR",
        revision=model.revision,
        task=model.task,
        source=model.source,
        tags=model.tags,
        device=settings.device.name,
        dtype=model.dtype,
        prompt=prompt_of(model, settings),
        max_new_tokens=None if model.embedding else settings.max_new_tokens,
        neuronx_cc=stack.neuronx_cc,
        torch_neuronx=stack.torch_neuronx,
        torch=stack.torch,
        library=stack.library,
        library_version=stack.library_version,
        python=stack.python,
        timestamp=_now(),
        plugin_version=__version__,
        self_check=settings.self_check,
    )


def gate(model: ModelSpec, settings: Settings) -> Row | None:
    """The row for a model that must not run (excluded, remote code not allowed), else None."""
    row = base_row(model, settings)
    if model.exclude is not None:
        return replace(
            row,
            result="EXCLUDED",
            verdict_basis="catalog",
            exclude_reason=model.exclude.reason,
            exclude_note=model.exclude.note,
            error=f"excluded ({model.exclude.reason}): {model.exclude.note}".rstrip(": "),
        )
    if model.trust_remote_code and not settings.allow_remote_code:
        return replace(
            row,
            result="EXCLUDED",
            verdict_basis="catalog",
            exclude_reason="remote-code",
            exclude_note="needs trust_remote_code; rerun with --allow-remote-code to run the repository's code",
            error="remote code not allowed: pass --allow-remote-code to run it",
        )
    return None


def plan_model(model: ModelSpec, settings: Settings, *, local_only: bool = False) -> tuple[Plan, bool]:
    """The model's plan, and whether the Hub proved unreachable while making it.

    A model that cannot be inspected runs on its catalog ``cores:`` when the entry sets them (the
    user decided); otherwise its plan carries the error (an ERROR row at stage plan saying what to
    pass), never a guessed core count.
    """
    try:
        shape = inspect_model(model, local_only=local_only)
    except PlanningError as exc:
        if model.cores is not None:
            return Plan(
                cores=model.cores,
                tp_size=model.cores,
                ep_size=1,
                weight_bytes=0,
                skip=None,
                reason=f"catalog override: {model.cores} core(s), not inspected ({exc})",
            ), exc.unreachable
        where = f"its catalog entry (line {model.line})" if model.line else "a catalog entry for it (--models-file)"
        error = (
            f"{exc}; to run it without inspecting it, set its core count: 'cores: N' in {where} "
            "(or check the id and the Hub's reachability)"
        )
        return Plan(
            cores=0, tp_size=1, ep_size=1, weight_bytes=0, skip=None, reason=error, error=error
        ), exc.unreachable
    plan = plan_cores(
        shape,
        dtype=model.dtype,
        core_bytes=settings.core_bytes,
        headroom=settings.headroom,
        max_cores=settings.max_cores,
        override=model.cores,
    )
    return plan, False


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


def _execute(
    spec: RunSpec,
    directory: Path,
    env: Mapping[str, str],
    settings: Settings,
    cancel: threading.Event | None = None,
) -> tuple[str, ProcessOutcome]:
    return render_and_run(
        spec,
        directory,
        env=env,
        timeout=settings.model_timeout,
        memory_limit=settings.host_memory_limit,
        cancel=cancel,
    )


class ReferenceRun:
    """One item's CPU reference: its spec, its cache key, and its run.

    The run starts at once, in a thread of its own beside the device run, unless the reference
    cache already holds the key (it is checked against the device run's commit later; a stale
    entry runs it then). The reference needs no device cores, so the item takes about the longer
    of the two runs instead of their sum, and the cores are free as soon as the device run ends.
    """

    def __init__(self, model: ModelSpec, settings: Settings, workdir: Path, environ: Mapping[str, str]) -> None:
        self.spec = run_spec(model, settings, device=DEVICES["cpu"], reference=True, post_load="")
        self.key = reference_key(self.spec, settings.stack)
        self._directory = workdir / "reference"
        self._env = _cpu_env(environ)
        self._settings = settings
        self._cancel = threading.Event()
        self._outcome: ProcessOutcome | None = None
        self._thread: threading.Thread | None = None
        #: The reference result the verdict used (cached or run), once :func:`_reference` has it.
        self.result: Mapping[str, Any] | None = None
        if settings.reference_cache is None or not ReferenceCache(settings.reference_cache).has(self.key):
            self._thread = threading.Thread(target=self._run, name="neuron-support-reference", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        self._outcome = _execute(self.spec, self._directory, self._env, self._settings, cancel=self._cancel)[1]

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


def failure_of(outcome: ProcessOutcome, what: str) -> tuple[str, str, str]:
    """(result, failure_stage, error) for a run.py that did not succeed."""
    result = outcome.result
    if outcome.timed_out:
        return "TIMEOUT", outcome.last_stage, f"{what} exceeded the timeout after {outcome.wall_s:.0f}s"
    if result is not None and not result.get("ok"):
        return (
            "ERROR",
            str(result.get("stage") or outcome.last_stage),
            f"{result.get('error_type')}: {result.get('error')}",
        )
    if outcome.signal_name is not None:
        hint = " (host out of memory?)" if outcome.signal_name == "SIGKILL" else ""
        tail = outcome.log_tail(1500)
        return "ERROR", outcome.last_stage, f"{what} killed by {outcome.signal_name}{hint}\n{tail}".rstrip()
    tail = outcome.log_tail(1500)
    return (
        "ERROR",
        outcome.last_stage,
        f"{what} exited with status {outcome.returncode} without a result\n{tail}".rstrip(),
    )


def stage_name(stage: str, reference: bool) -> str:
    if reference:
        return "reference"
    return stage if stage in ("load", "compile", "generate") else "load" if stage == "start" else stage


def planned_row(model: ModelSpec, settings: Settings, plan: Plan) -> Row:
    """The row before running: identity and plan; SKIPPED when the plan cannot run here."""
    row = replace(
        base_row(model, settings),
        neuron_cores=plan.cores or None,
        tp_size=plan.tp_size,
        ep_size=plan.ep_size,
        plan_reason=plan.reason,
        # weight_bytes is 0 when the model could not be inspected: unknown, not zero.
        weight_bytes=plan.weight_bytes or None,
        parameters=plan.weight_bytes // DTYPE_BYTES[model.dtype] if plan.weight_bytes else None,
        compile_backend=settings.compile_backend,
    )
    if plan.error is not None:
        return replace(row, result="ERROR", failure_stage="plan", verdict_basis="plan", error=plan.error)
    if plan.skip is not None:
        return replace(row, result="SKIPPED", failure_stage="plan", verdict_basis="plan", error=plan.skip)
    fits = core_pool(settings).largest_block() if settings.lease_dir is not None else settings.pool_cores
    if plan.cores > fits:
        return replace(
            row,
            result="SKIPPED",
            failure_stage="plan",
            verdict_basis="plan",
            error=f"needs {plan.cores} cores but the pool has {settings.pool_cores}"
            + (f" (at most {fits} contiguous)" if fits < settings.pool_cores else "")
            + f"; pass --neuron-cores={plan.cores} or more on a machine that has them",
        )
    return row


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
) -> Row:
    """Check one model end to end and return its row. ``cores`` is the lease (first, count).

    ``release`` is called the moment the device run ends: the verdict (reference, judge) needs
    no device cores, so the lease's holder can hand them to the next item.
    """
    environ = dict(os.environ if env is None else env)
    first, count = cores
    row = replace(planned_row(model, settings, plan), first_core=first, lease_start=round(time.time(), 3))
    if workdir is None:
        workdir = settings.results_dir / "runs" / slug(model.id) / settings.device.name
    device_env = {**environ, **settings.device.pin_cores(first, count)}
    if settings.compile_cache is not None:
        device_env[settings.device.compile_cache_env] = str(settings.compile_cache)
    sharded = plan.cores > 1
    # The free-running CPU reference: the seed's exact parity for one-core runs, and the embeddings
    # an embedding task is compared with. A sharded generation run is checked teacher-forced only:
    # a free-running CPU run of a model that needs 16 cores is 32 slow decode steps, one forward is not.
    reference = ReferenceRun(model, settings, workdir, environ) if not sharded or model.embedding else None
    spec = run_spec(model, settings, device=settings.device, reference=False, post_load=post_load, plan=plan)
    try:
        source, outcome = _execute(spec, workdir / "device", device_env, settings)
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
        status, stage, error = failure_of(outcome, "run.py")
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
        return _repeat_failure(row, result)

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
        return _single_core_verdict(row, settings, forced)
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
    return replace(row, result="FAIL", failure_stage="parity", error=_forced_error(forced, len(row.tokens)))


def _repeat_failure(row: Row, result: Mapping[str, Any]) -> Row:
    """The warm second run differs from the first: what a user gets from the NEFF cache is not what
    the first run showed."""
    if result.get("embeddings") is not None:
        error = "the second forward pass's embeddings differ from the first's"
    else:
        index = row.repeat_divergence
        again = list(result.get("tokens_again") or ())
        first = row.tokens[index] if index is not None and index < len(row.tokens) else None
        second = again[index] if index is not None and index < len(again) else None
        error = (
            f"the warm second generate() differs from the first at position {index} of {len(row.tokens)} "
            f"(first {first}, second {second})"
        )
    return replace(row, result="FAIL", failure_stage="generate", verdict_basis="repeat", error=error)


def _single_core_verdict(row: Row, settings: Settings, forced: TeacherForced) -> Row:
    """One core: free-running parity with the CPU reference and the teacher-forced check, both."""
    row = replace(row, verdict_basis="parity+teacher-forced")
    free_ok = bool(row.reference_match) or (settings.parity == "near-tie" and bool(row.near_tie))
    forced_ok = forced.passes(settings.parity)
    if free_ok and forced_ok:
        return replace(row, result="PASS")
    problems = []
    if not free_ok:
        n = len(row.reference_tokens)
        problems.append(
            f"tokens differ from the CPU reference at index {row.first_divergence} of {n} "
            f"(device {row.device_token}, reference {row.reference_token}, gap {row.logprob_gap} nats"
            f"{', a near-tie' if row.near_tie else ''})"
        )
    if not forced_ok:
        problems.append(_forced_error(forced, len(row.tokens)))
    return replace(row, result="FAIL", failure_stage="parity", error="; ".join(problems))


def _forced_error(forced: TeacherForced, n: int) -> str:
    if forced.positions_checked == 0:
        return "the teacher-forced CPU check scored no token (the device generated none)"
    return (
        f"teacher-forced CPU check: {forced.positions_disagreeing} of {forced.positions_checked} device tokens are not "
        f"the CPU top-1; first at position {forced.first_disagreement} of {n} (device {forced.device_token}, "
        f"CPU top-1 {forced.cpu_token}, device token ranked {forced.rank}, {forced.deficit} nats below; "
        f"max deficit {forced.max_deficit} nats{', all near-ties' if forced.all_near_ties else ''})"
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
        return _with_forced(replace(row, cpu_check="reused", cpu_check_s=0.0), forced), forced, None
    spec = cpu_check_spec(model, settings, tokens)
    short = _cpu_check_memory_shortfall(row, spec, settings)
    if short is not None:
        return replace(row, cpu_check=f"skipped: {short}"), None, None
    key = reference_key(spec, settings.stack)
    cache = ReferenceCache(settings.reference_cache) if settings.reference_cache is not None else None
    cached = cache.get(key, result.get("commit")) if cache is not None else None
    if cached is not None:
        forced = teacher_forced(cached["forced"], device_top)
        return _with_forced(replace(row, cpu_check="cached", cpu_check_s=0.0), forced), forced, None
    _, outcome = _execute(spec, workdir / "cpu-check", _cpu_env(environ), settings)
    row = replace(row, cpu_check="ran", cpu_check_s=round(outcome.wall_s, 3))
    checked = outcome.result
    if checked is None or not checked.get("ok"):
        status, _, error = failure_of(outcome, "teacher-forced CPU check run.py")
        failed = replace(
            row, result=status, failure_stage="reference", verdict_basis="run", error=scrub(error, environ)
        )
        return row, None, failed
    if cache is not None:
        cache.put(key, checked)
    forced = teacher_forced(checked["forced"], device_top)
    return _with_forced(row, forced), forced, None


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


def _with_forced(row: Row, forced: TeacherForced) -> Row:
    return replace(
        row,
        positions_checked=forced.positions_checked,
        positions_disagreeing=forced.positions_disagreeing,
        first_disagreement=forced.first_disagreement,
        disagreement_device_token=forced.device_token,
        disagreement_cpu_token=forced.cpu_token,
        disagreement_rank=forced.rank,
        disagreement_deficit=forced.deficit,
        max_logprob_deficit=forced.max_deficit,
        disagreements_near_tie=forced.all_near_ties,
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
    reference = cache.get(run.key, result.get("commit")) if cache is not None else None
    if reference is not None:
        run.cancel()
        row = replace(row, reference_dtype=ref_spec.dtype, reference_s=0.0, reference_cached=True)
    else:
        ref = run.outcome()
        row = replace(row, reference_dtype=ref_spec.dtype, reference_s=round(ref.wall_s, 3), reference_cached=False)
        if ref.result is None or not ref.result.get("ok"):
            status, _, error = failure_of(ref, "CPU reference run.py")
            failed = replace(
                row, result=status, failure_stage="reference", verdict_basis="run", error=scrub(error, environ)
            )
            return row, failed
        reference = ref.result
        if cache is not None:
            cache.put(run.key, reference)
    run.result = reference
    if model.embedding:
        return _with_embedding_parity(model, row, result, reference), None
    return replace(with_parity(row, result, reference), reference_tokens=tuple(reference["tokens"])), None


def with_parity(row: Row, result: Mapping[str, Any], reference: Mapping[str, Any]) -> Row:
    """The free-running parity of a device result against a CPU reference (tokens, and the top
    logprobs that tell a near-tie) into the row's parity columns."""
    parity = compare(
        result["tokens"], reference["tokens"], result.get("top_logprobs", ()), reference.get("top_logprobs", ())
    )
    return replace(
        row,
        reference_match=parity.match,
        near_tie=parity.near_tie,
        matched_prefix=parity.matched_prefix,
        first_divergence=parity.first_divergence,
        device_token=parity.device_token,
        reference_token=parity.reference_token,
        logprob_gap=parity.logprob_gap,
    )


def _with_embedding_parity(model: ModelSpec, row: Row, result: Mapping[str, Any], reference: Mapping[str, Any]) -> Row:
    """Cosines of device vs CPU embeddings into the row; a FAIL at stage parity below the threshold."""
    threshold = min_cosine_of(model)
    parity = compare_embeddings(result.get("embeddings") or (), reference.get("embeddings") or (), threshold)
    row = replace(
        row,
        verdict_basis="cosine",
        reference_match=parity.match,
        min_cosine=None if parity.min_cosine is None else round(parity.min_cosine, 8),
        cosine_threshold=threshold,
    )
    if parity.match:
        return row
    if parity.problem is not None:
        error = f"embeddings cannot be compared with the CPU reference: {parity.problem}"
    else:
        error = (
            f"embeddings differ from the CPU reference: min cosine {parity.min_cosine:.6f} "
            f"(sentence {parity.worst_index}) is below the threshold {threshold:g}"
        )
    return replace(row, result="FAIL", failure_stage="parity", error=error)


def judge_row(
    row: Row, settings: Settings, workdir: Path, environ: Mapping[str, str], result: Mapping[str, Any]
) -> tuple[Row, dict[str, Any]]:
    """A sharded run's fluency verdict: cheap checks, then a judge model in its own CPU process.

    Returns the row with the judge's evidence, and the fields (result, failure_stage, error) that
    make it a failure if the judge decides, empty when the judge found the text fluent.
    """
    row = replace(row, judge_model=settings.judge_model, judge_revision=settings.judge_revision)
    text = row.text or ""
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
        env=_cpu_env(environ),
        timeout=settings.model_timeout,
        log_path=directory / "log.txt",
    )
    verdict = outcome.result
    if verdict is None or not verdict.get("ok"):
        status, _, error = failure_of(outcome, f"judge {settings.judge_model}")
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


def _cpu_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a CPU-side run (reference, CPU check, judge): no device core pinning, and
    no device backend autoloaded (importing torch would load torch-neuronx on a trn2 host)."""
    return {**{k: v for k, v in environ.items() if k not in _PIN_VARS}, **NO_DEVICE_ENV}


def with_device_result(row: Row, result: Mapping[str, Any]) -> Row:
    first_s, second_s = result.get("first_generate_s"), result.get("generate_s")
    compile_s = round(first_s - second_s, 3) if first_s is not None and second_s is not None else None
    versions = result.get("versions") or {}
    graphs = result.get("graphs_compiled")
    tokens = tuple(result.get("tokens") or ())
    again = result.get("tokens_again")
    return replace(
        row,
        graphs_compiled=graphs,
        recompiles=result.get("recompiles"),
        graph_breaks=result.get("graph_breaks"),
        graph_break_reasons=tuple(result.get("graph_break_reasons") or ()),
        excess_graphs=None if graphs is None else max(0, int(graphs) - EXPECTED_GRAPHS),
        repeat_identical=result.get("repeat_identical"),
        repeat_divergence=None if again is None else repeat_divergence(tokens, again),
        load_s=_round(result.get("load_s")),
        first_generate_s=_round(first_s),
        generate_s=_round(second_s),
        compile_s=compile_s,
        peak_device_memory_bytes=result.get("peak_device_memory_bytes"),
        peak_device_memory_by_rank=tuple(m for m in result.get("peak_device_memory_by_rank") or () if m is not None),
        fallback_ops=tuple(result.get("fallback_ops") or ()),
        peak_host_rss_bytes=result.get("peak_host_rss_bytes"),
        tokens=tokens,
        distributed_config=json.dumps(result["distributed_config"]) if result.get("distributed_config") else None,
        text=result.get("text"),
        torch=versions.get("torch", row.torch),
        library_version=versions.get("transformers", row.library_version),
        neuronx_cc=versions.get("neuronx_cc", row.neuronx_cc),
        torch_neuronx=versions.get("torch_neuronx", row.torch_neuronx),
    )


def with_cache_counts(row: Row, result: Mapping[str, Any]) -> Row:
    """Compile-cache hits and misses, as run.py counted them (the device's persistent cache)."""
    counts = result.get("compile_cache") or {}
    return replace(row, compile_cache_hits=counts.get("hits"), compile_cache_misses=counts.get("misses"))


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def read_self_check(results_dir: Path, device: str) -> str | None:
    """What ``neuron-support doctor --json <results>/doctor.json`` found for ``device``, as a row keeps
    it; None when there is no such file, it is unreadable, or it checked another device."""
    try:
        data = json.loads((results_dir / "doctor.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("device") != device:
        return None
    verdict = "passed" if data.get("passed") else "FAILED"
    return f"{verdict}: {data.get('summary')} at {data.get('timestamp')}"
