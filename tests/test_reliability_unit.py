"""Reliability without torchrun: the progress channel, the run lock, partial
checkpoints, restart bookkeeping, unwritable --out."""

import errno
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from course_lib import cli
from course_lib.core import checkpoint, data, files
from course_lib.core.model import build_model
from course_lib.run import elastic, launch, progress, runlock
from tests.machinery import faults

# --- progress channel ------------------------------------------------------------


@pytest.mark.parametrize("line", [
    "", "garbage \x00\ufffd\ufffd", "@@progress", "@@progress {not json",
    '@@progress {"job": 3, "done": "x", "total": null}', "@@progress [1, 2]",
    "@@progress " + "[" * 100_000, "@@progress " + "x" * (2 << 20),
    '@@progress {"job": "a", "done": true, "total": 2}',
    '@@progress {"job": "a", "done": -1, "total": 2}',
])
def test_malformed_progress_is_text_never_an_exception(line):
    text, msg = progress.split_line(line)
    assert msg is None
    assert line.startswith(text)


def test_progress_after_foreign_bytes_is_still_read():
    line = "Traceback (most rec" + progress.encode("train stop", 2, 10).decode().strip()
    text, msg = progress.split_line(line)
    assert msg == ("train stop", 2, 10, "")
    assert text == "Traceback (most rec"


def test_a_progress_line_fits_one_atomic_pipe_write():
    line = progress.encode("j" * 10_000, 1, 2, "l" * 10_000)
    assert line.startswith(b"\n") and line.endswith(b"\n") and len(line) <= 512
    assert progress.split_line(line.decode().strip())[1][1:3] == (1, 2)


def test_reader_survives_any_byte_stream():
    read_fd, write_fd = os.pipe()
    lines: queue.Queue = queue.Queue()
    with os.fdopen(read_fd, "rb") as stream:
        reader = threading.Thread(target=launch._reader, args=(stream, lines))
        reader.start()
        with os.fdopen(write_fd, "wb") as w:
            w.write(b"".join(faults.NOISE) + bytes(range(256)) * 50)
            w.write(progress.encode("parity", 1, 3))
            w.write(b"no newline at the very end \xff")
        reader.join(timeout=30)
    assert not reader.is_alive()
    got = []
    while (item := lines.get_nowait()) is not None:
        got.append(item)
    assert all(len(x.encode()) <= 4 * launch._MAX_PIECE for x in got)
    assert ("parity", 1, 3, "") in [progress.split_line(x)[1] for x in got]
    assert got[-1].startswith("no newline at the very end")


