"""Forward tasks (text, token, image and audio classification, fill-mask, image features, depth, object
detection, segmentation): one compiled forward pass, its outputs under the calibrated tolerance rule and its
decisions where the CPU is decisive. The rules as pure functions, then the tiny zoo's forward models through
the plugin as users run them, healthy, with a fault planted in each one's head on the device side only, and
through their pipelines."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support import zoo
from pytest_neuron_support.base.storage import slug
from pytest_neuron_support.run.runscript import TEST_CARD_SIZE, template, with_spec
from pytest_neuron_support.tasks.forward import INPUT_FRAGMENTS, ITEMS, ForwardTask, Reading
from pytest_neuron_support.tasks.table import TASKS, task_of
from pytest_neuron_support.verdict import decide
from pytest_neuron_support.verdict.decisions import compare_decisions, noise_of, top_two
from pytest_neuron_support.verdict.tolerance import FLOOR, MULTIPLE, calibrated_outputs

# --- the decision rule ------------------------------------------------------------------------------


def test_top_two_gives_the_winner_and_its_lead() -> None:
    assert top_two([0.1, 2.0, 1.5]) == (1, pytest.approx(0.5))
    assert top_two([1.0, -math.inf]) == (0, math.inf)  # a lead over a masked class
    assert math.isnan(top_two([1.0, math.nan])[1])


def test_the_noise_is_how_far_rounding_moves_the_lead_at_least_the_floor() -> None:
    # The lead (2 - 1) moved by 0.5; one score's typical move is 0.5 / sqrt(2), a difference's 0.5.
    assert noise_of([1.0, 2.0], [1.0, 2.5]) == pytest.approx(0.5)
    assert noise_of([10.0, -20.0], [10.0, -20.0]) == pytest.approx(FLOOR * 20.0)
    # Both winners moved alike, so the lead did not move: the typical move of the others still counts, so a
    # lead that rounding happened to leave alone is not taken as exact.
    moved = noise_of([5.0, 4.0, 0.0, 0.0], [5.1, 4.1, 0.1, -0.1])
    assert moved == pytest.approx(math.sqrt(2 * (4 * 0.01) / 4))
    # Over a vocabulary, one far-off score does not make every lead a near-tie: the lead's own move decides.
    vocabulary = [0.0] * 999 + [3.0]
    assert noise_of(vocabulary, [*([0.0] * 998), 0.5, 3.0]) < 0.05
    # NaN anywhere, or an inf the other side lacks: no noise can be known.
    assert noise_of([1.0, 2.0], [math.nan, 2.0]) == math.inf == noise_of([1.0, 2.0], [1.0, math.nan])


def test_a_one_score_head_decides_by_its_sign() -> None:
    # A reranker's single logit: positive is 1, its lead is its distance from 0.
    assert top_two([-2.5]) == (0, 2.5) and top_two([0.7]) == (1, pytest.approx(0.7))
    flipped = compare_decisions([[0.3]], [[-5.0]], [[-5.01]])
    assert not flipped.match and (flipped.device, flipped.cpu) == (1, 0)
    assert compare_decisions([[-4.9]], [[-5.0]], [[-5.01]]).match


def test_a_class_masked_with_minus_inf_on_both_sides_is_no_fault() -> None:
    masked = [[-math.inf, 1.0, 0.0]]
    assert compare_decisions(masked, masked, masked).match
    # An inf the CPU does not have is the device's fault, decisively.
    found = compare_decisions([[math.inf, 1.0, 0.0]], [[0.5, 1.0, 0.0]], [[0.5, 1.0, 0.0]])
    assert not found.match and found.decisive_disagreeing == 1


def test_agreeing_decisions_match() -> None:
    f32 = [[0.0, 4.0], [3.0, 0.0]]
    found = compare_decisions(f32, f32, f32)
    assert found.match and (found.checked, found.disagreeing, found.first) == (2, 0, None)
    assert found.near_ties_only is None


def test_a_decisive_disagreement_fails_and_names_the_item_and_both_sides() -> None:
    f32 = [[0.0, 4.0], [3.0, 0.0]]
    noise = [[0.01, 4.01], [3.0, 0.0]]
    device = [[0.0, 4.0], [0.0, 3.0]]  # item 1 flipped
    found = compare_decisions(device, f32, noise)
    assert not found.match and (found.first, found.device, found.cpu) == (1, 1, 0)
    assert found.decisive_disagreeing == 1 and found.near_ties_only is False
    text = found.describe("text-classification decisions", ["POSITIVE", "POSITIVE"], ["POSITIVE", "NEGATIVE"])
    assert "first at item 1: device 'POSITIVE' (1), CPU 'NEGATIVE' (0)" in text and "decisive:" in text


def test_a_near_tie_disagreement_is_reported_not_failed() -> None:
    # The CPU's margin (0.01) is within 3x what bf16 rounding moved a score (0.02): rounding can close it.
    f32 = [[1.0, 1.01]]
    noise = [[1.02, 1.01]]
    found = compare_decisions([[1.01, 1.0]], f32, noise)
    assert found.match and found.disagreeing == 1 and found.decisive_disagreeing == 0
    assert found.near_ties_only is True and found.first == 0
    # The same flip at a margin the dtype cannot close is decisive.
    assert not compare_decisions([[1.01, 1.0]], [[1.0, 2.0]], [[1.02, 2.0]]).match


def test_a_device_item_that_is_not_a_number_never_agrees() -> None:
    found = compare_decisions([[math.nan, 1.0]], [[0.0, 1.0]], [[0.0, 1.0]])
    assert not found.match and found.decisive_disagreeing == 1


def test_items_that_cannot_be_paired_are_a_problem_never_a_pass() -> None:
    assert compare_decisions([[1.0]], [[1.0], [2.0]], [[1.0], [2.0]]).problem is not None
    assert compare_decisions([], [], []).problem is not None
    assert compare_decisions([[1.0, 2.0]], [[1.0]], [[1.0]]).problem is not None


def test_the_forward_verdict_needs_the_numbers_and_the_decisions() -> None:
    f32 = [[0.0, 4.0], [3.0, 0.0]]
    noise = [[0.004, 4.0], [3.0, 0.003]]
    healthy = [[0.002, 4.001], [3.001, 0.001]]
    ok = decide.forward(
        calibrated_outputs("logits", healthy, f32, noise), compare_decisions(healthy, f32, noise), "t logits"
    )
    assert (ok.result, ok.verdict_basis) == ("PASS", decide.FORWARD_BASIS)
    # Numbers off by 5 % with every decision unchanged: the numbers fail it.
    scaled = [[x * 1.05 for x in v] for v in f32]
    numbers = decide.forward(
        calibrated_outputs("logits", scaled, f32, noise), compare_decisions(scaled, f32, noise), "t logits"
    )
    assert (numbers.result, numbers.failure_stage) == ("FAIL", "parity")
    assert "t logits: logits at step 0" in str(numbers.error) and "decisions" not in str(numbers.error)
    # Labels swapped: both fail, and the error names both.
    swapped = [list(reversed(v)) for v in f32]
    both = decide.forward(
        calibrated_outputs("logits", swapped, f32, noise), compare_decisions(swapped, f32, noise), "t logits"
    )
    assert both.result == "FAIL" and "t logits: logits at step 0" in str(both.error)
    assert "t decisions: 2 of 2 decisions differ" in str(both.error)


def test_every_forward_row_reads_an_output_its_fragment_knows() -> None:
    rows = [task for task in TASKS.values() if isinstance(task, ForwardTask)]
    assert {task.name for task in rows} >= set(MODELS)
    for task in rows:
        assert task.reading.items in ITEMS and task.fragments[-1] == "forward.py"
        assert task.fragments[:2] == ("transformers.py", INPUT_FRAGMENTS[task.reading.inputs])
        # Word-pieces and masks are a text's items; positions an image's queries or a waveform's frames; pixels an
        # image's.
        assert task.reading.inputs == "text" or task.reading.items not in ("tokens", "mask")
        assert task.reading.inputs != "text" or task.reading.items != "positions"
        assert task.reading.inputs == "image" or task.reading.items != "pixels"
        # A task without a decision reads each input's whole output (its features, its depth map).
        assert task.reading.decides or task.reading.items == "sequence"
        # Every row names its registry, but a zero-shot classifier's: its NLI models are text-classification's.
        text_zero_shot = bool(task.reading.candidate_labels) and task.reading.inputs == "text"
        assert (task.registry is None) == text_zero_shot
        assert not task.generates and not task.takes_prompt
        if task.reading.items == "mask":
            assert all("{mask}" in sentence for sentence in task.reading.sentences)


def test_a_reading_with_items_run_py_cannot_read_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Reading\.items = .boxes.: one of sequence, tokens, mask, positions, pixels"):
        Reading("logits", "boxes")


def test_a_reading_judged_per_input_joins_each_inputs_items_and_still_fails_a_fault() -> None:
    # Two inputs of three frames each. Frame 1 of input 0: its own dtype noise happens to be tiny and the device's
    # rounding ordinary, a ratio of 10 on its own; across the whole input, device and noise are alike.
    per_item = ForwardTask("frames", "AutoModelForCTC", None, Reading("logits", "positions", inputs="audio"))
    per_input = ForwardTask(
        "frames", "AutoModelForCTC", None, Reading("logits", "positions", inputs="audio", numbers_per="input")
    )
    f32 = [[4.0, 1.0], [3.0, 2.0], [1.0, 5.0]] * 2
    noise = [[4.02, 1.0], [3.0, 2.0005], [1.0, 5.02]] * 2
    device = [[4.0, 1.0], [3.0, 2.02], [1.0, 5.0], [4.02, 1.0], [3.0, 2.0], [1.0, 4.98]]
    items = [[i, frame] for i in range(2) for frame in range(3)]
    cpu = {"outputs": f32, "noise_outputs": noise, "items": items}
    frame_by_frame = per_item.compare_outputs({"outputs": device, "items": items}, cpu)
    assert not frame_by_frame.match and len(frame_by_frame.comparisons) == 6
    joined = per_input.compare_outputs({"outputs": device, "items": items}, cpu)
    assert joined.match and [c.label for c in joined.comparisons] == ["logits[0]", "logits[1]"]
    # A fault in one frame of input 1 is still far outside the whole input's noise, and names the input.
    faulty = [*device[:4], [2.0, 3.0], device[5]]
    checked = per_input.compare_outputs({"outputs": faulty, "items": items}, cpu)
    assert not checked.match and checked.first_bad is not None and checked.first_bad.label == "logits[1]"
    # Items the device did not read alike cannot be joined alike: never a PASS.
    short = per_input.compare_outputs({"outputs": device[:5], "items": items[:5]}, cpu)
    assert not short.match
    with pytest.raises(ValueError, match=r"Reading\.numbers_per = .frame.: item or input"):
        Reading("logits", "positions", numbers_per="frame")


def test_a_numbers_only_verdict_is_the_calibrated_tolerance_alone() -> None:
    f32 = [[1.0, 2.0, 3.0]]
    noise = [[1.001, 2.002, 2.997]]
    ok = decide.forward(calibrated_outputs("depth", [[1.0005, 2.001, 2.999]], f32, noise), None, "d depth")
    assert (ok.result, ok.verdict_basis) == ("PASS", decide.FORWARD_BASIS)
    bad = decide.forward(calibrated_outputs("depth", [[3.0, 2.0, 1.0]], f32, noise), None, "d depth")
    assert bad.result == "FAIL" and "d depth: depth at step 0" in str(bad.error) and "decisions" not in str(bad.error)


def test_a_fault_in_an_output_compared_beside_the_scores_fails_naming_it() -> None:
    # A detector's boxes are compared item by item beside its class scores: a box wrong on the device alone
    # FAILs, though every score and decision agrees.
    task = task_of("object-detection")
    assert isinstance(task, ForwardTask) and task.reading.also == ("pred_boxes",)
    scores, boxes = [[4.0, 1.0, 0.5], [0.2, 3.0, 0.1]], [[0.5, 0.5, 0.2, 0.2], [0.3, 0.6, 0.1, 0.4]]
    noisy = [[[x * 1.001 for x in v] for v in vectors] for vectors in (scores, boxes)]
    cpu = {"outputs": scores, "also_outputs": {"pred_boxes": boxes}}
    cpu |= {"noise_outputs": noisy[0], "noise_also_outputs": {"pred_boxes": noisy[1]}}
    healthy = task.compare_outputs({"outputs": scores, "also_outputs": {"pred_boxes": boxes}}, cpu)
    assert healthy.match and healthy.stages() == ("logits", "pred_boxes")
    flipped = [list(reversed(box)) for box in boxes]
    checked = task.compare_outputs({"outputs": scores, "also_outputs": {"pred_boxes": flipped}}, cpu)
    bad = checked.first_bad
    assert not checked.match and bad is not None and (bad.stage, bad.step) == ("pred_boxes", 0)
    verdict = decide.forward(checked, compare_decisions(scores, scores, noisy[0]), "object-detection logits/pred_boxes")
    assert verdict.result == "FAIL" and "object-detection logits/pred_boxes: pred_boxes at step 0" in str(verdict.error)
    # A device run that returned no boxes compares nothing for them: never a PASS.
    missing = task.compare_outputs({"outputs": scores, "also_outputs": {}}, cpu)
    assert not missing.match and "pred_boxes" in str(missing.problem)


def test_a_segmentation_map_larger_than_the_grid_is_read_at_a_grid_of_pixels() -> None:
    # UperNet's logits come at the input's 512x512: 2 x 262,144 pixels of 150 classes would be the items. run.py
    # reads every n-th pixel of such a map (the same pixels on both sides), every pixel of a small one.
    task = task_of("image-segmentation")
    assert isinstance(task, ForwardTask)
    spec = {"sentences": [], "image_size": list(TEST_CARD_SIZE), "task_options": task.task_options()}
    namespace: dict[str, Any] = {"__name__": "template"}
    exec(compile(with_spec(template("run.py", task.fragments), spec), "run.py", "exec"), namespace)

    class Map:
        def __init__(self, *shape: int) -> None:
            self.shape = shape

    positions = namespace["item_positions"]
    small = positions(None, None, Map(2, 4, 16, 16), None)
    assert len(small) == 2 * 16 * 16 and small[:2] == [(0, 0, 0), (0, 0, 1)]
    large = positions(None, None, Map(2, 150, 512, 500), None)
    assert len(large) == 2 * 32 * 32 and large[:2] == [(0, 0, 0), (0, 0, 16)] and large[-1] == (1, 496, 496)


# --- through the plugin -------------------------------------------------------------------------------

#: Each forward model of the zoo, by task.
MODELS = {
    "text-classification": "tiny-random/distilbert-sst2",
    "zero-shot-classification": "tiny-random/distilbert-mnli",
    "token-classification": "tiny-random/bert-ner",
    "fill-mask": "tiny-random/roberta",
    "image-classification": "tiny-random/vit",
    "audio-classification": "tiny-random/wav2vec2-ks",
    "automatic-speech-recognition-ctc": "tiny-random/wav2vec2-ctc",
    "zero-shot-image-classification": "tiny-random/clip",
    "image-feature-extraction": "tiny-random/dinov2",
    "depth-estimation": "tiny-random/depth-anything",
    "object-detection": "tiny-random/yolos",
    "image-segmentation": "tiny-random/segformer",
}
FAULTY = "faulty"

#: Test-only faults in the device run (the CPU reference stays clean), by model: the head module and what
#: the fault does to its output. Class scores are rolled by one along their class axis, as a head kernel that
#: writes each class's score into its neighbour's slot would (a segmentation's classes are its second axis);
#: numbers without a decision (features, a depth map) are mirrored along their last axis. A hook on the head
#: module: Dynamo compiles it into the graph with the head.
ROLL = "out.roll(1, dims=-1)"
HEADS = {
    "distilbert-sst2": ("model.classifier", ROLL),
    "distilbert-mnli": ("model.classifier", ROLL),
    "bert-ner": ("model.classifier", ROLL),
    "roberta": ("model.get_output_embeddings()", ROLL),
    "vit": ("model.classifier", ROLL),
    "wav2vec2-ks": ("model.classifier", ROLL),
    "wav2vec2-ctc": ("model.lm_head", ROLL),
    # CLIP's candidate labels' text embeddings rolled by one label: each image scored against its neighbour's.
    "clip": ("model.text_projection", "out.roll(1, dims=0)"),
    "dinov2": ("model.layernorm", "out.flip(-1)"),
    "depth-anything": ("model.head", "out.flip(-1)"),
    "yolos": ("model.class_labels_classifier", ROLL),
    "segformer": ("model.decode_head.classifier", "out.roll(1, dims=1)"),
}
FAULT_HOOK = f"""
HEADS = {HEADS!r}


