"""Failure signatures on real-looking errors: the same root cause in different models reads the
same, different causes read differently, and every row gets its signature from the one schema."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pytest_neuron_support.data.dataset import (
    DATA_DIR,
    blocking_summary,
    diff_signatures,
    read_rows,
    render_card,
    write_rows,
)
from pytest_neuron_support.data.records import COLUMN_DOCS, Row, arrow_schema
from pytest_neuron_support.data.signatures import MAX_MESSAGE, RULES, blockers, bucket, head, normalise

DYNAMO_ADVICE = (
    "\n\nSet TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're reporting a "
    'bug to PyTorch). For even more developer context, set TORCH_LOGS="+dynamo"\n'
)


def sig(model: str, stage: str | None, error: str | None, result: str = "ERROR", **fields: Any) -> str | None:
    return Row(model_id=model, result=result, failure_stage=stage, error=error, **fields).signature


def backend_failed(model: str, op: str, shape: str, address: str, session: int, line: int) -> str:
    """Dynamo's BackendCompilerFailed wrapping the backend's NotImplementedError (the first two lines
    as torch 2.13 writes them), with the circumstances of one model's run."""
    slug = model.replace("/", "--")
    return (
        "BackendCompilerFailed: backend='neuron' raised:\n"
        f"NotImplementedError: Could not run '{op}' with arguments from the 'Neuron' backend: input {shape} "
        f"(FakeTensor at 0x{address}) in /tmp/pytest-of-ci/pytest-{session}/test_sweep0/out/runs/{slug}/neuron/"
        f"device/run.py:{line} while compiling {model}" + DYNAMO_ADVICE
    )


def test_one_unsupported_op_in_two_models_is_one_signature_naming_the_op() -> None:
    qwen = sig(
        "Qwen/Qwen3-8B",
        "compile",
        backend_failed("Qwen/Qwen3-8B", "aten::_fancy_op", "[2, 37, 4096]", "7f3a2c001b40", 3, 412),
    )
    llama = sig(
        "meta-llama/Llama-3.1-8B",
        "compile",
        backend_failed(
            "meta-llama/Llama-3.1-8B", "aten::_fancy_op", "torch.Size([1, 12, 2048])", "55d0c0ffee00", 17, 9
        ),
    )
    assert qwen == llama
    assert qwen == (
        "compile: BackendCompilerFailed aten::_fancy_op: backend='neuron' raised: NotImplementedError: Could not run "
        "'<op>' with arguments from the 'Neuron' backend: input <shape> (FakeTensor at <addr>) in <path>/run.py:<n> "
        "while compiling <model>"
    )
    other_op = sig(
        "Qwen/Qwen3-8B",
        "compile",
        backend_failed("Qwen/Qwen3-8B", "aten::_other_op", "[2, 37, 4096]", "7f3a2c001b40", 3, 412),
    )
    assert other_op is not None and other_op != qwen and "aten::_other_op" in other_op


def test_the_dispatchers_unsupported_operator_error_keeps_the_backend() -> None:
    # As torch 2.13 raises it (the list of backends and the registrations that follow cut here).
    def could_not_run(backend: str) -> str:
        return (
            f"NotImplementedError: Could not run 'aten::_cudnn_rnn_flatten_weight' with arguments from the '{backend}' "
            "backend. This could be because the operator doesn't exist for this backend, or was omitted during the "
            "selective/custom build process (if using custom build). If you are a Facebook employee using PyTorch on "
            "mobile, please visit https://fburl.com/ptmfixes for possible resolutions. "
            "'aten::_cudnn_rnn_flatten_weight' is only available for these backends: [Meta, BackendSelect, Python].\n\n"
            "Meta: registered at /__w/pytorch/pytorch/aten/src/ATen/core/MetaFallbackKernel.cpp:23 [backend fallback]"
        )

    cpu = sig("org/a", "compile", could_not_run("CPU"))
    assert cpu is not None
    assert cpu.startswith(
        "compile: NotImplementedError aten::_cudnn_rnn_flatten_weight: Could not run '<op>' with arguments from the "
        "'CPU' backend."
    )
    # The message is cut: what follows the cause (the registrations) cannot split a group.
    assert len(cpu.split(": ", 2)[2]) <= MAX_MESSAGE + 3 and "registered at" not in cpu
    assert sig("org/b", "compile", could_not_run("CPU")) == cpu
    assert sig("org/a", "compile", could_not_run("Neuron")) != cpu


