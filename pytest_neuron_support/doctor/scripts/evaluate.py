"""neuron-support doctor: evaluate one of the device table's expressions (SPEC["expr"], with torch
bound) and show its value. Rerun by hand with: python3 @@FILE@@ out.json"""

from harness import SPEC, main  # @@HARNESS@@


def check():
    import torch

    value = eval(SPEC["expr"], {"torch": torch, "__import__": __import__})
    return {"value": repr(value)[:2000]}


if __name__ == "__main__":
    main(check)
