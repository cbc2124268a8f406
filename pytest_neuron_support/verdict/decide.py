"""The verdict rule, in one place: pure functions from evidence to a :class:`Decision`.

Every row's ``result``, ``failure_stage``, ``verdict_basis`` and ``error`` come from one of these
functions, whether a catalog item or a user's own test made the row: the checks gather evidence
(tokens, the CPU's teacher-forced scores, cosines, losses, the judge's answer) and hand it here;
nothing else decides. ``records.VERDICT_BASES`` defines each basis for the dataset card.

A divergence at token 0 means a broken model, late drift means numerics
(``shared/reference/verdicts.md``): the errors say where and by how much, so a reader can tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_neuron_support.verdict.decisions import Decisions
from pytest_neuron_support.verdict.embeddings import EmbeddingParity
from pytest_neuron_support.verdict.tokens import Parity, TeacherForced
from pytest_neuron_support.verdict.tolerance import Calibrated
from pytest_neuron_support.verdict.training import GRAD_NORM_RTOL, LOSS_ATOL, LOSS_RTOL, TrainParity


@dataclass(frozen=True)
class Decision:
    """What decided a row: its result, the stage that failed (None for a PASS), what decided it, and
    the error a reader sees (None for a PASS).

    Attributes:
        result: ``PASS``, ``FAIL``, ``ERROR``, ``TIMEOUT`` (``records.RESULTS``).
        failure_stage: the stage that failed (``records.STAGES``), None when it passed.
        verdict_basis: the evidence that decided (``records.VERDICT_BASES``).
        error: why it failed, None when it passed.
    """

    result: str
    failure_stage: str | None
    verdict_basis: str
    error: str | None

    def fields(self) -> dict[str, Any]:
        """The row fields this decision sets (``dataclasses.replace(row, **decision.fields())``)."""
        return asdict(self)


def passed(basis: str) -> Decision:
    return Decision("PASS", None, basis, None)


def run_failed(status: str, stage: str, error: str) -> Decision:
    """A process of the check did not finish (``ERROR``, ``TIMEOUT``): the run decides, at its stage."""
    return Decision(status, stage, "run", error)


def device_type(device_map: str) -> str:
    """The device type a ``device_map`` names (``cuda:0`` -> ``cuda``): what every tensor must be on."""
    return device_map.split(":")[0]


def placement(device_map: str, model_devices: Sequence[str], pipeline_device: str | None) -> Decision | None:
    """Where a pipeline put its model, against the device it was asked for (``device_map``, the session
    device's): None when every parameter and buffer is on that device's type, else a FAIL at ``load``. A
    pipeline that keeps the model on the CPU still runs, and would PASS on the CPU's numbers."""
    wanted = device_type(device_map)
    if list(model_devices) == [wanted]:
        return None
    where = ", ".join(model_devices) or "no device (nothing recorded)"
    verb = "stayed on" if list(model_devices) == ["cpu"] else "is on"
    error = (
        f"the pipeline's model {verb} {where}, not on {wanted} (the pipeline's device: {pipeline_device}): it would "
        f"have run off the device, so it was not run; pass the device to the pipeline (device={wanted!r}), not a "
        "device_map the device's library does not see"
    )
    return Decision("FAIL", "load", "placement", error)


#: What differs when a task's warm second run is not its first, by the task's outputs.
REPEATED = {
    "embeddings": "the second forward pass's embeddings differ from the first's",
    "image": "the warm second pipeline call's image differs from the first's",
    "outputs": "the second forward pass's outputs differ from the first's",
}


def repeat_differs(
    first: Sequence[int], again: Sequence[int] | None, index: int | None, *, outputs: str = "tokens"
) -> Decision:
    """The warm second run gave other outputs than the first (what a user gets from the NEFF cache is
    not what the first run showed): a FAIL at ``generate`` saying where the tokens part (``index``), or,
    for a task whose outputs are not tokens (``outputs``: ``embeddings``, ``image``), that they differ."""
    if outputs != "tokens":
        return Decision("FAIL", "generate", "repeat", REPEATED[outputs])
    second = list(again or ())
    one = first[index] if index is not None and index < len(first) else None
    two = second[index] if index is not None and index < len(second) else None
    error = (
        f"the warm second generate() differs from the first at position {index} of {len(first)} "
        f"(first {one}, second {two})"
    )
    return Decision("FAIL", "generate", "repeat", error)


def forced_error(forced: TeacherForced, n: int) -> str:
    """What the teacher-forced CPU check found wrong with ``n`` device tokens."""
    if forced.positions_checked == 0:
        return "the teacher-forced CPU check scored no token (the device generated none)"
    return (
        f"teacher-forced CPU check: {forced.positions_disagreeing} of {forced.positions_checked} device tokens are not "
        f"the CPU top-1; first at position {forced.first_disagreement} of {n} (device {forced.device_token}, "
        f"CPU top-1 {forced.cpu_token}, device token ranked {forced.rank}, {forced.deficit} nats below; "
        f"max deficit {forced.max_deficit} nats{', all near-ties' if forced.all_near_ties else ''})"
    )


def one_core(free: Parity, forced: TeacherForced, mode: str, n_tokens: int, n_reference: int) -> Decision:
    """A one-core generation run: free-running parity with the CPU reference (the seed's exact parity;
    ``near-tie`` mode also passes a first divergence that is a near-tie) and the teacher-forced check,
    both. A FAIL at ``parity`` names every problem found."""
    basis = "parity+teacher-forced"
    free_ok = free.match or (mode == "near-tie" and bool(free.near_tie))
    forced_ok = forced.passes(mode)
    if free_ok and forced_ok:
        return passed(basis)
    problems = []
    if not free_ok:
        problems.append(
            f"tokens differ from the CPU reference at index {free.first_divergence} of {n_reference} "
            f"(device {free.device_token}, reference {free.reference_token}, gap {free.logprob_gap} nats"
            f"{', a near-tie' if free.near_tie else ''})"
        )
    if not forced_ok:
        problems.append(forced_error(forced, n_tokens))
    return Decision("FAIL", "parity", basis, "; ".join(problems))


def sharded(forced: TeacherForced | None, judged: Decision | None, mode: str, n_tokens: int) -> Decision:
    """A sharded generation run: the teacher-forced CPU check decides; where the host could not hold the
    model for it (``forced`` None), the fluency judge decides alone (``judged``: its failure, None when
    it found the text fluent)."""
    if forced is None:
        return judged if judged is not None else passed("judge")
    if forced.passes(mode):
        return passed("teacher-forced")
    return Decision("FAIL", "parity", "teacher-forced", forced_error(forced, n_tokens))


def judge_failed(result: str, error: str) -> Decision:
    """The judge found the text not fluent (``FAIL``), or could not run (its process's result)."""
    return Decision(result, "judge", "judge", error)


def embeddings(parity: EmbeddingParity) -> Decision:
    """Every sentence's device embedding against the CPU's: PASS at or above the threshold."""
    if parity.match:
        return passed("cosine")
    if parity.problem is not None:
        error = f"embeddings cannot be compared with the CPU reference: {parity.problem}"
    else:
        error = (
            f"embeddings differ from the CPU reference: min cosine {parity.min_cosine:.6f} "
            f"(sentence {parity.worst_index}) is below the threshold {parity.threshold:g}"
        )
    return Decision("FAIL", "parity", "cosine", error)


def training_error(parity: TrainParity) -> str:
    """Which step of a training run went wrong, and by how much against its tolerance."""
    step, what = parity.first_bad_step, parity.what
    if what == "step count":
        return f"training: the device ran {parity.steps_compared} step(s) comparable with the CPU's, not all of them"
    if what == "loss not finite":
        return f"training: the loss at step {step} is not finite ({parity.device_value})"
    if what == "loss":
        tolerance = f"tolerance {LOSS_ATOL} + {LOSS_RTOL} x abs(cpu)"
    else:
        tolerance = f"tolerance {GRAD_NORM_RTOL:.0%} of the CPU's"
    return (
        f"training: loss diverged at step {step}: the {what} is {parity.device_value:.6g} on the device, "
        f"{parity.cpu_value:.6g} on CPU ({tolerance})"
    )


def training(parity: TrainParity, recompiles: int | None) -> Decision:
    """PASS when every device loss is finite, each step's loss and gradient norm agree with the CPU's
    within tolerance, and no graph was compiled after the first step; else a FAIL at ``train`` naming the
    first step that went wrong (or the recompiles)."""
    if not parity.match:
        return Decision("FAIL", "train", "train-losses", training_error(parity))
    if recompiles:
        error = f"{recompiles} graph(s) compiled again after the first optimizer step: the shapes are not fixed"
        return Decision("FAIL", "train", "train-losses", error)
    return passed("train-losses")


def numeric(checked: Calibrated, basis: str, what: str) -> Decision:
    """A numeric check under the calibrated tolerance rule (``verdict.tolerance``): PASS when every
    comparison's distance from float32 is within the rule's multiple of the CPU's own dtype noise; a FAIL at
    ``parity`` names the first stage and step out of tolerance and by how much. ``what`` names the check in
    the error (``teacher-forced pipeline check``)."""
    if checked.problem is not None:
        return Decision("FAIL", "parity", basis, f"{what}: {checked.problem}")
    bad = checked.first_bad
    if bad is None:
        return passed(basis)
    others = sum(1 for c in checked.comparisons if not c.ok) - 1
    more = f"; {others} later comparison(s) out of tolerance too" if others else ""
    return Decision("FAIL", "parity", basis, f"{what}: {bad.describe()}{more}")


#: The basis of a forward task's verdict (tasks/forward.py): its outputs and the decisions read from them.
FORWARD_BASIS = "forward-calibrated"


def forward(
    checked: Calibrated,
    decisions: Decisions | None,
    what: str,
    labels: Sequence[str] = (),
    cpu_labels: Sequence[str] = (),
) -> Decision:
    """A forward task's verdict: every item's output within the calibrated tolerance (:func:`numeric`'s rule)
    and every decision the CPU was decisive about the same on the device (``verdict.decisions``; a near-tie
    that differs is reported in the row, not failed). A FAIL at ``parity`` names the first output out of
    tolerance and the first decision that differs, whichever failed (both when both did); ``what`` names the
    output (``text-classification logits``), ``labels``/``cpu_labels`` each item's decision per side.
    ``decisions`` is None for a task whose output is numbers only (features, a depth map): the calibrated
    tolerance alone decides."""
    if checked.problem is not None or (decisions is not None and decisions.problem is not None):
        problem = checked.problem or (decisions.problem if decisions is not None else None)
        return Decision("FAIL", "parity", FORWARD_BASIS, f"{what}: {problem}")
    errors = []
    bad = checked.first_bad
    if bad is not None:
        others = sum(1 for c in checked.comparisons if not c.ok) - 1
        more = f"; {others} later item(s) out of tolerance too" if others else ""
        errors.append(f"{what}: {bad.describe()}{more}")
    if decisions is not None and not decisions.match:
        errors.append(decisions.describe(f"{what.rsplit(' ', 1)[0]} decisions", labels, cpu_labels))
    if errors:
        return Decision("FAIL", "parity", FORWARD_BASIS, "; ".join(errors))
    return passed(FORWARD_BASIS)


#: The basis of a text-to-image verdict: the device's recording replayed stage by stage on CPU.
PIPELINE_BASIS = "pipeline-teacher-forced"


def pipeline_stages(checked: Calibrated | None, how: str, failure: tuple[str, str] | None) -> Decision:
    """A text-to-image verdict from its teacher-forced pipeline check (``cpu/stages.py``): the calibrated
    rule over every stage (:func:`numeric`); an ERROR at ``reference`` when the check's run did not finish
    (``failure``: its result and error) or could not run (``how``: ``skipped: <why>``), since nothing else
    vouches for a pipeline's numbers."""
    if failure is not None:
        return run_failed(failure[0], "reference", failure[1])
    if checked is None:
        return run_failed("ERROR", "reference", f"the pipeline check cannot run: {how.removeprefix('skipped: ')}")
    return numeric(checked, PIPELINE_BASIS, "teacher-forced pipeline check")


def component_placement(device_map: str, components: Mapping[str, Sequence[str]]) -> Decision | None:
    """A FAIL at ``load`` (basis placement) when a pipeline component's parameters or buffers are not all on
    the session's device: a component left on the host would be checked on the CPU's numbers. None when every
    component is on the device (or the run recorded no placement)."""
    want = device_type(device_map)
    off = {name: list(kinds) for name, kinds in components.items() if list(kinds) not in ([want], [])}
    if not off:
        return None
    where = "; ".join(f"{name} on {', '.join(kinds)}" for name, kinds in sorted(off.items()))
    return Decision("FAIL", "load", "placement", f"pipeline components not wholly on {want!r}: {where}")


def decoder_prompt(
    device: Sequence[int] | None,
    cpu: Sequence[int] | None,
    names: Mapping[int, str],
    then: Decision,
) -> Decision:
    """An encoder-decoder's decoder prompt (T5's or BART's decoder start token; Whisper's start of transcript,
    then the language, task and timestamp tokens generate() adds, a language it detected from the audio
    included) as the device's generate() built it, against the CPU reference's. Equal, or either unknown (a
    run that recorded none): the decision from the tokens after it, ``then``, stands. Different: a FAIL at
    ``prompt`` naming both prompts (with ``names``, the tokens' text, where known), whatever the tokens after
    it did: a transcript in another language or task answers another request, and its tokens cannot be
    compared. What ``then`` found wrong, if anything, is kept after it."""
    if device is None or cpu is None or list(device) == list(cpu):
        return then
    index = next((i for i, (a, b) in enumerate(zip(device, cpu, strict=False)) if a != b), min(len(device), len(cpu)))

    def shown(prompt: Sequence[int]) -> str:
        return "[" + ", ".join(f"{t} {names[t]}" if t in names else str(t) for t in prompt) + "]"

    def at(prompt: Sequence[int]) -> str:
        if index >= len(prompt):
            return "nothing"
        token = prompt[index]
        return f"{token} {names[token]}" if token in names else str(token)

    error = (
        f"the device's decoder prompt {shown(device)} differs from the CPU reference's {shown(cpu)} at position "
        f"{index} (device {at(device)}, CPU {at(cpu)}): generate() started the decoder with another prompt on the "
        "device (another start token; Whisper's: another language, task or timestamp)"
    )
    if then.error:
        error += f"; besides, {then.result} at {then.failure_stage}: {then.error}"
    return Decision("FAIL", "prompt", then.verdict_basis, error)
