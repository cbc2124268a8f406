"""The public fixtures: a user's own test leases cores, runs a model on the device, and gets its row."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from faultkit import SITECUSTOMIZE, record_tree, recorded

from pytest_neuron_support.catalog.load import load_catalog
from pytest_neuron_support.data.dataset import read_dataset, write_rows
from pytest_neuron_support.data.records import SCHEMA_VERSION, Row
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.cores import SLICE_ENV, CorePool
from pytest_neuron_support.session.evidence import FIXTURES
from pytest_neuron_support.session.fixtures import MarkerError, model_from_marker
from pytest_neuron_support.session.handles import CoreLease, pinning_env

REPO = Path(__file__).resolve().parent.parent
QWEN3 = next(m for m in load_catalog(REPO / "models-tiny.yaml").models if m.id == "tiny-random/qwen3")

USER_TESTS = f"""
import os
import subprocess
import sys

import pytest

PROMPT = {QWEN3.prompt!r}


@pytest.mark.neuron_cores(2)
def test_my_process_on_two_cores(neuron_cores):
    code = "import os; print(os.environ.get('NEURON_SUPPORT_VISIBLE_CORES'))"
    env = {{**os.environ, **neuron_cores.env}}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    first, last = neuron_cores.cores[0], neuron_cores.cores[-1]
    assert len(neuron_cores.cores) == 2 and last == first + 1
    # The child is pinned to exactly the leased cores (on cpu through the slice variable alone).
    assert out.stdout.strip() == "%d-%d" % (first, last), out.stdout
    neuron_cores.release()
    assert neuron_cores.released


@pytest.mark.neuron_model("tiny-random/qwen3", prompt=PROMPT)
def test_qwen3_continues_the_fox(neuron_run, neuron_reference, neuron_judge):
    assert len(neuron_run.tokens) == 32 and neuron_run.tokens_again == neuron_run.tokens
    assert neuron_run.text.startswith(" the quick brown fox jumps over a lazy dog.")
    assert neuron_run.tokens == neuron_reference.tokens
    assert neuron_run.timings.compile_s > 0 and not neuron_reference.cached
    assert neuron_judge(neuron_run).fluent


@pytest.mark.neuron_cores(1)
def test_a_wrong_answer(neuron_cores):
    assert neuron_cores.count == 2, "planted: a test that fails"


@pytest.mark.neuron_cores(4)
def test_more_cores_than_the_pool(neuron_cores):
    raise AssertionError("never runs: the pool has 2 cores")
"""


#: Appended to faultkit's recorder: a process started as ``python <script>.py`` also keeps the bytes
#: of that script as they were on disk when it started (``<pid>-<start>.script`` beside its record),
#: i.e. the code that actually ran, whatever the harness wrote or kept afterwards.
KEEP_SCRIPT = """

