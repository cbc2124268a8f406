"""End-to-end sweeps of the tiny zoo through the plugin, on CPU, as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from faultkit import session_rows

from pytest_neuron_support import zoo
from pytest_neuron_support.base.storage import slug
from pytest_neuron_support.catalog.load import load_catalog
from pytest_neuron_support.run.execution import run_script
from pytest_neuron_support.run.threads import cpu_threads, usable_cpus
from pytest_neuron_support.verdict.embeddings import DEFAULT_MIN_COSINE
from pytest_neuron_support.verdict.tolerance import MULTIPLE

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
#: The tasks whose rows carry greedy tokens.
TOKEN_TASKS = ("text-generation", "image-text-to-text")


def test_tiny_zoo_sweep_passes_every_architecture_with_four_workers_over_four_cores(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    shutil.copy(REPO / "models-tiny.yaml", pytester.path / "models-tiny.yaml")
    ids = {m.id for m in load_catalog(REPO / "models-tiny.yaml").models if m.exclude is None}
    result = pytester.runpytest_subprocess(
        "--device=cpu",
        "--models-file=models-tiny.yaml",
        "-n",
        "4",
        "--neuron-cores=4",
        "--results-dir=out",
        "--model-timeout=900",
    )
    assert result.ret == 0, session_rows(pytester.path / "out", failed_only=True)
    # One item per model, and one per Pipeline check: the text classifier's, the image classifier's and the CTC
    # recogniser's pass; the depth model's is the depth pipeline's known bfloat16 failure, held as its expectation
    # (an XFAIL).
    result.assert_outcomes(passed=len(ids) + 3, xfailed=1)
    result.stdout.fnmatch_lines(
        ["*neuron-support results*", f"1 ERROR, {len(ids) + 3} PASS", "Parquet: *out/data/*.parquet"]
    )

    every = pd.read_parquet(pytester.path / "out" / "data")
    assert overlapping_leases(every) == []  # the Pipeline checks' leases too
    pipelines = every[every.check == "pipeline"].set_index("model_id")
    assert sorted(pipelines.index) == [
        "tiny-random/depth-anything",
        "tiny-random/distilbert-sst2",
        "tiny-random/vit",
        "tiny-random/wav2vec2-ctc",
    ]
    # The image classifier's pipeline (transformers' image-classification, its top label) agrees with the direct
    # path's CPU reference by the forward rule.
    image = pipelines.loc["tiny-random/vit"]
    assert (image.result, image.verdict_basis, image.pipeline_class) == (
        "PASS",
        "forward-calibrated",
        "ImageClassificationPipeline",
    )
    classifier, depth = pipelines.loc["tiny-random/distilbert-sst2"], pipelines.loc["tiny-random/depth-anything"]
    assert (classifier.result, classifier.verdict_basis, classifier.pipeline_text) == (
        "PASS",
        "forward-calibrated",
        classifier.text,
    )
    assert (depth.result, depth.expectation) == ("ERROR", "met") and "ScalarType BFloat16" in depth.error
    # The CTC recogniser's pipeline (transformers' automatic-speech-recognition, the row's Hub pipeline tag).
    speech = pipelines.loc["tiny-random/wav2vec2-ctc"]
    assert (speech.result, speech.task, speech.pipeline_class) == (
        "PASS",
        "automatic-speech-recognition-ctc",
        "AutomaticSpeechRecognitionPipeline",
    )
    df = every[every.check == "inference"]
    assert sorted(df.model_id) == sorted(ids)  # one row per item
    assert set(df.result) == {"PASS"}
    for column in (
        "revision",
        "task",
        "failure_stage",
        "error",
        "neuron_cores",
        "dtype",
        "neuronx_cc",
        "torch_neuronx",
        "torch",
        "library",
        "library_version",
        "python",
        "device",
        "runscript",
        "timestamp",
    ):
        assert column in df.columns
    assert (df.graphs_compiled >= 1).all() and (df.recompiles == 0).all()
    # Mixed core counts shared one pool of 4 through the lease ledger: no core was ever double-booked,
    # and a lease covers the device run only (the verdict runs after it is released).
    assert set(df.neuron_cores) == {1, 2, 4}
    # The margin is the harness's own work inside the lease (starting the CPU side, rendering run.py): 2.7 s
    # for the pipeline under a loaded clean-clone run (fef5295), while a CPU check or judge that must stay
    # outside it takes 10 s and more.
    assert ((df.lease_end - df.lease_start) < df.run_s + 5.0).all(), df.lease_end - df.lease_start - df.run_s
    four = df.set_index("model_id").loc["tiny-random/olmo2"]
    assert (four.neuron_cores, four.tp_size, four.first_core, four.judge_verdict) == (4, 4, 0, "fluent")
    sharded = df[df.neuron_cores == 2]
    assert sorted(sharded.model_id) == ["tiny-random/mistral", "tiny-random/mixtral", "tiny-random/qwen3_moe"]
    assert (sharded.tp_size == 2).all() and (sharded.judge_model == "tiny-random/judge").all()
    assert (sharded.judge_verdict == "fluent").all() and sharded.distributed_config.notna().all()
    # Every PASS rests on CPU evidence, sharded ones too; the judge's verdict is kept beside it.
    rows = df.set_index("model_id")
    single = rows[(rows.neuron_cores == 1) & rows.task.isin(TOKEN_TASKS)]
    assert (single.verdict_basis == "parity+teacher-forced").all() and (single.reference_match == True).all()  # noqa: E712
    assert (rows[rows.neuron_cores > 1].verdict_basis == "teacher-forced").all()
    assert (rows[rows.neuron_cores > 1].cpu_check == "ran").all()
    assert rows.loc[zoo.MINILM_REPO, "verdict_basis"] == "embedding-calibrated"
    generation = rows[rows.task.isin(TOKEN_TASKS)]
    assert (generation.positions_checked == 32).all() and (generation.positions_disagreeing == 0).all()
    assert (generation.max_logprob_deficit == 0).all() and generation.first_disagreement.isna().all()
    assert (rows.repeat_identical == True).all()  # noqa: E712  (the warm run was checked, and agreed)
    assert rows.excess_graphs.notna().all() and rows.graph_breaks.notna().all()
    # Dynamo's recompile limit (8 graphs of one function): a run that hit it says so, with the guard that
    # failed last, and one that did not says nothing. With transformers 5.24 gemma3_text and phi3 hit it:
    # their sliding-window static cache layers guard on a Python int that grows at every decoding step.
    hit = rows.recompile_limit.notna()
    # The two carry it as their catalog expectation (expect:), met: known, with the upstream issue.
    assert set(rows.index[hit]) == {"tiny-random/gemma3_text", "tiny-random/phi3"}
    assert (rows.expectation[hit] == "met").all() and rows.expected_reason[hit].str.contains("issues/44609").all()
    assert rows.expectation[~hit].isna().all()
    assert (hit == (rows.graphs_compiled >= 8)).all(), rows[["graphs_compiled", "recompile_limit"]]
    assert rows.recompile_limit[hit].str.startswith("torch._dynamo hit config.recompile_limit (8); function: ").all()
    assert rows.recompile_limit[hit].str.contains("; last reason: ").all(), rows.recompile_limit[hit]
    # No run loads a device backend: the CPU side's switch, and the cpu row's own (a trn2 host's torch-neuronx would
    # otherwise load into a --device=cpu run), so one warm interpreter serves both sides.
    runs = pytester.path / "out" / "runs" / "tiny-random--qwen3" / "cpu"
    reference = json.loads((runs / "reference" / "result.json").read_text())
    row_env = {"TORCHINDUCTOR_VEC_ISA_OK": "1", "TORCHINDUCTOR_CPP_WRAPPER": "1"}  # the cpu row's, as run.py set them
    assert reference["environment"] == {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **row_env}
    device = json.loads((runs / "device" / "result.json").read_text())
    assert device["environment"] == {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **row_env}
    # A one-rank run compiles with inductor's C++ wrapper (the cpu row's unsharded_env); a sharded run's ranks
    # keep the Python wrapper, which can call a tensor-parallel graph's ops.
    sharded_run = pytester.path / "out" / "runs" / "tiny-random--olmo2" / "cpu" / "device" / "result.json"
    assert json.loads(sharded_run.read_text())["environment"]["TORCHINDUCTOR_CPP_WRAPPER"] is None
    assert (df.compile_s > 0).all() and (df.load_s > 0).all() and (df.run_s > df.first_generate_s).all()
    # The warm run's split: its first token within it, and 31 more decoded at a measured rate.
    warm = df[df.task.isin(TOKEN_TASKS)]
    assert (warm.time_to_first_token_s > 0).all() and (warm.time_to_first_token_s < warm.generate_s).all()
    assert (warm.decode_tokens_per_s > 0).all()
    # The rate is exactly the 31 tokens after the first over the span from the first to the last (the
    # device run's result.json keeps the span; the row rounds the rate to 3 decimals), and that span
    # lies inside the warm run after its first token (both row figures rounded to the millisecond).
    for model_id, rate, ttft, warm_s in warm[
        ["model_id", "decode_tokens_per_s", "time_to_first_token_s", "generate_s"]
    ].itertuples(index=False):
        run = json.loads(
            (pytester.path / "out" / "runs" / slug(model_id) / "cpu" / "device" / "result.json").read_text()
        )
        assert run["decode_tokens_per_s"] * run["decode_s"] == pytest.approx(31), model_id
        assert rate == pytest.approx(run["decode_tokens_per_s"], abs=1e-3), model_id
        assert ttft + run["decode_s"] <= warm_s + 0.002, (model_id, ttft, run["decode_s"], warm_s)
    # Every task of the catalog: text, a vision-language model, a real sentence-embedding model, a
    # text-to-image pipeline, a speech recognition model and one model of each forward task.
    tasks = {"text-generation", "image-text-to-text", "sentence-similarity", "text-to-image"}
    deciding = {
        "text-classification",
        "zero-shot-classification",
        "token-classification",
        "fill-mask",
        "image-classification",
        "audio-classification",
        "automatic-speech-recognition-ctc",
        "zero-shot-image-classification",
        "object-detection",
        "image-segmentation",
    }
    numbers_only = {"image-feature-extraction", "depth-estimation"}
    assert set(df.task) == {*tasks, *deciding, *numbers_only, "automatic-speech-recognition", "text2text-generation"}
    forward = rows[rows.task.isin(deciding | numbers_only)]
    assert (forward.verdict_basis == "forward-calibrated").all() and (forward.noise_ratio <= MULTIPLE).all()
    decided = rows[rows.task.isin(deciding)]
    assert (decided.positions_checked > 0).all() and (decided.positions_disagreeing == 0).all()
    assert rows[rows.task.isin(numbers_only)].positions_checked.isna().all()
    generated = df[df.task.isin(TOKEN_TASKS)]
    assert (generated.tokens.map(len) == 32).all()
    # Only one-core runs have a free-running reference to match a prefix against.
    assert (generated[generated.neuron_cores == 1].matched_prefix == 32).all()
    assert df.set_index("model_id").loc["tiny-random/llava", "task"] == "image-text-to-text"
    embedded = df[df.task == "sentence-similarity"]
    assert list(embedded.model_id) == [zoo.MINILM_REPO]
    assert (embedded.min_cosine >= DEFAULT_MIN_COSINE).all() and (embedded.tokens.map(len) == 0).all()
    assert (df.neuronx_cc == "none").all()
    # Each row names its task's own library: the pipeline's is diffusers (its own Parquet file), the rest transformers.
    assert (df.library == df.task.map(lambda task: "diffusers" if task == "text-to-image" else "transformers")).all()
    # Every run shared the CPUs with the other workers' runs instead of sizing its pool to the machine.
    assert (df.cpu_threads == cpu_threads(usable_cpus(), 4)).all(), df.cpu_threads
    # Each run.py holds its task's own code: static-cache generation for the generation tasks only.
    assert generated.runscript.str.contains('"cache_implementation": "static"').all()
    assert not embedded.runscript.str.contains("cache_implementation").any()
    pictured = rows.loc[zoo.PIPELINE_REPO]
    assert (pictured.verdict_basis, pictured.cpu_check) == ("pipeline-teacher-forced", "ran")
    assert len(pictured.numeric_stages) >= 13 and pictured.noise_ratio <= MULTIPLE
    assert pictured.image_psnr > 20 and len(pictured.tokens) == 0
    assert (pytester.path / "out" / pictured.image).is_file() and (
        pytester.path / "out" / pictured.reference_image
    ).is_file()
    # That the stored run.py is the one that ran is checked by running it again: see
    # test_parity_failure_and_load_error_are_rows_and_the_sweep_goes_on.


def overlapping_leases(df: pd.DataFrame) -> list[tuple[str, str]]:
    """Pairs of rows that held a common core at the same time."""
    rows = list(df[["model_id", "first_core", "neuron_cores", "lease_start", "lease_end"]].itertuples(index=False))
    clashes = []
    for i, a in enumerate(rows):
        for b in rows[:i]:
            cores_a = set(range(int(a.first_core), int(a.first_core + a.neuron_cores)))
            cores_b = set(range(int(b.first_core), int(b.first_core + b.neuron_cores)))
            if cores_a & cores_b and a.lease_start < b.lease_end and b.lease_start < a.lease_end:
                clashes.append((a.model_id, b.model_id))
    return clashes


def test_the_overlap_check_catches_a_double_booking() -> None:
    df = pd.DataFrame(
        {
            "model_id": ["a", "b"],
            "first_core": [0, 1],
            "neuron_cores": [2, 1],
            "lease_start": [0.0, 1.0],
            "lease_end": [2.0, 3.0],
        }
    )
    assert overlapping_leases(df) == [("b", "a")]


PERTURB = """
def pytest_neuron_support_post_load(config, model):
    if model.id == "tiny-random/llama":
        # test-only perturbation of the device run: the CPU reference stays clean
        return "with torch.no_grad():\\n    model.model.norm.weight.mul_(-1.0)\\n"
    return None
