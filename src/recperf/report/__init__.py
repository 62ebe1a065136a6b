"""The HTML report: one section module per capability, rendered into one self-contained page."""

from recperf.report.builder import build_report

__all__ = ["build_report"]
