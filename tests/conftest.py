"""Shared fixtures: the tiny zoo (built once per machine), pytester, and environment hygiene."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub.constants  # noqa: F401  (first, with the environment still clean: see below)

# pandas registers its Arrow extension types with pyarrow on first use. pytester restores
# sys.modules after each test, so a first use inside a pytester test would be forgotten and the
# next Parquet read would register them again ("type extension ... already defined"). Register
# them once, here, before any test runs.
import pandas.core.arrays.arrow.extension_types  # noqa: F401
import pytest
from faultkit import TAG_VAR, kill_own_processes
from filelock import FileLock

from pytest_neuron_support import zoo
from pytest_neuron_support.planning.planner import CONFIG_CACHE_ENV
from pytest_neuron_support.run.threads import usable_cpus

# This worker's own torch work (the zoo checks, in-process judges) and the run.py processes tests start
# directly (run_script with os.environ) share the CPUs with the other xdist workers: one worker's
# share of intra-op threads, as the plugin's --cpu-threads=auto gives each of its runs
# (run.threads.cpu_threads says what an oversubscribed pool costs). Set before torch is imported here.
# The xdist controller imports this file first and its workers inherit its environment: the mark
# tells a worker the value is this file's (to be set again for the worker count), not the user's.
# The sessions the tests start (pytester) do not inherit it: there the plugin decides (below).
_OMP_MARK = "NEURON_SUPPORT_TESTS_OMP"
_OWN_OMP = "OMP_NUM_THREADS" not in os.environ or os.environ.get(_OMP_MARK) == "1"
if _OWN_OMP:
    os.environ[_OMP_MARK] = "1"
    os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cpus() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


@pytest.fixture(autouse=True)
def _offline_subprocesses(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub reads HF_HUB_OFFLINE once, when its constants are imported (above, with a
    clean environment): this process stays online for the loopback Hub API tests, while every
    subprocess a test starts (pytester runs, run.py) is offline, so a model missing from the
    cache fails at once instead of retrying DNS for minutes. Tests that talk to the loopback Hub
    from a subprocess set HF_HUB_OFFLINE=0 themselves."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _sessions_pick_their_cpu_threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest sessions a test starts choose their runs' CPU threads themselves (--cpu-threads=auto),
    as on a user's machine, instead of inheriting this worker's OMP_NUM_THREADS (set above)."""
    if _OWN_OMP and "pytester" in request.fixturenames:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.delenv(_OMP_MARK, raising=False)


@pytest.fixture(autouse=True)
def _own_core_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's sessions lease from a ledger of their own: the default one is host-wide, and the
    tests that run side by side (-n 2) would otherwise share it (a test that shares one on purpose
    gives its sessions the same directory)."""
    ledger = tmp_path_factory.mktemp("core-ledger")
    monkeypatch.setenv("NEURON_SUPPORT_CORE_LEDGER", str(ledger))
    return ledger


pytest_plugins = ["pytester", "librarykeeper", "cpuclock"]

REPO = Path(__file__).resolve().parent.parent


def zoo_home() -> Path:
    """Where the tiny zoo is built: keyed by its fingerprint so a changed definition rebuilds."""
    base = Path(os.environ.get("NEURON_SUPPORT_ZOO_HOME", Path.home() / ".cache" / "neuron-support"))
    return base / f"zoo-{zoo.zoo_fingerprint()}"


@pytest.fixture(scope="session")
def tiny_zoo_cache() -> Path:
    """A Hugging Face hub cache holding every tiny-zoo checkpoint (built once, xdist-safe)."""
    home = zoo_home()
    home.mkdir(parents=True, exist_ok=True)
    cache = home / "hub"
    with FileLock(str(home / ".build.lock")):
        zoo.build_zoo(cache)
    return cache


@pytest.fixture
def offline_hub(tiny_zoo_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Environment for subprocesses: the zoo cache, offline (no DNS retries), no tokens."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tiny_zoo_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    yield tiny_zoo_cache


@pytest.fixture(scope="session")
def _suite_reference_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache home for the whole test run, shared by its xdist workers: each worker's basetemp
    is ``<run's basetemp>/popen-gwN``, so the run's own basetemp is their common parent (and a new
    run starts from an empty one)."""
    base = tmp_path_factory.getbasetemp()
    home = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-cache-home"
    home.mkdir(exist_ok=True)
    return home


