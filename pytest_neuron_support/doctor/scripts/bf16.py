"""neuron-support doctor, check `bf16`: a 64x64 bf16 matmul on the device against the CPU's. Rerun by
hand with: python3 @@FILE@@ out.json"""

from harness import SPEC, main, synchronize  # @@HARNESS@@


def check():
    import torch

    torch.manual_seed(0)
    a = torch.randn(64, 64).to(torch.bfloat16)
    b = torch.randn(64, 64).to(torch.bfloat16)
    cpu = (a @ b).float()
    on_device = a.to(SPEC["device"]) @ b.to(SPEC["device"])
    synchronize(torch)
    found = on_device.cpu().float()
    scale = float(cpu.abs().max())
    out = {
        "dtype": str(on_device.dtype),
        "device": str(on_device.device),
        "max_rel_diff": float((found - cpu).abs().max()) / scale,
    }
    module = SPEC.get("memory_module")
    if module and hasattr(getattr(torch, module), "is_bf16_supported"):
        out["is_bf16_supported"] = bool(getattr(torch, module).is_bf16_supported())
    return out


if __name__ == "__main__":
    main(check)
