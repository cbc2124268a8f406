"""What a task is: one row of the task table (:mod:`.table`), with its default row here.

A task says how a model of it is loaded (library, Auto class), what run.py feeds it and how (its
run.py fragments under ``templates/tasks/``, spliced into run.py the way ``templates/common.py`` is),
how its result becomes row columns, how its output is compared with the CPU's and how the inference
check decides it (through the pure rules of :mod:`pytest_neuron_support.verdict.decide`), which of the
catalog's fields it takes, what its settings hash holds, and how the planner reads its size.

:class:`Task`'s attributes and methods are the default row: a causal LM generating text from a prompt.
A task module subclasses it and sets only what differs, as transformers' ``testing_utils`` device
tables keep a ``"default"`` entry beside one entry per device.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.cpu.reference import ReferenceRun, reference_result
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.planning.planner import ModelShape, Plan, distributed_configs, inspect_model
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.verdict.decide import Decision, repeat_differs, run_failed
from pytest_neuron_support.verdict.tokens import repeat_divergence

#: Graphs a run with static shapes needs: one decoding-step graph (generate() runs the prefill
#: eagerly), or one forward graph for an embedding task. More is a graph break or a recompile:
#: on neuron each one is another neuronx-cc compile.
EXPECTED_GRAPHS = 1


class Task:
    """One task the suite runs (the default row: text generation with a causal LM).

    Attributes:
        name: the catalog's ``task:`` value: the Hub's pipeline tag, or for a second row of one pipeline tag
            (a CTC speech recogniser beside Whisper's), that tag with the row's own suffix.
        pipeline_tag: the Hub's pipeline tag and ``transformers.pipeline``'s task for it (its name unless a row
            says otherwise): what the Hub views rank and the pipeline check asks ``transformers.pipeline`` for.
        library: the library run.py loads it with.
        auto_class: the Auto class of that library run.py loads the model with.
        inputs: how run.py feeds it (its ``SPEC["inputs"]``): ``text`` (the prompt), ``vision`` (the
            prompt and run.py's own test card, through the processor) or ``embedding`` (a fixed list of
            sentences).
        code: run.py's task code, files of ``templates/tasks/`` spliced in this order after its library's
            loading (``templates/tasks/<library>.py``): together its :attr:`fragments`.
        takes_prompt: a catalog entry may set ``prompt:``.
        fixed_input: what it is fed instead, for a task that takes no prompt (the catalog's error says it).
        cosine: judged by cosine similarity (a catalog entry may set ``min_cosine:``).
        generates: it generates tokens (``--max-new-tokens`` applies; the training check may apply).
        pipeline: users reach for ``transformers.pipeline(<name>)`` for it: the pipeline check applies, with
            its :attr:`pipeline_fragments` (the task's inputs fragment gives the pipeline's call).
        trainable: the training check applies (``-k training``): train.py fine-tunes it with the Trainer on
            the task's own loss. Only causal language modelling has that train.py today.
        prior_factor: how many times a text-generation run of the same weights a run of this task is
            expected to take, before the dataset has a run of it: only the sweep's order reads it (the
            longest items start first, so none is left running alone at the end).
        registry: where the installed library lists every architecture it maps for this task, as
            ``(module, mapping)``: ``neuron-support coverage`` marks each covered, excluded or missing
            (catalog/coverage.py). None where no registry says which architectures do the task.
    """

    library: ClassVar[str] = "transformers"
    auto_class: str = "AutoModelForCausalLM"
    inputs: ClassVar[str] = "text"
    code: tuple[str, ...] = ("text.py", "generation.py")
    takes_prompt: ClassVar[bool] = True
    fixed_input: ClassVar[str] = ""
    cosine: ClassVar[bool] = False
    generates: ClassVar[bool] = True
    pipeline: ClassVar[bool] = True
    trainable: ClassVar[bool] = True
    prior_factor: ClassVar[float] = 1.0
    registry: tuple[str, str] | None = (
        "transformers.models.auto.modeling_auto",
        "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    )

    def __init__(self, name: str, pipeline_tag: str | None = None) -> None:
        self.name = name
        self.pipeline_tag = pipeline_tag or name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    @property
    def fragments(self) -> tuple[str, ...]:
        """run.py's code for this task: its library's loading, then its own."""
        return (f"{self.library}.py", *self.code)

    @property
    def pipeline_fragments(self) -> tuple[str, ...]:
        """run.py's code for the pipeline check: loading through ``transformers.pipeline``, the task's own
        code, then the pipeline's call (which replaces the direct path's run)."""
        return ("pipeline.py", *self.code, "pipeline_call.py")

    # --- what a run of it is ----------------------------------------------------------------------

    def prompt(self, model: ModelSpec, default: str) -> str | None:
        """The prompt its runs use: the entry's, else the session's ``--prompt`` (``default``)."""
        return model.prompt or default

    def max_new_tokens(self, settings: Settings) -> int | None:
        """Greedy tokens per run (None for a task that generates none)."""
        return settings.max_new_tokens if self.generates else None

    def hash_parts(self, model: ModelSpec) -> list[str]:
        """What the settings hash holds for this task beyond what every task's does."""
        return []

    def spec_fields(self, model: ModelSpec, reference: bool) -> dict[str, Any]:
        """The task's own fields of its run.py spec (a CPU reference's with ``reference``)."""
        return {}

    def run_spec(
        self,
        model: ModelSpec,
        settings: Settings,
        *,
        device: DeviceKind,
        reference: bool,
        post_load: str,
        plan: Plan | None = None,
    ) -> RunSpec:
        """run.py's spec: on the device compiled with the session's backend and sharded by the plan; a
        CPU reference (``reference``) eager, one process, in the reference dtype, on the same inputs."""
        return RunSpec(
            model=model.id,
            revision=model.revision,
            task=self.name,
            dtype=(settings.reference_dtype or model.dtype) if reference else model.dtype,
            prompt=self.prompt(model, settings.prompt) or "",
            max_new_tokens=settings.max_new_tokens,
            device=device,
            compile=not reference,
            compile_backend=device.compile_backend if reference else settings.compile_backend,
            trust_remote_code=model.trust_remote_code and settings.allow_remote_code,
            post_load="" if reference else post_load,
            world_size=1 if reference or plan is None else max(plan.cores, 1),
            distributed_configs=() if reference or plan is None else distributed_configs(plan),
            **self.script_fields(),
            **self.spec_fields(model, reference),
        )

    def script_fields(self) -> dict[str, Any]:
        """What a run.py spec takes from the task's row: its Auto class, its inputs, its fragments."""
        return {"auto_class": self.auto_class, "inputs": self.inputs, "fragments": self.fragments}

    def read_shape(self, model: ModelSpec, *, local_only: bool = False) -> ModelShape:
        """The planner's facts about a model of this task (its ``config.json`` and weights' headers)."""
        return inspect_model(model, local_only=local_only)

    # --- from its result to its row ---------------------------------------------------------------

    def with_result(self, row: Row, result: Mapping[str, Any]) -> Row:
        """What run.py measured, into the row's columns."""
        first_s, second_s = result.get("first_generate_s"), result.get("generate_s")
        compile_s = round(first_s - second_s, 3) if first_s is not None and second_s is not None else None
        versions = result.get("versions") or {}
        graphs = result.get("graphs_compiled")
        tokens = tuple(result.get("tokens") or ())
        again = result.get("tokens_again")
        counts = result.get("compile_cache") or {}
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
            load_s=rounded(result.get("load_s")),
            first_generate_s=rounded(first_s),
            generate_s=rounded(second_s),
            time_to_first_token_s=rounded(result.get("time_to_first_token_s")),
            decode_tokens_per_s=rounded(result.get("decode_tokens_per_s")),
            compile_s=compile_s,
            peak_device_memory_bytes=result.get("peak_device_memory_bytes"),
            peak_device_memory_by_rank=tuple(
                m for m in result.get("peak_device_memory_by_rank") or () if m is not None
            ),
            fallback_ops=tuple(result.get("fallback_ops") or ()),
            fallback_ops_unknown=result.get("fallback_ops_unavailable"),
            peak_host_rss_bytes=result.get("peak_host_rss_bytes"),
            cpu_threads=result.get("cpu_threads"),
            tokens=tokens,
            distributed_config=json.dumps(result["distributed_config"]) if result.get("distributed_config") else None,
            distributed_attempts=(
                json.dumps(result["distributed_attempts"]) if result.get("distributed_attempts") else None
            ),
            text=result.get("text"),
            torch=versions.get("torch", row.torch),
            # What run.py imports on top of the stack, as it ran (a run that failed keeps them too), and the
            # task's own library among them (a diffusers pipeline's row is diffusers', not transformers').
            libraries=tuple(result.get("libraries") or row.libraries),
            library=self.library,
            library_version=self.library_version(row, result),
            neuronx_cc=versions.get("neuronx_cc", row.neuronx_cc),
            torch_neuronx=versions.get("torch_neuronx", row.torch_neuronx),
            # Persistent compile-cache hits and misses, as run.py counted them (neuron: kernels, eager ops
            # included; cpu/cuda: inductor's FX graphs); None where the device's stats API was missing.
            persistent_cache_hits=counts.get("hits"),
            persistent_cache_misses=counts.get("misses"),
        )

    def library_version(self, row: Row, result: Mapping[str, Any]) -> str:
        """The version of the task's library the run imported: its pin among run.py's ``libraries``, else
        the run's recorded versions (run.py records transformers' always), else the row's."""
        for requirement in result.get("libraries") or ():
            name, _, version = str(requirement).partition("==")
            if name == self.library and version:
                return version
        return str((result.get("versions") or {}).get(self.library, row.library_version))

    def repeat(self, row: Row, result: Mapping[str, Any]) -> Decision | None:
        """The warm second run must repeat the first: None when it did, else its FAIL."""
        if row.repeat_identical is not False:
            return None
        return repeat_differs(row.tokens, result.get("tokens_again"), row.repeat_divergence)

    # --- its verdict ------------------------------------------------------------------------------

    def free_reference(self, sharded: bool) -> bool:
        """Whether a free-running CPU reference runs beside the device run."""
        return not sharded

    def compare(self, row: Row, model: ModelSpec, result: Mapping[str, Any], reference: Mapping[str, Any]) -> Row:
        """The device ``result`` against the CPU ``reference``: the evidence, into the row's columns."""
        raise NotImplementedError(f"{self.name}: no comparison with a CPU reference")

    def reference_of(
        self, row: Row, result: Mapping[str, Any], reference: ReferenceRun
    ) -> tuple[Row, Mapping[str, Any] | None]:
        """The free-running CPU reference's result for the device ``result`` (cached for its commit, or run
        beside it), with its dtype and timing in the row; (the row decided ERROR at ``reference``, None)
        when the reference could not run."""
        ref = reference_result(reference, result.get("commit"))
        row = replace(row, reference_dtype=ref.dtype, reference_s=ref.wall_s, reference_cached=ref.cached)
        if ref.failure is not None:
            return replace(row, **run_failed(ref.failure[0], "reference", ref.failure[1]).fields()), None
        return row, ref.result

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], reference: ReferenceRun | None) -> Row:
        """The inference check's verdict of a device run that finished and repeated itself: the CPU
        checks this task needs, their evidence into the row, and the decision."""
        raise NotImplementedError(f"{self.name}: no verdict")

    def locate_options(self, row: Row, result: Mapping[str, Any]) -> Mapping[str, Any] | str | None:
        """What run.py's module search (``SPEC["locate"]``) feeds a numerics FAIL's one forward; where it has none,
        why not for this row (a FAIL outside any module), or None where this task has no search yet (the row says
        so either way). ``recording`` in the options names a file of the device run that the search's forward is
        fed from: it is copied beside each run.py of the search and its reproducer."""
        return None


def rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)
