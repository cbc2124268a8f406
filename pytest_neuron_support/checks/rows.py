"""A model's row, built from what each step found: identity and plan (``base_row``, ``gate``,
``planned_row``), the device run's result, and the verdict mapping (parity, the teacher-forced CPU
check, the warm repeat), so :mod:`.pipeline` only orchestrates.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pytest_neuron_support import __version__
from pytest_neuron_support.catalog.load import ModelSpec
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.planning.planner import DTYPE_BYTES, Plan
from pytest_neuron_support.run.execution import ProcessOutcome
from pytest_neuron_support.run.settings import Settings, core_pool, min_cosine_of, prompt_of, settings_hash
from pytest_neuron_support.verdict.checks import (
    GRAD_NORM_RTOL,
    LOSS_ATOL,
    LOSS_RTOL,
    TRAIN_BATCH,
    TRAIN_MAX_LENGTH,
    TRAIN_STEPS,
    TeacherForced,
    TrainParity,
    compare,
    compare_embeddings,
    compare_training,
    repeat_divergence,
)

#: Graphs a run with static shapes needs: one decoding-step graph (generate() runs the prefill
#: eagerly), or one forward graph for an embedding task. More is a graph break or a recompile:
#: on neuron each one is another neuronx-cc compile.
EXPECTED_GRAPHS = 1


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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


#: What the libraries say of a file that is neither in the cache nor may be downloaded
#: (transformers' OSError, huggingface_hub's LocalEntryNotFoundError and OfflineModeIsEnabled).
_NOT_CACHED = re.compile(
    r"couldn't find them in the cached files|outgoing traffic has been disabled|offline mode is enabled"
    r"|LocalEntryNotFoundError|OfflineModeIsEnabled",
    re.IGNORECASE,
)


def offline_cause(reason: str) -> str:
    """Why a run was offline, in one line: the session found the Hub unreachable (``reason``)."""
    return f"the run was offline (HF_HUB_OFFLINE=1): the Hub was found unreachable at session start: {reason}"


def offline_load_error(error: str, reason: str, checkpoint: str) -> str:
    """The error of a load that failed in a run made offline because the session found the Hub
    unreachable (``reason``): one short line when ``checkpoint`` is not in the local cache (the
    library's advice to check the connection says nothing new), else the error and why it ran offline."""
    if _NOT_CACHED.search(error):
        kind = error.split(":", 1)[0]
        return f"{kind}: {checkpoint} is not in the local cache, and {offline_cause(reason)}"
    return f"{error}\n({offline_cause(reason)})"


def failure_of(
    outcome: ProcessOutcome, what: str, *, offline: str | None = None, checkpoint: str = "the checkpoint"
) -> tuple[str, str, str]:
    """(result, failure_stage, error) for a run.py that did not succeed.

    ``offline``: why the session found the Hub unreachable (its runs were offline), None when it
    did not; a load failure of ``checkpoint`` then says so (:func:`offline_load_error`).
    """
    result = outcome.result
    if outcome.timed_out:
        return "TIMEOUT", outcome.last_stage, f"{what} exceeded the timeout after {outcome.wall_s:.0f}s"
    if result is not None and not result.get("ok"):
        stage = str(result.get("stage") or outcome.last_stage)
        error = f"{result.get('error_type')}: {result.get('error')}"
        if result.get("error_type") == "RankDied":
            # A rank that died wrote no result: its last words are only in the shared log.
            error = f"{error}\n{outcome.log_tail(1500)}".rstrip()
        if offline is not None and stage in ("start", "load"):
            error = offline_load_error(error, offline, checkpoint)
        return "ERROR", stage, error
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
        recompile_limit=result.get("recompile_limit"),
        repeat_identical=result.get("repeat_identical"),
        repeat_divergence=None if again is None else repeat_divergence(tokens, again),
        load_s=_round(result.get("load_s")),
        first_generate_s=_round(first_s),
        generate_s=_round(second_s),
        time_to_first_token_s=_round(result.get("time_to_first_token_s")),
        decode_tokens_per_s=_round(result.get("decode_tokens_per_s")),
        compile_s=compile_s,
        peak_device_memory_bytes=result.get("peak_device_memory_bytes"),
        peak_device_memory_by_rank=tuple(m for m in result.get("peak_device_memory_by_rank") or () if m is not None),
        fallback_ops=tuple(result.get("fallback_ops") or ()),
        peak_host_rss_bytes=result.get("peak_host_rss_bytes"),
        cpu_threads=result.get("cpu_threads"),
        tokens=tokens,
        distributed_config=json.dumps(result["distributed_config"]) if result.get("distributed_config") else None,
        distributed_attempts=json.dumps(result["distributed_attempts"]) if result.get("distributed_attempts") else None,
        text=result.get("text"),
        torch=versions.get("torch", row.torch),
        library_version=versions.get("transformers", row.library_version),
        neuronx_cc=versions.get("neuronx_cc", row.neuronx_cc),
        torch_neuronx=versions.get("torch_neuronx", row.torch_neuronx),
    )


