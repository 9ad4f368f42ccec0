import contextlib
import dataclasses
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import course_lib
from course_lib import cli
from course_lib.core import paths
from course_lib.run import processes
from tests.machinery import replay

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("COURSE_PROGRESS", "none")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        pytest.skip("browser tests need Debian's Chromium at /usr/bin/chromium "
                    "(apt-get install chromium)")
    return CHROMIUM


@pytest.fixture(scope="session")
def browser(chromium_path):
    """One Playwright and one Chromium for the session: Playwright's sync API
    refuses a second instance while one is open, so the lab's tests and the
    site's page checks share this one."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(chromium_path), headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(autouse=True)
def launch_for_real(monkeypatch):
    """Tests launch their own jobs. Only module- and session-scoped fixtures
    (set up before this runs) may share a launch with the chapters; today the
    bug catalog and the protocol's launches do."""
    monkeypatch.delenv(replay.ENV, raising=False)


@pytest.fixture(scope="session")
def cfg():
    return course_lib.load_config(ROOT / "configs" / "minimum.yaml")


@pytest.fixture(scope="session")
def corpus(cfg):
    return course_lib.corpus(cfg)


@pytest.fixture(scope="session")
def data_dir():
    return paths.data_dir()


def course_lib_cli(*args, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``course-lib ARGS`` run by ``cli.main`` in this process: its exit code,
    stdout and stderr, without the 2 s a fresh interpreter spends importing
    torch. test_cli runs the installed entry point itself, in subprocesses."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's --help
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return subprocess.CompletedProcess(["course-lib", *argv], code, out.getvalue(),
                                       err.getvalue())


def with_train(cfg, **changes):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes))


# A torchrun agent's command line names the worker: its fork-server entry,
# or the worker module on the plain path.
AGENT_MARKERS = (b"course_lib/jobs/worker_entry.py", b"-m course_lib.jobs.worker ")
WORKER_TITLE = b"course-lib worker rank "  # every worker's title (run/processes.py)


def is_job(cmdline: bytes, ours: bytes = sys.executable.encode()) -> bool:
    """Whether a /proc cmdline (NULs as spaces) is one of the course's torchrun
    agents run with this checkout's interpreter, or a worker."""
    return (cmdline.startswith(WORKER_TITLE)
            or cmdline.startswith(ours) and any(m in cmdline for m in AGENT_MARKERS))


def worker_processes(within: Path | None = None) -> list[int]:
    """PIDs of the course's torchrun jobs: the agents (run with this
    checkout's interpreter) and the workers, by their titles. With
    ``within``, only those whose run file or run directory lies below that
    folder (so other test sessions are not counted)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if is_job(cmd) and state != "Z" and (
                within is None or str(within).encode() in cmd):
            found.append(int(entry))
    return found


def all_gone(pids: list[int], within: float = 10.0) -> bool:
    """Whether every one of ``pids`` has exited (zombies count) within ``within`` s."""
    deadline = time.monotonic() + within
    while any(processes._alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(processes._alive(p) for p in pids)


def nothing_survives(tmp_path_factory, grace: float):
    """Fixture body: every torchrun agent and worker the test started (its
    run file lies under this session's temporary folder) is gone within
    ``grace`` seconds after it."""
    mine = tmp_path_factory.getbasetemp()
    before = set(worker_processes(within=mine))
    yield
    deadline = time.monotonic() + grace
    while set(worker_processes(within=mine)) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(worker_processes(within=mine)) - before, \
        "a torchrun agent or worker survived its job"


@pytest.fixture
def popen():
    """``subprocess.Popen`` for one test: whatever still runs when the test
    ends (an assertion failed first) is killed, and the job it launched goes
    with it (agent.py)."""
    started = []

    def start(*args, **kw) -> subprocess.Popen:
        started.append(subprocess.Popen(*args, **kw))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def no_worker_left_behind(tmp_path_factory):
    yield from nothing_survives(tmp_path_factory, grace=5)
