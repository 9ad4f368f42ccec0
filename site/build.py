"""``make site``: the course as a static website, both editions, offline.

Run with the site's venv (``.venv-site``, site/requirements.txt), after
``site/generate.py`` has written the generated pages into ``build/site/gen``:

    .venv-site/bin/python site/build.py [--out build/site]

It lays out one Sphinx source folder per edition, ``build/site/src/en`` and
``build/site/src/fr``, from files that are read, never written:

- every chapter (``notebooks/[0-9][0-9]_*.ipynb``, the French ones from
  ``notebooks/fr/``), with its committed outputs and saved widget state, and
  after each widget one line saying how to run it live (``make lab``); the
  links of the chapters are rewritten to where their targets land in the site
  (a page, or a download for a script);
- the docs (``docs/*.md`` and what they show; in an edition that has its own
  page, ``docs/<edition>/<page>.md``, that one in its place), the pages of ``site/pages/``
  (the README's old sections, each including what ``generate.py`` wrote),
  ``ARCHITECTURE.md``, and the home page of each edition (``site/home/``);

then runs Sphinx once per edition, side by side (``site/conf.py``: nothing is
executed, nothing is fetched), into ``build/site/en`` and ``build/site/fr``,
and writes ``build/site/index.html``, which opens both. The browser assets
(require.js and the ipywidgets HTML manager) come from ``site/node_modules``,
installed by ``npm ci`` from ``site/package-lock.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

SITE = Path(__file__).resolve().parent
ROOT = SITE.parent
CHAPTERS = "[0-9][0-9]_*.ipynb"
EDITIONS = {"en": ROOT / "notebooks", "fr": ROOT / "notebooks" / "fr"}
NODE = SITE / "node_modules"
# The vendored browser assets: (package file, its name under _static/).
ASSETS = [(NODE / "requirejs" / "require.js", "require.js"),
          (NODE / "@jupyter-widgets" / "html-manager" / "dist" / "embed-amd.js",
           "embed-amd.js")]
FONTS = NODE / "@jupyter-widgets" / "html-manager" / "dist"
FONT_SUFFIXES = (".woff", ".woff2", ".ttf", ".eot", ".svg")

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LIVE_CLASS = "course-live-note"
LIVE_NOTE = {
    "en": "This widget shows its saved state; to move it, run the chapter live with "
          "<code>make lab</code>.",
    "fr": "Ce widget montre son état enregistré ; pour le faire bouger, exécutez le "
          "chapitre avec <code>make lab</code>.",
}
ENGLISH_ONLY = {
    "en": "",
    "fr": ":::{note}\nCette page de référence n'existe qu'en anglais ; les chapitres, "
          "eux, sont en français.\n:::\n",
}
# The worked solutions open with this, in the instructors' section of the site.
INSTRUCTORS = {
    "en": ":::{warning}\n:class: course-instructors\nFor instructors, and for learners "
          "after the exercises: this page gives every graded answer and why. Make each "
          "chapter's predictions and exercises first.\n:::\n",
    "fr": ":::{warning}\n:class: course-instructors\nPour les enseignants, et pour les "
          "apprenants après les exercices : cette page donne chaque réponse notée et sa "
          "raison (en anglais). Faites d'abord les prédictions et les exercices de chaque "
          "chapitre.\n:::\n",
}
# A Markdown link or image whose target is relative: [text](target) / ![alt](target)
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
HTML_REF = re.compile(r"""((?:src|href)=["'])([^"']+)(["'])""")


class BuildError(RuntimeError):
    pass


def chapters(edition: str) -> list[Path]:
    return sorted(EDITIONS[edition].glob(CHAPTERS))


def own_version(path: Path, edition: str) -> Path:
    """The edition's own version of a file of ``docs/`` (``docs/fr/cheatsheet.md``,
    ``docs/fr/cheatsheet.png``) where it has one, else the file itself."""
    path = path.resolve()
    own = ROOT / "docs" / edition / path.name
    return own if edition != "en" and path.parent == ROOT / "docs" and own.is_file() else path


def docs_pages(edition: str) -> list[tuple[Path, bool]]:
    """Each page of ``docs/`` as the edition shows it, and whether that is
    the English page (the French edition says so under its title)."""
    pages = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        shown = own_version(path, edition)
        pages.append((shown, shown == path.resolve()))
    return pages


def _is_relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^#|^/", target)


def site_path(repo_path: Path, edition: str) -> Path:
    """Where a repository file lands in an edition's source folder (relative)."""
    rel = repo_path.resolve().relative_to(ROOT)
    # the French chapter or docs page takes the English one's place
    if edition == "fr" and rel.parts[:2] in (("notebooks", "fr"), ("docs", "fr")):
        rel = Path(rel.parts[0], *rel.parts[2:])
    if rel.parts[:2] == ("site", "pages"):
        return Path(*rel.parts[2:])
    if rel == Path("ARCHITECTURE.md"):
        return Path("architecture.md")
    if rel == Path("README.md") or rel.parts[:2] == ("site", "home"):
        return Path("index.md")
    return rel


