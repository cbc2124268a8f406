"""Failure signatures: one string per ERROR, FAIL or TIMEOUT row that names its root cause, so the
models that fail the same way group together ("which one bug blocks the most models?").

A signature is ``<stage>: <ExceptionType>[ <operation or module>]: <normalised message>``, e.g. (wrapped here)::

    compile: BackendCompilerFailed aten::_fancy_op: backend='neuron' raised: NotImplementedError: Could not
        run '<op>' with arguments from the 'Neuron' backend.
    compile: BackendCompilerFailed NCC_IBIR227: backend='neuron' raised: CompilationError: <...>
    load: RankDied: rank(s) <ranks> died without a result: rank <n> terminated with signal SIGKILL
    load: run.py killed by SIGSEGV
    parity: teacher-forced disagreement at token 1-3

How it is made, in order:

1. PASS, SKIPPED and EXCLUDED rows have none (None): nothing is blocked.
2. Verdict failures are bucketed, not read: a FAIL at ``parity`` by the first diverging module
   where the module search named one (``parity: model.layers.1.mlp.down_proj (Linear) diverges first;
   ...``: the same module of the same architecture groups models), then by where the tokens first went
   wrong (:data:`BUCKETS`, from ``first_divergence`` / ``first_disagreement``), whether the
   free-running comparison, the teacher-forced check or both failed, and whether it was a near-tie;
   a FAIL at ``generate`` (the warm run differs) by ``repeat_divergence``; a FAIL at ``train`` by the
   step it first went wrong at (``train: loss diverged at step 2``); a judge's "not fluent"
   is one signature whatever the text was.
3. Out-of-memory errors, phrased differently by torch, CUDA, the Neuron runtime and the host
   allocator (:data:`OUT_OF_MEMORY`), become one canonical message per kind of memory.
4. Everything else is the error's head (:func:`head`: its first line, continued while that line
   ends with ``:``, as ``BackendCompilerFailed: backend=... raised:`` does, without Dynamo's
   boilerplate and without a log tail; a pytest traceback's first ``E`` line), split into the
   exception type (a leading ``Name:``) and message, the compiler's error code it names (neuronx-cc's
   ``NCC_*``), else the first operator it names (``aten::x``, ``custom::op``) or missing module
   hoisted out, then normalised by :data:`RULES` (ids, paths,
   addresses, shapes, sizes, times, numbers) and cut to :data:`MAX_MESSAGE` characters: a
   message's head names its cause, its tail its circumstances.

The row's own model id (and its directory slug ``org--name``) and its test node id become
``<model>`` and ``<test>`` first: the same bug in seven models must read the same. Signal names,
exit codes and errno values are kept: a different one is a different way to die.

Pure functions of a row's fields; imports nothing but the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from pytest_neuron_support.base.storage import slug

#: How a numerics FAIL's error goes on when the module search named a module (``verdict.modules``).
MODULE_SEARCH = "; first diverging module "

#: Results a signature is made for: the ones that block a model.
BLOCKING = ("ERROR", "FAIL", "TIMEOUT")

#: Characters of the normalised message kept in a signature.
MAX_MESSAGE = 200

#: Token-position buckets of a parity or repeat failure, as (first, last, name): token 0 is chosen
#: from the prefill's logits (a broken load or prefill), 1-3 are the first compiled decoding steps
#: (the decoding graph, the static cache), 4-15 and 16-31 drift that builds up over the sequence.
BUCKETS: tuple[tuple[int, int, str], ...] = (
    (0, 0, "token 0"),
    (1, 3, "token 1-3"),
    (4, 15, "token 4-15"),
    (16, 31, "token 16-31"),
)


class Outcome(Protocol):
    """The fields of a row a signature is made from (:class:`~.records.Row` has them all)."""

    @property
    def model_id(self) -> str: ...
    @property
    def test(self) -> str: ...
    @property
    def result(self) -> str: ...
    @property
    def failure_stage(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def first_divergence(self) -> int | None: ...
    @property
    def near_tie(self) -> bool | None: ...
    @property
    def first_disagreement(self) -> int | None: ...
    @property
    def disagreements_near_tie(self) -> bool | None: ...
    @property
    def repeat_divergence(self) -> int | None: ...
    @property
    def train_first_bad_step(self) -> int | None: ...
    @property
    def diverging_module(self) -> str | None: ...
    @property
    def diverging_module_kind(self) -> str | None: ...


@dataclass(frozen=True)
class Rule:
    """One normalisation step of a message: every match of ``pattern`` becomes ``replacement``.

    Attributes:
        name: what it normalises (docs/results.md and the dataset card list the rules by it).
        pattern: the regular expression.
        replacement: what a match becomes (``re.sub`` syntax, or a function of the match).
        why: what differs there between models that hit the same cause.
    """

    name: str
    pattern: re.Pattern[str]
    replacement: str | Callable[[re.Match[str]], str]
    why: str


def _keep_basename(match: re.Match[str]) -> str:
    return "<path>/" + match.group(0).rstrip("/").rsplit("/", 1)[-1]


# Characters that end a path in a message: whitespace, quotes, brackets and separators. A path
# may hold <model> (the row's own id became that first), but does not start right after it.
_PATH_CHARS = r"[^\s'\"`,;:()\[\]{}]"

#: The normalisation rules, applied in this order (after the model id, its slug and the test id
#: became ``<model>`` and ``<test>``).
RULES: tuple[Rule, ...] = (
    Rule("ansi", re.compile(r"\x1b\[[0-9;]*[A-Za-z]"), "", "compiler and runtime logs colour their output"),
    Rule(
        "url",
        re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"()\[\]]*[^\s'\"()\[\].,;:]"),
        "<url>",
        "Hub and download URLs name the model, its revision and the endpoint",
    ),
    Rule(
        "path",
        re.compile(rf"(?<![\w.:/<>-])~?/{_PATH_CHARS}*[^\s'\"`,;:()\[\]{{}}.]"),
        _keep_basename,
        "directories differ by machine, cache, session and model; the file name (config.json, a NEFF) is kept",
    ),
    Rule(
        "timestamp",
        re.compile(r"\b\d{4}-(?:\d{2}|[A-Z][a-z]{2})-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
        "<time>",
        "log lines carry when they were written",
    ),
    Rule(
        "uuid",
        re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
        "<id>",
        "request, session and run ids",
    ),
    Rule("address", re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>", "object and pointer addresses differ every run"),
    Rule(
        "hex id",
        re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}(?![0-9A-Za-z])"),
        "<hex>",
        "commit hashes, cache keys and graph hashes name the model's own files and graphs",
    ),
    Rule("worker", re.compile(r"\bgw\d+\b"), "gw<n>", "which xdist worker ran the model"),
    Rule(
        "rank list",
        re.compile(r"\brank\(s\)\s*\[[\d,\s]*\]"),
        "rank(s) <ranks>",
        "which ranks of a sharded run died first depends on timing",
    ),
    Rule(
        "shape",
        re.compile(
            r"(?:torch\.Size\()?\[\s*-?(?:\d+|[su]\d+)(?:\s*,\s*-?(?:\d+|[su]\d+))*\s*,?\s*\]\)?"
            r"|\(\s*-?\d+(?:\s*,\s*-?\d+)+\s*,?\s*\)"
            r"|\b\d+(?:x\d+)+\b"
        ),
        "<shape>",
        "tensor shapes (sizes, symbolic s0 dims, 2x37x64) follow each model's config and prompt",
    ),
    Rule(
        "size",
        re.compile(r"\b\d+(?:\.\d+)?\s*(?:[KMGTP]i?B|bytes?)\b"),
        "<size>",
        "allocation sizes follow the model's size",
    ),
    Rule(
        "duration",
        re.compile(r"\b\d+m\d+s\b|\b\d+(?:\.\d+)?\s*(?:ns|us|µs|ms|s|secs?|seconds?|mins?|minutes?|h|hours?)\b"),
        "<time>",
        "timings (the timeout, how long a step took) vary by machine and model",
    ),
    Rule(
        "number",
        re.compile(
            r"(?<!exit code )(?<!exit status )(?<!status )(?<!signal )(?<!Errno )"
            r"(?<![A-Za-z0-9])\d+(?:\.\d+)*(?:[eE][-+]?\d+)?(?![A-Za-z0-9])"
        ),
        "<n>",
        "ids, pids, ranks, layer indices, counts, line numbers and values, in file names too (graph_123.neff); not "
        "inside a name (conv2d, fp16, Qwen3); exit codes, signals and errno are kept",
    ),
    Rule("whitespace", re.compile(r"\s+"), " ", "line breaks and indentation are layout, not cause"),
)

#: Out-of-memory messages, each pattern with the kind of memory it names, in order (device
#: patterns first: a CUDA OOM also says "memory"). Every match becomes
#: ``<stage>: OutOfMemory <kind>: <kind> memory exhausted``, whatever the wording.
OUT_OF_MEMORY: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError: CUDA", re.I), "device"),
    (
        re.compile(
            r"NRT_RESOURCE|RESOURCE_EXHAUSTED|nrt_tensor_allocate|Failed to alloc\w* (?:HBM|DEVICE memory)"
            r"|out of device memory|device memory (?:exhausted|allocation failed)|NeuronCore.*out of memory",
            re.I,
        ),
        "device",
    ),
    (
        re.compile(
            r"^MemoryError\b|DefaultCPUAllocator|Cannot allocate memory|std::bad_alloc|out of host memory"
            r"|not enough memory: you tried to allocate",
            re.I | re.M,
        ),
        "host",
    ),
    (re.compile(r"\bout of memory\b|OutOfMemoryError", re.I), "device"),
)

# Lines that say nothing about the cause: Dynamo's and the dispatcher's advice.
_BOILERPLATE = re.compile(
    r"^\s*(?:Set TORCHDYNAMO_VERBOSE|For even more developer context|You can suppress this exception"
    r"|from user code:|To execute this test|Traceback \(most recent call last\))"
)
# A leading exception type: ``RuntimeError:`` or ``torch._dynamo.exc.BackendCompilerFailed:``.
_EXCEPTION_TYPE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Z]\w*)(?::\s+|:$)")
# An operator a message names: ``aten::_foo.default``, ``custom::op``; not C++ namespaces, nor a
# pytest node id (``models.yaml::test_model``: preceded by a dot).
_OPERATOR = re.compile(r"(?<![\w.])([a-z_][a-z0-9_]*)::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)")
_NOT_OPERATORS = frozenset({"std", "c10", "at", "caffe2", "pybind11", "torch", "boost"})
_KILLED = re.compile(r"killed by SIG[A-Z]+")
_MODULE = re.compile(r"No module named '([\w.]+)'")
#: neuronx-cc's error codes (``NCC_IBIR227``, ``NCC_EVRF007``): the compiler's own name for what it rejected.
_COMPILER_CODE = re.compile(r"\bNCC_[A-Z]+[0-9]+\b")


def compiler_error_code(error: str | None) -> str | None:
    """The first neuronx-cc error code (``NCC_*``) an error names, or None."""
    found = _COMPILER_CODE.search(error or "")
    return found.group(0) if found else None


def head(error: str) -> str:
    """The part of an error that names its cause: the first line that is not boilerplate (a pytest
    traceback's first ``E`` line), continued by the next while it ends with ``:``."""
    lines = [line.strip() for line in error.splitlines() if line.strip() and not _BOILERPLATE.match(line)]
    raised = [line[1:].strip() for line in lines if line.startswith("E ")]
    lines = raised or lines
    if not lines:
        return ""
    text, rest = lines[0], lines[1:]
    while text.endswith(":") and rest:
        text = f"{text} {rest.pop(0)}"
    return text


def normalise(message: str, model_id: str = "", test: str = "", rules: Iterable[Rule] = RULES) -> str:
    """``message`` with the row's own names and then every rule's matches replaced."""
    for name, token in sorted(
        ((test, "<test>"), (model_id, "<model>"), (slug(model_id) if model_id else "", "<model>")),
        key=lambda pair: -len(pair[0]),
    ):
        if name:
            message = message.replace(name, token)
    for rule in rules:
        message = rule.pattern.sub(rule.replacement, message)
    return message.strip()


def bucket(position: int | None) -> str:
    """The :data:`BUCKETS` name of a token position."""
    if position is None:
        return "an unknown token"
    for first, last, name in BUCKETS:
        if first <= position <= last:
            return name
    return f"token {BUCKETS[-1][1] + 1}+"


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE].rstrip() + "..."


