"""Registry coverage (``neuron-support coverage``): every architecture the installed transformers and diffusers
map for a catalog task is covered by a Selected entry, excluded with a reason, or missing, and the shipped
catalog leaves none missing. A covering tag is checked against its checkpoint's own config (the tiny zoo's
cache, a loopback Hub's model info): one the checkpoint contradicts covers nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hubserver import HubServer, ModelRecord

from pytest_neuron_support.catalog.coverage import (
    COVERED,
    EXCLUDED,
    MISMATCH,
    MISSING,
    UNVERIFIED,
    VERIFIED,
    Reading,
    check_tag,
    coverage,
    registry_of,
    task_coverage,
)
from pytest_neuron_support.catalog.load import CatalogError, load_catalog, parse_catalog
from pytest_neuron_support.tasks.table import TASKS

REPO = Path(__file__).resolve().parent.parent
COUNTS = re.compile(
    r"^(?P<task>[a-z0-9-]+) \((?P<registry>[^)]*), (?P<total>\d+) architectures\): "
    r"(?P<covered>\d+) covered, (?P<excluded>\d+) excluded, (?P<missing>\d+) missing$"
)


def run_coverage(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", "coverage", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


def counts(stdout: str) -> dict[str, dict[str, int]]:
    found = {}
    for line in stdout.splitlines():
        if match := COUNTS.match(line):
            found[match["task"]] = {k: int(match[k]) for k in ("total", "covered", "excluded", "missing")}
    return found


def test_the_shipped_catalog_covers_or_excludes_every_architecture_of_every_tracked_task() -> None:
    done = run_coverage()
    assert done.returncode == 0, done.stdout + done.stderr
    tracked = counts(done.stdout)
    # Every catalog task with a registry is reported; the embedding tasks say they are not tracked.
    assert set(tracked) == {name for name, task in TASKS.items() if task.registry is not None}
    assert "feature-extraction: not tracked" in done.stdout
    for task, figures in tracked.items():
        assert figures["missing"] == 0 and figures["covered"] + figures["excluded"] == figures["total"], task
        assert figures["covered"] > 0, task
    # text generation is read from transformers' causal-LM auto mapping, all of it.
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert tracked["text-generation"]["total"] == len(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def test_an_architecture_whose_only_entry_is_removed_is_missing_and_the_command_fails(tmp_path: Path) -> None:
    text = (REPO / "models.yaml").read_text(encoding="utf-8")
    entry = "  - id: facebook/opt-125m\n    task: text-generation\n    tags: [opt, dense]\n"
    assert entry in text
    (tmp_path / "models.yaml").write_text(text.replace(entry, ""), encoding="utf-8")
    done = run_coverage("--models-file=models.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "  missing  opt (OPTForCausalLM): neither covered nor excluded" in done.stdout
    assert counts(done.stdout)["text-generation"]["missing"] == 1
    assert "select a checkpoint tagged with each missing architecture" in done.stderr


def catalog_with(coverage_yaml: str) -> str:
    return (
        "models:\n"
        "  - id: org/llama\n    task: text-generation\n    tags: [llama]\n"
        "  - id: org/falcon\n    task: text-generation\n    tags: [falcon]\n"
        "    exclude: {reason: low-priority, note: a 2023 model}\n" + coverage_yaml
    )


def test_each_architecture_is_covered_excluded_or_missing_and_stale_or_contradicting_exclusions_fail() -> None:
    text = catalog_with(
        "coverage:\n  text-generation:\n"
        "    - reason: an encoder's decoder head\n      architectures: [bert, llama, not_an_architecture]\n"
    )
    # Both checkpoints say what their tags say (the tag checks have tests of their own below).
    said = {"org/llama": Reading("llama", "the Hugging Face cache"), "org/falcon": Reading("falcon", "the Hub API")}
    report = task_coverage(parse_catalog(text, "m.yaml"), "text-generation", said)
    by_name = {a.name: a for a in report.architectures}
    assert (by_name["llama"].status, by_name["llama"].entries) == (COVERED, ("org/llama",))
    assert (by_name["bert"].status, by_name["bert"].reason) == (EXCLUDED, "an encoder's decoder head")
    # An architecture only an excluded entry carries is excluded with that entry's reason.
    assert by_name["falcon"].status == EXCLUDED and by_name["falcon"].reason == (
        "org/falcon excluded (low-priority: a 2023 model)"
    )
    assert by_name["gpt2"].status == MISSING
    assert report.stale == ("not_an_architecture",) and report.contradictions == ("llama",)
    assert not report.complete
    # Only the tasks the catalog has entries of are reported.
    assert [t.task for t in coverage(parse_catalog(text, "m.yaml"))] == ["text-generation"]


def test_the_cli_lists_stale_and_contradicting_exclusions(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(
        catalog_with(
            "coverage:\n  text-generation:\n    - reason: r\n      architectures: [llama, not_an_architecture]\n"
        )
    )
    done = run_coverage("--models-file=m.yaml", "--task=text-generation", "--list", cwd=tmp_path)
    assert done.returncode == 1
    assert "  stale    not_an_architecture: excluded under coverage: text-generation" in done.stdout
    assert "  both     llama: excluded under coverage: text-generation, and a Selected entry covers it" in done.stdout
    assert "  covered  llama (LlamaForCausalLM): org/llama" in done.stdout


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ("coverage: [bert]\n", "m.yaml:9: 'coverage' must be a mapping of tasks"),
        (
            "coverage:\n  feature-extraction:\n    - {reason: r, architectures: [bert]}\n",
            "m.yaml:10: field 'coverage': not a task whose architectures coverage tracks (got 'feature-extraction')",
        ),
        (
            "coverage:\n  text-generation:\n    - {architectures: [bert]}\n",
            "m.yaml:11: field 'coverage': each group under coverage: text-generation needs exactly 'reason' and",
        ),
        (
            "coverage:\n  text-generation:\n    - {reason: '', architectures: [bert]}\n",
            "m.yaml:11: field 'coverage': a coverage exclusion needs its reason",
        ),
        (
            "coverage:\n  text-generation:\n    - {reason: r, architectures: bert}\n",
            "m.yaml:11: field 'coverage': 'architectures' must be a non-empty list of names (got 'bert')",
        ),
        (
            "coverage:\n  pipeline-tasks:\n    - {reason: r, architectures: [fill-mask]}\n",
            "m.yaml:11: field 'coverage': each group under coverage: pipeline-tasks needs exactly 'reason' and 'tasks'",
        ),
        (
            "coverage:\n  pipeline-tasks:\n    - {reason: r, tasks: [fill-mask]}\n"
            "    - {reason: s, tasks: [fill-mask]}\n",
            "m.yaml:12: field 'coverage': pipeline task excluded twice under coverage: pipeline-tasks "
            "(first at line 11)",
        ),
        (
            "coverage:\n  text-generation:\n    - {reason: r, architectures: [bert]}\n"
            "    - {reason: s, architectures: [bart, bert]}\n",
            "m.yaml:12: field 'coverage': architecture excluded twice under coverage: text-generation "
            "(first at line 11)",
        ),
    ],
)
def test_a_bad_coverage_section_is_one_error_naming_the_file_line_field_and_fix(section: str, error: str) -> None:
    with pytest.raises(CatalogError) as raised:
        parse_catalog(catalog_with(section), "m.yaml")
    assert str(raised.value).startswith(error), str(raised.value)


def test_the_shipped_catalog_s_exclusions_each_carry_a_reason() -> None:
    catalog = load_catalog(REPO / "models.yaml")
    assert catalog.coverage, "models.yaml leaves architectures out under coverage:, each with its reason"
    for task, reasons in catalog.coverage.items():
        assert all(len(reason) > 20 for reason in reasons.values()), task


# --- covering tags against their checkpoints -------------------------------------------------------------


def only(task: str, *kept: str) -> str:
    """A ``coverage:`` group leaving out every architecture of ``task``'s registry but ``kept``, so the
    command's exit status turns on the entries under test alone."""
    registry = registry_of(task)
    assert registry is not None
    names = ", ".join(sorted(set(registry[1]) - set(kept)))
    return f"  {task}:\n    - reason: not what this test is about\n      architectures: [{names}]\n"


