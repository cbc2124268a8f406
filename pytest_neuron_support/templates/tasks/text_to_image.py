"""run.py's text-to-image (``text-to-image``, a diffusers pipeline): the prompt, a fixed seed on a CPU
generator, a fixed number of steps, resolution and guidance (SPEC["task_options"]), twice (the first
call compiles the denoiser with the device's backend, the second is timed warm, step by step).

Every call of the denoiser (the pipeline's ``unet`` or ``transformer``) is recorded: the latent it
got and the noise it predicted, written to denoiser_io.pt beside the result. With
SPEC["task_options"]["forced_io"] set, the script is instead the teacher-forced CPU check of a device
run: the same pipeline call on CPU, eager, with each denoiser call's latent replaced by the device's
latent at that step, each prediction scored against the device's (relative error, cosine). The final
image is image.png beside the result (and in it, base64, so a cached CPU reference keeps it).

Spliced into run.py after the diffusers fragment; see diffusers.py.
"""

from __future__ import annotations

from run import SPEC, cold_then_warm, enter

# isort: split
# @@TASK@@
import base64
import io
import itertools
import os
import time

#: What compiles (the message of a run that compiled nothing names it).
COMPILED_CALL = "the pipeline's denoiser"
#: The pipeline components that denoise: the first one the pipeline has is compiled and recorded.
DENOISERS = ("unet", "transformer")
#: Names the latent input of a denoiser goes by when it is passed by keyword.
LATENT_KEYWORDS = ("sample", "hidden_states")


def prepare_task():
    return None


def denoiser_name(pipe):
    for name in DENOISERS:
        if getattr(pipe, name, None) is not None:
            return name
    raise NotImplementedError(f"{type(pipe).__name__} has none of the denoisers run.py records: {DENOISERS}")


def replace_latent(args, kwargs, latent):
    """The call's (args, kwargs) with its latent input replaced (its first argument, or by keyword)."""
    if args:
        return (latent, *args[1:]), kwargs
    for key in LATENT_KEYWORDS:
        if key in kwargs:
            return args, {**kwargs, key: latent}
    raise NotImplementedError(f"no latent input among the denoiser's arguments: {sorted(kwargs)}")


def latent_of(args, kwargs):
    if args:
        return args[0]
    for key in LATENT_KEYWORDS:
        if key in kwargs:
            return kwargs[key]
    raise NotImplementedError(f"no latent input among the denoiser's arguments: {sorted(kwargs)}")


class DenoiserTape:
    """Hooks on the denoiser: each call's latent input and predicted noise, kept on CPU in float32 while
    ``recording``; with ``replay`` (a device run's tape), each call's latent replaced by the recorded one."""

    def __init__(self, module, replay=None):
        self.latents = []
        self.outputs = []
        self.recording = True
        self.replay = replay
        self.handles = [
            module.register_forward_pre_hook(self.pre, with_kwargs=True),
            module.register_forward_hook(self.post, with_kwargs=True),
        ]

    def pre(self, module, args, kwargs):
        if self.replay is None:
            return None
        current = latent_of(args, kwargs)
        given = self.replay["latents"][len(self.outputs)]
        return replace_latent(args, kwargs, given.to(dtype=current.dtype, device=current.device))

    def post(self, module, args, kwargs, output):
        if not self.recording:
            return
        noise = output[0] if isinstance(output, tuple) else getattr(output, "sample", output)
        self.latents.append(latent_of(args, kwargs).detach().float().cpu())
        self.outputs.append(noise.detach().float().cpu())


def generate(pipe, torch, callback=None):
    """One pipeline call as every run makes it: the prompt, SPEC's steps, size and guidance, and a CPU
    generator seeded the same way; the image as a float tensor in [0, 1] (batch, channels, height, width)."""
    options = SPEC["task_options"]
    generator = torch.Generator("cpu").manual_seed(options["seed"])
    kwargs = {"callback_on_step_end": callback} if callback is not None else {}
    return pipe(
        SPEC["prompt"],
        num_inference_steps=options["steps"],
        guidance_scale=options["guidance_scale"],
        height=options["height"],
        width=options["width"],
        generator=generator,
        output_type="pt",
        **kwargs,
    ).images


