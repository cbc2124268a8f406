"""Rank handling shared by run.py and train.py: one spawned rank per leased core, results merged.

runscript splices everything below the @@RANKS@@ line into both scripts, in place of their own
@@RANKS@@ line, so each rendered script stays standalone while this code has one source. What is
above that line is not spliced: the import from ``run`` names what the host script defines
(merge_rank_facts is the part of the merge each script does its own way), so ruff checks this file
as the code it becomes. The spliced part imports the modules it uses itself, so a host script that
stops needing one cannot break it.
"""

from __future__ import annotations

from run import SPEC, STAGE, WORLD, enter, merge_rank_facts, run_and_write, versions

# Two import blocks: the one below is spliced with the code, so isort must not merge them.
# isort: split
# @@RANKS@@
# Rank handling, the same code in run.py and train.py: pytest-neuron-support renders both from one
# source (templates/ranks.py), with its own imports.
import json
import os
import signal
import sys
import time


def write_json(path, data):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)  # atomic: the harness never reads half a result


def rank_core(pinned, rank):
    """The core of ``rank`` within this process's leased cores ("4-7" or "4,5,6,7")."""
    cores = []
    for part in pinned.split(","):
        low, _, high = part.partition("-")
        cores.extend(range(int(low), int(high or low) + 1))
    return str(cores[rank])


def end_with_parent():
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere a no-op), so a
    harness killed outright (SIGKILL included) leaves no run or rank holding device cores."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent was already gone before the kernel was asked
        os.kill(os.getpid(), signal.SIGKILL)


def rank_entry(rank, world, port, out):
    """One torch.distributed rank (spawned, never forked: a forked child cannot re-initialise
    the Neuron runtime)."""
    end_with_parent()
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    pin = SPEC["device"]["core_env_var"]
    if pin and os.environ.get(pin):
        os.environ[pin] = rank_core(os.environ[pin], rank)
    WORLD.update(size=world, rank=rank)
    # A spawned rank imports this file afresh, so what main() set is not there (train.py puts the
    # Trainer's output_dir beside it; run.py does not read it).
    SPEC["out"] = out
    result = run_and_write(f"{out}.rank{rank}", rank)
    if not result["ok"]:
        sys.exit(1)  # makes torch.multiprocessing stop the other ranks instead of leaving them blocked


def free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_ranks(out):
    """Start one rank per leased core, wait for all, and merge their results into ``out``."""
    import torch.multiprocessing as mp

    world = SPEC["world_size"]
    for rank in range(world):
        if os.path.exists(f"{out}.rank{rank}"):
            os.remove(f"{out}.rank{rank}")
    started = time.perf_counter()
    enter("load")
    failure = None
    try:
        mp.spawn(rank_entry, args=(world, free_port(), out), nprocs=world, join=True, start_method="spawn")
    except Exception as exc:  # a rank failed or died; its own result says why
        failure = f"{type(exc).__name__}: {exc}"[:4000]
    results = []
    for rank in range(world):
        try:
            with open(f"{out}.rank{rank}", encoding="utf-8") as handle:
                results.append(json.load(handle))
        except (OSError, ValueError):
            results.append(None)
    failed = [r for r in results if r is not None and not r["ok"]]
    if failed:
        merged = dict(failed[0])
        merged["error"] = f"rank {merged['rank']}: {merged['error']}"
    elif all(r is not None for r in results) and failure is None:
        merged = dict(results[0])
        # Each rank's allocator peak is its own core's: keep all of them, and the largest.
        memory = [r["peak_device_memory_bytes"] for r in results]
        merged["peak_device_memory_by_rank"] = memory
        known = [m for m in memory if m is not None]
        merged["peak_device_memory_bytes"] = max(known) if known else None
        merged["peak_host_rss_bytes"] = max(r["peak_host_rss_bytes"] for r in results)
        merge_rank_facts(merged, results)  # what only this script's results carry
    else:
        missing = [rank for rank, r in enumerate(results) if r is None]
        merged = {
            "ok": False,
            "model": SPEC["model"],
            "device": SPEC["device"]["name"],
            "stage": STAGE["name"],
            "error_type": "RankDied",
            "error": f"rank(s) {missing} died without a result: {failure}",
            "versions": versions(),
        }
    merged["world_size"] = world
    merged["wall_s"] = time.perf_counter() - started
    write_json(out, merged)
    return merged