def zoo_catalog(qwen2_tag: str, pipeline_tag: str) -> str:
    """The zoo's qwen2, qwen3 and Stable Diffusion 1.5 checkpoints, the first and last tagged as given; every
    other architecture of the two tasks is left out, so the command passes when each tag covers what it says."""
    return (
        "models:\n"
        f"  - {{id: tiny-random/qwen2, task: text-generation, tags: [{qwen2_tag}, dense]}}\n"
        "  - {id: tiny-random/qwen3, task: text-generation, tags: [qwen3, dense]}\n"
        f"  - {{id: tiny-random/stable-diffusion, task: text-to-image, tags: [{pipeline_tag}, unet]}}\n"
        "coverage:\n" + only("text-generation", qwen2_tag, "qwen3") + only("text-to-image", pipeline_tag)
    )


ARGS = ("--models-file=m.yaml", "--task=text-generation", "--task=text-to-image", "--list")


@pytest.mark.usefixtures("offline_hub")
def test_a_tag_its_cached_checkpoint_contradicts_is_a_mismatch_and_covers_nothing(tmp_path: Path) -> None:
    # The zoo's checkpoints are what their names say: tiny-random/qwen2's config.json has model_type qwen2,
    # tiny-random/stable-diffusion's model_index.json is a StableDiffusionPipeline (SD 1.5).
    (tmp_path / "m.yaml").write_text(zoo_catalog("qwen2", "stable-diffusion"))
    honest = run_coverage(*ARGS, cwd=tmp_path)
    assert honest.returncode == 0, honest.stdout + honest.stderr
    assert "  covered  qwen2 (Qwen2ForCausalLM): tiny-random/qwen2" in honest.stdout
    assert "  covered  stable-diffusion (StableDiffusionPipeline): tiny-random/stable-diffusion" in honest.stdout
    assert "mismatch" not in honest.stdout and "unverified" not in honest.stdout

    # The same checkpoints tagged as what they are not: neither tag covers its architecture.
    (tmp_path / "m.yaml").write_text(zoo_catalog("llama", "stable-diffusion-xl"))
    lying = run_coverage(*ARGS, cwd=tmp_path)
    assert lying.returncode == 1, lying.stdout + lying.stderr
    assert "  missing  llama (LlamaForCausalLM): neither covered nor excluded" in lying.stdout
    assert "  missing  stable-diffusion-xl (StableDiffusionXLPipeline): neither covered nor excluded" in lying.stdout
    assert counts(lying.stdout)["text-generation"]["missing"] == 1
    assert counts(lying.stdout)["text-to-image"]["missing"] == 1
    assert (
        "  mismatch llama: tiny-random/qwen2 is tagged llama, but its config.json's model_type is 'qwen2', "
        "read from the Hugging Face cache: it does not cover llama"
    ) in lying.stdout
    assert (
        "  mismatch stable-diffusion-xl: tiny-random/stable-diffusion is tagged stable-diffusion-xl, but its "
        "model_index.json's _class_name is 'StableDiffusionPipeline' (the family stable-diffusion), read from the "
        "Hugging Face cache: it does not cover stable-diffusion-xl"
    ) in lying.stdout
    # The honest entry beside them is still covered, and checked.
    assert "  covered  qwen3 (Qwen3ForCausalLM): tiny-random/qwen3" in lying.stdout


