"""Check `imports`: torch and transformers import; the device package imports, torch autoloads it, and
it stays out of a process under ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (the CPU side's)."""

from __future__ import annotations

from pytest_neuron_support.devices.table import NO_DEVICE_ENV, DeviceKind
from pytest_neuron_support.doctor.check import Check, Doctor, env_text


def expected(kind: DeviceKind) -> str:
    return "torch and transformers import" + (
        f"; {kind.runtime_module} imports, is autoloaded by `import torch` (torch.{kind.memory_module} present) "
        f"and stays out under {env_text(NO_DEVICE_ENV)}"
        if kind.runtime_module
        else ""
    )


def run(doctor: Doctor) -> tuple[str, bool]:
    kind = doctor.kind
    args = doctor.script_args(runtime_module=kind.runtime_module)
    outcome = doctor.run("imports", "imports", args, doctor.device_env(()))
    if outcome.error is not None:
        return f"import failed: {outcome.error}", False
    doctor.versions.update(
        torch=str(outcome.get("torch")),
        transformers=str(outcome.get("transformers")),
        python=str(outcome.get("python")),
    )
    found = [f"torch {outcome.get('torch')}", f"transformers {outcome.get('transformers')}"]
    if kind.runtime_module is None:
        found.append(f"device package: none for {kind.name} (runtime_module is None)")
        return "; ".join(found), True
    doctor.versions[kind.runtime_module] = str(outcome.get("runtime_version"))
    found.append(f"{kind.runtime_module} {outcome.get('runtime_version')}")
    passed = True
    if not outcome.get("autoloaded"):
        found.append(f"NOT autoloaded by `import torch` (run.py never imports {kind.runtime_module})")
        passed = False
    if kind.memory_module and not outcome.get("registered"):
        found.append(f"torch.{kind.memory_module} missing after `import torch`")
        passed = False
    quiet = doctor.run("no-autoload", "no_autoload", {"runtime_module": kind.runtime_module}, doctor.cpu_env())
    if quiet.error is not None:
        found.append(f"under {env_text(NO_DEVICE_ENV)}: {quiet.error}")
        passed = False
    elif quiet.get("loaded"):
        found.append(f"still loaded under {env_text(NO_DEVICE_ENV)}: CPU-side runs would touch the device")
        passed = False
    else:
        found.append(f"kept out under {env_text(NO_DEVICE_ENV)}")
    return "; ".join(found), passed


CHECK = Check(
    key="imports",
    name="torch imports (and the device package)",
    expected=expected,
    run=run,
    scripts=("imports", "no_autoload"),
)
