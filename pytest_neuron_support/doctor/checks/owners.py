"""Check `owners`: the device's listing of the processes that hold its cores (``owners_command``,
``neuron-ls -j``) runs and prints JSON in the layout ``cores.core_owners`` reads. That parser reads
anything it does not recognise as "nothing owned", so here an unknown layout is a failure: the layout is
an inference from the docs that only this check tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import Check, Doctor, span
from pytest_neuron_support.doctor.runner import tail
from pytest_neuron_support.run.cores import core_owners


def expected(kind: DeviceKind) -> str:
    if kind.owners_command:
        return f"`{' '.join(kind.owners_command)}` runs and prints JSON that cores.core_owners reads"
    return "a listing of the processes that own cores (owners_command)"


def not_applicable(kind: DeviceKind) -> str | None:
    """No listing of owners in the table (a kind whose cores nobody owns): nothing to read."""
    if kind.owners_command is not None:
        return None
    return f"{kind.name} lists no owners of its cores (owners_command is None)"


def device_cores(device: Mapping[str, Any], index: int) -> list[int]:
    """The core ids one device of the listing names (``neuroncore_ids``, else its count from its index)."""
    count = int(device.get("nc_count") or device.get("neuroncore_count") or 0)
    ids = device.get("neuroncore_ids")
    first = int(device.get("neuron_device", index)) * count
    return [int(i) for i in ids] if isinstance(ids, list) else list(range(first, first + count))


def neuron_ls_layout(data: object) -> str | None:
    """Why ``data`` is not the layout :func:`~pytest_neuron_support.run.cores.core_owners` reads, or None."""
    if isinstance(data, dict):
        if "neuron_devices" not in data:
            return f"a JSON object without 'neuron_devices' (keys: {', '.join(sorted(data))})"
        data = data["neuron_devices"]
    if not isinstance(data, list):
        return f"JSON {type(data).__name__}, not a list of devices"
    if not data:
        return "an empty device list"
    for index, device in enumerate(data):
        if not isinstance(device, dict):
            return f"device {index} is a JSON {type(device).__name__}, not an object"
        if not device_cores(device, index):
            return f"device {index} names no cores (no nc_count, neuroncore_count, neuroncore_ids: {sorted(device)})"
        processes = device.get("neuron_processes")
        if processes is not None and not (
            isinstance(processes, list)
            and all(isinstance(p, dict) and isinstance(p.get("pid"), int) for p in processes)
        ):
            return (
                f"device {index}: 'neuron_processes' is not a list of objects with an integer 'pid': {processes!r:.200}"
            )
    return None


def run(doctor: Doctor) -> tuple[str, bool]:
    command = doctor.kind.owners_command
    assert command is not None
    shown = " ".join(command)
    if shutil.which(command[0]) is None:
        return f"`{command[0]}` not found on PATH", False
    try:
        proc = subprocess.run(list(command), capture_output=True, text=True, timeout=doctor.timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{shown}` failed: {exc}", False
    if proc.returncode != 0:
        return f"`{shown}` exited {proc.returncode}: {tail(proc.stderr or proc.stdout)}", False
    try:
        data = json.loads(proc.stdout)
    except ValueError as exc:
        return f"`{shown}` printed no JSON ({exc}): {proc.stdout[:300]!r}", False
    layout = neuron_ls_layout(data)
    if layout is not None:
        return f"`{shown}`: {layout}; output starts {proc.stdout[:300]!r}", False
    doctor.owners_listing = data
    # Every owner of a core counts (several processes can share a chip): a core is held when any process
    # but the doctor itself owns it, and the first such owner is named.
    doctor.owned = {
        core: foreign[0]
        for core, pids in core_owners(data).items()
        if (foreign := [pid for pid in pids if pid != os.getpid()])
    }
    devices = data if isinstance(data, list) else data["neuron_devices"]
    keys = sorted({k for d in devices if isinstance(d, dict) for k in d})
    listed = sum(len(device_cores(d, i)) for i, d in enumerate(devices) if isinstance(d, dict))
    mine = sorted(set(doctor.owned) & set(doctor.slice))
    held = ", ".join(f"{c}: pid {p}" for c, p in sorted(doctor.owned.items())) or "none"
    found = f"{len(devices)} device(s), {listed} core(s) listed (keys: {', '.join(keys)}); held: {held}"
    if mine:
        found += f"; {len(mine)} of this slice's cores held by others ({span(mine)}): the checks avoid them"
    return found, True


CHECK = Check(
    key="owners",
    name="cores held by others",
    expected=expected,
    run=run,
    not_applicable=not_applicable,
)