def test_a_custom_op_without_a_fake_impl_is_named() -> None:
    error = (
        "BackendCompilerFailed: backend='inductor' raised:\nRuntimeError: no fake impl registered for "
        "<CustomOpDef(faults::no_fake)>" + DYNAMO_ADVICE
    )
    assert sig("tiny-random/qwen2", "compile", error) == (
        "compile: BackendCompilerFailed faults::no_fake: backend='inductor' raised: RuntimeError: no fake impl "
        "registered for <CustomOpDef(<op>)>"
    )


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
            "of which 1.23 GiB is free. Process 12345 has 77.90 GiB memory in use.",
            "device",
        ),
        (
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 3 has a total capacity of 22.05 "
            "GiB of which 301.06 MiB is free. Including non-PyTorch memory, this process has 21.75 GiB memory in use.",
            "device",
        ),
        (
            "RuntimeError: nrt_tensor_allocate failed: Failed to allocate 268435456 bytes on HBM of NeuronCore 3 "
            "(status=4 NRT_RESOURCE)",
            "device",
        ),
        ("RuntimeError: rank 1: Failed to allocate DEVICE memory: 1073741824 bytes", "device"),
        ("MemoryError: ", "host"),
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you "
            "tried to allocate 17179869184 bytes.",
            "host",
        ),
    ],
)
def test_out_of_memory_in_any_wording_is_one_signature_per_kind_of_memory(error: str, kind: str) -> None:
    assert sig("org/any", "load", error) == f"load: OutOfMemory {kind}: {kind} memory exhausted"


def test_a_sigkill_is_not_taken_for_an_out_of_memory_error() -> None:
    # The harness only guesses at host memory: a SIGKILL stays a SIGKILL.
    error = "run.py killed by SIGKILL (host out of memory?)\nLoading checkpoint shards:  50%|#####  | 1/2 [00:03<00:03]"
    assert sig("org/a", "load", error) == "load: run.py killed by SIGKILL (host out of memory?)"


def test_rank_deaths_group_whichever_rank_died_and_keep_the_signal_and_exit_code() -> None:
    def died(ranks: str, process: int, how: str) -> str | None:
        error = f"RankDied: rank(s) [{ranks}] died without a result: rank {process} {how}\n[neuron-support] stage=load"
        return sig("org/moe", "load", error)

    killed = died("1", 1, "terminated with signal SIGKILL")
    assert killed == "load: RankDied: rank(s) <ranks> died without a result: rank <n> terminated with signal SIGKILL"
    assert died("0, 1", 0, "terminated with signal SIGKILL") == killed
    assert died("1", 1, "terminated with signal SIGSEGV") != killed
    exited = died("1", 1, "terminated with exit code 1")
    assert exited is not None and exited.endswith("terminated with exit code 1")
    assert died("2", 2, "terminated with exit code 1") == exited
    assert died("1", 1, "terminated with exit code 134") != exited
    # A rank that raised: the same error on rank 0 or rank 3 of another model.
    assert sig("org/a", "load", "RuntimeError: rank 1: boom on rank 1") == sig(
        "org/b", "load", "RuntimeError: rank 3: boom on rank 3"
    )


def test_a_run_killed_or_exiting_without_a_result_ignores_its_log_tail() -> None:
    segv = sig("org/a", "load", "run.py killed by SIGSEGV\n[neuron-support] stage load\nFatal Python error: 0x7f00")
    assert segv == "load: run.py killed by SIGSEGV"
    assert sig("org/b", "load", "run.py killed by SIGSEGV\nsomething else entirely, pid 4242") == segv
    assert sig("org/a", "compile", "run.py killed by SIGSEGV") != segv  # another stage, another place
    status = sig("org/a", "load", "run.py exited with status 139 without a result\nSegmentation fault (core dumped)")
    assert status == "load: run.py exited with status 139 without a result"
    assert sig("org/a", "load", "run.py exited with status 1 without a result") != status


def test_timeouts_group_whatever_the_timeout_was() -> None:
    hung = sig("org/a", "compile", "run.py exceeded the timeout after 3600s", result="TIMEOUT")
    assert hung == "compile: run.py exceeded the timeout after <time>"
    assert sig("org/b", "compile", "run.py exceeded the timeout after 180s", result="TIMEOUT") == hung
    assert sig("org/b", "load", "run.py exceeded the timeout after 180s", result="TIMEOUT") != hung


