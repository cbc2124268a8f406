from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.runscript import (
    RunSpec,
    TrainSpec,
    imported_modules,
    render,
    render_train,
    template,
)


def spec(**overrides: object) -> RunSpec:
    base: dict[str, object] = dict(
        model="org/name",
        revision="main",
        task="text-generation",
        dtype="bfloat16",
        prompt="Hi @@MODEL@@ \"'",
        max_new_tokens=32,
        device=DEVICES["neuron"],
        compile=True,
        compile_backend="neuron",
    )
    base.update(overrides)
    return RunSpec(**base)  # type: ignore[arg-type]


def spec_literal(source: str) -> dict[str, object]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SPEC":
            value = ast.literal_eval(node.value)
            assert isinstance(value, dict)
            return value
    raise AssertionError("no SPEC literal")


def test_rendered_script_is_valid_python_with_everything_written_in() -> None:
    source = render(spec())
    compile(source, "run.py", "exec")
    written = spec_literal(source)
    assert written["model"] == "org/name" and written["prompt"] == "Hi @@MODEL@@ \"'"
    assert written["max_new_tokens"] == 32 and written["dtype"] == "bfloat16"
    device = written["device"]
    assert isinstance(device, dict)
    assert device["device_map"] == "neuron" and device["compile_backend"] == "neuron"
    assert device["env"] == {"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1", "TORCH_NEURONX_METRICS_ENABLED": "1"}
    assert device["cache_stats_expr"] == "__import__('torch_neuronx')._C._get_compilation_cache_stats()"
    assert device["fallback_ops_expr"] == "__import__('torch_neuronx').get_fallback_ops()"
    assert '"""Does org/name run on neuron?' in source


def test_imports_are_limited_to_stdlib_torch_and_transformers() -> None:
    source = render(spec())
    tree = ast.parse(source)
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    # huggingface_hub (transformers' own dependency) only where it is at hand: the commit of the snapshot.
    assert roots - set(sys.stdlib_module_names) == {"torch", "transformers", "huggingface_hub"}
    assert imported_modules(source) == ("torch", "transformers")


#: The libraries each task's run.py imports on top of the stack (the pipeline check's run.py too).
LIBRARIES = {
    "text-generation": ("transformers",),
    "image-text-to-text": ("pillow", "transformers"),
    "feature-extraction": ("transformers",),
    "sentence-similarity": ("transformers",),
    # diffusers loads the pipeline's text encoders and tokenizers from transformers without depending on it.
    "text-to-image": ("diffusers", "pillow", "transformers"),
    "automatic-speech-recognition": ("transformers",),
    "text2text-generation": ("transformers",),
    "text-classification": ("transformers",),
    "zero-shot-classification": ("transformers",),
    "token-classification": ("transformers",),
    "fill-mask": ("transformers",),
    "image-classification": ("pillow", "transformers"),
    "audio-classification": ("transformers",),
    "automatic-speech-recognition-ctc": ("transformers",),
    "zero-shot-image-classification": ("pillow", "transformers"),
    "image-feature-extraction": ("pillow", "transformers"),
    "depth-estimation": ("pillow", "transformers"),
    "object-detection": ("pillow", "transformers"),
    "image-segmentation": ("pillow", "transformers"),
}


def test_every_run_py_names_the_libraries_it_imports_pinned_in_its_docstring() -> None:
    # The issue: run.py's docstring, `runscript` and the viewer left diffusers out of a text-to-image row's
    # reproduction, and run.py's docstring named three of the six tasks.
    from importlib import metadata

    from pytest_neuron_support.tasks.table import TASKS as TABLE

    assert set(LIBRARIES) == set(TABLE)
    for task, expected in LIBRARIES.items():
        row = TABLE[task]
        for fragments in {row.fragments, *((row.pipeline_fragments,) if row.pipeline else ())}:
            source = render(spec(task=task, **{**row.script_fields(), "fragments": fragments}))
            assert spec_literal(source)["libraries"] == list(expected), (task, fragments)
            pins = " ".join(f"{name}=={metadata.version(name)}" for name in expected)
            assert f"\n    pip install {pins}\n" in source, (task, source[:1500])
    docstring = template("run.py").split('"""')[1]
    assert "text-generation" not in docstring and "@@LIBRARIES@@" in docstring  # task-neutral, pins filled in