def test_a_checkpoint_not_cached_is_read_from_the_hub_api_never_its_files(tmp_path: Path) -> None:
    # No checkpoint is cached (an empty HF_HUB_CACHE): every tag is read from the loopback Hub's model info.
    # org/qwen2-as-llama says llama but its config says qwen2; org/llama is what it says, and gated (its
    # model info is public, as on the Hub); org/gone is a repository the Hub does not know.
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    models = [
        ModelRecord("org/qwen2-as-llama", files={"config.json": json.dumps(config).encode()}, extra={"config": config}),
        ModelRecord("org/llama", gated="manual", extra={"config": {"model_type": "llama"}}),
        ModelRecord("org/qwen3", extra={"config": {"model_type": "qwen3"}}),
    ]
    (tmp_path / "m.yaml").write_text(
        "models:\n"
        "  - {id: org/qwen2-as-llama, task: text-generation, tags: [llama]}\n"
        "  - {id: org/llama, task: text-generation, tags: [llama]}\n"
        "  - {id: org/qwen3, task: text-generation, tags: [qwen3], revision: v1}\n"
        "  - {id: org/gone, task: text-generation, tags: [gpt2]}\n"
        "coverage:\n" + only("text-generation", "llama", "qwen3", "gpt2")
    )
    with HubServer(models) as server:
        env = {**server.env(), "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
        done = run_coverage("--models-file=m.yaml", "--list", cwd=tmp_path, env=env)
        asked = server.requests
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "  mismatch llama: org/qwen2-as-llama is tagged llama, but its config.json's model_type is 'qwen2', read "
        "from the Hub API: it does not cover llama"
    ) in done.stdout
    # llama stays covered by the entry that is one; a repository the Hub does not know is unverified, not a lie.
    assert "  covered  llama (LlamaForCausalLM): org/llama" in done.stdout
    assert "  covered  gpt2 (GPT2LMHeadModel): org/gone" in done.stdout
    assert re.search(r"  unverified gpt2: org/gone: config.json's model_type not read \(.*HTTP 404", done.stdout)
    # Model info only, with its config, at the entry's revision: no file (weights least of all) was fetched.
    assert not [r.path for r in asked if "/resolve/" in r.path]
    asked = [r for r in asked if r.path.startswith("/api/models")]
    assert {r.path for r in asked} == {
        "/api/models/org/qwen2-as-llama/revision/main",
        "/api/models/org/llama/revision/main",
        "/api/models/org/qwen3/revision/v1",
        "/api/models/org/gone/revision/main",
    }
    assert all(r.method == "GET" and r.param("expand") == "config" for r in asked)