def test_load_errors_group_whatever_the_path_and_keep_the_missing_files_name() -> None:
    def missing(model: str, home: str, commit: str, name: str) -> str | None:
        slug = model.replace("/", "--")
        error = (
            f"FileNotFoundError: [Errno 2] No such file or directory: "
            f"'{home}/.cache/huggingface/hub/models--{slug}/snapshots/{commit}/{name}'"
        )
        return sig(model, "load", error)

    first = missing("org/a", "/home/ci", "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432", "tokenizer.json")
    assert first == "load: FileNotFoundError: [Errno 2] No such file or directory: '<path>/tokenizer.json'"
    assert missing("other/b-7b", "/root", "0123456789abcdef0123456789abcdef01234567", "tokenizer.json") == first
    assert missing("org/a", "/home/ci", "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432", "config.json") != first
    # transformers' own wording names the model, its cache path and a Hub URL.
    hub = sig(
        "org/b",
        "load",
        "OSError: org/b does not appear to have a file named /tmp/x/hub/models--org--b/snapshots/0123abcd4567ef89/"
        "config.json. Checkout 'https://huggingface.co/org/b/tree/main' for available files.",
    )
    assert hub == (
        "load: OSError: <model> does not appear to have a file named <path>/config.json. Checkout '<url>' for "
        "available files."
    )
    assert (
        sig("org/c", "load", "ModuleNotFoundError: No module named 'flash_attn'")
        == "load: ModuleNotFoundError flash_attn: No module named 'flash_attn'"
    )


@pytest.mark.parametrize(
    ("position", "name"),
    [
        (0, "token 0"),
        (1, "token 1-3"),
        (3, "token 1-3"),
        (4, "token 4-15"),
        (15, "token 4-15"),
        (16, "token 16-31"),
        (31, "token 16-31"),
        (32, "token 32+"),
        (None, "an unknown token"),
    ],
)
def test_buckets(position: int | None, name: str) -> None:
    assert bucket(position) == name


def free_running(index: int, near_tie: bool = False) -> str:
    tie = ", a near-tie" if near_tie else ""
    return f"tokens differ from the CPU reference at index {index} of 32 (device 9, reference 5, gap 0.031 nats{tie})"


def forced(position: int, deficit: float = 14.5361) -> str:
    return (
        f"teacher-forced CPU check: 6 of 32 device tokens are not the CPU top-1; first at position {position} of 32 "
        f"(device 523, CPU top-1 455, device token ranked 76, {deficit} nats below; max deficit 20.1 nats)"
    )


def parity(error: str, **fields: Any) -> str | None:
    return sig("org/a", "parity", error, result="FAIL", **fields)


def test_parity_failures_are_bucketed_by_where_the_tokens_first_went_wrong() -> None:
    both = parity(f"{free_running(2)}; {forced(2)}", first_divergence=2, first_disagreement=2)
    assert both == "parity: free-running divergence at token 1-3; teacher-forced disagreement at token 1-3"
    assert parity(f"{free_running(3)}; {forced(3, 2.5)}", first_divergence=3, first_disagreement=3) == both
    assert parity(f"{free_running(0)}; {forced(0)}", first_divergence=0, first_disagreement=0) != both
    # Numeric drift is not a broken model: a near-tie says so.
    tie = parity(free_running(20, near_tie=True), first_divergence=20, near_tie=True)
    assert tie == "parity: free-running divergence at token 16-31, near-tie"
    assert parity(free_running(20), first_divergence=20) == "parity: free-running divergence at token 16-31"


def test_a_sharded_runs_teacher_forced_failure_is_bucketed_too() -> None:
    assert parity(forced(3), first_disagreement=3) == "parity: teacher-forced disagreement at token 1-3"
    assert parity(forced(12), first_disagreement=12) == "parity: teacher-forced disagreement at token 4-15"
    assert (
        parity("the teacher-forced CPU check scored no token (the device generated none)")
        == "parity: the device generated no token"
    )
    below = "embeddings differ from the CPU reference: min cosine 0.912345 (sentence 2) is below the threshold 0.999"
    assert parity(below) == "parity: embeddings below the cosine threshold"


def test_a_warm_run_that_differs_and_a_judge_that_says_not_fluent() -> None:
    repeat = "the warm second generate() differs from the first at position 5 of 32 (first 17, second 22)"
    assert (
        sig("org/a", "generate", repeat, result="FAIL", repeat_divergence=5)
        == "generate: the warm second generate() differs from the first at token 4-15"
    )
    fluent = "judge tiny-random/judge found the text not fluent (P(yes)={p}): {text!r}"
    first = sig("org/a", "judge", fluent.format(p=0.123, text="the the the"), result="FAIL")
    assert first == "judge: the text was judged not fluent"
    assert sig("org/b", "judge", fluent.format(p=0.4, text="fox fox"), result="FAIL") == first