class Layout:
    """One edition's source folder, and the repository files it needs."""

    def __init__(self, edition: str, src: Path):
        self.edition, self.src = edition, src
        self.extra: set[Path] = set()  # repository files linked as downloads or images

    def rewrite(self, text: str, repo_file: Path, site_file: Path) -> str:
        """Relative links of a file moved from repo_file to site_file."""

        def fix(target: str) -> str:
            if not _is_relative(target):
                return target
            path, _, anchor = target.partition("#")
            if not path:
                return target
            found = (repo_file.parent / path).resolve()
            try:
                found.relative_to(ROOT)
            except ValueError:
                return target
            if not found.exists():
                return target  # left as it is: the link check names it
            found = own_version(found, self.edition)
            landed = site_path(found, self.edition)
            if found.suffix not in (".md", ".ipynb"):
                self.extra.add(found)  # a download (a script) or an image: copied
            rel = os.path.relpath(landed, site_file.parent)
            return rel + (f"#{anchor}" if anchor else "")

        text = LINK.sub(lambda m: m.group(1) + fix(m.group(2)) + m.group(3), text)
        return HTML_REF.sub(lambda m: m.group(1) + fix(m.group(2)) + m.group(3), text)

    def write(self, rel: Path, text: str) -> None:
        target = self.src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")

    def copy(self, source: Path, rel: Path) -> None:
        target = self.src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_bytes() != source.read_bytes():
            shutil.copyfile(source, target)

    # --- the pieces -------------------------------------------------------------

    def chapter(self, path: Path) -> str:
        """The chapter as the site shows it: links moved, a live note per widget."""
        nb = json.loads(path.read_text(encoding="utf-8"))
        site_file = site_path(path, self.edition)
        cells = []
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                src = "".join(cell["source"]) if isinstance(cell["source"], list) \
                    else cell["source"]
                cell = {**cell, "source": self.rewrite(src, path, site_file)}
            cells.append(cell)
            if cell["cell_type"] == "code" and any(
                    WIDGET_VIEW in o.get("data", {}) for o in cell.get("outputs", [])):
                cells.append({"cell_type": "markdown", "metadata": {},
                              "id": f"{cell.get('id', len(cells))}-live",
                              "source": f'<p class="{LIVE_CLASS}">'
                                        f"{LIVE_NOTE[self.edition]}</p>"})
        return json.dumps({**nb, "cells": cells}, ensure_ascii=False, indent=1)

    def page(self, source: Path, rel: Path, english_only: bool = False,
             banner: str = "") -> None:
        """A Markdown page, its links moved; under its title, a banner and, in
        the French edition, the note that it is in English."""
        text = self.rewrite(source.read_text(encoding="utf-8"), source, rel)
        if english_only and ENGLISH_ONLY[self.edition]:
            banner = f"{banner}\n{ENGLISH_ONLY[self.edition]}" if banner else \
                ENGLISH_ONLY[self.edition]
        if banner:
            head, sep, body = text.partition("\n")
            text = f"{head}{sep}\n{banner}\n{body}"
        self.write(rel, text)


