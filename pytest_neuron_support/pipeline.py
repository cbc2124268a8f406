"""One model, from its spec to its row: plan, render, run on the device, run the CPU reference, judge.

Nothing here raises for a model's failure: every outcome becomes a :class:`~.records.Row`,
so one broken model never stops a sweep.
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
    compare,
    compare_embeddings,
    fluency_precheck,
)
from .devices import DEVICES, DeviceKind
from .execution import ProcessOutcome, run_script
from .planning import DEFAULT_HEADROOM, DEFAULT_MAX_CORES, DTYPE_BYTES, Plan, PlanningError, inspect_model, plan_cores
from .records import Row, Stack
from .runscript import TEST_CARD_SIZE, JudgeSpec, RunSpec, render, render_judge

#: Environment variables whose values must never reach run.py, rows or logs.
SECRET_VARS: tuple[str, ...] = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "HF_API_TOKEN")


@dataclass(frozen=True)
class Settings:
    """Session-wide choices, fixed at configure time.

    Attributes:
        device: the device kind runs use.
        pool_cores: size of the core pool items lease from.
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
        lease_dir: directory of the session's core ledger, shared by all workers.
        judge_model: Hub id (or local path) of the model that judges sharded runs' fluency.
        judge_revision: its revision.
        parity: ``exact`` (every token equal) or ``near-tie`` (a near-tie first divergence passes).
        reference_cache: directory of cached CPU reference results, None to always rerun them.
        compile_cache: directory for the device's compile cache (NEFF cache on neuron, inductor's
            FX graph cache elsewhere), None to leave the environment's choice.
        host_memory_limit: address-space cap (bytes) of every run.py process, None for none.
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


