"""What run.py and train.py share: stage markers, versions, writing a result, one spawned rank per
leased core with the results merged, and the entry point.

runscript splices everything below the @@COMMON@@ line into both scripts, in place of their own
@@COMMON@@ import statement, so each rendered script stays standalone while this code has one
source. What is above that line is not spliced: the import from ``run`` names what the host script
defines (SPEC; DISTRIBUTIONS, the distributions whose versions it records; CHECK, its verdict line's
subject; run(), the check itself; merge_rank_facts, the part of the merge each script does its own
way), so ruff checks this file as the code it becomes. The spliced part imports the modules it uses
itself, so a host script that stops needing one cannot break it.
"""

from __future__ import annotations

from run import CHECK, DISTRIBUTIONS, SPEC, merge_rank_facts, run

# Two import blocks: the one below is spliced with the code, so isort must not merge them.
# isort: split
# @@COMMON@@
# The same code in run.py and train.py: pytest-neuron-support renders both from one source
# (templates/common.py), with its own imports.
import argparse
import json
import os
import platform
import resource
import signal
import sys
import time
import traceback

STAGE = {"name": "start"}
WORLD = {"size": 1, "rank": 0}
#: What the host's run() found that a failed result keeps too (train.py: what loading found, as
#: evidence that the model did load sharded); run.py keeps nothing there.
FACTS = {}


class NothingCompiledError(RuntimeError):
    """The run was asked to compile but compiled no graph: it silently ran eagerly."""


def enter(stage):
    """Record the stage; the harness reads the last marker if this process dies."""
    STAGE["name"] = stage
    print(f"[neuron-support] stage={stage}", file=sys.stderr, flush=True)


def versions():
    from importlib import metadata

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "none"

    found = {dist.replace("-", "_"): version(dist) for dist in DISTRIBUTIONS}
    return {
        **found,
        "neuronx_cc": compiler_version(version("neuronx-cc")),
        "python": platform.python_version(),
    }


def compiler_version(distribution_version):
    """The device compiler's own version (SPEC["device"]["compiler_version_expr"]: neuronxcc's
    __version__, with its local label, e.g. 2.15.128.0+56dc5a86, which its cache keys and the
    published NEFF caches are named by), else the distribution's version."""
    if distribution_version == "none":
        return "none"
    try:
        found = device_fact(None, "compiler_version_expr")
    except Exception:
        found = None
    return distribution_version if found is None else str(found)


def device_fact(torch, name):
    """Evaluate the device table's expression ``name`` (SPEC["device"]), or None where it has none."""
    expr = SPEC["device"].get(name)
    if expr is None:
        return None
    return eval(expr, {"torch": torch, "__import__": __import__})


def synchronize(torch):
    """Device work is asynchronous (neuron, cuda): wait before reading clocks or memory."""
    module = SPEC["device"]["memory_module"]
    if module is not None:
        getattr(torch, module).synchronize()


def peak_device_memory(torch):
    """The device allocator's peak on this process's core (tensors only: no compiled code,
    scratchpad or collective buffers), after a synchronize (the allocator is asynchronous)."""
    module = SPEC["device"]["memory_module"]
    if module is None:
        return None
    getattr(torch, module).synchronize()
    return int(getattr(torch, module).max_memory_allocated())


def run_and_write(out, rank=0):
    """Run the check in this process and write its JSON result to ``out``."""
    started = time.perf_counter()
    result = {"ok": False, "model": SPEC["model"], "device": SPEC["device"]["name"], "rank": rank}
    try:
        result.update(run())
        result["ok"] = True
        enter("done")
    except Exception as exc:
        result.update(FACTS)
        result.update(
            stage=STAGE["name"],
            error_type=type(exc).__name__,
            error=str(exc)[:4000],
            traceback=traceback.format_exc()[-20000:],
        )
        print(result["traceback"], file=sys.stderr)
    result["wall_s"] = time.perf_counter() - started
    result["peak_host_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch = sys.modules.get("torch")
    if torch is not None:  # the threads every timing above was measured with (OMP_NUM_THREADS)
        result["cpu_threads"] = torch.get_num_threads()
    result["versions"] = versions()
    write_json(out, result)
    return result


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


def rank_entry(rank, world, rendezvous, out):
    """One torch.distributed rank (spawned, never forked: a forked child cannot re-initialise
    the Neuron runtime). It joins the process group through ``rendezvous`` (:func:`join_process_group`)."""
    end_with_parent()
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
    )
    pin = SPEC["device"]["core_env_var"]
    if pin and os.environ.get(pin):
        os.environ[pin] = rank_core(os.environ[pin], rank)
    WORLD.update(size=world, rank=rank, rendezvous=rendezvous)
    # A spawned rank imports this file afresh, so what main() set is not there (train.py puts the
    # Trainer's output_dir beside it; run.py does not read it).
    SPEC["out"] = out
    result = run_and_write(f"{out}.rank{rank}", rank)
    if not result["ok"]:
        sys.exit(1)  # makes spawn_ranks stop the other ranks instead of leaving them blocked
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized():
        # An orderly teardown, as torch asks of every rank: multiprocessing ends this process with
        # os._exit, which runs no destructor, so nothing else would close the group.
        dist.destroy_process_group()


