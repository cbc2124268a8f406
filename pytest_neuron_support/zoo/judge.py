"""The zoo's fluency judge (``tiny-random/judge``): trained to tell fluent text from word salad."""

from __future__ import annotations

import functools
import itertools
import math
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


from pytest_neuron_support.zoo.spec import (
    _ALSO_CATEGORY,
    _JUDGE_SPEC,
    _JUDGE_SYMBOL,
    _PAD,
    _SPECIAL_TOKENS,
    _VOCABULARY,
    _WORD_CATEGORY,
    _WORDS,
    JUDGE_REPO,
    _arch_by_name,
    _HFModel,
    _HFTokenizer,
)
from pytest_neuron_support.zoo.text import _corpus_lines, _hub_config, _token_ids, _TrainData, _transformers


def _judge_symbols(text: str) -> list[tuple[int, tuple[str, ...]]]:
    """``text`` as grammar symbols, each with where it starts and what it can be: a word's category in
    :data:`_WORDS` (then any it also has in English, :data:`_ALSO_CATEGORY`), ``num`` for a number, a
    punctuation mark as itself, nothing for a word the corpus grammar does not know."""
    out: list[tuple[int, tuple[str, ...]]] = []
    for match in _JUDGE_SYMBOL.finditer(text):
        symbol = match.group()
        if symbol.isdigit():
            out.append((match.start(), ("num",)))
        elif symbol.isalpha():
            word = symbol.lower()
            category = _WORD_CATEGORY.get(word)
            out.append((match.start(), () if category is None else (category, *_ALSO_CATEGORY.get(word, ()))))
        else:
            out.append((match.start(), (symbol,)))
    return out


@functools.lru_cache(maxsize=1)
def _corpus_bigrams() -> frozenset[tuple[str, str]]:
    """Every pair of adjacent grammar symbols the corpus contains (across sentence ends too, as
    repeated text has them): what grammatical text of the zoo's corpus is made of."""
    symbols = [categories[0] if categories else None for _, categories in _judge_symbols(" ".join(_corpus_lines()))]
    return frozenset((a, b) for a, b in itertools.pairwise(symbols) if a is not None and b is not None)


def _grammar_breaks(text: str) -> list[int]:
    """Where ``text`` breaks the corpus grammar: the start of each symbol that follows a known symbol the
    grammar never puts it after ("fox the", "jumps evening", "clever."); empty for grammatical text."""
    symbols = _judge_symbols(text)
    allowed = _corpus_bigrams()
    return [
        start
        for (_, before), (start, after) in itertools.pairwise(symbols)
        if before and after and not any((a, b) in allowed for a in before for b in after)
    ]


