"""neuron-support doctor, check `compile-cache`: the compile cache directory is writable, and its
counters count one compile. Rerun by hand with: python3 @@FILE@@ out.json"""

import os

from harness import SPEC, main, synchronize  # @@HARNESS@@


def g(x):
    return torch.cos(x) * 3 + x


def counts(torch, counters):
    if SPEC["cache_stats_expr"]:
        # As run.py's cache_counts(): a wheel without the private stats binding leaves them unknown.
        try:
            stats = eval(SPEC["cache_stats_expr"], {"torch": torch, "__import__": __import__})
            return {"hits": int(stats["persistent_hits"]), "misses": int(stats["persistent_misses"])}
        except (AttributeError, ImportError, KeyError) as exc:
            return {"unavailable": f"{type(exc).__name__}: {exc}"[:300]}
    inductor = counters["inductor"]
    return {"hits": int(inductor["fxgraph_cache_hit"]), "misses": int(inductor["fxgraph_cache_miss"])}


def listing(root):
    found = []
    for parent, _, files in os.walk(root):
        found.extend(os.path.relpath(os.path.join(parent, name), root) for name in files)
    return sorted(found)


def check():
    global torch
    import tempfile

    root = SPEC["cache_dir"]
    try:
        os.makedirs(root, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=root, prefix=".doctor-")
        os.write(handle, b"x")
        os.close(handle)
        os.remove(probe)
    except OSError as exc:
        return {"writable": False, "error": f"not writable: {type(exc).__name__}: {exc}"}
    before_files = set(listing(root))
    import torch
    from torch._dynamo.utils import counters

    before = counts(torch, counters)
    compiled = torch.compile(g, backend=SPEC["backend"])
    out = compiled(torch.arange(16, dtype=torch.float32).to(SPEC["device"]))
    synchronize(torch)
    float(out.sum().cpu())
    after = counts(torch, counters)
    written = [name for name in listing(root) if name not in before_files][:2000]
    if "unavailable" in after:
        return {"writable": True, "unavailable": after["unavailable"], "written": written}
    return {
        "writable": True,
        "hits": after["hits"] - before["hits"],
        "misses": after["misses"] - before["misses"],
        "written": written,
    }


if __name__ == "__main__":
    main(check)
