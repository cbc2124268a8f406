"""Check `generation`: a rendered run.py (the harness's own, through ``render_and_run``) generates from
a tiny random llama built on CPU, compiled with the device's backend: ok, every token, at least one
graph, a warm run identical, and its persistent cache counters (or why they are unknown)."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor
from pytest_neuron_support.doctor.runner import tail
from pytest_neuron_support.run.runscript import RunSpec, render_and_run

#: Tokens the tiny generation must produce (the random-weight checkpoint has no EOS, so it cannot stop early).
GENERATION_TOKENS = 4
PROMPT = "once upon a time there was a little girl"


def expected(kind: DeviceKind) -> str:
    return (
        f"run.py (compile, backend {kind.compile_backend!r}) on a tiny llama: ok, "
        f"{GENERATION_TOKENS} tokens, graphs_compiled >= 1, repeat identical"
    )


def run(doctor: Doctor) -> tuple[str, bool]:
    cores = doctor.free_cores(1)
    if cores is None:
        return "no free core in this session's slice", False
    checkpoint = doctor.work_dir / "tiny-llama"
    built = doctor.run("checkpoint", "checkpoint", {"out_dir": str(checkpoint)}, doctor.cpu_env())
    if built.error is not None:
        return f"could not build the tiny checkpoint (on CPU): {built.error}", False
    dtype = "bfloat16" if doctor.bf16 else "float32"
    spec = RunSpec(
        model=str(checkpoint.resolve()),
        revision="main",
        task="text-generation",
        dtype=dtype,
        prompt=PROMPT,
        max_new_tokens=GENERATION_TOKENS,
        device=doctor.kind,
        compile=True,
        compile_backend=doctor.kind.compile_backend,
    )
    env = {**doctor.device_env(cores), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    _, outcome = render_and_run(
        spec, doctor.work_dir / "generation", env=env, timeout=doctor.timeout, python=doctor.python
    )
    result = outcome.result
    where = f"{dtype}, {doctor.cores_text(cores)}"
    if outcome.timed_out:
        return f"{where}: timed out at stage {outcome.last_stage}", False
    if result is None:
        return f"{where}: exit {outcome.returncode} without a result: {tail(outcome.log_tail())}", False
    if not result.get("ok"):
        return f"{where}: failed at {result.get('stage')}: {result.get('error_type')}: {result.get('error')}", False
    tokens = list(result.get("tokens") or [])
    graphs = int(result.get("graphs_compiled") or 0)
    same = bool(result.get("repeat_identical"))
    cache = result.get("compile_cache") or {}
    counted = (
        f"persistent cache counters unknown ({cache['unavailable']})"
        if cache.get("unavailable")
        else f"persistent cache {cache.get('hits')} hit(s), {cache.get('misses')} miss(es)"
    )
    found = (
        f"{where}: {len(tokens)} token(s) {tokens}, {graphs} graph(s) compiled, "
        f"repeat {'identical' if same else 'DIFFERENT'}, {counted}, {float(result.get('wall_s') or 0):.1f} s"
    )
    return found, len(tokens) == GENERATION_TOKENS and graphs >= 1 and same


CHECK = Check(
    key="generation",
    name="tiny generation through run.py",
    expected=expected,
    run=run,
    needs=ON_DEVICE,
    scripts=("checkpoint",),
)
