"""What import-linter cannot see: the package reaching its own face, or a
module named by a string.

``import course_lib`` inside the package runs the face's lazy lookup, so a
module low in the stack can reach the course layer at the top without an
import that the layer contracts see (frameworks/trl_grpo.py once did). And
``importlib.import_module("...")`` hides any dependency. Both are refused,
but for the few modules whose job is to load by name.
"""

import ast
import json
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "course_lib"
SUBMODULES = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
              if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
# module -> why it may load by name
BY_NAME = {
    "steps/registry.py": "a learner's step: package.module:function or file.py:function",
    "run/hooks.py": "the test machinery, named by an environment variable",
    "frameworks/__init__.py": "an adapter by its framework's name; installed versions",
    "frameworks/source.py": "the installed frameworks' modules whose lines chapters "
                            "07 and 08 print (third-party, never course_lib)",
    "course/grading.py": "an answer's report class, loaded only when a question is graded",
    "run/forkserver/server.py": "what a launch's jobs will import (JobSpec.preload: a "
                                "framework's modules, third-party), once before the forks",
}


def violations(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "course_lib":
                    found.append(f"{where}:{node.lineno}: import course_lib (the face)")
                if alias.name.split(".")[0] == "importlib" and where not in BY_NAME:
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.module == "course_lib":
                for alias in node.names:
                    if alias.name not in SUBMODULES:
                        found.append(f"{where}:{node.lineno}: from course_lib import "
                                     f"{alias.name} (a name of the face)")
            if (node.module or "").split(".")[0] == "importlib" and where not in BY_NAME:
                found.append(f"{where}:{node.lineno}: from {node.module} import ...")
    return found


@pytest.mark.parametrize("path", sorted(p for p in PACKAGE.rglob("*.py")
                                        if p != PACKAGE / "__init__.py"),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_reaches_the_face_or_loads_by_name(path):
    where = str(path.relative_to(PACKAGE))
    assert not violations(path.read_text(), where)


def test_the_rule_catches_a_planted_violation():
    assert violations("import course_lib\n", "frameworks/x.py")
    assert violations("def f():\n    from course_lib import corpus\n", "jobs/x.py")
    assert violations("import importlib\n", "jobs/x.py")
    assert violations("from importlib import import_module\n", "core/x.py")
    assert not violations("from course_lib import checks, frameworks\n", "jobs/x.py")
    assert not violations("import importlib\n", "steps/registry.py")
    assert {"checks", "core", "jobs", "cli"} <= SUBMODULES


def test_the_allowlist_is_not_stale():
    for where in BY_NAME:
        assert "importlib" in (PACKAGE / where).read_text(), f"{where} no longer needs it"


# --- the face: every name it exports is reached ----------------------------------------

FACE_IMPORT = re.compile(r"from course_lib import \(([^)]*)\)|from course_lib import ([^\n(]+)")
FACE_ATTRIBUTE = re.compile(r"(?<![\w.])course_lib\.(\w+)")


def _reached(text: str) -> set[str]:
    found = set(FACE_ATTRIBUTE.findall(text))
    for m in FACE_IMPORT.finditer(text):
        found |= set(re.findall(r"\w+", re.sub(r"#.*", "", m.group(1) or m.group(2))))
    return found


def test_every_face_name_is_reached_by_a_chapter_test_doc_or_example():
    import course_lib

    texts = []
    for nb in sorted((ROOT / "notebooks").glob("**/*.ipynb")):  # both editions
        cells = json.loads(nb.read_text())["cells"]
        texts += ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    for folder, pattern in (("tests", "*.py"), ("docs", "*.md"), ("examples", "*"),
                            ("benchmarks", "*.py"), ("scripts", "*.py")):
        texts += [p.read_text(errors="replace") for p in sorted((ROOT / folder).rglob(pattern))
                  if p.is_file() and p != Path(__file__)]
    texts += [(ROOT / "README.md").read_text()]
    reached = set().union(*map(_reached, texts))
    unreached = sorted(set(course_lib._EXPORTS) - reached)
    assert not unreached, f"face names nothing reaches (drop them): {unreached}"


def test_the_reach_rule_on_examples():
    found = _reached("from course_lib import (\n    check,  # x\n    quiz,\n)")
    assert found == {"check", "quiz"}
    assert _reached("x = course_lib.train(cfg)\ny = my.course_lib.nope") == {"train"}