def chapter_title(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


def chapter_list(edition: str) -> str:
    """The home page's chapter list: every chapter there is, by its own title."""
    return "\n".join(f"- [{chapter_title(p)}](notebooks/{p.name})" for p in chapters(edition))


def assemble(edition: str, src: Path, gen: Path) -> Layout:
    """Lay out one edition's Sphinx source folder."""
    lay = Layout(edition, src)
    wanted: set[Path] = set()

    def note(rel: Path) -> Path:
        wanted.add(rel)
        return rel

    for path in chapters(edition):
        lay.write(note(site_path(path, edition)), lay.chapter(path))
    for path, english in docs_pages(edition):
        lay.page(path, note(Path("docs", path.name)), english_only=english,
                 banner=INSTRUCTORS[edition] if path.name == "solutions.md" else "")
    for path in sorted((SITE / "pages").glob("*.md")):
        lay.page(path, note(Path(path.name)), english_only=True)
    lay.page(ROOT / "ARCHITECTURE.md", note(Path("architecture.md")), english_only=True)
    home = (SITE / "home" / f"{edition}.md").read_text(encoding="utf-8")
    home = home.replace("{{ chapters }}", chapter_list(edition))
    # a page of docs/ that the home page does not name yet joins its reference list
    named = set(re.findall(r"docs/[\w.-]+", home))
    home = home.replace("{{ more_docs }}", "\n".join(
        f"docs/{p.stem}" for p in sorted((ROOT / "docs").glob("*.md"))
        if f"docs/{p.stem}" not in named))
    lay.write(note(Path("index.md")), lay.rewrite(home, SITE / "home" / "x.md",
                                                  Path("index.md")))
    for path in sorted(gen.iterdir()):
        lay.copy(path, note(Path("_gen", path.name)))
    # README.md as a fragment: the pages include its sections (one source)
    lay.copy(ROOT / "README.md", note(Path("_gen", "README.md")))
    for found in sorted(lay.extra):
        if found.is_file():
            lay.copy(found, note(site_path(found, edition)))
    # what an earlier build left and this one does not make
    for old in sorted(src.rglob("*"), reverse=True):
        rel = old.relative_to(src)
        if old.is_file() and rel not in wanted:
            old.unlink()
        elif old.is_dir() and not any(old.iterdir()):
            old.rmdir()
    return lay


def vendor(static: Path) -> None:
    static.mkdir(parents=True, exist_ok=True)
    missing = [str(p) for p, _ in ASSETS if not p.is_file()]
    if missing:
        raise BuildError(f"missing {', '.join(missing)}: run `npm ci` in site/ "
                         "(make site does)")
    for path, name in ASSETS:
        shutil.copyfile(path, static / name)
    for font in FONTS.iterdir():
        if font.suffix in FONT_SUFFIXES:
            shutil.copyfile(font, static / font.name)


def sphinx(edition: str, out: Path, static: Path) -> subprocess.Popen:
    env = {**os.environ, "COURSE_SITE_EDITION": edition,
           "COURSE_SITE_STATIC": str(static),
           "COURSE_SITE_TWIN_SRC": str(out / "src" / ("fr" if edition == "en" else "en")),
           "PYTHONWARNINGS": "ignore"}
    # -a: write every page (each holds the whole navigation), reading only the
    # sources that changed since the last build (build/site/doctrees)
    # Warnings (a broken cross-reference, a missing image) do not stop the build:
    # they land in sphinx-<edition>.log, which tests/test_site.py requires empty.
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-a", "-q",
           "-c", str(SITE), "-d", str(out / "doctrees" / edition),
           str(out / "src" / edition), str(out / edition)]
    with open(out / f"sphinx-{edition}.log", "w") as log:  # the child keeps its copy
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def prune(html: Path, src: Path) -> None:
    """Remove the pages of an earlier build whose source is gone (Sphinx keeps them)."""
    for page in html.rglob("*.html"):
        rel = page.relative_to(html)
        if rel.parts[0] == "_static" or rel.as_posix() in ("genindex.html", "search.html"):
            continue
        stem = rel.with_suffix("")
        if rel.parts[0] == "_gen" or not any((src / f"{stem}{s}").is_file()
                                             for s in (".md", ".ipynb")):
            page.unlink()


ENTRY = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>Token-weighted DDP</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:system-ui,sans-serif;max-width:40rem;margin:4rem auto;
padding:0 1rem;line-height:1.5}}a{{font-size:1.2rem}}</style></head>
<body>
<h1>Token-weighted DDP</h1>
<p>An interactive course on one easy mistake in data-parallel training: averaging each
rank's mean loss weighs tokens unequally. With 12 tokens on one rank and 36 on the other,
a rank-0 token weighs three times as much as a rank-1 token; the course shows the fix and
proves it on real torchrun jobs, on a laptop.</p>
<ul>
<li><a href="en/index.html" hreflang="en">Read the course in English</a> ({n_en} chapters)</li>
<li lang="fr"><a href="fr/index.html" hreflang="fr">Lire le cours en français</a>
({n_fr} chapitres)</li>
</ul>
</body></html>
"""


def build(out: Path) -> dict[str, int]:
    start = time.monotonic()
    gen = out / "gen"
    if not (gen / "cli.md").is_file():
        raise BuildError(f"{gen} has no generated pages: run site/generate.py first "
                         "(make site does)")
    static = out / "static"
    vendor(static)
    for edition in EDITIONS:
        assemble(edition, out / "src" / edition, gen)
    procs = {e: sphinx(e, out, static) for e in EDITIONS}
    failed = []
    for edition, proc in procs.items():
        if proc.wait() != 0:
            failed.append(edition)
    for edition in EDITIONS:
        log = (out / f"sphinx-{edition}.log").read_text()
        if log.strip():
            print(f"--- sphinx, {edition} ---\n{log}", file=sys.stderr)
    if failed:
        raise BuildError(f"Sphinx failed for {', '.join(failed)}: see above")
    for edition in EDITIONS:
        prune(out / edition, out / "src" / edition)
    (out / "index.html").write_text(ENTRY.format(n_en=len(chapters("en")),
                                                 n_fr=len(chapters("fr"))))
    pages = {e: sum(1 for p in (out / e).rglob("*.html")
                    if p.relative_to(out / e).parts[0] != "_static") for e in EDITIONS}
    print(f"site: {out}/index.html, {pages['en']} pages in en/, {pages['fr']} in fr/, "
          f"{time.monotonic() - start:.1f} s")
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    args = parser.parse_args(argv)
    try:
        build(args.out.resolve())
    except BuildError as exc:
        print(f"make site: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
