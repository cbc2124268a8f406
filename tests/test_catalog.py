from __future__ import annotations

from pathlib import Path

import pytest

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.catalog.load import (
    CatalogError,
    cli_model,
    is_hub_id,
    load_catalog,
    merge_models,
    parse_catalog,
)
from pytest_neuron_support.tasks.table import TASKS

REPO = Path(__file__).resolve().parent.parent


def test_shipped_selected_catalog_is_valid_and_large_enough() -> None:
    catalog = load_catalog(REPO / "models.yaml")
    selected = [m for m in catalog.models if m.exclude is None]
    assert len(selected) >= 30
    # Every task with a row has Selected entries.
    assert {m.task for m in catalog.models} == set(TASKS)
    excluded = [m for m in catalog.models if m.exclude is not None]
    assert excluded, "the catalog documents its exclusions"
    assert all(m.exclude and m.exclude.note for m in excluded)
    ids = {m.id for m in catalog.models}
    for family in ("Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-Instruct-v0.1"):
        assert family in ids


def test_tiny_catalog_lists_the_zoo() -> None:
    from pytest_neuron_support import zoo

    catalog = load_catalog(REPO / "models-tiny.yaml")
    assert {m.id for m in catalog.models} >= {a.repo_id for a in zoo.ARCHS}
    assert len(catalog.models) >= 10
    tasks = {m.id: m.task for m in catalog.models}
    assert tasks["tiny-random/llava"] == "image-text-to-text"
    assert tasks[zoo.MINILM_REPO] == "sentence-similarity"
    assert tasks[zoo.PIPELINE_REPO] == "text-to-image"
    assert tasks[zoo.WHISPER_REPO] == "automatic-speech-recognition"
    assert tasks[zoo.SEQ2SEQ_REPO] == "text2text-generation"


def test_entry_fields_parse_into_a_frozen_spec() -> None:
    text = """
models:
  - id: org/model-a
    task: text-generation
    revision: v1.0
    dtype: float16
    prompt: "Hello"
    cores: 4
    trust_remote_code: true
    extra_packages: ["foo==1.0"]
    tags: [llama, dense]
    timeout: 7200
  - id: org/model-b
    task: image-text-to-text
    exclude: {reason: too-large, note: "needs 40 cores"}
"""
    catalog = parse_catalog(text, "cat.yaml")
    a, b = catalog.models
    assert a == ModelSpec(
        id="org/model-a",
        task="text-generation",
        revision="v1.0",
        dtype="float16",
        prompt="Hello",
        cores=4,
        trust_remote_code=True,
        extra_packages=("foo==1.0",),
        tags=("llama", "dense"),
        line=3,
        timeout=7200.0,
    )
    assert b.exclude is not None and b.exclude.reason == "too-large" and b.line == 13
    assert b.revision == "main" and b.dtype == "bfloat16" and b.timeout is None
    with pytest.raises(AttributeError):
        a.id = "x"  # type: ignore[misc]


GOOD = "  - id: org/ok\n    task: text-generation\n"

