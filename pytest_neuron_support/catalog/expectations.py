"""``neuron-support expect update RESULTS``: a sweep's outcomes written back into the catalog as each
entry's ``expect:``, as PyTorch's ``update_expected.py`` regenerates its expected-status files, without
letting a regression through as a known failure.

For each entry, its newest row of the check its expectation is about (``inference`` unless it says
otherwise). What is written:

- a row that meets its expectation: the expectation, refined by the row (its stage and signature), its
  reason kept;
- a row that improves on it: a clean PASS drops it; a PASS that still hits Dynamo's recompile limit
  becomes ``expect: {result: PASS, recompiles: true, reason}``;
- a new failure (an entry without an expectation, whose earlier rows never passed): ``expect: {result,
  stage, signature, reason}``, the reason saying which sweep found it and asking for the upstream issue.

What is refused, the catalog's expectation left as it was and the reason printed: a row that fails
otherwise than its expectation says (a changed failure), and a failure of an entry whose previous row
passed (PASS -> FAIL, in RESULTS or ``--baseline``). Either is written only when the command line
accepts it for that model with a reason (``--accept MODEL --reason URL``). SKIPPED and EXCLUDED rows, and
entries without a row, are left as they are.

The file is edited line by line, in place: only the ``expect:`` lines of the entries that change are
written (one flow mapping per entry), so comments, order and formatting stay.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from pytest_neuron_support.base.model import Expectation, ModelSpec
from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.catalog.load import load_catalog, parse_catalog
from pytest_neuron_support.data.dataset import latest_rows
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.verdict.expected import DIFFERS, compare, describe

#: Rows that ran nothing: they say nothing about an expectation.
_RAN_NOTHING: tuple[str, ...] = ("SKIPPED", "EXCLUDED")


@dataclass(frozen=True)
class Change:
    """One entry's expectation, before and after (None: none); ``accepted``: the command line accepted it."""

    model_id: str
    before: Expectation | None
    after: Expectation | None
    accepted: bool = False

    def __str__(self) -> str:
        if self.after is None:
            was = "" if self.before is None else f" (was {describe(self.before)})"
            return f"{self.model_id}: expectation dropped{was}: it passed"
        if self.accepted:
            return f"{self.model_id}: expect {describe(self.after)} (accepted on the command line: {self.after.reason})"
        kept = " (reason kept)" if self.before is not None and self.before.reason == self.after.reason else ""
        return f"{self.model_id}: expect {describe(self.after)}{kept}"


@dataclass(frozen=True)
class Refusal:
    """An entry whose row is not written: why, and what the catalog keeps."""

    model_id: str
    before: Expectation | None
    why: str

    def __str__(self) -> str:
        keeps = f"expect {describe(self.before)}" if self.before is not None else "no expectation (it passes)"
        return (
            f"{self.model_id}: not written: {self.why}; the catalog keeps {keeps}. If this is the new known state, "
            f"accept it with its reason: --accept {self.model_id} --reason URL"
        )


@dataclass(frozen=True)
class Update:
    """What ``expect update`` does to a catalog: the changes it writes, the rows it refuses, the accepted
    models that had nothing to accept, and the catalog's text after (None when nothing changes)."""

    changes: tuple[Change, ...]
    refused: tuple[Refusal, ...]
    unused: tuple[str, ...]
    before: str
    after: str | None

    def diff(self, path: Path) -> str:
        """The edit as a unified diff of the catalog (what ``--dry-run`` prints)."""
        if self.after is None:
            return ""
        lines = difflib.unified_diff(
            self.before.splitlines(keepends=True), self.after.splitlines(keepends=True), str(path), str(path)
        )
        return "".join(lines)


def _outcome(row: Row) -> str:
    """A row's outcome in words: ``FAIL at parity (parity: …)``."""
    stage = f" at {row.failure_stage}" if row.failure_stage else ""
    return row.result + stage + (f" ({row.signature})" if row.signature else "")


