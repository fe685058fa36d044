"""Reports of a benchmark, rebuilt from its storage alone (``dmlbench report DIR``): Markdown, a
self-contained HTML page, CSV and LaTeX tables and plots. Reads what ``protocol.run.schedule`` stored."""

from dmlbench.report.build import write_report
from dmlbench.report.data import LEADERBOARD_METRICS, ReportData, load_report_data

__all__ = ["LEADERBOARD_METRICS", "ReportData", "load_report_data", "write_report"]
