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
    """Record the stage; the harness reads the last marker if this process dies. A rank also keeps
    it in a file of its own (WORLD["stage_file"]): the ranks share one log, so its last marker may be
    another rank's, and the launcher must say which stage a rank that died without a result reached."""
    STAGE["name"] = stage
    print(f"[neuron-support] stage={stage}", file=sys.stderr, flush=True)
    if "stage_file" in WORLD:
        with open(f"{WORLD['stage_file']}.tmp", "w", encoding="utf-8") as handle:
            handle.write(stage)
        os.replace(f"{WORLD['stage_file']}.tmp", WORLD["stage_file"])


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


def device_module(torch):
    """The device's torch module (torch.neuron, torch.cuda), or None: a device without one (cpu), or one this
    process cannot use (a cuda run on a machine without CUDA), where only a run that never reached the
    device gets (the pipeline check's run of a pipeline that left its model on the CPU)."""
    name = SPEC["device"]["memory_module"]
    module = None if name is None else getattr(torch, name, None)
    return module if module is not None and module.is_available() else None


def synchronize(torch):
    """Device work is asynchronous (neuron, cuda): wait before reading clocks or memory."""
    module = device_module(torch)
    if module is not None:
        module.synchronize()


def peak_device_memory(torch):
    """The device allocator's peak on this process's core (tensors only: no compiled code,
    scratchpad or collective buffers), after a synchronize (the allocator is asynchronous)."""
    module = device_module(torch)
    if module is None:
        return None
    module.synchronize()
    return int(module.max_memory_allocated())


def run_and_write(out, rank=0):
    """Run the check in this process and write its JSON result to ``out``."""
    started = time.perf_counter()
    result = {"ok": False, "model": SPEC["model"], "device": SPEC["device"]["name"], "rank": rank}
    ended = None
    try:
        result.update(run())
        # The commit of the snapshot the files were loaded from, which a cached reference must match (the
        # config's _commit_hash would say it, but transformers 5 keeps none there).
        result["commit"] = snapshot_commit()
        result["ok"] = True
        enter("done")
    except BaseException as exc:
        # SystemExit and KeyboardInterrupt are recorded too (a rank that just exited must not look
        # like a later failure than its peers'), then end the process as they would have.
        ended = None if isinstance(exc, Exception) else exc
        result.update(FACTS)
        result.update(
            # When, on the host's clock: of a sharded run's failed ranks the first to fail is the cause
            # (a peer blocked in a collective with it fails after it, "Connection closed by peer").
            failed_at=time.time(),
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
    if ended is not None:
        raise ended
    return result


def snapshot_commit():
    """The commit of the Hugging Face cache snapshot SPEC["model"]'s files were loaded from: the folder
    ``snapshots/<commit>/`` its config.json (a diffusers pipeline's model_index.json) resolves to for
    SPEC["revision"], as from_pretrained resolved it. A cached CPU reference is used only for a run of
    the same commit. None for a local folder (it has no commit) or where huggingface_hub cannot say;
    never an error: the run itself worked."""
    if os.path.isdir(SPEC["model"]):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for name in ("config.json", "model_index.json"):
        try:
            found = try_to_load_from_cache(SPEC["model"], name, revision=SPEC["revision"])
        except (ValueError, OSError):  # an id huggingface_hub refuses (HFValidationError is a ValueError)
            return None
        if isinstance(found, str):  # a path; None or a "known missing" sentinel otherwise
            return os.path.basename(os.path.dirname(found))
    return None


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


def enter_rank(rank, world, pin, root_comm_env):
    """Make this spawned process rank ``rank`` of ``world``: it ends with its parent, gets torch.distributed's
    environment variables and, on a device that pins cores (``pin``: the device's core variable, set to the
    lease), narrows the pinning to its own core of the lease. Returns the lease's runtime root-communication
    port as ``(root_comm_env, port)`` for :func:`join_process_group`, or None (no pinning, or no such
    variable on this device). run.py's ranks and the doctor's process-group check both enter this way."""
    end_with_parent()
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
    )
    if not (pin and os.environ.get(pin)):
        return None
    first = int(rank_core(os.environ[pin], 0))  # the lease's first host core
    os.environ[pin] = rank_core(os.environ[pin], rank)
    return (root_comm_env, root_comm_port(first)) if root_comm_env else None


def rank_entry(rank, world, rendezvous, out):
    """One torch.distributed rank (spawned, never forked: a forked child cannot re-initialise
    the Neuron runtime). It joins the process group through ``rendezvous`` (:func:`join_process_group`)."""
    device = SPEC["device"]
    root_comm = enter_rank(rank, world, device["core_env_var"], device.get("root_comm_env"))
    WORLD.update(
        size=world,
        rank=rank,
        rendezvous=rendezvous,
        stage_file=f"{out}.rank{rank}.stage",
        root_comm=root_comm,
    )
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
#: The device runtime's root-communication ports (neuron: NEURON_RT_ROOT_COMM_ID), one per first core
#: of a lease: above Linux's ephemeral range (32768-60999), so no port the kernel hands out (the c10d
#: store's) is ever one of them.
ROOT_COMM_BASE = 61100


