"""The results viewer: one self-contained static page, and how to rerun any row.

``neuron-support report`` writes a folder that opens from disk with no server and uploads as-is
as a static Hugging Face Space::

    <out>/index.html         the viewer: inline CSS and JS, the data embedded as JSON
    <out>/README.md          the Space's card (``sdk: static``)
    <out>/hub-rankings.json  the Hub rankings shown (reusable with ``--hub-snapshot``)

The data travels inside ``index.html`` in a ``<script type="application/json">`` tag because
Chromium refuses ``fetch()`` of ``file://`` URLs; a Content-Security-Policy that allows no
connection at all makes "no network" a property the browser enforces, not a promise. Every
value reaches the page through ``textContent`` (never ``innerHTML``), and the embedded JSON has
``<``, ``>`` and ``&`` escaped, so a model id, an error or a run.py can never become markup.

Columns and their tooltips come from :mod:`.records` (``COLUMN_DOCS``, ``RESULTS``, ``STAGES``):
the page shows a curated choice of columns in the table (:data:`TABLE_COLUMNS`) and every column
in a model's detail, so a column added to :class:`~.records.Row` appears without touching this
module.

How to rerun a row (the packages to install on top of the stack, the NEFF cache to sync, the
command) is computed here once, by :func:`reproduction`, for both the page and
``neuron-support runscript``. This module imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import __version__, neffcache
from .catalog import TASKS as CATALOG_TASKS
from .catalog import Catalog
from .dataset import read_dataset, stack_stem
from .devices import DEVICES
from .hub import TASKS as HUB_TASKS
from .hub import HubError, HubRanking, fetch_all, load_snapshot, save_snapshot
from .records import COLUMN_DOCS, COLUMN_TYPES, RESULTS, STAGES, VERDICT_BASES, Row

#: AWS's pip index for neuronx-cc and torch-neuronx (the PyPI names are placeholders).
NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
#: The public bucket of compiled graphs, one folder per compiler version.
NEFF_CACHE_BUCKET = neffcache.DEFAULT_BUCKET
#: Where the sync command puts the cache, and where the run command points run.py at it.
NEFF_CACHE_DIR = "/tmp/neff_cache"

#: Columns of the viewer's table, in display order (every model's detail shows all columns).
TABLE_COLUMNS: tuple[str, ...] = (
    "model_id",
    "task",
    "result",
    "failure_stage",
    "verdict_basis",
    "error",
    "device",
    "neuron_cores",
    "tp_size",
    "ep_size",
    "parameters",
    "run_s",
    "compile_s",
    "peak_device_memory_bytes",
)
#: Columns the detail panel lists first, in this order; the rest follow in schema order.
DETAIL_COLUMNS: tuple[str, ...] = (
    "result",
    "failure_stage",
    "error",
    "verdict_basis",
    "cpu_check",
    "positions_checked",
    "positions_disagreeing",
    "first_disagreement",
    "disagreement_deficit",
    "max_logprob_deficit",
    "reference_match",
    "judge_verdict",
    "judge_score",
    "repeat_identical",
    "fallback_ops",
    "graphs_compiled",
    "graph_breaks",
    "excess_graphs",
    "exclude_reason",
    "exclude_note",
    "device",
    "neuron_cores",
    "tp_size",
    "ep_size",
    "plan_reason",
    "distributed_config",
    "parameters",
    "weight_bytes",
    "run_s",
    "load_s",
    "compile_s",
    "first_generate_s",
    "generate_s",
    "reference_s",
    "peak_device_memory_bytes",
    "peak_host_rss_bytes",
    "neuronx_cc",
    "torch_neuronx",
    "torch",
    "library",
    "library_version",
    "python",
    "timestamp",
)
#: The run time's parts shown as a split bar (the rest of run_s is start-up and reading back).
SPLIT_COLUMNS: tuple[str, ...] = ("load_s", "compile_s", "generate_s")

SPACE_TITLE = "Model support on AWS Trainium"


# --- how to rerun a row (shared with `neuron-support runscript`) -------------------------------


def neff_sync_command(neuronx_cc: str) -> str | None:
    """The command that fetches the public NEFF cache for compiler ``neuronx_cc``; None off Trainium."""
    try:
        return shlex.join(neffcache.pull_command(neuronx_cc, NEFF_CACHE_DIR))
    except neffcache.NeffCacheError:
        return None  # no compiler ("none"), or a recorded version no bucket folder can be named by


def _public_version(version: str) -> str:
    # A local label ("2.13.0+cpu") names a build from PyTorch's own index; the version itself is
    # what pip resolves against the index the user installs from.
    return version.split("+", 1)[0]


def install_commands(row: Row, extra_packages: Sequence[str] = ()) -> tuple[str, ...]:
    """pip commands that put ``row``'s stack in place: the Neuron packages from AWS's index (when
    the row ran with neuronx-cc), then torch, the model library and the catalog's extra packages."""
    commands: list[str] = []
    if row.neuronx_cc and row.neuronx_cc != "none":
        pins = [f"neuronx-cc=={row.neuronx_cc}"]
        if row.torch_neuronx and row.torch_neuronx != "none":
            pins.append(f"torch-neuronx=={row.torch_neuronx}")
        commands.append(f"pip install --extra-index-url {NEURON_PIP_INDEX} {' '.join(pins)}")
    packages: list[str] = []
    if row.torch:
        packages.append(f"torch=={_public_version(row.torch)}")
    if row.library and row.library_version:
        packages.append(f"{row.library}=={row.library_version}")
    packages.extend(extra_packages)
    if packages:
        commands.append("pip install " + " ".join(shlex.quote(p) for p in packages))
    return tuple(commands)