def test_harness_and_user_test_failures_lose_their_worker_node_id_and_traceback() -> None:
    crash = "the pytest worker died while checking this model: worker 'gw{n}' crashed while running '{item}'"
    first = sig("org/a", "harness", crash.format(n=1, item="models.yaml::test_model[org/a]"))
    assert first == (
        "harness: the pytest worker died while checking this model: worker 'gw<n>' crashed while running "
        "'models.yaml::test_model[<model>]'"
    )
    assert sig("org/b", "harness", crash.format(n=0, item="models.yaml::test_model[org/b]")) == first
    # A user's test: pytest's traceback, whose first E line is the failure.
    test = "tests/test_mine.py::test_knows_paris[{m}]"
    longrepr = (
        "neuron_run = NeuronRun(tokens=(1, 2))\n\n    def test_knows_paris(neuron_run):\n"
        ">       assert 'Paris' in neuron_run.text\nE       AssertionError: assert 'Paris' in 'the the'\n"
        "E        +  where 'the the' = NeuronRun(tokens=(1, 2)).text\n\ntests/test_mine.py:7: AssertionError"
    )
    mine = sig("org/a", "test", longrepr, result="FAIL", test=test.format(m="org/a"))
    assert mine == "test: AssertionError: assert 'Paris' in 'the the'"