def _parity(row: Outcome, error: str) -> str:
    if "embeddings" in error:
        why = "cannot be compared" if "cannot be compared" in error else "below the cosine threshold"
        return f"embeddings {why}"
    if "scored no token" in error:
        return "the device generated no token"
    parts = []
    if "differ from the CPU reference" in error:
        parts.append(f"free-running divergence at {bucket(row.first_divergence)}{', near-tie' if row.near_tie else ''}")
    if "teacher-forced CPU check" in error:
        near = ", near-ties" if row.disagreements_near_tie else ""
        parts.append(f"teacher-forced disagreement at {bucket(row.first_disagreement)}{near}")
    return "; ".join(parts) or _cut(normalise(head(error), row.model_id, row.test))


def _out_of_memory(text: str) -> str | None:
    for pattern, kind in OUT_OF_MEMORY:
        if pattern.search(text):
            return kind
    return None


def _subject(message: str) -> str | None:
    for match in _OPERATOR.finditer(message):
        if match.group(1) not in _NOT_OPERATORS:
            return match.group(0)
    module = _MODULE.search(message)
    return module.group(1) if module else None


def _training(row: Outcome, error: str) -> str:
    """A training FAIL by what went wrong and at which step (a check runs a handful of steps, so the
    step itself is the bucket): ``loss diverged at step 2``, ``loss not finite at step 1``."""
    if "compiled again" in error:
        return "graphs compiled again after the first step"
    step = row.train_first_bad_step
    what = "loss not finite" if "not finite" in error else "loss diverged"
    return f"{what} at step {step}" if step is not None else f"{what}: fewer steps than the CPU's"


