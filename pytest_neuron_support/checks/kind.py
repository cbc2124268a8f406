"""What a check kind is: the protocol every kind of check implements (inference, training, ...), as
pytest-xdist's schedulers sit behind its public ``Scheduling`` protocol.

:func:`.run.run_check` does what every kind shares once (the lease's window, the device run, releasing
the cores the moment it ends, mapping a run that did not finish to its row); a kind says only what
differs: how its spec is made and which template it renders (:meth:`CheckKind.device_spec`), what runs on
the CPU side (:meth:`CheckKind.start_cpu_side`), how its result becomes a row
(:meth:`CheckKind.with_result`) and how its verdict is decided (:meth:`CheckKind.decide`). The kinds are
listed once, in :mod:`.registry`, which the catalog, the suite and the fixtures read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec, TrainSpec
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.tasks.task import Task


class CpuSide(Protocol):
    """What a kind started on the CPU beside the device run: stopped when the device run fails."""

    def cancel(self) -> None: ...


class NoCpuSide:
    """Nothing runs on the CPU beside the device run."""

    def cancel(self) -> None:
        pass


class CheckKind(Protocol):
    """One kind of check of a model: a row's ``check``, a catalog test, a public fixture.

    Attributes:
        name: the row's ``check`` (``inference``, ``train``); what ``checks:`` and ``--check`` name.
        test: the catalog suite's test function that makes it (``test_model``, ``test_training``).
        fixture: the public fixture that runs it (``neuron_check``, ``neuron_train_check``).
        folder: its run folder under the model's (``""``: the model's own).
        script: the script its device run executes (what a failure names: ``run.py``, ``train.py``).
        training: the planner sizes it by the training memory model (weights, gradients, optimizer).
        summary: what it checks, for ``--help`` and the card.
    """

    name: str
    test: str
    fixture: str
    folder: str
    script: str
    training: bool
    summary: str

    def applies_to(self, task: Task) -> bool:
        """Whether a model of ``task`` can get this check."""
        ...

    def hash_parts(self) -> list[str]:
        """What its settings hash holds beyond what the inference check's does."""
        ...

    def planned(self, row: Row, model: ModelSpec, settings: Settings) -> Row:
        """The inference row of a model before it runs, made this kind's."""
        ...

    def device_spec(self, job: Job, post_load: str) -> RunSpec | TrainSpec:
        """The spec of its device run (which also says the template it renders)."""
        ...

    def start_cpu_side(self, job: Job, row: Row) -> CpuSide:
        """What runs on the CPU beside the device run (it needs no cores)."""
        ...

    def with_result(self, job: Job, row: Row, result: Mapping[str, Any]) -> Row:
        """The device run's result into the row's columns."""
        ...

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], side: CpuSide) -> Row:
        """The verdict of a device run that finished: the CPU side's evidence and the decision."""
        ...

    def locate(self, job: Job, row: Row, result: Mapping[str, Any], spec: RunSpec | TrainSpec) -> Row:
        """After the verdict: where a numerics FAIL starts inside the model (the first diverging module, from
        one more forward on the device and on CPU: ``cpu.locate``), else ``row`` as it is (a PASS costs
        nothing). ``spec`` is the device run's own."""
        ...
