"""Splitting a sweep across runners: ``--shard i/N``, SLURM arrays, Kubernetes indexed Jobs.

Every shard computes the same split from the same inputs (the catalog, the plans and the
earlier dataset's timings), so N independent sessions cover every item exactly once. The
split is balanced by expected cost with the longest-processing-time rule: items in
decreasing cost, each to the shard with the least work so far.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_SHARD = re.compile(r"^(\d+)/(\d+)$")


class ShardError(ValueError):
    """A shard specification that cannot be used; the message says the fix."""


@dataclass(frozen=True)
class Shard:
    """This session's part of the sweep: shard ``index`` (0-based) of ``count``.

    Attributes:
        index: 0 .. count-1.
        count: number of shards.
        source: where it came from (``--shard``, ``SLURM_ARRAY_TASK_ID``, ``JOB_COMPLETION_INDEX``).
    """

    index: int
    count: int
    source: str


def parse_shard(text: str, source: str = "--shard") -> Shard:
    match = _SHARD.match(text.strip())
    if not match:
        raise ShardError(f"{source}={text!r} is not 'i/N'; pass e.g. --shard=0/4 (shards are numbered from 0)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or index >= count:
        raise ShardError(f"{source}={text!r} is out of range; the index must be 0 .. N-1 and N at least 1")
    return Shard(index, count, source)


def shard_from_env(env: Mapping[str, str]) -> Shard | None:
    """The shard a batch scheduler assigned, if any.

    SLURM array jobs set ``SLURM_ARRAY_TASK_ID`` / ``SLURM_ARRAY_TASK_COUNT`` (ids may start
    at ``SLURM_ARRAY_TASK_MIN``). Kubernetes indexed Jobs set ``JOB_COMPLETION_INDEX`` only;
    the Job's ``completions`` must be passed as ``NEURON_SUPPORT_SHARDS`` (set it from the
    same value in the Job spec).
    """
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        try:
            index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
            count = int(env["SLURM_ARRAY_TASK_COUNT"])
        except ValueError:
            raise ShardError("SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT are not integers") from None
        return parse_shard(f"{index}/{count}", "SLURM_ARRAY_TASK_ID")
    if "JOB_COMPLETION_INDEX" in env:
        if "NEURON_SUPPORT_SHARDS" not in env:
            raise ShardError(
                "JOB_COMPLETION_INDEX is set but NEURON_SUPPORT_SHARDS is not; set it to the Job's completions"
            )
        return parse_shard(f"{env['JOB_COMPLETION_INDEX']}/{env['NEURON_SUPPORT_SHARDS']}", "JOB_COMPLETION_INDEX")
    return None


def assign(costs: Sequence[tuple[str, float]], count: int) -> dict[str, int]:
    """Map each item id to a shard, balancing total cost (longest processing time first).

    Deterministic: ties in cost break by id, ties in load by shard index.
    """
    loads = [0.0] * count
    assignment: dict[str, int] = {}
    for item, cost in sorted(costs, key=lambda pair: (-pair[1], pair[0])):
        shard = min(range(count), key=lambda i: (loads[i], i))
        assignment[item] = shard
        loads[shard] += cost
    return assignment
