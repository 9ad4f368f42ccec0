"""The French edition of the chapters, built from the English ones.

Each translated chapter has a file ``notebooks/i18n/fr/<chapter>.json``: one
entry per markdown cell, keyed by the cell's stable id, holding the French
text and the hash of the English source it was translated from. The French
notebook ``notebooks/fr/<chapter>.ipynb`` is built from the English chapter:
its markdown from the entries, its code cells copied, so that a change to
the code reaches both editions. A code cell that prints labels for the
learner or asks for an answer in a comment may have an entry too: the same
program, with its messages and comments in French (``program`` checks that
only those differ). A cell added, changed or removed in English
makes the chapter stale until it is translated again (``problems``), and the
build refuses a stale chapter (and builds the others). The hash is of the
text with its whitespace collapsed, so a reflowed cell needs no new
translation; a cell whose id changed but whose text did not is a rename, and
its translation follows it.

The French notebooks live one folder down, so their relative links and
paths gain a ``../``, and a first code cell sets ``COURSE_EDITION=fr``: the
quiz and the widgets then speak French in that kernel (``edition``). The
French prose is set with French typography as it is built (``typography``),
and so are the messages and comments of a French code cell.

    python -m course_lib.course.translation [--check] [--only NN ...]   # make translations
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from course_lib.core import edition as editions
from course_lib.core import paths, typography

EDITION = "fr"
# The code cell that switches the kernel to the edition, right after the title.
SWITCH = 'import os\n\nos.environ["COURSE_EDITION"] = "{edition}"  # {says}'
NAMES = {"fr": "French"}
SAYS = {"fr": "le cours vous répond en français"}
# A relative link or path that starts in notebooks/: one folder deeper now.
UP = re.compile(r"(\]\(|\"|'|%%writefile |\s)\.\./")


class TranslationError(ValueError):
    """A chapter whose translation is missing or stale: the cells to translate."""


def source_hash(text: str) -> str:
    """The hash an entry keeps of its English text: a reflow (whitespace
    only) leaves it as it was."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()[:16]


def chapters_dir(edition: str = editions.DEFAULT, root: Path | None = None) -> Path:
    """Where an edition's chapters live: notebooks/, or notebooks/<edition>/."""
    top = (root or paths.project_root()) / "notebooks"
    return top if edition == editions.DEFAULT else top / edition


def entries_dir(edition: str = EDITION) -> Path:
    return chapters_dir() / "i18n" / edition


def english(stem: str) -> Path:
    return chapters_dir() / f"{stem}.ipynb"


def entries_path(stem: str, edition: str = EDITION) -> Path:
    return entries_dir(edition) / f"{stem}.json"


def built_path(stem: str, edition: str = EDITION) -> Path:
    return chapters_dir(edition) / f"{stem}.ipynb"


