"""A CPU-side script of one check run in a thread of its own, beside the device run: it needs no
device cores, so the item takes about the longer of the two runs instead of their sum."""

from __future__ import annotations

import threading

from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.execution import ProcessOutcome
from pytest_neuron_support.run.runscript import RunSpec, TrainSpec


class BackgroundRun:
    """``spec`` rendered into ``job.workdir / folder`` and run on the CPU (:meth:`start`), or at once when
    its :meth:`outcome` is asked for before it was started; :meth:`cancel` stops it."""

    def __init__(self, job: Job, spec: RunSpec | TrainSpec, folder: str) -> None:
        self.job = job
        self.spec = spec
        self.folder = folder
        self._cancel = threading.Event()
        self._outcome: ProcessOutcome | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"neuron-support-{self.folder}", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        self._outcome = self.job.execute_on_cpu(self.spec, self.folder, self._cancel)[1]

    def outcome(self) -> ProcessOutcome:
        """The finished run: waits for the one started, or runs it now if none was."""
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        assert self._outcome is not None
        return self._outcome

    def cancel(self) -> None:
        """Not needed after all (the device run failed, or a cache had it): stop it now."""
        self._cancel.set()
        if self._thread is not None:
            self._thread.join()
