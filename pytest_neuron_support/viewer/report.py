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
``<``, ``>`` and ``&`` escaped, so a model id, an error or a run.py can never become markup. Each
view and each row's page has an address, kept in the URL's fragment by the page itself
(``#view=downloads``, ``#row=<model>/<check>&stack=<stem>``; docs/viewer.md, *Links*).

Columns and their tooltips come from :mod:`.records` (``COLUMN_DOCS``, ``RESULTS``, ``STAGES``):
the page shows a curated choice of columns in the table (:data:`TABLE_COLUMNS`) and every column
in a model's detail, so a column added to :class:`~.records.Row` appears without touching this
module.

How to rerun a row (the packages to install on top of the stack, the NEFF cache to sync, the
command) is computed here once, by :func:`reproduction`, for both the page and
``neuron-support runscript``. This module imports neither torch nor transformers.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_neuron_support import __version__
from pytest_neuron_support.catalog.load import TASKS as CATALOG_TASKS
from pytest_neuron_support.catalog.load import Catalog
from pytest_neuron_support.checks.registry import CHECKS
from pytest_neuron_support.data.dataset import near_tie_pass, read_dataset, stack_stem
from pytest_neuron_support.data.records import (
    COLUMN_DOCS,
    COLUMN_LABELS,
    COLUMN_TYPES,
    RESULTS,
    STAGES,
    VERDICT_BASES,
    Row,
)
from pytest_neuron_support.data.signatures import blockers
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.hub import HubError, HubRanking, fetch_all, load_snapshot, save_snapshot
from pytest_neuron_support.run import neffcache
from pytest_neuron_support.run.runscript import template
from pytest_neuron_support.tasks.table import RANKED_TASKS, TASKS
from pytest_neuron_support.viewer.story import story

#: AWS's pip index for neuronx-cc and torch-neuronx (the PyPI names are placeholders).
NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"

#: Columns of the viewer's table, in display order (every model's detail shows all columns).
#: The Space's headline columns first (result, cores, run time including compile, peak device
#: memory), then what explains them; headed by their schema labels (records.COLUMN_LABELS).
TABLE_COLUMNS: tuple[str, ...] = (
    "model_id",
    "result",
    "neuron_cores",
    "run_s",
    "peak_device_memory_bytes",
    "task",
    "check",
    "failure_stage",
    "verdict_basis",
    "parity_mode",
    "noise_ratio",
    "error",
    "device",
    "tp_size",
    "ep_size",
    "parameters",
    "compile_s",
)
#: Columns the detail panel lists first, in this order; the rest follow in schema order.
DETAIL_COLUMNS: tuple[str, ...] = (
    "result",
    "failure_stage",
    "error",
    "signature",
    "verdict_basis",
    "parity_mode",
    "near_tie",
    "disagreements_near_tie",
    "check",
    "train_first_bad_step",
    "train_losses",
    "cpu_train_losses",
    "train_grad_norms",
    "cpu_train_grad_norms",
    "train_max_loss_delta",
    "train_first_step_s",
    "train_steps_per_s",
    "train_state_bytes",
    "recompiles",
    "cpu_check",
    "positions_checked",
    "positions_disagreeing",
    "first_disagreement",
    "disagreement_deficit",
    "max_logprob_deficit",
    "evidence_stage",
    "evidence_step",
    "evidence_distance",
    "noise_floor",
    "noise_ratio",
    "diverging_module",
    "diverging_ratio",
    "last_inside_module",
    "locate_note",
    "compiler_error_code",
    "reproducer",
    "numeric_stages",
    "numeric_ratios",
    "denoise_step_s",
    "image_psnr",
    "expectation",
    "expected_result",
    "expected_stage",
    "expected_signature",
    "expected_recompiles",
    "expected_reason",
    "pipeline_class",
    "pipeline_device",
    "model_devices",
    "pipeline_text",
    "reference_match",
    "judge_verdict",
    "judge_score",
    "repeat_identical",
    "fallback_ops",
    "fallback_ops_unknown",
    "fallback_calls",
    "fallback_reproducer",
    "graphs_compiled",
    "graph_breaks",
    "excess_graphs",
    "recompile_limit",
    "exclude_reason",
    "exclude_note",
    "device",
    "neuron_cores",
    "tp_size",
    "ep_size",
    "plan_reason",
    "distributed_config",
    "distributed_attempts",
    "train_global_batch",
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
    "libraries",
    "python",
    "timestamp",
)
#: The run time's parts shown as a split bar (the rest of run_s is start-up and reading back).
SPLIT_COLUMNS: tuple[str, ...] = ("load_s", "compile_s", "generate_s")

SPACE_TITLE = "Model support on AWS Trainium"


# --- how to rerun a row (shared with `neuron-support runscript`) -------------------------------


def _public_version(version: str) -> str:
    # A local label ("2.13.0+cpu") names a build from PyTorch's own index; the version itself is
    # what pip resolves against the index the user installs from.
    return version.split("+", 1)[0]


def install_commands(row: Row, extra_packages: Sequence[str] = ()) -> tuple[str, ...]:
    """pip commands that put ``row``'s stack in place: the Neuron packages from AWS's index (when
    the row ran with neuronx-cc), then torch, the model libraries run.py imports (``libraries``:
    diffusers beside transformers for text-to-image) and the catalog's extra packages. A row written
    before ``libraries`` existed names only its one ``library``."""
    commands: list[str] = []
    if row.neuronx_cc and row.neuronx_cc != "none":
        pins = [f"neuronx-cc=={row.neuronx_cc}"]
        if row.torch_neuronx and row.torch_neuronx != "none":
            pins.append(f"torch-neuronx=={row.torch_neuronx}")
        commands.append(f"pip install --extra-index-url {NEURON_PIP_INDEX} {' '.join(pins)}")
    packages: list[str] = []
    if row.torch:
        packages.append(f"torch=={_public_version(row.torch)}")
    # Falsy, not only empty: a Parquet file merged with an older one without the column reads null.
    if row.libraries:
        packages.extend(row.libraries)
    elif row.library and row.library_version:
        packages.append(f"{row.library}=={row.library_version}")
    packages.extend(extra_packages)
    if packages:
        commands.append("pip install " + " ".join(shlex.quote(p) for p in packages))
    return tuple(commands)


def run_command(row: Row) -> str:
    """The command that reruns ``row``'s run.py as the harness did: pinned to as many cores as the
    row used (from core 0), and on Trainium reading the NEFF cache :func:`.neffcache.sync_command` fills."""
    env: dict[str, str] = {}
    device = DEVICES.get(row.device)
    if device is not None:
        env.update(device.pin_cores(0, row.neuron_cores or 1))
        if neffcache.sync_command(row.neuronx_cc) is not None:
            env[device.compile_cache_env] = neffcache.sync_cache_dir(row.neuronx_cc)
    prefix = "".join(f"{key}={shlex.quote(value)} " for key, value in env.items())
    return f"{prefix}python3 {script_name(row)} --out result.json"


def script_name(row: Row) -> str:
    """The file the row's script is saved as: run.py, or train.py for the training check."""
    return "train.py" if row.check == "train" else "run.py"


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
        script: the script's file name: ``run.py``, or ``train.py`` for a training row.
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
    script: str = "run.py"

    def instructions(self) -> str:
        """The shell lines to paste (comments say what each part is), without run.py itself."""
        lines = [f"# {self.model_id} on {self.stack} ({self.device}): {self.result}"]
        lines.append(f"# packages to install on top of the stack (Python {self.python or 'any'}):")
        lines += list(self.install) or ["# (none recorded)"]
        if self.sync is not None:
            lines += ["# the compiled graphs (NEFF cache) for this compiler:", self.sync]
        else:
            lines.append("# no NEFF cache: this row did not run with neuronx-cc")
        lines += [f"# save the {self.script} below as {self.script}, then:", self.run]
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
        sync=neffcache.sync_command(row.neuronx_cc),
        run=run_command(row),
        script=script_name(row),
    )