def test_every_task_renders_its_loading_path() -> None:
    from pytest_neuron_support.catalog.load import TASKS
    from pytest_neuron_support.tasks.table import TASKS as TABLE

    expected = {
        "text-generation": ("AutoModelForCausalLM", "text"),
        "image-text-to-text": ("AutoModelForImageTextToText", "vision"),
        "feature-extraction": ("AutoModel", "embedding"),
        "sentence-similarity": ("AutoModel", "embedding"),
        "text-to-image": ("DiffusionPipeline", "text-to-image"),
        "automatic-speech-recognition": ("AutoModelForSpeechSeq2Seq", "audio"),
        "text2text-generation": ("AutoModelForSeq2SeqLM", "text"),
        "text-classification": ("AutoModelForSequenceClassification", "forward"),
        "zero-shot-classification": ("AutoModelForSequenceClassification", "forward"),
        "token-classification": ("AutoModelForTokenClassification", "forward"),
        "fill-mask": ("AutoModelForMaskedLM", "forward"),
        "image-classification": ("AutoModelForImageClassification", "forward"),
        "audio-classification": ("AutoModelForAudioClassification", "forward"),
        "automatic-speech-recognition-ctc": ("AutoModelForCTC", "forward"),
        "zero-shot-image-classification": ("AutoModelForZeroShotImageClassification", "forward"),
        "image-feature-extraction": ("AutoModel", "forward"),
        "depth-estimation": ("AutoModelForDepthEstimation", "forward"),
        "object-detection": ("AutoModelForObjectDetection", "forward"),
        "image-segmentation": ("AutoModelForSemanticSegmentation", "forward"),
    }
    assert set(TASKS) == set(TABLE) == set(expected)
    # Each task's run.py holds its own code (its fragments) and no other task's.
    own = {
        "transformers.py": "getattr(transformers, auto_class).from_pretrained(",
        "diffusers.py": "pipeline_class.from_pretrained(",
        "text.py": 'preprocessor(SPEC["prompt"]',
        "vision.py": "def fixed_image(",
        "audio.py": "def fixed_audio(",
        "embedding.py": "def pool(",
        "generation.py": "def run_generation(",
        "text_to_image.py": "class StageTape",
        "forward.py": "def run_forward(",
    }
    for task in TASKS:
        source = render(spec(task=task, sentences=("a b", "c"), **TABLE[task].script_fields()))
        compile(source, "run.py", "exec")
        written = spec_literal(source)
        assert written["task"] == task and written["sentences"] == ["a b", "c"]
        assert written["image_size"] == [224, 224]
        # The task table's row travels in the SPEC: run.py keeps no task table of its own.
        assert (written["auto_class"], written["inputs"]) == expected[task]
        for fragment, marker in own.items():
            assert (marker in source) == (fragment in TABLE[task].fragments), (task, fragment)
        assert "@@TASK@@" not in source and "@@COMMON@@" not in source
    assert "TASKS" not in template()


def test_cpu_reference_script_stays_eager() -> None:
    written = spec_literal(render(spec(device=DEVICES["cpu"], compile=False, compile_backend="inductor")))
    assert written["compile"] is False
    assert isinstance(written["device"], dict) and written["device"]["force_compile"] is True


def test_ranks_join_the_process_group_before_anything_seeds_or_touches_the_device() -> None:
    # On neuron, seeding sizes the device generator table from the cores visible at that moment;
    # a rank's device index is right only after init_process_group (shared/reference/torchneuron.md).
    tree = ast.parse(render(spec(world_size=2)))
    run = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "run")
    calls = [
        node.func.attr
        for node in ast.walk(run)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("init_process_group", "manual_seed")
    ]
    calls += [
        node.func.id
        for node in ast.walk(run)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "join_world"
    ]
    lines = {
        getattr(node.func, "attr", getattr(node.func, "id", None)): node.lineno
        for node in ast.walk(run)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in calls
    }
    # run() joins through common.py's join_world, whose join_process_group calls init_process_group itself.
    assert sorted(calls) == ["join_world", "manual_seed"]
    assert lines["join_world"] < lines["manual_seed"]
    world = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "join_world")
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "join_process_group" for n in ast.walk(world))
    join = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "join_process_group")
    assert any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "init_process_group"
        for n in ast.walk(join)
    )


_RENDEZVOUS_SCRIPT = """
import json, os, signal, socket, sys, time

def rank_entry(rank, world, rendezvous, out):
    import torch
    import torch.distributed as dist

    join_process_group(dist, "gloo", rank, world, rendezvous)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    with open(f"{out}.rank{rank}", "w") as handle:
        json.dump({"sum": total.item(), "port": int(os.environ["MASTER_PORT"])}, handle)
    dist.destroy_process_group()

@@LAUNCHER@@

if __name__ == "__main__":
    out = sys.argv[1]
    # What a crashed earlier run leaves behind: the port of a store that is gone. A rank that read
    # it would wait on a dead port instead of rank 0's new store.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        stale = sock.getsockname()[1]
    with open(f"{out}.rendezvous", "w") as handle:
        handle.write(str(stale))
    print(json.dumps({"failure": spawn_ranks(2, out), "stale": stale}))
"""