def with_cache_counts(row: Row, result: Mapping[str, Any]) -> Row:
    """Persistent compile-cache hits and misses, as run.py counted them (neuron: kernels, eager ops
    included; cpu/cuda: inductor's FX graphs); None where the device's stats API was missing."""
    counts = result.get("compile_cache") or {}
    return replace(row, persistent_cache_hits=counts.get("hits"), persistent_cache_misses=counts.get("misses"))


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def repeat_failure(row: Row, result: Mapping[str, Any]) -> Row:
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


def single_core_verdict(row: Row, settings: Settings, forced: TeacherForced) -> Row:
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
        problems.append(forced_error(forced, len(row.tokens)))
    return replace(row, result="FAIL", failure_stage="parity", error="; ".join(problems))


def forced_error(forced: TeacherForced, n: int) -> str:
    if forced.positions_checked == 0:
        return "the teacher-forced CPU check scored no token (the device generated none)"
    return (
        f"teacher-forced CPU check: {forced.positions_disagreeing} of {forced.positions_checked} device tokens are not "
        f"the CPU top-1; first at position {forced.first_disagreement} of {n} (device {forced.device_token}, "
        f"CPU top-1 {forced.cpu_token}, device token ranked {forced.rank}, {forced.deficit} nats below; "
        f"max deficit {forced.max_deficit} nats{', all near-ties' if forced.all_near_ties else ''})"
    )


def with_forced(row: Row, forced: TeacherForced) -> Row:
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


def with_embedding_parity(model: ModelSpec, row: Row, result: Mapping[str, Any], reference: Mapping[str, Any]) -> Row:
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


def training_row(row: Row, model: ModelSpec, settings: Settings) -> Row:
    """A row of the training check before it runs: it generates nothing, so no prompt or token count."""
    return replace(
        row,
        check="train",
        settings_hash=settings_hash(model, settings, "train"),
        prompt=None,
        max_new_tokens=None,
        train_steps=TRAIN_STEPS,
        train_batch_size=TRAIN_BATCH,
        train_max_length=TRAIN_MAX_LENGTH,
    )


def _floats(values: Any) -> tuple[float, ...]:
    """Per-step values as a list<double> column (an unrecorded value is NaN, so steps stay aligned)."""
    return tuple(float("nan") if v is None else float(v) for v in values or ())


