"""Two torchrun agents on loopback, each with its own --out (no shared disk)."""

import subprocess
import sys

import pytest

from course_lib.jobs.parity import ParityReport
from course_lib.reports.store import report_path
from course_lib.run import launch

pytestmark = [pytest.mark.torchrun, pytest.mark.usefixtures("no_worker_left_behind")]


def test_two_agents_with_separate_outs_both_succeed(tmp_path):
    endpoint = f"127.0.0.1:{launch.free_port()}"
    agents = [subprocess.Popen(
        [sys.executable, "-m", "course_lib", "parity", "--nnodes", "2",
         "--node-rank", str(node), "--rdzv-endpoint", endpoint, "--world-size", "2",
         "--out", str(tmp_path / f"node{node}"), "--timeout", "240"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    results = [a.communicate(timeout=300) for a in agents]
    for agent, (_, stderr) in zip(agents, results):
        assert agent.returncode == 0, stderr
    holders = [n for n in (0, 1)
               if report_path(tmp_path / f"node{n}", "parity").is_file()]
    assert len(holders) == 1, "exactly one node holds global rank 0's report"
    (holder,) = holders
    other = 1 - holder
    assert ParityReport.load(tmp_path / f"node{holder}").passed
    assert "PASS" in results[holder][0]
    said = results[other][0]
    assert "the job succeeded" in said
    assert f"node{holder}/reports/parity.json" in said, said