def test_different_root_causes_have_different_signatures() -> None:
    errors = [
        ("compile", backend_failed("org/a", "aten::_fancy_op", "[2, 3]", "7f00", 1, 1)),
        ("compile", backend_failed("org/a", "aten::_other_op", "[2, 3]", "7f00", 1, 1)),
        ("compile", "NothingCompiledError: generate() compiled no graph: compilation was skipped"),
        ("load", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
        ("load", "MemoryError: "),
        ("load", "run.py killed by SIGSEGV"),
        ("load", "run.py killed by SIGKILL (host out of memory?)"),
        ("load", "RankDied: rank(s) [1] died without a result: rank 1 terminated with signal SIGKILL"),
        ("load", "RuntimeError: rank 1: boom on rank 1"),
        ("load", "ValueError: rank 1: boom on rank 1"),
        ("load", "FileNotFoundError: [Errno 2] No such file or directory: '/x/config.json'"),
        ("load", "FileNotFoundError: [Errno 13] Permission denied: '/x/config.json'"),
        ("generate", "RuntimeError: Neuron runtime: NEFF failed to execute"),
    ]
    signatures = [sig("org/a", stage, error) for stage, error in errors]
    assert None not in signatures
    assert len(set(signatures)) == len(errors), signatures


def test_only_rows_that_block_a_model_have_a_signature() -> None:
    for result in ("PASS", "SKIPPED", "EXCLUDED"):
        assert sig("org/a", "plan", "needs 32 cores but the pool has 16", result=result) is None
    assert sig("org/a", "compile", None, result="TIMEOUT") == "compile: TIMEOUT with no error recorded"
    assert sig("org/a", None, "RuntimeError: x") == "unknown: RuntimeError: x"


def test_the_signature_is_made_again_whenever_a_row_is_built() -> None:
    row = Row(model_id="org/a", result="ERROR", failure_stage="load", error="run.py killed by SIGSEGV")
    assert replace(row, result="PASS", error=None).signature is None  # never a stale one
    # A stored value (older rules, a hand edit) is not trusted: the row's own fields decide.
    record = {**row.__dict__, "signature": "load: something stale"}
    assert Row.from_mapping(record).signature == "load: run.py killed by SIGSEGV"
    assert Row.from_json(row.to_json()) == row
    with pytest.raises(TypeError):
        Row(model_id="org/a", result="PASS", signature="x")  # type: ignore[call-arg]


def test_signatures_are_in_parquet_and_an_old_dataset_without_the_column_gets_them(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        Row(model_id="org/a", result="ERROR", failure_stage="load", error="run.py killed by SIGSEGV"),
        Row(model_id="org/b", result="PASS"),
    ]
    (path,) = write_rows(tmp_path / "new", rows)
    df = pd.read_parquet(path).set_index("model_id")
    assert df.loc["org/a", "signature"] == "load: run.py killed by SIGSEGV"
    assert pd.isna(df.loc["org/b", "signature"])
    assert "signature" in COLUMN_DOCS and arrow_schema().field("signature").type == pa.string()
    # A file written before the column existed: no signature column at all.
    old = tmp_path / "old" / DATA_DIR
    old.mkdir(parents=True)
    table = pq.read_table(path).drop_columns(["signature"])
    pq.write_table(table, old / path.name)
    assert "signature" not in pd.read_parquet(old / path.name).columns
    again = {r.model_id: r.signature for r in read_rows(old / path.name)}
    assert again == {"org/a": "load: run.py killed by SIGSEGV", "org/b": None}


def test_blockers_count_models_not_rows_most_first() -> None:
    segv = "run.py killed by SIGSEGV"
    rows = [
        Row(model_id="org/c", result="ERROR", failure_stage="load", error=segv),
        Row(model_id="org/a", result="ERROR", failure_stage="load", error=segv),
        Row(model_id="org/a", result="ERROR", failure_stage="load", error=segv, device="neuron"),
        Row(model_id="org/b", result="ERROR", failure_stage="compile", error="MemoryError: "),
        Row(model_id="org/d", result="PASS"),
    ]
    found = blockers(rows)
    assert [(b.signature, b.models) for b in found] == [
        ("load: run.py killed by SIGSEGV", ("org/a", "org/c")),
        ("compile: OutOfMemory host: host memory exhausted", ("org/b",)),
    ]
    assert (found[0].example_model, found[0].example, found[0].stage) == ("org/a", segv, "load")


def test_diff_of_signatures_counts_models_newly_blocked_and_unblocked() -> None:
    segv, oom = "run.py killed by SIGSEGV", "MemoryError: "

    def err(model: str, error: str) -> Row:
        return Row(model_id=model, result="ERROR", failure_stage="load", error=error)

    old = [err("org/a", segv), err("org/b", segv), err("org/c", oom), Row(model_id="org/d", result="PASS")]
    new = [Row(model_id="org/a", result="PASS"), err("org/b", oom), err("org/c", oom), err("org/d", "ValueError: x")]
    changes = diff_signatures(old, new)
    assert [(c.kind, c.signature, c.old_models, c.new_models) for c in changes] == [
        ("appeared", "load: ValueError: x", (), ("org/d",)),
        ("disappeared", "load: run.py killed by SIGSEGV", ("org/a", "org/b"), ()),
        ("persisting", "load: OutOfMemory host: host memory exhausted", ("org/c",), ("org/b", "org/c")),
    ]
    # org/a passes now; org/b is blocked by another signature; org/d is newly blocked.
    assert blocking_summary(changes, {r.model_id for r in new}) == (
        "signatures: 1 appeared, 1 disappeared; 1 model(s) newly blocked, 1 model(s) unblocked, "
        "1 blocked by another signature now"
    )
    # org/a not in the new dataset at all: missing, not unblocked (nothing says it runs now).
    assert blocking_summary(changes, {"org/b", "org/c", "org/d"}) == (
        "signatures: 1 appeared, 1 disappeared; 1 model(s) newly blocked, 0 model(s) unblocked, "
        "1 missing from the new dataset, 1 blocked by another signature now"
    )


def test_head_and_normalise() -> None:
    assert head("E   x\nE   y") == "x"
    assert head("BackendCompilerFailed: backend='neuron' raised:\n\nValueError: v\nmore") == (
        "BackendCompilerFailed: backend='neuron' raised: ValueError: v"
    )
    text = (
        "at 0xdeadbeef, commit 0123abcd4567, id 123e4567-e89b-12d3-a456-426614174000, 2.5 GiB, 30s, "
        "2026-01-10T12:00:00Z, layers.11.mlp [2, s0, 64] 2x37x64 exit code 137 signal 9 [Errno 28] conv2d fp16 on gw3"
    )
    assert normalise(text) == (
        "at <addr>, commit <hex>, id <id>, <size>, <time>, <time>, layers.<n>.mlp <shape> <shape> exit code 137 "
        "signal 9 [Errno 28] conv2d fp16 on gw<n>"
    )


def test_the_card_lists_every_rule(tmp_path: Path) -> None:
    write_rows(tmp_path, [Row(model_id="org/a", result="ERROR", failure_stage="load", error="MemoryError: ")])
    card = render_card(tmp_path)
    assert "## Failure signatures" in card
    for rule in RULES:
        assert f"| {rule.name} | " in card and rule.why in card
    assert "This dataset: 1 signature(s) blocking 1 model(s)." in card