# --- what a row's verdict rests on, said once for the table and the row's page -----------------


def near_tie_note(row: Row) -> str | None:
    """Why ``row`` is a near-tie PASS (:func:`~.dataset.near_tie_pass`: its tokens part from the CPU's,
    and the misses were near-ties that ``--parity=near-tie`` let through), or None for any other row.
    A reader must not take it for an exact match: the page marks it wherever the PASS is shown."""
    if not near_tie_pass(row):
        return None
    parts: list[str] = []
    if row.near_tie:
        gap = f", gap {row.logprob_gap:.4g} nats" if row.logprob_gap is not None else ""
        parts.append(f"free-running tokens part from the CPU's at index {row.first_divergence}{gap}, a near-tie")
    if row.disagreements_near_tie:
        deficit = f", max deficit {row.max_logprob_deficit:.4g} nats" if row.max_logprob_deficit is not None else ""
        parts.append(
            f"{row.positions_disagreeing} of {row.positions_checked} teacher-forced positions disagree, "
            f"all near-ties{deficit}"
        )
    return f"PASS with --parity={row.parity_mode or 'near-tie'}: " + "; ".join(parts)


def numeric_evidence(row: Row) -> str | None:
    """The numeric check's deciding comparison in one line: on a FAIL the first stage and step out of
    tolerance and by how much; on a PASS the comparison closest to its tolerance (how close it was);
    None for a row without a calibrated numeric check."""
    if row.evidence_stage is None or row.noise_ratio is None:
        return None
    where = row.evidence_stage if row.evidence_step is None else f"{row.evidence_stage}[{row.evidence_step}]"
    lead = "out of tolerance first at" if row.result == "FAIL" else "closest to its tolerance at"
    measured = f"{row.noise_ratio:.3g} x the noise floor"
    if row.evidence_distance is not None and row.noise_floor is not None:
        measured = f"distance {row.evidence_distance:.3g} = {measured} {row.noise_floor:.3g}"
    return f"{lead} {where}: {measured}"


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
    return _view_of(fetch_all(RANKED_TASKS, limit=limit, timeout_s=timeout_s), "live")


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


