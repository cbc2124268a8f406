"""The tasks the suite runs, in one table: what loads a model of each, what feeds it, what decides it.

The catalog validates ``task:`` against it, run.py is rendered with its task's row (run.py is a
standalone script and imports nothing from this package, so the row travels in its ``SPEC``), the
verdict follows the row's ``verdict``, and the viewer's Hub views list the tasks marked ``ranked``.
docs/tasks.md describes each task's path and verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal


@dataclass(frozen=True)
class Task:
    """One task the suite runs.

    Attributes:
        name: the catalog's ``task:`` value, the Hub's pipeline tag.
        auto_class: the transformers Auto class run.py loads the model with.
        inputs: how run.py feeds it: ``text`` (the prompt), ``vision`` (the prompt and run.py's own
            test card image, through the processor) or ``embedding`` (a fixed list of sentences,
            pooled as the checkpoint's sentence-transformers modules say).
        verdict: ``tokens`` (32 greedy tokens: parity with CPU and the teacher-forced CPU check) or
            ``cosine`` (each sentence's embedding against the CPU's, ``min_cosine``).
        ranked: whether the viewer's Trending and Downloads views list the Hub's models of this task.
    """

    name: str
    auto_class: str
    inputs: Literal["text", "vision", "embedding"]
    verdict: Literal["tokens", "cosine"]
    ranked: bool


TASKS: Mapping[str, Task] = MappingProxyType(
    {
        task.name: task
        for task in (
            Task("text-generation", "AutoModelForCausalLM", "text", "tokens", ranked=True),
            Task("image-text-to-text", "AutoModelForImageTextToText", "vision", "tokens", ranked=True),
            Task("feature-extraction", "AutoModel", "embedding", "cosine", ranked=False),
            Task("sentence-similarity", "AutoModel", "embedding", "cosine", ranked=False),
        )
    }
)

#: Tasks that generate greedy tokens and are judged token by token.
GENERATION_TASKS: tuple[str, ...] = tuple(name for name, task in TASKS.items() if task.verdict == "tokens")
#: Tasks that embed a fixed set of sentences and are judged by cosine similarity.
EMBEDDING_TASKS: tuple[str, ...] = tuple(name for name, task in TASKS.items() if task.verdict == "cosine")
#: Tasks whose Hub rankings the viewer shows.
RANKED_TASKS: tuple[str, ...] = tuple(name for name, task in TASKS.items() if task.ranked)