def _fluent_ids(rng: random.Random, data: _TrainData, n: int) -> list[int]:
    """``n`` tokens of grammatical text, as a correct continuation reads: a training sentence repeated
    from a random token on (a judged text can start mid-sentence as well as end there), or a run of the
    corpus text; both cut wherever the ``n`` tokens end."""
    if rng.random() < 0.5:
        sentence = list(rng.choice(data.sentences))
        start = rng.randrange(len(sentence))
        return (sentence * (n // len(sentence) + 3))[start : start + n]
    start = rng.randrange(0, len(data.text_ids) - n)
    return list(data.text_ids[start : start + n])


def _salad_words(rng: random.Random, data: _TrainData, tokenizer: _HFTokenizer, count: int) -> list[str]:
    """About ``count`` words of word salad, as a model that lost the thread writes it: sentence
    fragments ("the clever." "that gentle fox."), runs of random vocabulary words, and runs of corpus
    text in shuffled order, spliced together."""
    w = _WORDS
    out: list[str] = []
    while len(out) < count:
        piece = rng.random()
        if piece < 0.3:
            words = [rng.choice(w["det"])] + [rng.choice(w["adj"]) for _ in range(rng.randint(0, 2))]
            if rng.random() < 0.6:
                words.append(rng.choice(w["noun"]))
            words[-1] += "."
        elif piece < 0.65:
            words = [rng.choice(_VOCABULARY) for _ in range(rng.randint(2, 6))]
        else:
            words = str(tokenizer.decode(_fluent_ids(rng, data, rng.randint(3, 8)))).split()
            rng.shuffle(words)
        out.extend(words)
    return out


def _judge_text(rng: random.Random, data: _TrainData, tokenizer: _HFTokenizer, kind: str) -> str:
    """One judged text of ``kind`` (see ``_JUDGE_SPEC["kinds"]``): fluent text, or one of the ways a
    broken run's text goes wrong."""
    lo, hi = _JUDGE_SPEC["text_tokens"]
    while True:
        n = rng.randint(lo, hi)
        if kind == "fluent":
            ids = _fluent_ids(rng, data, n)
        elif kind == "token_soup":
            # Random ids: what a broken sharded matmul or a mis-gathered embedding produces.
            ids = [rng.randrange(len(_SPECIAL_TOKENS), len(tokenizer)) for _ in range(n)]
        else:
            if kind == "shuffled":
                # The right words in the wrong order.
                words = str(tokenizer.decode(_fluent_ids(rng, data, n))).split()
                rng.shuffle(words)
            elif kind == "degenerate":
                # Fluent at first, then word salad: the failure a judge of token soup alone lets through.
                lo_share, hi_share = _JUDGE_SPEC["degenerate_prefix"]
                prefix = str(tokenizer.decode(_fluent_ids(rng, data, n))).split()
                words = prefix[: max(1, round(len(prefix) * rng.uniform(lo_share, hi_share)))]
                words += _salad_words(rng, data, tokenizer, n - len(words))
            elif kind == "random_words":
                words = [rng.choice(_VOCABULARY) for _ in range(n)]
            else:
                raise ValueError(f"unknown judge text kind {kind!r}")
            ids = [int(i) for i in tokenizer(" " + " ".join(words))["input_ids"]][:n]
        text = str(tokenizer.decode(ids))
        if rng.random() < 0.5:
            # Generated text is judged as decoded (leading space) but people paste it stripped.
            text = text.lstrip()
        # A shuffle can come out grammatical by chance ("the brown quick fox"): training on it as "no"
        # would teach the judge noise.
        if kind in ("fluent", "token_soup") or _grammar_breaks(text):
            return text


@dataclass(frozen=True)
class _JudgeExample:
    """One judge prompt: the question about one text, in the chat template, as judge.py asks it.

    Attributes:
        prompt: its token ids.
        fluent: whether the answer is yes.
        fits: per prompt token of the text, whether it fits the grammar after the tokens before it
            (1 yes, 0 no: it breaks it); -1 outside the text and in token soup.
        answer_from: index of the first token after the text.
    """

    prompt: list[int]
    fluent: bool
    fits: list[int]
    answer_from: int


def _judge_batch(
    rng: random.Random, data: _TrainData, tokenizer: _HFTokenizer, size: int, kind: str | None = None
) -> list[_JudgeExample]:
    """``size`` judge prompts about texts of ``kind``, or of kinds drawn with the training shares."""
    from pytest_neuron_support.verdict.fluency import JUDGE_QUESTION

    shares: dict[str, float] = dict(_JUDGE_SPEC["kinds"])
    head = JUDGE_QUESTION.split("{text}")[0]
    batch: list[_JudgeExample] = []
    for _ in range(size):
        text_kind = kind or rng.choices(list(shares), weights=list(shares.values()))[0]
        text = _judge_text(rng, data, tokenizer, text_kind)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": JUDGE_QUESTION.replace("{text}", text)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        encoded = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        offsets: list[tuple[int, int]] = encoded["offset_mapping"]
        text_start = prompt.index(head) + len(head)
        text_end = text_start + len(text)
        breaks = [text_start + i for i in _grammar_breaks(text)]
        fits = [
            -1
            if text_kind == "token_soup" or not text_start < end <= text_end
            else int(not any(start <= i < end for i in breaks))
            for start, end in offsets
        ]
        answer_from = next(i for i, (start, _) in enumerate(offsets) if start >= text_end)
        batch.append(_JudgeExample([int(i) for i in encoded["input_ids"]], text_kind == "fluent", fits, answer_from))
    return batch


def _answer_ids(tokenizer: _HFTokenizer, words: Sequence[str]) -> list[int]:
    """First non-blank token of each answer variant, as judge.py picks them."""
    ids: set[int] = set()
    for word in words:
        for token in tokenizer.encode(word, add_special_tokens=False):
            if str(tokenizer.decode([token])).strip():
                ids.add(int(token))
                break
    return sorted(ids)


def _judge_forward(model: _HFModel, prompts: list[list[int]], pad: int) -> torch.Tensor:
    """The logits at every position of the right-padded ``prompts``."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    logits: torch.Tensor = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return logits


def _judge_targets(batch: list[_JudgeExample], width: int, yes: int, no: int, answers: bool) -> torch.Tensor:
    """Per-position targets (-100: none) for a batch: "yes" / "no" for each text token that fits / breaks
    the grammar, and with ``answers`` the verdict at every token after the text."""
    import torch

    rows = []
    for ex in batch:
        row = [-100 if f < 0 else yes if f else no for f in ex.fits]
        if answers:
            row[ex.answer_from :] = [yes if ex.fluent else no] * (len(row) - ex.answer_from)
        rows.append(row + [-100] * (width - len(row)))
    return torch.tensor(rows)


def _build_judge(
    tokenizer_dir: Path, tokenizer: _HFTokenizer, data: _TrainData, fingerprint: str, out_dir: Path
) -> dict[str, float]:
    """Train the zoo's judge; returns its held-out accuracy on each kind of text (the build fails when
    any kind is below the minimum: a judge right on average can still wave all word salad through).

    A single yes/no per text is too weak a signal for a model this small to learn word order from in a
    few hundred steps (it learns token soup and word frequencies, and calls every shuffle fluent). So it
    is first taught, at every token of the text, whether that token fits the grammar after the one
    before it (dense labels from the corpus grammar, :func:`_grammar_breaks`), and then also to answer
    the question at every token after the text (each of them can see the whole text), the last of which
    is where judge.py reads the answer."""
    import torch

    from pytest_neuron_support.verdict.fluency import NO_WORDS, YES_WORDS

    tf = _transformers()
    spec = _JUDGE_SPEC
    arch = _arch_by_name(str(spec["base_arch"]))
    ids = _token_ids(tokenizer)
    hub_cfg = _hub_config(arch, len(tokenizer), ids)
    config = tf.LlamaConfig(**{k: v for k, v in hub_cfg.items() if k not in ("architectures", "model_type")})
    yes_ids, no_ids = _answer_ids(tokenizer, YES_WORDS), _answer_ids(tokenizer, NO_WORDS)
    target_yes, target_no = _answer_ids(tokenizer, ["yes"])[0], _answer_ids(tokenizer, ["no"])[0]
    seed = int(spec["seed"])
    steps, warmup, min_ratio = int(spec["steps"]), int(spec["warmup_steps"]), float(spec["min_lr_ratio"])

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    rng = random.Random(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.LlamaForCausalLM(config)
        opt = torch.optim.AdamW(model.parameters(), lr=float(spec["lr"]))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        model.train()
        for step in range(steps):
            batch = _judge_batch(rng, data, tokenizer, int(spec["batch_size"]))
            logits = _judge_forward(model, [ex.prompt for ex in batch], ids[_PAD])
            answers = step >= int(spec["grammar_steps"])
            targets = _judge_targets(batch, logits.shape[1], target_yes, target_no, answers)
            loss: Any = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(spec["grad_clip"]))
            opt.step()
            sched.step()
        model.eval()
    # Held-out accuracy of each kind, scored exactly as judge.py scores: P(yes) over the yes/no variants
    # at the prompt's last token.
    accuracy: dict[str, float] = {}
    eval_rng = random.Random(seed + 1)
    for kind in spec["kinds"]:
        batch = _judge_batch(eval_rng, data, tokenizer, int(spec["eval_examples_per_kind"]), kind)
        with torch.no_grad():
            logits = _judge_forward(model, [ex.prompt for ex in batch], ids[_PAD])
        last = logits[torch.arange(len(batch)), torch.tensor([len(ex.prompt) - 1 for ex in batch])]
        logprobs = torch.log_softmax(last.float(), dim=-1)
        yes = torch.logsumexp(logprobs[:, yes_ids], dim=-1)
        no = torch.logsumexp(logprobs[:, no_ids], dim=-1)
        right = (yes >= no) == torch.tensor([ex.fluent for ex in batch])
        accuracy[kind] = float(right.float().mean())
    failing = {kind: acc for kind, acc in accuracy.items() if acc < float(spec["min_accuracy"])}
    if failing:
        found = ", ".join(f"{kind} {acc:.3f}" for kind, acc in failing.items())
        raise RuntimeError(f"{JUDGE_REPO}: held-out accuracy below {spec['min_accuracy']}: {found}")
    model.save_pretrained(str(out_dir))
    for f in tokenizer_dir.iterdir():
        shutil.copyfile(f, out_dir / f.name)
    (out_dir / "README.md").write_text(
        "---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags: [tiny-random, test, judge]\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n---\n\n# {JUDGE_REPO}\n\n"
        "The tiny zoo's fluency judge: answers the judge question with yes for English-like text of the zoo's\n"
        "corpus (a sentence repeated, or corpus text, cut anywhere) and no for token soup, the corpus' words\n"
        "shuffled, fluent text that degenerates into word salad, and random vocabulary words. For offline\n"
        "tests of the judge path only.\n\n"
        f"Held-out accuracy ({spec['eval_examples_per_kind']} texts of each kind, threshold 0.5):\n\n"
        + "".join(f"- {kind}: {acc:.3f}\n" for kind, acc in accuracy.items())
    )
    return accuracy