def with_training_result(row: Row, result: Mapping[str, Any]) -> Row:
    """What train.py measured, into the row's training columns (and the shared timing/memory ones)."""
    versions = result.get("versions") or {}
    first_s, steps_per_s = result.get("first_step_s"), result.get("steps_per_s")
    # Compile cost as for inference: the cold first step minus a warm one.
    compile_s = round(first_s - 1.0 / steps_per_s, 3) if first_s is not None and steps_per_s else None
    state = result.get("training_state_bytes") or {}
    held = [int(state[k]) for k in ("weights", "gradients", "optimizer") if state.get(k) is not None]
    graphs = result.get("graphs_compiled")
    trained = result.get("distributed_config") or {}
    return replace(
        row,
        # The sharding that trained, which may not be the plan's first choice (distributed_attempts).
        tp_size=int(trained.get("tp_size", 1)) if trained else row.tp_size,
        ep_size=int(trained.get("ep_size", 1)) if trained else row.ep_size,
        distributed_attempts=json.dumps(result["distributed_attempts"]) if result.get("distributed_attempts") else None,
        train_global_batch=result.get("global_batch"),
        train_steps=result.get("steps", row.train_steps),
        train_losses=_floats(result.get("losses")),
        train_grad_norms=_floats(result.get("grad_norms")),
        train_first_step_s=_round(first_s),
        train_steps_per_s=_round(steps_per_s),
        train_state_bytes=sum(held) if len(held) == 3 else None,
        graphs_compiled=graphs,
        recompiles=result.get("recompiles"),
        graph_breaks=result.get("graph_breaks"),
        graph_break_reasons=tuple(result.get("graph_break_reasons") or ()),
        # Training compiles the forward (its backward comes with it through AOTAutograd): one graph.
        excess_graphs=None if graphs is None else max(0, int(graphs) - EXPECTED_GRAPHS),
        load_s=_round(result.get("load_s")),
        compile_s=compile_s,
        peak_device_memory_bytes=result.get("peak_device_memory_bytes"),
        peak_device_memory_by_rank=tuple(m for m in result.get("peak_device_memory_by_rank") or () if m is not None),
        peak_host_rss_bytes=result.get("peak_host_rss_bytes"),
        cpu_threads=result.get("cpu_threads"),
        distributed_config=json.dumps(result["distributed_config"]) if result.get("distributed_config") else None,
        torch=versions.get("torch", row.torch),
        library_version=versions.get("transformers", row.library_version),
        neuronx_cc=versions.get("neuronx_cc", row.neuronx_cc),
        torch_neuronx=versions.get("torch_neuronx", row.torch_neuronx),
    )


def training_verdict(row: Row, device: Mapping[str, Any], cpu: Mapping[str, Any]) -> Row:
    """PASS when every device loss is finite, each step's loss and gradient norm agree with the CPU's
    within the documented tolerance (checks.LOSS_*, GRAD_NORM_RTOL), and no graph was compiled after
    the first step; else a FAIL at stage train naming the first step that went wrong."""
    parity = compare_training(
        device.get("losses") or (), cpu.get("losses") or (), device.get("grad_norms") or (), cpu.get("grad_norms") or ()
    )
    row = replace(
        row,
        verdict_basis="train-losses",
        cpu_train_losses=_floats(cpu.get("losses")),
        cpu_train_grad_norms=_floats(cpu.get("grad_norms")),
        train_first_bad_step=parity.first_bad_step,
        train_max_loss_delta=parity.max_loss_delta,
        reference_match=parity.match,
    )
    if not parity.match:
        return replace(row, result="FAIL", failure_stage="train", error=training_error(parity))
    if row.recompiles:
        return replace(
            row,
            result="FAIL",
            failure_stage="train",
            error=f"{row.recompiles} graph(s) compiled again after the first optimizer step: the shapes are not fixed",
        )
    return replace(row, result="PASS", failure_stage=None, error=None)


def training_error(parity: TrainParity) -> str:
    step, what = parity.first_bad_step, parity.what
    if what == "step count":
        return f"training: the device ran {parity.steps_compared} step(s) comparable with the CPU's, not all of them"
    if what == "loss not finite":
        return f"training: the loss at step {step} is not finite ({parity.device_value})"
    if what == "loss":
        tolerance = f"tolerance {LOSS_ATOL} + {LOSS_RTOL} x abs(cpu)"
    else:
        tolerance = f"tolerance {GRAD_NORM_RTOL:.0%} of the CPU's"
    return (
        f"training: loss diverged at step {step}: the {what} is {parity.device_value:.6g} on the device, "
        f"{parity.cpu_value:.6g} on CPU ({tolerance})"
    )
