"""neuron-support doctor, check `imports`: under TORCH_DEVICE_BACKEND_AUTOLOAD=0, `import torch` leaves
the device package out. Rerun by hand with: python3 @@FILE@@ out.json"""

import os
import sys

from harness import SPEC, main  # @@HARNESS@@


def check():
    import torch  # noqa: F401

    autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    return {"loaded": SPEC["runtime_module"] in sys.modules, "autoload": autoload}


if __name__ == "__main__":
    main(check)
