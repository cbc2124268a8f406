"""neuron-support doctor, checks `two-processes` and `exclusive`: take a core and hold it (until a
partner holds its own, then SPEC["hold_s"] more, or until released). Rerun by hand with:
python3 @@FILE@@ out.json"""

import os
import time

from harness import SPEC, main, synchronize  # @@HARNESS@@


def check():
    import torch

    started = time.time()
    x = torch.ones(1 << 18, device=SPEC["device"]) * 2  # reserves the core: the runtime is up
    synchronize(torch)
    ready = time.time()
    if SPEC.get("ready_file"):
        open(SPEC["ready_file"], "w").close()
    partner = SPEC.get("wait_for")
    release = SPEC.get("release_file")
    deadline = time.time() + SPEC["wait_s"]
    # Hold until the partner holds its core too, then hold_s more: the two overlap by construction.
    while partner and not os.path.exists(partner) and time.time() < deadline:
        if release and os.path.exists(release):  # the partner failed: stop waiting for it
            break
        time.sleep(0.05)
    partner_ready = bool(partner) and os.path.exists(partner)
    end = time.time() + SPEC["hold_s"]
    while time.time() < end and not (release and os.path.exists(release)):
        time.sleep(0.05)
    total = float((x * 1).sum().cpu())
    return {
        "started": started,
        "ready": ready,
        "done": time.time(),
        "partner_ready": partner_ready,
        "device": str(x.device),
        "sum": total,
        "pinned": os.environ.get(SPEC["core_env_var"] or "", None),
    }


if __name__ == "__main__":
    main(check)
