"""Every key the session keeps in pytest's stashes, in one room below the modules that read them: the
config's (what the controller set up) and each catalog item's (what its collection gave it).

It imports only the types the keys hold, none of the modules that set or read them, so none of those
imports another to find a key.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run.settings import Resolved, Settings
from pytest_neuron_support.session.options import Options

# --- the config's: the session's setup -------------------------------------------------------------

#: The validated command-line options.
options_key = pytest.StashKey[Options]()
#: What the controller resolved (device, slice, pool, ...), handed to xdist workers.
resolved_key = pytest.StashKey[Resolved]()
#: The session's settings: a sweep's, made at configure time.
settings_key = pytest.StashKey[Settings]()
#: Settings resolved on first use in a session that runs no catalog (a user's own tests).
lazy_settings_key = pytest.StashKey[Settings]()
#: This session's id in the host-wide core ledger (the controller's, on every worker).
session_id_key = pytest.StashKey[str]()
#: The catalog's models (then the ``--model`` additions).
catalog_key = pytest.StashKey[tuple[ModelSpec, ...]]()
#: The session checks only ``--model`` entries, with no catalog file (it is collected all the same).
virtual_catalog_key = pytest.StashKey[bool]()
#: item name (``test_model[<id>]``) -> its plan, made once per session for the selected models (on the
#: xdist controller; without xdist once selection is done).
plans_key = pytest.StashKey[dict[str, Plan]]()
#: (model id, device, check) -> (result, settings hash) of rows already in the dataset (``--resume``).
recorded_key = pytest.StashKey[dict[tuple[str, str, str], tuple[str, str]]]()
#: model id -> seconds of its last run in the dataset.
history_key = pytest.StashKey[Mapping[str, float]]()

# --- each catalog item's -------------------------------------------------------------------------------

#: The catalog entry a catalog item checks (set at collection; absent on a user's own test).
model_key = pytest.StashKey[ModelSpec]()
#: The check kind it makes (``inference``: test_model, ``train``: test_training).
check_key = pytest.StashKey[str]()
#: Its plan: from the controller (xdist), or made once the session's selection is known.
plan_key = pytest.StashKey[Plan]()
#: cores x expected seconds: the item's place in the sweep and in the core ledger's queue.
cost_key = pytest.StashKey[float]()
