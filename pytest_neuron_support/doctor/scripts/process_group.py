"""neuron-support doctor, check `process-group`: two spawned ranks, one core each, join a process group
with run.py's own launcher and rendezvous, seed, and all_reduce on the device. Rerun by hand with:
python3 @@FILE@@ out.json"""

import json
import os
import sys
import traceback

# run.py's entry of a rank (enter_rank: its environment, its own core, the runtime's root-communication
# port), rendezvous (join_process_group) and launcher (spawn_ranks), spliced in from templates/common.py.
from common import enter_rank, join_process_group, spawn_ranks  # @@COMMON@@
from harness import SPEC, main, synchronize, write_json  # @@HARNESS@@


def rank_entry(rank, world, rendezvous, out):
    # As run.py's ranks do: each narrows to its own core of the pair, with the lease's root-communication port.
    pin = SPEC["core_env_var"]
    root_comm = enter_rank(rank, world, pin, SPEC["root_comm_env"])
    result = {"rank": rank, "pinned": os.environ.get(pin or "")}
    try:
        import torch
        import torch.distributed as dist

        # Before any seeding or device use: on neuron seeding sizes the device generator table from the
        # cores visible at that moment, and the rank's device index is right only after this call.
        join_process_group(dist, SPEC["backend"], rank, world, rendezvous, root_comm=root_comm)
        result["root_comm"] = os.environ.get(SPEC["root_comm_env"] or "")
        torch.manual_seed(0)
        device = torch.device(SPEC["device"])
        noise = torch.rand(2, device=device)  # device RNG on every rank, after seeding
        value = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(value)
        synchronize(torch)
        result.update(sum=value.cpu().tolist(), device=str(value.device), noise=noise.cpu().tolist())
        dist.destroy_process_group()
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:3000]
        result["traceback"] = traceback.format_exc()[-4000:]
    write_json(f"{out}.rank{rank}", result)
    if "error" in result:
        sys.exit(1)  # spawn_ranks then stops the other rank instead of leaving it blocked


def check():
    out, world = sys.argv[1], 2
    failure = spawn_ranks(world, out)
    ranks = []
    for rank in range(world):
        try:
            with open(f"{out}.rank{rank}", encoding="utf-8") as handle:
                ranks.append(json.load(handle))
        except (OSError, ValueError):
            ranks.append({"rank": rank, "error": "died without a result"})
    return {"ranks": ranks, "spawn_error": failure}


if __name__ == "__main__":
    main(check)
