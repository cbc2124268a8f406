"""A session that found the Hub unreachable runs every model's processes offline: the fact travels
in its settings (and, to xdist workers, in ``Resolved`` through ``workerinput``), every run's
environment gets ``HF_HUB_OFFLINE=1``, and a load that fails says why in one line. The end-to-end
run against a closed port is ``test_faults_hub.py::test_an_unreachable_hub_is_a_load_error_not_a_hang``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_neuron_support.data.records import current_stack
from pytest_neuron_support.devices.table import DEVICES, NO_DEVICE_ENV
from pytest_neuron_support.run.context import cpu_env, device_run_env, session_env
from pytest_neuron_support.run.execution import ProcessOutcome, failure_of, offline_cause, offline_load_error
from pytest_neuron_support.run.settings import Resolved, Settings
from pytest_neuron_support.session.options import Options
from pytest_neuron_support.session.resolve import settings_for, with_judge

DOWN = "http://127.0.0.1:9 is unreachable (Connection refused)"
# What transformers raises when a checkpoint is neither cached nor downloadable (HF_HUB_OFFLINE=1).
NOT_CACHED = (
    "OSError: We couldn't connect to 'http://127.0.0.1:9' to load the files, and couldn't find them in the "
    "cached files.\nCheck your internet connection or see how to run the library in offline mode at "
    "'https://huggingface.co/docs/transformers/installation#offline-mode'."
)


def _settings(hub_unreachable: str | None) -> Settings:
    return Settings(
        device=DEVICES["cpu"],
        neuron_cores=1,
        max_new_tokens=4,
        prompt="p",
        model_timeout=60.0,
        results_dir=Path("out"),
        compile_backend="inductor",
        reference_dtype=None,
        allow_remote_code=False,
        stack=current_stack(),
        hub_unreachable=hub_unreachable,
    )


def _outcome(tmp_path: Path, result: dict[str, object] | None, stage: str = "load") -> ProcessOutcome:
    log = tmp_path / "log.txt"
    log.write_text(f"[neuron-support] stage={stage}\n", encoding="utf-8")
    return ProcessOutcome(returncode=1, timed_out=False, wall_s=3.0, result=result, last_stage=stage, log_path=log)


def test_runs_are_offline_only_when_the_session_found_the_hub_unreachable() -> None:
    environ = {"HOME": "/h", "HF_HUB_OFFLINE": "0", "NEURON_RT_VISIBLE_CORES": "3"}
    down, up = _settings(DOWN), _settings(None)
    assert session_env(down, environ) == {**environ, "HF_HUB_OFFLINE": "1"}
    assert session_env(up, environ) == environ  # reachable: nothing changes, the user's value included
    assert session_env(up, {"HF_HUB_OFFLINE": "1"}) == {"HF_HUB_OFFLINE": "1"}
    # Both kinds of process a model's check starts: the device run and every CPU-side run.
    assert device_run_env(down, environ, {"NEURON_RT_VISIBLE_CORES": "4"})["HF_HUB_OFFLINE"] == "1"
    # (on the cpu device the CPU side also holds the device table's compiler settings: test_devices)
    assert cpu_env(down, environ) == {"HOME": "/h", "HF_HUB_OFFLINE": "1", **NO_DEVICE_ENV, **DEVICES["cpu"].env_for(1)}
    assert device_run_env(up, environ, {})["HF_HUB_OFFLINE"] == "0"
    assert cpu_env(up, environ)["HF_HUB_OFFLINE"] == "0"
    assert environ["HF_HUB_OFFLINE"] == "0"  # the caller's mapping is not changed


def test_every_process_run_for_a_model_gets_the_sessions_cpu_threads() -> None:
    environ = {"HOME": "/h", "OMP_NUM_THREADS": "12"}
    threads, inherit = dataclasses.replace(_settings(None), cpu_threads=3), _settings(None)
    assert session_env(threads, environ)["OMP_NUM_THREADS"] == "3"
    assert device_run_env(threads, environ, {"NEURON_RT_VISIBLE_CORES": "4"})["OMP_NUM_THREADS"] == "3"
    assert cpu_env(threads, environ)["OMP_NUM_THREADS"] == "3"
    # None: the user's own OMP_NUM_THREADS (or none) reaches the runs as it is.
    assert cpu_env(inherit, environ)["OMP_NUM_THREADS"] == "12"
    assert "OMP_NUM_THREADS" not in device_run_env(inherit, {"HOME": "/h"}, {})


def test_an_uncached_checkpoint_offline_is_one_line_naming_the_cause() -> None:
    error = offline_load_error(NOT_CACHED, DOWN, "nobody/sized")
    assert error == (
        "OSError: nobody/sized is not in the local cache, and the run was offline (HF_HUB_OFFLINE=1): the Hub "
        f"was found unreachable at session start: {DOWN}"
    )
    assert "\n" not in error and offline_cause(DOWN) in error
    hub_error = "LocalEntryNotFoundError: Cannot find the requested files in the disk cache and outgoing traffic..."
    assert offline_load_error(hub_error, DOWN, "org/m").startswith("LocalEntryNotFoundError: org/m is not in")
    # Any other load failure keeps its own text and says the run was offline.
    other = "SafetensorError: Error while deserializing header: HeaderTooLarge"
    assert offline_load_error(other, DOWN, "org/m") == f"{other}\n({offline_cause(DOWN)})"


def test_failure_of_names_the_offline_cause_of_load_failures_only(tmp_path: Path) -> None:
    message = NOT_CACHED.split(": ", 1)[1]
    load = {"ok": False, "stage": "load", "error_type": "OSError", "error": message}
    status, stage, error = failure_of(_outcome(tmp_path, load), "run.py", offline=DOWN, checkpoint="org/m")
    assert (status, stage) == ("ERROR", "load")
    assert error.startswith("OSError: org/m is not in the local cache") and error.endswith(DOWN)
    # A session that reached the Hub: the library's own text, as before.
    assert failure_of(_outcome(tmp_path, load), "run.py") == ("ERROR", "load", NOT_CACHED)
    # Past loading, the Hub had nothing to do with it.
    compile_ = {"ok": False, "stage": "compile", "error_type": "RuntimeError", "error": "boom"}
    outcome = _outcome(tmp_path, compile_, "compile")
    assert failure_of(outcome, "run.py", offline=DOWN) == ("ERROR", "compile", "RuntimeError: boom")


def test_the_finding_travels_to_workers_in_their_settings(tmp_path: Path) -> None:
    resolved = Resolved(
        device="cpu",
        cores=(0, 1),
        neuron_cores=2,
        core_bytes=1 << 30,
        neuronx_cc="none",
        session="s",
        hub_unreachable=DOWN,
        cpu_threads=3,
    )
    shared = json.loads(json.dumps(resolved.to_workerinput()))  # workerinput crosses a process boundary
    assert Resolved.from_workerinput(shared) == resolved
    options = with_judge(
        Options(
            models_file=tmp_path / "models.yaml",
            models_file_explicit=True,
            extra_models=(),
            device="cpu",
            neuron_cores=None,
            max_new_tokens=4,
            prompt="p",
            model_timeout=60.0,
            results_dir=tmp_path,
            compile_backend=None,
            reference_dtype=None,
            allow_remote_code=False,
            judge_model=None,
            judge_revision=None,
            parity="exact",
            shard=None,
            resume=False,
            neff_cache=None,
            reference_cache=None,
            host_memory_gib=None,
            cpu_check_memory_gib=None,
            core_ledger=tmp_path / "ledger",
            core_memory_gib=None,
            memory_headroom=0.25,
            max_cores=16,
        )
    )
    assert settings_for(options, Resolved.from_workerinput(shared)).hub_unreachable == DOWN
    assert settings_for(options, Resolved.from_workerinput(shared)).cpu_threads == 3  # decided on the controller
    reachable = dataclasses.replace(resolved, hub_unreachable=None)
    assert settings_for(options, reachable).hub_unreachable is None


def test_settings_hash_does_not_depend_on_the_hub() -> None:
    import hashlib

    from pytest_neuron_support.base.model import ModelSpec
    from pytest_neuron_support.checks.rows import settings_hash

    model = ModelSpec(id="org/m")
    settings = _settings(None)
    # Computed here from what decides a check, written out (the settings' own defaults included);
    # the Hub's reachability is not among them, so both sessions' rows get this very hash.
    parts = [
        "org/m",
        "main",  # the catalog's defaults: revision, task, dtype
        "text-generation",
        "bfloat16",
        "p",  # the prompt
        "None",  # the catalog's cores
        "4",  # max_new_tokens
        "cpu",
        "inductor",
        "None",  # the reference dtype: the device run's
        "exact",  # the settings' defaults: parity, judge and its revision, core memory, headroom, max cores
        "Qwen/Qwen2.5-0.5B-Instruct",
        "main",
        str(24 << 30),
        "0.25",
        "16",
    ]
    expected = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]
    assert settings_hash(model, _settings(DOWN)) == expected
    assert settings_hash(model, settings) == expected
    # The hash does follow a setting that changes the check: it is not a constant.
    assert settings_hash(model, dataclasses.replace(settings, max_new_tokens=5)) != expected


@pytest.mark.parametrize(
    ("args", "environ", "threads"),
    [
        (("--cpu-threads=3",), {"OMP_NUM_THREADS": "8"}, 3),  # the option wins
        ((), {"OMP_NUM_THREADS": "8"}, None),  # the user's own variable reaches the runs as it is
        ((), {}, 8),  # one worker: its device run and its reference share 16 CPUs
        (("-n", "3"), {}, 2),  # three workers: six concurrent runs on 16 CPUs
        (("-n", "0"), {}, 8),
    ],
)
def test_the_controller_decides_the_runs_cpu_threads(
    pytester: pytest.Pytester, args: tuple[str, ...], environ: dict[str, str], threads: int | None
) -> None:
    from pytest_neuron_support.session.options import parse_options
    from pytest_neuron_support.session.resolve import resolve_cpu_threads

    config = pytester.parseconfig(*args)
    assert resolve_cpu_threads(config, parse_options(config), environ, cpus=16) == threads


def _other(value: object) -> object:
    """Another value of a setting's own type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, Path):
        return value / "other"
    if isinstance(value, tuple):
        return (*value, 99)
    if value is DEVICES["cpu"]:
        return DEVICES["cuda"]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        first = dataclasses.fields(value)[0].name
        return dataclasses.replace(value, **{first: _other(getattr(value, first))})
    return "float32"  # an unset optional setting (None) given a value


def test_the_settings_hash_follows_exactly_the_settings_declared_to_change_a_result() -> None:
    from pytest_neuron_support.base.model import ModelSpec
    from pytest_neuron_support.checks.rows import settings_hash
    from pytest_neuron_support.run.settings import CHANGES_RESULT

    model = ModelSpec(id="org/m")
    settings = _settings(None)
    base = settings_hash(model, settings)
    follows = {}
    for field in dataclasses.fields(Settings):
        changed = dataclasses.replace(settings, **{field.name: _other(getattr(settings, field.name))})
        follows[field.name] = settings_hash(model, changed) != base
    declared = {f.name for f in dataclasses.fields(Settings) if CHANGES_RESULT in f.metadata}
    # The prompt is the one undeclared setting that moves the hash: it enters as the model's own prompt (the
    # entry's, else the session's), so an entry with a prompt of its own keeps its hash under another --prompt.
    assert {name for name, moved in follows.items() if moved} == declared | {"prompt"}
    assert declared >= {"max_new_tokens", "device", "compile_backend", "parity", "judge_model", "max_cores"}
    prompted = ModelSpec(id="org/m", prompt="its own")
    assert settings_hash(prompted, dataclasses.replace(settings, prompt="q")) == settings_hash(prompted, settings)
