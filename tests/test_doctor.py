"""``neuron-support doctor`` as users run it: real subprocesses on this (CPU-only) machine, no mocks.

The cpu row passes, with every check the table rules out reported N/A and why; the failure paths that
can be shown honestly without Trainium fail where they should: a device that is not there (cuda), a
compile cache that cannot be written, an unreadable slice, a missing or unreadable owners listing, a
missing compiler, and cores that turn out not to be exclusive. And the package keeps each check in one
place: its module (row and runner) and its scripts, real files that render standalone and lint clean.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import json
import os
import pkgutil
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

import pytest_neuron_support.doctor
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.doctor.command import run_doctor
from pytest_neuron_support.doctor.registry import CHECKS
from pytest_neuron_support.doctor.render import common_parts, render, script_names, script_source
from pytest_neuron_support.doctor.report import FAIL, NA, NOT_RUN, OK

REPO = Path(__file__).resolve().parent.parent
DOCTOR = Path(pytest_neuron_support.doctor.__file__).parent
KEYS = [c.key for c in CHECKS]
#: What the cpu row of the device table rules out, and the field that says so.
CPU_NOT_APPLICABLE = {
    "owners": "owners_command is None",
    "memory": "memory_module is None",
    "exclusive": "not exclusive by the table",
    "compiler": "compiler_version_expr is None",
    "fallback-ops": "fallback_ops_expr is None",
    "core-ids": "owners_command is None",
}
#: Checks that need a device: with none there they must say NOT RUN, never OK.
DEVICE_CHECKS = ["slice", "bf16", "two-processes", "compile", "compile-cache", "process-group", "generation"]


@pytest.fixture(autouse=True)
def _work_dirs_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor keeps its work directory when a check fails (for reading the logs): put those of these
    tests, in this process and in the doctor subprocesses, under pytest's tmp_path instead of /tmp."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def doctor(*args: str, env: Mapping[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.doctor", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def rows(path: Path) -> dict[str, dict[str, Any]]:
    report = json.loads(path.read_text())
    return {c["key"]: c for c in report["checks"]}


def test_cpu_passes_every_check_that_applies_and_says_why_the_rest_do_not(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = doctor("--device", "cpu", "--json", str(out), "--timeout", "900")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = proc.stdout.split("\n\n", 1)[1]  # after the progress lines
    for check in CHECKS:
        assert f"{check.key}: {check.name.split()[0]}" in table, check.name  # named by key, never by number
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "doctor: 9 OK, 0 FAIL, 6 N/A on cpu", lines[-1]

    report = json.loads(out.read_text())
    assert report["passed"] is True and report["device"] == "cpu"
    assert report["versions"]["torch"].startswith("2.") and report["timestamp"]
    assert [c["key"] for c in report["checks"]] == KEYS
    assert all("number" not in c for c in report["checks"])
    found = {c["key"]: c for c in report["checks"]}
    for key, why in CPU_NOT_APPLICABLE.items():
        assert found[key]["status"] == NA, found[key]
        assert found[key]["found"].startswith("does not apply: ") and why in found[key]["found"], found[key]
    assert all(found[k]["status"] == OK for k in KEYS if k not in CPU_NOT_APPLICABLE), found
    # The rows say what they saw, not just OK.
    assert "sum [3.0]" in found["process-group"]["found"] and "gloo" in found["process-group"]["found"]
    assert "4 token(s)" in found["generation"]["found"] and "repeat identical" in found["generation"]["found"]
    assert "TORCHINDUCTOR_CACHE_DIR=" in found["compile-cache"]["found"]
    assert "both held at once" in found["two-processes"]["found"]
    # Everything passed: the work directory went with it.
    assert not Path(report["work_dir"]).exists()


def test_cuda_without_a_gpu_fails_at_the_device_and_runs_nothing_that_needs_one(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = doctor("--device", "cuda", "--json", str(out), "--timeout", "300")
    found = rows(out)
    if found["device"]["status"] == OK:
        pytest.skip("this machine has a GPU")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert found["imports"]["status"] == OK
    device = found["device"]
    assert device["status"] == FAIL
    assert device["found"].startswith("no cuda device visible to torch") and "torch.cuda" in device["found"]
    for key in DEVICE_CHECKS:
        assert found[key]["status"] == NOT_RUN, found[key]
        assert found[key]["found"] == "not run: needs `device` (device available, core count), which is FAIL"
    # What the cuda row rules out is still N/A by the table, not NOT RUN: cuda shares a GPU.
    assert found["exclusive"]["status"] == NA and "CUDA_VISIBLE_DEVICES" in found["exclusive"]["found"]
    assert json.loads(out.read_text())["passed"] is False
    assert proc.stdout.strip().splitlines()[-1] == "doctor: 1 OK, 1 FAIL, 5 N/A, 8 NOT RUN on cuda"
    assert "scripts and logs of the checks: " in proc.stdout


@contextlib.contextmanager
def read_only_directory(path: Path) -> Iterator[Path]:
    """A directory nobody can write to: mode 0555, and immutable where this runs as root (root ignores
    the mode)."""
    path.mkdir()
    path.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    immutable = False
    if os.access(path, os.W_OK):
        immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode == 0
        if not immutable:
            pytest.skip("cannot make a directory read-only for this user (root without chattr)")
    try:
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        path.chmod(0o755)


def test_an_unwritable_compile_cache_fails_that_check(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    with read_only_directory(tmp_path / "cache") as cache:
        kind = DEVICES["cpu"]
        proc = doctor(
            "--device", "cpu", "--only", "compile-cache", "--json", str(out), env={kind.compile_cache_env: str(cache)}
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = rows(out)
    assert list(found) == ["imports", "device", "slice", "compile-cache"]  # the check and what it needs
    assert [found[k]["status"] for k in ("imports", "device", "slice")] == [OK, OK, OK]
    cache_row = found["compile-cache"]
    assert cache_row["status"] == FAIL
    assert f"TORCHINDUCTOR_CACHE_DIR={cache}: not writable: PermissionError" in cache_row["found"], cache_row


def test_an_unreadable_slice_fails_and_stops_the_device_checks(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = doctor("--device", "cpu", "--only", "bf16", "--json", str(out), env={"NEURON_SUPPORT_VISIBLE_CORES": "5-2"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = rows(out)
    assert found["slice"]["status"] == FAIL and "runs backwards" in found["slice"]["found"]
    assert found["bf16"]["status"] == NOT_RUN and "needs `slice` (" in found["bf16"]["found"]


def fake_owners_command(tmp_path: Path, listing: object, exit_status: int = 0) -> tuple[str, ...]:
    """A stand-in for ``neuron-ls -j``: a real executable that prints ``listing`` as JSON."""
    script = tmp_path / "fake-neuron-ls"
    text = listing if isinstance(listing, str) else json.dumps(listing)
    script.write_text(f"#!{sys.executable}\nimport sys\nprint({text!r})\nsys.exit({exit_status})\n")
    script.chmod(0o755)
    return (str(script), "-j")


#: The layout torchneuron.md documents for ``neuron-ls -j`` (and cores.core_owners reads).
LISTING = [
    {
        "neuron_device": 0,
        "nc_count": 2,
        "memory_size": 103079215104,
        "neuroncore_ids": [0, 1],
        "neuron_processes": [{"pid": 4242, "command": "python other.py"}],
    },
    {"neuron_device": 1, "nc_count": 2, "memory_size": 103079215104, "neuroncore_ids": [2, 3]},
]


def owners_row(tmp_path: Path, command: Sequence[str]) -> dict[str, Any]:
    kind = dataclasses.replace(DEVICES["cpu"], owners_command=tuple(command))
    report = run_doctor(kind, only={"owners"}, timeout=60)
    assert [c.key for c in report.checks] == ["owners"]  # it needs nothing else
    return dataclasses.asdict(report.checks[0])


def test_owners_listing_in_the_documented_layout_is_read(tmp_path: Path) -> None:
    row = owners_row(tmp_path, fake_owners_command(tmp_path, LISTING))
    assert row["status"] == OK, row
    assert "2 device(s), 4 core(s) listed" in row["found"] and "held: 0: pid 4242, 1: pid 4242" in row["found"]


@pytest.mark.parametrize(
    ("listing", "exit_status", "says"),
    [
        ({"devices": []}, 0, "without 'neuron_devices'"),
        ([{"neuron_device": 0}], 0, "names no cores"),
        ([{"nc_count": 2, "neuron_processes": [{"process": "x"}]}], 0, "integer 'pid'"),
        ("Neuron devices: 2 (table)", 0, "printed no JSON"),
        ("", 2, "exited 2"),
    ],
)
def test_an_unreadable_owners_listing_fails(tmp_path: Path, listing: object, exit_status: int, says: str) -> None:
    row = owners_row(tmp_path, fake_owners_command(tmp_path, listing, exit_status))
    assert row["status"] == FAIL and says in row["found"], row


def test_a_missing_owners_command_fails(tmp_path: Path) -> None:
    row = owners_row(tmp_path, ("neuron-ls-not-installed-here", "-j"))
    assert row["status"] == FAIL and "not found on PATH" in row["found"], row


def test_compiler_version_keeps_its_label_and_maps_to_the_bucket_prefix() -> None:
    kind = dataclasses.replace(DEVICES["cpu"], compiler_version_expr="'2.15.128.0+56dc5a86'")
    (row,) = run_doctor(kind, only={"compiler"}, timeout=60).checks
    assert row.status == OK, row
    assert row.found == (
        "2.15.128.0+56dc5a86; bucket prefix hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-2.15.128.0+56dc5a86"
    )


def test_a_missing_compiler_fails_with_its_error() -> None:
    (row,) = run_doctor(DEVICES["neuron"], only={"compiler"}, timeout=60).checks
    assert row.status == FAIL and "ModuleNotFoundError" in row.found and "neuronxcc" in row.found, row


def test_cores_that_are_not_exclusive_fail_the_exclusivity_check_on_a_free_core(tmp_path: Path) -> None:
    # A kind that claims exclusive cores (a pinning variable and an owners listing) on what is really the
    # cpu: the second process on the first one's core succeeds, which the check must call a failure. The
    # cores the listing says another process holds (0 and 1) are avoided: the check pins core 2.
    kind = dataclasses.replace(
        DEVICES["cpu"],
        core_env_var="NEURON_SUPPORT_TEST_CORES",
        core_env_contiguous=True,
        owners_command=fake_owners_command(tmp_path, LISTING),
    )
    report = run_doctor(kind, only={"owners", "exclusive"}, timeout=300)
    found = {c.key: c for c in report.checks}
    assert found["owners"].status == OK
    row = found["exclusive"]
    assert row.status == FAIL, row
    assert "NEURON_SUPPORT_TEST_CORES=2" in row.found and "cores are not exclusive" in row.found, row
    assert not report.passed and Path(report.work_dir).is_dir()  # kept for reading the logs
    assert (Path(report.work_dir) / "01-imports.py").is_file()


def test_unknown_check_names_are_refused() -> None:
    proc = doctor("--device", "cpu", "--only", "nonsense")
    assert proc.returncode == 2 and "invalid choice: 'nonsense'" in proc.stderr


def test_the_workflow_runs_the_doctor_before_the_sweep() -> None:
    flow = yaml.safe_load((REPO / ".github" / "workflows" / "model-support.yml").read_text())
    steps = [step.get("run", "") for step in flow["jobs"]["sweep"]["steps"]]
    doctor_step = next(i for i, run in enumerate(steps) if "neuron-support doctor" in run)
    sweep_step = next(i for i, run in enumerate(steps) if "pytest --device=neuron" in run)
    pull_step = next(i for i, run in enumerate(steps) if "neuron-support neff pull" in run)
    assert doctor_step < pull_step < sweep_step
    assert "--device neuron" in steps[doctor_step] and "--json results/doctor.json" in steps[doctor_step]


def test_the_cli_runs_the_doctor() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("neuron-support")), "doctor", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "--device" in proc.stdout and "--json" in proc.stdout


def test_the_doctor_process_imports_neither_torch_nor_transformers() -> None:
    # Everything that touches the device runs in the checks' subprocesses; the modules the doctor uses
    # (lazily, too) must not drag torch in (on neuron, torch autoloads torch-neuronx).
    code = (
        "import importlib, pkgutil, sys\n"
        "import pytest_neuron_support.doctor, pytest_neuron_support.run.execution\n"
        "import pytest_neuron_support.run.runscript, pytest_neuron_support.run.neffcache\n"
        # Every module of the package, the checks' included (__main__ would run the doctor).
        "for m in pkgutil.walk_packages(pytest_neuron_support.doctor.__path__, 'pytest_neuron_support.doctor.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'torch_neuronx') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_no_doctor_module_imports_the_viewer() -> None:
    # The doctor checks a host; the viewer renders datasets. What both need (the NEFF-cache sync command)
    # lives below them (run/neffcache.py), so the arrows point one way.
    package = Path(pytest_neuron_support.doctor.__file__).parent
    importers = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(name.startswith("pytest_neuron_support.viewer") for name in names):
                importers.append(path.relative_to(package).as_posix())
    assert importers == []


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.usefixtures("shared_references")
@pytest.mark.slow
def test_rows_record_the_self_check_the_session_found_with_its_results(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    from faultkit import catalog

    out = pytester.path / "out"
    proc = doctor("--device", "cpu", "--only", "bf16", "--json", str(out / "doctor.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pytester.makefile(".yaml", models=catalog("tiny-random/qwen3"))
    pytester.runpytest_subprocess("--device=cpu", f"--results-dir={out}").assert_outcomes(passed=1)
    row = pd.read_parquet(out / "data").iloc[0]
    assert row.self_check.startswith("passed: doctor: ") and " on cpu at 20" in row.self_check, row.self_check
    # A report of another device says nothing about this one.
    report = json.loads((out / "doctor.json").read_text())
    (out / "doctor.json").write_text(json.dumps({**report, "device": "neuron"}))
    pytester.runpytest_subprocess("--device=cpu", f"--results-dir={out}").assert_outcomes(passed=1)
    assert pd.isna(pd.read_parquet(out / "data").iloc[0].self_check)


def test_the_device_check_counts_neuron_cores_without_reading_unpinned_properties(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The doctor's `device` check used to read get_device_properties(0) unpinned: nrt_init over every core
    # of the host.
    from test_devices import calls, fake_torch

    from pytest_neuron_support.doctor.check import Doctor
    from pytest_neuron_support.doctor.checks import device

    log = fake_torch(tmp_path, monkeypatch)
    doctor = Doctor(DEVICES["neuron"], timeout=120, work_dir=tmp_path, environ=dict(os.environ))
    found, passed = device.run(doctor)
    assert passed and found.startswith("64 reported"), found
    assert "the `memory` check reads" in found and "24.0 GiB (LNC table)" in found, found
    assert [c for c in calls(log) if c["call"] == "get_device_properties"] == [], calls(log)


def test_a_doctor_process_gets_the_rows_one_rank_variables_only_on_one_core_and_the_users_win(tmp_path: Path) -> None:
    # The cpu row's C++ wrapper cannot compile a sharded graph: a process over two cores (two ranks) must not get it.
    from pytest_neuron_support.doctor.check import Doctor

    doctor = Doctor(DEVICES["cpu"], timeout=120, work_dir=tmp_path, environ={"HOME": "/h"})
    one, two = doctor.device_env([0]), doctor.device_env([0, 1])
    assert one["TORCHINDUCTOR_CPP_WRAPPER"] == "1" and "TORCHINDUCTOR_CPP_WRAPPER" not in two
    assert one["TORCHINDUCTOR_VEC_ISA_OK"] == two["TORCHINDUCTOR_VEC_ISA_OK"] == "1"
    own = Doctor(DEVICES["cpu"], timeout=120, work_dir=tmp_path, environ={"TORCHINDUCTOR_CPP_WRAPPER": "0"})
    assert own.device_env([0])["TORCHINDUCTOR_CPP_WRAPPER"] == "0"


def test_a_wheel_without_the_cache_stats_api_generates_with_unknown_counters_and_the_doctor_says_so() -> None:
    # The issue: the stats call is a private _C._ binding; where a wheel lacks it, run.py raised
    # AttributeError before its first stage and every row was an ERROR at `load`.
    kind = dataclasses.replace(DEVICES["cpu"], cache_stats_expr="torch._C._no_such_compilation_cache_stats()")
    report = run_doctor(kind, timeout=900, only=["compile-cache", "generation"])
    by_key = {c.key: c for c in report.checks}
    generation, cache = by_key["generation"], by_key["compile-cache"]
    assert generation.status == OK, generation.found
    assert "persistent cache counters unknown (AttributeError" in generation.found, generation.found
    assert cache.status == OK and "counters UNAVAILABLE on this wheel" in cache.found, cache.found
    assert "_no_such_compilation_cache_stats" in cache.found, cache.found


def trn2_listing(chips: int, cores_per_chip: int, held: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """``neuron-ls -j`` as a trn2 host prints it: one entry per chip (96 GiB of HBM), its cores' ids."""
    listing = []
    for chip in range(chips):
        ids = list(range(chip * cores_per_chip, (chip + 1) * cores_per_chip))
        device: dict[str, Any] = {
            "neuron_device": chip,
            "bdf": f"{0xCC + chip:02x}:00.0",
            "nc_count": cores_per_chip,
            "memory_size": 103079215104,
            "neuroncore_ids": ids,
        }
        if held and chip in held:
            device["neuron_processes"] = [{"pid": held[chip], "command": "python run.py"}]
        listing.append(device)
    return listing