def compile_denoiser(torch, pipe, name):
    """Compile the way diffusers' own Neuron path does: its ``enable_neuron_compile`` where the installed
    diffusers has it (the neuron device), else the denoiser with ``torch.compile(fullgraph=True)`` and the
    device's backend. Returns how, for the result."""
    if SPEC["device"]["name"] == "neuron" and hasattr(pipe, "enable_neuron_compile"):
        pipe.enable_neuron_compile(model_names=[name], fullgraph=True)
        return f"{type(pipe).__name__}.enable_neuron_compile([{name!r}], fullgraph=True)"
    setattr(pipe, name, torch.compile(getattr(pipe, name), backend=SPEC["compile_backend"], fullgraph=True))
    return f"torch.compile(pipe.{name}, backend={SPEC['compile_backend']!r}, fullgraph=True)"


def png_of(torch, image):
    """The first image of a batch as PNG bytes (8 bits a channel)."""
    from PIL import Image

    pixels = (image[0].detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8)
    picture = Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy(), mode="RGB")
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def beside_result(name):
    return os.path.join(os.path.dirname(os.path.abspath(SPEC["out"])), name)


def run_task(torch, preprocessor, pipe, state):
    name = denoiser_name(pipe)
    if SPEC["task_options"].get("forced_io"):
        return run_teacher_forced(torch, pipe, name)
    compiled = compile_denoiser(torch, pipe, name) if SPEC["compile"] else None
    tape = DenoiserTape(getattr(pipe, name))
    step_times = []

    def clock(pipeline, step, timestep, callback_kwargs):
        step_times.append(time.perf_counter())
        return {}

    def warm():
        tape.recording = False
        step_times.append(time.perf_counter())
        return generate(pipe, torch, clock)

    with torch.no_grad():
        first, second, facts = cold_then_warm(torch, lambda: generate(pipe, torch), warm)
    torch.save({"latents": tape.latents, "outputs": tape.outputs}, beside_result("denoiser_io.pt"))
    image = png_of(torch, first)
    with open(beside_result("image.png"), "wb") as handle:
        handle.write(image)
    steps = [b - a for a, b in itertools.pairwise(step_times)]
    return {
        "tokens": [],
        "text": None,
        "denoiser": name,
        "compiled_with": compiled,
        "denoiser_calls": len(tape.outputs),
        "denoiser_io": "denoiser_io.pt",
        "image": "image.png",
        "image_png": base64.b64encode(image).decode("ascii"),
        "repeat_identical": bool(torch.equal(first, second)),
        "step_s": steps,
        **facts,
    }


def run_teacher_forced(torch, pipe, name):
    """The device's latents, one denoiser call at a time, through the CPU pipeline's own call (its own
    prompt encoding, timesteps and guidance): each prediction scored against the device's."""
    recorded = torch.load(SPEC["task_options"]["forced_io"])
    tape = DenoiserTape(getattr(pipe, name), replay=recorded)
    enter("check")
    start = time.perf_counter()
    with torch.no_grad():
        generate(pipe, torch)
    scores = []
    for step, (device, cpu) in enumerate(zip(recorded["outputs"], tape.outputs, strict=False)):
        difference = (device - cpu).norm().item()
        scale = cpu.norm().item()
        cosine = torch.nn.functional.cosine_similarity(device.flatten(), cpu.flatten(), dim=0).item()
        rel_error = difference / scale if scale > 0 else float("inf") if difference > 0 else 0.0
        scores.append({"step": step, "rel_error": round(rel_error, 6), "cosine": round(cosine, 6)})
    return {"tokens": [], "text": None, "denoise": scores, "denoiser": name, "forced_s": time.perf_counter() - start}
