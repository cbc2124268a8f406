"""Registry coverage (``neuron-support coverage``): every architecture the installed transformers and diffusers
map for a catalog task is covered by a Selected entry, excluded with a reason, or missing, and the shipped
catalog leaves none missing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_neuron_support.catalog.coverage import COVERED, EXCLUDED, MISSING, coverage, task_coverage
from pytest_neuron_support.catalog.load import CatalogError, load_catalog, parse_catalog
from pytest_neuron_support.tasks.table import TASKS

REPO = Path(__file__).resolve().parent.parent
COUNTS = re.compile(
    r"^(?P<task>[a-z-]+) \((?P<registry>[^)]*), (?P<total>\d+) architectures\): "
    r"(?P<covered>\d+) covered, (?P<excluded>\d+) excluded, (?P<missing>\d+) missing$"
)


def run_coverage(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", "coverage", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
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
    report = task_coverage(parse_catalog(text, "m.yaml"), "text-generation")
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
