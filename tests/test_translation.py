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
    built = translation.build(stem)
    committed = json.loads(translation.built_path(stem).read_text(encoding="utf-8"))
    assert translation.same_code(built, committed), (
        f"notebooks/fr/{stem}.ipynb is not the build of the English chapter: "
        "run `make translations`")
    english = json.loads(translation.english(stem).read_text())
    code = [c for c in english["cells"] if c["cell_type"] == "code"]
    french = [c for c in committed["cells"] if c["cell_type"] == "code"][1:]  # the switch
    assert len(code) == len(french)
    for en, fr in zip(code, french, strict=True):  # the code comes from the English
        assert "".join(fr["source"]) == translation.UP.sub(
            r"\1../../", "".join(en["source"]))
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
