"""Render the standalone ``run.py`` that checks one model on one device.

The script imports only the standard library, torch and its task's libraries (transformers; diffusers
for a text-to-image pipeline: :func:`libraries`); every setting is written into its ``SPEC`` literal,
so the file stored with a result is exactly what ran and ``python3 run.py`` reproduces it on any
machine with the same stack and those libraries (:func:`requirements` pins them, its docstring says
them).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import pprint
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_neuron_support import __version__
from pytest_neuron_support.data.records import installed_version
from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.verdict.fluency import JUDGE_QUESTION, JUDGE_THRESHOLD, NO_WORDS, YES_WORDS

if TYPE_CHECKING:
    from pytest_neuron_support.run.execution import ProcessOutcome

_SPEC_MARKER = "SPEC = {}  # @@SPEC@@"
#: Ends the first line of run.py's / train.py's import statement that templates/common.py's code
#: replaces, and, in common.py, the line after which that code starts.
_COMMON_MARKER = "# @@COMMON@@"
_COMMON_HOSTS = ("run.py", "train.py")
#: Ends the line of run.py's import statement that its task's fragments replace, and, in each fragment,
#: the line after which its code starts.
_TASK_MARKER = "# @@TASK@@"
#: (width, height) of the test card run.py draws for image-text-to-text runs (run.py's fixed_image).
TEST_CARD_SIZE: tuple[int, int] = (224, 224)
#: Modules of the stack itself: a row records their versions in its own columns (torch, torch_neuronx,
#: neuronx_cc), and the Neuron ones come from AWS's package index, so they are not among the libraries
#: installed on top of it.
STACK_MODULES = frozenset({"torch", "torch_neuronx", "neuronxcc"})
#: Libraries that a library run.py imports loads by name without installing them: a diffusers pipeline's
#: text encoders and tokenizers are transformers classes (its model_index.json names them), and diffusers
#: does not depend on transformers. So every row's libraries hold transformers.
IMPLIED: Mapping[str, tuple[str, ...]] = {"diffusers": ("transformers",)}


@dataclass(frozen=True)
class RunSpec:
    """Everything one run.py needs, written into it verbatim.

    Attributes:
        model: Hub id, or absolute path of a local checkpoint.
        revision: revision to load.
        task: catalog task (selects the loading and input code in the script).
        dtype: torch dtype name for the weights.
        prompt: prompt text.
        max_new_tokens: greedy tokens to generate.
        device: the device kind's table row.
        compile: compile decoding (device runs) or stay eager (CPU reference runs).
        compile_backend: torch.compile backend when compiling.
        top_k: logprobs kept per generated position (near-tie analysis needs 5).
        trust_remote_code: passed to from_pretrained; True only when catalog and user opt in.
        post_load: Python run after loading with ``model`` bound (from the
            ``pytest_neuron_support_post_load`` hook); empty by default.
        world_size: ranks to spawn (one per leased core); 1 runs in the script's own process.
        distributed_configs: ``DistributedConfig`` keyword sets to try in order (the first
            that loads is used and recorded); empty when not sharded.
        sentences: the sentences an embedding or a text forward task feeds its model (empty for generation).
        image_size: (width, height) of the test card run.py draws (image-text-to-text, image classification).
        forced_tokens: set for the teacher-forced CPU check: the device's tokens, scored under the
            device's own prefix in one forward pass instead of generating; None otherwise.
        score_own_tokens: a generating run also scores its own tokens teacher-forced (CPU
            references: their pass is the CPU check of a device run that generated the same tokens).
        auto_class: the task's Auto class of transformers run.py loads the model with.
        inputs: how run.py feeds the model (the task's ``inputs``: ``text``, ``vision``, ``embedding``).
        fragments: the task's run.py code, files of ``templates/tasks/`` spliced into run.py in this
            order (not written into ``SPEC``: they are the script's code).
        task_options: the task's own settings (a text-to-image run's steps, size, guidance and seed; the
            device run's recording a teacher-forced check replays), written into ``SPEC["task_options"]``.
        locate: set only after a numerics FAIL (``cpu.locate``): run ONE forward at the first bad position
            with every module's output recorded instead of the task's run (``tokens``: a generation's prefix
            after the prompt; ``device_traces``: the device side's recordings, one per rank, which a CPU side
            scores in float32 against ``noise_dtype``); None otherwise.
        capture_compile_failure: set only to rerun a compile ERROR (``run.repro``): Dynamo's own repro machinery
            (``torch._dynamo.config.repro_after = "dynamo"``) writes the graph the backend failed on as a
            standalone ``repro.py`` in the run's folder.
        capture_fallbacks: set only to rerun a run whose device fell back to the host (``run.fallbacks``): the ops
            it named, each distinct call of which the eager rerun records with its arguments' dtypes and shapes.
        replay_fallbacks: set only in the fallback reproducer: the recorded calls, each made again alone on the
            device with random tensors of those dtypes and shapes (no model is loaded).
    """

    model: str
    revision: str
    task: str
    dtype: str
    prompt: str
    max_new_tokens: int
    device: DeviceKind
    compile: bool
    compile_backend: str
    top_k: int = 5
    trust_remote_code: bool = False
    post_load: str = ""
    world_size: int = 1
    distributed_configs: tuple[dict[str, Any], ...] = ()
    sentences: tuple[str, ...] = ()
    image_size: tuple[int, int] = TEST_CARD_SIZE
    forced_tokens: tuple[int, ...] | None = None
    score_own_tokens: bool = False
    # The default row of the task table (tasks.task.Task): a causal LM generating text.
    auto_class: str = "AutoModelForCausalLM"
    inputs: str = "text"
    fragments: tuple[str, ...] = ("transformers.py", "text.py", "generation.py")
    task_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    locate: Mapping[str, Any] | None = None
    capture_compile_failure: bool = False
    capture_fallbacks: tuple[str, ...] = ()
    replay_fallbacks: tuple[Mapping[str, Any], ...] = ()

    def to_spec(self) -> dict[str, Any]:
        spec = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "fragments"}
        spec["locate"] = None if self.locate is None else dict(self.locate)
        spec["device"] = self.device.as_runscript_spec()
        spec["distributed_configs"] = [dict(c) for c in self.distributed_configs]
        spec["sentences"] = list(self.sentences)
        spec["image_size"] = list(self.image_size)
        spec["forced_tokens"] = None if self.forced_tokens is None else list(self.forced_tokens)
        spec["task_options"] = dict(self.task_options)
        spec["capture_fallbacks"] = list(self.capture_fallbacks)
        spec["replay_fallbacks"] = [dict(call) for call in self.replay_fallbacks]
        return spec


@dataclass(frozen=True)
class TrainSpec:
    """Everything one train.py needs, written into it verbatim (templates/train.py).

    Attributes:
        model: Hub id, or absolute path of a local checkpoint.
        revision: revision to load.
        dtype: torch dtype name for the weights; ``bfloat16`` also sets ``TrainingArguments(bf16=True)``.
        device: the device kind's table row.
        compile: ``TrainingArguments(torch_compile=...)``: device runs compile, the CPU side is eager.
        compile_backend: ``torch_compile_backend`` when compiling.
        steps: optimizer steps (``max_steps``).
        batch_size: ``per_device_train_batch_size``.
        max_length: every example is padded (``padding="max_length"``) or cut to this many tokens.
        learning_rate: constant learning rate (no warm-up, no decay, no weight decay).
        seed: ``TrainingArguments(seed=, data_seed=)`` and ``torch.manual_seed``.
        texts: the fixed text set, cycled to ``steps x batch_size`` examples in order.
        trust_remote_code: passed to from_pretrained; True only when catalog and user opt in.
        post_load: Python run after loading with ``model`` bound (the post-load hook); empty by default.
        world_size: ranks to spawn (one per leased core); 1 runs in the script's own process.
        distributed_configs: ``DistributedConfig`` keyword sets to try in order; empty when not sharded.
    """

    model: str
    revision: str
    dtype: str
    device: DeviceKind
    compile: bool
    compile_backend: str
    steps: int
    batch_size: int
    max_length: int
    learning_rate: float
    seed: int
    texts: tuple[str, ...]
    trust_remote_code: bool = False
    post_load: str = ""
    world_size: int = 1
    distributed_configs: tuple[dict[str, Any], ...] = ()

    def to_spec(self) -> dict[str, Any]:
        spec = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        spec["device"] = self.device.as_runscript_spec()
        spec["distributed_configs"] = [dict(c) for c in self.distributed_configs]
        spec["texts"] = list(self.texts)
        return spec


@dataclass(frozen=True)
class JudgeSpec:
    """What judge.py asks: is ``text`` fluent English, according to ``judge_model``?

    Attributes:
        judge_model: Hub id (or local path) of a small instruct causal LM.
        judge_revision: its revision.
        text: the generated text being judged.
        threshold: P(yes | yes or no) at or above which the text is judged fluent.
        question: the question, with ``{text}`` where the text goes.
        yes_words / no_words: answers whose first tokens count as yes / no.
    """

    judge_model: str
    judge_revision: str
    text: str
    threshold: float = JUDGE_THRESHOLD
    question: str = JUDGE_QUESTION
    yes_words: tuple[str, ...] = YES_WORDS
    no_words: tuple[str, ...] = NO_WORDS


def template(name: str = "run.py", fragments: Sequence[str] = ()) -> str:
    """A file of the package's ``templates/`` folder (run.py, judge.py, a task's fragment, the viewer's
    page); run.py and train.py come with their shared code (common.py) already spliced in, and run.py
    with its task's ``fragments`` (files of ``templates/tasks/``), so their text runs as is."""
    source = resources.files("pytest_neuron_support").joinpath(f"templates/{name}").read_text(encoding="utf-8")
    if name in _COMMON_HOSTS:
        source = _splice(source, _COMMON_MARKER, _shared("common.py", _COMMON_MARKER))
    if name == "run.py":
        code = "".join(f"\n\n\n{_shared(f'tasks/{fragment}', _TASK_MARKER)}" for fragment in fragments)
        source = _splice(source, _TASK_MARKER, code[1:])
    return source


def _shared(name: str, marker: str) -> str:
    """What a shared template contributes: everything after its marker line (above it, the imports
    that tell ruff where the names it uses come from)."""
    return template(name).split(f"{marker}\n", 1)[1].strip("\n")


def _splice(source: str, marker: str, shared: str) -> str:
    # Spliced, not imported: the rendered script must run with nothing of this package installed.
    # The host's marker ends the first line of a whole import statement (it tells ruff where the
    # names come from), which may go on over more lines, up to the one closing its parenthesis.
    lines = source.split("\n")
    marked = [i for i, line in enumerate(lines) if line.endswith(marker)]
    if len(marked) != 1:
        raise ValueError(f"a template sharing code needs exactly one {marker} line, found {len(marked)}")
    first = last = marked[0]
    if lines[first].split("#", 1)[0].rstrip().endswith("("):
        last = lines.index(")", first)
    lines[first : last + 1] = [shared]
    return "\n".join(lines)


def with_spec(source: str, spec: dict[str, Any]) -> str:
    """A template's source (:func:`template`) with ``spec`` written in as its ``SPEC``: what the tiny zoo
    executes to feed its models exactly what run.py feeds them."""
    return _fill(source, spec)


def _fill(source: str, spec: dict[str, Any]) -> str:
    # Inserted last so no prompt or judged text can be mistaken for a placeholder.
    literal = pprint.pformat(spec, sort_dicts=False, width=100)
    return source.replace(_SPEC_MARKER, f"SPEC = {literal}")


def imported_modules(source: str) -> tuple[str, ...]:
    """The top-level modules a script needs, beyond the standard library, sorted: every import, lazy ones
    inside functions included, except an optional one (in a ``try`` that handles its ``ImportError``: the
    script runs without it)."""
    tree = ast.parse(source)
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_handles_import_error(h) for h in node.handlers):
            optional |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return tuple(sorted(found - set(sys.stdlib_module_names)))