def test_ranks_meet_in_the_store_rank_zero_bound_itself(tmp_path: Path) -> None:
    # No port is chosen before rank 0 binds one (a port picked and handed over can be taken by
    # another concurrent sharded run meanwhile): rank 0's store takes port 0 and publishes the
    # port it got; a stale rendezvous file from an earlier run is not read.
    from pytest_neuron_support.doctor.render import common_parts

    script = tmp_path / "ranks.py"
    script.write_text(
        _RENDEZVOUS_SCRIPT.replace(
            "@@LAUNCHER@@", common_parts(("join_process_group", "spawn_ranks"), defined={"rank_entry"})
        ),
        encoding="utf-8",
    )
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    launched = json.loads(proc.stdout.strip().splitlines()[-1])
    assert launched["failure"] is None, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result.json.rank{rank}").read_text()) for rank in range(2)]
    assert [r["sum"] for r in ranks] == [3.0, 3.0]  # both ranks in one group
    assert ranks[0]["port"] == ranks[1]["port"] != launched["stale"]  # MASTER_PORT: rank 0's store
    assert not (tmp_path / "result.json.rendezvous").exists()  # the launcher cleans up after its ranks


def test_the_cpu_check_script_carries_the_tokens_it_scores() -> None:
    written = spec_literal(
        render(spec(device=DEVICES["cpu"], compile=False, compile_backend="inductor", forced_tokens=(5, 6, 7)))
    )
    assert written["forced_tokens"] == [5, 6, 7] and written["compile"] is False
    assert spec_literal(render(spec()))["forced_tokens"] is None


def train_spec(**overrides: object) -> TrainSpec:
    base: dict[str, object] = dict(
        model="org/name",
        revision="main",
        dtype="bfloat16",
        device=DEVICES["neuron"],
        compile=True,
        compile_backend="neuron",
        steps=3,
        batch_size=2,
        max_length=16,
        learning_rate=1e-3,
        seed=0,
        texts=("a b", "c d"),
        world_size=2,
    )
    base.update(overrides)
    return TrainSpec(**base)  # type: ignore[arg-type]


def shared_code() -> str:
    """What templates/common.py contributes: everything after its marker line."""
    _, marker, shared = template("common.py").partition("# @@COMMON@@\n")
    assert marker and "def launch_ranks(" in shared and "def run_and_write(" in shared and "@@" not in shared
    return shared.strip("\n")


def rendered_scripts() -> dict[str, str]:
    return {"run.py": render(spec(world_size=2)), "train.py": render_train(train_spec())}


def defined_names(source: str) -> list[str]:
    """The module-level functions, classes and assigned names of ``source``, each time it defines one."""
    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names.extend(target.id for target in node.targets if isinstance(target, ast.Name))
    return names


def test_run_py_and_train_py_carry_the_one_common_code_inlined_once() -> None:
    shared = shared_code()
    names = set(defined_names(shared))
    assert names == {
        # stage markers, versions and the result of one process
        "STAGE",
        "WORLD",
        "FACTS",
        "NothingCompiledError",
        "enter",
        "versions",
        "compiler_version",
        "device_fact",
        "device_module",
        "synchronize",
        "peak_device_memory",
        "run_and_write",
        "snapshot_commit",
        # ranks
        "write_json",
        "rank_core",
        "end_with_parent",
        "enter_rank",
        "rank_entry",
        "RENDEZVOUS_TIMEOUT_S",
        "ROOT_COMM_BASE",
        "root_comm_port",
        "join_process_group",
        "join_world",
        "spawn_ranks",
        "first_failure",
        "last_stage",
        "launch_ranks",
        # the entry point
        "main",
    }
    for name, source in rendered_scripts().items():
        compile(source, name, "exec")
        # The same text, once, and in its place: no marker and nothing imported from the package.
        assert source.count(shared) == 1, name
        assert "@@COMMON@@" not in source and "from common import" not in source, name
        assert "@@RANKS@@" not in source and "from ranks import" not in source, name
        # Each shared name defined once (the host keeps no copy of its own), beside what the host provides.
        defined = defined_names(source)
        host = {"SPEC", "DISTRIBUTIONS", "CHECK", "run", "merge_rank_facts"}
        assert all(defined.count(n) == 1 for n in names | host), name
        # The unrendered template reads the same (the zoo executes run.py's to draw its test card).
        assert template(name).count(shared) == 1, name