@pytest.mark.parametrize(
    ("lnc", "listing", "count", "pool", "pinned", "passed", "says"),
    [
        # LNC=1: 8 cores a chip, to the runtime and to neuron-ls alike.
        (1, trn2_listing(2, 8), 16, tuple(range(16)), None, True, "consistent"),
        # LNC=2: 4 logical cores a chip, and neuron-ls lists logical ids too.
        (2, trn2_listing(2, 4), 8, tuple(range(8)), None, True, "consistent"),
        # A session given a slice: the runtime sees the slice, the listing the host.
        (2, trn2_listing(4, 4), 8, tuple(range(8, 16)), "NEURON_RT_VISIBLE_CORES=8-15", True, "consistent"),
        # LNC=2, but neuron-ls numbers the 8 physical cores a chip: owners would land on the wrong ids.
        (2, trn2_listing(2, 8), 8, tuple(range(8)), None, False, "PHYSICAL cores (16 = 8 logical x LNC 2)"),
        (1, trn2_listing(2, 8), 12, tuple(range(12)), None, False, "16 listed != 12 visible"),
        (2, trn2_listing(2, 4), 4, tuple(range(8, 12)), "NEURON_RT_VISIBLE_CORES=8-11", False, "8-11 are not listed"),
        # The session's own slice narrower than the runtime's variable: the runtime counts what its variable
        # names, and that is consistent.
        (2, trn2_listing(4, 4), 8, tuple(range(8, 12)), "NEURON_RT_VISIBLE_CORES=8-15", True, "consistent"),
        (2, trn2_listing(4, 4), 4, tuple(range(8, 12)), "NEURON_RT_VISIBLE_CORES=8-15", False, "which names 8 core(s)"),
    ],
)
def test_neuron_ls_core_ids_are_cross_checked_against_the_numbering_the_pinning_uses(
    lnc: int,
    listing: list[dict[str, Any]],
    count: int,
    pool: tuple[int, ...],
    pinned: str | None,
    passed: bool,
    says: str,
) -> None:
    from pytest_neuron_support.doctor.checks.core_ids import core_numbering

    found, ok = core_numbering(listing, count, pool, pinned, lnc)
    assert ok is passed and says in found, found
    assert f"device_count() = {count}" in found and f"LNC={lnc}" in found


