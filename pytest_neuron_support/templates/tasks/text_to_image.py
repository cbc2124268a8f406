"""run.py's text-to-image (``text-to-image``, a diffusers pipeline): the prompt, a fixed seed on a CPU
generator, a fixed number of steps and guidance (SPEC["task_options"]; the pipeline's own default
resolution unless the options set one), twice (the first call compiles the denoiser with the device's
backend, the second is timed warm, step by step).

The first call is recorded stage by stage, on CPU in float32 (moved off the device before any cast, so the
recording adds no operation to the device's fallback-op list): each denoiser call's latent and predicted
noise (``denoise``), each scheduler step's noise input (the classifier-free-guidance combine of the
prediction: ``guidance``), its latent input and its new latent (``scheduler``), the latent given to the
VAE decoder and the final image (``decode``), written to denoiser_io.pt beside the result. Each denoiser call's
whole input is kept too (``calls``: its arguments in their own dtypes, a tensor equal to the previous call's
kept once), so that a FAIL's module search can feed one call again.

With SPEC["task_options"]["forced_io"] set, the script is instead the teacher-forced CPU check of a device
run: the same pipeline call on CPU, eager, every stage fed the device's own inputs from that recording (its
latents into the denoiser, its predictions into the guidance combine, its guided noise and latent into the
scheduler step, its final latent into the VAE decoder), once in float32 and once in the device's dtype
(``noise_dtype``), so each stage's device output is scored against float32 next to the CPU's own dtype
noise (``verdict.tolerance`` judges them). The final image is image.png beside the result (and in it,
base64, so a cached CPU reference keeps it).

With SPEC["locate"] set (after a numerics FAIL at a denoise or decode step), the script is instead the module
search of that step (run.py's locate_modules): the denoiser fed that call's recorded inputs, or the VAE decoder
fed the recorded final latent, with every module's output recorded (``locate_stage``).

Spliced into run.py after the diffusers fragment; see diffusers.py.
"""

from __future__ import annotations

from run import SPEC, cold_then_warm, enter, locate_modules, placed, relative_distance

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
#: The stages a teacher-forced check scores, in the order a denoising step runs them.
STAGES = ("denoise", "guidance", "scheduler", "decode")


def prepare_task():
    return None


def denoiser_name(pipe):
    for name in DENOISERS:
        if getattr(pipe, name, None) is not None:
            return name
    raise NotImplementedError(f"{type(pipe).__name__} has none of the denoisers run.py records: {DENOISERS}")


def argument(args, kwargs, index, names):
    """A call's argument by position, else by the first of ``names`` it was given as (None when absent)."""
    if len(args) > index:
        return args[index]
    return next((kwargs[name] for name in names if name in kwargs), None)


def with_argument(args, kwargs, index, names, value):
    """The call's (args, kwargs) with that argument replaced."""
    if len(args) > index:
        return (*args[:index], value, *args[index + 1 :]), kwargs
    for name in names:
        if name in kwargs:
            return args, {**kwargs, name: value}
    raise NotImplementedError(f"no argument {names[0]!r} among the call's arguments: {sorted(kwargs)}")


def on_cpu(tensor):
    """A recorded copy: moved to the host first, then cast, so the harness runs no op on the device."""
    return tensor.detach().to("cpu").float()


def like(recorded, current):
    """A recorded tensor as the input it replaces: that tensor's dtype and device."""
    return recorded.to(device=current.device, dtype=current.dtype)


def first_tensor(output):
    """The tensor a denoiser, scheduler step or decoder returned (a tuple's first item, a diffusers
    output's ``sample``/``prev_sample``, or the tensor itself)."""
    if isinstance(output, tuple):
        return output[0]
    for name in ("sample", "prev_sample"):
        if hasattr(output, name):
            return getattr(output, name)
    return output


def with_first_tensor(output, tensor):
    """``output`` of the same kind with its first tensor replaced."""
    if isinstance(output, tuple):
        return (tensor, *output[1:])
    for name in ("sample", "prev_sample"):
        if hasattr(output, name):
            setattr(output, name, tensor)  # a diffusers BaseOutput keeps its mapping in step
            return output
    return tensor


