import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from course_lib.run import launch, processes
from course_lib.run.forkserver import client as agent_client
from course_lib.run.runfile import LaunchRecord
from tests.conftest import all_gone


def test_auto_backend_on_cpu_is_gloo():
    if launch.gpu_count() >= 2:
        pytest.skip("this host has GPUs: auto picks NCCL")
    p = launch.resolve("auto", 2)
    assert (p.backend, p.device) == ("gloo", "cpu")
    assert "not the NCCL reference path" in p.describe()


def test_an_unknown_backend_is_refused():
    # NCCL without GPUs: test_cli's one-line refusal.
    with pytest.raises(launch.BackendError, match="expected auto, gloo or nccl"):
        launch.resolve("mpi", 2)


def test_torchrun_command_uses_a_free_loopback_port():
    cmd = launch.torchrun_command(Path("run.json"), 2)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    port = cmd[cmd.index("--master-port") + 1]
    assert cmd[cmd.index("--master-addr") + 1] == "127.0.0.1"
    assert port != "29500" and 1024 < int(port) < 65536
    assert cmd[-6:] == ["--start-method", "fork", "--run-path", str(launch.WORKER_ENTRY),
                        "--run-file", "run.json"]
    assert launch.WORKER_ENTRY.is_file()


def test_multinode_arguments_pass_through():
    mn = launch.MultiNode(nnodes=2, rdzv_endpoint="10.0.0.1:29400")
    cmd = launch.torchrun_command(Path("run.json"), 4, mn)
    joined = " ".join(cmd)
    assert "--nnodes 2" in joined
    # torchrun ignores --node-rank under c10d (it warns): every node types this
    assert "--node-rank" not in joined
    assert "--rdzv-endpoint 10.0.0.1:29400" in joined and "--rdzv-backend c10d" in joined
    assert "--master-port" not in joined
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"], "what each node types"


def test_kill_tree_reaches_children_in_other_sessions():
    """torchrun puts workers in sessions of their own; kill_tree must still
    reach them."""
    script = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
              " start_new_session=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while not processes.descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = processes.descendants(proc.pid)
    assert kids, "the grandchild never started"
    processes.kill_tree(proc, grace=2.0)
    assert proc.returncode is not None
    time.sleep(0.2)
    assert not any(processes._alive(k) for k in kids)


def test_max_restarts_pass_through_with_a_fresh_rendezvous_per_round():
    cmd = launch.torchrun_command(Path("run.json"), 2, max_restarts=3)
    joined = " ".join(cmd)
    assert "--max-restarts 3" in joined and "--rdzv-backend c10d" in joined
    endpoint = cmd[cmd.index("--rdzv-endpoint") + 1]
    assert endpoint.startswith("127.0.0.1:") and endpoint != "127.0.0.1:29500"
    assert "--max-restarts 0" in " ".join(launch.torchrun_command(Path("run.json"), 2))


def test_kill_tree_ends_a_stopped_process_group_without_waiting_for_sigkill():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGSTOP)
    processes.kill_tree(proc, grace=30.0)
    assert proc.returncode == -signal.SIGTERM, "SIGCONT let SIGTERM act, no SIGKILL"


def test_launch_phases_split_a_launch_from_its_records(tmp_path):
    import json as _json

    from benchmarks.support import timing

    LaunchRecord(started=100.0, seconds=10.0, world_size=2, jobs=["parity"],
                      returncode=0).append_to(tmp_path)
    LaunchRecord(started=200.0, seconds=5.0, world_size=2, jobs=["smoke"],
                      returncode=-1).append_to(tmp_path)  # failed: no phases
    logs = tmp_path / "logs"
    events = [{"event": "ready", "job": "setup", "rank": 0, "time": 103.0,
               "process_started": 101.5},
              {"event": "start", "job": "parity", "rank": 0, "time": 103.5,
               "spec": {"job": "parity"}},
              {"event": "done", "job": "parity", "rank": 0, "time": 108.0}]
    (logs / "setup-rank0.jsonl").write_text(
        "".join(_json.dumps(e) + "\n" for e in events[:1]))
    (logs / "parity-rank0.jsonl").write_text(
        "".join(_json.dumps(e) + "\n" for e in events[1:]))
    [p] = timing.launch_phases(tmp_path)
    assert (p.jobs, p.total) == (["parity"], 10.0)
    assert (p.agent, p.startup, p.work, p.teardown) == (1.5, 1.5, 4.5, 2.0)
    assert len(LaunchRecord.read_all(tmp_path)) == 2


