"""docs/: the worked solutions and the cheat-sheet are what their generators write now.

Both generators are deterministic without a run: the solutions hide the
chapters' run while they are written, and the cheat-sheet is rebuilt from
its committed bugs report (docs/cheatsheet-bugs.json).
"""

import json
import re

import pytest

from course_lib.course import cheatsheet, quiz, solutions
from course_lib.jobs.audit import BugsReport
from tests.conftest import ROOT

DOCS = ROOT / "docs"
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PNG = b"\x89PNG\r\n\x1a\n"


def test_every_question_has_a_reasoning():
    missing = sorted(qid for qid, q in quiz.QUESTIONS.items() if not q.reasoning.strip())
    assert not missing, f"no reasoning in course/questions/ for {missing}"


def test_reasonings_are_short():
    for qid, q in quiz.QUESTIONS.items():
        why = q.reasoning
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", why.strip()) if s]
        assert why.strip() and len(sentences) <= 3, f"{qid}: 1-3 sentences"


def test_the_committed_solutions_are_the_generators_output(tmp_path):
    out = tmp_path / "solutions.md"
    solutions.main(["--out", str(out)])
    assert (DOCS / "solutions.md").read_text() == out.read_text(), (
        "docs/solutions.md is stale: run `make solutions`")


def test_the_solutions_never_read_the_run():
    """The document is the same with or without runs/course."""
    text = solutions.render()
    assert "/runs/" not in text and "runs/course/" not in text


# an import statement that names solutions, or a dynamic import of it
IMPORTS = re.compile(r"^\s*(from|import)\s.*\bsolutions\b|import_module\(.*solutions",
                     re.MULTILINE)


def test_no_chapter_imports_the_solutions():
    for path in CHAPTERS:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                assert not IMPORTS.search("".join(cell["source"])), (
                    f"{path.name} imports the worked solutions")


def test_the_committed_cheatsheet_is_the_generators_output():
    report = cheatsheet.committed()
    assert (DOCS / "cheatsheet.md").read_text() == cheatsheet.markdown(report), (
        "docs/cheatsheet.md is stale: run `make cheatsheet`")


def test_the_cheatsheet_png_is_a_png():
    data = (DOCS / "cheatsheet.png").read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000


def test_the_cheatsheet_names_built_in_steps_and_every_trap_is_caught():
    from course_lib.steps.catalog import BUILTIN

    report = cheatsheet.committed()
    assert len(cheatsheet.TRAPS) == 5
    for trap in cheatsheet.TRAPS:
        for step in trap.steps:
            assert BUILTIN[step].kind == "bug", step
            assert report.steps[step].caught_by, f"{step}: caught by nothing"
    assert not report.steps[cheatsheet.CONTROL].caught_by


def test_the_cheatsheet_agrees_with_the_courses_run():
    """When chapter 05 has written runs/course/reports/bugs.json, its verdicts
    are the committed sheet's (the catalog is deterministic)."""
    out = ROOT / "runs" / cheatsheet.RUN_NAME
    if not BugsReport.exists(out):
        pytest.skip("no runs/course/reports/bugs.json: chapter 05 has not run here")
    run = BugsReport.load(out)
    if run.objective != cheatsheet.objectives.DEFAULT:
        pytest.skip(f"the course's bugs report is of objective {run.objective}")
    committed = cheatsheet.committed()
    for trap in cheatsheet.TRAPS:
        for step in (*trap.steps, cheatsheet.CONTROL):
            assert run.steps[step].caught_by == committed.steps[step].caught_by, (
                f"{step}: the run disagrees with docs/cheatsheet-bugs.json: "
                "run `make cheatsheet`")


def test_the_docs_are_linked():
    readme = (ROOT / "README.md").read_text()
    setup = (ROOT / "notebooks" / "00_setup.ipynb").read_text()
    for name in ("glossary.md", "cheatsheet.md", "solutions.md"):
        assert (DOCS / name).is_file()
        assert f"docs/{name}" in readme, f"README.md does not link docs/{name}"
    assert "../docs/glossary.md" in setup, "00_setup does not link docs/glossary.md"
    # the cheat-sheet states the rule and which checks catch each trap: it is
    # linked from chapter 05's recap, once the learner has predicted those
    traps = (ROOT / "notebooks" / "05_bug_lab.ipynb").read_text()
    assert "../docs/cheatsheet.md" in traps, "05 does not link docs/cheatsheet.md"
    assert "cheatsheet.md" not in setup, "00_setup gives the traps away before 05"


# The check table left the README for the site's checks page, written from
# checks.CHECKS on each build: tests/test_site.py::test_the_check_table_is_the_registrys.


def test_the_committed_recipes_page_is_the_generators_output():
    """docs/recipes.md, the 34-row reference chapter 08 points to, is the
    rendering of the committed report, which audits every recipe."""
    from course_lib.course import recipes_page
    from course_lib.steps.recipes import RECIPES

    report = recipes_page.committed()
    assert set(report.recipes) == set(RECIPES), "docs/recipes-report.json: make recipes-page"
    assert recipes_page.markdown_path().read_text() == recipes_page.markdown(report), (
        "docs/recipes.md is stale: run `make recipes-page` (or --snapshot)")
    for page, rl in recipes_page.VERDICT_PAGES.items():
        assert recipes_page.verdict_path(page).read_text() == \
            recipes_page.verdicts_markdown(report, rl), (
            f"docs/{page} is stale: run `make recipes-page` (or --snapshot)")
    # the formulas page carries no verdict: chapter 08 links it before its predictions
    assert "What each one trains" not in recipes_page.markdown_path().read_text()


def test_the_committed_versions_page_is_the_generators_output():
    """docs/framework-versions.md, the history chapter 08 links, is the
    rendering of the committed version matrix, and names every Trainer
    version that the matrix measured."""
    from course_lib.course import versions_page
    from course_lib.frameworks.evidence import Matrix

    page = versions_page.path().read_text()
    assert page == versions_page.markdown(), (
        "docs/framework-versions.md is stale: run `make versions-page`")
    for version in {r.version for r in Matrix.committed().measured if r.framework == "hf"}:
        assert version in page, f"transformers {version} is measured but not on the page"


def test_the_reference_run_page_shows_the_course_run():
    """docs/reference-run.md (chapter 07 links it) states the course's column of
    the r1 comparison: when the chapters' run exists, its numbers are those."""
    from course_lib.core import paths
    from course_lib.course import reconcile

    out = paths.default_out("course")
    try:
        rows = reconcile.rows(out)
    except FileNotFoundError:
        pytest.skip("no runs/course: the chapters have not run here")
    page = (DOCS / "reference-run.md").read_text()
    table = [line.split("|")[1:-1] for line in page.splitlines() if line.startswith("| ")]
    for row in rows:
        assert any(cells[1].strip() == row.r1 and cells[2].strip() == row.ours
                   for cells in table), f"{row.quantity}: r1 {row.r1}, ours {row.ours}"