def pytest_neuron_support_post_load(config, model):
    if model.id.startswith({FAULTY + "/"!r}):
        head, fault = HEADS[model.id.split("/", 1)[1]]
        return f"head = {{head}}\\nhead.register_forward_hook(lambda module, args, out: {{fault}})\\n"
    return None
"""


def snapshot_of(cache: Path, repo: str) -> Path:
    snapshots = cache / f"models--{repo.replace('/', '--')}" / "snapshots"
    return next(snapshots.iterdir())


@pytest.fixture
def forward_hub(offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the zoo cache with each forward model under a second id, to be run faulty."""
    cache = tmp_path / "hub"
    shutil.copytree(offline_hub, cache, symlinks=True)
    for repo in MODELS.values():
        zoo.install_snapshot(cache, f"{FAULTY}/{repo.split('/')[1]}", snapshot_of(cache, repo))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.slow
def test_each_forward_task_passes_and_a_fault_in_its_head_fails_naming_the_output_and_the_decision(
    pytester: pytest.Pytester, forward_hub: Path
) -> None:
    pytester.makeconftest(FAULT_HOOK)
    entries = [(repo, task) for task, repo in MODELS.items()]
    entries += [(f"{FAULTY}/{repo.split('/')[1]}", task) for repo, task in entries]
    pytester.makefile(".yaml", models="models:\n" + "".join(f"  - {{id: {r}, task: {t}}}\n" for r, t in entries))
    result = pytester.runpytest_subprocess(
        "--device=cpu", "-n", "2", "--results-dir=out", "--reference-cache=none", "--model-timeout=900"
    )
    assert_outcomes(result, pytester.path / "out", passed=len(MODELS), failed=len(MODELS))
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    for task, repo in MODELS.items():
        reading = task_of(task).reading
        healthy = df.loc[repo]
        assert (healthy.result, healthy.task, healthy.verdict_basis) == ("PASS", task, "forward-calibrated")
        assert healthy.reference_match and healthy.reference_dtype == "float32" and healthy["dtype"] == "bfloat16"
        assert healthy.evidence_stage in reading.outputs and 0 < healthy.noise_ratio <= MULTIPLE
        # Every output is compared item by item (a detector's boxes beside its scores), or input by input (a CTC
        # recogniser's frames of each waveform joined).
        assert {stage.split("[")[0] for stage in healthy.numeric_stages} == set(reading.outputs)
        items = len(healthy.numeric_stages) // len(reading.outputs)
        if reading.numbers_per == "input":
            # The waveform and its reverse, 74 frames each.
            assert items == 2 and healthy.positions_checked == 148 and healthy.positions_disagreeing == 0
        elif reading.decides:
            assert healthy.positions_checked == items > 0 and healthy.positions_disagreeing == 0
        else:
            assert pd.isna(healthy.positions_checked) and items == 2  # the test card and its mirror image
        # One static shape: nothing compiles twice (wav2vec2's forward breaks into two graphs, which its row
        # records as graph breaks: docs/tasks.md).
        assert healthy.graphs_compiled >= 1 and healthy.recompiles == 0 and len(healthy.tokens) == 0 and healthy.text
        assert "AutoModel" in healthy.runscript and "def run_forward(" in healthy.runscript

        faulty = df.loc[f"{FAULTY}/{repo.split('/')[1]}"]
        assert (faulty.result, faulty.failure_stage, faulty.verdict_basis) == ("FAIL", "parity", "forward-calibrated")
        assert not faulty.reference_match and faulty.noise_ratio > MULTIPLE
        # The error names the output out of tolerance and the decision that differs, with both sides' labels.
        what = f"{task} {'/'.join(reading.outputs)}: {reading.output} at step 0: relative distance from float32"
        assert what in faulty.error, faulty.error
        if reading.decides:
            assert f"{task} decisions: " in faulty.error and "where the CPU was decisive" in faulty.error
            assert faulty.positions_disagreeing > 0 and faulty.disagreements_near_tie is False
        else:
            assert "decisions" not in faulty.error
        assert "register_forward_hook" in faulty.runscript

    # run.py reads each decision as transformers' own pipeline does: the CPU reference's labels are the
    # pipeline's (in a subprocess: torch imported inside a pytester test would be dropped from sys.modules).
    references = {
        task: json.loads(
            (pytester.path / "out" / "runs" / slug(MODELS[task]) / "cpu" / "reference" / "result.json").read_text()
        )
        for task in PIPELINE_LABELS
    }
    labels = pipeline_labels({task: MODELS[task] for task in PIPELINE_LABELS}, pytester.path)
    for task, reference in references.items():
        assert len(labels[task]) == len(reference["items"]), (task, labels[task], reference["items"])
        assert labels[task] == reference["decision_labels"], task