class StageTape:
    """Every stage of one pipeline call, kept on CPU in float32 while ``recording``.

    Hooks on the denoiser (its latent input and noise prediction), a wrapper on the scheduler's ``step``
    (the guided noise and the latent it gets, the latent it returns) and on the VAE's ``decode`` (the
    latent it gets). With ``replay`` (a device run's tape) each stage is fed the device's own inputs and
    passes the device's own output on, so the whole call follows the device's trajectory while the CPU's
    output of every stage is recorded."""

    def __init__(self, pipe, denoiser, replay=None):
        self.replay = replay
        self.recording = True
        self.record = {"latents": [], "outputs": [], "guided": [], "samples": [], "stepped": [], "decoded": []}
        module = getattr(pipe, denoiser)
        if replay is None:
            # A device run keeps each denoiser call's whole input, for a FAIL's module search (locate_stage).
            self.record["calls"] = []
            self.record["weights_dtype"] = SPEC["dtype"]  # what the pipeline casts its inputs to
        self.hooks = [
            module.register_forward_pre_hook(self.before_denoiser, with_kwargs=True),
            module.register_forward_hook(self.after_denoiser, with_kwargs=True),
        ]
        self.scheduler = pipe.scheduler
        self.step = pipe.scheduler.step
        pipe.scheduler.step = self.scheduler_step
        self.vae = getattr(pipe, "vae", None)
        if self.vae is not None:
            self.decode = self.vae.decode
            self.vae.decode = self.vae_decode

    def close(self):
        """Takes the hooks and wrappers off again (a second replay puts its own on)."""
        for hook in self.hooks:
            hook.remove()
        self.scheduler.step = self.step
        if self.vae is not None:
            self.vae.decode = self.decode

    def keep(self, name, tensor):
        if self.recording:
            self.record[name].append(on_cpu(tensor))

    def given(self, name, index, current):
        """The device's recorded input for this call (``replay``), else the call's own."""
        return current if self.replay is None else like(self.replay[name][index], current)

    def before_denoiser(self, module, args, kwargs):
        if self.replay is None:
            return None
        latent = argument(args, kwargs, 0, LATENT_KEYWORDS)
        return with_argument(
            args, kwargs, 0, LATENT_KEYWORDS, self.given("latents", len(self.record["outputs"]), latent)
        )

    def after_denoiser(self, module, args, kwargs, output):
        index = len(self.record["outputs"])
        self.keep("latents", argument(args, kwargs, 0, LATENT_KEYWORDS))
        if self.recording and self.replay is None:
            before = self.record["calls"][-1] if self.record["calls"] else None
            self.record["calls"].append(kept_input({"args": list(args), "kwargs": kwargs}, before))
        noise = first_tensor(output)
        self.keep("outputs", noise)
        if self.replay is None:
            return None
        return with_first_tensor(output, self.given("outputs", index, noise))

    def scheduler_step(self, *args, **kwargs):
        index = len(self.record["stepped"])
        guided = argument(args, kwargs, 0, ("model_output",))
        self.keep("guided", guided)
        args, kwargs = with_argument(args, kwargs, 0, ("model_output",), self.given("guided", index, guided))
        sample = argument(args, kwargs, 2, ("sample",))
        self.keep("samples", sample)
        args, kwargs = with_argument(args, kwargs, 2, ("sample",), self.given("samples", index, sample))
        output = self.step(*args, **kwargs)
        stepped = first_tensor(output)
        self.keep("stepped", stepped)
        if self.replay is None:
            return output
        return with_first_tensor(output, self.given("stepped", index, stepped))

    def vae_decode(self, *args, **kwargs):
        latent = argument(args, kwargs, 0, ("z", "latents"))
        index = len(self.record["decoded"])
        self.keep("decoded", latent)
        args, kwargs = with_argument(args, kwargs, 0, ("z", "latents"), self.given("decoded", index, latent))
        return self.decode(*args, **kwargs)


#: What a recording keeps of a call argument it cannot store (torch.load's weights_only refuses other objects).
UNRECORDED = "unrecorded"