def _keep_script():
    where = _os.environ.get("NEURON_SUPPORT_TEST_RECORD")
    argv = [a.decode(errors="replace") for a in open("/proc/self/cmdline", "rb").read().split(b"\\0") if a]
    scripts = [a for a in argv[1:2] if a.endswith(".py")]
    if not where or not scripts:
        return
    stat = open("/proc/self/stat").read()
    start = stat[stat.rindex(")") + 2:].split()[19]
    with open(_os.path.join(_os.getcwd(), scripts[0]), "rb") as handle:
        data = handle.read()
    tmp = _os.path.join(where, f".{_os.getpid()}.script.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
    _os.replace(tmp, _os.path.join(where, f"{_os.getpid()}-{start}.script"))

try:
    _keep_script()
except OSError:
    pass
"""


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.slow
def test_a_users_own_tests_lease_cores_check_a_tiny_model_and_get_rows_under_xdist(
    pytester: pytest.Pytester, offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_mine=USER_TESTS)
    record = tmp_path / "record"
    for name, value in record_tree(record, SITECUSTOMIZE + KEEP_SCRIPT).items():
        monkeypatch.setenv(name, value)
    result = pytester.runpytest_subprocess(
        "test_mine.py",
        "--device=cpu",
        "-n",
        "2",
        "--neuron-cores=2",
        "--results-dir=out",
        "--judge-model=tiny-random/judge",
        "--model-timeout=900",
        # The recorder sees a process as its interpreter starts: a warm start (the cpu device's one-rank run) forks one.
        "--cpu-side-starts=fresh",
        "-rs",
    )
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*neuron-support results*", "*2 PASS*", "Parquet: *out/data/*.parquet"])

    df = pd.read_parquet(pytester.path / "out" / "data").set_index("test")
    cores = df.loc["test_mine.py::test_my_process_on_two_cores"]
    assert (cores.model_id, cores.source, cores.result, cores.verdict_basis) == (
        "test_mine.py::test_my_process_on_two_cores",
        "test",
        "PASS",
        "test",
    )
    assert cores.neuron_cores == 2 and cores.first_core in (0, 1) and cores.lease_end > cores.lease_start
    assert pd.isna(cores.run_s)  # it ran no model

    qwen = df.loc["test_mine.py::test_qwen3_continues_the_fox"]
    assert (qwen.model_id, qwen.result, qwen.task, qwen.prompt) == (QWEN3.id, "PASS", "text-generation", QWEN3.prompt)
    assert (qwen.neuron_cores, qwen.tp_size, qwen.device, qwen.schema_version) == (1, 1, "cpu", SCHEMA_VERSION)
    assert len(qwen.tokens) == 32 and list(qwen.reference_tokens) == list(qwen.tokens)
    assert qwen.reference_match and qwen.matched_prefix == 32 and qwen.reference_cached == False  # noqa: E712
    assert qwen.text.startswith(" the quick brown fox") and qwen.graphs_compiled >= 1 and qwen.compile_s > 0
    assert (qwen.judge_model, qwen.judge_verdict) == ("tiny-random/judge", "fluent")
    workdir = pytester.path / "out" / "runs" / "tests" / "test_mine.py--test_qwen3_continues_the_fox" / "cpu"
    # The row's run.py is the one that ran: the bytes the device run's interpreter found on disk as it started.
    script = (workdir / "device" / "run.py").resolve()
    device_runs = [r for r in recorded(record) if [Path(a).resolve() for a in r.argv[1:2]] == [script]]
    assert len(device_runs) == 1, [(r.cwd, r.argv) for r in recorded(record)]
    ran = record / "procs" / f"{device_runs[0].pid}-{device_runs[0].start}.script"
    assert qwen.runscript == ran.read_text(encoding="utf-8")
    assert json.loads((workdir / "reference" / "result.json").read_text())["tokens"] == list(qwen.tokens)
    # The model's lease ended with its device run: the reference and the judge held no cores.
    assert qwen.lease_end - qwen.lease_start < qwen.run_s + 2.0

    wrong = df.loc["test_mine.py::test_a_wrong_answer"]
    assert (wrong.result, wrong.failure_stage, wrong.neuron_cores) == ("FAIL", "test", 1)
    assert "planted: a test that fails" in wrong.error
    skipped = df.loc["test_mine.py::test_more_cores_than_the_pool"]
    assert (skipped.result, skipped.failure_stage) == ("SKIPPED", "plan")
    assert "needs 4 cores but the pool has 2" in skipped.error and pd.isna(skipped.first_core)

    # A pool of 2: the 2-core lease and each 1-core lease never held a core at the same time.
    held = df[df.lease_start.notna()]
    two = held[held.neuron_cores == 2].iloc[0]
    for _, one in held[held.neuron_cores == 1].iterrows():
        assert one.lease_end <= two.lease_start or two.lease_end <= one.lease_start


def test_pytest_fixtures_lists_every_fixture_with_its_docstring(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--fixtures", "-v", "test_x.py")
    result.stdout.fnmatch_lines(
        [
            "*fixtures defined from pytest_neuron_support.session.fixtures*",
            "neuron_model -- *fixtures.py:*",
            "*The model spec (``catalog.ModelSpec``) this test checks.",
            "*From ``@pytest.mark.neuron_model(*",
            "neuron_cores -- *fixtures.py:*",
            "*An exclusive lease of N contiguous cores*",
            "*lease.env*pins a child*",
            "*released at teardown, or as*",
            "neuron_run -- *fixtures.py:*",
            "*run on the device under the test's lease*",
            "neuron_reference -- *fixtures.py:*",
            "*The CPU reference of the test's model spec*",
            "neuron_judge -- *fixtures.py:*",
            "*The fluency judge*",
        ]
    )
    listed = [name for name in FIXTURES if f"{name} -- " in result.stdout.str()]
    assert listed == list(FIXTURES)
    markers = pytester.runpytest_subprocess("--markers", "test_x.py")
    markers.stdout.fnmatch_lines(["@pytest.mark.neuron_cores(n):*", "@pytest.mark.neuron_model(id, *, prompt=*"])


def test_a_test_that_uses_no_neuron_fixture_gets_no_row(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(tmp_path):\n    assert tmp_path.is_dir()\n")
    result = pytester.runpytest_subprocess("test_x.py", "--device=cpu", "--results-dir=out")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists()


def test_a_bad_marker_is_an_error_that_says_what_to_write(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_x=(
            "import pytest\n"
            "@pytest.mark.neuron_model('org/x', dtype='int8')\n"
            "def test_x(neuron_model):\n    pass\n"
            "def test_y(neuron_model):\n    pass\n"
        )
    )
    result = pytester.runpytest_subprocess("test_x.py", "--device=cpu", "--results-dir=out")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*dtype='int8' is not allowed; use one of bfloat16, float16, float32*"])
    result.stdout.fnmatch_lines(["*mark the test with @pytest.mark.neuron_model('org/name'*"])
    rows = pd.read_parquet(pytester.path / "out" / "data").set_index("test")
    assert set(rows.result) == {"ERROR"} and set(rows.failure_stage) == {"test"}


def test_model_marker_fields_become_the_spec() -> None:
    spec = model_from_marker(("org/name",), {"prompt": "Hi", "dtype": "float32", "cores": 2, "revision": "v1"})
    assert (spec.id, spec.prompt, spec.dtype, spec.cores, spec.revision, spec.source) == (
        "org/name",
        "Hi",
        "float32",
        2,
        "v1",
        "test",
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "takes one model id"),
        (("org/a", "org/b"), {}, "takes one model id"),
        (("not a hub id",), {}, "not a Hub model id"),
        (("org/a",), {"temperature": 1}, "unknown field(s) temperature"),
        (("org/a",), {"task": "translation"}, "task='translation' is not allowed"),
        (("org/a",), {"cores": 3}, "field 'cores': not an allowed core count (got 3); use one of 1, 2, 4, 8, 16"),
        (("org/a",), {"prompt": "  "}, "must be non-empty text"),
    ],
)
def test_bad_model_markers_say_what_is_wrong(args: tuple[str, ...], kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(MarkerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model_from_marker(args, kwargs)


def test_the_pinning_environment_names_the_leased_cores_on_every_device() -> None:
    assert pinning_env(DEVICES["cpu"], 2, 2) == {SLICE_ENV: "2-3"}
    assert pinning_env(DEVICES["neuron"], 8, 2) == {SLICE_ENV: "8-9", "NEURON_RT_VISIBLE_CORES": "8-9"}
    assert pinning_env(DEVICES["cuda"], 1, 3) == {SLICE_ENV: "1-3", "CUDA_VISIBLE_DEVICES": "1,2,3"}
    assert pinning_env(DEVICES["neuron"], 5, 1) == {SLICE_ENV: "5", "NEURON_RT_VISIBLE_CORES": "5"}


def test_a_lease_is_exclusive_until_released_and_release_is_idempotent(tmp_path: Path) -> None:
    pool = CorePool(tmp_path, 2, device="cpu")
    lease = CoreLease(pool, pool.acquire(2, holder="me"), DEVICES["cpu"])
    assert lease.cores == (0, 1) and dict(lease.env) == {SLICE_ENV: "0-1"}
    assert pool.try_acquire(1, holder="other") is None  # held: nobody else gets a core of it
    with lease:
        pass  # leaving the block releases it, as release() does
    assert lease.released and pool.leases() == []
    lease.release()  # a second release (teardown after the test's own) hands back nothing else
    other = pool.try_acquire(1, holder="other")
    assert other is not None and pool.leases() == [other]


def test_a_users_test_row_is_a_row_of_its_own(tmp_path: Path) -> None:
    catalog = Row(model_id="org/m", result="PASS", library_version="5", timestamp="1")
    mine = Row(model_id="org/m", result="FAIL", library_version="5", test="t.py::test_m", source="test")
    write_rows(tmp_path, [catalog, mine])
    write_rows(tmp_path, [Row(model_id="org/m", result="ERROR", library_version="5", test="t.py::test_m")])
    rows = {row.test: row.result for row in read_dataset(tmp_path)}
    assert rows == {"": "PASS", "t.py::test_m": "ERROR"}  # the rerun replaced the test's row, not the catalog's


def test_old_rows_without_a_test_column_read_as_catalog_rows() -> None:
    old = json.loads(Row(model_id="org/m", result="PASS").to_json())
    del old["test"]
    assert Row.from_mapping(old).test == ""


def test_indirect_model_ids_and_remote_code_rows(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_x=(
            "import pytest\n"
            "@pytest.mark.parametrize('neuron_model', ['org/a', 'org/b'], indirect=True)\n"
            "def test_ids(neuron_model):\n"
            "    assert neuron_model.id in ('org/a', 'org/b') and neuron_model.source == 'test'\n"
            "@pytest.mark.neuron_model('org/remote', trust_remote_code=True)\n"
            "def test_remote(neuron_model):\n"
            "    raise AssertionError('never runs without --allow-remote-code')\n"
        )
    )
    result = pytester.runpytest_subprocess("test_x.py", "--device=cpu", "--results-dir=out", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*remote code not allowed: pass --allow-remote-code*"])
    rows = pd.read_parquet(pytester.path / "out" / "data").set_index("test")
    assert rows.loc["test_x.py::test_ids[org/a]", "model_id"] == "org/a"
    assert rows.loc["test_x.py::test_ids[org/b]", "model_id"] == "org/b"
    remote = rows.loc["test_x.py::test_remote"]
    assert (remote.model_id, remote.result, remote.exclude_reason) == ("org/remote", "EXCLUDED", "remote-code")


def test_a_users_test_beside_a_catalog_sweep_gets_its_row_from_the_sweeps_writer(pytester: pytest.Pytester) -> None:
    pytester.makefile(
        ".yaml",
        models="models:\n  - id: org/big\n    task: text-generation\n    exclude: {reason: too-large, note: huge}\n",
    )
    pytester.makepyfile(test_x="def test_lease(neuron_cores):\n    assert neuron_cores.count == 1\n")
    result = pytester.runpytest_subprocess("models.yaml", "test_x.py", "--device=cpu", "--results-dir=out")
    result.assert_outcomes(passed=1, skipped=1)
    rows = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    assert rows.loc["org/big", "test"] == "" and rows.loc["org/big", "result"] == "EXCLUDED"
    mine = rows.loc["test_x.py::test_lease"]
    assert (mine.test, mine.result, mine.neuron_cores, mine.first_core) == ("test_x.py::test_lease", "PASS", 1, 0)


def test_the_run_keeps_the_lease_only_for_a_test_that_takes_it_itself() -> None:
    from types import SimpleNamespace

    from pytest_neuron_support.session.fixtures import _asks_for_lease

    def holds(neuron_run: object, neuron_cores: object) -> None: ...
    def runs(neuron_run: object) -> None: ...

    assert _asks_for_lease(SimpleNamespace(function=holds))  # type: ignore[arg-type]
    assert not _asks_for_lease(SimpleNamespace(function=runs))  # type: ignore[arg-type]
