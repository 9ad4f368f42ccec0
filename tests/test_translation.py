"""The French edition never drifts: every translated chapter has an entry
for each English markdown cell, made from that cell's current text, and its
committed notebook is the build of the English chapter."""

import json

import pytest

from course_lib.course import translation

CHAPTERS = translation.translated()


def _stems(folder):
    return sorted(p.stem for p in folder.glob("[0-9][0-9]_*.ipynb"))


def test_every_chapter_is_translated():
    english = _stems(translation.english("x").parent)
    untranslated = sorted(set(english) - set(CHAPTERS))
    assert english == CHAPTERS, f"no French translation file for {untranslated}"
    assert _stems(translation.built_path("x").parent) == english, "run `make translations`"


@pytest.mark.parametrize("stem", CHAPTERS)
def test_the_translation_is_up_to_date(stem):
    stale = translation.problems(stem)
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize("stem", CHAPTERS)
def test_the_committed_french_chapter_is_the_build(stem):
    from course_lib.core.typography import french_code

    built = translation.build(stem)
    committed = json.loads(translation.built_path(stem).read_text(encoding="utf-8"))
    assert translation.same_code(built, committed), (
        f"notebooks/fr/{stem}.ipynb is not the build of the English chapter: "
        "run `make translations`")
    english = json.loads(translation.english(stem).read_text())
    entries = json.loads(translation.entries_path(stem).read_text())["cells"]
    code = [c for c in english["cells"] if c["cell_type"] == "code"]
    french = [c for c in committed["cells"] if c["cell_type"] == "code"][1:]  # the switch
    assert len(code) == len(french)
    for en, fr in zip(code, french, strict=True):  # the code comes from the English
        said = (french_code(entries[en["id"]]["fr"]) if en["id"] in entries
                else "".join(en["source"]))
        assert "".join(fr["source"]) == translation.UP.sub(r"\1../../", said)
        assert translation.program("".join(fr["source"])) == translation.program(
            translation.UP.sub(r"\1../../", "".join(en["source"])))
    outputs = "".join(o.get("text", "") if isinstance(o.get("text", ""), str)
                      else "".join(o["text"]) for c in committed["cells"]
                      for o in c.get("outputs", []))
    assert "your answer here" not in outputs  # the quiz answered in French


def _chapter(tmp_path, monkeypatch, cells, entries):
    en, fr = tmp_path / "99_x.ipynb", tmp_path / "99_x.json"
    en.write_text(json.dumps({"cells": cells, "metadata": {}}))
    fr.write_text(json.dumps({"chapter": "99_x", "cells": entries}))
    monkeypatch.setattr(translation, "english", lambda stem: en)
    monkeypatch.setattr(translation, "entries_path", lambda stem, edition="fr": fr)


def _md(cid, text):
    return {"cell_type": "markdown", "id": cid, "metadata": {}, "source": [text]}


def test_a_cell_added_changed_or_removed_in_english_is_named(tmp_path, monkeypatch):
    cells = [_md("a", "# Title"), _md("b", "changed text"), _md("c", "new cell")]
    entries = {"a": {"en_sha256": translation.source_hash("# Title"), "fr": "# Titre"},
               "b": {"en_sha256": translation.source_hash("old text"), "fr": "ancien"},
               "gone": {"en_sha256": "0", "fr": "disparu"}}
    _chapter(tmp_path, monkeypatch, cells, entries)
    found = translation.problems("99_x")
    assert found == [
        "99_x, cell b: the English changed since it was translated: translate it again",
        "99_x, cell c: no French entry: translate it",
        "99_x, cell gone: an entry whose English cell is gone: remove it"]
    with pytest.raises(translation.TranslationError, match="cell b"):
        translation.build("99_x")