# (yaml text, expected substrings of the single error message)
BAD_CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "unknown field": (
        "models:\n" + GOOD + "  - id: org/x\n    task: text-generation\n    dtyp: bfloat16\n",
        ("cat.yaml:6", "entry 'org/x'", "field 'dtyp'", "unknown field", "allowed fields"),
    ),
    "cores wrong type": (
        "models:\n  - id: org/x\n    task: text-generation\n    cores: two\n",
        ("cat.yaml:4", "field 'cores'", "'two'", "use one of 1, 2, 4, 8, 16"),
    ),
    "cores not a power of two": (
        "models:\n  - id: org/x\n    task: text-generation\n    cores: 3\n",
        ("cat.yaml:4", "field 'cores'", "(got 3)", "1, 2, 4, 8, 16"),
    ),
    "cores over the limit": (
        "models:\n  - id: org/x\n    task: text-generation\n    cores: 32\n",
        ("field 'cores'", "(got 32)"),
    ),
    "cores boolean": (
        "models:\n  - id: org/x\n    task: text-generation\n    cores: true\n",
        ("field 'cores'", "(got True)"),
    ),
    "duplicate id": (
        "models:\n" + GOOD + GOOD,
        ("cat.yaml:4", "entry 'org/ok'", "duplicate id (first at line 2)", "list each model once"),
    ),
    "unknown task": (
        "models:\n  - id: org/x\n    task: text-to-speech\n",
        (
            "cat.yaml:3",
            "entry 'org/x'",
            "field 'task'",
            "unknown task",
            "'text-to-speech'",
            "use one of text-generation, image-text-to-text, feature-extraction, sentence-similarity",
        ),
    ),
    "min_cosine on a generation task": (
        "models:\n  - id: org/x\n    task: text-generation\n    min_cosine: 0.99\n",
        ("cat.yaml:4", "entry 'org/x'", "field 'min_cosine'", "only embedding tasks", "(got 0.99)"),
    ),
    "min_cosine out of range": (
        "models:\n  - id: org/x\n    task: feature-extraction\n    min_cosine: 1.5\n",
        ("cat.yaml:4", "field 'min_cosine'", "must be a number in (0, 1]", "(got 1.5)", "min_cosine: 0.999"),
    ),
    "min_cosine not a number": (
        "models:\n  - id: org/x\n    task: sentence-similarity\n    min_cosine: high\n",
        ("field 'min_cosine'", "'high'"),
    ),
    "timeout not positive": (
        "models:\n  - id: org/x\n    task: text-generation\n    timeout: 0\n",
        ("cat.yaml:4", "entry 'org/x'", "field 'timeout'", "must be a positive number of seconds", "(got 0)"),
    ),
    "timeout not a number": (
        "models:\n  - id: org/x\n    task: text-generation\n    timeout: soon\n",
        ("field 'timeout'", "'soon'", "timeout: 1800"),
    ),
    "prompt on an embedding task": (
        "models:\n  - id: org/x\n    task: sentence-similarity\n    prompt: hello\n",
        ("cat.yaml:4", "field 'prompt'", "fixed set of sentences", "drop the field"),
    ),
    "missing task": ("models:\n  - id: org/x\n", ("cat.yaml:2", "entry 'org/x'", "missing required field 'task'")),
    "missing id": ("models:\n  - task: text-generation\n", ("cat.yaml:2", "missing required field 'id'")),
    "bad dtype": (
        "models:\n  - id: org/x\n    task: text-generation\n    dtype: bf16\n",
        ("cat.yaml:4", "field 'dtype'", "'bf16'", "bfloat16, float16, float32"),
    ),
    "path as id": (
        "models:\n  - id: ../../etc/passwd\n    task: text-generation\n",
        ("cat.yaml:2", "field 'id'", "not a Hub model id", "--model ./dir"),
    ),
    "id without org": ("models:\n  - id: gpt2\n    task: text-generation\n", ("field 'id'", "'gpt2'")),
    "id wrong type": ("models:\n  - id: 12\n    task: text-generation\n", ("field 'id'", "(got 12)")),
    "bad exclusion reason": (
        "models:\n  - id: org/x\n    task: text-generation\n    exclude: {reason: slow}\n",
        ("cat.yaml:4", "field 'exclude'", "'slow'", "low-priority, incompatible, remote-code, too-large"),
    ),
    "exclusion unknown key": (
        "models:\n  - id: org/x\n    task: text-generation\n    exclude: {reason: too-large, why: big}\n",
        ("field 'exclude'", "'why'", "allowed keys: reason, note"),
    ),
    "exclude not a mapping": (
        "models:\n  - id: org/x\n    task: text-generation\n    exclude: too-large\n",
        ("field 'exclude'", "must be a mapping"),
    ),
    "trust_remote_code string": (
        "models:\n  - id: org/x\n    task: text-generation\n    trust_remote_code: 'yes'\n",
        ("field 'trust_remote_code'", "'yes'", "true or false"),
    ),
    "tags not a list": (
        "models:\n  - id: org/x\n    task: text-generation\n    tags: llama\n",
        ("field 'tags'", "'llama'", "tags: [a, b]"),
    ),
    "extra_packages with non-string": (
        "models:\n  - id: org/x\n    task: text-generation\n    extra_packages: [1]\n",
        ("field 'extra_packages'", "[1]"),
    ),
    "empty prompt": (
        "models:\n  - id: org/x\n    task: text-generation\n    prompt: '  '\n",
        ("field 'prompt'", "prompt is empty"),
    ),
    "revision not a string": (
        "models:\n  - id: org/x\n    task: text-generation\n    revision: 3\n",
        ("field 'revision'", "(got 3)", "quote the value"),
    ),
    "entry not a mapping": ("models:\n  - org/x\n", ("cat.yaml:2", "each entry must be a mapping", "'org/x'")),
    "yaml syntax error": ("models:\n  - id: org/x\n    task: [unclosed\n", ("cat.yaml:", "YAML syntax error")),
    "empty file": ("", ("cat.yaml", "file is empty", "models:")),
    "top level list": ("- id: org/x\n", ("cat.yaml:1", "top level must be a mapping")),
    "unknown top-level key": ("model:\n  - id: org/x\n", ("cat.yaml:1", "unknown top-level key 'model'")),
    "models not a list": ("models: org/x\n", ("cat.yaml:1", "'models' must be a list")),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_malformed_catalog_names_file_line_entry_field_value_and_fix(case: str) -> None:
    text, expected = BAD_CASES[case]
    with pytest.raises(CatalogError) as info:
        parse_catalog(text, "cat.yaml")
    message = str(info.value)
    for part in expected:
        assert part in message, f"{part!r} missing from {message!r}"


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"file not found.*--models-file"):
        load_catalog(tmp_path / "nope.yaml")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00models")
    with pytest.raises(CatalogError, match="cannot read file"):
        load_catalog(binary)
    directory = tmp_path / "dir.yaml"
    directory.mkdir()
    with pytest.raises(CatalogError, match=r"dir\.yaml: cannot read file"):
        load_catalog(directory)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Qwen/Qwen3-8B", True),
        ("meta-llama/Llama-3.1-8B-Instruct", True),
        ("a/b", True),
        ("org/name.v2", True),
        ("gpt2", False),
        ("/etc/passwd", False),
        ("../x/y", False),
        ("org/../x", False),
        ("org/na--me", False),
        ("org/name/extra", False),
        ("org/-name", False),
        ("org/name ", False),
        ("org/" + "x" * 97, False),
    ],
)
def test_hub_id_rules(text: str, ok: bool) -> None:
    assert is_hub_id(text) is ok


def test_cli_models(tmp_path: Path) -> None:
    assert cli_model("org/name") == ModelSpec(id="org/name", source="cli")
    local = cli_model(str(tmp_path))
    assert local.source == "local" and local.id == str(tmp_path.resolve())
    with pytest.raises(CatalogError, match="does not exist"):
        cli_model(str(tmp_path / "missing"))
    with pytest.raises(CatalogError, match="not a Hub model id"):
        cli_model("not an id")
    merged = merge_models([ModelSpec(id="org/a")], [ModelSpec(id="org/a", source="cli"), ModelSpec(id="org/b")])
    assert [m.id for m in merged] == ["org/a", "org/b"] and merged[0].source == "catalog"
