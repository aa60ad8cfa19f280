"""Reports: the merged JUnit a run writes (:mod:`.junit`), read back into cells
(:mod:`.read`, the one reader, shared by the gate and the HTML page), and that page
(:mod:`.html`)."""

from cpmatrix.report.read import ReportCell, ReportError, read_report

__all__ = ["ReportCell", "ReportError", "read_report"]
