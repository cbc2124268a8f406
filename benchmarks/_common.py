"""Shared by the benchmarks: the tiny zoo cache and a pytest session runner."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from pytest_neuron_support import zoo

REPO = Path(__file__).resolve().parent.parent


@functools.cache  # built (or checked) once per process: every later sweep reuses the answer
def zoo_cache() -> Path:
    base = Path(os.environ.get("NEURON_SUPPORT_ZOO_HOME", Path.home() / ".cache" / "neuron-support"))
    cache = base / f"zoo-{zoo.zoo_fingerprint()}" / "hub"
    zoo.build_zoo(cache)
    return cache


def children_cpu() -> float:
    """CPU seconds of this process's reaped children so far (the sessions and everything they ran)."""
    times = os.times()
    return times.children_user + times.children_system


def catalog(path: Path, entries: list[tuple[str, int]]) -> Path:
    prompt = json.dumps(zoo.TINY_PROMPT)
    lines = [f"judge: {{model: {zoo.JUDGE_REPO}}}", "models:"]
    for repo, cores in entries:
        lines.append(f"  - {{id: {repo}, task: text-generation, cores: {cores}, prompt: {prompt}}}")
    path.write_text("\n".join(lines) + "\n")
    return path


def sweep(
    workdir: Path,
    models_file: Path,
    results: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
) -> tuple[float, pd.DataFrame]:
    """Run one pytest session on CPU; return its wall seconds and the rows it wrote.

    ``env`` adds variables to the session's environment (a conftest in ``workdir`` may read them);
    ``log`` keeps pytest's output there instead of discarding it.
    """
    env = {**os.environ, "HF_HUB_CACHE": str(zoo_cache()), "HF_HUB_OFFLINE": "1", **(env or {})}
    start = time.monotonic()
    log_file = None if log is None else log.open("w", encoding="utf-8")
    out = subprocess.DEVNULL if log_file is None else log_file
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                "--device=cpu",
                f"--models-file={models_file}",
                f"--results-dir={results}",
                *args,
            ],
            cwd=workdir,
            env=env,
            check=False,
            stdout=out,
            stderr=None if log is None else subprocess.STDOUT,
        )
    finally:
        if log_file is not None:
            log_file.close()
    wall = time.monotonic() - start
    return wall, pd.read_parquet(results / "data")
