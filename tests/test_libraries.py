"""Every row records the libraries its run.py imports, pinned to the versions that ran, and its run.py's
docstring says what to install: a session run as users run it, with a diffusers pipeline whose run fails
right after loading (a failed run keeps them too; a transformers row that passes records its own in
test_speech)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support import zoo


@pytest.mark.slow
def test_a_text_to_image_row_records_diffusers_and_what_it_loads_with(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    # The issue: a text-to-image row said library=transformers with no diffusers version, and neither its
    # run.py nor its reproduction told a reader to install diffusers.
    pytester.makeconftest(
        """
def pytest_neuron_support_post_load(config, model):
    return "raise RuntimeError('planted after loading')"
"""
    )
    pytester.makefile(".yaml", models=f"models:\n  - {{id: {zoo.PIPELINE_REPO}, task: text-to-image}}\n")
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--reference-cache=none")
    assert_outcomes(result, pytester.path / "out", failed=1)
    row = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id").loc[zoo.PIPELINE_REPO]
    assert (row.result, row.failure_stage) == ("ERROR", "load") and "planted after loading" in row.error
    # diffusers, the Pillow its image code imports, and transformers, which diffusers loads the pipeline's
    # text encoders and tokenizers with (diffusers does not install it).
    expected = tuple(f"{name}=={metadata.version(name)}" for name in ("diffusers", "pillow", "transformers"))
    assert tuple(row.libraries) == expected
    assert (row.library, row.library_version) == ("diffusers", metadata.version("diffusers"))
    assert f"\n    pip install {' '.join(expected)}\n" in row.runscript
