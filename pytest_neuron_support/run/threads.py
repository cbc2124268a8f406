"""How many CPU threads each process run for a model gets: the usable CPUs shared among the runs that go
on side by side (``--cpu-threads=auto``; ``session.resolve.resolve_cpu_threads`` applies it, and
``run.context.session_env`` writes it as every run's ``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import os

#: Processes one item runs at the same time on the host CPU: its device run and, beside it, its CPU
#: reference (cpu.reference.ReferenceRun). The CPU check and the judge run after the device run ends.
CONCURRENT_RUNS_PER_ITEM = 2


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity: a container's or taskset's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_threads(cpus: int, workers: int) -> int:
    """Intra-op CPU threads (OMP_NUM_THREADS) for each process run for a model when ``workers`` items
    run side by side on ``cpus`` usable CPUs: the CPUs shared among their concurrent runs, at least 1.

    Why: torch sizes its thread pool to the whole machine in every process, so workers' runs
    oversubscribe the CPU, and each parallel op then waits at its barrier for threads that are not
    scheduled. Measured on a 2-CPU machine with the other CPU busy: a bfloat16 linear (1x64 by 64x768)
    took 5.5 to 8.4 ms on two threads and 0.19 ms on one; a tiny model's 32-token eager generate()
    8.3 s against 0.21 s."""
    return max(1, cpus // (max(1, workers) * CONCURRENT_RUNS_PER_ITEM))
