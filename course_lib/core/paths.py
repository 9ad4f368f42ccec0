"""Where the course's files live, whatever the current directory is."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout holding configs/ and data/.

    ``COURSE_ROOT`` wins; else the editable install's parent; else the first
    parent of the current directory that has configs/minimum.yaml.
    """
    if os.environ.get("COURSE_ROOT"):
        return Path(os.environ["COURSE_ROOT"]).resolve()
    here = Path(__file__).resolve().parents[2]
    if (here / "configs" / "minimum.yaml").is_file():
        return here
    for parent in [Path.cwd(), *Path.cwd().parents]:
        if (parent / "configs" / "minimum.yaml").is_file():
            return parent
    return Path.cwd()


def config_path(name: str = "minimum") -> Path:
    return project_root() / "configs" / f"{name}.yaml"


def data_dir() -> Path:
    return project_root() / "data"


def default_out(config_name: str) -> Path:
    return project_root() / "runs" / config_name


def generated_data_dir() -> Path:
    """Corpora of configs other than the committed ones (git-ignored)."""
    return project_root() / "runs" / "data"
