"""The training check (a row's ``check`` is ``train``): a few Trainer steps on the device against the
same steps on CPU.

train.py (``templates/train.py``) fine-tunes the model on a fixed text set: ``bf16``, ``torch_compile``
with the device's backend, every example padded to a fixed length and ``dataloader_drop_last``, so every
step has the same shapes; sharded with ``DistributedConfig`` when the plan says so. The same train.py
runs eagerly on CPU (beside a one-core device run; after a sharded one, once it says how many examples a
step took over its ranks). PASS when every loss is finite, the per-step losses and gradient norms agree
with the CPU's within ``verdict.training``'s tolerances, and nothing compiled after the first step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.checks.kind import CpuSide
from pytest_neuron_support.checks.rows import settings_hash
from pytest_neuron_support.cpu.background import BackgroundRun
from pytest_neuron_support.cpu.forced import memory_shortfall
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.devices.table import DEVICES, DeviceKind
from pytest_neuron_support.planning.planner import Plan, distributed_configs
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.execution import failure_of
from pytest_neuron_support.run.runscript import RunSpec, TrainSpec
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.tasks.task import EXPECTED_GRAPHS, Task, rounded
from pytest_neuron_support.verdict import decide
from pytest_neuron_support.verdict.training import (
    TRAIN_BATCH,
    TRAIN_LEARNING_RATE,
    TRAIN_MAX_LENGTH,
    TRAIN_SEED,
    TRAIN_STEPS,
    TRAIN_TEXTS,
    compare_training,
)


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


def _floats(values: Any) -> tuple[float, ...]:
    """Per-step values as a list<double> column (an unrecorded value is NaN, so steps stay aligned)."""
    return tuple(float("nan") if v is None else float(v) for v in values or ())


class TrainCpuSide(BackgroundRun):
    """train.py's CPU steps, beside a one-core device run or after a sharded one."""

    def __init__(self, job: Job, spec: TrainSpec, shortfall: str | None) -> None:
        super().__init__(job, spec, "cpu")
        self.spec: TrainSpec = spec
        #: Why the host cannot hold the CPU side (it never starts then), None when it can.
        self.shortfall = shortfall