def kept_input(value, before):
    """A denoiser call's input as the recording keeps it: every tensor on the host in its own dtype (a timestep
    stays float32 or int64 where the latent is bfloat16), one equal to the previous call's (``before``) kept once
    (the prompt's embeddings: the same at every step); plain values as they are; any other object by its type's
    name only ({UNRECORDED: name}), so the recording still loads safely and the module search says why it
    cannot feed that call again."""
    if hasattr(value, "is_floating_point"):
        copy = value.detach().to("cpu")
        same = hasattr(before, "is_floating_point") and before.dtype == copy.dtype and before.shape == copy.shape
        return before if same and bool(before.equal(copy)) else copy
    if isinstance(value, dict):
        earlier = before if isinstance(before, dict) else {}
        return {key: kept_input(item, earlier.get(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        earlier = before if isinstance(before, list) and len(before) == len(value) else [None] * len(value)
        return [kept_input(item, old) for item, old in zip(value, earlier, strict=True)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {UNRECORDED: type(value).__name__}


def unrecorded(value):
    """The type names of the objects a kept call input could not store."""
    if isinstance(value, dict):
        if set(value) == {UNRECORDED}:
            return {value[UNRECORDED]}
        return set().union(*(unrecorded(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(unrecorded(item) for item in value))
    return set()


def locate_stage(torch, pipe):
    """The module search of one denoise or decode step (SPEC["locate"]: ``component``, ``call``, and ``recording``,
    the device run's recording, copied beside this script): the denoiser fed that call's recorded inputs, compiled
    as the device run compiled it, or the VAE decoder fed the recorded final latent, eager as the device run
    decoded it. Modules are named from the pipeline (``unet.down_blocks.0.attentions.0``)."""
    options = SPEC["locate"]
    name = options["component"]
    here = os.path.dirname(os.path.abspath(__file__))
    recorded = torch.load(os.path.join(here, options["recording"]))
    if name == "vae":
        latent = recorded["decoded"][options["call"]]

        def call(forward):
            weights = next(forward.parameters())
            return forward.decode(placed(latent, weights.device, weights.dtype), return_dict=False)

        def compiled(torch, module):
            return module  # run.py compiles only the denoiser: the device decoded eagerly

    else:
        given, source = recorded["calls"][options["call"]], recorded["weights_dtype"]
        missing = sorted(unrecorded(given))
        if missing:
            raise NotImplementedError(f"the denoiser call passes {', '.join(missing)}, which the recording cannot keep")

        def call(forward):
            weights = next(forward.parameters())
            inputs = placed(given, weights.device, weights.dtype, only=source)
            return forward(*inputs["args"], **inputs["kwargs"])

        def compiled(torch, module):
            return compiled_denoiser(torch, module) if SPEC["compile"] else module

    def reference(torch):
        import diffusers

        cpu = getattr(diffusers, SPEC["auto_class"]).from_pretrained(
            SPEC["model"],
            revision=SPEC["revision"],
            torch_dtype=torch.float32,
            trust_remote_code=SPEC["trust_remote_code"],
        )
        return getattr(cpu, name).eval()

    return locate_modules(torch, getattr(pipe, name), call, name, compiled, reference)


def call_options():
    """The pipeline call's keyword arguments from SPEC's task options: the steps and the guidance always; a
    size only where the options set one (else the pipeline's own default resolution, as a user gets it)."""
    options = SPEC["task_options"]
    kwargs = {"num_inference_steps": options["steps"], "guidance_scale": options["guidance_scale"]}
    for name in ("height", "width"):
        if options.get(name):
            kwargs[name] = options[name]
    return kwargs


def generate(pipe, torch, callback=None):
    """One pipeline call as every run makes it: the prompt, SPEC's options and a CPU generator seeded the
    same way; the image as a float tensor in [0, 1] (batch, channels, height, width)."""
    generator = torch.Generator("cpu").manual_seed(SPEC["task_options"]["seed"])
    kwargs = {"callback_on_step_end": callback} if callback is not None else {}
    return pipe(SPEC["prompt"], generator=generator, output_type="pt", **call_options(), **kwargs).images


def compile_denoiser(torch, pipe, name):
    """Compile the denoiser the way diffusers' own Neuron test does: ``torch.compile(fullgraph=True)`` with
    the device's backend (diffusers has no pipeline-level Neuron compile call: ``enable_neuron_compile`` was
    in a draft of its Neuron PR and removed before the merge). Returns how, for the result."""
    setattr(pipe, name, compiled_denoiser(torch, getattr(pipe, name)))
    return f"torch.compile(pipe.{name}, backend={SPEC['compile_backend']!r}, fullgraph=True)"


def compiled_denoiser(torch, module):
    """The denoiser as every run compiles it (the device run, and the module search of one of its calls)."""
    return torch.compile(module, backend=SPEC["compile_backend"], fullgraph=True)


def component_devices(torch, pipe):
    """Where each pipeline component's parameters and buffers are: {component: [device types]}."""
    found = {}
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            tensors = itertools.chain(component.parameters(), component.buffers())
            found[name] = sorted({t.device.type for t in tensors})
    return found


def png_of(torch, image):
    """The first image of a batch (on CPU, float) as PNG bytes (8 bits a channel)."""
    from PIL import Image

    pixels = (image[0].clamp(0, 1) * 255).round().to(torch.uint8)
    picture = Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy(), mode="RGB")
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def beside_result(name):
    return os.path.join(os.path.dirname(os.path.abspath(SPEC["out"])), name)


def run_task(torch, preprocessor, pipe, state):
    if SPEC.get("locate"):
        return locate_stage(torch, pipe)
    name = denoiser_name(pipe)
    if SPEC["task_options"].get("forced_io"):
        return run_teacher_forced(torch, pipe, name)
    placed = component_devices(torch, pipe)
    compiled = compile_denoiser(torch, pipe, name) if SPEC["compile"] else None
    tape = StageTape(pipe, name)
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
    first, second = on_cpu(first), on_cpu(second)
    torch.save({**tape.record, "image": first}, beside_result("denoiser_io.pt"))
    image = png_of(torch, first)
    with open(beside_result("image.png"), "wb") as handle:
        handle.write(image)
    steps = [b - a for a, b in itertools.pairwise(step_times)]
    return {
        "tokens": [],
        "text": None,
        "denoiser": name,
        "compiled_with": compiled,
        "component_devices": placed,
        "model_devices": sorted({kind for kinds in placed.values() for kind in kinds}),
        "denoiser_calls": len(tape.record["outputs"]),
        "denoiser_io": "denoiser_io.pt",
        "image": "image.png",
        "image_png": base64.b64encode(image).decode("ascii"),
        "repeat_identical": bool(torch.equal(first, second)),
        "step_s": steps,
        **facts,
    }


def replayed(torch, pipe, name, recorded):
    """The CPU's output of every stage of one pipeline call fed the device's recorded inputs."""
    tape = StageTape(pipe, name, replay=recorded)
    with torch.no_grad():
        image = generate(pipe, torch)
    tape.close()
    return {
        "denoise": tape.record["outputs"],
        "guidance": tape.record["guided"],
        "scheduler": tape.record["stepped"],
        "decode": [on_cpu(image)] if recorded["decoded"] else [],
    }


def run_teacher_forced(torch, pipe, name):
    """The device's recording through the CPU pipeline's own call, stage by stage, in float32 and in the
    device's dtype: each stage's device output and both CPU outputs' distances (``distance``: device from
    float32; ``noise``: the CPU in the device's dtype from float32)."""
    recorded = torch.load(SPEC["task_options"]["forced_io"])
    device = {
        "denoise": recorded["outputs"],
        "guidance": recorded["guided"],
        "scheduler": recorded["stepped"],
        "decode": [recorded["image"]] if recorded["decoded"] else [],
    }
    enter("check")
    start = time.perf_counter()
    exact = replayed(torch, pipe, name, recorded)
    noise_dtype = SPEC["task_options"].get("noise_dtype") or SPEC["dtype"]
    if noise_dtype != SPEC["dtype"]:
        pipe.to(dtype=getattr(torch, noise_dtype))
        rounded = replayed(torch, pipe, name, recorded)
    else:
        rounded = exact
    # In the order the call ran them: each step's denoise, guidance and scheduler, then the decode.
    steps = max(len(device[stage]) for stage in STAGES[:3])
    order = [(step, stage) for step in range(steps) for stage in STAGES[:3]]
    scores = []
    for step, stage in [*order, *((step, "decode") for step in range(len(device["decode"])))]:
        if step < min(len(device[stage]), len(exact[stage]), len(rounded[stage])):
            scores.append(
                {
                    "stage": stage,
                    "step": step,
                    "distance": relative_distance(torch, device[stage][step], exact[stage][step]),
                    "noise": relative_distance(torch, rounded[stage][step], exact[stage][step]),
                }
            )
    return {
        "tokens": [],
        "text": None,
        "stages": scores,
        "calls": {stage: len(device[stage]) for stage in STAGES},
        "noise_dtype": noise_dtype,
        "denoiser": name,
        "forced_s": time.perf_counter() - start,
    }
