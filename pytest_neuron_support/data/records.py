"""The one schema: every outcome is a :class:`Row`; results and stages have exact meanings.

The Parquet schema, the dataset card's column table and the viewer's columns are all
derived from :class:`Row`'s fields and their ``doc`` metadata, so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from pytest_neuron_support.data.signatures import MAX_MESSAGE, signature
from pytest_neuron_support.verdict.training import GRAD_NORM_RTOL, LOSS_ATOL, LOSS_RTOL

SCHEMA_VERSION = 12

#: Every value of the ``result`` column and exactly what it means.
RESULTS: Mapping[str, str] = {
    "PASS": (
        "The model loaded on the device with the catalog dtype, generate() compiled its decoding step "
        "(at least one graph compiled, none silently skipped), its warm second generate() repeated the first "
        "token for token, and the CPU check of the same checkpoint agreed (verdict_basis says which): "
        "one core: every greedy token equals a free-running CPU run's and is the CPU model's top-1 under the "
        "device's own prefix (teacher-forced); sharded: every device token is the CPU top-1 teacher-forced; "
        "--parity near-tie also accepts disagreements that are near-ties; image-text-to-text: the same image "
        "too; embedding tasks: every sentence's device embedding has cosine >= cosine_threshold with the CPU one; "
        "text-to-image: every component is on the device, the warm call repeated the first image, and every stage of "
        "every step (denoiser, guidance combine, scheduler step, VAE decode), fed the device's own inputs, is within "
        "the calibrated tolerance of the CPU's float32 output (noise_ratio <= the rule's multiple). "
        "A PASS whose fallback_ops is not empty ran those operations on the host, not the device: it is "
        "flagged wherever results are shown. "
        "Only where the host could not hold the model for the CPU check (verdict_basis 'judge') does a "
        "sharded PASS rest on the fluency judge alone. It does not measure throughput or latency, longer "
        "generations, sampling, batching, or accuracy on any benchmark."
    ),
    "FAIL": (
        "The run finished but its output is wrong: stage 'parity' (tokens differ from the CPU reference or "
        "are not the CPU top-1 teacher-forced; see first_divergence, first_disagreement, disagreement_deficit), "
        "'generate' (the warm second generate() differs from the first; see repeat_divergence; text-to-image: the "
        "warm image differs) or 'judge' "
        "(only when the judge decided alone: a sharded run's text was judged not fluent)."
    ),
    "ERROR": (
        "The run did not finish: it raised or died at failure_stage (load, compile, generate, reference, "
        "or harness); error holds the exception type and message, or the signal that killed it."
    ),
    "TIMEOUT": (
        "The run exceeded --model-timeout; its whole process group was killed. failure_stage is the stage it was in."
    ),
    "SKIPPED": (
        "Not run for a reason outside the model's code: it needs more cores than allowed, cannot be "
        "sharded, or needs remote code the user did not allow. error says why."
    ),
    "EXCLUDED": "Curated out in the catalog; exclude_reason and exclude_note say why. Not run.",
}

#: Every value of ``failure_stage``.
STAGES: Mapping[str, str] = {
    "plan": "choosing cores before anything runs (needs more cores than allowed, cannot shard: SKIPPED; "
    "config or size unreadable: ERROR, set cores: N in the entry)",
    "load": "from_pretrained onto the device (download, config, weights, placement); the pipeline check: "
    "transformers.pipeline, and a model it left off the device (FAIL, basis placement)",
    "compile": "first generate() (embedding tasks: first forward pass): graph capture and compilation, "
    "or no graph compiled at all",
    "generate": "second generate() (embedding tasks: second forward pass) and reading outputs back; a FAIL "
    "here means the warm run's tokens differ from the first run's",
    "reference": "a CPU run of the same checkpoint: the free-running reference or the teacher-forced check",
    "parity": "comparing device tokens with the CPU (free-running and teacher-forced; embedding tasks: a cosine "
    "below the threshold; text-to-image: a pipeline stage out of the calibrated tolerance, see evidence_stage)",
    "prompt": "encoder-decoder generation (Whisper): the decoder prompt the device's generate() built (language, "
    "task and timestamp tokens, a detected language included) differs from the CPU reference's (FAIL)",
    "judge": "the fluency judge of a sharded run (decides only when the CPU check could not run)",
    "train": "the training check (check = train): the Trainer's set-up and the optimizer steps after the first "
    "(ERROR), or the per-step losses and gradient norms disagree with the same steps on CPU, a loss is not finite, "
    "or a graph was compiled again after the first step (FAIL; train_first_bad_step says where)",
    "harness": "the test harness itself (unreadable result, worker lost)",
    "test": "a user's own test (its body, or a fixture of its own): an assertion failed (FAIL) or it raised (ERROR)",
}


#: Every value of ``verdict_basis``: which evidence decided the row's result.
VERDICT_BASES: Mapping[str, str] = {
    "parity+teacher-forced": (
        "one-core generation: the device's greedy tokens against a free-running CPU run (the seed's exact "
        "parity) and against a teacher-forced CPU pass over the device's own tokens; both must agree"
    ),
    "teacher-forced": (
        "sharded generation: one CPU forward over prompt + the device's tokens; every device token must be the "
        "CPU top-1 under its own prefix (--parity near-tie: or a near-tie). The judge ran too and its verdict "
        "is kept beside it, but did not decide"
    ),
    "judge": (
        "sharded generation whose CPU check could not run (cpu_check says why, e.g. the host cannot hold the "
        "model): the fluency judge decided alone"
    ),
    "embedding-calibrated": (
        "embedding tasks: every sentence's device embedding within the calibrated tolerance of the CPU's float32 "
        "embedding (distance <= the rule's multiple x the CPU's own dtype noise, docs/verdicts.md), and its cosine "
        "with it at least cosine_threshold"
    ),
    "forward-calibrated": (
        "forward tasks (text, token, image and audio classification, fill-mask): every item's device output (a "
        "sentence's, a token's, a mask's, an image's or a waveform's logits) within the calibrated tolerance of "
        "the CPU's float32 output (docs/verdicts.md), and its decision (the top-1) the CPU's wherever the CPU's "
        "own margin is decisive (larger than the rule's multiple x its dtype noise); a differing near-tie is "
        "reported, not failed"
    ),
    "cosine": (
        "embedding tasks: within the dtype's noise, but a sentence's cosine with the CPU embedding is below "
        "cosine_threshold (the entry's min_cosine, the correlation it is held to): a FAIL"
    ),
    "pipeline-teacher-forced": (
        "text-to-image: the same pipeline call on CPU with every stage fed the device's own inputs (its latent into "
        "the denoiser, its prediction into the guidance combine, its guided noise and latent into the scheduler step, "
        "its final latent into the VAE decoder), in float32 and in the device's dtype: every stage's device output "
        "within the calibrated tolerance (distance from float32 <= the rule's multiple x the CPU's own dtype noise, "
        "docs/verdicts.md); evidence_stage and evidence_step name the first that is not"
    ),
    "train-losses": (
        "the training check: the device's per-step losses and gradient norms against the same steps of the same "
        "train.py on CPU (eager, same data and seed): every loss finite, abs(device - cpu) <= "
        f"{LOSS_ATOL} + {LOSS_RTOL} x abs(cpu) per step, gradient norms within {GRAD_NORM_RTOL:.0%}, and no graph "
        "compiled again after the first step"
    ),
    "placement": (
        "the pipeline check: where transformers.pipeline(task, model=id, device=<device>) put the model, read right "
        "after loading (model_devices); a model not wholly on the session's device FAILs at load and is not run (a "
        "pipeline that silently keeps it on CPU would otherwise pass on the CPU's numbers)"
    ),
    "repeat": "the warm second generate() (or forward) differed from the first: a FAIL at stage generate",
    "run": "the run did not finish (ERROR or TIMEOUT): the exception, signal or timeout decided",
    "plan": "not run: the planner's reason (SKIPPED at stage plan, or ERROR at plan when it could not inspect "
    "the model)",
    "catalog": "not run: the catalog's exclusion, or remote code not allowed (EXCLUDED)",
    "test": "a user's own test (the test column) that used the plugin's fixtures: its own assertions decided",
}


def _doc(text: str, label: str | None = None) -> dict[str, str]:
    """A column's definition, and the human label the viewer's table heads it with (unit included)."""
    return {"doc": text} if label is None else {"doc": text, "label": label}


@dataclass(frozen=True)
class Stack:
    """Software stack versions; a Parquet file holds rows of one (neuronx_cc, library, version).

    Attributes:
        neuronx_cc: neuronx-cc compiler version, ``none`` off Trainium.
        torch_neuronx: torch-neuronx version, ``none`` off Trainium.
        torch: PyTorch version.
        library: the model library checked (``transformers``).
        library_version: its version.
        python: interpreter version.
    """

    neuronx_cc: str
    torch_neuronx: str
    torch: str
    library: str
    library_version: str
    python: str


def installed_version(dist: str) -> str:
    """The installed version of a distribution, ``none`` where it is not installed (reads metadata only)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def current_stack() -> Stack:
    """Versions installed for this interpreter, read from package metadata (imports nothing)."""
    return Stack(
        neuronx_cc=installed_version("neuronx-cc"),
        torch_neuronx=installed_version("torch-neuronx"),
        torch=installed_version("torch"),
        library="transformers",
        library_version=installed_version("transformers"),
        python=platform.python_version(),
    )


