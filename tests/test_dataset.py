"""The dataset as users read it: real Parquet files read back with pandas."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pytest_neuron_support.data.dataset import PartWriter, read_dataset, recover_parts, write_rows
from pytest_neuron_support.data.records import COLUMN_DOCS, RESULTS, SCHEMA_VERSION, STAGES, Row

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def golden_schema() -> list[tuple[str, str]]:
    """The columns, in order, with their Arrow types, of the current schema version as written down
    in ``fixtures/dataset-schema-v<N>.txt`` (independent of ``Row``, which the writer derives from)."""
    path = FIXTURES / f"dataset-schema-v{SCHEMA_VERSION}.txt"
    assert path.exists(), f"{path.name} is missing: a new SCHEMA_VERSION needs its columns written down there"
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    return [(name, kind) for name, kind in (line.split(": ", 1) for line in lines)]


def row(model: str, result: str = "PASS", version: str = "5.24.0", **kw: object) -> Row:
    return Row(model_id=model, result=result, library_version=version, torch="2.13.0", tokens=(1, 2), **kw)  # type: ignore[arg-type]


def test_rows_round_trip_through_parquet_with_pandas(tmp_path: Path) -> None:
    rows = [row("org/a"), row("org/b", "FAIL", failure_stage="parity", first_divergence=3, logprob_gap=0.25)]
    (path,) = write_rows(tmp_path, rows)
    assert path.name == "neuronxcc-none__transformers-5.24.0.parquet"
    df = pd.read_parquet(tmp_path / "data")
    assert list(df.columns) == [name for name, _ in golden_schema()]
    assert df.set_index("model_id").loc["org/b", "first_divergence"] == 3
    assert sorted(read_dataset(tmp_path), key=lambda r: r.model_id) == rows


def test_rerun_replaces_only_that_models_row_and_stacks_get_their_own_file(tmp_path: Path) -> None:
    write_rows(tmp_path, [row("org/a"), row("org/b")])
    write_rows(tmp_path, [row("org/a", "ERROR", failure_stage="load")])
    write_rows(tmp_path, [row("org/a", version="5.25.0")])
    df = pd.read_parquet(tmp_path / "data")
    assert len(df) == 3
    old = df[df.library_version == "5.24.0"].set_index("model_id")["result"].to_dict()
    assert old == {"org/a": "ERROR", "org/b": "PASS"}
    assert len(list((tmp_path / "data").glob("*.parquet"))) == 2


def test_card_defines_every_column_result_and_stage_and_declares_configs(tmp_path: Path) -> None:
    write_rows(tmp_path, [row("org/a")])
    card = (tmp_path / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    paths = [c["data_files"][0]["path"] for c in front["configs"]]
    assert "data/neuronxcc-none__transformers-5.24.0.parquet" in paths
    for name in [*COLUMN_DOCS, *RESULTS, *STAGES]:
        assert f"`{name}`" in card


#: Columns users' queries depend on, with the Arrow types the dataset promises, written out by
#: hand: the schema and the column docs are both derived from ``Row``, so comparing them with each
#: other could never fail; this is the contract a changed field type would break.
PROMISED_TYPES = {
    "model_id": pa.string(),
    "result": pa.string(),
    "failure_stage": pa.string(),
    "verdict_basis": pa.string(),
    "error": pa.string(),
    "tokens": pa.list_(pa.int64()),
    "neuron_cores": pa.int64(),
    "tp_size": pa.int64(),
    "first_divergence": pa.int64(),
    "logprob_gap": pa.float64(),
    "reference_match": pa.bool_(),
    "run_s": pa.float64(),
    "lease_start": pa.float64(),
    "fallback_ops": pa.list_(pa.string()),
    "peak_device_memory_by_rank": pa.list_(pa.int64()),
    "runscript": pa.string(),
}


def test_the_parquet_file_has_the_promised_column_types_and_their_docs(tmp_path: Path) -> None:
    (path,) = write_rows(tmp_path, [row("org/a", neuron_cores=2, run_s=1.5, reference_match=True)])
    schema = pq.read_schema(path)  # the file as written, not the schema function that wrote it
    assert {name: schema.field(name).type for name in PROMISED_TYPES} == PROMISED_TYPES
    # Every column, in order, with its type, against the written-down schema of this version.
    assert [(field.name, str(field.type)) for field in schema] == golden_schema()
    # Each column carries its doc in the file's own metadata, the text the card shows for it.
    card = (tmp_path / "README.md").read_text()
    for name in ("model_id", "first_divergence", "runscript"):
        doc = schema.field(name).metadata[b"doc"].decode()
        assert doc and doc in card, (name, doc)


def test_parts_survive_a_killed_session_and_are_recovered(tmp_path: Path) -> None:
    dead = PartWriter(tmp_path, session="dead")
    dead.add(row("org/a"))
    dead.add(row("org/b"))
    (dead.directory / "000003.tmp").write_text('{"model_id": "org/c", "res')  # torn, never renamed
    assert recover_parts(tmp_path) == 2
    assert sorted(pd.read_parquet(tmp_path / "data").model_id) == ["org/a", "org/b"]
    assert not dead.directory.exists()


def test_row_json_round_trip() -> None:
    original = row("org/a", tags=("x",), peak_host_rss_bytes=5)
    assert Row.from_json(original.to_json()) == original
    assert json.loads(original.to_json())["tags"] == ["x"]
    assert dataclasses.asdict(original)["tokens"] == (1, 2)


def test_the_card_says_what_each_pass_rests_on_and_which_ran_ops_on_the_host(tmp_path: Path) -> None:
    from pytest_neuron_support.data.dataset import render_card

    write_rows(
        tmp_path,
        [
            row("org/one", verdict_basis="parity+teacher-forced"),
            row("org/sharded", verdict_basis="teacher-forced", judge_verdict="fluent"),
            row("org/huge", verdict_basis="judge", cpu_check="skipped: needs ~140.0 GiB"),
            row("org/hosted", verdict_basis="parity+teacher-forced", fallback_ops=("aten::_embedding_bag",)),
            row("org/bad", "FAIL", failure_stage="parity", verdict_basis="teacher-forced"),
        ],
    )
    card = render_card(tmp_path)
    assert "| `parity+teacher-forced` |" in card and card.split("| `parity+teacher-forced` |")[1].split("\n")[
        0
    ].endswith("| 2 |")
    assert card.split("| `teacher-forced` |")[1].split("\n")[0].endswith("| 1 |")  # the FAIL is not counted
    assert card.split("| `judge` |")[1].split("\n")[0].endswith("| 1 |")
    assert "ran operations on the host instead of the device (`fallback_ops`): 1 (org/hosted)." in card
    df = pd.read_parquet(tmp_path / "data").set_index("model_id")
    assert list(df.loc["org/hosted", "fallback_ops"]) == ["aten::_embedding_bag"]