# --- the agent server (agent.py, agent_client.py) ------------------------------------

SLEEPER = """\
import time
from course_lib.run.forkserver.prctl import die_with_parent
die_with_parent()
print("worker up", flush=True)
time.sleep(60)
"""


def _sleeper_cmd(tmp_path: Path) -> list[str]:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
            "--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
            "--master-port", str(launch.free_port()), "--start-method", "fork",
            "--run-path", str(script)]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _wait_for_worker(agent) -> None:
    seen, fd = b"", agent.stdout.fileno()
    deadline = time.monotonic() + 60
    while b"worker up" not in seen:
        assert time.monotonic() < deadline, f"the worker never started: {seen!r}"
        if select.select([fd], [], [], 1.0)[0]:
            piece = os.read(fd, 4096)
            assert piece, f"the agent's output ended first: {seen!r}"
            seen += piece


def test_agents_fork_from_one_server_each_in_a_session_of_its_own(tmp_path):
    agents = [agent_client.spawn(_sleeper_cmd(tmp_path), _env(), str(tmp_path))
              for _ in range(2)]
    try:
        for agent in agents:
            _wait_for_worker(agent)
        first, second = (psutil.Process(a.pid) for a in agents)
        server = first.parent()
        assert second.parent().pid == server.pid
        assert server.cmdline()[:3] == [sys.executable, "-m", agent_client.SERVER_MODULE]
        shown = Path(f"/proc/{first.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
        assert shown.startswith(f"{sys.executable} -m torch.distributed.run ")
        assert os.getsid(first.pid) == first.pid != os.getsid(0)
        assert first.cwd() == str(tmp_path)
        workers = [p.pid for a in (first, second) for p in a.children(recursive=True)]
        assert len(workers) == 2
    finally:
        for agent in agents:
            processes.kill_tree(agent, grace=2.0)
    assert all(a.returncode is not None and a.returncode != 0 for a in agents)
    assert all_gone([first.pid, second.pid, *workers])
    assert server.is_running(), "the server outlives its agents"


def test_a_killed_server_takes_its_agent_and_the_next_launch_starts_another(tmp_path):
    agent = agent_client.spawn(_sleeper_cmd(tmp_path), _env(), str(tmp_path))
    _wait_for_worker(agent)
    server = psutil.Process(agent.pid).parent()
    worker = psutil.Process(agent.pid).children()[0].pid
    server.kill()
    assert agent.wait(timeout=10) == -signal.SIGKILL
    assert all_gone([agent.pid, worker])
    again = agent_client.spawn(_sleeper_cmd(tmp_path), _env(), str(tmp_path))
    try:
        _wait_for_worker(again)
        assert psutil.Process(again.pid).parent().pid != server.pid
    finally:
        processes.kill_tree(again, grace=2.0)


# --- what a worker imports ------------------------------------------------------------


HOLDS = """
import sys
from course_lib.run.forkserver.prctl import die_with_parent
die_with_parent()
print("worker up", "tabnanny" in sys.modules, flush=True)
"""


def test_a_preload_is_imported_once_by_a_server_of_its_own(tmp_path):
    """Launches that name modules (JobSpec.preload) fork from a server that
    imported them before it forked; the others fork from one that did not, so
    their workers start without them."""
    script = tmp_path / "holds.py"
    script.write_text(HOLDS)
    cmd = [*_sleeper_cmd(tmp_path)[:-1], str(script)]
    seen = {}
    for preload in ((), ("tabnanny",), ("tabnanny",)):
        agent = agent_client.spawn(cmd, _env(), str(tmp_path), preload)
        server = psutil.Process(agent.pid).parent()
        out = agent.stdout.read().decode()
        assert agent.wait(timeout=60) == 0, out
        seen.setdefault(preload, []).append((server.pid, "worker up True" in out))
    (plain,), (warm, again) = seen[()], seen[("tabnanny",)]
    assert plain == (plain[0], False) and warm[1] and again == warm  # one server per set
    assert plain[0] != warm[0] and psutil.Process(warm[0]).cmdline()[-1] == "tabnanny"
    # a module that does not import is left to the worker, which says so itself
    agent = agent_client.spawn(cmd, _env(), str(tmp_path), ("no_such_module_here",))
    assert agent.wait(timeout=60) == 0, agent.stdout.read()


def test_a_frameworks_job_names_what_its_workers_import():
    from course_lib.frameworks import modules
    from course_lib.jobs.frameworks import Configuration, FrameworksJob

    job = FrameworksJob([Configuration("hf", "gpt2"), Configuration("trl", "llama",
                                                                    uses={"lora": {}})])
    assert set(job.preload()) == {"transformers.trainer", "trl.trainer.sft_trainer",
                                  "datasets", "peft",
                                  "transformers.models.gpt2.modeling_gpt2",
                                  "transformers.models.llama.modeling_llama"}
    assert modules(["hf", "unsloth"]) == ()  # Unsloth must import before transformers


def test_a_worker_starts_without_the_frameworks():
    """A worker imports its module and every job kind at start; only the
    frameworks' job imports transformers and its kin, when it runs."""
    heavy = ("transformers", "trl", "accelerate", "lightning", "datasets", "peft",
             "unsloth", "matplotlib", "pandas", "ipywidgets")
    code = ("import sys, course_lib.jobs.worker\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_replay_key_reads_the_files_a_job_reads(tmp_path, cfg):
    """A launch is shared only when its inputs are the same: the learner's
    capstone script and the checkpoint an evaluation reads count, by content."""
    from course_lib.jobs.capstone import CapstoneJob
    from course_lib.jobs.evaluate import EvaluateJob
    from course_lib.run.runfile import RunFile
    from tests.machinery import replay

    script, ckpt = tmp_path / "train.py", tmp_path / "step-0001"
    ckpt.mkdir()

    def key(job):
        return replay.key(RunFile(config=cfg.to_dict(), backend="gloo", device="cpu",
                                  data_dir=str(tmp_path), out=str(tmp_path / "out"),
                                  jobs=[job]))

    keys = []
    for text in ("def step(): pass\n", "def step(): return 1\n"):
        script.write_text(text)
        (ckpt / "model.pt").write_text(text)
        keys.append((key(CapstoneJob(str(script), str(tmp_path / "out"), ["step"])),
                     key(EvaluateJob(str(ckpt)))))
    assert keys[0][0] != keys[1][0], "an edited script is another launch"
    assert keys[0][1] != keys[1][1], "another checkpoint at the same path is another launch"
    assert keys[1] == (key(CapstoneJob(str(script), str(tmp_path / "out"), ["step"])),
                       key(EvaluateJob(str(ckpt)))), "the same files: the same launch"


def test_a_stored_failure_keeps_every_field_of_its_error():
    """A replayed LaunchError reads as the one it copies: the uneven check
    compares ``audited`` with the step it expects to fail (a replay that
    dropped it failed the bug lab, chapter 05, in both editions)."""
    from course_lib.run.launch import LaunchError
    from tests.machinery import replay

    err = LaunchError("rank 1 failed", rank=1, step=3, job="uneven", audited="a_step",
                      log_tail="tail")
    stored = replay._stored_failure(err)
    again = LaunchError(stored.pop("message"), **stored)
    assert str(again) == str(err) and vars(again) == vars(err)
    assert replay._stored_failure(LaunchError("x", rank=0, interrupted=True)) is None