def signature(row: Outcome) -> str | None:
    """The row's failure signature (see the module doc); None for PASS, SKIPPED and EXCLUDED."""
    if row.result not in BLOCKING:
        return None
    stage = row.failure_stage or "unknown"
    error = row.error or ""
    if not error.strip():
        return f"{stage}: {row.result} with no error recorded"
    if row.result == "FAIL" and stage == "parity":
        # The module search's words are the row's evidence, not its cause's: the signature names the module.
        cause = _parity(row, error.split(MODULE_SEARCH, 1)[0])
        if row.diverging_module is None:
            return f"parity: {cause}"
        of = f" ({row.diverging_module_kind})" if row.diverging_module_kind else ""
        return f"parity: {row.diverging_module}{of} diverges first; {cause}"
    if row.result == "FAIL" and stage == "generate" and "warm second generate()" in error:
        return f"generate: the warm second generate() differs from the first at {bucket(row.repeat_divergence)}"
    if row.result == "FAIL" and stage == "judge" and "not fluent" in error:
        return "judge: the text was judged not fluent"
    if row.result == "FAIL" and stage == "train":
        return f"train: {_training(row, error)}"
    text = head(error)
    # "killed by SIGKILL (host out of memory?)" is the harness's guess, not an allocator's report.
    memory = None if _KILLED.search(text) else _out_of_memory(text)
    if memory is not None:
        return f"{stage}: OutOfMemory {memory}: {memory} memory exhausted"
    typed = _EXCEPTION_TYPE.match(text)
    kind = typed.group(1) if typed else None
    message = text[typed.end() :] if typed else text
    message = normalise(message, row.model_id, row.test)
    # The compiler's own code (read before the numbers are normalised away) names what it rejected better than
    # any operator the message also names.
    subject = compiler_error_code(error) or _subject(message)
    if subject is not None and "::" in subject:
        message = message.replace(subject, "<op>")
    label = " ".join(part for part in (kind, subject) if part)
    return f"{stage}: {label}: {_cut(message)}" if label else f"{stage}: {_cut(message)}"


