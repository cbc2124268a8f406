"""Shared by the fault-family test modules: a catalog of tiny-zoo models, and a process finder."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_neuron_support import zoo


def catalog(*ids: str) -> str:
    prompt = json.dumps(zoo.TINY_PROMPT)
    return "models:\n" + "".join(f"  - {{id: {i}, task: text-generation, prompt: {prompt}}}\n" for i in ids)


def alive_pids_running(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (proc / "status").read_text()
        except OSError:
            continue
        if marker in cmdline and "State:\tZ" not in status:
            pids.append(int(proc.name))
    return pids