def expectation_from(row: Row, before: Expectation | None, reason: str | None = None) -> Expectation | None:
    """What ``row`` says the entry should expect, with ``reason``, else ``before``'s reason, else one saying
    which sweep found it; ``before`` itself where the row ran nothing (SKIPPED, EXCLUDED)."""
    if row.result in _RAN_NOTHING:
        return before
    recompiled = row.recompile_limit is not None
    if row.result == "PASS" and not recompiled:
        return None
    if reason is None:
        reason = (
            before.reason
            if before is not None
            else (
                f"found by the sweep of {row.timestamp[:10]} ({row.library} {row.library_version}, neuronx-cc "
                f"{row.neuronx_cc}, {row.device}): say why, with the upstream issue's URL"
            )
        )
    if row.result == "PASS":
        return Expectation(result="PASS", reason=reason, check=row.check, recompiles=True)
    return Expectation(
        result=row.result, reason=reason, check=row.check, stage=row.failure_stage, signature=row.signature
    )


def newest_rows(rows: Iterable[Row]) -> dict[tuple[str, str], Row]:
    """Each (model, check)'s newest catalog row (by timestamp) over every stack and device in ``rows``."""
    return latest_rows((r for r in rows if r.source == "catalog"), key=lambda r: (r.model_id, r.check))


def previous_rows(current: Mapping[tuple[str, str], Row], rows: Iterable[Row]) -> dict[tuple[str, str], Row]:
    """Each (model, check)'s newest catalog row in ``rows`` (a sweep's and its baseline's) that ran and is
    older than its ``current`` row (its newest in the sweep): what it did before."""
    earlier: dict[tuple[str, str], Row] = {}
    for row in sorted(rows, key=lambda r: r.timestamp):
        key = (row.model_id, row.check)
        now = current.get(key)
        if now is None or row is now or row.source != "catalog" or row.result in _RAN_NOTHING:
            continue
        if row.timestamp <= now.timestamp:
            earlier[key] = row
    return earlier


def _failing(expect: Expectation | None) -> bool:
    return expect is not None and expect.result != "PASS"


def planned_changes(
    models: Iterable[ModelSpec],
    rows: Mapping[tuple[str, str], Row],
    earlier: Mapping[tuple[str, str], Row] | None = None,
    accepted: Mapping[str, str] | None = None,
) -> tuple[list[Change], list[Refusal]]:
    """The entries whose expectation the rows change, and those whose row is refused (a changed failure, a
    PASS -> FAIL against ``earlier``) unless ``accepted`` (model id -> reason) names them."""
    earlier, accepted = earlier or {}, accepted or {}
    changes: list[Change] = []
    refused: list[Refusal] = []
    for model in models:
        key = (model.id, model.expect.check if model.expect else "inference")
        row = rows.get(key)
        if row is None or row.result in _RAN_NOTHING:
            continue
        reason = accepted.get(model.id)
        after = expectation_from(row, model.expect, reason)
        why = None
        if model.expect is not None:
            recompiled = row.recompile_limit is not None
            if compare(model.expect, row.result, row.failure_stage, row.signature, recompiled) == DIFFERS:
                why = f"a changed failure: expected {describe(model.expect)}, got {_outcome(row)}"
        elif _failing(after) and key in earlier and earlier[key].result == "PASS":
            was = earlier[key]
            why = (
                f"PASS -> {_outcome(row)}: its row of {was.timestamp[:10]} ({was.library} {was.library_version}, "
                f"neuronx-cc {was.neuronx_cc}, {was.device}) passed; a regression is not a known failure"
            )
        if why is not None and reason is None:
            refused.append(Refusal(model.id, model.expect, why))
            continue
        if _failing(after) and after is not None and after.stage is None and after.signature is None:
            # The catalog refuses such an expectation (any failure would meet it): say so here.
            refused.append(
                Refusal(model.id, model.expect, f"its row ({row.result}) names no failure stage or signature to expect")
            )
            continue
        if after != model.expect:
            changes.append(Change(model.id, model.expect, after, accepted=reason is not None and after is not None))
    return changes, refused


