"""What the public fixtures hand a test: its lease (:class:`CoreLease`), the device run
(:class:`DeviceRun`), the CPU reference (:class:`CpuReference`), a judge's verdict
(:class:`JudgeVerdict`) and a whole check (:class:`ModelCheck`); frozen records a test reads, made by
:mod:`.fixtures`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_neuron_support.checks.rows import expectation_of
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.run.cores import SLICE_ENV, CorePool, Lease
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.session.explain import Verdict
from pytest_neuron_support.verdict import expected


def pinning_env(device: DeviceKind, first: int, count: int) -> dict[str, str]:
    """The environment that keeps a child process on cores ``first .. first+count-1``: the device's own
    variable (``NEURON_RT_VISIBLE_CORES=8-9``; none on cpu), and :data:`~.cores.SLICE_ENV` on every
    device, so a pytest session started in the child leases only inside the lease."""
    span = str(first) if count == 1 else f"{first}-{first + count - 1}"
    return {SLICE_ENV: span, **device.pin_cores(first, count)}


class CoreLease:
    """An exclusive lease of host cores (host numbering), held from the host-wide core ledger.

    Attributes:
        device: the device kind the cores belong to.
        cores: the leased cores, contiguous.
        env: what a child process needs in its environment to be pinned to them
            (``subprocess.run(..., env={**os.environ, **lease.env})``).
        acquired: epoch seconds the lease was granted.
        released_at: epoch seconds it was released, None while held.
    """

    def __init__(self, pool: CorePool, lease: Lease, device: DeviceKind) -> None:
        self._pool = pool
        self._lease = lease
        self.device = device.name
        self.cores: tuple[int, ...] = tuple(lease.cores)
        self.env: Mapping[str, str] = MappingProxyType(pinning_env(device, lease.first, lease.count))
        self.acquired = lease.acquired
        self.released_at: float | None = None

    @property
    def first(self) -> int:
        return self._lease.first

    @property
    def count(self) -> int:
        return self._lease.count

    @property
    def released(self) -> bool:
        return self.released_at is not None

    def release(self) -> None:
        """Hand the cores back now (idempotent): the test is done with them before its teardown."""
        if self.released_at is None:
            self._pool.release(self._lease)
            self.released_at = time.time()

    def __enter__(self) -> CoreLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<CoreLease {self.device} cores {self.cores[0]}-{self.cores[-1]} ({state})>"


@dataclass(frozen=True)
class Timings:
    """Seconds of one device run (None where run.py did not get that far).

    Attributes:
        run_s: the whole run.py process, compile included.
        load_s: ``from_pretrained``.
        first_generate_s: the first ``generate()`` (it compiles).
        generate_s: the second, warm ``generate()``.
        compile_s: first minus second: the compile cost.
    """

    run_s: float
    load_s: float | None
    first_generate_s: float | None
    generate_s: float | None
    compile_s: float | None


@dataclass(frozen=True)
class DeviceRun:
    """One run.py of a model spec on the device, under the test's lease.

    Attributes:
        spec: what run.py was rendered from.
        runscript: the exact run.py that ran (``python3 run.py`` reproduces it).
        directory: where run.py, result.json and log.txt are.
        result: run.py's JSON result (None when it wrote none: killed, crashed).
        status: ``ok``, else ``ERROR`` or ``TIMEOUT``.
        stage: the stage that failed (``load``, ``compile``, ``generate``), None when ok.
        error: the exception or signal, None when ok.
        timings: how long it took, and where.
    """

    spec: RunSpec
    runscript: str
    directory: Path
    result: Mapping[str, Any] | None
    status: str
    stage: str | None
    error: str | None
    timings: Timings

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def tokens(self) -> list[int]:
        """The greedy tokens of the first ``generate()``."""
        return [int(t) for t in (self.result or {}).get("tokens") or ()]

    @property
    def tokens_again(self) -> list[int]:
        """The tokens of the warm second ``generate()`` (equal to :attr:`tokens` on a healthy device)."""
        return [int(t) for t in (self.result or {}).get("tokens_again") or ()]

    @property
    def text(self) -> str:
        return str((self.result or {}).get("text") or "")

    @property
    def embeddings(self) -> list[list[float]]:
        """Embedding tasks: one vector per sentence."""
        return [list(v) for v in (self.result or {}).get("embeddings") or ()]

    @property
    def commit(self) -> str | None:
        """The commit the revision resolved to (a cached CPU reference must be of the same one)."""
        value = (self.result or {}).get("commit")
        return None if value is None else str(value)


@dataclass(frozen=True)
class CpuReference:
    """The same spec on CPU, eager, in the reference dtype: from the reference cache or a run of its own.

    Attributes:
        spec: what its run.py was rendered from.
        directory: where that run.py, result.json and log.txt are (when it ran).
        result: its JSON result.
        cached: it came from the reference cache (same key, same commit as the device run).
        wall_s: seconds it took here (0 when cached).
    """

    spec: RunSpec
    directory: Path
    result: Mapping[str, Any]
    cached: bool
    wall_s: float

    @property
    def tokens(self) -> list[int]:
        return [int(t) for t in self.result.get("tokens") or ()]

    @property
    def text(self) -> str:
        return str(self.result.get("text") or "")

    @property
    def embeddings(self) -> list[list[float]]:
        return [list(v) for v in self.result.get("embeddings") or ()]


@dataclass(frozen=True)
class JudgeVerdict:
    """What the fluency judge said about one text.

    Attributes:
        text: the text judged.
        fluent: the cheap checks passed and the judge's P(yes) reached its threshold.
        verdict: ``fluent``, ``not fluent`` or ``precheck: <why>``.
        score: the judge's P(yes | yes or no), None when a cheap check decided.
        judge_model / judge_revision: the judge (its resolved revision).
    """

    text: str
    fluent: bool
    verdict: str
    score: float | None
    judge_model: str
    judge_revision: str


class ExpectedFailure(AssertionError):
    """A catalog item failed as its entry's ``expect:`` says: the only failure its strict ``xfail``
    marker (``raises=ExpectedFailure``) counts as expected."""


@dataclass(frozen=True)
class ModelCheck:
    """The whole check a catalog item makes of one model (what ``neuron_check`` returns).

    Attributes:
        row: the row the dataset records: result, stage, error, plan, lease, timings, memory, and
            the evidence that decided it (``verdict_basis``, parity, teacher-forced CPU check, judge).
        directory: the folder of its runs (``device/``, ``reference/``, ``cpu-check/``, ``judge/``,
            each with run.py, result.json and log.txt).
    """

    row: Row
    directory: Path

    @property
    def result(self) -> Verdict:
        """``PASS``, ``FAIL`` or ``ERROR``: a ``str``; ``assert check.result == "PASS"`` explains itself."""
        return Verdict(self.row, self.directory)

    @property
    def passed(self) -> bool:
        return self.row.result == "PASS"

    def assert_as_expected(self) -> None:
        """The catalog suite's assertion: PASS, or the outcome its entry's ``expect:`` names. A met
        expectation of a failure raises :class:`ExpectedFailure` (the item's strict ``xfail`` marker turns
        it into an XFAIL with the reason), so a PASS in its place is a failed XPASS(strict); an expected
        recompile that no longer happens fails here; any other outcome fails as ``result == "PASS"`` does."""
        expect = expectation_of(self.row)
        if expect is None or self.row.expectation is None:
            assert self.result == "PASS"
            return
        said = expected.message(
            expect, self.row.expectation, self.row.result, self.row.failure_stage, self.row.signature
        )
        if self.row.expectation == expected.MET:
            if expect.result != "PASS":
                raise ExpectedFailure(said)
            return
        if self.row.expectation == expected.IMPROVED:
            if expect.result != "PASS":
                return  # the strict xfail marker fails it: [XPASS(strict)] with the expectation's reason
            raise AssertionError(said)  # it no longer recompiles
        assert self.result == "PASS", said  # it failed otherwise than expected

    @property
    def tokens(self) -> list[int]:
        """The device's greedy tokens."""
        return list(self.row.tokens)

    @property
    def text(self) -> str:
        return self.row.text or ""