@dataclass(frozen=True)
class Blocker:
    """One failure signature and the models it blocks.

    Attributes:
        signature: the signature (see :func:`signature`).
        models: the model ids whose rows carry it, sorted.
        example_model: the model whose error is the example (the first of ``models``).
        example: that row's error as recorded.
        stage: the failure stage its rows share.
    """

    signature: str
    models: tuple[str, ...]
    example_model: str
    example: str
    stage: str

    def to_dict(self) -> dict[str, object]:
        return {
            "signature": self.signature,
            "models": list(self.models),
            "example_model": self.example_model,
            "example": self.example,
            "example_head": head(self.example),
            "stage": self.stage,
        }


class Signed(Outcome, Protocol):
    """A row with its signature (:class:`~.records.Row`)."""

    @property
    def signature(self) -> str | None: ...


def blockers(rows: Iterable[Signed]) -> list[Blocker]:
    """The signatures of ``rows``, by the number of models they block (most first), then by
    signature; a model with several rows of one signature (two devices, a user's test) counts once."""
    grouped: dict[str, dict[str, Signed]] = {}
    for row in rows:
        if row.signature is not None:
            grouped.setdefault(row.signature, {}).setdefault(row.model_id, row)
    found = []
    for sig, by_model in grouped.items():
        models = tuple(sorted(by_model))
        first = by_model[models[0]]
        found.append(Blocker(sig, models, models[0], first.error or "", first.failure_stage or "unknown"))
    return sorted(found, key=lambda b: (-len(b.models), b.signature))