def test_the_build_takes_the_code_from_english(tmp_path, monkeypatch):
    code = {"cell_type": "code", "id": "k", "metadata": {}, "execution_count": 3,
            "outputs": [{"output_type": "stream", "text": "x"}],
            "source": ['lab = Path("../runs/course")\n', "print(1)"]}
    cells = [_md("a", "# Title\n[glossary](../docs/glossary.md)"), code]
    entries = {"a": {"en_sha256": translation.source_hash(cells[0]["source"][0]),
                     "fr": "# Titre\n[glossaire](../docs/glossary.md)"}}
    _chapter(tmp_path, monkeypatch, cells, entries)
    nb = translation.build("99_x")
    sources = ["".join(c["source"]) for c in nb["cells"]]
    assert sources[0] == "# Titre\n[glossaire](../../docs/glossary.md)"
    assert 'os.environ["COURSE_EDITION"] = "fr"' in sources[1]
    assert sources[2] == 'lab = Path("../../runs/course")\nprint(1)'
    assert nb["cells"][2]["outputs"] == [] and nb["cells"][2]["execution_count"] is None


def _code(cid, text):
    return {"cell_type": "code", "id": cid, "metadata": {}, "execution_count": None,
            "outputs": [], "source": [text]}


def test_a_code_cell_speaks_french_and_does_what_the_english_does(tmp_path, monkeypatch):
    english = 'print("rank totals:", f"{total:.4f}")  # the sums\nconfig = "minimum"\n'
    said = ('print("totaux par rang :", f"{number(total, \'.4f\')}")  # les sommes\n'
            'config = "minimum"\n')
    title = {"en_sha256": translation.source_hash("# Title"), "fr": "# Titre"}
    entries = {"a": title, "k": {"en_sha256": translation.source_hash(english), "fr": said}}
    _chapter(tmp_path, monkeypatch, [_md("a", "# Title"), _code("k", english),
                                     _code("u", "print(1)")], entries)
    assert translation.problems("99_x") == []  # a code cell without an entry is English
    nb = translation.build("99_x")
    set_as_french = said.replace(" :", "\u00a0:")  # its messages' typography, as tr's
    assert ["".join(c["source"]) for c in nb["cells"][2:]] == [set_as_french, "print(1)"]
    # the same messages around another program: named, not built
    entries["k"]["fr"] = said.replace('"minimum"', '"maximum"')
    _chapter(tmp_path, monkeypatch, [_md("a", "# Title"), _code("k", english)], entries)
    assert translation.problems("99_x") == [
        "99_x, cell k: the French code does more than the English: only its comments, "
        "messages and number formats may differ"]
    # the English code changed: its French messages are stale
    entries["k"]["fr"] = said
    _chapter(tmp_path, monkeypatch, [_md("a", "# Title"), _code("k", "print(2)")], entries)
    assert translation.problems("99_x") == [
        "99_x, cell k: the English changed since it was translated: translate it again"]


def test_a_program_is_what_a_cell_does_not_what_it_says():
    same = translation.program
    assert same('print(f"loss {x:.4f}")') == same('print(f"perte {decimal(x)}")')
    assert same('print("N =", n)  # count') == same('print("N =", number(n))')
    assert same('x = f"l2:{a}"') != same('x = f"l3:{a}"')  # an option, not a message
    assert same('check("quiz.1", None)') != same('check("quiz.2", None)')
    assert same('print(n)') != same('print(n + 1)')
    assert same('print("lengths from", a, "to", b)') == same('print("de", a, "à", b)')
    assert same("f\"{'step':<18}{'PASS' if ok else 'FAIL':>6}\"") == same(
        "f\"{'étape':<20}{'RÉUSSITE' if ok else 'ÉCHEC':>9}\"")
    assert same("f\"{'PASS' if ok else 'FAIL'}\"") != same("f\"{'PASS' if ko else 'FAIL'}\"")
    assert same('print(f"{x:.0f}% of {n!r}")') == same('print(f"{x} % de {decimal(n, 1)}")')
    assert same('print(d["a"])') != same('print(d["b"])')  # a key, not a message
    assert same('share = f"{x:.2g}%"') == same('share = f"{number(x, \'.2g\')} %"')
    assert same("from course_lib import check") == same(
        "from course_lib import check, decimal, number")  # to print numbers in French
    assert same("from course_lib import check") != same("from course_lib import check, quiz")
    body = '%%writefile step.py\nx = 1  # TODO: add n\nprint("n is", x)\n'
    assert same(body) == same(body.replace("# TODO: add n", "# À FAIRE : ajoutez n")
                              .replace("n is", "n vaut"))  # the file's comments, messages
    assert same(body) != same(body.replace("x = 1", "x = 2"))  # the file is code
    assert same(body) != same(body.replace("step.py", "other.py"))
    data = "%%writefile notes.txt\na b\n"
    assert same(data) != same(data.replace("a b", "a c"))  # not Python: its text