#: Renders :func:`rendered_scripts` in a fresh interpreter and prints them as JSON.
RENDER_ELSEWHERE = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); import test_runscript; "
    "print(json.dumps(test_runscript.rendered_scripts()))"
)


def test_rendering_with_the_common_code_is_deterministic(tmp_path: Path) -> None:
    """The same spec gives the same bytes in another process: rows of separate sessions and workers
    are compared by their run.py (a merged dataset against an unsharded one), and each process has
    its own string hash seed (a set iterated in the rendering would order differently there, while
    two renders in one process always agree)."""
    renders = []
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", RENDER_ELSEWHERE, str(Path(__file__).resolve().parent)],
            capture_output=True,
            check=True,
            cwd=tmp_path,  # the package as installed, not a copy the current directory happens to hold
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        renders.append(done.stdout)
    assert renders[0] == renders[1] == renders[2]
    assert json.loads(renders[0]) == rendered_scripts()  # and the same as this process renders


def test_rendered_scripts_define_every_name_they_use(tmp_path: Path) -> None:
    # compile() does not resolve names: the spliced code relies on its host for SPEC, DISTRIBUTIONS,
    # CHECK, run and merge_rank_facts, the host on it for enter, WORLD, main and more; pyflakes'
    # rules (F) on the rendered text catch a missing one, or an import the host no longer uses. F811
    # is left out: the spliced code imports the modules it uses itself, so those the host uses too
    # are imported twice on purpose.
    pytest.importorskip("ruff")
    paths = []
    for name, source in rendered_scripts().items():
        path = tmp_path / name
        path.write_text(source, encoding="utf-8")
        paths.append(str(path))
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated"]
    done = subprocess.run(
        [*ruff, "--select", "F", "--ignore", "F811", *paths],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_a_wheel_without_the_fallback_op_list_runs_and_says_the_ops_are_unknown(
    offline_hub: Path, tmp_path: Path
) -> None:
    # The issue: run.py called the device's fallback-op list unguarded; torch_neuronx.get_fallback_ops reads
    # a private binding, and a wheel without it failed a run that worked. The planted module stands in for
    # such a wheel: it imports, and has no get_fallback_ops.
    import dataclasses

    from pytest_neuron_support.data.records import Row
    from pytest_neuron_support.run.runscript import render_and_run
    from pytest_neuron_support.tasks.task import Task

    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "wheel_without_fallback_ops.py").write_text('"""A device wheel that lists no fallback ops."""\n')
    kind = dataclasses.replace(
        DEVICES["cpu"], fallback_ops_expr="__import__('wheel_without_fallback_ops').get_fallback_ops()"
    )
    run = spec(model="tiny-random/gpt2", dtype="float32", device=kind, compile=False, max_new_tokens=4)
    env = {**os.environ, "PYTHONPATH": str(planted)}
    _, outcome = render_and_run(run, tmp_path / "run", env=env, timeout=300)
    result = outcome.result
    assert result is not None and result["ok"], (result or {}).get("traceback", outcome)
    assert result["fallback_ops"] is None and len(result["tokens"]) == 4
    unknown = result["fallback_ops_unavailable"]
    assert unknown.startswith("AttributeError:") and "get_fallback_ops" in unknown, unknown
    # The row keeps no op, and says the list is unknown (not empty) and why.
    row = Task("text-generation").with_result(Row(model_id="tiny-random/gpt2", result="ERROR"), result)
    assert row.fallback_ops == () and row.libraries == tuple(result["libraries"])
    assert row.fallback_ops_unknown == unknown


def test_no_task_fragment_defines_a_name_run_py_or_common_py_defines() -> None:
    """The fragments are spliced into run.py's own namespace, before run.py's functions: a fragment's function of
    the same name as one of run.py's (or common.py's) would be replaced by it at import, silently (as a
    ``first_tensor`` of text_to_image.py once was by run.py's module search)."""
    import pytest_neuron_support

    templates = Path(pytest_neuron_support.__file__).resolve().parent / "templates"

    def defined(path: Path) -> set[str]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        names |= {
            t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
        }
        return names

    shared = defined(templates / "run.py") | defined(templates / "common.py")
    for fragment in sorted((templates / "tasks").glob("*.py")):
        clash = (defined(fragment) & shared) - {"PREPROCESSOR"}
        assert not clash, f"{fragment.name} defines {sorted(clash)}, which run.py or common.py defines too"