#: How long a rank waits for rank 0's store (and the store for the ranks): torch's default
#: process-group timeout. A rank 0 that dies ends the wait sooner: spawn_ranks stops the others.
RENDEZVOUS_TIMEOUT_S = 1800


def join_process_group(dist, backend, rank, world, rendezvous):
    """``init_process_group`` over a store rank 0 hosts on a port the kernel picked for it.

    Picking a free port in the launcher and handing it over races: until rank 0 binds it, another
    run's rank can take it, and two concurrent sharded runs then fail, or worse, meet in one store.
    Here rank 0 binds port 0 itself and publishes the port it got in the ``rendezvous`` file (written
    whole, then renamed); the other ranks wait for the file. ``MASTER_ADDR``/``MASTER_PORT`` are set
    to that store before the group starts (the Neuron docs ask for them on every rank)."""
    import datetime

    timeout = datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S)
    if rank == 0:
        # wait_for_workers=False: the others can only connect after the port is published below.
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=timeout, wait_for_workers=False)
        port = store.port
        with open(f"{rendezvous}.tmp", "w", encoding="utf-8") as handle:
            handle.write(str(port))
        os.replace(f"{rendezvous}.tmp", rendezvous)
    else:
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
        while True:
            try:
                with open(rendezvous, encoding="utf-8") as handle:
                    port = int(handle.read())
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    waited = f"rank 0 published no store in {rendezvous} within {RENDEZVOUS_TIMEOUT_S} s"
                    raise TimeoutError(waited) from None
                time.sleep(0.05)
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=timeout)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout)


def spawn_ranks(world, out):
    """Start ``world`` ranks and wait for all of them; when one ends badly, stop the others (they
    would wait in a collective for it). Returns how the first bad one ended, or None.

    The standard library's spawn context, as torch.multiprocessing.spawn uses, without importing
    torch into this launcher: about 2 s of CPU saved per sharded run, and on neuron no device
    backend is autoloaded in a process that holds no core. Spawned, never forked: a forked child
    cannot re-initialise the Neuron runtime."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    rendezvous = f"{out}.rendezvous"  # where rank 0 publishes its store's port (join_process_group)
    for stale in (rendezvous, f"{rendezvous}.tmp"):
        if os.path.exists(stale):
            os.remove(stale)
    ranks = [context.Process(target=rank_entry, args=(rank, world, rendezvous, out)) for rank in range(world)]
    for process in ranks:
        process.start()
    running = {process.sentinel: rank for rank, process in enumerate(ranks)}
    failure = None
    while running:
        # Once the others were told to stop, a rank that ignores SIGTERM gets 30 s, then SIGKILL.
        ended = wait(list(running), timeout=None if failure is None else 30)
        if not ended:
            for rank in running.values():
                ranks[rank].kill()
            continue
        for sentinel in ended:
            rank = running.pop(sentinel)
            ranks[rank].join()
            code = ranks[rank].exitcode
            if code and failure is None:
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                failure = f"rank {rank} terminated with {how}"
                for other in running.values():
                    ranks[other].terminate()
    for done in (rendezvous, f"{rendezvous}.tmp"):
        if os.path.exists(done):
            os.remove(done)
    return failure


def launch_ranks(out):
    """Start one rank per leased core, wait for all, and merge their results into ``out``."""
    world = SPEC["world_size"]
    for rank in range(world):
        if os.path.exists(f"{out}.rank{rank}"):
            os.remove(f"{out}.rank{rank}")
    started = time.perf_counter()
    enter("load")
    failure = spawn_ranks(world, out)  # None, or how a rank ended; its own result says why
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="result.json", help="where to write the JSON result")
    args = parser.parse_args(argv)
    SPEC["out"] = args.out  # train.py puts the Trainer's output_dir beside it; run.py does not read it
    if os.environ.get("NEURON_SUPPORT_HARNESS"):  # started by the harness: end with it
        end_with_parent()
    for key, value in SPEC["device"]["env"].items():
        os.environ.setdefault(key, value)  # before torch is imported
    result = launch_ranks(args.out) if SPEC["world_size"] > 1 else run_and_write(args.out)
    verdict = "ok" if result["ok"] else f"failed at {result['stage']}: {result['error_type']}: {result['error']}"
    subject = CHECK.format(model=SPEC["model"], device=SPEC["device"]["name"])
    print(f"[neuron-support] {subject}: {verdict}", file=sys.stderr)
    return 0 if result["ok"] else 1
