"""The one Sphinx configuration of both editions (``make site``).

``site/build.py`` runs Sphinx twice with this file (``-c site``): once on
``build/site/src/en`` and once on ``build/site/src/fr``. The edition and
the paths come from the environment it sets:

- ``COURSE_SITE_EDITION``: ``en`` or ``fr`` (Sphinx's ``language``: the
  theme's labels, ``<html lang>``, the search's stemmer);
- ``COURSE_SITE_STATIC``: the vendored browser assets (require.js and the
  ipywidgets HTML manager, copied from ``site/node_modules``);
- ``COURSE_SITE_TWIN_SRC``: the other edition's source folder, where each
  page looks for its twin (the language switch).

Nothing is executed (``nb_execution_mode = "off"``): the chapters' committed
outputs and saved widget state are the pages. Nothing is fetched, at build
time or in the browser: no intersphinx, MathJax from ``sphinx-mathjax-offline``
and the widget scripts from ``_static/``.
"""

from __future__ import annotations

import os
from pathlib import Path

EDITION = os.environ.get("COURSE_SITE_EDITION", "en")
OTHER = {"en": "fr", "fr": "en"}[EDITION]
STATIC = os.environ.get("COURSE_SITE_STATIC", "")
TWIN_SRC = Path(os.environ.get("COURSE_SITE_TWIN_SRC", "."))
HERE = Path(__file__).resolve().parent

# Words of the site itself, in each edition.
WORDS = {
    "en": {"title": "Token-weighted DDP", "switch": "Français", "switch_title":
           "Cette page en français"},
    "fr": {"title": "DDP pondéré par token", "switch": "English", "switch_title":
           "This page in English"},
}[EDITION]

project = WORDS["title"]
author = "course_lib"
copyright = "the course's authors"  # noqa: A001 (Sphinx's name)
language = EDITION
root_doc = "index"

extensions = ["myst_nb", "sphinx-mathjax-offline"]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "_gen"]  # _gen: included only
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
templates_path = [str(HERE / "_templates")]
html_static_path = [p for p in (STATIC, str(HERE / "_static")) if p]
html_css_files = ["course-site.css"]
# Before the MathJax config and the widgets: see the file (MathJax 3 has no Hub).
html_js_files: list[str | tuple[str, dict[str, int]]] = [("mathjax-hub.js", {"priority": 100})]

# --- notebooks: never executed -------------------------------------------------------
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "html_image"]
myst_heading_anchors = 3
myst_dmath_double_inline = True
# The widgets' scripts, vendored: require.js, then the HTML manager (its AMD
# build bundles @jupyter-widgets/base and controls, every module the chapters use).
nb_ipywidgets_js: dict[str, dict[str, str]] = {"require.js": {}, "embed-amd.js": {}}

# --- HTML ----------------------------------------------------------------------------
# "--out" stays two hyphens, 'quotes' stay straight: the pages are code's neighbours
smartquotes = False
html_theme = "sphinx_book_theme"
html_title = WORDS["title"]
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "article_header_end": ["lang-switch.html", "article-header-buttons.html"],
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "use_source_button": False,
    "use_issues_button": False,
    "use_edit_page_button": False,
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
    "search_bar_text": {"en": "Search the course…", "fr": "Rechercher…"}[EDITION],
}
# a fixed default colour mode: with none, the theme logs "invalid theme mode" (a console error)
html_context = {"course_edition": EDITION, "default_mode": "light"}
# a shell escape (`!cd ...`) in a code cell is not IPython the lexer knows
suppress_warnings = ["mystnb.unknown_mime_type", "misc.highlighting_failure"]


def _twin(app, pagename: str) -> str | None:
    """The relative URL of this page in the other edition, or of its home."""
    depth = pagename.count("/")
    up = "../" * (depth + 1)
    for suffix in (".md", ".ipynb"):
        if (TWIN_SRC / f"{pagename}{suffix}").is_file():
            return f"{up}{OTHER}/{pagename}.html"
    return f"{up}{OTHER}/index.html" if pagename != "genindex" else None


def _page_context(app, pagename, templatename, context, doctree) -> None:
    context["course_twin_url"] = _twin(app, pagename)
    context["course_twin_label"] = WORDS["switch"]
    context["course_twin_title"] = WORDS["switch_title"]
    context["course_twin_lang"] = OTHER
    context["course_twin_exact"] = any(
        (TWIN_SRC / f"{pagename}{s}").is_file() for s in (".md", ".ipynb"))


def setup(app):
    app.connect("html-page-context", _page_context)
    return {"parallel_read_safe": True}