class TrainingCheck:
    """Does the model fine-tune unmodified on the device, step for step as on CPU?"""

    name = "train"
    test = "test_training"
    fixture = "neuron_train_check"
    folder = "train"
    script = "train.py"
    training = True
    summary = "train.py: a few Trainer steps (bf16, torch_compile, fixed padding) against the same steps on CPU"

    def applies_to(self, task: Task) -> bool:
        return task.trainable

    def hash_parts(self) -> list[str]:
        # The training check's own settings: its rows never stand for an inference row, nor back.
        return [self.name, *map(repr, (TRAIN_STEPS, TRAIN_BATCH, TRAIN_MAX_LENGTH, TRAIN_LEARNING_RATE)), *TRAIN_TEXTS]

    def planned(self, row: Row, model: ModelSpec, settings: Settings) -> Row:
        """It generates nothing: no prompt or token count; its own hash and step settings."""
        return replace(
            row,
            check=self.name,
            settings_hash=settings_hash(model, settings, self.hash_parts()),
            prompt=None,
            max_new_tokens=None,
            train_steps=TRAIN_STEPS,
            train_batch_size=TRAIN_BATCH,
            train_max_length=TRAIN_MAX_LENGTH,
        )

    def device_spec(self, job: Job, post_load: str) -> TrainSpec:
        return train_spec(
            job.model, job.settings, device=job.settings.device, reference=False, post_load=post_load, plan=job.plan
        )

    def start_cpu_side(self, job: Job, row: Row) -> CpuSide:
        spec = train_spec(job.model, job.settings, device=DEVICES["cpu"], reference=True, post_load="", plan=None)
        side = TrainCpuSide(job, spec, memory_shortfall(row.parameters, spec.dtype, job.settings, training=True))
        # Beside a one-core device run: the CPU steps need no cores, so the item takes the longer of the two.
        if side.shortfall is None and not job.sharded:
            side.start()
        return side

    def with_result(self, job: Job, row: Row, result: Mapping[str, Any]) -> Row:
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
            distributed_attempts=(
                json.dumps(result["distributed_attempts"]) if result.get("distributed_attempts") else None
            ),
            train_global_batch=result.get("global_batch"),
            train_steps=result.get("steps", row.train_steps),
            train_losses=_floats(result.get("losses")),
            train_grad_norms=_floats(result.get("grad_norms")),
            train_first_step_s=rounded(first_s),
            train_steps_per_s=rounded(steps_per_s),
            train_state_bytes=sum(held) if len(held) == 3 else None,
            graphs_compiled=graphs,
            recompiles=result.get("recompiles"),
            graph_breaks=result.get("graph_breaks"),
            graph_break_reasons=tuple(result.get("graph_break_reasons") or ()),
            # Training compiles the forward (its backward comes with it through AOTAutograd): one graph.
            excess_graphs=None if graphs is None else max(0, int(graphs) - EXPECTED_GRAPHS),
            load_s=rounded(result.get("load_s")),
            compile_s=compile_s,
            peak_device_memory_bytes=result.get("peak_device_memory_bytes"),
            peak_device_memory_by_rank=tuple(
                m for m in result.get("peak_device_memory_by_rank") or () if m is not None
            ),
            peak_host_rss_bytes=result.get("peak_host_rss_bytes"),
            cpu_threads=result.get("cpu_threads"),
            distributed_config=json.dumps(result["distributed_config"]) if result.get("distributed_config") else None,
            torch=versions.get("torch", row.torch),
            library_version=versions.get("transformers", row.library_version),
            neuronx_cc=versions.get("neuronx_cc", row.neuronx_cc),
            torch_neuronx=versions.get("torch_neuronx", row.torch_neuronx),
        )

    def locate(self, job: Job, row: Row, result: Mapping[str, Any], spec: RunSpec | TrainSpec) -> Row:
        # The module search reruns the direct path's forward: this check's FAILs say where at their own stage.
        return row

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], side: CpuSide) -> Row:
        assert isinstance(side, TrainCpuSide)
        if side.shortfall is not None:
            return replace(row, **decide.run_failed("ERROR", "reference", side.shortfall).fields())
        if not side.started:  # sharded: once train.py said how many examples a step took over its ranks
            side.spec = replace(side.spec, batch_size=int(result.get("global_batch") or side.spec.batch_size))
            side.start()
        cpu = side.outcome()
        row = replace(row, reference_dtype=side.spec.dtype, reference_s=round(cpu.wall_s, 3), reference_cached=False)
        if cpu.result is None or not cpu.result.get("ok"):
            status, _, error = failure_of(
                cpu, "CPU train.py", offline=job.settings.hub_unreachable, checkpoint=job.model.id
            )
            return replace(row, **decide.run_failed(status, "reference", scrub(error, job.environ) or "").fields())
        return training_verdict(row, result, cpu.result)


def training_verdict(row: Row, device: Mapping[str, Any], cpu: Mapping[str, Any]) -> Row:
    """The training evidence (both runs' per-step losses and gradient norms) into the row, and its
    decision (``verdict.decide.training``)."""
    parity = compare_training(
        device.get("losses") or (), cpu.get("losses") or (), device.get("grad_norms") or (), cpu.get("grad_norms") or ()
    )
    row = replace(
        row,
        cpu_train_losses=_floats(cpu.get("losses")),
        cpu_train_grad_norms=_floats(cpu.get("grad_norms")),
        train_first_bad_step=parity.first_bad_step,
        train_max_loss_delta=parity.max_loss_delta,
        reference_match=parity.match,
    )
    return replace(row, **decide.training(parity, row.recompiles).fields())