def report_data(
    rows: Sequence[Row],
    catalog: Catalog | None,
    hub_view: HubView,
    images: Mapping[int, dict[str, str]] | None = None,
    results_dir: Path | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (embedded verbatim in ``index.html``). ``images``: by
    a row's index in ``rows``, its images as the page shows them (:func:`embedded_images`); ``results_dir``: where
    the rows' run folders are (a compile ERROR's reproducer is read from there)."""
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
                "sync": neffcache.sync_command(first.neuronx_cc),
            }
        )
    default_stack = max(stacks, key=lambda s: (s["newest"], s["stem"]))["stem"] if stacks else None
    row_dicts = []
    shown = images or {}
    for index, row in sorted(
        enumerate(rows), key=lambda pair: (stack_stem(pair[1]), pair[1].model_id, pair[1].device, pair[1].check)
    ):
        again = reproduction(row, extra.get(row.model_id, ()))
        record = {name: _json_value(value) for name, value in dataclasses.asdict(row).items()}
        # The row's page tells the whole story, as `neuron-support explain` prints it, and carries a compile
        # ERROR's reproducer (the run folders it lives in are not published with the site).
        record["story"] = story(row, by_stack[stack_stem(row)], again.instructions())
        record["reproducer_script"] = script_text(row.reproducer, results_dir)
        record["fallback_script"] = script_text(row.fallback_reproducer, results_dir)
        record.update(shown.get(index, {}))
        record.update(
            stack=again.stack,
            near_tie_note=near_tie_note(row),
            evidence=numeric_evidence(row),
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
                *RANKED_TASKS,
                *(r.task for r in rows),
                *(spec.task for spec in (catalog.models if catalog else ())),
            ]
        )
    )
    # The Failures view: each stack's signatures by the models they block, made by the function
    # `neuron-support failures` prints, so the page and the terminal group alike.
    # Census rows (tiny random models, one per architecture) have the Architectures view, not this one.
    failures = {
        stem: [b.to_dict() for b in blockers([r for r in stack_rows if r.source != "census"])]
        for stem, stack_rows in sorted(by_stack.items())
    }
    return {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "plugin_version": __version__,
        "columns": [
            {"name": name, "type": COLUMN_TYPES[name], "doc": COLUMN_DOCS[name], "label": COLUMN_LABELS[name]}
            for name in COLUMN_DOCS
        ],
        "verdict_bases": dict(VERDICT_BASES),
        "table_columns": list(TABLE_COLUMNS),
        "detail_columns": list(DETAIL_COLUMNS),
        "split_columns": list(SPLIT_COLUMNS),
        "results": dict(RESULTS),
        "stages": dict(STAGES),
        "tasks": tasks,
        # The tasks whose rows generate tokens: the Architectures view shows their teacher-forced check (a forward
        # task's rows count decisions in the same columns, which are not a teacher-forced check).
        "generating_tasks": [task.name for task in TASKS.values() if task.generates],
        # The check filter: a model checked both ways has one row (and one table line) per check.
        "checks": list(CHECKS),
        "stacks": stacks,
        "default_stack": default_stack,
        "rows": row_dicts,
        "failures": failures,
        "catalog": {"path": catalog.path.name if catalog else None, "models": catalog_models},
        "hub": hub_view.to_dict(),
    }


#: The largest reproducer the page embeds (a graph of a large model's every layer is larger; its path is shown).
REPRODUCER_EMBED_BYTES = 256 << 10


def script_text(script: str | None, results_dir: Path | None) -> str | None:
    """A row's standalone script (``reproducer``, ``fallback_reproducer``: relative to the results folder) as the
    page shows it: its text, or where it is when it is too large to embed or gone from the results folder; None
    for a row without one."""
    if not script:
        return None
    path = None if results_dir is None else results_dir / script
    if path is None or not path.is_file():
        return f"# {script} is not beside this report: rerun the model to write it again"
    if path.stat().st_size > REPRODUCER_EMBED_BYTES:
        return f"# {path} is {path.stat().st_size:,} bytes, too large to embed: read it there"
    return path.read_text(encoding="utf-8")


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
    """The whole page: ``templates/viewer.html`` (HTML, CSS and the script that renders the views)
    with the data embedded."""
    return template("viewer.html").replace("@@DATA@@", embed_json(data))


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


def embedded_images(rows: Sequence[Row], results_dir: Path) -> dict[int, dict[str, str]]:
    """The text-to-image rows' images (``image``, ``reference_image``: PNG paths in the results folder) as
    ``data:`` URIs, so the page stays one self-contained file (its images inline like its data). A catalog
    pipeline makes its default resolution (1024² for SDXL), so an image larger than :data:`THUMBNAIL_PX`
    on a side is embedded as a thumbnail of that size (the full image stays in the run folder). Returns, by
    the row's index, the page's ``image_src`` / ``reference_image_src``; an image no longer there is left
    out (the page says none)."""
    found: dict[int, dict[str, str]] = {}
    for index, row in enumerate(rows):
        for column in ("image", "reference_image"):
            relative = getattr(row, column)
            source = results_dir / relative if relative else None
            if source is None or not source.is_file():
                continue
            encoded = base64.b64encode(_thumbnail(source)).decode("ascii")
            found.setdefault(index, {})[f"{column}_src"] = f"data:image/png;base64,{encoded}"
    return found


#: The longest side, in pixels, of an image the page embeds.
THUMBNAIL_PX = 256


def _thumbnail(path: Path) -> bytes:
    """The PNG's bytes, scaled down to :data:`THUMBNAIL_PX` on its longest side where it is larger."""
    data = path.read_bytes()
    from PIL import Image  # Pillow comes with diffusers, which made the image

    with Image.open(io.BytesIO(data)) as image:
        if max(image.size) <= THUMBNAIL_PX:
            return data
        image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()


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
    out_dir.mkdir(parents=True, exist_ok=True)
    data = report_data(rows, catalog, hub_view, embedded_images(rows, results_dir), results_dir)
    index = out_dir / "index.html"
    index.write_text(render_html(data), encoding="utf-8")
    (out_dir / "README.md").write_text(render_space_card(), encoding="utf-8")
    if hub_view.rankings:
        save_snapshot(out_dir / "hub-rankings.json", hub_view.rankings)
    return Report(index, len(rows), tuple(s["stem"] for s in data["stacks"]), hub_view.unavailable)
