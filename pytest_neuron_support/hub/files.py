"""Files and safetensors metadata of one repository: the planner's and the tasks' questions of the Hub (a
file from the Hugging Face cache or downloaded, the weights counted from safetensors headers alone)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_neuron_support.hub.reach import HubError


def download_file(repo_id: str, filename: str, *, revision: str | None, local_only: bool = False) -> Path:
    """``filename`` of ``repo_id`` from the Hugging Face cache, downloaded if it is not there (unless
    ``local_only``). Raises what huggingface_hub raises (offline and not cached, not found, gated, HTTP)."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo_id, filename, revision=revision, local_files_only=local_only)
    if not isinstance(path, str):
        raise HubError(f"{repo_id}: hf_hub_download returned no file for {filename}")
    return Path(path)


def cached_file(repo_id: str, filename: str, *, revision: str | None) -> Path | None:
    """``filename`` of ``repo_id`` when it is already in the Hugging Face cache, else None (never a
    request)."""
    from huggingface_hub import try_to_load_from_cache

    # A path only when the file is cached; None or a "known missing" sentinel otherwise.
    found = try_to_load_from_cache(repo_id, filename, revision=revision)
    return Path(found) if isinstance(found, str) else None


def safetensors_parameters(
    repo_id: str,
    *,
    revision: str | None,
    count: Callable[[str, str, list[int]], int],
    is_expert: Callable[[str], bool],
) -> tuple[int, int]:
    """(parameters, expert parameters) of ``repo_id`` from the Hub's safetensors metadata API (the
    headers only, no weights): each tensor counts ``count(name, dtype, shape)`` weights, as an
    expert's when ``is_expert(name)``. The metadata's own ``parameter_count`` is the header's elements,
    which is not the weights a packed dtype loads as."""
    from huggingface_hub import get_safetensors_metadata

    metadata = get_safetensors_metadata(repo_id, revision=revision)
    total = experts = 0
    for file in metadata.files_metadata.values():
        for name, tensor in file.tensors.items():
            weights = count(name, str(tensor.dtype), list(tensor.shape))
            total += weights
            experts += weights if is_expert(name) else 0
    return total, experts


def repo_files(repo_id: str, *, revision: str | None) -> list[str]:
    """Every file of ``repo_id`` at ``revision``, as the model's info lists them (its ``siblings``: the
    planner's question for a repository whose weights are in several folders, a diffusers pipeline's)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, revision=revision)
    return [sibling.rfilename for sibling in info.siblings or ()]


def safetensors_file_parameters(repo_id: str, filename: str, *, revision: str | None) -> int:
    """The elements of every tensor of one safetensors file of ``repo_id``, from its header as the Hub's
    API reads it (a range request; no weights)."""
    from huggingface_hub import HfApi

    metadata = HfApi().parse_safetensors_file_metadata(repo_id, filename, revision=revision)
    return sum(int(count) for count in metadata.parameter_count.values())
