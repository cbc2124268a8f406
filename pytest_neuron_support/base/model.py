"""The model a check is about: :class:`ModelSpec`, one catalog entry, ``--model`` or marker, as every
room below the catalog reads it (the catalog parses and validates it; the planner, the runs, the rows
and the fixtures take it as it is).
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
EXCLUDE_REASONS: tuple[str, ...] = ("low-priority", "incompatible", "remote-code", "too-large")
#: The core counts a plan (and a catalog's ``cores:``) can have.
CORE_COUNTS: tuple[int, ...] = (1, 2, 4, 8, 16)
#: The checks an entry gets when it names none.
DEFAULT_CHECKS: tuple[str, ...] = ("inference",)
DEFAULT_PROMPT = "The history of the printing press begins"
DEFAULT_DTYPE = "bfloat16"
DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class Exclusion:
    """Why a catalog entry is collected but not run.

    Attributes:
        reason: one of ``low-priority``, ``incompatible``, ``remote-code``, ``too-large``.
        note: free text shown in the skip message and the row.
    """

    reason: str
    note: str = ""


#: The results an expectation may name: a known failure, or a PASS with a known compile defect.
EXPECTED_RESULTS: tuple[str, ...] = ("FAIL", "ERROR", "TIMEOUT", "PASS")


@dataclass(frozen=True)
class Expectation:
    """A catalog entry's known outcome (``expect:``), with why: what the sweep should find until the
    cause is fixed, as PyTorch's expected-accuracy files and tt-xla's per-model status are.

    Attributes:
        result: ``FAIL``, ``ERROR`` or ``TIMEOUT`` (a known failure), or ``PASS`` with ``recompiles``
            (a known compile defect that does not change the tokens).
        reason: why, with the upstream issue's URL where there is one; shown in the XFAIL and the viewer.
        check: the check kind it is about (``inference`` unless the entry says otherwise).
        stage: the failure stage it must fail at (None: any stage).
        signature: what the row's failure signature must start with (None: any signature).
        recompiles: the run hits Dynamo's recompile limit (``recompile_limit`` set): a decoding step that
            recompiles at every token.
    """

    result: str
    reason: str
    check: str = "inference"
    stage: str | None = None
    signature: str | None = None
    recompiles: bool = False


@dataclass(frozen=True)
class ModelSpec:
    """One model to check: a catalog entry, a ``--model`` argument, or a local checkpoint.

    Attributes:
        id: Hub id ``org/name``; for a local checkpoint, the absolute directory path.
        task: ``text-generation``, ``image-text-to-text``, ``feature-extraction`` or
            ``sentence-similarity`` (see ``tasks.table.TASKS``).
        revision: branch, tag or commit; ``main`` unless pinned.
        dtype: weights dtype on the device (default bfloat16).
        prompt: text prompt; None means the session's ``--prompt``.
        cores: core-count override from the catalog, None to let the planner choose.
        trust_remote_code: the entry opts in to Hub repository code (the user must too).
        extra_packages: pip requirements to install on top of the stack for this model.
        exclude: set when the entry is curated out; the item is reported skipped.
        tags: free-form labels (architecture family, dense/moe), matched by ``-k``.
        source: ``catalog``, ``cli`` (``--model ID``) or ``local`` (``--model ./dir``).
        line: 1-based line of the entry in that file (0 for the command line).
        min_cosine: embedding tasks only: the cosine similarity every sentence's device
            embedding must reach against the CPU's; None means ``verdict.embeddings.DEFAULT_MIN_COSINE``.
        timeout: seconds each of this model's run.py processes (device run, CPU reference, CPU
            check) may take before its process group is killed; None means ``--model-timeout``.
            A large model's compile may need more than the sweep's default; a model known to hang
            can be given less, so the sweep does not wait for it.
        checks: the checks this entry asks for (``checks.registry.KINDS``), each one item and one row;
            ``--check`` replaces them for a run. ``train`` applies to the tasks its check kind applies to only.
        expect: the entry's known outcome and why (``expect:``); None when it is expected to pass.
    """

    id: str
    task: str = "text-generation"
    revision: str = DEFAULT_REVISION
    dtype: str = DEFAULT_DTYPE
    prompt: str | None = None
    cores: int | None = None
    trust_remote_code: bool = False
    extra_packages: tuple[str, ...] = ()
    exclude: Exclusion | None = None
    tags: tuple[str, ...] = ()
    source: str = "catalog"
    line: int = 0
    min_cosine: float | None = None
    timeout: float | None = None
    checks: tuple[str, ...] = DEFAULT_CHECKS
    expect: Expectation | None = None