def test_offline_and_not_cached_every_tag_is_unverified_said_once_and_still_covers(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(
        "models:\n  - {id: org/llama, task: text-generation, tags: [llama]}\n"
        "coverage:\n" + only("text-generation", "llama")
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    done = run_coverage("--models-file=m.yaml", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert counts(done.stdout)["text-generation"]["covered"] == 1
    assert (
        "  unverified 1 tag(s) not checked against their checkpoint, counted covered on the catalog's word "
        "(1 not in the Hugging Face cache, and the Hub was not asked: HF_HUB_OFFLINE=1); --list names each"
    ) in done.stdout


def test_a_diffusers_tag_is_checked_against_the_family_autopipeline_files_its_class_under() -> None:
    registry = registry_of("text-to-image")
    assert registry is not None
    mapping = registry[1]
    cached = Reading("StableDiffusionXLPipeline", "the Hugging Face cache")
    assert check_tag("org/sdxl", "stable-diffusion-xl", cached, "diffusers", mapping).status == VERIFIED
    # An SDXL checkpoint does not cover Stable Diffusion 1.5's family, though the names share a prefix.
    wrong = check_tag("org/sdxl", "stable-diffusion", cached, "diffusers", mapping)
    assert (wrong.status, wrong.family) == (MISMATCH, "stable-diffusion-xl")
    # Kandinsky 2.2's repositories name their decoder pipeline; AutoPipeline files it under kandinsky22, whose
    # text-to-image class is the combined pipeline.
    decoder = Reading("KandinskyV22Pipeline", "the Hub API")
    assert mapping["kandinsky22"] == "KandinskyV22CombinedPipeline"
    assert check_tag("org/k22", "kandinsky22", decoder, "diffusers", mapping).status == VERIFIED
    unread = check_tag("org/x", "flux", Reading(None, error="offline"), "diffusers", mapping)
    assert unread.status == UNVERIFIED and "model_index.json's _class_name not read (offline)" in unread.describe()


def test_every_task_of_the_installed_pipeline_is_covered_excluded_or_missing() -> None:
    from transformers.pipelines import SUPPORTED_TASKS

    done = run_coverage()
    line = next(line for line in done.stdout.splitlines() if line.startswith("pipeline tasks ("))
    found = re.fullmatch(
        r"pipeline tasks \(transformers [^ ]+ SUPPORTED_TASKS, (\d+) tasks\): "
        r"(\d+) covered, (\d+) excluded, (\d+) missing",
        line,
    )
    assert found is not None, line
    total, covered, excluded, missing = map(int, found.groups())
    assert total == len(SUPPORTED_TASKS) == covered + excluded + missing
    # The tasks with a row and Selected entries are covered; each other one is listed with why.
    listed = {m[1]: m[0] for m in re.findall(r"^  (missing|excluded) +([a-z0-9-]+): ", done.stdout, flags=re.M)}
    assert len(listed) == excluded + missing
    # The shipped catalog states a reason for every pipeline task it has no row for: none is missing.
    assert missing == 0 and listed["zero-shot-object-detection"] == "excluded" and "text-generation" not in listed
    assert re.search(r"^  excluded video-classification: pending: .*PyAV", done.stdout, flags=re.M)
    covering = {
        "text-generation",
        "image-text-to-text",
        "automatic-speech-recognition",
        "text-classification",
        "zero-shot-classification",
        "token-classification",
        "fill-mask",
        "image-classification",
        "audio-classification",
        "automatic-speech-recognition-ctc",
        "zero-shot-image-classification",
        "image-feature-extraction",
        "depth-estimation",
        "object-detection",
        "image-segmentation",
    }
    assert covered >= len(covering) and not set(listed) & covering


def test_a_registry_value_naming_several_heads_is_read_as_all_of_them() -> None:
    from pytest_neuron_support.catalog.coverage import class_names, registry_of

    assert class_names(("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher")) == (
        "DeiTForImageClassification / DeiTForImageClassificationWithTeacher"
    )
    read = registry_of("image-classification")
    assert read is not None and read[1]["levit"].startswith("LevitForImageClassification / ")


def test_a_pipeline_task_left_out_says_why_and_a_stale_or_contradicting_one_fails(tmp_path: Path) -> None:
    from pytest_neuron_support.catalog.coverage import pipeline_coverage

    section = (
        "coverage:\n  pipeline-tasks:\n    - reason: needs an environment to act in\n"
        "      tasks: [decision, no-such-task, text-generation]\n"
    )
    (tmp_path / "m.yaml").write_text(catalog_with(section))
    found = pipeline_coverage(load_catalog(tmp_path / "m.yaml"))
    by_name = {task.name: task for task in found.tasks}
    assert (by_name["decision"].status, by_name["decision"].said) == (EXCLUDED, "needs an environment to act in")
    assert by_name["text-generation"].status == COVERED and found.contradictions == ("text-generation",)
    assert found.stale == ("no-such-task",) and "no-such-task" not in by_name
    done = run_coverage("--models-file=m.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "  excluded decision: needs an environment to act in" in done.stdout
    assert "  stale    no-such-task: excluded under coverage: pipeline-tasks" in done.stdout
    assert "  both     text-generation: excluded under coverage: pipeline-tasks" in done.stdout


def test_a_row_sharing_a_hub_pipeline_tag_covers_that_tag_and_is_ranked_once(tmp_path: Path) -> None:
    # The CTC row's entries are speech recognition for the Hub and for transformers.pipeline: a catalog with a
    # CTC recogniser alone covers automatic-speech-recognition, and the Hub views rank that tag once.
    from pytest_neuron_support.catalog.coverage import pipeline_coverage
    from pytest_neuron_support.tasks.table import RANKED_TASKS, task_of

    assert task_of("automatic-speech-recognition-ctc").pipeline_tag == "automatic-speech-recognition"
    assert RANKED_TASKS.count("automatic-speech-recognition") == 1
    assert "automatic-speech-recognition-ctc" not in RANKED_TASKS
    ctc = "models:\n  - {id: org/w2v, task: automatic-speech-recognition-ctc, tags: [wav2vec2]}\n"
    (tmp_path / "m.yaml").write_text(ctc)
    by_name = {task.name: task for task in pipeline_coverage(load_catalog(tmp_path / "m.yaml")).tasks}
    assert (by_name["automatic-speech-recognition"].status, by_name["automatic-speech-recognition"].said) == (
        COVERED,
        "org/w2v",
    )
    assert by_name["audio-classification"].status == MISSING
