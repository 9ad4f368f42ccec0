"""Find a step by its SPEC: a built-in name, a recipe, ``module:function`` or
``path/to/file.py:function``. The one place that knows every kind of step,
so the catalog and the recipes never import each other's loader."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from course_lib.steps.base import StepInfo, StepSpecError
from course_lib.steps.catalog import BUILTIN
from course_lib.steps.objectives import STEPS as OBJECTIVE_STEPS
from course_lib.steps.recipes import RECIPES

__all__ = ["BUILTIN", "RECIPES", "StepInfo", "StepSpecError", "load", "load_function"]


def load(spec: str) -> StepInfo:
    """A built-in name, a recipe's name, ``package.module:function`` or
    ``path/to/file.py:function``."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    if spec in RECIPES:
        return RECIPES[spec].step
    if spec in OBJECTIVE_STEPS:
        return OBJECTIVE_STEPS[spec]
    if ":" not in spec:
        known = ", ".join(BUILTIN)
        raise StepSpecError(f"--step: {spec!r} is not a built-in step ({known}), "
                            "a recipe (course-lib recipes) "
                            "nor module:function or file.py:function")
    func = load_function(spec, "--step")
    doc = (func.__doc__ or "").strip().splitlines()
    return StepInfo(spec.rpartition(":")[2], func, "custom", doc[0] if doc else spec, "")


def load_function(spec: str, flag: str) -> Callable[..., Any]:
    """A learner's function, ``package.module:function`` or
    ``path/to/file.py:function``; StepSpecError (bad input, one line) names
    ``flag`` when it names nothing callable."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise StepSpecError(f"{flag}: expected module:function or file.py:function, "
                            f"got {spec!r}")
    if where.endswith(".py"):
        module = _module_from_file(Path(where), flag)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise StepSpecError(f"{flag}: cannot import {where!r}: {exc}") from None
    func = getattr(module, name, None)
    if not callable(func):
        raise StepSpecError(f"{flag}: {where} has no function {name!r}")
    return func


def _module_from_file(path: Path, flag: str):
    if not path.is_file():
        raise StepSpecError(f"{flag}: no such file: {path}")
    name = f"course_user_step_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise StepSpecError(f"{flag}: {path} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # a learner's file: any error is bad input
        raise StepSpecError(f"{flag}: {path} failed to import: "
                            f"{type(exc).__name__}: {exc}") from None
    return module