# --- the run lock -----------------------------------------------------------------


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    refused = pytest.raises(runlock.RunDirInUse, match=f"in use by PID {os.getpid()}")
    with runlock.hold(tmp_path), refused, runlock.hold(tmp_path):
        pass
    with runlock.hold(tmp_path):  # released on exit
        pass


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path):
    code = ("import sys, time; from course_lib.run import runlock\n"
            "with runlock.hold(sys.argv[1]):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(runlock.RunDirInUse, match=f"PID {holder.pid}"), \
            runlock.hold(tmp_path):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    with runlock.hold(tmp_path) as path:
        assert path.read_text().strip() == str(os.getpid())


# --- partial checkpoints ----------------------------------------------------------


def _save(run_dir, step, cfg, corpus):
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = data.make_sampler(cfg, corpus, 2)
    return checkpoint.save(run_dir, step, model=model, optimizer=opt, sampler=sampler,
                           cfg=cfg.with_world_size(1), data_lock=corpus.lock, rank=0,
                           world_size=1, device=torch.device("cpu"))


def test_disk_full_mid_checkpoint_leaves_nothing_that_looks_valid(tmp_path, cfg, corpus,
                                                                  monkeypatch):
    good = _save(tmp_path, 5, cfg, corpus)
    monkeypatch.setattr(files, "write_durably", files.write_durably)
    faults._disk_full_writes()
    with pytest.raises(OSError) as err:
        _save(tmp_path, 10, cfg, corpus)
    assert err.value.errno == errno.ENOSPC
    partial = tmp_path / "checkpoints" / "step-0010.tmp"
    assert partial.is_dir() and any(p.stat().st_size for p in partial.iterdir())
    assert checkpoint.latest_valid(tmp_path) == good
    assert checkpoint.list_checkpoints(tmp_path) == [good]
    with pytest.raises(checkpoint.CheckpointError, match="manifest.json is missing"):
        checkpoint.verify(partial)


# --- restart bookkeeping ----------------------------------------------------------


def test_resume_point_takes_this_launchs_newest_valid_checkpoint(tmp_path, cfg, corpus):
    old = _save(tmp_path, 5, cfg, corpus)
    os.utime(old / checkpoint.TRAINER, (time.time() - 3600,) * 2)
    since = time.time() - 60
    assert elastic.resume_point(tmp_path, 100, since) is None, "older launch: ignored"
    ten = _save(tmp_path, 10, cfg, corpus)
    fifteen = _save(tmp_path, 15, cfg, corpus)
    assert elastic.resume_point(tmp_path, 100, since) == fifteen
    assert elastic.resume_point(tmp_path, 12, since) == ten, "never past the job's stop"
    (fifteen / "model.pt").write_bytes(b"torn")
    assert elastic.resume_point(tmp_path, 100, since) == ten, "invalid: skipped"


def test_restart_records_are_read_back_in_order(tmp_path):
    log = elastic.log_path(tmp_path)
    log.parent.mkdir(parents=True)
    log.write_text(json.dumps({"restart": 2, "run": "stop", "resumed_from_step": 40,
                               "time": 2.0}) + "\n"
                   + "cut by SIGK\n"
                   + json.dumps({"restart": 1, "run": "stop", "resumed_from_step": 15,
                                 "time": 1.0}) + "\n")
    got = elastic.read_restarts([tmp_path])
    assert [(r.restart, r.resumed_from_step) for r in got] == [(1, 15), (2, 40)]
    elastic.clear([tmp_path])
    assert elastic.read_restarts([tmp_path]) == []


# --- unwritable --out --------------------------------------------------------------


def test_unwritable_out_is_one_line_and_exit_2(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert cli.main(["train", "--stop-at", "1", "--out", str(blocker / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Not a directory" in lines[0], lines


def test_notebooks_print_rounding_level_errors_as_a_bound(monkeypatch):
    from course_lib.reports.numbers import err_bound

    assert err_bound(7.450580596923828e-09) == err_bound(3.725290298461914e-09) == "< 1e-7"
    assert err_bound(0.0) == "< 1e-7"
    assert err_bound(0.0064258938655257225) == "= 6.43e-03"
    assert err_bound(None) == "= n/a"
    monkeypatch.setenv("COURSE_EDITION", "fr")  # the French edition's decimal mark
    assert err_bound(0.0064258938655257225) == "= 6,43e-03"


def test_a_launch_error_names_the_audited_step_as_a_field(tmp_path, cfg, corpus):
    from course_lib.rank.context import JobState, RankContext
    from course_lib.run.diagnose import diagnose

    ctx = RankContext(cfg, 0, 2, "gloo", torch.device("cpu"), corpus,
                      JobState(out=tmp_path, job="uneven", audited="a_step,with_a_comma",
                               check="uneven_microbatches"))
    ctx.log("audit_step", step="a_step,with_a_comma")
    # No error of its own (a timeout): the last record names the step.
    found = diagnose(tmp_path, [], 0.0, "timeout", "timed out", [])
    assert found.audited == "a_step,with_a_comma" and found.rank == 0
    ctx.log("error", job=ctx.describe(), step=None, stuck=[1],
            message="StepDesyncError: rank 1 did not finish the step within 10 s")
    found = diagnose(tmp_path, [], 0.0, "error", "exit 1", [])
    assert (found.audited, found.rank) == ("a_step,with_a_comma", 1)
    ctx.logs.close()