@pytest.fixture(autouse=True)
def _shared_config_facts(_suite_reference_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every session the tests start keeps transformers' reading of a config in one folder for the
    whole run, as sessions on a user's machine share ``~/.cache`` (pytester gives each test a HOME of
    its own). An entry is keyed by the whole config and the transformers version
    (``planning.config_facts``), so a hit is what reading would give; the tests of that cache give
    it folders of their own."""
    monkeypatch.setenv(CONFIG_CACHE_ENV, str(_suite_reference_home / "config-facts"))


@pytest.fixture
def shared_references(_suite_reference_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sessions this test starts keep their CPU references in one cache shared with every other
    test that asks for this fixture, as sessions on a user's machine share ``~/.cache`` (pytester
    gives each test a HOME of its own, so by default each would rerun every reference).

    ``NEURON_SUPPORT_CACHE`` is the plugin's cache home: ``--reference-cache`` defaults to its
    ``reference`` folder. A reference is keyed by everything that shapes it (model commit, prompt,
    tokens, dtype, versions: ``caches.reference_key``), so a hit is the very result a run would give.
    Only for tests that check something other than the reference run itself: a test that reads
    ``runs/.../reference`` or asserts ``reference_cached`` must not ask for it (it would hit or
    miss depending on which tests ran before it)."""
    monkeypatch.setenv("NEURON_SUPPORT_CACHE", str(_suite_reference_home))
    return _suite_reference_home / "reference"


#: anyio's pytest plugin (anyio comes with huggingface_hub's HTTP client) loads in every pytest process
#: and, at import, its event-loop backends: trio (which selenium brings) and asyncio. No session a test
#: starts has an async test, and that import is about a third of such a process's start (0.3 s of CPU
#: measured, against 0.6 s for the rest of pytest and the plugin); the suite starts about 500 of them
#: (the sessions and their xdist workers).
SESSION_OPTIONS = "-p no:anyio"


def _add_session_options(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, options: str) -> None:
    """Adds ``options`` to ``PYTEST_ADDOPTS`` for the pytest sessions this test starts (pytester's,
    Popen's, and their xdist workers, which inherit it)."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # pytester clears PYTEST_ADDOPTS when it starts: set it after
    current = os.environ.get("PYTEST_ADDOPTS", "").split()
    if options not in " ".join(current):
        monkeypatch.setenv("PYTEST_ADDOPTS", " ".join([*current, options]))


@pytest.fixture(autouse=True)
def _sessions_skip_unused_plugins(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions this test starts do not load anyio's plugin (:data:`SESSION_OPTIONS` says why);
    everything else about them is as a user's."""
    _add_session_options(request, monkeypatch, SESSION_OPTIONS)