def test_a_change_of_prose_keeps_the_outputs(tmp_path, monkeypatch):
    code = {"cell_type": "code", "id": "k", "metadata": {}, "execution_count": None,
            "outputs": [], "source": ["print(1)"]}
    cells = [_md("a", "# Title"), code]
    entries = {"a": {"en_sha256": translation.source_hash("# Title"), "fr": "# Titre"}}
    _chapter(tmp_path, monkeypatch, cells, entries)
    ran = translation.build("99_x")
    ran["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    ran["cells"][2]["execution_count"] = 2
    ran["metadata"]["widgets"] = {"state": {"m1": {"model_name": "FloatSliderModel"}}}
    entries["a"]["fr"] = "# Le titre"
    _chapter(tmp_path, monkeypatch, cells, entries)
    rebuilt = translation.build("99_x")
    assert not translation.same_code(rebuilt, ran)
    kept = translation.keep_outputs(rebuilt, ran)
    assert kept["cells"][0]["source"] == ["# Le titre"]
    assert kept["cells"][2]["outputs"] == ran["cells"][2]["outputs"]
    assert kept["cells"][2]["execution_count"] == 2
    # the widget state the kept outputs show, and the edition's mark
    assert kept["metadata"]["widgets"] == ran["metadata"]["widgets"]
    assert kept["metadata"]["course_edition"] == "fr"


# --- what the French learner is shown: the committed chapters -----------------------

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _committed(stem, edition="fr"):
    path = translation.built_path(stem) if edition == "fr" else translation.english(stem)
    return json.loads(path.read_text(encoding="utf-8"))


def _state(nb):
    return nb["metadata"].get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


@pytest.mark.parametrize("stem", CHAPTERS)
def test_every_saved_widget_points_to_a_model_the_chapter_keeps(stem):
    nb = _committed(stem)
    views = [o["data"][WIDGET_VIEW]["model_id"] for c in nb["cells"]
             for o in c.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
    missing = [m for m in views if m not in _state(nb)]
    assert not missing, f"{stem}: widget views without their model: {missing}"


@pytest.mark.parametrize("stem", CHAPTERS)
def test_the_saved_widgets_speak_french(stem):
    from course_lib.core import edition

    english = {k for k in edition.catalog("fr") if len(k) > 3}
    texts = [v for model in _state(_committed(stem)).values()
             # a layout's or a style's values are CSS ("display": "none"), not text
             if not model["model_name"].endswith(("LayoutModel", "StyleModel"))
             for v in model.get("state", {}).values() if isinstance(v, str)]
    left = sorted({t for t in texts if t in english})
    assert not left, f"{stem}: English catalog strings in the French widget state: {left}"


@pytest.mark.parametrize("stem", CHAPTERS)
def test_a_french_chapter_has_outputs_where_the_english_one_has(stem):
    def ran(nb):
        return [bool(c.get("outputs")) for c in nb["cells"] if c["cell_type"] == "code"]
    english, french = ran(_committed(stem, "en")), ran(_committed(stem))[1:]  # the switch
    empty = [i for i, (en, fr) in enumerate(zip(english, french, strict=True)) if en and not fr]
    assert not empty, f"{stem}: code cells {empty} have outputs in English only: execute it"


@pytest.mark.parametrize("stem", CHAPTERS)
def test_the_french_prose_is_set_with_french_typography(stem):
    from course_lib.core.typography import breakable

    found = {c["id"]: breakable("".join(c["source"])) for c in _committed(stem)["cells"]
             if c["cell_type"] == "markdown"}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"{stem}: plain spaces where French needs unbreakable ones: {found}"


# --- the build's anti-drift machinery ------------------------------------------------


def test_a_reflowed_english_cell_needs_no_new_translation(tmp_path, monkeypatch):
    entries = {"a": {"en_sha256": translation.source_hash("one two\nthree"), "fr": "un"}}
    _chapter(tmp_path, monkeypatch, [_md("a", "one  two three\n")], entries)
    assert translation.problems("99_x") == []
    _chapter(tmp_path, monkeypatch, [_md("a", "one two four")], entries)
    assert translation.problems("99_x") != []


def test_a_renamed_cell_keeps_its_translation(tmp_path, monkeypatch, capsys):
    entries = {"old": {"en_sha256": translation.source_hash("# Title"), "fr": "# Titre"}}
    _chapter(tmp_path, monkeypatch, [_md("new", "# Title")], entries)
    monkeypatch.setattr(translation, "translated", lambda edition="fr": ["99_x"])
    monkeypatch.setattr(translation, "built_path", lambda stem, edition="fr":
                        tmp_path / "fr" / "99_x.ipynb")
    assert translation.problems("99_x") == []
    assert "".join(translation.build("99_x")["cells"][0]["source"]) == "# Titre"
    assert translation.main([]) == 0
    assert "cell old is now new" in capsys.readouterr().out
    kept = json.loads((tmp_path / "99_x.json").read_text())["cells"]
    assert list(kept) == ["new"] and kept["new"]["fr"] == "# Titre"


def test_a_renamed_code_cell_keeps_its_outputs(tmp_path, monkeypatch):
    code = {"cell_type": "code", "id": "k", "metadata": {}, "execution_count": None,
            "outputs": [], "source": ["print(1)"]}
    entries = {"a": {"en_sha256": translation.source_hash("# Title"), "fr": "# Titre"}}
    _chapter(tmp_path, monkeypatch, [_md("a", "# Title"), code], entries)
    ran = translation.build("99_x")
    ran["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    _chapter(tmp_path, monkeypatch, [_md("a", "# Title"), {**code, "id": "k2"}], entries)
    kept = translation.keep_outputs(translation.build("99_x"), ran)
    assert kept["cells"][2]["id"] == "k2"
    assert kept["cells"][2]["outputs"] == ran["cells"][2]["outputs"]
    changed = {**code, "id": "k2", "source": ["print(2)"]}
    _chapter(tmp_path, monkeypatch, [_md("a", "# Title"), changed], entries)
    with pytest.raises(ValueError, match="execute"):
        translation.keep_outputs(translation.build("99_x"), ran)


def test_a_cell_without_an_id_is_named(tmp_path, monkeypatch):
    cell = {"cell_type": "markdown", "metadata": {}, "source": ["# Title"]}
    _chapter(tmp_path, monkeypatch, [cell], {})
    with pytest.raises(translation.TranslationError, match=r"99_x, cell 0: no id"):
        translation.problems("99_x")


def test_a_stale_chapter_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    fresh = {"a": {"en_sha256": translation.source_hash("# One"), "fr": "# Un"}}
    chapters = {"98_ok": ([_md("a", "# One")], fresh), "99_x": ([_md("a", "# Two")], fresh)}
    for stem, (cells, entries) in chapters.items():
        (tmp_path / f"{stem}.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}}))
        (tmp_path / f"{stem}.json").write_text(json.dumps({"chapter": stem, "cells": entries}))
    monkeypatch.setattr(translation, "english", lambda stem: tmp_path / f"{stem}.ipynb")
    monkeypatch.setattr(translation, "entries_path",
                        lambda stem, edition="fr": tmp_path / f"{stem}.json")
    monkeypatch.setattr(translation, "translated", lambda edition="fr": list(chapters))
    monkeypatch.setattr(translation, "built_path", lambda stem, edition="fr":
                        tmp_path / "fr" / f"{stem}.ipynb")
    assert translation.main([]) == 1
    err = capsys.readouterr().err
    assert "99_x, cell a: the English changed" in err
    assert (tmp_path / "fr" / "98_ok.ipynb").exists()
    assert not (tmp_path / "fr" / "99_x.ipynb").exists()


def test_french_typography_leaves_code_and_formulas_alone():
    from course_lib.core.typography import NBSP, NNBSP, breakable, french

    text = ("Aparté : pourquoi ? « le rang » ; 2 x 3 ... 50 % `a : b` $x : y$ "
            "![img](a?b) [lien](http://x?y)\n```\nx = a ; b\n```\n")
    out = french(text)
    assert out == (f"Aparté{NBSP}: pourquoi{NNBSP}? «{NBSP}le rang{NBSP}»{NNBSP}; 2 × 3 … "
                   f"50{NBSP}% `a : b` $x : y$ ![img](a?b) [lien](http://x?y)\n"
                   "```\nx = a ; b\n```\n")
    assert breakable(text) and not breakable(out)
    assert french(out) == out  # once is enough
    assert french("http://x a:b s[1:2]") == "http://x a:b s[1:2]"
    # after a code span, a formula or a link, the space is the prose's
    after = "`all_reduce` : somme ; $N$ ? [lien](x) : oui"
    assert french(after) == (f"`all_reduce`{NBSP}: somme{NNBSP}; $N${NNBSP}? "
                             f"[lien](x){NBSP}: oui")
    assert len(breakable(after)) == 3 and not breakable(french(after))


def test_a_count_and_a_duration_do_not_wrap():
    from course_lib.core.typography import NBSP, NNBSP, breakable, french

    text = "les 16 971 tokens en 10 s, 30 ms par pas ; le rang 1 s'arrête, 0,5 100 fois"
    out = french(text)
    assert out == (f"les 16{NNBSP}971 tokens en 10{NBSP}s, 30{NBSP}ms par pas{NNBSP}; "
                   "le rang 1 s'arrête, 0,5 100 fois")  # not a unit, nor a count
    assert len(breakable(text)) == 3 and not breakable(out)
    assert french("environ {seconds} s") == f"environ {{seconds}}{NBSP}s"  # a template


def test_french_typography_in_code_sets_the_messages_and_leaves_the_code():
    from course_lib.core.typography import NBSP, NNBSP, french_code

    source = ('d = {"a" : 1}\n'
              'print(f"rang {r} : {a % b} ; {x!r:>10}", "moyennes        :")\n'
              'print("16 971 tokens", f"{{x}} : {d[\'a\']}", b"a : b")  # note : ici\n'
              '!echo "a : b"\n')
    out = french_code(source)
    assert out == ('d = {"a" : 1}\n'
                   f'print(f"rang {{r}}{NBSP}: {{a % b}}{NNBSP}; {{x!r:>10}}", '
                   f'"moyennes       {NBSP}:")\n'
                   f'print("16{NNBSP}971 tokens", f"{{{{x}}}}{NBSP}: {{d[\'a\']}}", b"a : b")'
                   f'  # note{NBSP}: ici\n'
                   '!echo "a : b"\n')
    assert len(out) == len(source)  # a padded column keeps its width
    assert french_code(out) == out
    assert french_code("print('a : b'") == "print('a : b'"  # does not tokenize: as is


@pytest.mark.parametrize("stem", CHAPTERS)
def test_no_french_output_writes_thousands_with_a_comma(stem):
    """112,480 reads as 112,48 to a French reader: the chapters print counts
    through ``number``, which writes 112 480 in the French edition. A French
    decimal (1,315 for 1.315) has the same shape, so what counts is a number
    the English chapter's same cell printed the same way: a count left in
    English (cell by cell: 1,000 is a French decimal in one table, an English
    count in another cell's prompt)."""
    import re

    def commas(edition):
        cells = [c for c in _committed(stem, edition)["cells"] if c["cell_type"] == "code"]
        found = []
        for cell in cells[1:] if edition == "fr" else cells:  # the French switch
            numbers = set()
            for out in cell.get("outputs", []):
                text = out.get("text") or out.get("data", {}).get("text/plain", "")
                text = "".join(text) if isinstance(text, list) else text
                numbers |= set(re.findall(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d,])", text))
            found.append(numbers)
        return found

    found = sorted(n for en, fr in zip(commas("en"), commas("fr"), strict=True)
                   for n in fr & en)
    assert not found, f"{stem}: thousands written with a comma: {found[:5]}"