def run_command(row: Row) -> str:
    """The command that reruns ``row``'s run.py as the harness did: pinned to as many cores as the
    row used (from core 0), and on Trainium reading the NEFF cache :func:`neff_sync_command` fills."""
    env: dict[str, str] = {}
    device = DEVICES.get(row.device)
    if device is not None:
        env.update(device.pin_cores(0, row.neuron_cores or 1))
        if neff_sync_command(row.neuronx_cc) is not None:
            env[device.compile_cache_env] = NEFF_CACHE_DIR
    prefix = "".join(f"{key}={shlex.quote(value)} " for key, value in env.items())
    return f"{prefix}python3 run.py --out result.json"


@dataclass(frozen=True)
class Reproduction:
    """Everything needed to rerun one row on a fresh machine.

    Attributes:
        model_id: the model.
        stack: the row's stack file stem (``neuronxcc-<v>__transformers-<v>``).
        device: the device kind the row ran on.
        result: the row's result.
        python: the interpreter version the row ran with.
        runscript: the exact run.py that ran; None when nothing ran (skipped, excluded).
        install: pip commands to run on top of the base image, in order.
        sync: the NEFF-cache sync command for the row's compiler; None off Trainium.
        run: the command that runs run.py.
    """

    model_id: str
    stack: str
    device: str
    result: str
    python: str
    runscript: str | None
    install: tuple[str, ...]
    sync: str | None
    run: str

    def instructions(self) -> str:
        """The shell lines to paste (comments say what each part is), without run.py itself."""
        lines = [f"# {self.model_id} on {self.stack} ({self.device}): {self.result}"]
        lines.append(f"# packages to install on top of the stack (Python {self.python or 'any'}):")
        lines += list(self.install) or ["# (none recorded)"]
        if self.sync is not None:
            lines += ["# the compiled graphs (NEFF cache) for this compiler:", self.sync]
        else:
            lines.append("# no NEFF cache: this row did not run with neuronx-cc")
        lines += ["# save the run.py below as run.py, then:", self.run]
        return "\n".join(lines) + "\n"


def reproduction(row: Row, extra_packages: Sequence[str] = ()) -> Reproduction:
    """How to rerun ``row``; ``extra_packages`` are the catalog entry's ``extra_packages``."""
    return Reproduction(
        model_id=row.model_id,
        stack=stack_stem(row),
        device=row.device,
        result=row.result,
        python=row.python,
        runscript=row.runscript,
        install=install_commands(row, extra_packages),
        sync=neff_sync_command(row.neuronx_cc),
        run=run_command(row),
    )


# --- the Hub rankings a report shows -----------------------------------------------------------


@dataclass(frozen=True)
class HubView:
    """The Hub rankings a report shows, or why it shows none.

    Attributes:
        rankings: the rankings (each may carry its own ``error``).
        source: where they came from: ``live``, ``snapshot`` or ``none``.
        unavailable: why no ranking can be shown at all (``--no-hub``, every fetch failed, an
            unreadable snapshot); None when at least one ranking has models.
    """

    rankings: tuple[HubRanking, ...]
    source: str
    unavailable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "unavailable": self.unavailable,
            "rankings": [ranking.to_dict() for ranking in self.rankings],
        }


def _view_of(rankings: Sequence[HubRanking], source: str) -> HubView:
    if rankings and all(ranking.error is not None for ranking in rankings):
        reasons = list(dict.fromkeys(str(ranking.error) for ranking in rankings))
        return HubView(tuple(rankings), source, "; ".join(reasons))
    if not rankings:
        return HubView((), source, "the snapshot holds no rankings")
    return HubView(tuple(rankings), source)


def live_hub_view(limit: int, timeout_s: float) -> HubView:
    """Fetch every ranking now (``HF_ENDPOINT`` honoured); never raises for Hub trouble."""
    return _view_of(fetch_all(limit=limit, timeout_s=timeout_s), "live")


def snapshot_hub_view(path: Path) -> HubView:
    """Rankings saved earlier (``hub-rankings.json``); an unreadable file is reported, not raised."""
    try:
        return _view_of(load_snapshot(path), "snapshot")
    except (OSError, HubError) as exc:
        return HubView((), "snapshot", f"cannot read the Hub snapshot {path}: {exc}")


def no_hub_view(why: str = "not fetched (--no-hub)") -> HubView:
    return HubView((), "none", why)


# --- the report --------------------------------------------------------------------------------


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing measurement is null everywhere else too
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