def _handles_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught] if caught is not None else []
    return caught is None or any(
        isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError", "Exception") for n in names
    )


def _distribution_name(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503: lower case, runs of ``-_.`` as one ``-``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _distributions_of_modules() -> Mapping[str, tuple[str, ...]]:
    # Read once per process: it walks every installed distribution's file list.
    return {module: tuple(dists) for module, dists in metadata.packages_distributions().items()}


def libraries(source: str) -> tuple[str, ...]:
    """The distributions a script (rendered or not) needs on top of the stack, sorted: those that provide
    the modules it imports (not the standard library's, not the stack's: :data:`STACK_MODULES`), and
    what they load by name (:data:`IMPLIED`). A module no installed distribution provides is named as
    the module (``PIL`` would be ``pil``: install Pillow for it)."""
    names: set[str] = set()
    for module in imported_modules(source):
        if module in STACK_MODULES:
            continue
        names.update(_distribution_name(d) for d in _distributions_of_modules().get(module, (module,)))
    for name in list(names):
        names.update(IMPLIED.get(name, ()))
    return tuple(sorted(names))


def requirements(names: Sequence[str]) -> tuple[str, ...]:
    """pip requirements pinning each distribution of ``names`` to the version installed for this
    interpreter (``diffusers==0.42.1``); a name that is not installed stays bare."""
    return tuple(name if (version := installed_version(name)) == "none" else f"{name}=={version}" for name in names)


def render(spec: RunSpec) -> str:
    """The run.py source for ``spec``; its ``SPEC["libraries"]`` names the distributions it imports on
    top of the stack (run.py records their versions), and its docstring pins them."""
    code = template("run.py", spec.fragments)
    needed = libraries(code)
    source = (
        code.replace("@@MODEL@@", spec.model)
        .replace("@@DEVICE@@", spec.device.name)
        .replace("@@VERSION@@", __version__)
        .replace("@@LIBRARIES@@", " ".join(requirements(needed)))
    )
    return _fill(source, {**spec.to_spec(), "libraries": list(needed)})


def render_train(spec: TrainSpec) -> str:
    """The train.py source for ``spec``."""
    source = (
        template("train.py")
        .replace("@@MODEL@@", spec.model)
        .replace("@@DEVICE@@", spec.device.name)
        .replace("@@VERSION@@", __version__)
    )
    return _fill(source, spec.to_spec())


def render_judge(spec: JudgeSpec) -> str:
    """The judge.py source for ``spec``."""
    return _fill(template("judge.py").replace("@@VERSION@@", __version__), dataclasses.asdict(spec))


def render_and_run(
    spec: RunSpec | TrainSpec,
    directory: Path,
    *,
    env: Mapping[str, str],
    timeout: float,
    python: str | None = None,
    memory_limit: int | None = None,
    cancel: threading.Event | None = None,
    warm: bool = False,
) -> tuple[str, ProcessOutcome]:
    """Write ``spec``'s run.py (a TrainSpec's train.py) into ``directory`` and run it isolated there
    (result.json, log.txt beside it); returns the source that ran and how its process ended (``warm``:
    ``execution.run_script``'s)."""
    from pytest_neuron_support.run.execution import run_script

    directory.mkdir(parents=True, exist_ok=True)
    training = isinstance(spec, TrainSpec)
    source = render_train(spec) if isinstance(spec, TrainSpec) else render(spec)
    script = directory / ("train.py" if training else "run.py")
    script.write_text(source, encoding="utf-8")
    outcome = run_script(
        script,
        directory / "result.json",
        env=env,
        timeout=timeout,
        log_path=directory / "log.txt",
        python=python or sys.executable,
        memory_limit=memory_limit,
        cancel=cancel,
        warm=warm,
        compiles=spec.compile,
    )
    return source, outcome
