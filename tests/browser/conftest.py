"""A real JupyterLab server and a real Chromium for the browser tests.

The server runs from the interpreter's own environment on 127.0.0.1 with a
free port, a random token and an isolated HOME/Jupyter/IPython state under a
temporary directory. JupyterLab's news, update checks and autosave are off.
The notebook sources must be byte-for-byte unchanged afterwards, and no
process started by the server (kernels included) may outlive it.

Chromium is Debian's /usr/bin/chromium driven by Playwright's Python API;
``playwright install`` is never run. Without that binary the tests skip.
``COURSE_BROWSER_NOTEBOOKS`` points the server at another notebook directory
(for developing the harness); by default it serves ``<repo>/notebooks``.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "runs" / "screenshots"
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0

# User settings for the isolated JupyterLab (plugin id -> settings).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension:notification": {
        "fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    # every cell in the DOM, so committed outputs can be counted and checked
    # and no "Select Kernel" dialog racing the kernelspec fetch on open
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none",
                                               "autoStartDefaultKernel": True},
}


@dataclass
class LabServer:
    url: str
    token: str
    root_dir: Path
    proc: subprocess.Popen
    log: Path
    marker: str
    seen_children: set[tuple[int, str]] = field(default_factory=set)

    def app_url(self) -> str:
        return f"{self.url}/lab?token={self.token}"

    def api(self, path: str, auth: bool = True, timeout: float = 10.0):
        req = urllib.request.Request(f"{self.url}{path}")
        if auth:
            req.add_header("Authorization", f"token {self.token}")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"

    def remember_children(self) -> None:
        """Note every live descendant (kernels) so teardown can prove it is gone."""
        self.seen_children |= descendants(self.proc.pid)


# --- /proc helpers ------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie has exited already
        return None
    return int(fields[1]), fields[19]


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def descendants(root: int) -> set[tuple[int, str]]:
    """(pid, start time) of every live process whose parent chain includes root."""
    parents = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st:
            parents[pid] = st
    found = set()
    for pid, (_, start) in parents.items():
        cur, hops = pid, 0
        while cur in parents and hops < 64:
            cur, hops = parents[cur][0], hops + 1
            if cur == root:
                found.add((pid, start))
                break
    return found


def _alive(pid: int, start: str) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start


def carrying_marker(marker: str) -> set[int]:
    """Processes whose environment carries this session's marker (reparented too)."""
    needle = f"COURSE_BROWSER_SESSION={marker}".encode()
    found = set()
    for pid in _all_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and _stat(pid) is not None:
            found.add(pid)
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _snapshot(directory: Path) -> dict[str, str]:
    """sha256 of every file under directory, by relative path."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# --- fixtures -----------------------------------------------------------------


def _write_settings(base: Path, data_dir: Path) -> Path:
    settings_dir = base / "lab-settings"
    for plugin, values in LAB_SETTINGS.items():
        package, _, name = plugin.partition(":")
        target = settings_dir / package / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values, indent=2))
    # overrides.json too: it wins over the user settings of any JupyterLab 4.x
    overrides = data_dir / "lab" / "settings" / "overrides.json"
    overrides.parent.mkdir(parents=True, exist_ok=True)
    overrides.write_text(json.dumps(LAB_SETTINGS, indent=2))
    return settings_dir


def _write_server_config(config_dir: Path) -> None:
    """No news feed, no update check, no language server (it would write
    .virtual_documents into the notebook directory)."""
    lab = {"news_url": None,
           "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate"}
    server = {"jpserver_extensions": {"jupyter_lsp": False}}
    for name in ("jupyter_server_config.json", "jupyter_lab_config.json"):
        (config_dir / name).write_text(json.dumps({"LabApp": lab, "ServerApp": server}))


@pytest.fixture(scope="session")
def lab_server(chromium_path, tmp_path_factory) -> LabServer:
    root_dir = Path(os.environ.get("COURSE_BROWSER_NOTEBOOKS", ROOT / "notebooks")).resolve()
    assert root_dir.is_dir(), f"notebook directory {root_dir} is missing"
    jupyter = Path(sys.executable).parent / "jupyter"
    assert jupyter.exists(), f"jupyter not found next to {sys.executable}"
    base = tmp_path_factory.mktemp("lab")
    dirs = {name: base / name for name in
            ("home", "config", "data", "runtime", "ipython", "workspaces", "checkpoints")}
    for d in dirs.values():
        d.mkdir()
    settings_dir = _write_settings(base, dirs["data"])
    _write_server_config(dirs["config"])
    token, port, marker = secrets.token_hex(24), _free_port(), secrets.token_hex(8)
    env = {**os.environ,
           "HOME": str(dirs["home"]),
           "JUPYTER_CONFIG_DIR": str(dirs["config"]),
           "JUPYTER_DATA_DIR": str(dirs["data"]),
           "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
           "IPYTHONDIR": str(dirs["ipython"]),
           "JUPYTERLAB_SETTINGS_DIR": str(settings_dir),
           "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
           "COURSE_PROGRESS": "text",
           "COURSE_BROWSER_SESSION": marker,
           "PYTHONUNBUFFERED": "1"}
    env.pop("JUPYTER_TOKEN", None)
    cmd = [str(jupyter), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root_dir}",
           # checkpoints (created when a notebook opens) stay out of the sources
           f"--FileCheckpoints.checkpoint_dir={dirs['checkpoints']}",
           f"--LabApp.user_settings_dir={settings_dir}",
           f"--LabApp.workspaces_dir={dirs['workspaces']}",
           # window.jupyterapp, as JupyterLab's own browser tests (Galata) use it:
           # the tests open each chapter in the page already loaded
           "--LabApp.expose_app_in_browser=True"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    before = _snapshot(root_dir)
    log = base / "server.log"
    with open(log, "wb") as log_fh:
        proc = subprocess.Popen(cmd, env=env, cwd=dirs["home"], stdout=log_fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = LabServer(url=f"http://127.0.0.1:{port}", token=token, root_dir=root_dir,
                       proc=proc, log=log, marker=marker)
    try:
        _wait_ready(server)
        yield server
    finally:
        leftovers = _stop(server)
    assert not leftovers, f"processes outlived the Jupyter server: {leftovers}"
    after = _snapshot(root_dir)
    assert after == before, (
        "files under the notebook directory changed during the browser session "
        "(the browser tests must never write notebook sources): "
        f"{sorted(set(after.items()) ^ set(before.items()))}")


def _wait_ready(server: LabServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {server.proc.returncode}:\n"
                        f"{server.log_tail()}")
        try:
            status, body = server.api("/api/status", timeout=3)
            if status == 200 and isinstance(body, dict) and "started" in body:
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.25)  # polling interval, not a correctness wait
    pytest.fail(f"jupyter lab not ready after {START_TIMEOUT:.0f} s:\n{server.log_tail()}")


def _stop(server: LabServer) -> list[str]:
    """SIGTERM, then SIGKILL; return what survived (after killing it)."""
    server.remember_children()
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
    # kernels exit on their own once their parent is gone; give them time
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        alive = {(p, s) for p, s in server.seen_children if _alive(p, s)}
        marked = carrying_marker(server.marker) - {os.getpid()}
        if not alive and not marked:
            return []
        time.sleep(0.25)
    survivors = sorted({p for p, _ in alive} | marked)
    report = []
    for pid in survivors:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            report.append(f"{pid}: {cmdline.decode(errors='replace')[:200]}")
            os.kill(pid, signal.SIGKILL)  # clean up what we started, then fail
        except (OSError, ProcessLookupError):
            pass
    return report


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.course_call_failed = report.failed


@pytest.fixture(scope="session")
def lab_page(browser, lab_server):
    """One JupyterLab page for the session. Loading the app costs Chromium
    several CPU-seconds; each test opens its chapter in a new tab of this one
    (``_open`` in test_lab.py), as a learner would."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors
    try:
        pg.goto(lab_server.app_url())
        pg.wait_for_function("() => window.jupyterapp !== undefined")
        pg.evaluate("async () => { await window.jupyterapp.started;"
                    " await window.jupyterapp.restored; }")
        yield pg
    finally:
        lab_server.remember_children()
        context.close()


@pytest.fixture
def page(request, lab_page, lab_server):
    """The session's page; a screenshot and the server log when the test fails."""
    yield lab_page
    lab_server.remember_children()
    if getattr(request.node, "course_call_failed", False):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        lab_page.screenshot(path=str(SCREENSHOTS / f"{request.node.name}-failure.png"))
        print(f"page errors: {lab_page.errors}\nserver log tail:\n{lab_server.log_tail()}")


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
