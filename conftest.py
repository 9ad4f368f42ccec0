"""Repository-wide pytest set-up, loaded before tests/ and notebooks/."""

import os
import shutil
import tempfile
from pathlib import Path

from course_lib.run import hooks
from tests.machinery import faults, replay

ROOT = Path(__file__).resolve().parent

# Notebook kernels inherit this: the launcher prints a few stable text lines
# instead of widget state, so nbval compares the same output every time.
os.environ["COURSE_PROGRESS"] = "text"

# The test machinery lives in tests/machinery/, outside the package: the
# launch path imports the modules these variables name (course_lib/run/hooks.py).
# Every process a session starts inherits them, and PYTHONPATH lets the
# notebooks' kernels, the CLI's subprocesses and the workers import them.
HOOKS = {hooks.LAUNCH_HOOK_ENV: replay.__name__, hooks.WORKER_HOOK_ENV: faults.__name__}


def pytest_configure(config):
    """The hooks, and one replay store per session (replay.py), unless `make
    test` already named one for both of its pytest processes."""
    for name, module in HOOKS.items():
        os.environ.setdefault(name, module)
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(ROOT) not in path:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, path)])
    if not os.environ.get(replay.ENV):
        store = tempfile.mkdtemp(prefix="course-replay-")
        os.environ[replay.ENV] = store
        config.add_cleanup(lambda: shutil.rmtree(store, ignore_errors=True))
