"""A pytest plugin of the suite's (loaded by conftest.py): with ``NEURON_SUPPORT_TEST_CPU=FILE`` set, each
test's CPU seconds are appended to FILE, one JSON line a test (its id, wall seconds, this worker's own CPU
seconds and its children's), from every xdist worker. Unset, it does nothing.

Why CPU and not ``--durations``: on the suite's 2-CPU machines ``pytest tests -n 2`` keeps both CPUs busy,
so a test's wall time says as much about what ran beside it as about itself (the tiny-zoo sweep took 627 s
beside the text-to-image test and half that alone). The suite's length is its CPU seconds over two CPUs,
so what to cut is read from CPU seconds: ``python benchmarks/suite_cpu.py FILE`` sums them by test file.

The children's figure is ``getrusage(RUSAGE_CHILDREN)``: every process the test started and waited for,
with what those waited for in turn (pytester sessions, their xdist workers, run.py, ranks, compilers).
Session-scoped fixtures count in the test that set them up (the zoo build in the first test of the worker
that built it)."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path

import pytest

CPU_ENV = "NEURON_SUPPORT_TEST_CPU"


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    out = os.environ.get(CPU_ENV)
    if not out:
        yield
        return
    own, children, start = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.time()
    yield
    line = {
        "id": item.nodeid,
        "wall": round(time.time() - start, 3),
        "self": round(_cpu(resource.RUSAGE_SELF) - own, 3),
        "children": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
    }
    # One short line a write, in append mode: the workers' lines never interleave.
    with Path(out).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")
