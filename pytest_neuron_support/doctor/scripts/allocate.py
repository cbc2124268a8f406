"""neuron-support doctor, check `exclusive`: allocate on the core another process holds (which must
fail at runtime init). Rerun by hand with: python3 @@FILE@@ out.json"""

import os

from harness import SPEC, main, synchronize  # @@HARNESS@@


def check():
    import torch

    x = torch.ones(1 << 10, device=SPEC["device"]) * 2
    synchronize(torch)
    return {"device": str(x.device), "sum": float(x.sum().cpu()), "pinned": os.environ.get(SPEC["core_env_var"] or "")}


if __name__ == "__main__":
    main(check)
