"""Collecting a generated 1,000-entry catalog (``pytest --collect-only``), offline.

Every entry is planned at collection (config and safetensors metadata from the local cache;
these ids are not cached, so each plan falls back quickly). Prints collection seconds against
the 2 s target, measured with pytest's own clock.

    python benchmarks/collect_1000.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lines = ["models:"]
        for i in range(1000):
            lines.append(f"  - {{id: bench-org/model-{i:04d}, task: text-generation, tags: [bench, n{i % 7}]}}")
        (work / "models.yaml").write_text("\n".join(lines) + "\n")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(work / "hub")}
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--device=cpu", "--collect-only", "-q"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    match = re.search(r"(\d+) tests? collected in ([\d.]+)s", out)
    if not match:
        raise SystemExit(f"unexpected pytest output:\n{out[-2000:]}")
    count, seconds = int(match.group(1)), float(match.group(2))
    print(f"collected {count} items in {seconds:.2f}s; ratio to the 2 s target = {seconds / 2:.2f} (target <= 1)")


if __name__ == "__main__":
    main()
