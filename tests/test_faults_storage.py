"""Storage faults: an unwritable or full results directory is refused before any work, a disk
that fills mid-sweep loses no row, and concurrent writers lose or corrupt none.

Full disks are real: a small tmpfs mounted for the test (root, or CAP_SYS_ADMIN, is needed to
mount one; CI runs as root)."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from pytest_neuron_support import zoo
from pytest_neuron_support.data.dataset import MIN_FREE_BYTES, check_writable, write_rows
from pytest_neuron_support.data.records import Row

CATALOG = "models:\n  - {id: org/a, task: text-generation}\n"


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs of the size given by ``@pytest.mark.parametrize("small_disk", [MiB], indirect=True)``."""
    mount = tmp_path / "disk"
    mount.mkdir()
    size = f"{request.param}m"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to make a full disk (needs root or CAP_SYS_ADMIN): {done.stderr!r}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> None:
    """Write until the file system says no space is left."""
    try:
        with open(directory / "filler", "wb") as handle:
            while True:
                handle.write(b"\0" * (1 << 20))
                handle.flush()
    except OSError:
        pass


def test_unwritable_results_dir_is_refused_before_any_work(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", models=CATALOG)
    (pytester.path / "blocker").write_text("a file, not a directory")
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=blocker/results")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--results-dir=*blocker/results is not writable*"])


@pytest.mark.parametrize("small_disk", [1], indirect=True)
def test_a_full_results_disk_is_refused_before_any_work(pytester: pytest.Pytester, small_disk: Path) -> None:
    fill(small_disk)
    with pytest.raises(OSError, match=r"No space left|MiB free"):
        check_writable(small_disk / "results")
    pytester.makefile(".yaml", models=CATALOG)
    result = pytester.runpytest_subprocess("--device=cpu", f"--results-dir={small_disk / 'results'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--results-dir=*disk/results is not writable (*); pass a directory*free space*"])
    assert not (small_disk / "results" / "runs").exists()  # nothing ran


@pytest.mark.parametrize("small_disk", [MIN_FREE_BYTES // (1 << 20) - 8], indirect=True)
def test_too_little_free_space_is_refused_with_the_numbers(small_disk: Path) -> None:
    with pytest.raises(OSError, match=r"only \d+\.\d MiB free, a sweep needs at least 64 MiB"):
        check_writable(small_disk)


FILL_AFTER_FIRST = """
import os
from pathlib import Path

FILLED = []

def pytest_runtest_teardown(item):
    # After the first model's row is recorded, the results disk fills up.
    if not FILLED:
        FILLED.append(item.name)
        try:
            with open(Path(os.environ["RESULTS"]) / "filler", "wb") as handle:
                while True:
                    handle.write(bytes(1 << 20))
                    handle.flush()
        except OSError:
            pass
"""


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.slow
@pytest.mark.parametrize("small_disk", [96], indirect=True)
def test_a_disk_that_fills_mid_sweep_loses_no_row(
    pytester: pytest.Pytester, small_disk: Path, offline_hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = small_disk / "results"
    monkeypatch.setenv("RESULTS", str(results))
    # The rescue goes to the system's temporary folder (tempfile): this test's own, so a run of the
    # suite leaves nothing in /tmp and the rescue read back below is this session's.
    own_tmp = pytester.mkdir("tmp")
    monkeypatch.setenv("TMPDIR", str(own_tmp))
    pytester.makeconftest(FILL_AFTER_FIRST)
    prompt = json.dumps(zoo.TINY_PROMPT)
    pytester.makefile(
        ".yaml",
        models=(
            "models:\n"
            f"  - {{id: tiny-random/qwen3, task: text-generation, prompt: {prompt}}}\n"
            f"  - {{id: tiny-random/llama, task: text-generation, prompt: {prompt}}}\n"
        ),
    )
    result = pytester.runpytest_subprocess("--device=cpu", f"--results-dir={results}")
    # The sweep went on: the second model is a row too (its run could not even be written).
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(
        [
            f"*could not write rows to {results}: *No space left on device*",
            "*all 2 rows were saved in *neuron-support-unsaved-*; free space, then recover them with: "
            f"neuron-support merge * --into {results}",
        ]
    )
    rescued = next(line for line in result.stdout.lines if "were saved in" in line).split(" saved in ")[1].split(";")[0]
    assert Path(rescued).parent == own_tmp
    (results / "filler").unlink()
    merged = subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", "merge", rescued, "--into", str(results)],
        capture_output=True,
        text=True,
    )
    assert merged.returncode == 0, merged.stderr
    df = pd.read_parquet(results / "data").set_index("model_id")
    assert sorted(df.index) == ["tiny-random/llama", "tiny-random/qwen3"]
    outcomes = set(df.result)
    assert "PASS" in outcomes  # the model that ran before the disk filled
    broken = df[df.result != "PASS"].iloc[0]
    assert (broken.result, broken.failure_stage) == ("ERROR", "harness")
    assert "No space left on device" in broken.error


#: Rows each writer merges in, one write at a time: enough for the eight to interleave throughout
#: (every write reads and rewrites the whole file under the lock).
ROWS_PER_WRITER = 30


def _writer(directory: str, w: int) -> None:
    for i in range(ROWS_PER_WRITER):
        write_rows(
            Path(directory),
            [
                Row(
                    model_id=f"org/w{w}-{i}",
                    result="PASS",
                    library_version="5.24.0",
                    tags=(f"writer-{w}",),
                    peak_host_rss_bytes=i,
                )
            ],
        )


def test_eight_concurrent_writer_processes_lose_and_corrupt_no_row(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), w)) for w in range(8)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(300)
        assert p.exitcode == 0
    df = pd.read_parquet(tmp_path / "data")
    assert len(df) == 8 * ROWS_PER_WRITER and df.model_id.is_unique
    for record in df.itertuples():
        w, i = record.model_id.removeprefix("org/w").split("-")
        assert list(record.tags) == [f"writer-{w}"] and record.peak_host_rss_bytes == int(i)


def test_unwritable_results_dir_fails_before_the_sweep(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        check_writable(blocker / "results")
