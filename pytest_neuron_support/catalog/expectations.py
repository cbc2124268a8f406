"""``neuron-support expect update RESULTS``: a sweep's outcomes written back into the catalog as each
entry's ``expect:``, as PyTorch's ``update_expected.py`` regenerates its expected-status files.

For each entry, its newest row of the check its expectation is about (``inference`` unless it says
otherwise): a FAIL, ERROR or TIMEOUT becomes ``expect: {result, stage, signature, reason}``; a PASS that
hit Dynamo's recompile limit becomes ``expect: {result: PASS, recompiles: true, reason}``; a clean PASS
drops the entry's expectation. A reason already there is kept (it is what people know about the cause);
a new one says where it came from and asks for the upstream issue. SKIPPED and EXCLUDED rows, and
entries without a row, are left as they are.

The file is edited line by line, in place: only the ``expect:`` lines of the entries that change are
written (one flow mapping per entry), so comments, order and formatting stay.
"""

from __future__ import annotations

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
from pytest_neuron_support.verdict.expected import describe


@dataclass(frozen=True)
class Change:
    """One entry's expectation, before and after (None: none)."""

    model_id: str
    before: Expectation | None
    after: Expectation | None

    def __str__(self) -> str:
        if self.after is None:
            was = "" if self.before is None else f" (was {describe(self.before)})"
            return f"{self.model_id}: expectation dropped{was}: it passed"
        kept = " (reason kept)" if self.before is not None and self.before.reason == self.after.reason else ""
        return f"{self.model_id}: expect {describe(self.after)}{kept}"


def expectation_from(row: Row, before: Expectation | None) -> Expectation | None:
    """What ``row`` says the entry should expect, keeping ``before``'s reason; ``before`` itself where the
    row ran nothing (SKIPPED, EXCLUDED)."""
    if row.result in ("SKIPPED", "EXCLUDED"):
        return before
    recompiled = row.recompile_limit is not None
    if row.result == "PASS" and not recompiled:
        return None
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


def planned_changes(models: Iterable[ModelSpec], rows: Mapping[tuple[str, str], Row]) -> list[Change]:
    """The entries whose expectation the rows change."""
    changes = []
    for model in models:
        row = rows.get((model.id, model.expect.check if model.expect else "inference"))
        if row is None:
            continue
        after = expectation_from(row, model.expect)
        if after != model.expect:
            changes.append(Change(model.id, model.expect, after))
    return changes


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


def update_catalog(path: Path, rows: Iterable[Row]) -> list[Change]:
    """Write the rows' expectations into the catalog at ``path`` (in place, atomically); the changes."""
    catalog = load_catalog(path)
    changes = planned_changes(catalog.models, newest_rows(rows))
    if changes:
        text = apply_changes(path.read_text(encoding="utf-8"), changes)
        parse_catalog(text, str(path), path)  # the edited catalog must load before it replaces the file
        write_atomic(path, text)
    return changes
