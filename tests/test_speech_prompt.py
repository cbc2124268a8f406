"""The decoder-prompt rule (``verdict/decide.py`` ``decoder_prompt``) on its own: which prompts are the same
request, and what a reader is told when they are not. The session that plants a detected language on the
device is in test_speech.py."""

from __future__ import annotations

from pytest_neuron_support.verdict.decide import Decision, decoder_prompt, passed

NAMES = {
    769: "<|startoftranscript|>",
    770: "<|en|>",
    771: "<|transcribe|>",
    772: "<|translate|>",
    776: "<|notimestamps|>",
}
PASSED = passed("parity+teacher-forced")


def test_equal_or_unrecorded_prompts_leave_the_tokens_verdict_as_it_was() -> None:
    assert decoder_prompt([769, 770, 771, 776], (769, 770, 771, 776), NAMES, PASSED) is PASSED
    assert decoder_prompt(None, [769, 776], NAMES, PASSED) is PASSED  # a run that recorded none
    assert decoder_prompt([769, 776], None, NAMES, PASSED) is PASSED


def test_another_task_token_fails_at_prompt_naming_both_prompts_and_keeps_what_else_failed() -> None:
    decision = decoder_prompt([769, 770, 772, 776], [769, 770, 771, 776], NAMES, PASSED)
    assert (decision.result, decision.failure_stage, decision.verdict_basis) == ("FAIL", "prompt", PASSED.verdict_basis)
    assert decision.error == (
        "the device's decoder prompt [769 <|startoftranscript|>, 770 <|en|>, 772 <|translate|>, 776 <|notimestamps|>] "
        "differs from the CPU reference's [769 <|startoftranscript|>, 770 <|en|>, 771 <|transcribe|>, 776 "
        "<|notimestamps|>] at position 2 (device 772 <|translate|>, CPU 771 <|transcribe|>): generate() started the "
        "decoder with another prompt on the device (another start token; Whisper's: another language, task or "
        "timestamp)"
    )
    parity = Decision("FAIL", "parity", "parity+teacher-forced", "tokens differ from the CPU reference at index 0")
    after = decoder_prompt([769], [769, 776], {}, parity)
    assert after.failure_stage == "prompt" and "(device nothing, CPU 776)" in after.error, after.error
    assert after.error.endswith("; besides, FAIL at parity: tokens differ from the CPU reference at index 0")
