"""docs/fr/: the French edition's cheat-sheet and glossary, and the site's
French edition showing them in place of the English pages.

The French cheat-sheet is what the one generator writes for the French
edition (``cheatsheet.markdown(report, "fr")``); the French glossary is
hand-written, and keeps one entry per term of the English glossary, keyed by
the English term it gives in parentheses.
"""

import importlib.util
import json
import re
import sys

from course_lib.core import edition, typography
from course_lib.course import cheatsheet
from tests.conftest import ROOT

DOCS = ROOT / "docs"
PNG = b"\x89PNG\r\n\x1a\n"
# a glossary row's first cell: **French term** (English term)
FR_TERM = re.compile(r"^\*\*(?P<fr>.+?)\*\* \((?P<en>.+)\)$")


def _rows(path) -> list[list[str]]:
    """A Markdown table's body rows, as cells (the header and rule left out)."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines()
             if line.startswith("| ")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines[1:]]


def _unbreakable(text: str) -> list[str]:
    """Where ``text`` breaks French typography: what ``typography.breakable``
    finds, and a plain space between a code span and high punctuation (which
    it leaves alone, the code span being protected)."""
    return typography.breakable(text) + re.findall(r".{0,20}` [:;?!%»]", text)


def _english_catalog_keys(text: str) -> list[str]:
    """The catalog's English texts that French changes and that stand whole in
    ``text``: what an untranslated string would leave on the page."""
    fr = edition.catalog("fr")
    return [en for en, tr in fr.items()
            if en != tr and len(en) > 12 and re.search(r"[a-z]{3,} [a-z]{3,}", en)
            and "{" not in en and en in text]


# --- the cheat-sheet --------------------------------------------------------------------


def test_the_committed_french_cheatsheet_is_the_generators_output():
    report = cheatsheet.committed()
    assert cheatsheet.page_path("fr") == DOCS / "fr" / "cheatsheet.md"
    assert (DOCS / "fr" / "cheatsheet.md").read_text(encoding="utf-8") == \
        cheatsheet.markdown(report, "fr"), "docs/fr/cheatsheet.md: run `make cheatsheet`"


def test_the_french_cheatsheet_speaks_french_whatever_the_shell(monkeypatch):
    """One generator: the edition is an argument, not the environment, and the
    English sheet stays English in a French shell (and the other way round)."""
    report = cheatsheet.committed()
    monkeypatch.setenv(edition.ENV, "fr")
    english = cheatsheet.markdown(report)
    assert english == (DOCS / "cheatsheet.md").read_text()
    monkeypatch.setenv(edition.ENV, "en")
    french = cheatsheet.markdown(report, "fr")
    assert french.startswith("# Aide-mémoire") and edition.current() == "en"
    # the structure is the English one's: the same rows, the same steps, the same verdicts
    def table(text):
        return [r for r in text.splitlines() if r.startswith("| ")]

    assert len(table(french)) == len(table(english))
    for step in [s for t in cheatsheet.TRAPS for s in t.steps] + [cheatsheet.CONTROL]:
        en_row = next(r for r in table(english) if f"| `{step}` |" in r)
        fr_row = next(r for r in table(french) if f"| `{step}` |" in r)
        caught = en_row.rsplit("|", 2)[1], fr_row.rsplit("|", 2)[1]
        assert caught[0] == caught[1] or step == cheatsheet.CONTROL, step


def test_the_french_cheatsheet_has_no_english_left_and_french_typography(monkeypatch):
    text = (DOCS / "fr" / "cheatsheet.md").read_text(encoding="utf-8")
    left = _english_catalog_keys(text)
    assert not left, f"English strings on the French sheet: {left[:3]}"
    monkeypatch.setenv(edition.ENV, "fr")
    for trap in cheatsheet.TRAPS:  # each trap's title and what, in French, on its row
        assert f"| **{trap.title()}** | {trap.what()} | `{trap.steps[0]}` |" in text
    monkeypatch.setenv(edition.ENV, "en")
    for trap in cheatsheet.TRAPS:
        assert trap.title() not in text, trap.title()
    assert not _unbreakable(text), _unbreakable(text)[:3]
    assert typography.NBSP + ":" in text, "no no-break space before a colon"
    # the figures of the sheet are the report's, in French words
    report = cheatsheet.committed()
    assert f"sur {report.world_size} rangs" in text
    control = next(r for r in text.splitlines() if f"`{cheatsheet.CONTROL}`" in r)
    assert control.endswith("| rien |")  # the control is caught by nothing
    assert "détecté\N{NO-BREAK SPACE}: oui" in text and "True" not in text


def test_the_french_cheatsheet_png_is_its_own():
    fr = (DOCS / "fr" / "cheatsheet.png").read_bytes()
    en = (DOCS / "cheatsheet.png").read_bytes()
    assert fr.startswith(PNG) and len(fr) > 10_000
    assert fr != en, "docs/fr/cheatsheet.png is the English figure"


def test_the_french_figure_writes_french():
    fig = cheatsheet.figure(cheatsheet.committed(), "fr")
    texts = [t.get_text() for t in fig.texts]
    texts += [t.get_text() for ax in fig.axes for t in ax.texts]
    texts += [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    joined = "\n".join(texts)
    assert "la règle" in joined and "DÉTECTÉ" in joined and "CAUGHT" not in joined
    assert not [t for t in texts if "the rule" in t or "Magenta:" in t]


# --- the glossary -----------------------------------------------------------------------


def test_every_english_glossary_term_has_its_french_entry():
    english = _rows(DOCS / "glossary.md")
    french = _rows(DOCS / "fr" / "glossary.md")
    assert english and all(len(r) == 4 for r in english)
    keys = []
    for row in french:
        assert len(row) == 3, row
        found = FR_TERM.match(row[0])
        assert found, f"docs/fr/glossary.md: {row[0]!r} is not **terme** (English term)"
        assert row[1].strip(), found["en"]
        keys.append(found["en"])
    assert len(keys) == len(set(keys)), "a term twice in docs/fr/glossary.md"
    wanted = [r[0] for r in english]
    missing = [t for t in wanted if t not in keys]
    extra = [t for t in keys if t not in wanted]
    assert not missing, f"docs/fr/glossary.md lacks {missing}"
    assert not extra, f"docs/fr/glossary.md has terms the English glossary has not: {extra}"
    assert keys == wanted, "docs/fr/glossary.md keeps the English glossary's order"
    chapters = {r[0]: r[3] for r in english}
    for row in french:  # a term is first put to work in the same chapter in both
        en = FR_TERM.match(row[0])["en"]  # type: ignore[index]
        assert row[2] == chapters[en], f"{en}: chapter {row[2]}, English {chapters[en]}"


def test_the_french_glossary_is_set_in_french_typography():
    text = (DOCS / "fr" / "glossary.md").read_text(encoding="utf-8")
    assert not _unbreakable(text), _unbreakable(text)[:3]
    assert text.startswith("# Glossaire")


def test_the_french_glossary_gives_the_tutorials_words():
    """The French column of the English glossary names the French terms: the
    French glossary uses them (the register of the chapters)."""
    text = (DOCS / "fr" / "glossary.md").read_text(encoding="utf-8")
    for word in ("nombre de rangs (W)", "moyenne des moyennes", "fenêtre d'accumulation",
                 "dénominateur global", "rendez-vous", "hook de communication"):
        assert word in text, word


# --- the site ---------------------------------------------------------------------------


def _build():
    spec = importlib.util.spec_from_file_location("site_build", ROOT / "site" / "build.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["site_build"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_french_edition_shows_the_french_docs_pages(tmp_path):
    build = _build()
    gen = tmp_path / "gen"
    gen.mkdir()
    fr = build.assemble("fr", tmp_path / "src" / "fr", gen)
    en = build.assemble("en", tmp_path / "src" / "en", gen)
    translated = sorted(p.name for p in (DOCS / "fr").glob("*.md"))
    assert translated == ["cheatsheet.md", "glossary.md"]
    for name in translated:
        shown = (fr.src / "docs" / name).read_text(encoding="utf-8")
        # the page itself: its links (the PNG, the glossary) land beside it
        assert shown == (DOCS / "fr" / name).read_text(encoding="utf-8"), f"fr/docs/{name}"
        english = (en.src / "docs" / name).read_text(encoding="utf-8")
        assert english == (DOCS / name).read_text(encoding="utf-8"), f"en/docs/{name} changed"
    # an English-only page still says so in the French edition, and not in the English one
    assert "n'existe qu'en anglais" in (fr.src / "docs" / "recipes.md").read_text()
    assert "n'existe qu'en anglais" not in (en.src / "docs" / "recipes.md").read_text()
    # the French sheet's figure is the French PNG, at the English one's place
    assert (fr.src / "docs" / "cheatsheet.png").read_bytes() == \
        (DOCS / "fr" / "cheatsheet.png").read_bytes()
    assert (en.src / "docs" / "cheatsheet.png").read_bytes() == \
        (DOCS / "cheatsheet.png").read_bytes()
    assert not (fr.src / "docs" / "fr").exists() and not (en.src / "docs" / "fr").exists()
    # the French home page links both
    home = (fr.src / "index.md").read_text(encoding="utf-8")
    assert "](docs/glossary.md)" in home and "](docs/cheatsheet.md)" in home


def test_a_french_chapters_link_to_the_glossary_lands_on_the_french_one():
    build = _build()
    chapter = ROOT / "notebooks" / "fr" / "00_setup.ipynb"
    cells = json.loads(chapter.read_text(encoding="utf-8"))["cells"]
    # in JupyterLab the link opens the French page; on the site it lands there too
    assert any("../../docs/fr/glossary.md" in "".join(c["source"]) for c in cells)
    lay = build.Layout("fr", ROOT / "build" / "unused")
    moved = lay.rewrite("[g](../../docs/fr/glossary.md) [e](../../docs/glossary.md) "
                        "![s](../../docs/cheatsheet.png)",
                        chapter, build.site_path(chapter, "fr"))
    assert moved == "[g](../docs/glossary.md) [e](../docs/glossary.md) " \
                    "![s](../docs/cheatsheet.png)"
    assert lay.extra == {(DOCS / "fr" / "cheatsheet.png").resolve()}
    shown = dict(build.docs_pages("fr"))
    assert shown[(DOCS / "fr" / "glossary.md").resolve()] is False
    assert shown[(DOCS / "recipes.md").resolve()] is True
    assert all(english for _, english in build.docs_pages("en"))
