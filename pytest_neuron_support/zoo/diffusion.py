"""The text-to-image pipeline: a tiny Stable Diffusion 1.5, built offline from its real component
configs (``model_index.json``, unet, vae, text encoder, tokenizer, scheduler) with the sizes shrunk (and
v-prediction: zoo/spec.py says why), trained briefly to draw one synthetic picture, and saved as diffusers
saves a pipeline.

Trained, so that its image shows something a person can compare (a random pipeline's is noise): the
suite's prompt draws a red apple (a red disc) on a wooden table (a brown band) against a studio backdrop,
and the empty prompt the same table without the apple. The VAE learns latents a person can read too: a
latent is the picture averaged over 8x8 pixels (three channels; the fourth stays 0), so the decoder learns
to sharpen it and the encoder to make it. The UNet and the text encoder then learn v-prediction on those
latents under the scheduler's own noise, half of each batch at the timesteps of the suite's 4 steps. About
11 CPU-s on one thread, from fixed seeds: the same files on every run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_neuron_support.zoo.spec import _PIPELINE_SPEC


def _clip_tokenizer(directory: Path, spec: dict[str, Any]) -> Any:
    """A CLIP BPE tokenizer of its own small vocabulary (every lower-case letter, alone and word-final, and
    the merges of the prompt words the spec lists), written as ``vocab.json`` and ``merges.txt``."""
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {"<|startoftext|>": 0, "!": 1, "<|endoftext|>": 2}
    for letter in "abcdefghijklmnopqrstuvwxyz":
        vocab[letter] = len(vocab)
        vocab[f"{letter}</w>"] = len(vocab)
    merges = []
    for word in spec["words"]:
        # Left to right, one merge at a time, so the whole word becomes one token (word-final form).
        pieces = [*word[:-1], f"{word[-1]}</w>"]
        while len(pieces) > 1:
            merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            vocab.setdefault(pieces[0], len(vocab))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return CLIPTokenizer(
        str(directory / "vocab.json"),
        str(directory / "merges.txt"),
        pad_token="<|endoftext|>",
        model_max_length=spec["max_length"],
    )


def _picture(picture: Mapping[str, Any], scene: Mapping[str, Any], size: int) -> Any:
    """One picture of the set, drawn: the backdrop, the band below ``band_top``, the disc if it has one;
    (3, size, size) in [-1, 1], as the VAE takes images."""
    import torch

    y, x = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
    image = torch.tensor(scene["backdrop"]).view(3, 1, 1).repeat(1, size, size)
    image[:, y > size * scene["band_top"]] = torch.tensor(scene["band"]).view(3, 1)
    if picture["disc"] is not None:
        inside = (x - size / 2) ** 2 + (y - size * scene["disc_y"]) ** 2 < (size * scene["radius"]) ** 2
        image[:, inside] = torch.tensor(picture["disc"]).view(3, 1)
    return image * 2 - 1


def _train_vae(vae: Any, images: Any, latents: Any, spec: Mapping[str, Any]) -> float:
    """The decoder learns to draw each picture from its latent (noised, so that the UNet's near misses
    still decode), the encoder to give that latent; the last step's loss."""
    import torch

    train, scale = spec["training"], spec["vae"]["scaling_factor"]
    optimizer = torch.optim.Adam(vae.parameters(), lr=train["vae_lr"])
    loss: Any = torch.zeros(())  # Tensor.backward is untyped
    for _ in range(train["vae_steps"]):
        noisy = latents + train["latent_noise"] * torch.randn_like(latents)
        decoded = vae.decode(noisy / scale).sample
        mean, logvar = vae.quant_conv(vae.encoder(images)).chunk(2, 1)
        # A narrow posterior (logvar near -10), so that a sampled latent is its mean.
        loss = (
            torch.nn.functional.mse_loss(decoded, images)
            + torch.nn.functional.mse_loss(mean * scale, latents)
            + 1e-3 * ((logvar + 10) ** 2).mean()
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.item())