def flow_line(indent: int, expect: Expectation) -> str:
    """The entry's ``expect:`` line: a flow mapping whose strings are JSON-quoted (valid YAML)."""
    fields: dict[str, object] = {"result": expect.result}
    if expect.check != "inference":
        fields["check"] = expect.check
    if expect.stage is not None:
        fields["stage"] = expect.stage
    if expect.signature is not None:
        fields["signature"] = expect.signature
    if expect.recompiles:
        fields["recompiles"] = True
    fields["reason"] = expect.reason
    body = ", ".join(f"{key}: {json.dumps(value)}" for key, value in fields.items())
    return f"{' ' * indent}expect: {{{body}}}\n"


def _last_line(node: yaml.Node) -> int:
    """The 0-based last line a node's text is on. A block collection's end mark sits wherever the next
    token starts (the next entry's ``- id:``, indented), so it is found from its last child; a scalar's or
    flow collection's end mark follows its text, or starts the next line after a block scalar."""
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and not node.flow_style and node.value:
        last = node.value[-1]
        return _last_line(last[1] if isinstance(last, tuple) else last)
    mark = node.end_mark
    return mark.line - 1 if mark.column == 0 else mark.line


def apply_changes(text: str, changes: Iterable[Change]) -> str:
    """``text`` (a catalog) with each change's ``expect:`` lines replaced, added or removed."""
    wanted = {change.model_id: change.after for change in changes}
    root = yaml.compose(text)
    assert isinstance(root, yaml.MappingNode)
    entries = next(value for key, value in root.value if key.value == "models")
    assert isinstance(entries, yaml.SequenceNode)
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line + 1, the lines in their place)
    for entry in entries.value:
        assert isinstance(entry, yaml.MappingNode)
        fields = {key.value: (key, value) for key, value in entry.value}
        model_id = fields["id"][1].value
        if model_id not in wanted:
            continue
        after = wanted[model_id]
        indent = entry.value[0][0].start_mark.column
        new = [] if after is None else [flow_line(indent, after)]
        if "expect" in fields:
            key, value = fields["expect"]
            edits.append((key.start_mark.line, _last_line(value) + 1, new))
        elif new:
            end = max(_last_line(value) for _, value in entry.value) + 1
            edits.append((end, end, new))
    for first, end, new in sorted(edits, reverse=True):
        lines[first:end] = new
    return "".join(lines)


def plan_update(
    path: Path,
    rows: Iterable[Row],
    *,
    baseline: Iterable[Row] = (),
    accepted: Mapping[str, str] | None = None,
) -> Update:
    """What writing the rows' expectations into the catalog at ``path`` would do (nothing is written).
    ``baseline``: an earlier sweep's rows, whose passes make a failure now a PASS -> FAIL."""
    rows = list(rows)
    catalog = load_catalog(path)
    current = newest_rows(rows)
    accepted = dict(accepted or {})
    changes, refused = planned_changes(catalog.models, current, previous_rows(current, [*rows, *baseline]), accepted)
    written = {change.model_id for change in changes if change.accepted}
    unused = tuple(model for model in accepted if model not in written)
    text = path.read_text(encoding="utf-8")
    after = None
    if changes:
        after = apply_changes(text, changes)
        parse_catalog(after, str(path), path)  # the edited catalog must load before it replaces the file
    return Update(tuple(changes), tuple(refused), unused, text, after)


def update_catalog(
    path: Path,
    rows: Iterable[Row],
    *,
    baseline: Iterable[Row] = (),
    accepted: Mapping[str, str] | None = None,
) -> Update:
    """Write the rows' expectations into the catalog at ``path`` (in place, atomically), refusing what
    :func:`plan_update` refuses; what it did."""
    update = plan_update(path, rows, baseline=baseline, accepted=accepted)
    if update.after is not None:
        write_atomic(path, update.after)
    return update