def slug(model_id: str) -> str:
    """A directory name for a model id or local path."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model_id.strip("/")) or "model"


def scrub(text: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """Replace the value of every secret variable in ``text`` with ``***``."""
    if text is None:
        return None
    for name in SECRET_VARS:
        value = env.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


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
    )


def gate(model: ModelSpec, settings: Settings) -> Row | None:
    """The row for a model that must not run (excluded, remote code not allowed), else None."""
    row = base_row(model, settings)
    if model.exclude is not None:
        return replace(
            row,
            result="EXCLUDED",
            exclude_reason=model.exclude.reason,
            exclude_note=model.exclude.note,
            error=f"excluded ({model.exclude.reason}): {model.exclude.note}".rstrip(": "),
        )
    if model.trust_remote_code and not settings.allow_remote_code:
        return replace(
            row,
            result="EXCLUDED",
            exclude_reason="remote-code",
            exclude_note="needs trust_remote_code; rerun with --allow-remote-code to run the repository's code",
            error="remote code not allowed: pass --allow-remote-code to run it",
        )
    return None


def plan_model(model: ModelSpec, settings: Settings, *, local_only: bool = False) -> tuple[Plan, bool]:
    """The model's plan, and whether the Hub proved unreachable while making it.

    A model that cannot be inspected runs on its catalog core count or one core: its load
    will then say why (a plan must not hide a missing model behind a skip).
    """
    try:
        shape = inspect_model(model, local_only=local_only)
    except PlanningError as exc:
        cores = 1 if model.cores is None else model.cores
        return Plan(
            cores=cores,
            tp_size=cores,
            ep_size=1,
            weight_bytes=0,
            skip=None,
            reason=f"not inspected ({exc}); running on {cores} core(s)",
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
    ``ep_size=n, tp_plan={}`` raises "has no tp_plan" while ``tp_size=n, ep_size=n`` and
    ``fsdp_size=n, ep_size=n`` work), so run.py detects it and the row records the one used.
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
    )


def _execute(
    spec: RunSpec,
    directory: Path,
    env: Mapping[str, str],
    settings: Settings,
    cancel: threading.Event | None = None,
) -> tuple[str, ProcessOutcome]:
    directory.mkdir(parents=True, exist_ok=True)
    source = render(spec)
    script = directory / "run.py"
    script.write_text(source, encoding="utf-8")
    outcome = run_script(
        script,
        directory / "result.json",
        env=env,
        timeout=settings.model_timeout,
        log_path=directory / "log.txt",
        memory_limit=settings.host_memory_limit,
        cancel=cancel,
    )
    return source, outcome


class _ReferenceRun:
    """One item's CPU reference: its spec, its cache key, and its run.

    The run starts at once, in a thread of its own beside the device run, unless the reference
    cache already holds the key (it is checked against the device run's commit later; a stale
    entry runs it then). The reference needs no device cores, so the item takes about the longer
    of the two runs instead of their sum, and the cores are free as soon as the device run ends.
    """

    def __init__(self, model: ModelSpec, settings: Settings, workdir: Path, environ: Mapping[str, str]) -> None:
        self.spec = run_spec(model, settings, device=DEVICES["cpu"], reference=True, post_load="")
        self.key = _reference_key(self.spec, settings)
        self._directory = workdir / "reference"
        self._env = _cpu_env(environ)
        self._settings = settings
        self._cancel = threading.Event()
        self._outcome: ProcessOutcome | None = None
        self._thread: threading.Thread | None = None
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


def _failure(outcome: ProcessOutcome, what: str) -> tuple[str, str, str]:
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


def _stage_name(stage: str, reference: bool) -> str:
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
    if plan.skip is not None:
        return replace(row, result="SKIPPED", failure_stage="plan", error=plan.skip)
    if plan.cores > settings.pool_cores:
        return replace(
            row,
            result="SKIPPED",
            failure_stage="plan",
            error=f"needs {plan.cores} cores but the pool has {settings.pool_cores}; pass --neuron-cores={plan.cores} "
            "or more on a machine that has them",
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
) -> Row:
    """Check one model end to end and return its row. ``cores`` is the lease (first, count).

    ``release`` is called the moment the device run ends: the verdict (reference, judge) needs
    no device cores, so the lease's holder can hand them to the next item.
    """
    environ = dict(os.environ if env is None else env)
    first, count = cores
    row = replace(planned_row(model, settings, plan), first_core=first, lease_start=round(time.time(), 3))
    workdir = settings.results_dir / "runs" / slug(model.id) / settings.device.name
    device_env = {**environ, **settings.device.pin_cores(first, count)}
    if settings.compile_cache is not None:
        device_env[settings.device.compile_cache_env] = str(settings.compile_cache)
    sharded = plan.cores > 1
    # Embedding models are small and have no text for the judge: their CPU reference always runs,
    # sharded or not, so the cosine verdict stays meaningful on every plan.
    needs_reference = not sharded or settings.device.compare_sharded or model.embedding
    reference = _ReferenceRun(model, settings, workdir, environ) if needs_reference else None
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
        row = _with_device_result(row, result)
        row = _with_cache_counts(row, settings.device, result, outcome)
    if result is None or not result.get("ok"):
        if reference is not None:
            reference.cancel()
        status, stage, error = _failure(outcome, "run.py")
        return replace(row, result=status, failure_stage=_stage_name(stage, False), error=scrub(error, environ))

    if reference is not None:
        row, failed = _reference(model, settings, row, result, reference, environ)
        if failed:
            return failed
    if model.embedding:
        return replace(row, result="PASS") if row.reference_match else row
    if sharded:
        return _judge(row, settings, workdir, environ)
    if row.reference_match or (settings.parity == "near-tie" and row.near_tie):
        return replace(row, result="PASS")
    n = len(row.reference_tokens)
    error = (
        f"tokens differ from the CPU reference at index {row.first_divergence} of {n} "
        f"(device {row.device_token}, reference {row.reference_token}, gap {row.logprob_gap} nats"
        f"{', a near-tie' if row.near_tie else ''})"
    )
    return replace(row, result="FAIL", failure_stage="parity", error=error)


def _reference(
    model: ModelSpec,
    settings: Settings,
    row: Row,
    result: Mapping[str, Any],
    run: _ReferenceRun,
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
            status, _, error = _failure(ref, "CPU reference run.py")
            return row, replace(row, result=status, failure_stage="reference", error=scrub(error, environ))
        reference = ref.result
        if cache is not None:
            cache.put(run.key, reference)
    if model.embedding:
        return _with_embedding_parity(model, row, result, reference), None
    parity = compare(
        result["tokens"], reference["tokens"], result.get("top_logprobs", ()), reference.get("top_logprobs", ())
    )
    row = replace(
        row,
        reference_tokens=tuple(reference["tokens"]),
        reference_match=parity.match,
        near_tie=parity.near_tie,
        matched_prefix=parity.matched_prefix,
        first_divergence=parity.first_divergence,
        device_token=parity.device_token,
        reference_token=parity.reference_token,
        logprob_gap=parity.logprob_gap,
    )
    return row, None


def _reference_key(spec: RunSpec, settings: Settings) -> str:
    """The reference cache key: caches.reference_key, plus what it does not hash (the embedded
    sentences, the image size), so changing either is a miss, never a stale hit."""
    key = reference_key(spec, settings.stack)
    if not spec.sentences and spec.task != "image-text-to-text":
        return key
    extra = json.dumps({"key": key, "sentences": list(spec.sentences), "image_size": list(spec.image_size)})
    return hashlib.sha256(extra.encode()).hexdigest()[:32]


def _with_embedding_parity(model: ModelSpec, row: Row, result: Mapping[str, Any], reference: Mapping[str, Any]) -> Row:
    """Cosines of device vs CPU embeddings into the row; a FAIL at stage parity below the threshold."""
    threshold = min_cosine_of(model)
    parity = compare_embeddings(result.get("embeddings") or (), reference.get("embeddings") or (), threshold)
    row = replace(
        row,
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


def _judge(row: Row, settings: Settings, workdir: Path, environ: Mapping[str, str]) -> Row:
    """A sharded run's verdict: cheap checks, then a judge model in its own CPU process."""
    row = replace(row, judge_model=settings.judge_model, judge_revision=settings.judge_revision)
    text = row.text or ""
    precheck = fluency_precheck(text, row.tokens)
    if precheck is not None:
        return replace(
            row,
            result="FAIL",
            failure_stage="judge",
            judge_verdict=f"precheck: {precheck}",
            error=precheck,
        )
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
        status, _, error = _failure(outcome, f"judge {settings.judge_model}")
        return replace(row, result=status, failure_stage="judge", error=scrub(error, environ))
    score = float(verdict["score"])
    row = replace(
        row,
        judge_revision=str(verdict.get("resolved_revision") or settings.judge_revision),
        judge_score=round(score, 6),
        judge_verdict="fluent" if verdict["fluent"] else "not fluent",
    )
    if verdict["fluent"]:
        return replace(row, result="PASS")
    error = f"judge {settings.judge_model} found the text not fluent (P(yes)={score:.3f}): {text[:200]!r}"
    return replace(row, result="FAIL", failure_stage="judge", error=error)