def translated(edition: str = EDITION) -> list[str]:
    """The chapters that have a translation file."""
    return sorted(p.stem for p in entries_dir(edition).glob("[0-9][0-9]_*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _text(cell: dict) -> str:
    return "".join(cell["source"])


def _cells(stem: str) -> list[dict]:
    """The English chapter's cells; each must have an id (nbformat 4.5)."""
    cells = _load(english(stem))["cells"]
    for index, cell in enumerate(cells):
        if "id" not in cell:
            raise TranslationError(f"{stem}, cell {index}: no id: save the chapter with "
                                   "nbformat 4.5 or later, which gives every cell one")
    return cells


# Calls whose text is the edition's way of writing a number: ``{number(x)}``
# in a French f-string says what ``{x:,}`` says in English.
_NUMBERS = {"number", "decimal"}


def _called(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return None


def _printed(node: ast.expr) -> ast.expr:
    """``x`` for ``number(x, ...)`` or ``decimal(x, ...)``: the value printed."""
    if isinstance(node, ast.Call) and _called(node) in _NUMBERS and node.args:
        return node.args[0]
    return node


def _blank_strings(node: ast.expr) -> ast.expr:
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            child.value = ""
    return node


def _writes_python(node: ast.Call) -> bool:
    """``%%writefile path.py``: a Python file the learner reads and runs."""
    args = node.args
    return (len(args) == 3 and all(isinstance(a, ast.Constant) for a in args)
            and args[0].value == "writefile"  # type: ignore[attr-defined]
            and str(args[1].value).strip().endswith(".py"))  # type: ignore[attr-defined]


class _Blank(ast.NodeTransformer):
    """Blanks what a code cell says to the learner: every string literal with
    a space in it (a message, a label, a column), every string a print call
    or an f-string's field prints (a word: "to", 'PASS', "%"), an f-string's
    format specs and conversions, an edition's number call around a printed
    value, and the import of those calls from the face. Identifiers, paths,
    options and quiz keys have no space and must stay as they are. A
    %%writefile of a .py file is held to its program likewise; any other
    magic or shell line stays as it is."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if _called(node) == "run_cell_magic" and _writes_python(node):
            body = node.args[2]  # %%writefile x.py: the file is a program too
            node.args[2] = ast.Constant(program(body.value))  # type: ignore[attr-defined]
            return node
        if _called(node) in ("run_cell_magic", "run_line_magic", "system", "getoutput"):
            return node
        if _called(node) == "print":
            node.args = [_blank_strings(a) if isinstance(a, ast.Constant) else a
                         for a in map(_printed, node.args)]
            for arg in node.args:  # an f-string's text, printed: "{x:.0f}%" may be "{x} %"
                if isinstance(arg, ast.JoinedStr):
                    arg.values = [ast.Constant("") if isinstance(v, ast.Constant) else v
                                  for v in arg.values]
        return self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        if node.module == "course_lib":  # the edition's number writers, imported to print
            node.names = [a for a in node.names if a.name not in _NUMBERS]
        return node

    def visit_FormattedValue(self, node: ast.FormattedValue) -> ast.AST:
        node.value = _printed(node.value)
        if isinstance(node.value, (ast.Constant, ast.IfExp)):  # {'step':<26}, {'PASS' if ..}
            node.value = _blank_strings(node.value)
        node.format_spec, node.conversion = None, -1  # {x!r}: a format too
        return self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str) and (any(ch.isspace() for ch in node.value)
                                            or node.value == "%"):  # French: " %"
            return ast.Constant("")
        return node


def program(source: str) -> str:
    """What a code cell does, apart from what it says to the learner: its
    syntax tree without comments or messages (``_Blank``). A French code
    cell must have the English one's program."""
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    return ast.dump(_Blank().visit(tree))


def _renamed(cells: list[dict], entries: dict[str, dict]) -> dict[str, str]:
    """New id -> old id, for each English cell without an entry whose text
    an orphaned entry was translated from: the same cell under a new id."""
    ids = {c["id"] for c in cells}
    orphans = {e["en_sha256"]: cid for cid, e in entries.items() if cid not in ids}
    found = {}
    for cell in cells:
        if cell["id"] not in entries:
            old = orphans.pop(source_hash(_text(cell)), None)
            if old is not None:
                found[cell["id"]] = old
    return found


def _follow(cells: list[dict], entries: dict[str, dict]) -> dict[str, str]:
    """Key each renamed cell's entry by its new id, in ``entries``; new id -> old."""
    moved = _renamed(cells, entries)
    for new, old in moved.items():
        entries[new] = entries.pop(old)
    return moved


def _entries(stem: str, edition: str, cells: list[dict]) -> dict[str, dict]:
    """The chapter's entries, each renamed cell's under its new id."""
    entries = _load(entries_path(stem, edition))["cells"]
    _follow(cells, entries)
    return entries


def problems(stem: str, edition: str = EDITION) -> list[str]:
    """One line per cell to translate: missing (markdown), stale, orphaned,
    or a code entry whose program is not the English one's."""
    cells = _cells(stem)
    entries = _entries(stem, edition, cells)
    found = []
    for cell in cells:
        entry = entries.get(cell["id"])
        if entry is None:
            if cell["cell_type"] == "markdown":
                found.append(f"{stem}, cell {cell['id']}: no {NAMES[edition]} entry: "
                             "translate it")
        elif entry["en_sha256"] != source_hash(_text(cell)):
            found.append(f"{stem}, cell {cell['id']}: the English changed since it was "
                         "translated: translate it again")
        elif cell["cell_type"] == "code" and program(entry[edition]) != program(_text(cell)):
            found.append(f"{stem}, cell {cell['id']}: the {NAMES[edition]} code does more "
                         "than the English: only its comments, messages and number "
                         "formats may differ")
    ids = {c["id"] for c in cells}
    found += [f"{stem}, cell {cid}: an entry whose English cell is gone: remove it"
              for cid in entries if cid not in ids]
    return found


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def build(stem: str, edition: str = EDITION) -> dict:
    """The edition's notebook of ``stem`` (TranslationError when stale)."""
    stale = problems(stem, edition)
    if stale:
        raise TranslationError("; ".join(stale))
    nb = _load(english(stem))
    entries = _entries(stem, edition, nb["cells"])
    cells = []
    for cell in nb["cells"]:
        cell = copy.deepcopy(cell)
        entry = entries.get(cell["id"])
        if cell["cell_type"] == "markdown":
            text = typography.french(entry[edition])  # type: ignore[index]
            cell["source"] = _lines(UP.sub(r"\1../../", text))
        else:  # an entry's messages set as the catalog's are (typography.french_code)
            text = typography.french_code(entry[edition]) if entry else _text(cell)
            cell["source"] = _lines(UP.sub(r"\1../../", text))
            cell["outputs"], cell["execution_count"] = [], None
            cell["metadata"].pop("execution", None)
        cells.append(cell)
    switch: dict[str, Any] = {
        "cell_type": "code", "execution_count": None, "id": f"edition-{edition}",
        "metadata": {}, "outputs": [],
        "source": _lines(SWITCH.format(edition=edition, says=SAYS[edition]))}
    nb["cells"] = [cells[0], switch, *cells[1:]]
    nb["metadata"]["course_edition"] = edition
    return nb


def write(nb: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def same_code(built: dict, committed: dict) -> bool:
    """The committed notebook has the build's cells (sources; outputs aside)."""
    def sources(nb):
        return [(c["cell_type"], c.get("id"), _text(c)) for c in nb["cells"]]
    return sources(built) == sources(committed)


def _code(nb: dict) -> list[str]:
    """The code, cell by cell: what the outputs depend on (ids aside)."""
    return [_text(c) for c in nb["cells"] if c["cell_type"] == "code"]


def keep_outputs(nb: dict, old: dict) -> dict:
    """``nb`` with the outputs of ``old``'s code cells, matched by their code
    (a renamed cell keeps its outputs), and ``old``'s notebook metadata: the
    widget state that those outputs point to lives there, not in the cells."""
    if _code(nb) != _code(old):
        raise ValueError("the code changed: execute the chapter instead")
    nb["metadata"] = {**copy.deepcopy(old["metadata"]),
                      "course_edition": nb["metadata"]["course_edition"]}
    ran = iter(c for c in old["cells"] if c["cell_type"] == "code")
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            before = next(ran)
            for key in ("outputs", "execution_count", "metadata"):
                cell[key] = copy.deepcopy(before[key])
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.course.translation")
    parser.add_argument("--edition", default=EDITION, choices=[e for e in editions.EDITIONS
                                                               if e != editions.DEFAULT])
    parser.add_argument("--check", action="store_true",
                        help="only say which cells need a translation")
    parser.add_argument("--only", nargs="*", default=None, metavar="NN",
                        help="the chapters to build, by number (e.g. 04 05): the others "
                             "may be stale meanwhile")
    args = parser.parse_args(argv)
    stems = [stem for stem in translated(args.edition)
             if not args.only or stem[:2] in args.only]
    status = 0
    for stem in stems:
        try:
            stale = problems(stem, args.edition)
        except TranslationError as bad:
            stale = [str(bad)]
        for line in stale:
            print(line, file=sys.stderr)
        status = status or int(bool(stale))
        if stale or args.check:
            continue  # the other chapters still build
        _follow_renames(stem, args.edition)
        path = built_path(stem, args.edition)
        root = paths.project_root()
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        nb = build(stem, args.edition)
        old = _load(path) if path.exists() else None
        if old is not None and same_code(nb, old):
            print(f"{shown}: up to date")
        elif old is not None and _code(nb) == _code(old):
            write(keep_outputs(nb, old), path)  # only the prose changed
            print(f"{shown}: text updated, outputs kept")
        else:
            write(nb, path)
            print(f"built {shown}: execute it to fill its outputs")
    return status


def _follow_renames(stem: str, edition: str) -> None:
    """Key each renamed cell's entry by its new id, in the entries file."""
    path = entries_path(stem, edition)
    doc = _load(path)
    moved = _follow(_cells(stem), doc["cells"])
    if not moved:
        return
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for new, old in moved.items():
        print(f"{stem}, cell {old} is now {new}: its translation follows it")


if __name__ == "__main__":
    sys.exit(main())