def _train_denoiser(
    unet: Any, text_encoder: Any, input_ids: Any, latents: Any, scheduler: Any, spec: Mapping[str, Any]
) -> float:
    """The UNet and the text encoder learn v-prediction: each picture's latent under the scheduler's noise
    at a random timestep, conditioned on its caption; the last step's loss."""
    import torch

    train = spec["training"]
    # The suite's own timesteps (PNDM repeats one) make half of each batch: the steps that draw its image.
    scheduler.set_timesteps(spec["sampling_steps"])
    sampled = torch.unique(scheduler.timesteps)
    alphas = scheduler.alphas_cumprod
    optimizer = torch.optim.Adam([*unet.parameters(), *text_encoder.parameters()], lr=train["lr"])
    batch = train["batch"]
    loss: Any = torch.zeros(())  # Tensor.backward is untyped
    for _ in range(train["unet_steps"]):
        which = torch.randint(len(latents), (batch,))
        timesteps = torch.where(
            torch.arange(batch) % 2 == 0,
            sampled[torch.randint(len(sampled), (batch,))],
            torch.randint(0, scheduler.config.num_train_timesteps, (batch,)),
        )
        noise = torch.randn(batch, *latents.shape[1:])
        alpha = alphas[timesteps].view(-1, 1, 1, 1)
        noisy = alpha.sqrt() * latents[which] + (1 - alpha).sqrt() * noise
        velocity = alpha.sqrt() * noise - (1 - alpha).sqrt() * latents[which]
        prediction = unet(noisy, timesteps, encoder_hidden_states=text_encoder(input_ids[which])[0]).sample
        loss = torch.nn.functional.mse_loss(prediction, velocity)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.item())


def _build_pipeline(out_dir: Path, fingerprint: str) -> str:
    """Build, train and save the tiny pipeline into ``out_dir``; returns its log line's figures."""
    import importlib

    import torch

    # Untyped libraries, used as they are.
    diffusers: Any = importlib.import_module("diffusers")
    transformers: Any = importlib.import_module("transformers")

    spec = _PIPELINE_SPEC
    torch.manual_seed(spec["seed"])
    scratch = out_dir.parent / f"{out_dir.name}-tokenizer"
    tokenizer = _clip_tokenizer(scratch, spec)
    text_config = {**spec["text_encoder"], "vocab_size": len(tokenizer)}
    pipe = diffusers.StableDiffusionPipeline(
        vae=diffusers.AutoencoderKL(**spec["vae"]),
        text_encoder=transformers.CLIPTextModel(transformers.CLIPTextConfig(**text_config)),
        tokenizer=tokenizer,
        unet=diffusers.UNet2DConditionModel(**spec["unet"]),
        scheduler=diffusers.PNDMScheduler(**spec["scheduler"]),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    captions = list(spec["pictures"])
    size = spec["unet"]["sample_size"] * pipe.vae_scale_factor
    images = torch.stack([_picture(spec["pictures"][c], spec["scene"], size) for c in captions])
    pooled = torch.nn.functional.avg_pool2d(images, pipe.vae_scale_factor)
    latents = torch.cat([pooled, torch.zeros_like(pooled[:, :1])], 1)
    input_ids = tokenizer(captions, padding="max_length", max_length=spec["max_length"], return_tensors="pt")
    vae_loss = _train_vae(pipe.vae, images, latents, spec)
    # A scheduler of its own: set_timesteps changes the one the pipeline saves.
    scheduler = diffusers.PNDMScheduler(**spec["scheduler"])
    unet_loss = _train_denoiser(pipe.unet, pipe.text_encoder, input_ids.input_ids, latents, scheduler, spec)
    # diffusers warns at every cast of a model that declares float32 modules, even an empty list of them.
    diffusers.utils.logging.set_verbosity_error()
    pipe.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "README.md").write_text(
        "---\nlibrary_name: diffusers\npipeline_tag: text-to-image\n---\n"
        "# A tiny Stable Diffusion 1.5, trained to draw one synthetic picture\n\nBuilt offline by "
        f"pytest-neuron-support's tiny zoo from the real component configs of {spec['source']} with the sizes "
        "shrunk (and v-prediction), trained briefly (bf16). "
        f"{captions[0]!r} draws a red disc on a brown band against a light backdrop; the empty prompt draws "
        "the band alone.\n\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n",
        encoding="utf-8",
    )
    parameters = sum(p.numel() for module in (pipe.unet, pipe.vae, pipe.text_encoder) for p in module.parameters())
    return f"{parameters} parameters, loss vae {vae_loss:.4f}, unet {unet_loss:.4f}"