@dataclass(frozen=True)
class Row:
    """One outcome for one model on one stack: the unit of the dataset.

    Every item (pass, fail, error, timeout, skip, exclusion) becomes exactly one row. Field
    docs (``doc`` metadata) are the dataset card's column definitions.
    """

    model_id: str = field(metadata=_doc("Hub id (org/name), or the absolute path of a local checkpoint", label="Model"))
    result: str = field(
        metadata=_doc("PASS, FAIL, ERROR, TIMEOUT, SKIPPED or EXCLUDED (defined below)", label="Result")
    )
    revision: str = field(default="main", metadata=_doc("revision asked for (branch, tag or commit)"))
    task: str = field(
        default="text-generation",
        metadata=_doc(
            "the task row that checked it (tasks/table.py, docs/tasks.md), as the catalog's task: names it: "
            "text-generation, image-text-to-text, text-to-image, automatic-speech-recognition, a forward task "
            "(text-classification, fill-mask, object-detection, ...)",
            label="Task",
        ),
    )
    source: str = field(
        default="catalog",
        metadata=_doc(
            "catalog, cli (--model ID), local (--model ./dir), test (a user's test: see the test column) or census "
            "(benchmarks/census.py: one tiny random model per architecture and task)"
        ),
    )
    test: str = field(
        default="",
        metadata=_doc(
            "node id of the user's own test that made this row with the plugin's fixtures (file::name[params]); "
            "its model_id is the test's model, or the node id when it checks none. Empty for catalog items"
        ),
    )
    failure_stage: str | None = field(
        default=None, metadata=_doc("stage that failed (defined below); null on PASS", label="Failed at")
    )
    check: str = field(
        default="inference",
        metadata=_doc(
            "which check made the row: inference (run.py: the task's direct path, from_pretrained(device_map=...), "
            "against the CPU), pipeline (run.py through transformers.pipeline(task, model=id, device=...), against "
            "the direct path's CPU reference) or train (train.py: a few Trainer optimizer steps against the same "
            "steps on CPU); a model checked several ways has one row of each",
            label="Check",
        ),
    )
    train_steps: int | None = field(
        default=None, metadata=_doc("check train: optimizer steps the device run took (max_steps)")
    )
    train_batch_size: int | None = field(
        default=None, metadata=_doc("check train: examples per step per rank, each padded to train_max_length")
    )
    train_global_batch: int | None = field(
        default=None,
        metadata=_doc(
            "check train: examples per step over all ranks (FSDP ranks each take their own batch; tensor-parallel "
            "ranks share one): what the CPU side takes per step in its one process"
        ),
    )
    train_max_length: int | None = field(
        default=None, metadata=_doc("check train: tokens per example (padding='max_length': fixed shapes)")
    )
    train_losses: tuple[float, ...] = field(
        default=(), metadata=_doc("check train: the device's training loss at each optimizer step, in order")
    )
    cpu_train_losses: tuple[float, ...] = field(
        default=(), metadata=_doc("check train: the CPU's loss at each step (same train.py, eager, same data and seed)")
    )
    train_grad_norms: tuple[float, ...] = field(
        default=(), metadata=_doc("check train: the device's gradient norm (before clipping) at each step")
    )
    cpu_train_grad_norms: tuple[float, ...] = field(
        default=(), metadata=_doc("check train: the CPU's gradient norm at each step")
    )
    train_first_bad_step: int | None = field(
        default=None,
        metadata=_doc(
            "check train: the first optimizer step (1-based) whose loss or gradient norm is off the CPU's or not "
            "finite; null when every step agrees"
        ),
    )
    train_max_loss_delta: float | None = field(
        default=None, metadata=_doc("check train: the largest abs(device - cpu) loss difference over the steps (nats)")
    )
    train_first_step_s: float | None = field(
        default=None,
        metadata=_doc("check train: seconds of the first optimizer step, its compile included", label="First step (s)"),
    )
    train_steps_per_s: float | None = field(
        default=None,
        metadata=_doc("check train: optimizer steps per second after the first (compiled, warm)", label="Steps/s"),
    )
    train_state_bytes: int | None = field(
        default=None,
        metadata=_doc(
            "check train: bytes of weights, gradients and optimizer state train.py held (rank 0's shard when "
            "sharded): what the planner's training memory model (4 x the weights' bytes) estimates"
        ),
    )
    error: str | None = field(
        default=None, metadata=_doc("exception type and message, signal, or skip reason", label="Error")
    )
    # Derived, never passed: made from the row's own fields whenever a row is built (from_mapping
    # and replace() included), so every row has it, crash rows too, and rows read from a dataset
    # written before the column existed, or under older rules, compare under the current ones.
    signature: str | None = field(
        default=None,
        init=False,
        metadata=_doc(
            "the failure's root cause, the same for every model that fails the same way (ERROR, FAIL and "
            "TIMEOUT rows; null otherwise): '<stage>: <ExceptionType>[ <operation or module>]: <message>' with the "
            "row's model id, paths, addresses, hex ids, shapes, sizes, times and numbers normalised away (signals, "
            "exit codes and errno kept), the message's first line (continued while it ends with ':') cut to "
            f"{MAX_MESSAGE} characters; out-of-memory errors as 'OutOfMemory device|host'; parity FAILs by where "
            "tokens first went wrong (token 0, 1-3, 4-15, 16-31, 32+) and which check failed; recomputed whenever "
            "a row is read. `neuron-support failures` groups models by it",
            label="Failure signature",
        ),
    )
    expected_result: str | None = field(
        default=None,
        metadata=_doc(
            "the catalog entry's expected result for this check (expect:): FAIL, ERROR or TIMEOUT (a known "
            "failure), or PASS with expected_recompiles (a known compile defect); null when it is expected to pass"
        ),
    )
    expected_stage: str | None = field(
        default=None, metadata=_doc("the stage the expectation says it fails at (null: any stage)")
    )
    expected_signature: str | None = field(
        default=None, metadata=_doc("what the expectation says the failure signature starts with (null: any)")
    )
    expected_recompiles: bool | None = field(
        default=None, metadata=_doc("the expectation says the run hits Dynamo's recompile limit")
    )
    expected_reason: str | None = field(
        default=None,
        metadata=_doc("why the entry is expected to fail (the upstream issue's URL where there is one)"),
    )
    expectation: str | None = field(
        default=None,
        metadata=_doc(
            "the row against its expectation: met (an XFAIL, or a PASS with its known defect), improved (it "
            "passed, or no longer recompiles: a strict XPASS, a failed item) or differs (it failed otherwise: a "
            "failure of its own); null without an expectation, and for SKIPPED and EXCLUDED rows"
        ),
    )
    exclude_reason: str | None = field(default=None, metadata=_doc("catalog exclusion reason"))
    exclude_note: str | None = field(default=None, metadata=_doc("catalog exclusion note"))
    tags: tuple[str, ...] = field(default=(), metadata=_doc("catalog tags"))
    device: str = field(default="cpu", metadata=_doc("device kind the run used: neuron, cuda or cpu", label="Device"))
    neuron_cores: int | None = field(
        default=None, metadata=_doc("cores (devices off Trainium) the run used", label="Cores")
    )
    tp_size: int | None = field(default=None, metadata=_doc("tensor-parallel size (1 = not sharded)", label="TP"))
    ep_size: int | None = field(default=None, metadata=_doc("expert-parallel size (1 = not sharded)", label="EP"))
    plan_reason: str | None = field(default=None, metadata=_doc("why the planner chose this core count"))
    parameters: int | None = field(
        default=None,
        metadata=_doc("parameter count read from the safetensors metadata (null if not inspected)", label="Parameters"),
    )
    weight_bytes: int | None = field(
        default=None, metadata=_doc("bytes the weights take on the device in the run dtype (null if not inspected)")
    )
    distributed_config: str | None = field(
        default=None,
        metadata=_doc(
            "JSON of the DistributedConfig arguments a sharded run loaded with (check train: the one it trained with)"
        ),
    )
    distributed_attempts: str | None = field(
        default=None,
        metadata=_doc(
            "JSON list of the DistributedConfig argument sets tried before distributed_config and why each failed "
            "(config, error; check train: the stage too, e.g. the Trainer refusing tensor parallelism); null "
            "when the first one worked or the run was not sharded"
        ),
    )
    first_core: int | None = field(default=None, metadata=_doc("first core of the leased contiguous range"))
    lease_start: float | None = field(default=None, metadata=_doc("epoch seconds the run started on its lease"))
    lease_end: float | None = field(
        default=None,
        metadata=_doc("epoch seconds the device run ended and the lease was released (the verdict runs after)"),
    )
    dtype: str = field(default="bfloat16", metadata=_doc("weights dtype on the device"))
    reference_dtype: str | None = field(default=None, metadata=_doc("dtype of the CPU reference run"))
    compile_backend: str | None = field(default=None, metadata=_doc("torch.compile backend of generate()"))
    prompt: str | None = field(default=None, metadata=_doc("prompt text"))
    max_new_tokens: int | None = field(default=None, metadata=_doc("greedy tokens asked for"))
    graphs_compiled: int | None = field(
        default=None,
        metadata=_doc("graphs compiled by the first generate() (check train: by all the training steps)"),
    )
    recompiles: int | None = field(
        default=None,
        metadata=_doc(
            "graphs compiled again by the second generate() (check train: graphs compiled after the first "
            "optimizer step; fixed shapes need none, so any is a FAIL)"
        ),
    )
    run_s: float | None = field(
        default=None,
        metadata=_doc("wall seconds of the device run.py, compile included", label="Run time incl. compile (s)"),
    )
    load_s: float | None = field(default=None, metadata=_doc("seconds in from_pretrained"))
    compile_s: float | None = field(
        default=None, metadata=_doc("first generate() minus second generate(): the compile cost", label="Compile (s)")
    )
    first_generate_s: float | None = field(default=None, metadata=_doc("seconds of the first generate()"))
    generate_s: float | None = field(default=None, metadata=_doc("seconds of the second (compiled) generate()"))
    time_to_first_token_s: float | None = field(
        default=None,
        metadata=_doc(
            "warm (second) generate(): seconds from its call to the first new token on the host (the prefill "
            "and one decoding step; the cold run's compile is in compile_s, not here)",
            label="Time to first token (s)",
        ),
    )
    decode_tokens_per_s: float | None = field(
        default=None,
        metadata=_doc(
            "warm (second) generate(): new tokens per second after the first (the compiled decoding step); "
            "null for embedding tasks",
            label="Decode (tokens/s)",
        ),
    )
    reference_s: float | None = field(default=None, metadata=_doc("wall seconds of the CPU reference run"))
    reference_cached: bool | None = field(
        default=None, metadata=_doc("the CPU reference came from the reference cache (same key, same commit)")
    )
    persistent_cache_hits: int | None = field(
        default=None,
        metadata=_doc(
            "lookups the device's persistent (on-disk) compile cache answered during the two generate() calls. "
            "neuron: every kernel that passed torch-neuronx's C++ compilation cache, the eager prefill's "
            "per-op kernels as well as the torch.compile'd graphs (_C._get_compilation_cache_stats, "
            "TORCH_NEURONX_METRICS_ENABLED=1); cpu/cuda: inductor's FX-graph cache hits "
            "(counters['inductor']['fxgraph_cache_hit']), compiled graphs only. Null where the device's "
            "stats API is absent from the installed wheel (unknown, not zero)"
        ),
    )
    persistent_cache_misses: int | None = field(
        default=None,
        metadata=_doc(
            "lookups the same cache could not answer, so the kernel (neuron: graph or eager op) or FX graph "
            "(cpu/cuda) was compiled; null where the stats API is absent (unknown, not zero)"
        ),
    )
    peak_device_memory_bytes: int | None = field(
        default=None,
        metadata=_doc(
            "the device allocator's peak on one core (torch.<device>.max_memory_allocated after synchronize: "
            "tensors only, no compiled code, scratchpad or collective buffers); sharded: the largest rank's; "
            "null on cpu",
            label="Peak device memory",
        ),
    )
    peak_device_memory_by_rank: tuple[int, ...] = field(
        default=(), metadata=_doc("sharded runs: each rank's allocator peak on its own core, by rank")
    )
    fallback_ops: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "operations that ran on the host instead of the device (torch-neuronx's get_fallback_ops(): the eager "
            "prefill can fall back silently); a PASS with any is flagged"
        ),
    )
    fallback_ops_unknown: str | None = field(
        default=None,
        metadata=_doc(
            "why the device's fallback-op list could not be read (a wheel without the private API it reads): "
            "fallback_ops is then unknown, not empty; null when it was read"
        ),
    )
    fallback_calls: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "where fallback_ops is not empty: each distinct call of those ops with its arguments' dtypes and shapes "
            "(aten::cumsum(bfloat16[1, 7], -1) x3), recorded on an eager rerun of the device run; empty otherwise "
            "(fallback_note says why where the rerun could not say)"
        ),
    )
    fallback_reproducer: str | None = field(
        default=None,
        metadata=_doc(
            "the fallback reproducer, relative to the results folder: a run.py that loads no model and makes each "
            "of fallback_calls again alone on the device, with random tensors of those dtypes and shapes, saying "
            "after each (in a process of its own) whether the device's fallback list names its op; null where "
            "nothing fell back or nothing was captured (fallback_note says why)"
        ),
    )
    fallback_note: str | None = field(
        default=None,
        metadata=_doc(
            "where fallback_ops is not empty: how fallback_calls were captured and how to run the reproducer, or "
            "why they were not; null on every other row"
        ),
    )
    peak_host_rss_bytes: int | None = field(default=None, metadata=_doc("peak resident memory of run.py"))
    cpu_threads: int | None = field(
        default=None,
        metadata=_doc(
            "intra-op CPU threads the device run.py ran with (its torch.get_num_threads(); the session's "
            "--cpu-threads, by default the usable CPUs shared among the workers' concurrent runs); every "
            "timing above was measured with it",
            label="CPU threads",
        ),
    )
    tokens: tuple[int, ...] = field(default=(), metadata=_doc("generated token ids on the device"))
    text: str | None = field(default=None, metadata=_doc("generated text on the device"))
    reference_tokens: tuple[int, ...] = field(default=(), metadata=_doc("generated token ids on CPU"))
    reference_match: bool | None = field(
        default=None,
        metadata=_doc(
            "all tokens equal the CPU reference (embedding tasks: every cosine >= cosine_threshold); "
            "null when no reference ran"
        ),
    )
    matched_prefix: int | None = field(default=None, metadata=_doc("leading tokens equal to the reference"))
    first_divergence: int | None = field(default=None, metadata=_doc("index of the first differing token"))
    device_token: int | None = field(default=None, metadata=_doc("device token at the first divergence"))
    reference_token: int | None = field(default=None, metadata=_doc("reference token at the first divergence"))
    logprob_gap: float | None = field(
        default=None,
        metadata=_doc("reference logprob of its token minus that of the device token, at the divergence (nats)"),
    )
    judge_model: str | None = field(default=None, metadata=_doc("model that judged a sharded run's fluency"))
    judge_revision: str | None = field(default=None, metadata=_doc("the judge's resolved revision"))
    judge_verdict: str | None = field(
        default=None, metadata=_doc("fluent, not fluent, or 'precheck: <why>' when cheap checks failed first")
    )
    judge_score: float | None = field(default=None, metadata=_doc("judge's P(yes | yes or no) for 'is it fluent?'"))
    min_cosine: float | None = field(
        default=None,
        metadata=_doc("embedding tasks: the smallest cosine similarity between a sentence's device and CPU embeddings"),
    )
    cosine_threshold: float | None = field(
        default=None, metadata=_doc("embedding tasks: the cosine every sentence must reach to PASS")
    )
    denoise_step_s: float | None = field(
        default=None, metadata=_doc("text-to-image: mean seconds of one denoising step in the warm pipeline call")
    )
    image_psnr: float | None = field(
        default=None,
        metadata=_doc(
            "text-to-image: PSNR in dB of the device's final image against the free-running CPU run's from the same "
            "seed (100 = identical); evidence, not the verdict"
        ),
    )
    image: str | None = field(
        default=None,
        metadata=_doc(
            "text-to-image: the device's final image, a PNG in the run folder's device/ (runs/<model>/<device>/)"
        ),
    )
    reference_image: str | None = field(
        default=None,
        metadata=_doc("text-to-image: the CPU reference's final image, a PNG in the run folder's reference/"),
    )
    numeric_stages: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "numeric checks: every comparison the calibrated tolerance rule judged, in order, as "
            "'<stage>[<step>]' (text-to-image: denoise, guidance, scheduler and decode at each step; embedding "
            "tasks: embedding per sentence)"
        ),
    )
    numeric_ratios: tuple[float, ...] = field(
        default=(),
        metadata=_doc(
            "numeric checks: each comparison's noise_ratio, in numeric_stages' order (PASS needs every one <= the "
            "rule's multiple, docs/verdicts.md)"
        ),
    )
    evidence_stage: str | None = field(
        default=None,
        metadata=_doc(
            "numeric checks: the stage that decided: the first comparison out of tolerance on a FAIL, else the one "
            "closest to its tolerance (denoise, guidance, scheduler, decode, embedding)",
            label="Stage checked",
        ),
    )
    evidence_step: int | None = field(
        default=None,
        metadata=_doc("numeric checks: evidence_stage's step (text-to-image) or sentence (embeddings), 0-based"),
    )
    evidence_distance: float | None = field(
        default=None,
        metadata=_doc(
            "numeric checks: at evidence_stage, the device output's relative L2 distance from the CPU's in float32 "
            "on the device's own inputs"
        ),
    )
    noise_floor: float | None = field(
        default=None,
        metadata=_doc(
            "numeric checks: at evidence_stage, the CPU's own dtype noise: the relative L2 distance of the CPU run in "
            "the device's dtype from the CPU run in float32 on the same inputs, raised to the rule's floor"
        ),
    )
    noise_ratio: float | None = field(
        default=None,
        metadata=_doc(
            "numeric checks: evidence_distance / noise_floor; PASS needs every comparison's ratio <= the rule's "
            "multiple (docs/verdicts.md), so it says how close a PASS was",
            label="Noise ratio",
        ),
    )
    diverging_module: str | None = field(
        default=None,
        metadata=_doc(
            "a numerics FAIL: the first module, in execution order, whose output was out of the calibrated "
            "tolerance when one forward at the first bad position ran again on the device and on CPU with a hook "
            "on every module (its path in the model, e.g. model.layers.1.mlp.down_proj); null when none was "
            "named (locate_note says why)",
            label="First diverging module",
        ),
    )
    diverging_module_kind: str | None = field(
        default=None, metadata=_doc("diverging_module's class (Linear, Qwen3MLP, LayerNorm, ...)")
    )
    diverging_distance: float | None = field(
        default=None,
        metadata=_doc("diverging_module's output: the device's relative L2 distance from the CPU's in float32"),
    )
    diverging_ratio: float | None = field(
        default=None,
        metadata=_doc(
            "diverging_module's output: diverging_distance / the dtype's own noise there (the calibrated rule's "
            "ratio; over the rule's multiple, or it would not be named)"
        ),
    )
    last_inside_module: str | None = field(
        default=None,
        metadata=_doc("a numerics FAIL: the last module before diverging_module whose output was still inside"),
    )
    locate_note: str | None = field(
        default=None,
        metadata=_doc(
            "a numerics FAIL: how the module search ended: 'located' with how many modules were compared, or why "
            "no module was named (a sharded run, a task without the search, a rerun that failed, every module "
            "inside); null on every other row (the search runs only after a numerics FAIL)"
        ),
    )
    compiler_error_code: str | None = field(
        default=None,
        metadata=_doc(
            "an ERROR whose error names a neuronx-cc error code (NCC_IBIR227, ...): the first one; the failure "
            "signature names it too",
            label="Compiler code",
        ),
    )
    reproducer: str | None = field(
        default=None,
        metadata=_doc(
            "the standalone script that reproduces a failure, relative to the results folder: for a compile ERROR "
            "the graph the backend failed on, written by Dynamo's own repro machinery when the device run ran again "
            "with torch._dynamo.config.repro_after = 'dynamo' (python3 repro.py run --no-save-dir runs it on random "
            "inputs, without the model's weights); for a numerics FAIL with a diverging_module, a run.py that feeds "
            "that module alone the inputs it records from the CPU model, on the device and on CPU, and prints both "
            "distances and the ratio; null when none was written (reproducer_note says why)",
            label="Reproducer",
        ),
    )
    reproducer_note: str | None = field(
        default=None,
        metadata=_doc(
            "a compile ERROR or a numerics FAIL: how the reproducer was made and how to run it, or why none was (a "
            "sharded run, a failure outside the backend's compile of a graph); null on every other row"
        ),
    )
    parity_mode: str | None = field(
        default=None,
        metadata=_doc(
            "token checks: the --parity mode the verdict used: exact (every token equal) or near-tie (a near-tie "
            "divergence may pass); a near-tie PASS has near_tie true",
            label="Parity",
        ),
    )
    libraries: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "the model libraries run.py imports, as pip requirements with the versions installed "
            "(transformers==..., diffusers==..., sentence-transformers==...): what to install on top of the stack"
        ),
    )
    pipeline_class: str | None = field(
        default=None, metadata=_doc("check = pipeline: the pipeline class transformers.pipeline built")
    )
    pipeline_device: str | None = field(
        default=None, metadata=_doc("check = pipeline: the pipeline's own device (its .device) after loading")
    )
    model_devices: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "check = pipeline: the device types holding the model's parameters and buffers right after the pipeline "
            "loaded it; anything but the session's device alone is a FAIL at load (basis placement)"
        ),
    )
    pipeline_text: str | None = field(
        default=None,
        metadata=_doc(
            "check = pipeline: the text the pipeline itself returned (its generated_text or text); tokens and text are "
            "read from its generate() call"
        ),
    )
    near_tie: bool | None = field(
        default=None,
        metadata=_doc(
            "the first divergence is a near-tie: each token in the other run's top-5 and their gap <= 0.5 nats "
            "(numeric drift, not a broken model); null when the runs agree"
        ),
    )
    verdict_basis: str | None = field(
        default=None,
        metadata=_doc("which evidence decided the result (the values are defined below)", label="Decided by"),
    )
    cpu_check: str | None = field(
        default=None,
        metadata=_doc(
            "the teacher-forced CPU check: ran, cached, reused (the free-running reference generated the same "
            "tokens, and its own teacher-forced pass is this one), or 'skipped: <why>'; null when it does not apply"
        ),
    )
    cpu_check_s: float | None = field(default=None, metadata=_doc("wall seconds of the teacher-forced CPU run"))
    positions_checked: int | None = field(
        default=None,
        metadata=_doc(
            "device tokens the teacher-forced CPU check scored (forward tasks: the items whose decisions were compared)"
        ),
    )
    positions_disagreeing: int | None = field(
        default=None,
        metadata=_doc(
            "positions whose device token is not the CPU top-1 under the device's prefix (forward tasks: items whose "
            "device top-1 is not the CPU's float32 top-1)"
        ),
    )
    first_disagreement: int | None = field(
        default=None, metadata=_doc("index of the first such position (null when none)")
    )
    disagreement_device_token: int | None = field(
        default=None,
        metadata=_doc("the device's token at first_disagreement (forward tasks: its top-1 index)"),
    )
    disagreement_cpu_token: int | None = field(
        default=None, metadata=_doc("the CPU top-1 at first_disagreement (forward tasks: the CPU's float32 top-1)")
    )
    disagreement_rank: int | None = field(
        default=None,
        metadata=_doc("rank of the device token in the CPU distribution at first_disagreement (0 = top-1)"),
    )
    disagreement_deficit: float | None = field(
        default=None,
        metadata=_doc("CPU logprob of its top-1 minus that of the device token at first_disagreement (nats)"),
    )
    max_logprob_deficit: float | None = field(
        default=None, metadata=_doc("the largest such deficit over all positions (nats; 0 when all agree)")
    )
    disagreements_near_tie: bool | None = field(
        default=None,
        metadata=_doc(
            "every disagreement is a near-tie: the device token in the CPU top-5, the CPU top-1 in the device's "
            "top-5, deficit <= 0.5 nats; null when none disagree"
        ),
    )
    repeat_identical: bool | None = field(
        default=None,
        metadata=_doc("the warm second generate() gave the first one's tokens (embedding tasks: the same vectors)"),
    )
    repeat_divergence: int | None = field(
        default=None, metadata=_doc("first position where the second generate()'s tokens part from the first's")
    )
    graph_breaks: int | None = field(
        default=None,
        metadata=_doc("Dynamo graph breaks while compiling (each one more graph, on neuron one more compile)"),
    )
    graph_break_reasons: tuple[str, ...] = field(default=(), metadata=_doc("distinct graph-break reasons, at most 5"))
    excess_graphs: int | None = field(
        default=None,
        metadata=_doc(
            "graphs compiled beyond what static shapes need (one decoding-step graph; embedding tasks one forward "
            "graph); > 0 is flagged in the viewer"
        ),
    )
    recompile_limit: str | None = field(
        default=None,
        metadata=_doc(
            "Dynamo's warning when a compiled function hit its recompile limit (torch._dynamo.config.recompile_limit) "
            "during the two runs: the limit, the function and the guard that failed last. Past it Dynamo runs that "
            "function uncompiled (eager), so the later steps and the decode timings are not the compiled graph's; "
            "the tokens are still checked as any run's. Flagged in the viewer"
        ),
    )
    self_check: str | None = field(
        default=None,
        metadata=_doc(
            "the host's `neuron-support doctor` self-check for this device that the session found in the results "
            "folder (doctor.json): 'passed: <summary> at <time>' or 'FAILED: ...'; null when none was run"
        ),
    )
    neuronx_cc: str = field(
        default="none", metadata=_doc("neuronx-cc version (its own __version__), none off Trainium")
    )
    torch_neuronx: str = field(default="none", metadata=_doc("torch-neuronx version, none off Trainium"))
    torch: str = field(default="", metadata=_doc("PyTorch version"))
    library: str = field(default="transformers", metadata=_doc("library checked"))
    library_version: str = field(default="", metadata=_doc("its version"))
    python: str = field(default="", metadata=_doc("Python version"))
    runscript: str | None = field(default=None, metadata=_doc("the exact run.py that ran on the device"))
    timestamp: str = field(default="", metadata=_doc("UTC time the row was made (ISO 8601)"))
    plugin_version: str = field(default="", metadata=_doc("pytest-neuron-support version"))
    settings_hash: str = field(
        default="", metadata=_doc("hash of the settings that shaped the check (prompt, tokens, dtype, device, ...)")
    )
    schema_version: int = field(default=SCHEMA_VERSION, metadata=_doc("version of this schema"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "signature", signature(self))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Row:
        """Rebuild a row from JSON or a Parquet record; unknown keys are ignored."""
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = f.name
            if data.get(name) is None and _RENAMED.get(name) in data:  # a row written before the rename
                name = _RENAMED[name]
            if name not in data or not f.init:  # a derived column is made again, not read
                continue
            value = data[name]
            if COLUMN_TYPES[f.name].startswith("list") and value is not None:
                value = tuple(value.tolist() if hasattr(value, "tolist") else value)
            elif value is not None and hasattr(value, "item"):
                value = value.item()  # numpy scalar from pandas
            if isinstance(value, float) and value != value and not COLUMN_TYPES[f.name].startswith("double"):
                value = None  # pandas NaN for a missing integer
            kwargs[f.name] = value
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> Row:
        return cls.from_mapping(json.loads(text))


#: Columns renamed since an older schema: new name -> old. The old columns counted the same thing
#: (their docs said "compiled graphs", which was wrong on neuron), so older datasets keep their values.
_RENAMED: Mapping[str, str] = {
    "persistent_cache_hits": "compile_cache_hits",
    "persistent_cache_misses": "compile_cache_misses",
}


_ARROW_TYPES: Mapping[str, str] = {
    "str": "string",
    "str | None": "string",
    "int": "int64",
    "int | None": "int64",
    "float | None": "double",
    "bool": "bool",
    "bool | None": "bool",
    "tuple[int, ...]": "list<int64>",
    "tuple[str, ...]": "list<string>",
    "tuple[float, ...]": "list<double>",
}

#: column name -> Arrow type name, in schema order.
COLUMN_TYPES: Mapping[str, str] = {f.name: _ARROW_TYPES[str(f.type)] for f in dataclasses.fields(Row)}
#: column name -> definition, in schema order.
COLUMN_DOCS: Mapping[str, str] = {f.name: f.metadata["doc"] for f in dataclasses.fields(Row)}
#: column name -> the human label the viewer's table heads it with (the name itself where none is set).
COLUMN_LABELS: Mapping[str, str] = {f.name: f.metadata.get("label", f.name) for f in dataclasses.fields(Row)}


def arrow_schema() -> Any:
    """The Parquet schema, derived from :class:`Row` (imports pyarrow lazily)."""
    import pyarrow as pa

    scalar = {"string": pa.string(), "int64": pa.int64(), "double": pa.float64(), "bool": pa.bool_()}
    fields = []
    for name, type_name in COLUMN_TYPES.items():
        arrow_type = pa.list_(scalar[type_name[5:-1]]) if type_name.startswith("list<") else scalar[type_name]
        fields.append(pa.field(name, arrow_type, metadata={"doc": COLUMN_DOCS[name]}))
    return pa.schema(fields, metadata={"schema_version": str(SCHEMA_VERSION)})
