"""neuron-support doctor, check `imports`: torch, transformers and the device package import, and
torch autoloads the device package. Rerun by hand with: python3 @@FILE@@ out.json"""

import sys

from harness import SPEC, main  # @@HARNESS@@


def check():
    from importlib import metadata

    import torch

    out = {"torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        out["transformers"] = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        out["transformers"] = "none"
    module = SPEC["runtime_module"]
    if module:
        # Before importing the package ourselves: run.py never imports it, torch must have autoloaded it.
        out["autoloaded"] = module in sys.modules
        out["registered"] = bool(SPEC["memory_module"]) and hasattr(torch, SPEC["memory_module"])
        runtime = __import__(module)
        out["runtime_version"] = str(getattr(runtime, "__version__", "unknown"))
    return out


if __name__ == "__main__":
    main(check)
