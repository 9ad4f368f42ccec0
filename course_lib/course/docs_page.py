"""A docs page written from a report, with the report committed beside it.

``docs/cheatsheet.md`` and ``docs/recipes.md`` are each written from one
report of a chapter's run. The report is committed next to the page, so the
page can be rebuilt (``--snapshot``) and tested without a run. Each page
takes the report from the chapters' run (``runs/course``) when that run has
one it accepts, and otherwise makes it in a run folder of its own.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from course_lib.core import paths
from course_lib.reports.store import to_json

R = TypeVar("R")
RUN_NAME = "course"  # the chapters' shared run folder


@dataclass(frozen=True)
class DocsPage(Generic[R]):
    report: Any  # the report class: .exists(out), .load(out), .from_dict(d)
    snapshot: str  # docs/<snapshot>: the committed report
    page: str  # docs/<page>: the page
    chapter: str  # the chapter whose run writes the report
    own_run: str  # runs/<own_run>: where the page makes its report otherwise

    def snapshot_path(self) -> Path:
        return paths.project_root() / "docs" / self.snapshot

    def markdown_path(self) -> Path:
        return paths.project_root() / "docs" / self.page

    def committed(self) -> R:
        return self.report.from_dict(json.loads(self.snapshot_path().read_text()))

    def measure(self, accept: Callable[[R], bool],
                make: Callable[[Path], R]) -> tuple[R, str]:
        """The report of the chapters' run if ``accept`` takes it, else
        ``make(runs/<own_run>)``; and where it came from."""
        course = paths.default_out(RUN_NAME)
        if self.report.exists(course):
            found = self.report.load(course)
            if accept(found):
                name = f"runs/{RUN_NAME}/reports/{self.report.NAME}.json"
                return found, f"{name} (chapter {self.chapter}'s run)"
        return make(paths.default_out(self.own_run)), \
            f"runs/{self.own_run}/reports/{self.report.NAME}.json (run now)"

    def write(self, report: R, markdown: str, *, snapshot: bool) -> list[Path]:
        """The page; with ``snapshot``, the report it was made from too."""
        written = []
        if snapshot:
            self.snapshot_path().parent.mkdir(parents=True, exist_ok=True)
            self.snapshot_path().write_text(to_json(report.to_dict()))  # type: ignore[attr-defined]
            written.append(self.snapshot_path())
        self.markdown_path().write_text(markdown)
        return [*written, self.markdown_path()]

    def main(self, argv: list[str] | None, description: str,
             measure: Callable[[], tuple[R, str]],
             write: Callable[[R, bool], Iterable[Path]],
             say: Callable[[R], None] = lambda report: None) -> int:
        """``python -m ...``: measure (or ``--snapshot``: the committed
        report), then write the page."""
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--snapshot", action="store_true",
                            help=f"rebuild from docs/{self.snapshot}, without a run")
        args = parser.parse_args(argv)
        if args.snapshot:
            report, source = self.committed(), f"docs/{self.snapshot} (committed)"
        else:
            report, source = measure()
        print(f"{self.report.NAME} report: {source}")
        say(report)
        root = paths.project_root()
        for path in write(report, not args.snapshot):
            print(f"wrote {path.relative_to(root)}")
        return 0
