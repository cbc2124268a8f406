"""The dataset as users read it: real Parquet files read back with pandas."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pytest_neuron_support.dataset import PartWriter, check_writable, read_dataset, recover_parts, write_rows
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


def _writer(directory: str, w: int) -> None:
    for i in range(100):
        write_rows(Path(directory), [row(f"org/w{w}-{i}", tags=(f"writer-{w}",), peak_host_rss_bytes=i)])


def test_eight_concurrent_writer_processes_lose_and_corrupt_no_row(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), w)) for w in range(8)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(300)
        assert p.exitcode == 0
    df = pd.read_parquet(tmp_path / "data")
    assert len(df) == 800 and df.model_id.is_unique
    for record in df.itertuples():
        w, i = record.model_id.removeprefix("org/w").split("-")
        assert list(record.tags) == [f"writer-{w}"] and record.peak_host_rss_bytes == int(i)


def test_unwritable_results_dir_fails_before_the_sweep(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        check_writable(blocker / "results")


def test_row_json_round_trip() -> None:
    original = row("org/a", tags=("x",), peak_host_rss_bytes=5)
    assert Row.from_json(original.to_json()) == original
    assert json.loads(original.to_json())["tags"] == ["x"]
    assert dataclasses.asdict(original)["tokens"] == (1, 2)
