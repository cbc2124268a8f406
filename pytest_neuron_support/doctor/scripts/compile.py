"""neuron-support doctor, check `compile`: torch.compile with the device's backend against eager.
Rerun by hand with: python3 @@FILE@@ out.json"""

from harness import SPEC, main, synchronize  # @@HARNESS@@


def f(x, y):
    return torch.sin(x) @ y + torch.relu(y) * 0.5


def check():
    global torch
    import torch
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    x = torch.randn(8, 8).to(SPEC["device"])
    y = torch.randn(8, 8).to(SPEC["device"])
    eager = f(x, y)
    synchronize(torch)
    counters.clear()
    compiled = torch.compile(f, backend=SPEC["backend"])
    out = compiled(x, y)
    synchronize(torch)
    expected = eager.cpu()
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "max_rel_diff": float((out.cpu() - expected).abs().max()) / float(expected.abs().max()),
        "device": str(out.device),
    }


if __name__ == "__main__":
    main(check)
