"""Report files: the atomic writer, the run header, the logs' reader.

Each job's report dataclass lives beside the job (``course_lib.jobs``) and
reads its own file back: ``ParityReport.load(out)`` (``load(out, name)`` for
a report saved under another name).
"""

from course_lib.reports.store import Report, RunHeader, location_path, report_path

__all__ = ["Report", "RunHeader", "location_path", "report_path"]