def root_comm_port(first_core):
    """The runtime root-communication port of the sharded run whose lease starts at host core
    ``first_core``. Leases are exclusive on the host, so two concurrent sharded runs never share a
    first core, and never this port: torch-neuronx's own choice when the variable is unset is a port
    picked free now and bound later by the runtime (get_free_port), which another run can take in
    between."""
    return ROOT_COMM_BASE + first_core


def join_process_group(dist, backend, rank, world, rendezvous, root_comm=None):
    """``init_process_group`` over a store rank 0 hosts on a port the kernel picked for it.

    Picking a free port in the launcher and handing it over races: until rank 0 binds it, another
    run's rank can take it, and two concurrent sharded runs then fail, or worse, meet in one store.
    Here rank 0 binds port 0 itself and publishes the port it got in the ``rendezvous`` file (written
    whole, then renamed); the other ranks wait for the file. ``MASTER_ADDR``/``MASTER_PORT`` are set
    to that store before the group starts (the Neuron docs ask for them on every rank).

    ``root_comm``: ``(variable, port)`` of the device runtime's own root-communication address
    (:func:`root_comm_port`), or None where the device has none (cpu, cuda). Rank 0 checks that the
    port is free, publishes ``127.0.0.1:<port>`` beside the store's port, and every rank sets the
    variable before the group starts (the backend keeps a value that is set)."""
    import datetime
    import socket

    timeout = datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S)
    if rank == 0:
        address = None
        if root_comm is not None:
            with socket.socket() as probe:
                # SO_REUSEADDR: the last run's connections lingering in TIME_WAIT on this lease's port do
                # not make it taken; a process listening on it still does.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", root_comm[1]))
                except OSError as exc:
                    taken = f"{root_comm[0]}: port {root_comm[1]} is taken by another process ({exc})"
                    raise RuntimeError(f"{taken}; free it, or lease other cores") from None
            address = f"127.0.0.1:{root_comm[1]}"
        # wait_for_workers=False: the others can only connect after the port is published below.
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=timeout, wait_for_workers=False)
        port = store.port
        with open(f"{rendezvous}.tmp", "w", encoding="utf-8") as handle:
            json.dump({"store": port, "root_comm": address}, handle)
        os.replace(f"{rendezvous}.tmp", rendezvous)
    else:
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
        while True:
            try:
                with open(rendezvous, encoding="utf-8") as handle:
                    published = json.load(handle)
                port, address = int(published["store"]), published["root_comm"]
                break
            except (OSError, ValueError, KeyError, TypeError):
                if time.monotonic() > deadline:
                    waited = f"rank 0 published no store in {rendezvous} within {RENDEZVOUS_TIMEOUT_S} s"
                    raise TimeoutError(waited) from None
                time.sleep(0.05)
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=timeout)
    if root_comm is not None and address is not None:
        os.environ[root_comm[0]] = address
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout)


def join_world(dist):
    """This rank joins its run's process group: the device table's backend, WORLD's rank, size and
    rendezvous, and the runtime's own root-communication port where the device has one (neuron). The
    first thing a rank does, before any seeding or device use: on neuron, seeding sizes the device
    generator table from the cores visible at that moment, and a rank's device index is only right
    after this call."""
    join_process_group(
        dist,
        SPEC["device"]["dist_backend"],
        WORLD["rank"],
        WORLD["size"],
        WORLD["rendezvous"],
        root_comm=WORLD["root_comm"],
    )