def test_the_core_id_check_runs_after_the_owners_listing_and_fails_with_the_numbers(tmp_path: Path) -> None:
    # The listing numbers twice the cores the runtime counts, at LNC=2: physical ids where logical are pinned.
    logical = os.cpu_count() or 1  # what the cpu row's count_expr reports in the doctor's probe
    command = fake_owners_command(tmp_path, trn2_listing(1, 2 * logical))
    kind = dataclasses.replace(DEVICES["cpu"], owners_command=command, max_pool=None)
    environ = {**os.environ, "NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_SUPPORT_VISIBLE_CORES": "0"}
    report = run_doctor(kind, only={"core-ids"}, timeout=120, environ=environ)
    row = {c.key: c for c in report.checks}["core-ids"]
    assert row.status == FAIL and "MISMATCH" in row.found, row
    assert f"neuron-ls numbers PHYSICAL cores ({2 * logical} = {logical} logical x LNC 2)" in row.found, row


def check_module(key: str) -> Any:
    return importlib.import_module(f"pytest_neuron_support.doctor.checks.{key.replace('-', '_')}")


def started_scripts(module: Any) -> set[str]:
    """The scripts a check module's runner starts: the second argument of its ``doctor.run(...)`` and
    ``doctor.start(...)`` calls (label, script, args, env)."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    return {
        call.args[1].value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("run", "start")
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "doctor"
        and isinstance(call.args[1], ast.Constant)
    }


def test_each_check_is_one_module_with_its_row_its_runner_and_its_scripts() -> None:
    # One room: a new check is a module under checks/ (and scripts under scripts/) plus its place in the
    # registry. The registry lists every check module, once, and nothing else.
    modules = sorted(m.name for m in pkgutil.iter_modules([str(DOCTOR / "checks")]))
    assert modules == sorted(key.replace("-", "_") for key in KEYS)
    assert len(set(KEYS)) == len(KEYS)
    earlier: set[str] = set()
    for check in CHECKS:
        module = check_module(check.key)
        assert module.CHECK is check, check.key
        # Its row's texts and its runner are the module's own, not another's.
        assert check.run.__module__ == module.__name__ and check.expected.__module__ == module.__name__, check.key
        # The scripts its runner starts are the ones its row names, and they ship with the package.
        assert started_scripts(module) == set(check.scripts), check.key
        assert all((DOCTOR / "scripts" / f"{name}.py").is_file() for name in check.scripts), check.key
        # What it needs runs before it (run_doctor reads their results).
        assert set(check.needs) <= earlier, check.key
        earlier.add(check.key)
    # Every script belongs to a check: none is left over.
    assert sorted({name for check in CHECKS for name in check.scripts}) == list(script_names())


def test_no_script_is_a_string_and_no_check_is_named_by_number() -> None:
    # The scripts are files ruff reads; a program kept in a string constant of the package would not be.
    for path in sorted(DOCTOR.rglob("*.py")):
        if "scripts" in path.relative_to(DOCTOR).parts:
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                program = re.search(r"^\s*(def \w+\(|import \w+$|from \S+ import \w)", node.value, re.M)
                assert not ("\n" in node.value and program), (path, node.value[:200])
        assert not re.search(r"\bchecks? \d", text), path  # checks are named by key


def test_every_script_renders_into_a_standalone_program_that_lints_clean(tmp_path: Path) -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists() and shutil.which(ruff) is None:
        pytest.skip("ruff is not installed (it is in the test extra)")
    # The files as they ship: ruff with the repository's configuration.
    lint = subprocess.run([ruff, "check", str(DOCTOR / "scripts")], capture_output=True, text=True, cwd=REPO)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    for name in script_names():
        source = render(name, {"device": "cpu", "memory_module": None, "core_env_var": None}, file=f"01-{name}.py")
        assert "@@" not in source and "from harness import" not in source and "from common import" not in source
        assert "python3 01-" in source and "SPEC = {'device': 'cpu'" in source, name
        compile(source, name, "exec")
        (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
    # The programs as they run: every name they use defined (the splice brought what common.py's code
    # needs), nothing defined or imported twice (common.py's rank_entry must not replace a check's own).
    lint = subprocess.run(
        [ruff, "check", "--isolated", "--select", "F", "--output-format", "concise", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_scripts_run_run_pys_own_code_from_templates_common() -> None:
    # The process-group check's launcher is common.py's spawn_ranks and join_process_group, verbatim,
    # with the constants they use; its own rank_entry stays the one spawn_ranks starts.
    from pytest_neuron_support.run.runscript import template

    common = template("common.py")
    launcher = common_parts(("join_process_group", "spawn_ranks"), defined={"rank_entry"})
    for name in ("join_process_group", "spawn_ranks", "RENDEZVOUS_TIMEOUT_S"):
        node = next(n for n in ast.parse(common).body if name in {getattr(n, "name", None), *_targets(n)})
        assert str(ast.get_source_segment(common, node)) in launcher, name
    assert "def rank_entry" not in launcher and "def rank_core" not in launcher
    rendered = render("process_group", {"device": "cpu"}, file="13-process-group.py")
    assert rendered.count("def rank_entry(") == 1 and rendered.count("def spawn_ranks(") == 1
    # A rank enters as run.py's do (its environment, its own core, the root-communication port): one copy.
    assert rendered.count("def enter_rank(") == 1 and rendered.count("LOCAL_WORLD_SIZE=str(world)") == 1
    assert "enter_rank(" in script_source("process_group") and "os.environ.update(" not in script_source(
        "process_group"
    )
    assert "def end_with_parent(" in rendered and "def write_json(" in rendered  # through the harness
    assert "from common import" in script_source("process_group")  # the file names what it takes
    with pytest.raises(ValueError, match="defines no no_such_part"):
        common_parts(("no_such_part",))


def _targets(node: ast.stmt) -> list[str]:
    return [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
