"""The free-running CPU reference of a device run: the same run.py on CPU, eager, in the reference
dtype, started beside the device run and cached.

The reference needs no device cores, so an item takes about the longer of the two runs instead of
their sum, and the cores are free as soon as the device run ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.cpu.background import BackgroundRun
from pytest_neuron_support.run.caches import ReferenceCache, cached_commit, is_local, reference_key
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.execution import failure_of
from pytest_neuron_support.run.runscript import RunSpec


class ReferenceRun(BackgroundRun):
    """One item's CPU reference: its spec, its cache key, and its run.

    The run starts at once, in a thread of its own beside the device run, unless the reference
    cache holds an entry the verdict is sure to use. Every caller reads the cache through
    :meth:`cached`, for the commit of the snapshot the device run loaded (run.py reports it). Before
    the device run says it, the commit is the one the Hugging Face cache resolves the revision to
    (:func:`cached_commit`: what an offline device run loads), None for a local folder. With an entry
    of that commit the reference is not started; if the device run loads another commit after all (the
    branch moved on the Hub and the device run downloaded it), the entry is a miss and the reference
    runs after the device run. An entry of another commit (a moved ``refs/main``) is a miss at once: the
    reference starts beside the device run.
    """

    def __init__(self, job: Job, spec: RunSpec) -> None:
        super().__init__(job, spec, "reference")
        self.spec: RunSpec = spec
        self.key = reference_key(spec, job.settings.stack)
        #: The reference result the verdict used (cached or run), once :func:`reference_result` has it.
        self.result: Mapping[str, Any] | None = None
        if self.cached(cached_commit(spec.model, spec.revision, job.environ)) is None:
            self.start()

    def cached(self, commit: str | None) -> Mapping[str, Any] | None:
        """The cached result of this reference for a device run that loaded ``commit`` (None for a local
        folder), or None when the cache lacks it, holds another commit's, or the commit of a Hub model
        is unknown."""
        cache = self.job.settings.reference_cache
        if cache is None:
            return None
        return ReferenceCache(cache).get(self.key, commit, local=is_local(self.spec.model))


@dataclass(frozen=True)
class Reference:
    """The reference a verdict compares with: its result, or why there is none.

    Attributes:
        result: the reference run's JSON result (None when it failed).
        dtype: the dtype it ran in.
        wall_s: seconds it took here (0 when cached).
        cached: it came from the reference cache.
        failure: (result, error) of a reference run that did not finish, else None.
    """

    result: Mapping[str, Any] | None
    dtype: str
    wall_s: float
    cached: bool
    failure: tuple[str, str] | None = None


def reference_result(run: ReferenceRun, commit: str | None, *, use_cache: bool = True) -> Reference:
    """The reference of a device run that loaded ``commit``: the cache's entry of that commit (the run
    started beside it is stopped), else the run's own result (stored in the cache), else its failure.
    ``use_cache=False``: a reference with no device run beside it (a user's ``neuron_reference`` alone)
    runs, and only stores its result."""
    job = run.job
    cached = run.cached(commit) if use_cache else None
    if cached is not None:
        run.cancel()
        run.result = cached
        return Reference(cached, run.spec.dtype, 0.0, True)
    outcome = run.outcome()
    wall_s = round(outcome.wall_s, 3)
    if outcome.result is None or not outcome.result.get("ok"):
        status, _, error = failure_of(
            outcome, "CPU reference run.py", offline=job.settings.hub_unreachable, checkpoint=job.model.id
        )
        return Reference(None, run.spec.dtype, wall_s, False, (status, scrub(error, job.environ) or ""))
    if job.settings.reference_cache is not None:
        ReferenceCache(job.settings.reference_cache).put(run.key, outcome.result)
    run.result = outcome.result
    return Reference(outcome.result, run.spec.dtype, wall_s, False)
