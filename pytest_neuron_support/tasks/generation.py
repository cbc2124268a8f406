"""Text generation (``text-generation``) and its vision-language sibling (``image-text-to-text``).

run.py generates ``--max-new-tokens`` greedy tokens with a static cache (generate() compiles the
decoding step with the device's backend), twice: the warm second run must repeat the first. The verdict
rests on CPU evidence: a one-core run's tokens must equal a free-running CPU reference's (the seed's
exact parity, started beside the device run), and every run's tokens, sharded included, must be the CPU
model's top-1 under the device's own prefix (the teacher-forced check: one CPU forward). The fluency
judge reads every sharded run's text; it decides only where the host cannot hold the model for the CPU
check. docs/tasks.md describes both tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from pytest_neuron_support.base.model import DEFAULT_PROMPT, ModelSpec
from pytest_neuron_support.cpu.forced import forced_check, forced_spec
from pytest_neuron_support.cpu.judge import judge
from pytest_neuron_support.cpu.reference import ReferenceRun
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.tasks.task import Task
from pytest_neuron_support.verdict import decide
from pytest_neuron_support.verdict.tokens import Parity, TeacherForced, compare

#: The text turn after the image of an image-text-to-text entry that sets no prompt, while the
#: session's --prompt is the default (a text continuation prompt says nothing about an image).
IMAGE_PROMPT = "Describe this image."


def parity_of(result: Mapping[str, Any], reference: Mapping[str, Any]) -> Parity:
    """The free-running parity of a device result against a CPU reference: their tokens, and the top
    logprobs that tell a near-tie."""
    return compare(
        result["tokens"], reference["tokens"], result.get("top_logprobs", ()), reference.get("top_logprobs", ())
    )


def with_parity(row: Row, parity: Parity, reference: Mapping[str, Any]) -> Row:
    """The free-running parity's evidence into the row's parity columns."""
    return replace(
        row,
        reference_match=parity.match,
        near_tie=parity.near_tie,
        matched_prefix=parity.matched_prefix,
        first_divergence=parity.first_divergence,
        device_token=parity.device_token,
        reference_token=parity.reference_token,
        logprob_gap=parity.logprob_gap,
        reference_tokens=tuple(reference["tokens"]),
    )


def with_forced(row: Row, forced: TeacherForced) -> Row:
    """The teacher-forced CPU check's evidence into the row's columns."""
    return replace(
        row,
        positions_checked=forced.positions_checked,
        positions_disagreeing=forced.positions_disagreeing,
        first_disagreement=forced.first_disagreement,
        disagreement_device_token=forced.device_token,
        disagreement_cpu_token=forced.cpu_token,
        disagreement_rank=forced.rank,
        disagreement_deficit=forced.deficit,
        max_logprob_deficit=forced.max_deficit,
        disagreements_near_tie=forced.all_near_ties,
    )


class TextGeneration(Task):
    """``text-generation``: the tokenizer and ``AutoModelForCausalLM``, the prompt as is (the default row)."""

    def spec_fields(self, model: ModelSpec, reference: bool) -> dict[str, Any]:
        # A CPU reference also scores its own tokens teacher-forced: when the device generated the very
        # same tokens, that pass is the device run's CPU check too.
        return {"score_own_tokens": reference}

    def compare(self, row: Row, model: ModelSpec, result: Mapping[str, Any], reference: Mapping[str, Any]) -> Row:
        return with_parity(row, parity_of(result, reference), reference)

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], reference: ReferenceRun | None) -> Row:
        """One core: free-running parity with the CPU reference and the teacher-forced check, both.
        Sharded: the teacher-forced check (the judge's verdict kept as evidence, deciding only where the
        host cannot hold the model for the check)."""
        settings, mode = job.settings, job.settings.parity
        row = replace(row, parity_mode=mode)  # the mode the token verdict below is decided under
        free: Parity | None = None
        if reference is not None:
            row, cpu = self.reference_of(row, result, reference)
            if cpu is None:
                return row
            free = parity_of(result, cpu)
            row = with_parity(row, free, cpu)
        spec = forced_spec(
            self.run_spec(job.model, settings, device=DEVICES["cpu"], reference=True, post_load=""),
            tuple(int(t) for t in result.get("tokens") or ()),
            result.get("decoder_prompt_ids"),
        )
        check = forced_check(job, spec, result, row.parameters, None if reference is None else reference.result)
        if check.how.startswith("skipped"):
            row = replace(row, cpu_check=check.how)
        else:
            row = replace(row, cpu_check=check.how, cpu_check_s=check.wall_s)
        if check.failure is not None:
            return replace(row, **decide.run_failed(check.failure[0], "reference", check.failure[1]).fields())
        if check.forced is not None:
            row = with_forced(row, check.forced)
        if free is not None:
            assert check.forced is not None
            decision = decide.one_core(free, check.forced, mode, len(row.tokens), len(row.reference_tokens))
            return replace(row, **decision.fields())
        judged = judge(settings, job.workdir, job.environ, row.text or "", row.tokens, result)
        row = replace(row, **judged.fields())
        decision = decide.sharded(check.forced, judged.failure, mode, len(row.tokens))
        return replace(row, **decision.fields())

    def locate_options(self, row: Row, result: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The device's own tokens up to the first bad one (the teacher-forced check's first disagreement, else
        the free-running divergence): one forward over the prompt and them ends at the logits that chose it; an
        encoder-decoder's after its decoder prompt."""
        position = row.first_disagreement if row.first_disagreement is not None else row.first_divergence
        if position is None:
            return None
        prefix = result.get("decoder_prompt_ids")
        return {
            "tokens": [int(t) for t in (result.get("tokens") or ())[:position]],
            "prefix": None if prefix is None else [int(t) for t in prefix],
        }


class ImageTextToText(TextGeneration):
    """``image-text-to-text``: the processor and ``AutoModelForImageTextToText``; run.py's own test card
    (drawn by arithmetic, the same on every machine) and the prompt through the processor's chat
    template."""

    auto_class = "AutoModelForImageTextToText"
    registry = (
        "transformers.models.auto.modeling_auto",
        "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    )
    inputs: ClassVar[str] = "vision"
    code = ("vision.py", "generation.py")
    # train.py's batches are text only: no image reaches the processor.
    trainable: ClassVar[bool] = False

    def prompt(self, model: ModelSpec, default: str) -> str | None:
        if not model.prompt and default == DEFAULT_PROMPT:
            return IMAGE_PROMPT
        return super().prompt(model, default)