def _newest(rows: Iterable[Row]) -> str:
    return max((row.timestamp for row in rows), default="")


def report_data(rows: Sequence[Row], catalog: Catalog | None, hub_view: HubView) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (embedded verbatim in ``index.html``)."""
    extra = {spec.id: spec.extra_packages for spec in (catalog.models if catalog else ())}
    by_stack: dict[str, list[Row]] = {}
    for row in rows:
        by_stack.setdefault(stack_stem(row), []).append(row)
    stacks = []
    for stem, stack_rows in sorted(by_stack.items()):
        first = max(stack_rows, key=lambda r: r.timestamp)
        stacks.append(
            {
                "stem": stem,
                "neuronx_cc": first.neuronx_cc,
                "torch_neuronx": first.torch_neuronx,
                "torch": first.torch,
                "library": first.library,
                "library_version": first.library_version,
                "python": first.python,
                "rows": len(stack_rows),
                "newest": _newest(stack_rows),
                "sync": neff_sync_command(first.neuronx_cc),
            }
        )
    default_stack = max(stacks, key=lambda s: (s["newest"], s["stem"]))["stem"] if stacks else None
    row_dicts = []
    for row in sorted(rows, key=lambda r: (stack_stem(r), r.model_id, r.device)):
        again = reproduction(row, extra.get(row.model_id, ()))
        record = {name: _json_value(value) for name, value in dataclasses.asdict(row).items()}
        record.update(
            stack=again.stack,
            install=list(again.install),
            sync=again.sync,
            run=again.run,
            instructions=again.instructions(),
        )
        row_dicts.append(record)
    catalog_models = [
        {
            "id": spec.id,
            "task": spec.task,
            "tags": list(spec.tags),
            "exclude_reason": spec.exclude.reason if spec.exclude else None,
            "exclude_note": spec.exclude.note if spec.exclude else None,
        }
        for spec in (catalog.models if catalog else ())
    ]
    tasks = list(
        dict.fromkeys(
            [
                *CATALOG_TASKS,
                *HUB_TASKS,
                *(r.task for r in rows),
                *(spec.task for spec in (catalog.models if catalog else ())),
            ]
        )
    )
    return {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "plugin_version": __version__,
        "columns": [{"name": name, "type": COLUMN_TYPES[name], "doc": COLUMN_DOCS[name]} for name in COLUMN_DOCS],
        "verdict_bases": dict(VERDICT_BASES),
        "table_columns": list(TABLE_COLUMNS),
        "detail_columns": list(DETAIL_COLUMNS),
        "split_columns": list(SPLIT_COLUMNS),
        "results": dict(RESULTS),
        "stages": dict(STAGES),
        "tasks": tasks,
        "stacks": stacks,
        "default_stack": default_stack,
        "rows": row_dicts,
        "catalog": {"path": catalog.path.name if catalog else None, "models": catalog_models},
        "hub": hub_view.to_dict(),
    }


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside a ``<script>`` element: no ``</script>``, no ``<!--``, no entity."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for raw, escaped in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def render_html(data: Mapping[str, Any]) -> str:
    """The whole page: :data:`_PAGE` with the data embedded."""
    return _PAGE.replace("@@DATA@@", embed_json(data))


def render_space_card() -> str:
    """README.md of the static Space: its front matter tells the Hub to serve index.html as is."""
    return (
        "---\n"
        f"title: {SPACE_TITLE}\n"
        "emoji: 🧪\n"
        "colorFrom: blue\n"
        "colorTo: green\n"
        "sdk: static\n"
        "app_file: index.html\n"
        "pinned: false\n"
        "---\n\n"
        f"# {SPACE_TITLE}\n\n"
        "Which Hugging Face Hub models run unmodified on AWS Trainium through TorchNeuron, with the\n"
        "evidence: the run.py that ran, the stack, timings and errors. Generated by\n"
        f"`neuron-support report` (pytest-neuron-support {__version__}); `index.html` is self-contained.\n"
    )


@dataclass(frozen=True)
class Report:
    """What :func:`write_report` wrote.

    Attributes:
        index: the page.
        rows: rows shown (every stack).
        stacks: stack stems present.
        hub_unavailable: why no Hub ranking is shown, or None.
    """

    index: Path
    rows: int
    stacks: tuple[str, ...]
    hub_unavailable: str | None


def write_report(results_dir: Path, catalog: Catalog | None, hub_view: HubView, out_dir: Path) -> Report:
    """Write the viewer folder for the dataset under ``results_dir``."""
    rows = read_dataset(results_dir)
    data = report_data(rows, catalog, hub_view)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = out_dir / "index.html"
    index.write_text(render_html(data), encoding="utf-8")
    (out_dir / "README.md").write_text(render_space_card(), encoding="utf-8")
    if hub_view.rankings:
        save_snapshot(out_dir / "hub-rankings.json", hub_view.rankings)
    return Report(index, len(rows), tuple(s["stem"] for s in data["stacks"]), hub_view.unavailable)


# The page. Plain DOM code, no framework: it must run from disk, offline, for years. Its lines are
# HTML/CSS/JS, which ruff's line length does not fit (hence the noqa on the closing quotes).
_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Model support on AWS Trainium</title>
<style>
:root { --pass:#1a7f37; --fail:#d4700b; --error:#cf222e; --timeout:#8250df; --skipped:#6e7781; --excluded:#afb8c1; --untested:#ffffff; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
header { background: #232f3e; color: #fff; padding: 12px 20px; }
header h1 { margin: 0; font-size: 20px; }
header p { margin: 4px 0 0; color: #d0d7de; font-size: 12px; }
main { padding: 12px 20px; }
nav { display: flex; gap: 4px; margin-bottom: 10px; }
nav button { border: 1px solid #d0d7de; background: #fff; padding: 6px 14px; border-radius: 6px; cursor: pointer; font-size: 14px; }
nav button[aria-selected="true"] { background: #0969da; color: #fff; border-color: #0969da; }
.controls { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; margin-bottom: 8px; }
.controls label { font-size: 12px; color: #57606a; display: flex; flex-direction: column; }
.controls input, .controls select { font-size: 14px; padding: 4px 6px; min-width: 160px; }
.notice { background: #fff8c5; border: 1px solid #d4a72c; padding: 6px 10px; border-radius: 6px; margin: 6px 0; }
.info { background: #ddf4ff; border: 1px solid #54aeff; padding: 6px 10px; border-radius: 6px; margin: 6px 0; font-size: 12px; }
.summary { display: flex; gap: 6px; flex-wrap: wrap; margin: 6px 0; }
.chip { padding: 2px 8px; border-radius: 10px; font-size: 12px; border: 1px solid #d0d7de; background: #fff; cursor: help; }
table { border-collapse: collapse; width: 100%; background: #fff; font-size: 13px; }
th, td { border-bottom: 1px solid #eaeef2; padding: 4px 6px; text-align: left; vertical-align: top; white-space: nowrap; }
th { background: #f6f8fa; position: sticky; top: 0; cursor: help; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.error { max-width: 380px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; color: #57606a; }
.badge { white-space: nowrap; display: inline-block; padding: 0 6px; border-radius: 4px; font-weight: 600; font-size: 12px; color: #fff; cursor: help; }
.r-PASS { background: var(--pass); } .r-FAIL { background: var(--fail); } .r-ERROR { background: var(--error); }
.r-TIMEOUT { background: var(--timeout); } .r-SKIPPED { background: var(--skipped); } .r-EXCLUDED { background: var(--excluded); color: #1f2328; }
.flag { font-size: 11px; color: #9a6700; font-weight: 600; margin-left: 4px; cursor: help; }
.r-not-tested { background: #fff; color: #57606a; border: 1px dashed #8c959f; }
button.model { background: none; border: none; color: #0969da; cursor: pointer; padding: 0; font: inherit; text-align: left; }
button.model:hover { text-decoration: underline; }
.table-box { overflow-x: auto; max-width: 100%; }
#plot { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; margin: 8px 0; padding: 6px; }
#plot svg { display: block; }
#detail { position: fixed; top: 0; right: 0; bottom: 0; width: min(760px, 100%); background: #fff; border-left: 1px solid #d0d7de; box-shadow: -4px 0 16px rgba(0,0,0,.15); overflow-y: auto; padding: 12px 18px; }
#detail[hidden] { display: none; }
#detail h2 { margin: 0 0 6px; font-size: 18px; word-break: break-all; }
#detail h3 { margin: 14px 0 4px; font-size: 14px; }
#detail dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; font-size: 13px; }
#detail dt { color: #57606a; cursor: help; }
#detail dd { margin: 0; word-break: break-word; white-space: pre-wrap; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: 8px; overflow: auto; font-size: 12px; white-space: pre; }
#runscript { max-height: 60vh; }
.split { display: flex; height: 14px; border-radius: 3px; overflow: hidden; border: 1px solid #d0d7de; margin: 4px 0; }
.split span { display: block; height: 100%; }
.legend { font-size: 12px; color: #57606a; }
.close { float: right; font-size: 14px; }
</style>
</head>
<body>
<header>
  <h1>Model support on AWS Trainium (TorchNeuron)</h1>
  <p id="generated"></p>
</header>
<main>
  <nav role="tablist">
    <button id="view-selected" data-view="selected" role="tab" title="The curated catalog, including excluded models and why">Selected</button>
    <button id="view-trending" data-view="trending" role="tab" title="The Hub's trending models per task, tested or not">Trending</button>
    <button id="view-downloads" data-view="downloads" role="tab" title="The Hub's most downloaded models per task, tested or not">Downloads</button>
  </nav>
  <div class="controls">
    <label>Task <select id="task"></select></label>
    <label>Search by name <input id="search" type="search" placeholder="e.g. qwen" autocomplete="off"></label>
    <label>neuronx-cc <select id="compiler"></select></label>
    <label>Library <select id="library"></select></label>
  </div>
  <div id="stack-info" class="info"></div>
  <div id="hub-info"></div>
  <div id="summary" class="summary"></div>
  <div class="table-box"><table id="models"><thead></thead><tbody></tbody></table></div>
  <p id="empty" hidden>No model matches.</p>
  <div id="plot"></div>
</main>
<aside id="detail" hidden aria-live="polite"></aside>
<script type="application/json" id="report-data">@@DATA@@</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const DOCS = Object.fromEntries(DATA.columns.map(c => [c.name, c.doc]));
const TYPES = Object.fromEntries(DATA.columns.map(c => [c.name, c.type]));
const COLORS = { PASS: "#1a7f37", FAIL: "#d4700b", ERROR: "#cf222e", TIMEOUT: "#8250df", SKIPPED: "#6e7781", EXCLUDED: "#afb8c1" };
const HUB_DOCS = {
  rank: "position in the Hub's ranking for this task",
  downloads: "downloads over the last 30 days, as the Hub reports them",
  likes: "total likes on the Hub",
  trending_score: "the Hub's trending score (recent likes, decayed)",
};
const state = { view: "selected", task: "", search: "", compiler: "", library: "" };
const catalogById = new Map(DATA.catalog.models.map(m => [m.id, m]));

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmtCount(n) {
  if (n === null || n === undefined) return "";
  const units = [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "k"]];
  for (const [size, unit] of units) if (Math.abs(n) >= size) return (n / size).toFixed(n / size >= 100 ? 0 : 1) + unit;
  return String(n);
}
function fmtBytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
function fmtSeconds(s) {
  if (s === null || s === undefined) return "";
  return s >= 100 ? s.toFixed(0) + " s" : s.toFixed(1) + " s";
}
function fmtValue(name, value) {
  if (value === null || value === undefined) return "";
  if (name.endsWith("_bytes")) return fmtBytes(value);
  if (name.endsWith("_s")) return fmtSeconds(value);
  if (name === "parameters") return fmtCount(value);
  if (Array.isArray(value)) return value.join(", ");
  return String(value);
}
function isNumeric(name) {
  const t = TYPES[name] || "";
  return t === "int64" || t === "double";
}

function currentStack() {
  return DATA.stacks.find(s => s.neuronx_cc === state.compiler && (s.library + " " + s.library_version) === state.library) || null;
}
function stackRows(stack) {
  return stack ? DATA.rows.filter(r => r.stack === stack.stem) : [];
}

// One table entry: a model, the row for it on the chosen stack (or none), and its Hub ranking data.
function entriesFor(view, stack) {
  const rows = stackRows(stack);
  const rowsByModel = new Map();
  for (const row of rows) {
    if (!rowsByModel.has(row.model_id)) rowsByModel.set(row.model_id, []);
    rowsByModel.get(row.model_id).push(row);
  }
  const entries = [];
  const add = (id, task, hubModel, rank) => {
    const found = rowsByModel.get(id);
    if (found) for (const row of found) entries.push({ id, task: row.task || task, row, hub: hubModel, rank });
    else entries.push({ id, task, row: null, hub: hubModel, rank, catalog: catalogById.get(id) || null });
  };
  if (view === "selected") {
    for (const model of DATA.catalog.models) add(model.id, model.task, null, null);
    // Models checked with --model (not in the catalog) still deserve to be seen.
    const extra = [...new Set(DATA.rows.map(r => r.model_id))].filter(id => !catalogById.has(id)).sort();
    for (const id of extra) {
      const any = DATA.rows.find(r => r.model_id === id);
      add(id, any.task, null, null);
    }
  } else {
    for (const ranking of DATA.hub.rankings) {
      if (ranking.sort !== view) continue;
      ranking.models.forEach((model, i) => add(model.id, ranking.task, model, i + 1));
    }
  }
  const needle = state.search.trim().toLowerCase();
  return entries.filter(e => (!state.task || e.task === state.task) && (!needle || e.id.toLowerCase().includes(needle)));
}

function resultOf(entry) {
  if (entry.row) return entry.row.result;
  if (entry.catalog && entry.catalog.exclude_reason) return "EXCLUDED";
  return "not tested";
}
function badge(entry) {
  const result = resultOf(entry);
  const cls = "badge r-" + result.replace(" ", "-");
  let title = DATA.results[result] || "No row for this model on the selected stack.";
  if (!entry.row && result === "EXCLUDED") title = "Excluded in the catalog: " + entry.catalog.exclude_reason + (entry.catalog.exclude_note ? " (" + entry.catalog.exclude_note + ")" : "");
  return el("span", { class: cls, title, text: result });
}
function hostOpsFlag(entry) {
  // A PASS that ran operations on the host did not run wholly on the device: say so where it is read.
  const ops = entry.row ? entry.row.fallback_ops : null;
  if (!ops || !ops.length) return "";
  return el("span", { class: "flag host-ops", title: "ran on the host, not the device: " + ops.join(", ") + " (fallback_ops)", text: " " + ops.length + " op(s) on host" });
}
function graphsFlag(entry) {
  // On neuron every graph is a neuronx-cc compile: more than static shapes need is worth a look.
  const extra = entry.row ? entry.row.excess_graphs : null;
  if (!extra) return "";
  const breaks = entry.row.graph_breaks ? ", " + entry.row.graph_breaks + " graph break(s)" : "";
  return el("span", { class: "flag graphs", title: entry.row.graphs_compiled + " graphs compiled where static shapes need 1" + breaks + " (excess_graphs)", text: " +" + extra + " graphs" });
}
function stageCell(entry) {
  const stage = entry.row && entry.row.failure_stage;
  if (!stage) return el("td");
  return el("td", { title: DATA.stages[stage] || "", text: stage });
}
function errorText(entry) {
  if (entry.row) {
    const r = entry.row;
    if (r.error) return r.error.split("\n")[0];
    if (r.exclude_reason) return r.exclude_reason + (r.exclude_note ? ": " + r.exclude_note : "");
    return "";
  }
  if (entry.catalog && entry.catalog.exclude_reason) return entry.catalog.exclude_reason + (entry.catalog.exclude_note ? ": " + entry.catalog.exclude_note : "");
  return "";
}

function headerCells(view) {
  const cells = [];
  if (view !== "selected") {
    cells.push(["rank", HUB_DOCS.rank, true]);
  }
  for (const name of DATA.table_columns) {
    cells.push([name, DOCS[name], isNumeric(name)]);
    if (name === "model_id" && view !== "selected") {
      cells.push([view === "trending" ? "trending_score" : "downloads", HUB_DOCS[view === "trending" ? "trending_score" : "downloads"], true]);
      cells.push(["likes", HUB_DOCS.likes, true]);
    }
  }
  return cells;
}

function cellFor(name, entry) {
  if (name === "rank") return el("td", { class: "num", text: entry.rank });
  if (name === "downloads" || name === "likes") return el("td", { class: "num", text: entry.hub ? fmtCount(entry.hub[name]) : "" });
  if (name === "trending_score") return el("td", { class: "num", text: entry.hub && entry.hub.trending_score !== null ? entry.hub.trending_score.toFixed(1) : "" });
  if (name === "model_id") {
    return el("td", {}, el("button", { class: "model", "data-model": entry.id, title: "details, run.py and how to rerun", onclick: () => openDetail(entry) , text: entry.id }));
  }
  if (name === "task") return el("td", { text: entry.task });
  if (name === "result") return el("td", {}, badge(entry), hostOpsFlag(entry), graphsFlag(entry));
  if (name === "verdict_basis") { const b = entry.row ? entry.row.verdict_basis : null; return el("td", { title: (b && DATA.verdict_bases[b]) || "", text: b || "" }); }
  if (name === "failure_stage") return stageCell(entry);
  if (name === "error") { const text = errorText(entry); return el("td", { class: "error", title: text, text }); }
  const value = entry.row ? entry.row[name] : null;
  return el("td", { class: isNumeric(name) ? "num" : "", text: fmtValue(name, value) });
}

function renderTable(entries) {
  const thead = document.querySelector("#models thead");
  const tbody = document.querySelector("#models tbody");
  const cells = headerCells(state.view);
  thead.replaceChildren(el("tr", {}, ...cells.map(([name, doc]) => el("th", { title: doc || "", text: name }))));
  tbody.replaceChildren(...entries.map(entry => el("tr", { "data-model": entry.id, "data-result": resultOf(entry), "data-device": entry.row ? entry.row.device : "" }, ...cells.map(([name]) => cellFor(name, entry)))));
  document.getElementById("empty").hidden = entries.length > 0;
}

function renderSummary(entries) {
  const counts = new Map();
  for (const e of entries) counts.set(resultOf(e), (counts.get(resultOf(e)) || 0) + 1);
  const order = [...Object.keys(DATA.results), "not tested"];
  document.getElementById("summary").replaceChildren(...order.filter(r => counts.has(r)).map(r =>
    el("span", { class: "chip", title: DATA.results[r] || "no row on the selected stack", "data-result": r }, el("span", { class: "badge r-" + r.replace(" ", "-"), text: r }), " " + counts.get(r))));
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
// Run time vs parameters, log-log, one dot per row, coloured by result.
function renderPlot(entries) {
  const box = document.getElementById("plot");
  const points = entries.filter(e => e.row && e.row.parameters > 0 && e.row.run_s > 0);
  if (!points.length) { box.replaceChildren(el("span", { class: "legend", text: "Run time vs parameters: no row here has both." })); return; }
  const W = 640, H = 260, L = 60, R = 130, T = 14, B = 36;
  const xs = points.map(p => Math.log10(p.row.parameters)), ys = points.map(p => Math.log10(p.row.run_s));
  // Whole decades, with a margin so no dot sits on an axis.
  const [x0, x1] = [Math.floor(Math.min(...xs) - 0.1), Math.ceil(Math.max(...xs) + 0.1)];
  const [y0, y1] = [Math.floor(Math.min(...ys) - 0.1), Math.ceil(Math.max(...ys) + 0.1)];
  const sx = v => L + (v - x0) / (x1 - x0) * (W - L - R), sy = v => H - B - (v - y0) / (y1 - y0) * (H - T - B);
  const root = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "run time vs parameters" });
  root.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#8c959f" }), svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#8c959f" }));
  for (let e = x0; e <= x1; e++) root.append(svg("text", { x: sx(e), y: H - B + 14, "text-anchor": "middle", "font-size": 11, fill: "#57606a" }, fmtCount(10 ** e)));
  for (let e = y0; e <= y1; e++) root.append(svg("text", { x: L - 6, y: sy(e) + 4, "text-anchor": "end", "font-size": 11, fill: "#57606a" }, fmtSeconds(10 ** e)));
  root.append(svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", "font-size": 12 }, "parameters"));
  root.append(svg("text", { x: 12, y: (T + H - B) / 2, "font-size": 12, transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle" }, "run time (compile included)"));
  points.forEach((p, i) => {
    const dot = svg("circle", { cx: sx(xs[i]), cy: sy(ys[i]), r: 5, fill: COLORS[p.row.result] || "#000", "fill-opacity": 0.8, stroke: "#fff", "data-model": p.id });
    dot.append(svg("title", {}, `${p.id}: ${p.row.result}, ${fmtCount(p.row.parameters)} parameters, ${fmtSeconds(p.row.run_s)}`));
    dot.style.cursor = "pointer";
    dot.addEventListener("click", () => openDetail(p));
    root.append(dot);
  });
  Object.keys(COLORS).forEach((r, i) => {
    root.append(svg("circle", { cx: W - R + 16, cy: T + 8 + i * 18, r: 5, fill: COLORS[r] }));
    root.append(svg("text", { x: W - R + 26, y: T + 12 + i * 18, "font-size": 12 }, r));
  });
  box.replaceChildren(root);
}

function renderStackInfo() {
  const stack = currentStack();
  const box = document.getElementById("stack-info");
  if (!DATA.stacks.length) { box.textContent = "The dataset holds no rows yet: every model shows as not tested."; return; }
  if (!stack) { box.textContent = `No rows for neuronx-cc ${state.compiler} with ${state.library}: pick another combination.`; return; }
  box.replaceChildren(
    `Stack ${stack.stem}: neuronx-cc ${stack.neuronx_cc}, torch-neuronx ${stack.torch_neuronx}, torch ${stack.torch}, ${stack.library} ${stack.library_version}, Python ${stack.python}; ${stack.rows} rows, newest ${stack.newest}.`,
    stack.sync ? el("div", {}, "NEFF cache for this compiler: ", el("code", { text: stack.sync })) : el("div", { text: "No NEFF cache: this stack did not run with neuronx-cc." }));
}

function renderHubInfo() {
  const box = document.getElementById("hub-info");
  if (state.view === "selected") { box.replaceChildren(); return; }
  const parts = [];
  if (DATA.hub.unavailable) parts.push(el("div", { class: "notice", id: "hub-unavailable", text: "Hub rankings unavailable: " + DATA.hub.unavailable }));
  for (const ranking of DATA.hub.rankings) {
    if (ranking.sort !== state.view || (state.task && ranking.task !== state.task)) continue;
    if (ranking.error && !DATA.hub.unavailable) parts.push(el("div", { class: "notice", text: `${ranking.task}: rankings unavailable: ${ranking.error}` }));
    else if (!ranking.error) parts.push(el("div", { class: "info hub-snapshot", text: `${ranking.task}: Hub snapshot taken ${ranking.fetched_at} from ${ranking.endpoint} in ${ranking.elapsed_s.toFixed(2)} s (${ranking.models.length} models, ${DATA.hub.source}).` }));
  }
  box.replaceChildren(...parts);
}

function splitBar(row) {
  const parts = DATA.split_columns.map(name => [name, row[name]]).filter(([, v]) => v !== null && v !== undefined && v > 0);
  if (!row.run_s || !parts.length) return null;
  const colors = { load_s: "#54aeff", compile_s: "#d4a72c", generate_s: "#1a7f37" };
  const used = parts.reduce((a, [, v]) => a + v, 0);
  const other = Math.max(0, row.run_s - used);
  const bar = el("div", { class: "split", title: "share of run_s" });
  for (const [name, v] of [...parts, ["other", other]]) {
    const span = el("span", { title: `${name}: ${fmtSeconds(v)}${DOCS[name] ? " — " + DOCS[name] : " (start-up, reading back)"}` });
    span.style.width = (100 * v / Math.max(row.run_s, used)) + "%";
    span.style.background = colors[name] || "#d0d7de";
    bar.append(span);
  }
  const legend = el("div", { class: "legend", text: [...parts, ["other", other]].map(([n, v]) => `${n} ${fmtSeconds(v)}`).join(" · ") + ` of run_s ${fmtSeconds(row.run_s)}` });
  return el("div", {}, bar, legend);
}

function pre(id, text) { return el("pre", { id, text }); }

function openDetail(entry) {
  const panel = document.getElementById("detail");
  const row = entry.row;
  const kids = [el("button", { class: "close", id: "detail-close", onclick: closeDetail, text: "close ✕" }), el("h2", { text: entry.id }), badge(entry)];
  const stack = currentStack();
  if (!row) {
    const why = entry.catalog && entry.catalog.exclude_reason ? `Excluded in the catalog (${entry.catalog.exclude_reason}${entry.catalog.exclude_note ? ": " + entry.catalog.exclude_note : ""}).` : "Not tested on this stack.";
    kids.push(el("p", { text: why }));
    const elsewhere = DATA.rows.filter(r => r.model_id === entry.id).map(r => r.stack + " (" + r.result + ")");
    if (elsewhere.length) kids.push(el("p", { text: "Rows on other stacks: " + elsewhere.join(", ") }));
  } else {
    const split = splitBar(row);
    if (split) kids.push(el("h3", { text: "Run time and its split" }), split);
    const dl = el("dl");
    const shown = new Set();
    const addField = name => {
      shown.add(name);
      const value = row[name];
      if (value === null || value === undefined || value === "" || (Array.isArray(value) && !value.length)) return;
      let text = fmtValue(name, value);
      if (name === "run_s" || name.endsWith("_bytes") || name === "parameters") text += ` (${value})`;
      let doc = DOCS[name] || "";
      if (name === "result") doc = DATA.results[value] || doc;
      if (name === "failure_stage") doc = DATA.stages[value] || doc;
      dl.append(el("dt", { title: doc, text: name }), el("dd", { "data-column": name, text }));
    };
    DATA.detail_columns.forEach(addField);
    kids.push(el("h3", { text: "Result" }), dl);
    kids.push(el("h3", { text: "Packages to install on top of the stack" }), pre("install", row.install.join("\n") || "(none recorded)"));
    kids.push(el("h3", { text: "NEFF cache for this compiler" }), pre("sync", row.sync || "none: this row did not run with neuronx-cc"));
    kids.push(el("h3", { text: "Run it" }), pre("run", row.run));
    kids.push(el("h3", { text: "run.py (exactly what ran)" }), pre("runscript", row.runscript || "no run.py was recorded: nothing ran for this row"));
    const all = el("dl");
    for (const c of DATA.columns) {
      if (shown.has(c.name) || c.name === "runscript") continue;
      const value = row[c.name];
      all.append(el("dt", { title: c.doc, text: c.name }), el("dd", { "data-column": c.name, text: value === null || value === undefined ? "null" : Array.isArray(value) ? "[" + value.join(", ") + "]" : String(value) }));
    }
    kids.push(el("details", {}, el("summary", { text: "Every column" }), all));
  }
  if (stack === null && row) kids.push(el("p", { text: "stack " + row.stack }));
  panel.replaceChildren(...kids);
  panel.hidden = false;
}
function closeDetail() { document.getElementById("detail").hidden = true; }

function render() {
  for (const button of document.querySelectorAll("nav button")) button.setAttribute("aria-selected", String(button.dataset.view === state.view));
  const entries = entriesFor(state.view, currentStack());
  renderStackInfo();
  renderHubInfo();
  renderSummary(entries);
  renderPlot(entries);
  renderTable(entries);
}

function options(select, values, labels) {
  select.replaceChildren(...values.map((v, i) => el("option", { value: v, text: labels ? labels[i] : v })));
}

function init() {
  const fetched = DATA.hub.rankings.map(r => r.fetched_at).sort()[0];
  document.getElementById("generated").textContent =
    `Generated ${DATA.generated_at} by pytest-neuron-support ${DATA.plugin_version} · ${DATA.rows.length} rows on ${DATA.stacks.length} stacks · ` +
    (DATA.hub.unavailable ? "Hub rankings unavailable" : `Hub snapshot ${fetched}`);
  options(document.getElementById("task"), ["", ...DATA.tasks], ["all tasks", ...DATA.tasks]);
  const compilers = [...new Set(DATA.stacks.map(s => s.neuronx_cc))].sort();
  const libraries = [...new Set(DATA.stacks.map(s => s.library + " " + s.library_version))].sort();
  options(document.getElementById("compiler"), compilers);
  options(document.getElementById("library"), libraries);
  const first = DATA.stacks.find(s => s.stem === DATA.default_stack);
  if (first) {
    state.compiler = first.neuronx_cc;
    state.library = first.library + " " + first.library_version;
    document.getElementById("compiler").value = state.compiler;
    document.getElementById("library").value = state.library;
  }
  for (const button of document.querySelectorAll("nav button")) button.addEventListener("click", () => { state.view = button.dataset.view; closeDetail(); render(); });
  document.getElementById("task").addEventListener("change", e => { state.task = e.target.value; render(); });
  document.getElementById("search").addEventListener("input", e => { state.search = e.target.value; render(); });
  document.getElementById("compiler").addEventListener("change", e => { state.compiler = e.target.value; closeDetail(); render(); });
  document.getElementById("library").addEventListener("change", e => { state.library = e.target.value; closeDetail(); render(); });
  document.addEventListener("keydown", e => { if (e.key === "Escape") closeDetail(); });
  render();
  document.body.dataset.ready = "true";
}
init();
</script>
</body>
</html>
"""  # noqa: E501
