"""Each selected model's plan, per check kind: the fewest cores whose memory holds it
(:func:`pytest_neuron_support.planning.planner.plan_cores`), from facts its task's reader finds without
downloading a weight, and a prior for how long it will take (which orders the sweep).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pytest_neuron_support import hub
from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.checks.registry import KINDS
from pytest_neuron_support.planning.planner import Plan, PlanningError, plan_cores
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.tasks.table import task_of


def plan_model(
    model: ModelSpec,
    settings: Settings,
    *,
    local_only: bool = False,
    check: str = "inference",
    hub_down: str | None = None,
) -> tuple[Plan, bool]:
    """The model's plan for ``check``, and whether the Hub proved unreachable while making it."""
    plans, unreachable = plan_checks(model, settings, (check,), local_only=local_only, hub_down=hub_down)
    return plans[check], unreachable


def plan_checks(
    model: ModelSpec,
    settings: Settings,
    checks: Sequence[str],
    *,
    local_only: bool = False,
    hub_down: str | None = None,
) -> tuple[dict[str, Plan], bool]:
    """The model's plan for each of ``checks`` from one inspection, and whether the Hub proved
    unreachable while making them (the train check plans by the training memory model: weights,
    gradients and optimizer state, :func:`.planning.planner.training_bytes`, for a kind that trains).

    A model that cannot be inspected runs on its catalog ``cores:`` when the entry sets them (the
    user decided); otherwise its plan carries the error (an ERROR row at stage plan saying what to
    pass), never a guessed core count. A Hub model that is not in the local cache while the Hub
    cannot be asked (``hub_down``: why the caller did not ask it) gets one short error saying so.
    """
    try:
        shape = task_of(model.task).read_shape(model, local_only=local_only)
    except PlanningError as exc:
        if model.cores is not None:
            plan = Plan(
                cores=model.cores,
                tp_size=model.cores,
                ep_size=1,
                weight_bytes=0,
                skip=None,
                reason=f"catalog override: {model.cores} core(s), not inspected ({exc})",
            )
            return dict.fromkeys(checks, plan), exc.unreachable
        where = f"its catalog entry (line {model.line})" if model.line else "a catalog entry for it (--models-file)"
        error = not_cached_offline(model, exc, hub_down) or (
            f"{exc}; to run it without inspecting it, set its core count: 'cores: N' in {where} "
            "(or check the id and the Hub's reachability)"
        )
        plan = Plan(cores=0, tp_size=1, ep_size=1, weight_bytes=0, skip=None, reason=error, error=error)
        return dict.fromkeys(checks, plan), exc.unreachable
    factor = task_of(model.task).prior_factor
    plans = {
        check: replace(
            plan_cores(
                shape,
                dtype=model.dtype,
                core_bytes=settings.core_bytes,
                headroom=settings.memory_headroom,
                max_cores=settings.max_cores,
                override=model.cores,
                training=KINDS[check].training,
            ),
            prior_factor=factor,
        )
        for check in checks
    }
    return plans, False


def not_cached_offline(model: ModelSpec, exc: PlanningError, hub_down: str | None) -> str | None:
    """The short, true error of a Hub model that is neither in the local cache nor reachable, or None
    when that is not why it could not be inspected (a local folder, a cached config, a Hub that answered).

    The inspection's own error says everything it tried and the client's offline help, and a core
    count would not help: the run would fail loading the same missing files."""
    if model.source == "local" or hub.cached_file(model.id, "config.json", revision=model.revision) is not None:
        return None
    # hub.unreachable() says at once when the client is offline, else tries one connection.
    why = hub_down or ("the Hub could not be reached" if exc.unreachable else hub.unreachable())
    if why is None:
        return None
    return (
        f"{model.id} (revision {model.revision}) is not in the local Hugging Face cache and the Hub cannot be "
        f"asked ({why}); check the id, or download it where the Hub is reachable (hf download {model.id}) and rerun"
    )


def prior_seconds(plan: Plan) -> float:
    """Expected seconds of a model never run before: compile dominates and grows with size.

    A rough prior (60 s plus 25 s per GiB of weights, times its task's ``prior_factor``), only used to
    order the sweep.
    """
    return (60.0 + 25.0 * plan.weight_bytes / (1 << 30)) * plan.prior_factor
