"""The session's settings, resolved once: the device probed (on the controller only, in a subprocess),
the CPU threads, the judge, and :func:`settings_for`, which makes the one :class:`~.settings.Settings`
object every run reads from the options and those facts, copying each by its name.

A session that collects no catalog resolves its settings only when a fixture first needs them
(:func:`session_settings`): a plain ``pytest`` run where the plugin is installed probes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Mapping

import pytest

from pytest_neuron_support.catalog.load import Catalog
from pytest_neuron_support.data.records import current_stack
from pytest_neuron_support.devices.table import (
    DEVICES,
    DeviceNotFound,
    compiler_version,
    fallback_core_bytes,
    find_device,
)
from pytest_neuron_support.run import neffcache
from pytest_neuron_support.run.cores import session_cores
from pytest_neuron_support.run.settings import Resolved, Settings, read_self_check
from pytest_neuron_support.run.threads import cpu_threads, usable_cpus
from pytest_neuron_support.session.keys import lazy_settings_key, options_key, session_id_key, settings_key
from pytest_neuron_support.session.options import Options
from pytest_neuron_support.verdict.fluency import DEFAULT_JUDGE


def resolve_device(options: Options) -> Resolved:
    """The device kind, this session's slice of its cores, the pool, bytes per core and the
    compiler version, from the options and, where needed, probe subprocesses."""
    try:
        found = find_device(options.device)
    except DeviceNotFound as exc:
        raise pytest.UsageError(str(exc)) from None
    except Exception as exc:  # a broken torch install is the user's to fix, said plainly
        raise pytest.UsageError(f"could not probe devices: {exc}") from None
    core_memory, available = found.core_memory, found.available
    options = Options(**{**options.__dict__, "device": found.kind.name})
    kind = DEVICES[options.device]
    # cpu "cores" are slots for ranks (max_pool of them), any number of which a session may use.
    try:
        cores = session_cores(kind.visible_env_vars, kind.max_pool or available)
    except ValueError as exc:
        raise pytest.UsageError(f"the slice of cores this session was given is unreadable: {exc}") from None
    limit = len(cores)
    if options.neuron_cores is not None and options.neuron_cores > limit:
        raise pytest.UsageError(
            f"--neuron-cores={options.neuron_cores} is more than the {limit} core(s) this session may use on the "
            f"{options.device} device; pass at most {limit}"
        )
    if options.core_memory_gib is not None:
        core_bytes = int(options.core_memory_gib * (1 << 30))
    else:
        core_bytes = core_memory or fallback_core_bytes(kind)
    default_pool = min(limit, available) if kind.max_pool else limit
    return Resolved(
        device=options.device,
        cores=cores,
        neuron_cores=options.neuron_cores or default_pool,
        core_bytes=core_bytes,
        neuronx_cc=compiler_version(kind),
        session=uuid.uuid4().hex[:12],
        self_check=read_self_check(options.results_dir, options.device),
    )


def resolve_cpu_threads(
    config: pytest.Config, options: Options, environ: Mapping[str, str], cpus: int | None = None
) -> int | None:
    """``--cpu-threads``; else, where the environment sets OMP_NUM_THREADS, None (the runs inherit the
    user's choice); else the usable CPUs (``cpus``, default :func:`usable_cpus`) shared among the
    session's workers (``run.threads.cpu_threads``; ``-n N`` is N workers, none is one). Decided once, on
    the controller, which alone knows how many xdist workers there are."""
    if options.cpu_threads is not None:
        return options.cpu_threads
    if environ.get("OMP_NUM_THREADS"):
        return None
    workers = max(1, int(config.getoption("numprocesses", 0) or 0))
    return cpu_threads(usable_cpus() if cpus is None else cpus, workers)


def with_judge(options: Options, catalog: Catalog | None = None) -> Options:
    """The judge, decided here only: ``--judge-model``, else the catalog's ``judge:``, else the default
    (a session without a catalog: the default)."""
    if options.judge_model is not None:
        model, revision = options.judge_model, "main"
    elif catalog is not None and catalog.judge_model:
        model, revision = catalog.judge_model, catalog.judge_revision
    else:
        model, revision = DEFAULT_JUDGE, "main"
    return dataclasses.replace(options, judge_model=model, judge_revision=options.judge_revision or revision)


def settings_for(options: Options, resolved: Resolved) -> Settings:
    """The session's settings from the options (their judge resolved by :func:`with_judge`) and what the
    controller found out: every field of :class:`Settings` named like an option or a resolved fact takes
    its value (one name from the command line to the row); only what is derived is set here."""
    if options.judge_model is None or options.judge_revision is None:
        raise ValueError("settings_for needs the judge resolved first: with_judge(options, catalog)")
    kind = DEVICES[resolved.device]
    names = {field.name for field in dataclasses.fields(Settings)}
    values = {name: value for name, value in vars(options).items() if name in names}
    values.update({name: value for name, value in dataclasses.asdict(resolved).items() if name in names})
    values["cores"] = resolved.cores  # asdict made the tuple a list
    return Settings(
        **{
            **values,
            "device": kind,
            "compile_backend": options.compile_backend or kind.compile_backend,
            # neuron: a default base where none is given, one folder per compiler version below it.
            "neff_cache": neffcache.session_cache_base(kind, options.neff_cache, os.environ),
            "stack": dataclasses.replace(current_stack(), neuronx_cc=resolved.neuronx_cc),
        }
    )


def session_settings(config: pytest.Config) -> Settings:
    """The session's settings: a sweep's, else resolved here once (device, pool, ledger) from the options."""
    settings = config.stash.get(settings_key, None) or config.stash.get(lazy_settings_key, None)
    if settings is None:
        options = config.stash[options_key]
        resolved = dataclasses.replace(resolve_device(options), session=config.stash[session_id_key])
        settings = settings_for(with_judge(options), resolved)
        config.stash[lazy_settings_key] = settings
    return settings
