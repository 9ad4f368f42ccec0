"""The course's website (``make site``), built once and checked page by page.

The site is built by ``make site`` (``site/generate.py``, then
``site/build.py``); ``make test`` builds it before the lanes and names it in
``COURSE_SITE``, and a narrow run builds it here. Then:

- without a browser: every chapter has its page in both editions; every
  internal link and asset of every page resolves (anchors included); no page
  loads a script, a style sheet or an image from another host; the README is
  a front door and each of its old sections has a home; the generated tables
  are their sources';
- in Debian's Chromium (the browser tests' setup: ``tests/browser/conftest.py``),
  the site served on 127.0.0.1, every page: no request leaves 127.0.0.1,
  no console error and no failed request, every image loaded, math typeset
  where there is math, each widget drawn from its saved state with its
  ``make lab`` line, ``<html lang>`` the edition's, and the language switch
  landing on the twin page;
- the checks fail where they should: on a copy of the built site with a
  planted broken link, a missing image and an external script.

Without /usr/bin/chromium the browser checks skip with one line.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import ROOT

SITE_DIR = ROOT / "site"
EDITIONS = {"en": ROOT / "notebooks", "fr": ROOT / "notebooks" / "fr"}
CHAPTERS = "[0-9][0-9]_*.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
BUILD_TIMEOUT = 600


# --- the built site ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def site() -> Path:
    """The built site: ``COURSE_SITE`` when ``make test`` built it, else built now."""
    given = os.environ.get("COURSE_SITE")
    if given:
        path = Path(given).resolve()
        assert (path / "index.html").is_file(), f"COURSE_SITE={given} holds no built site"
        return path
    if shutil.which("npm") is None:
        pytest.skip("the site needs npm to vendor its scripts (apt-get install nodejs npm)")
    subprocess.run(["make", "--no-print-directory", "site"], cwd=ROOT, check=True,
                   timeout=BUILD_TIMEOUT)
    return ROOT / "build" / "site"


def pages(site: Path) -> list[Path]:
    """Every HTML page of the site (not the theme's own HTML fragments)."""
    return sorted(p for p in site.rglob("*.html")
                  if "_static" not in p.relative_to(site).parts
                  and p.relative_to(site).parts[0] in ("en", "fr", "index.html"))


class _Refs(HTMLParser):
    """The URLs a page refers to, by (tag, attribute), and the ids it holds."""

    LINKS = {("a", "href"), ("link", "href"), ("script", "src"), ("img", "src"),
             ("iframe", "src"), ("source", "src"), ("video", "src"), ("audio", "src")}

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            if (tag, name) in self.LINKS and value:
                self.refs.append((tag, name, value))


@functools.cache
def _parse(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def _external(url: str) -> bool:
    return bool(re.match(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:)?//", url))


def broken_links(site: Path, only: list[Path] | None = None) -> list[str]:
    """'page: tag url (why)' for each internal link or asset that does not
    resolve: a missing file, or an anchor the target page does not hold."""
    found = []
    for page in only or pages(site):
        for tag, _, url in _parse(page).refs:
            if _external(url) or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", url):
                continue  # another host (not loaded: checked below), mailto:, data:
            parts = urllib.parse.urlsplit(url)
            path = urllib.parse.unquote(parts.path)
            target = page if not path else (page.parent / path).resolve()
            if path.endswith("/") or target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(site)}: <{tag}> {url}"
            try:
                target.relative_to(site)
            except ValueError:
                found.append(f"{where} (outside the site)")
                continue
            if not target.is_file():
                found.append(f"{where} (no such file)")
            elif parts.fragment and target.suffix == ".html" and \
                    urllib.parse.unquote(parts.fragment) not in _parse(target).ids:
                found.append(f"{where} (no such anchor)")
    return found


def external_assets(site: Path, only: list[Path] | None = None) -> list[str]:
    """'page: tag url' for each script, style sheet, image or frame from another host."""
    return [f"{page.relative_to(site)}: <{tag}> {url}"
            for page in only or pages(site)
            for tag, attr, url in _parse(page).refs
            if tag != "a" and _external(url)]


# --- without a browser ---------------------------------------------------------------------


def test_every_chapter_has_its_page_in_both_editions(site):
    for edition, folder in EDITIONS.items():
        chapters = sorted(folder.glob(CHAPTERS))
        assert chapters, f"no chapters in {folder}"
        for nb in chapters:
            page = site / edition / "notebooks" / f"{nb.stem}.html"
            assert page.is_file(), f"{nb.relative_to(ROOT)} has no page {page}"
    home = (site / "en" / "index.html").read_text()
    detail = (SITE_DIR / "pages" / "course.md").read_text()
    for nb in sorted(EDITIONS["en"].glob(CHAPTERS)):
        assert f"notebooks/{nb.stem}.html" in home, f"the home page does not list {nb.stem}"
        assert f"`{nb.stem}`" in detail, f"site/pages/course.md has no row for {nb.stem}"


def test_every_page_beyond_the_chapters_is_built(site):
    """The reference pages, the docs, the instructors' section, in both editions."""
    names = ["index", "running", "cli", "audit", "checks", "recipes", "frameworks",
             "evaluation", "measurements", "course", "architecture", "docs/glossary",
             "docs/cheatsheet", "docs/recipes", "docs/framework-versions", "docs/reference-run",
             "docs/troubleshooting", "docs/solutions"]
    for edition in EDITIONS:
        for name in names:
            assert (site / edition / f"{name}.html").is_file(), f"{edition}/{name}.html"
    assert (site / "index.html").is_file()
    fr = (site / "fr" / "index.html").read_text()
    assert '<html lang="fr"' in fr and "Pour les enseignants" in fr
    assert "For instructors, after the exercises" in (site / "en" / "index.html").read_text()
    for edition in EDITIONS:  # the solutions say who they are for, first
        solutions = (site / edition / "docs" / "solutions.html").read_text()
        assert "course-instructors" in solutions, f"{edition}/docs/solutions.html"


def test_the_build_had_no_warning(site):
    """Sphinx's warnings (a cross-reference or an anchor that does not resolve, a
    missing image, a page in no table of contents) are failures here."""
    for edition in EDITIONS:
        log = (site / f"sphinx-{edition}.log").read_text()
        found = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
        assert not found, f"make site, {edition}:\n" + "\n".join(found[:30])


def test_every_internal_link_resolves(site):
    broken = broken_links(site)
    assert not broken, "broken internal links:\n" + "\n".join(broken[:40])


def test_no_page_loads_from_another_host(site):
    found = external_assets(site)
    assert not found, "assets from another host:\n" + "\n".join(found[:40])


def test_every_chapter_shows_its_committed_outputs_and_nothing_ran(site):
    """Each chapter page holds one output block per code cell that has committed
    outputs, and the build is configured never to execute (a kernel would also
    need torch, which the site's venv does not have)."""
    conf = (SITE_DIR / "conf.py").read_text()
    assert 'nb_execution_mode = "off"' in conf
    requirements = (SITE_DIR / "requirements.txt").read_text().lower()
    assert "\ntorch==" not in requirements, "the site's venv has no torch"
    for edition, folder in EDITIONS.items():
        for nb in sorted(folder.glob(CHAPTERS)):
            cells = json.loads(nb.read_text())["cells"]
            with_outputs = sum(1 for c in cells if c["cell_type"] == "code" and c["outputs"])
            html = (site / edition / "notebooks" / f"{nb.stem}.html").read_text()
            shown = html.count('<div class="cell_output docutils container">')
            assert shown == with_outputs, (
                f"{edition}/{nb.stem}: {shown} output blocks, {with_outputs} cells with "
                "committed outputs")


# --- the README, the front door ----------------------------------------------------------


def _headings(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_every_old_readme_section_has_a_home(site):
    mapping = json.loads((SITE_DIR / "readme-sections.json").read_text())["sections"]
    assert len(mapping) == 22, "the README had 22 sections before the site"
    for section, (source, heading, phrase) in mapping.items():
        path = ROOT / source
        assert path.is_file(), f"{section!r}: its home {source} is gone"
        assert heading in _headings(path), f"{section!r}: no heading {heading!r} in {source}"
        assert phrase in path.read_text(encoding="utf-8"), \
            f"{section!r}: its text ({phrase!r}) is not in {source}"
        if source.startswith("site/pages/") or source.startswith("docs/"):
            rel = source.removeprefix("site/pages/").removesuffix(".md") + ".html"
            assert (site / "en" / rel).is_file(), f"{section!r}: no page en/{rel}"


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "the README is a front door: 200 lines at most"
    for must in ("make course", "make test", "make lab", "make site", "pip", "conda",
                 "docker build", "environment.yml"):
        assert must in readme, f"the README does not say {must!r}"
    french = readme.split("## Édition française", 1)
    assert len(french) == 2 and "/fr/" in french[1], "the French section points to /fr/"
    # every file it points to exists
    for target in re.findall(r"\]\(([^)#\s]+)", readme):
        if not _external(target):
            assert (ROOT / target).exists(), f"README links {target}, which is missing"


# --- the generated pages are their sources' ---------------------------------------------------


def _generate():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_site_generate",
                                                  SITE_DIR / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_table_is_the_registrys(site):
    """The checks page's table is each check's name and ``compares``, in order,
    and it is what the built page shows."""
    from course_lib import checks

    table = _generate().check_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert rows == [f"| `{n}` | {c.compares} |" for n, c in checks.CHECKS.items()]
    html = (site / "en" / "checks.html").read_text()
    for name in checks.CHECKS:
        assert f"<code class=\"docutils literal notranslate\"><span class=\"pre\">{name}" \
               f"</span></code>" in html, f"checks.html lacks {name}"


def test_the_recipes_table_says_what_the_real_code_measured(site):
    """One row per recipe, whose last cell says what the matrix says (run, or
    not run), as the README's table did."""
    from course_lib.steps.recipes import RECIPES

    rows = {row[0].strip("`"): row for row in _generate().recipe_rows()}
    assert list(rows) == list(RECIPES)
    html = (site / "en" / "recipes.html").read_text()
    for name, r in RECIPES.items():
        last = rows[name][-1]
        if r.loss_runs:
            assert last.startswith("run (loss function"), (name, last)
        elif r.real:
            assert last.startswith("run: ") and "as predicted" in last, (name, last)
        else:
            assert last.startswith("not run ("), (name, last)
        assert f"<span class=\"pre\">{name}</span>" in html, f"recipes.html lacks {name}"


def test_the_cli_page_is_the_parsers(site):
    from course_lib import cli

    text = _generate().cli_page()
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        assert f"### `{name}`" in text, name
        for action in p._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in text, (name, flag)
    assert (site / "en" / "cli.html").is_file()


# --- in Chromium ----------------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def serve(site) -> Iterator:
    """serve(folder) -> the URL of that folder, served on 127.0.0.1."""
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(_Quiet, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# The page's own checks, in the page: images, math, widgets, lang, the switch.
PAGE_STATE = """() => {
  const imgs = [...document.images];
  return {
    lang: document.documentElement.lang,
    images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    math: document.querySelectorAll('.math').length,
    typeset: document.querySelectorAll('mjx-container').length,
    views: document.querySelectorAll('script[type="WIDGET_VIEW"]').length,
    widgets: document.querySelectorAll('.jupyter-widgets.widget-container, .widget-box')
      .length,
    live: document.querySelectorAll('.course-live-note').length,
    switch: (document.querySelector('a.course-lang-switch') || {}).href || null,
    exact: (document.querySelector('a.course-lang-switch') || {dataset: {}}).dataset.twin,
  };
}""".replace("WIDGET_VIEW", WIDGET_VIEW)


class PageChecker:
    """Opens pages in one browser context and says what is wrong with each."""

    def __init__(self, browser, base: str, site: Path):
        self.base, self.site = base, site
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.set_default_timeout(20_000)
        self.outside: list[str] = []
        self.errors: list[str] = []
        self.context.route("**/*", self._route)
        # one tab for every page, as a reader clicking through: its events
        # land in the lists above, emptied before each page
        self.tab = self.context.new_page()
        self.tab.on("console", lambda m: self.errors.append(f"console error: {m.text}")
                    if m.type == "error" else None)
        self.tab.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.tab.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url}"))
        self.tab.on("response", lambda r: self.errors.append(f"HTTP {r.status}: {r.url}")
                    if r.status >= 400 else None)

    def _route(self, route):
        host = urllib.parse.urlsplit(route.request.url).hostname
        if host == "127.0.0.1" or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def close(self):
        self.context.close()

    def url(self, page: Path) -> str:
        return f"{self.base}/{page.relative_to(self.site).as_posix()}"

    def _wait(self, count: str, n: int) -> None:
        """Until the page holds n elements (JS: count), or 15 s: a shortfall
        is reported by the caller."""
        try:
            self.tab.wait_for_function(f"n => {count} >= n", arg=n, timeout=15_000)
        except Exception:
            pass

    def check(self, path: Path) -> list[str]:
        problems: list[str] = []
        rel = path.relative_to(self.site).as_posix()
        self.outside.clear()
        self.errors.clear()
        self.tab.goto(self.url(path), wait_until="load")
        state = self.tab.evaluate(PAGE_STATE)
        if state["math"]:
            self._wait("document.querySelectorAll('mjx-container').length", state["math"])
        if state["views"]:
            self._wait("document.querySelectorAll('.jupyter-widgets.widget-container, "
                       ".widget-box').length", state["views"])
        if state["math"] or state["views"]:
            state = self.tab.evaluate(PAGE_STATE)
        problems += [f"request to another host: {u}" for u in self.outside]
        problems += self.errors
        problems += [f"image not loaded: {src}" for src in state["broken"]]
        if state["math"] and state["typeset"] < state["math"]:
            problems.append(f"math not typeset: {state['typeset']} of {state['math']}")
        if state["views"]:
            if state["widgets"] < state["views"]:
                problems.append(f"widgets: {state['widgets']} drawn of {state['views']}")
            if state["live"] < 1:
                problems.append("a widget page without its `make lab` line")
        edition = rel.split("/", 1)[0]
        if edition in EDITIONS:
            if state["lang"] != edition:
                problems.append(f"<html lang={state['lang']!r}>, not {edition!r}")
            problems += self._switch(rel, edition, state)
        return [f"{rel}: {p}" for p in problems]

    def _switch(self, rel: str, edition: str, state: dict) -> list[str]:
        if rel.endswith(("genindex.html", "search.html")):
            return []
        if not state["switch"]:
            return ["no language switch"]
        other = "fr" if edition == "en" else "en"
        twin = f"{other}/{rel.split('/', 1)[1]}"
        want = f"{self.base}/{twin}" if (self.site / twin).is_file() else \
            f"{self.base}/{other}/index.html"
        if state["switch"] != want:
            return [f"language switch -> {state['switch']}, not {want}"]
        return []

    def lands_on_twin(self, path: Path) -> str | None:
        """Click the switch; None when it lands on the twin in the other language."""
        rel = path.relative_to(self.site).as_posix()
        edition, rest = rel.split("/", 1)
        other = "fr" if edition == "en" else "en"
        try:
            self.tab.goto(self.url(path), wait_until="domcontentloaded")
            self.tab.locator("a.course-lang-switch").first.click()
            self.tab.wait_for_url(f"**/{other}/{rest}", wait_until="domcontentloaded")
            lang = self.tab.evaluate("() => document.documentElement.lang")
            return None if lang == other else f"{rel}: the twin says lang={lang!r}"
        except Exception as exc:  # a wrong or dead switch
            return f"{rel}: the switch does not land on {other}/{rest}: {exc}"


@pytest.fixture(scope="session")
def checker(browser, serve, site):
    c = PageChecker(browser, serve(site), site)
    yield c
    c.close()


@pytest.mark.browser
def test_every_page_in_chromium(checker, site):
    problems = []
    for page in pages(site):
        problems += checker.check(page)
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:60])


@pytest.mark.browser
def test_the_language_switch_lands_on_the_twin(checker, site):
    """Clicked, both ways, on the first and last chapters and a reference page
    (every page's switch points at its twin: test_every_page_in_chromium)."""
    chapters = sorted(EDITIONS["en"].glob(CHAPTERS))
    picked = [f"notebooks/{chapters[0].stem}.html", f"notebooks/{chapters[-1].stem}.html",
              "cli.html"]
    wrong = [checker.lands_on_twin(site / edition / rel)
             for rel in picked for edition in EDITIONS]
    wrong = [w for w in wrong if w]
    assert not wrong, "\n".join(wrong)


# --- the checks fail where they should -----------------------------------------------------


def _planted_copy(site: Path, tmp: Path) -> Path:
    """A copy of the built site (hard links: files are replaced, never written)."""
    copy = tmp / "site"
    shutil.copytree(site, copy, copy_function=os.link)
    return copy


def _replace(path: Path, text: str) -> None:
    path.unlink()  # break the hard link first: the built site stays as it is
    path.write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def planted(site, tmp_path_factory) -> dict[str, Path]:
    """A copy of the site with three pages broken, one way each."""
    copy = _planted_copy(site, tmp_path_factory.mktemp("planted"))
    link = copy / "en" / "index.html"
    _replace(link, link.read_text().replace(
        "</article>", '<p><a href="notebooks/99_missing.html">gone</a></p></article>', 1))
    chapter = next(p for p in sorted((copy / "en" / "notebooks").glob("*.html"))
                   if "<img" in p.read_text())
    image = re.search(r'<img[^>]*src="([^"]+)"', chapter.read_text())
    assert image, chapter
    (chapter.parent / image.group(1)).unlink()
    script = copy / "en" / "cli.html"
    _replace(script, script.read_text().replace(
        "</head>", '<script src="https://cdn.jsdelivr.net/npm/left-pad/index.js"></script>'
        "</head>", 1))
    return {"link": link, "image": chapter, "script": script, "site": copy}


def test_a_planted_broken_link_fails(planted):
    found = broken_links(planted["site"], [planted["link"]])
    assert any("99_missing.html (no such file)" in f for f in found), found


def test_a_planted_missing_image_fails(planted):
    found = broken_links(planted["site"], [planted["image"]])
    assert any("<img>" in f and "(no such file)" in f for f in found), found


def test_a_planted_external_script_fails(planted):
    found = external_assets(planted["site"], [planted["script"]])
    assert found == ["en/cli.html: <script> https://cdn.jsdelivr.net/npm/left-pad/index.js"]


@pytest.mark.browser
def test_chromium_fails_each_planted_page(planted, browser, serve):
    c = PageChecker(browser, serve(planted["site"]), planted["site"])
    try:
        image = c.check(planted["image"])
        script = c.check(planted["script"])
    finally:
        c.close()
    assert any("image not loaded" in p for p in image), image
    assert any("HTTP 404" in p for p in image), image
    assert any("request to another host: https://cdn.jsdelivr.net/" in p for p in script), \
        script
