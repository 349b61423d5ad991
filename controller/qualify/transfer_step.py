"""The transfer evidence of `dualloop qualify`: a leave-one-dataset-out report of the candidate's
training recipe (`dualloop eval-logs --leave-one-out`, controller.transfer), its left-out figures
judged against the targets of a site never seen."""

from __future__ import annotations

from pathlib import Path

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.qualify.checks import Check, at_most
from dualloop.controller.transfer.leave_out import NOMINAL_TARGET, RATIO_TARGET, VETO_TARGET, TransferReport


def read_transfer(path: Path) -> TransferReport:
    try:
        return TransferReport.from_json(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"--transfer: {path}: {err.strerror or err}") from None
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"--transfer: {path}: not a report of `dualloop eval-logs --leave-one-out` ({type(err).__name__}: {err})"
        ) from None


def transfer_checks(report: TransferReport) -> list[Check]:
    """Per dataset left out: disagreement over the best baseline's, vetoed and non-NOMINAL shares."""
    checks = []
    for d in report.datasets:
        c, name = d.left_out, f"{d.dataset} left out"
        checks.append(at_most("transfer", f"{name}: disagreement ratio", c.disagreement_ratio, RATIO_TARGET))
        if c.driving is not None:
            checks.append(at_most("transfer", f"{name}: vetoed share", c.driving.vetoed, VETO_TARGET))
            checks.append(at_most("transfer", f"{name}: non-NOMINAL share", 1 - c.driving.nominal, 1 - NOMINAL_TARGET))
    return checks