_PIN_VARS = frozenset(kind.core_env_var for kind in DEVICES.values() if kind.core_env_var)


def _cpu_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a CPU-side run (reference, judge): no device core pinning."""
    return {k: v for k, v in environ.items() if k not in _PIN_VARS}


def _with_device_result(row: Row, result: Mapping[str, Any]) -> Row:
    first_s, second_s = result.get("first_generate_s"), result.get("generate_s")
    compile_s = round(first_s - second_s, 3) if first_s is not None and second_s is not None else None
    versions = result.get("versions") or {}
    return replace(
        row,
        graphs_compiled=result.get("graphs_compiled"),
        recompiles=result.get("recompiles"),
        load_s=_round(result.get("load_s")),
        first_generate_s=_round(first_s),
        generate_s=_round(second_s),
        compile_s=compile_s,
        peak_device_memory_bytes=result.get("peak_device_memory_bytes"),
        peak_host_rss_bytes=result.get("peak_host_rss_bytes"),
        tokens=tuple(result.get("tokens") or ()),
        distributed_config=json.dumps(result["distributed_config"]) if result.get("distributed_config") else None,
        text=result.get("text"),
        torch=versions.get("torch", row.torch),
        library_version=versions.get("transformers", row.library_version),
        neuronx_cc=versions.get("neuronx_cc", row.neuronx_cc),
        torch_neuronx=versions.get("torch_neuronx", row.torch_neuronx),
    )


def _with_cache_counts(row: Row, device: DeviceKind, result: Mapping[str, Any], outcome: ProcessOutcome) -> Row:
    """Compile-cache hits and misses: counted by run.py (inductor), or from the compiler's log lines."""
    if device.cache_log_markers is not None:
        log = outcome.log_tail(chars=10_000_000)
        hit, miss = device.cache_log_markers
        return replace(row, compile_cache_hits=log.count(hit), compile_cache_misses=log.count(miss))
    counts = result.get("compile_cache") or {}
    return replace(row, compile_cache_hits=counts.get("hits"), compile_cache_misses=counts.get("misses"))


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)
