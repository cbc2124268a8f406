"""neuron-support doctor, check `memory`: the device's memory statistics after synchronize(), and its
per-core memory read pinned. Rerun by hand with: python3 @@FILE@@ out.json"""

import os

from harness import SPEC, main  # @@HARNESS@@


def check():
    import torch

    memory = getattr(torch, SPEC["memory_module"])
    x = torch.ones(1 << 18, dtype=torch.float32, device=SPEC["device"])  # 1 MiB
    memory.synchronize()
    return {
        "tensor_bytes": x.numel() * x.element_size(),
        "max_memory_allocated": int(memory.max_memory_allocated()),
        "memory_allocated": int(memory.memory_allocated()),
        "device": str(x.device),
        "pinned": os.environ.get(SPEC["core_env_var"] or "", None),
        # Read here, pinned to the core this check holds: on neuron it initialises the runtime, which
        # the unpinned `device` check must not do.
        "core_memory": int(eval(SPEC["memory_expr"], {"torch": torch})) if SPEC.get("memory_expr") else None,
    }


if __name__ == "__main__":
    main(check)
