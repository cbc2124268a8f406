"""What CI and README's commands install: the pins every install takes, and the report of what moved
when the suite is tried on the newest releases (.ci/upstream)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INSTALL = "pip install -c constraints.txt torch==2.13.0 -e '.[test]'"


def test_readme_commands_and_ci_install_the_pinned_versions() -> None:
    # A looser install resolves whatever upstream released last: a new transformers once turned CI red
    # for a change nobody made. Both README commands and .ci/run install through the same pins.
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m venv .venv &&")]
    assert len(commands) == 2 and all(INSTALL in c for c in commands), commands
    assert INSTALL in (REPO / ".ci" / "run").read_text(encoding="utf-8")
    pins = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.lower().replace("_", "-")] = version
    # The packages whose releases move per-release facts, and torch's CPU build, are pinned exactly.
    for name in ("transformers", "huggingface-hub", "accelerate", "pytest", "pytest-xdist"):
        assert name in pins, f"constraints.txt pins no {name}"
    assert pins["torch"] == "2.13.0"  # no local label: the same file serves a CPU and a CUDA build


def test_upstream_reports_which_versions_moved(tmp_path: Path) -> None:
    pinned = tmp_path / "constraints.txt"
    pinned.write_text("# pins\ntransformers==5.24.0\nhuggingface_hub==2.4.0\ntorch==2.13.0\n", encoding="utf-8")
    now = tmp_path / "now.txt"
    now.write_text("transformers==5.25.0\nhuggingface-hub==2.4.0\ntorch==2.13.0+cpu\nrich==15.0.0\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "moved.py"), str(pinned), str(now)],
        capture_output=True,
        text=True,
        check=True,
    )
    # huggingface_hub and huggingface-hub are one package; torch's +cpu label is no move.
    assert done.stdout.splitlines() == ["  rich: not pinned -> 15.0.0", "  transformers: 5.24.0 -> 5.25.0"]
    same = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "moved.py"), str(pinned), str(pinned)], capture_output=True, text=True
    )
    assert same.stdout.strip() == "nothing moved: the pins are the latest releases"