"""


@pytest.mark.usefixtures("eager_compile")
def test_parity_failure_and_load_error_are_rows_and_the_sweep_goes_on(
    pytester: pytest.Pytester,
    offline_hub: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # A private copy of the zoo cache plus a checkpoint whose weights file is cut short.
    cache = pytester.path / "hub"
    shutil.copytree(offline_hub, cache, symlinks=True)
    llama = (
        cache
        / "models--tiny-random--llama"
        / "snapshots"
        / (cache / "models--tiny-random--llama" / "refs" / "main").read_text().strip()
    )
    broken = pytester.path / "broken"
    broken.mkdir()
    for file in llama.iterdir():
        data = file.read_bytes()
        (broken / file.name).write_bytes(data[: len(data) // 2] if file.suffix == ".safetensors" else data)
    zoo.install_snapshot(cache, "tiny-broken/truncated", broken)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    pytester.makeconftest(PERTURB)
    pytester.makefile(
        ".yaml",
        models=(
            "models:\n"
            f"  - id: tiny-random/llama\n    task: text-generation\n    prompt: {zoo.TINY_PROMPT!r}\n"
            "  - id: tiny-broken/truncated\n    task: text-generation\n"
            f"  - id: tiny-random/qwen3\n    task: text-generation\n    prompt: {zoo.TINY_PROMPT!r}\n"
        ),
    )
    result = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=out")
    result.assert_outcomes(passed=1, failed=2)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    llama = df.loc["tiny-random/llama"]
    assert llama.result == "FAIL" and llama.failure_stage == "parity"
    # The divergence the row reports is where the two runs' own results (result.json, written by
    # run.py, not by the row builder) first differ.
    runs = pytester.path / "out" / "runs" / "tiny-random--llama" / "cpu"
    device = json.loads((runs / "device" / "result.json").read_text())["tokens"]
    reference = json.loads((runs / "reference" / "result.json").read_text())["tokens"]
    first = next(i for i, (d, r) in enumerate(zip(device, reference, strict=True)) if d != r)
    assert (llama.first_divergence, llama.matched_prefix) == (first, first)
    assert (llama.device_token, llama.reference_token) == (device[first], reference[first])
    assert "model.model.norm.weight.mul_(-1.0)" in llama.runscript
    # The row's run.py is the one that ran: run alone, it gives the row's (perturbed) tokens again.
    again = tmp_path_factory.mktemp("rerun")
    (again / "run.py").write_text(llama.runscript)
    outcome = run_script(again / "run.py", again / "result.json", env=os.environ, timeout=600, log_path=again / "log")
    assert outcome.result is not None and outcome.result["ok"], outcome.log_tail()
    assert outcome.result["tokens"] == list(llama.tokens) == device
    broken = df.loc["tiny-broken/truncated"]
    assert broken.result == "ERROR" and broken.failure_stage == "load"
    assert df.loc["tiny-random/qwen3", "result"] == "PASS"
