"""The dataset as users read it: real Parquet files read back with pandas."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import yaml

from pytest_neuron_support.dataset import PartWriter, read_dataset, recover_parts, write_rows
from pytest_neuron_support.records import COLUMN_DOCS, RESULTS, STAGES, Row, arrow_schema


def row(model: str, result: str = "PASS", version: str = "5.24.0", **kw: object) -> Row:
    return Row(model_id=model, result=result, library_version=version, torch="2.13.0", tokens=(1, 2), **kw)  # type: ignore[arg-type]


def test_rows_round_trip_through_parquet_with_pandas(tmp_path: Path) -> None:
    rows = [row("org/a"), row("org/b", "FAIL", failure_stage="parity", first_divergence=3, logprob_gap=0.25)]
    (path,) = write_rows(tmp_path, rows)
    assert path.name == "neuronxcc-none__transformers-5.24.0.parquet"
    df = pd.read_parquet(tmp_path / "data")
    assert list(df.columns) == list(COLUMN_DOCS)
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
    assert set(arrow_schema().names) == set(COLUMN_DOCS)


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
    from pytest_neuron_support.dataset import render_card

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
