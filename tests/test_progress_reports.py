import io
import json

import pytest

from course_lib.jobs.parity import ParityReport
from course_lib.jobs.resume import ResumeReport
from course_lib.reports import store as reports
from course_lib.run import progress


def test_text_progress_prints_a_start_and_an_end_line_per_task():
    buf = io.StringIO()
    sink = progress.TextProgress(buf)
    for step in range(1, 51):
        sink.update("train stop", step, 50)
    sink.update("train continuous", 1, 100)
    assert buf.getvalue().splitlines() == [
        "[train stop] started", "[train stop] 50/50 done", "[train continuous] started"]


def test_widget_progress_tracks_the_job(capsys):
    sink = progress.WidgetProgress()
    sink.update("parity", 2, 3)
    assert (sink.bar.value, sink.bar.max) == (2, 3)
    assert sink.text.value.startswith("parity: 2/3")
    sink.close()
    assert sink.bar.bar_style == "success"


@pytest.mark.parametrize("mode,cls", [("text", progress.TextProgress),
                                      ("tqdm", progress.TqdmProgress),
                                      ("none", progress.Progress)])
def test_make_honours_course_progress(monkeypatch, mode, cls):
    monkeypatch.setenv("COURSE_PROGRESS", mode)
    assert type(progress.make()) is cls


def test_reports_round_trip_as_typed_objects(tmp_path):
    data = {"world_size": 2, "backend": "gloo", "device": "cpu", "dtype": "float32",
            "compared_values": 3, "atol": 1e-6, "rtol": 1e-4, "local_tokens": [1, 2],
            "global_tokens": 3, "passed": True, "control": "x", "nccl_reference_path": False,
            "torch": "2.x", "step": 0, "window_loss_per_token": 1.5, "no_sync": {},
            "grad_sample": {"index": [0], "reference": [0.5], "global_token": [0.5],
                            "mean_of_means": [0.25]}, "future_field": 1,
            "modes": {"global_token": {"max_abs_err": 0.0, "allclose": True, "violations": 0},
                      "mean_of_means": {"max_abs_err": float("nan"), "allclose": False,
                                        "violations": 3}}}
    path = reports.write(tmp_path, "parity", data)
    assert "NaN" not in path.read_text(), "strict JSON: NaN becomes null"
    p = ParityReport.load(tmp_path)
    assert p.correct.allclose and p.control_mode.max_abs_err is None
    assert p.nccl_reference_path is False and p.grad_sample.reference == [0.5]
    assert p.grad_sample["mean_of_means"] == [0.25], "the chapters index it by key"
    assert list(p.grad_sample) == ["index", "reference", "global_token", "mean_of_means"]
    assert p.extra == {"future_field": 1}, "unknown keys are kept, not lost"
    del data["modes"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="ParityReport lacks key 'modes'"):
        ParityReport.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no resume report"):
        ResumeReport.load(tmp_path)