def spawn_ranks(world, out, ended=None):
    """Start ``world`` ranks and wait for all of them; when one ends badly, stop the others (they
    would wait in a collective for it). Returns how the first bad one ended, or None; ``ended``, a
    list, gets every bad ending as ``{"rank", "at", "how", "stopped"}`` (``at``: when the launcher saw
    it, on the host's clock; ``stopped``: the launcher had told that rank to stop).

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
    stopped = set()
    while running:
        # Once the others were told to stop, a rank that ignores SIGTERM gets 30 s, then SIGKILL.
        ready = wait(list(running), timeout=None if failure is None else 30)
        if not ready:
            for rank in running.values():
                ranks[rank].kill()
            continue
        seen = time.time()
        for sentinel in ready:
            rank = running.pop(sentinel)
            ranks[rank].join()
            code = ranks[rank].exitcode
            if not code:
                continue
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            if ended is not None:
                ended.append({"rank": rank, "at": seen, "how": how, "stopped": rank in stopped})
            if failure is None:
                failure = f"rank {rank} terminated with {how}"
                for other in running.values():
                    ranks[other].terminate()
                    stopped.add(other)
    for done in (rendezvous, f"{rendezvous}.tmp"):
        if os.path.exists(done):
            os.remove(done)
    return failure


def first_failure(results, ended):
    """Which rank's failure caused the others' (its number), or None if none failed.

    A rank that failed by itself fails first; its peers, blocked in a collective with it, fail after
    it (gloo's "Connection closed by peer", a timeout), so rank 0's view is no guide. A rank killed by a
    signal the launcher did not send (the host's OOM killer, a crash in native code) caused it: a peer
    that merely lost it raises, it is not signalled. Otherwise the earliest failure on the host's clock
    wins: a rank's own ``failed_at`` where it wrote a failed result, else when the launcher saw it end.
    A rank that wrote a good result and then ended badly (a crash in teardown) is a cause only when no
    rank failed before its result, and a rank the launcher stopped only when nothing else failed."""
    own = [e for e in ended if not e["stopped"]]
    signalled = [e for e in own if results[e["rank"]] is None and e["how"].startswith("signal ")]
    if signalled:
        return min(signalled, key=lambda e: e["at"])["rank"]
    times = {}
    for rank, result in enumerate(results):
        if result is not None and not result["ok"]:
            times[rank] = result.get("failed_at", float("inf"))
    for event in own:
        if results[event["rank"]] is None:
            times.setdefault(event["rank"], event["at"])
    if not times:
        times = {e["rank"]: e["at"] for e in own} or {e["rank"]: e["at"] for e in ended}
    return min(times, key=lambda rank: (times[rank], rank)) if times else None


def last_stage(out, rank):
    """The stage rank ``rank`` last entered (its stage file, :func:`enter`), or None."""
    try:
        with open(f"{out}.rank{rank}.stage", encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def launch_ranks(out):
    """Start one rank per leased core, wait for all, and merge their results into ``out``.

    A failed run is named by the rank whose failure caused the others' (:func:`first_failure`), at
    the stage that rank reached, whatever the other ranks saw after it; theirs follow as evidence."""
    world = SPEC["world_size"]
    for rank in range(world):
        for path in (f"{out}.rank{rank}", f"{out}.rank{rank}.stage"):
            if os.path.exists(path):
                os.remove(path)
    started = time.perf_counter()
    enter("load")
    ended = []
    failure = spawn_ranks(world, out, ended)  # None, or how a rank ended; its own result says why
    results = []
    for rank in range(world):
        try:
            with open(f"{out}.rank{rank}", encoding="utf-8") as handle:
                results.append(json.load(handle))
        except (OSError, ValueError):
            results.append(None)
    stages = [last_stage(out, rank) for rank in range(world)]
    for rank in range(world):
        if os.path.exists(f"{out}.rank{rank}.stage"):
            os.remove(f"{out}.rank{rank}.stage")
    cause = first_failure(results, ended)
    if cause is None and all(r is not None and r["ok"] for r in results):
        merged = dict(results[0])
        # Each rank's allocator peak is its own core's: keep all of them, and the largest.
        memory = [r["peak_device_memory_bytes"] for r in results]
        merged["peak_device_memory_by_rank"] = memory
        known = [m for m in memory if m is not None]
        merged["peak_device_memory_bytes"] = max(known) if known else None
        merged["peak_host_rss_bytes"] = max(r["peak_host_rss_bytes"] for r in results)
        merge_rank_facts(merged, results)  # what only this script's results carry
    elif cause is not None and results[cause] is not None and not results[cause]["ok"]:
        merged = dict(results[cause])
        merged["error"] = f"rank {cause}: {merged['error']}"
    else:
        missing = [rank for rank, r in enumerate(results) if r is None]
        how = next((f"rank {e['rank']} terminated with {e['how']}" for e in ended if e["rank"] == cause), failure)
        if cause is not None and results[cause] is not None:  # its result was good: it died after it
            how = f"{how}, after writing a good result"
        merged = {
            "ok": False,
            "model": SPEC["model"],
            "device": SPEC["device"]["name"],
            # The stage the rank that died had reached; the launcher's own ("load") if it never said.
            "stage": (stages[cause] if cause is not None else None) or STAGE["name"],
            "error_type": "RankDied",
            "error": f"rank(s) {missing} died without a result: {how}",
            "versions": versions(),
        }
    others = [
        f"rank {rank} then failed at {r['stage']}: {r['error_type']}: {r['error'][:300]}"
        for rank, r in enumerate(results)
        if rank != cause and r is not None and not r["ok"]
    ]
    if others:  # what the peers saw after the cause: evidence, not the verdict's reason
        merged["error"] = f"{merged['error']}\n" + "\n".join(others)
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
    one_rank = SPEC["device"]["unsharded_env"] if SPEC["world_size"] == 1 else {}
    for key, value in {**SPEC["device"]["env"], **one_rank}.items():
        os.environ.setdefault(key, value)  # before torch is imported
    result = launch_ranks(args.out) if SPEC["world_size"] > 1 else run_and_write(args.out)
    verdict = "ok" if result["ok"] else f"failed at {result['stage']}: {result['error_type']}: {result['error']}"
    subject = CHECK.format(model=SPEC["model"], device=SPEC["device"]["name"])
    print(f"[neuron-support] {subject}: {verdict}", file=sys.stderr)
    return 0 if result["ok"] else 1
