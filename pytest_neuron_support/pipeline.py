"""One model, from its spec to its row: plan, render, run on the device, run the CPU reference, judge.

Nothing here raises for a model's failure: every outcome becomes a :class:`~.records.Row`,
so one broken model never stops a sweep.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import __version__
from .catalog import ModelSpec
from .checks import compare
from .devices import DEVICES, DeviceKind
from .execution import ProcessOutcome, run_script
from .records import Row, Stack
from .runscript import RunSpec, render

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


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def base_row(model: ModelSpec, settings: Settings) -> Row:
    """A row with the model's and stack's identity filled in, before anything runs."""
    stack = settings.stack
    return Row(
        model_id=model.id,
        result="ERROR",
        revision=model.revision,
        task=model.task,
        source=model.source,
        tags=model.tags,
        device=settings.device.name,
        dtype=model.dtype,
        prompt=model.prompt or settings.prompt,
        max_new_tokens=settings.max_new_tokens,
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


def run_spec(model: ModelSpec, settings: Settings, *, device: DeviceKind, reference: bool, post_load: str) -> RunSpec:
    return RunSpec(
        model=model.id,
        revision=model.revision,
        task=model.task,
        dtype=(settings.reference_dtype or model.dtype) if reference else model.dtype,
        prompt=model.prompt or settings.prompt,
        max_new_tokens=settings.max_new_tokens,
        device=device,
        compile=not reference,
        compile_backend=device.compile_backend if reference else settings.compile_backend,
        trust_remote_code=model.trust_remote_code and settings.allow_remote_code,
        post_load="" if reference else post_load,
    )


def _execute(spec: RunSpec, directory: Path, env: Mapping[str, str], timeout: float) -> tuple[str, ProcessOutcome]:
    directory.mkdir(parents=True, exist_ok=True)
    source = render(spec)
    script = directory / "run.py"
    script.write_text(source, encoding="utf-8")
    outcome = run_script(script, directory / "result.json", env=env, timeout=timeout, log_path=directory / "log.txt")
    return source, outcome


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


def run_model(
    model: ModelSpec,
    settings: Settings,
    *,
    cores: tuple[int, int] = (0, 1),
    post_load: str = "",
    env: Mapping[str, str] | None = None,
) -> Row:
    """Check one model end to end and return its row. ``cores`` is the lease (first, count)."""
    gated = gate(model, settings)
    if gated is not None:
        return gated
    environ = dict(os.environ if env is None else env)
    first, count = cores
    row = replace(
        base_row(model, settings),
        neuron_cores=count,
        tp_size=1,
        ep_size=1,
        plan_reason=f"{count} core(s) leased: {first}..{first + count - 1}",
        compile_backend=settings.compile_backend,
    )
    workdir = settings.results_dir / "runs" / slug(model.id) / settings.device.name
    device_env = {**environ, **settings.device.pin_cores(first, count)}
    spec = run_spec(model, settings, device=settings.device, reference=False, post_load=post_load)
    source, outcome = _execute(spec, workdir / "device", device_env, settings.model_timeout)
    row = replace(row, runscript=source, run_s=round(outcome.wall_s, 3))
    result = outcome.result
    if result is not None:
        row = _with_device_result(row, result)
    if result is None or not result.get("ok"):
        status, stage, error = _failure(outcome, "run.py")
        return replace(row, result=status, failure_stage=_stage_name(stage, False), error=scrub(error, environ))

    ref_spec = run_spec(model, settings, device=DEVICES["cpu"], reference=True, post_load="")
    cpu_env = {k: v for k, v in environ.items() if k not in _PIN_VARS}
    _, ref = _execute(ref_spec, workdir / "reference", cpu_env, settings.model_timeout)
    row = replace(row, reference_dtype=ref_spec.dtype, reference_s=round(ref.wall_s, 3))
    if ref.result is None or not ref.result.get("ok"):
        status, _, error = _failure(ref, "CPU reference run.py")
        return replace(row, result=status, failure_stage="reference", error=scrub(error, environ))

    parity = compare(
        result["tokens"], ref.result["tokens"], result.get("top_logprobs", ()), ref.result.get("top_logprobs", ())
    )
    row = replace(
        row,
        reference_tokens=tuple(ref.result["tokens"]),
        matched_prefix=parity.matched_prefix,
        first_divergence=parity.first_divergence,
        device_token=parity.device_token,
        reference_token=parity.reference_token,
        logprob_gap=parity.logprob_gap,
    )
    if parity.match:
        return replace(row, result="PASS")
    n = len(ref.result["tokens"])
    error = (
        f"tokens differ from the CPU reference at index {parity.first_divergence} of {n} "
        f"(device {parity.device_token}, reference {parity.reference_token}, gap {parity.logprob_gap} nats)"
    )
    return replace(row, result="FAIL", failure_stage="parity", error=error)


_PIN_VARS = frozenset(kind.core_env_var for kind in DEVICES.values() if kind.core_env_var)


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
        text=result.get("text"),
        torch=versions.get("torch", row.torch),
        library_version=versions.get("transformers", row.library_version),
        neuronx_cc=versions.get("neuronx_cc", row.neuronx_cc),
        torch_neuronx=versions.get("torch_neuronx", row.torch_neuronx),
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)
