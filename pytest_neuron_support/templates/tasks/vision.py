"""run.py's inputs for an image and a prompt (``image-text-to-text``): the processor (image processor,
tokenizer and chat template), run.py's own test card, and the prompt through the chat template.

Spliced into run.py before the generation fragment (see text.py).
"""

from __future__ import annotations

from run import SPEC

# isort: split
# @@TASK@@
#: A VLM needs its processor (image processor + tokenizer + chat template), not just a tokenizer.
PREPROCESSOR = "AutoProcessor"


def fixed_image(torch, width, height):
    """A test card drawn from arithmetic alone, identical on every machine: a red-green gradient,
    a blue band, a dark square and a white disc (uint8, channels first, as image processors take).

    Drawn here rather than shipped so run.py stays one file and device and reference runs see
    the same pixels without a download."""
    y = torch.arange(height, dtype=torch.float64).view(-1, 1).expand(height, width)
    x = torch.arange(width, dtype=torch.float64).view(1, -1).expand(height, width)
    red = 255.0 * x / max(width - 1, 1)
    green = 255.0 * y / max(height - 1, 1)
    blue = torch.where((y >= height * 0.4) & (y < height * 0.6), 255.0, 64.0)
    square = (x >= width * 0.1) & (x < width * 0.35) & (y >= height * 0.1) & (y < height * 0.35)
    disc = (x - width * 0.7) ** 2 + (y - height * 0.7) ** 2 <= (min(width, height) * 0.18) ** 2
    channels = []
    for channel in (red, green, blue):
        channel = torch.where(square, 16.0, channel)
        channel = torch.where(disc, 255.0, channel)
        channels.append(channel)
    return torch.stack(channels).round().clamp(0, 255).to(torch.uint8)


def task_inputs(torch, preprocessor, model):
    """(inputs on CPU, tokenizer): the fixed image and the prompt, through the chat template."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": SPEC["prompt"]}]}]
    text = preprocessor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = fixed_image(torch, *SPEC["image_size"])
    inputs = preprocessor(images=[image], text=[text], return_tensors="pt")
    for key, value in inputs.items():
        if value.is_floating_point():  # pixel values in the weights' dtype, as a user passes them
            inputs[key] = value.to(model.dtype)
    return inputs, preprocessor.tokenizer


def pil_image(card):
    """A card (uint8, channels first) as the PIL image a user hands a pipeline."""
    from PIL import Image

    return Image.fromarray(card.permute(1, 2, 0).numpy())


def pipeline_call(torch, pipe, kwargs):
    """The pipeline check's call: the same test card (as the PIL image a user hands a pipeline) and prompt in
    one chat turn, which the pipeline puts through the processor's chat template itself."""
    image = pil_image(fixed_image(torch, *SPEC["image_size"]))
    content = [{"type": "image", "image": image}, {"type": "text", "text": SPEC["prompt"]}]
    return pipe(text=[{"role": "user", "content": content}], generate_kwargs=kwargs)
