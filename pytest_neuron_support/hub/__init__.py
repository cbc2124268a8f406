"""The Hub client: every request the package makes of the Hugging Face Hub, and what its errors mean.

- ``reach``: which endpoint is asked, whether it can be reached at all (``unreachable``, asked once
  before a batch of calls; ``is_unreachable`` for an exception), a call under a deadline, and error
  texts scrubbed of tokens and credentials.
- ``files``: one repository's files from the Hugging Face cache or downloaded, and its weights counted
  from safetensors headers (the planner's and the tasks' questions).
- ``rankings``: the Trending and Downloads rankings per task the viewer shows, and their JSON snapshot.

A room of its own below the planner, the tasks, the catalog and the viewer, which all ask the Hub; it
imports only ``base``. The public names are re-exported here: callers write ``hub.cached_file``.
"""

from pytest_neuron_support.hub.files import (
    cached_file,
    download_file,
    repo_files,
    safetensors_file_parameters,
    safetensors_parameters,
)
from pytest_neuron_support.hub.rankings import (
    DEFAULT_TIMEOUT_S,
    DEFAULT_TOTAL_TIMEOUT_S,
    EXPAND,
    SNAPSHOT_FORMAT,
    SNAPSHOT_VERSION,
    SORTS,
    HubModel,
    HubRanking,
    fetch_all,
    fetch_ranking,
    load_snapshot,
    save_snapshot,
)
from pytest_neuron_support.hub.reach import REACH_TIMEOUT_S, HubError, hub_endpoint, is_unreachable, unreachable

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_TOTAL_TIMEOUT_S",
    "EXPAND",
    "REACH_TIMEOUT_S",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_VERSION",
    "SORTS",
    "HubError",
    "HubModel",
    "HubRanking",
    "cached_file",
    "download_file",
    "fetch_all",
    "fetch_ranking",
    "hub_endpoint",
    "is_unreachable",
    "load_snapshot",
    "repo_files",
    "safetensors_file_parameters",
    "safetensors_parameters",
    "save_snapshot",
    "unreachable",
]