#: The tasks whose pipeline answers one label per item run.py reads (a detector's pipeline keeps only the
#: queries above its threshold, a segmentation's one mask per label: the pipeline check compares those).
PIPELINE_LABELS = (
    "text-classification",
    "token-classification",
    "fill-mask",
    "image-classification",
    "audio-classification",
)


def pipeline_labels(repos: dict[str, str], folder: Path) -> dict[str, list[str]]:
    """What ``transformers.pipeline(task)`` decides for each task's sentences (or images, or waveforms), item by
    item, for each ``{task: repo}``: one script in ``folder``, one subprocess for them all (torch and transformers
    imported once)."""
    readers = []
    for task, repo in repos.items():
        forward = task_of(task)
        assert isinstance(forward, ForwardTask)
        # run.py's own test card and waveform, drawn by the template's code (as the zoo draws them).
        spec = {"sentences": [], "image_size": list(TEST_CARD_SIZE), "task_options": forward.task_options()}
        source = with_spec(template("run.py", forward.fragments), spec)
        rate = forward.task_options().get("audio", {}).get("sample_rate")
        readers.append(f"""
namespace = {{"__name__": "template"}}
exec(compile({source!r}, "run.py", "exec"), namespace)
pipe = transformers.pipeline({task!r}, model={repo!r}, dtype="float32")
if {task!r} == "image-classification":
    card = namespace["fixed_image"](torch, *{list(TEST_CARD_SIZE)!r})
    images = [Image.fromarray(c.permute(1, 2, 0).numpy()) for c in (card, card.flip(-1))]
    labels = [found[0]["label"] for found in pipe(images)]
elif {task!r} == "audio-classification":
    wave = namespace["fixed_audio"](torch)
    labels = [pipe({{"raw": w.numpy(), "sampling_rate": {rate!r}}})[0]["label"] for w in (wave, wave.flip(0))]
else:
    texts = [s.replace("{{mask}}", pipe.tokenizer.mask_token or "") for s in {list(forward.reading.sentences)!r}]
    if {task!r} == "text-classification":
        labels = [out["label"] for out in pipe(texts)]
    elif {task!r} == "token-classification":
        labels = [entity["entity"] for sentence in pipe(texts, ignore_labels=[]) for entity in sentence]
    else:
        labels = [found[0]["token_str"].strip() for found in (pipe(t, top_k=1) for t in texts)]
found[{task!r}] = labels
""")
    script = "import json, torch, transformers\nfrom PIL import Image\nfound = {}\n" + "".join(readers)
    script += "print(json.dumps(found))\n"
    (folder / "pipeline_labels.py").write_text(script, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "pipeline_labels.py"], cwd=folder, capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    labels: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(labels) == sorted(repos), labels
    return labels


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.slow
def test_each_forward_task_passes_through_its_pipeline_and_the_pipeline_answers_what_the_device_decided(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    entries = "".join(
        f"  - {{id: {repo}, task: {task}, checks: [pipeline]{DEPTH_BF16 if task == 'depth-estimation' else ''}}}\n"
        for task, repo in MODELS.items()
    )
    pytester.makefile(".yaml", models="models:\n" + entries)
    result = pytester.runpytest_subprocess(
        "--device=cpu", "-n", "2", "--results-dir=out", "--reference-cache=none", "--model-timeout=900"
    )
    assert_outcomes(result, pytester.path / "out", passed=len(MODELS) - 1, xfailed=1)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    for task, repo in MODELS.items():
        row = df.loc[repo]
        if task == "depth-estimation":
            # transformers' depth pipeline cannot postprocess a bfloat16 depth map (numpy has no bfloat16): the
            # pipeline fails after the forward pass, the row says where and why, and the catalog's expectation
            # holds it as known.
            assert (row.check, row.result, row.expectation) == ("pipeline", "ERROR", "met"), task
            assert "TypeError: Got unsupported ScalarType BFloat16" in row.error
            continue
        reading = task_of(task).reading
        assert (row.check, row.result, row.verdict_basis) == ("pipeline", "PASS", "forward-calibrated"), task
        assert list(row.model_devices) == ["cpu"] and row.pipeline_class.endswith("Pipeline")
        items = len(row.numeric_stages) // len(reading.outputs)
        assert items > 0 and row.noise_ratio <= MULTIPLE
        if reading.numbers_per == "input":
            assert items == 2 and row.positions_checked == 148  # two waveforms, 74 frames each
        else:
            assert row.positions_checked == items if reading.decides else pd.isna(row.positions_checked)
        assert "pipe.model = torch.compile(pipe.model" in row.runscript and row.graphs_compiled >= 1
        # The warm second call compiles nothing new.
        assert row.recompiles == 0
        if task in ("token-classification", "zero-shot-classification"):
            # Its pipeline pads nothing: each sentence (or sentence and hypothesis) length compiled a graph of its
            # own, and the row says so.
            assert row.graphs_compiled > 1 and row.excess_graphs == row.graphs_compiled - 1
        elif task not in ("audio-classification", "automatic-speech-recognition-ctc", "image-segmentation"):
            # wav2vec2's and SegFormer's forwards break into two graphs (docs/tasks.md).
            assert row.graphs_compiled == 1 and row.excess_graphs == 0
        # The pipeline's own answer is the decision the device made, item by item.
        if task in ("text-classification", "image-classification", "audio-classification"):
            assert row.pipeline_text == row.text, (row.pipeline_text, row.text)
        elif task == "automatic-speech-recognition-ctc":
            # Its pipeline's answer is the transcription CTC decoding makes of the device's frames (repeats merged,
            # blanks dropped): the characters the tiny model was trained to say, frame by frame, in turn.
            said = row.pipeline_text.split("; ")
            assert len(said) == 2 and all(s.startswith("\"<s></s><unk> ETAONIHSRDLUMWCFGYPBVK'XJQZ<s>") for s in said)
            assert row.pipeline_class == "AutomaticSpeechRecognitionPipeline"
        elif task == "zero-shot-image-classification":
            # The pipeline's best label for each image is the device's decision, named as the candidate label.
            assert row.pipeline_text == row.text == "a test card; a mirrored test card", row.text
        elif task == "zero-shot-classification":
            # Each sentence's best label is the one whose hypothesis the tiny NLI model was trained to entail
            # (zoo/spec.py), and each pair's class is the one it was trained to give.
            assert row.pipeline_text == "animals; complaint; question", row.pipeline_text
            assert row.text.split("; ") == [
                ["ENTAILMENT", "NEUTRAL", "CONTRADICTION"][i] for i in (2, 2, 0, 0, 2, 1, 1, 0, 2)
            ]
        else:
            assert row.pipeline_text and row.text


#: The depth pipeline's known bfloat16 failure, as the catalogs hold it (models.yaml, models-tiny.yaml).
DEPTH_BF16 = (
    ", expect: {check: pipeline, result: ERROR, stage: compile, "
    'signature: "compile: TypeError: Got unsupported ScalarType BFloat16", reason: "numpy has no bfloat16"}'
)