@pytest.fixture
def eager_compile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The pytest sessions this test starts compile with torch.compile's ``eager`` backend
    (``--compile-backend=eager``, through ``PYTEST_ADDOPTS`` so sessions started with Popen get it
    too). Dynamo still captures and counts every graph, recompile and graph break, and generate()
    still goes through the compiled path at the compile stage; what is skipped is inductor's code
    generation, about 24 s of CPU per graph compiled cold on these 2-CPU machines (3 s warm).

    For tests of the harness (leases, faults, verdicts, progress, resume, fixtures): the compiler is
    not what they check. The tests about compiling keep the cpu row's inductor: the tiny-zoo sweep
    of every architecture, test_scale (compile cache hits), test_zoo (decisive when compiled),
    ``--device=auto`` (the row's backend) and test_faults_model (a fault planted in inductor)."""
    option = "--compile-backend=eager"
    _add_session_options(request, monkeypatch, option)
    return option


#: Where inductor keeps what it compiled (its FX-graph and AOTAutograd caches). Unset, it is
#: ``<tmp>/torchinductor_<user>``, shared by every test, every run of the suite and every CI job on the
#: machine: a compile a test calls cold may be served from there, warm.
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


@pytest.fixture
def cold_inductor_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty inductor cache of this test's own, for every process it starts (pytester sessions,
    their workers and runs inherit ``TORCHINDUCTOR_CACHE_DIR``) and for this process: the first
    compile of a graph there is a real one (cache misses, code generation), whatever ran before.
    For the tests that claim a cold compile. A session given ``--neff-cache DIR`` compiles into DIR
    instead (the plugin sets the variable for its device runs), which is as fresh when DIR is the
    test's own. inductor writes the variable back into ``os.environ`` when it first reads it;
    monkeypatch restores it after the test either way."""
    cache = tmp_path_factory.mktemp("inductor-cache")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(cache))
    return cache


@pytest.fixture
def process_tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A tag unique to this test, in the environment every process it starts inherits (pytester
    runs, their xdist workers, run.py, spawned ranks, compiler workers): faultkit.own_processes
    finds them by it, and none of another test's. Whatever the test leaves alive is killed after
    it, so a failed check does not leak into the next test."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_VAR, tag)
    yield tag
    kill_own_processes(tag)


#: The longest tests, longest first (``pytest tests -n 2 --durations=40`` on a 2-CPU machine).
#: Under xdist the plugin's scheduler (pytest_xdist_make_scheduler below) deals tests out one at a
#: time in collection order, so the longest start first, on different workers, and the short ones
#: fill in around them: started last, the longest would run on alone at the end. Only the order
#: changes, never what runs.
LONGEST_FIRST = (
    "tests/test_sweep.py::test_tiny_zoo_sweep_passes_every_architecture",
    "tests/test_text_to_image.py::test_the_tiny_pipeline_passes_and_a_fault_at_any_stage",
    "tests/test_scale.py::",
    "tests/test_reference_commit.py::test_a_moved_main_between_two_sessions",
    "tests/test_verdicts.py::test_fluent_wrong_dead_and_warm_faults",
    "tests/test_faults_model.py::",
    "tests/test_sharded.py::test_sharded_items_run_two_ranks",
    "tests/test_leases.py::test_two_concurrent_sessions",
    "tests/test_sharded.py::test_the_judge_is_kept_beside_the_cpu_check",
    "tests/test_faults_session.py::",
    "tests/test_doctor.py::test_cpu_passes_every_check",
    "tests/test_promises.py::test_resume_reruns",
    "tests/test_speech.py::test_the_tiny_whisper",
    "tests/test_user_paths.py::test_a_users_reference_runs_beside",
    "tests/test_near_tie_views.py::",
    "tests/test_sweep.py::test_parity_failure_and_load_error",
    "tests/test_training.py::test_the_tiny_zoo_trains_on_cpu",
    "tests/test_promises.py::test_near_tie",
    "tests/test_forced_cache.py::",
    "tests/test_cold_cache.py::",
    "tests/test_faults_ranks.py::",
    "tests/test_doctor.py::test_rows_record_the_self_check",
    "tests/test_tasks.py::test_vlm_and_real_minilm",
    "tests/test_failures.py::",
    "tests/test_faults_hub.py::test_an_unreachable_hub",
    "tests/test_faults_security.py::",
    "tests/test_verdicts.py::test_without_room",
    "tests/test_progress.py::",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest tests -n 2`` deals the tests out one at a time in collection order, with the plugin's
    own scheduler (the one a model sweep gets). xdist's default load scheduler first sends each worker
    a chunk of consecutive tests, a quarter of its share (63 of 507 here): that put every test of
    LONGEST_FIRST on one worker, which ran them one after another for 39 minutes while the other had
    finished its share after 20 (measured on a clean clone)."""
    from pytest_neuron_support.session.scheduling import CostOrderScheduling

    return CostOrderScheduling(config, log)


def _rank(item: pytest.Item) -> tuple[int, int]:
    for rank, prefix in enumerate(LONGEST_FIRST):
        if item.nodeid.startswith(prefix):
            return (0, rank)
    # Then the other tests that run models or whole pytest sessions, then the rest.
    heavy = {"offline_hub", "tiny_zoo_cache", "pytester"} & set(getattr(item, "fixturenames", ()))
    return (1, 0) if heavy or item.get_closest_marker("slow") is not None else (2, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: each group keeps its collection order
