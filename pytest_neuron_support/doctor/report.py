"""What one doctor run found: a row per check (:class:`CheckResult`), the whole :class:`Report` (the
JSON that ``--json`` writes, which the session reads back: ``run/settings.py`` ``read_self_check``),
and the text table the command prints."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OK = "OK"
FAIL = "FAIL"
NA = "N/A"
NOT_RUN = "NOT RUN"


@dataclass(frozen=True)
class CheckResult:
    """One row of the doctor's table.

    Attributes:
        key: the check's stable identifier (``memory``, ``process-group``...), for scripts reading the JSON.
        name: what is checked, as the table says it.
        expected: what the harness assumes, with the device table's fields it comes from.
        found: what this host showed: values, the error text of a failure, or, for ``N/A`` and
            ``NOT RUN``, the reason (the table field, or the prerequisite that did not pass).
        status: ``OK``, ``FAIL``, ``N/A`` (does not apply to this kind, by the table) or ``NOT RUN``
            (a prerequisite failed, so the check could not say anything).
        seconds: wall time the check took.
    """

    key: str
    name: str
    expected: str
    found: str
    status: str
    seconds: float = 0.0


@dataclass(frozen=True)
class Report:
    """Everything one doctor run found.

    Attributes:
        device: the device kind checked (``auto`` resolved).
        checks: one result per check, in table order.
        versions: versions seen by the checks (torch, transformers, the device package, the compiler).
        timestamp: when the run ended (UTC, ISO 8601).
        work_dir: where the checks' scripts and logs were written (removed when every check passed).
    """

    device: str
    checks: tuple[CheckResult, ...]
    versions: Mapping[str, str]
    timestamp: str
    work_dir: str

    @property
    def passed(self) -> bool:
        """No check failed and none was left unrun (``N/A`` decided by the table is not a failure)."""
        return all(c.status in (OK, NA) for c in self.checks)

    def counts(self) -> dict[str, int]:
        return {status: sum(c.status == status for c in self.checks) for status in (OK, FAIL, NA, NOT_RUN)}

    def summary(self) -> str:
        counts = self.counts()
        text = f"doctor: {counts[OK]} OK, {counts[FAIL]} FAIL, {counts[NA]} N/A"
        if counts[NOT_RUN]:
            text += f", {counts[NOT_RUN]} NOT RUN"
        return f"{text} on {self.device}"

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "passed": self.passed,
            "timestamp": self.timestamp,
            "versions": dict(self.versions),
            "work_dir": self.work_dir,
            "summary": self.summary(),
            "checks": [dataclasses.asdict(c) for c in self.checks],
        }


_WIDTHS = {"check": 34, "expected": 46, "found": 64, "status": 7}


def format_table(checks: Sequence[CheckResult]) -> str:
    """The checks as a text table (cells wrapped, long error texts cut: the JSON has them whole)."""
    columns = list(_WIDTHS)
    rule = "-+-".join("-" * _WIDTHS[c] for c in columns)
    lines = [" | ".join(c.ljust(_WIDTHS[c]) for c in columns).rstrip(), rule]
    for check in checks:
        found = check.found if len(check.found) <= 600 else check.found[:600] + " [...]"
        cells = {
            "check": textwrap.wrap(f"{check.key}: {check.name}", _WIDTHS["check"]),
            "expected": textwrap.wrap(check.expected, _WIDTHS["expected"]),
            "found": textwrap.wrap(found, _WIDTHS["found"], break_long_words=True),
            "status": [check.status],
        }
        for row in range(max(len(v) for v in cells.values())):
            lines.append(
                " | ".join((cells[c][row] if row < len(cells[c]) else "").ljust(_WIDTHS[c]) for c in columns).rstrip()
            )
    return "\n".join(lines)
