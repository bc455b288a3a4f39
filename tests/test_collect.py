"""``txlearn collect`` on a synthetic bulk download of each LMS's layout (Canvas's flat zip with
its late marker and -N resubmissions, Moodle's folder per participant, Gradescope's export with
submission_metadata.yml): the student folders, the notebooks and manifest.csv; a wrong layout
named; a submitted time nobody gave flagged in the gradebook and warned about."""

import csv
import io
import json
import unicodedata
import zipfile
from pathlib import Path

import pytest

from txlearn import cli
from txlearn.course.gradebook.course import Course, load_course, parse_time
from txlearn.course.lms.collect import CollectError, collect

NB = {name: json.dumps({"cells": [], "metadata": {"who": name}}).encode()
      for name in ("alice", "bob0", "bob1", "jose", "lee1", "lee2")}
COURSE = """\
sets:
  01_softmax: {deadline: "2026-10-05 23:59"}
roster:
  alice: {name: "Liddell, Alice", email: alice@uni.example, canvas_id: 5512}
"""


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def _manifest(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def course(tmp_path):
    (tmp_path / "course.yaml").write_text(COURSE)
    return load_course(tmp_path / "course.yaml")


def test_canvas_download(tmp_path, course):
    jose = unicodedata.normalize("NFD", "garcíajosé")      # as a macOS archive keeps it
    download = _zip(tmp_path / "canvas.zip", {
        "liddellalice_5512_9001_01_softmax.ipynb": NB["alice"],
        "smithbob_late_5513_9002_01_softmax.ipynb": NB["bob0"],
        "smithbob_late_5513_9003_01_softmax-1.ipynb": NB["bob1"],     # uploaded again: latest
        f"{jose}_5514_9004_01_softmax.ipynb": NB["jose"],
        "leejin_5515_9005_01_softmax.ipynb": NB["lee1"],
        "leejin_5516_9006_01_softmax.ipynb": NB["lee2"],             # another Jin Lee
        "liddellalice_5512_9007_notes.txt": b"not a notebook"})
    out = tmp_path / "submissions"
    rows, notes = collect(download, out, layout="canvas", course=course)
    folders = sorted(p.parent.name for p in out.glob("*/01_softmax.ipynb"))
    # alice by her roster entry's Canvas id; José's name in NFC; two leejin told apart by id
    assert folders == sorted(["alice", "smithbob", "garcíajosé", "leejin_5515", "leejin_5516"])
    assert (out / "smithbob" / "01_softmax.ipynb").read_bytes() == NB["bob1"]
    assert (out / "alice" / "01_softmax.ipynb").read_bytes() == NB["alice"]
    manifest = {r["student"]: r for r in _manifest(out / "manifest.csv")}
    assert manifest["smithbob"] == {
        "student": "smithbob", "set": "01_softmax", "submitted_at": "", "lms": "canvas",
        "lms_key": "smithbob_5513_9003", "lms_late": "yes",
        "file": "smithbob_late_5513_9003_01_softmax-1.ipynb"}
    assert manifest["alice"]["lms_late"] == "" and manifest["alice"]["lms_key"] == \
        "liddellalice_5512_9001"
    assert len(rows) == 5
    assert any("no submission time" in n for n in notes), notes
    assert any("1 earlier resubmission" in n for n in notes), notes
    # the course file reads a manifest without times: those notebooks fall back to file times
    (out / "course.yaml").write_text(COURSE)
    assert load_course(out / "course.yaml").manifest == {}


def test_moodle_download(tmp_path):
    download = _zip(tmp_path / "moodle.zip", {
        "Alice Liddell_301_assignsubmission_file_/01_softmax.ipynb": NB["alice"],
        "José García_302_assignsubmission_file/01_softmax.ipynb": NB["jose"],   # Moodle 4.1+
        "José García_302_assignsubmission_file/.DS_Store": b""})
    out = tmp_path / "submissions"
    rows, notes = collect(download, out, layout="moodle")
    assert sorted(r["student"] for r in rows) == ["Alice Liddell", "José García"]
    assert (out / "José García" / "01_softmax.ipynb").read_bytes() == NB["jose"]
    manifest = {r["student"]: r for r in _manifest(out / "manifest.csv")}
    assert manifest["José García"]["lms_key"] == "José García_302"
    assert manifest["Alice Liddell"]["submitted_at"] == ""
    assert any("Moodle's download carries no submission time" in n for n in notes), notes


def test_gradescope_export_with_its_times(tmp_path, course):
    root = tmp_path / "export" / "assignment_77_export"
    (root / "submission_11").mkdir(parents=True)
    (root / "submission_12").mkdir()
    (root / "submission_11" / "01_softmax.ipynb").write_bytes(NB["alice"])
    (root / "submission_12" / "01_softmax.ipynb").write_bytes(NB["bob1"])
    (root / "submission_metadata.yml").write_text("""\
submission_11:
  :submitters:
  - :name: Alice Liddell
    :sid: '1001'
    :email: alice@uni.example
  :created_at: 2026-10-05 21:58:00.123456789 -0700
  :score: 4.0
submission_12:
  :submitters:
  - :name: Bob Smith
    :email: bob@uni.example
  :created_at: 2026-10-06 01:00:00 +0000
""")
    out = tmp_path / "submissions"
    rows, notes = collect(tmp_path / "export", out, layout="gradescope", course=course)
    assert notes == []
    manifest = {r["student"]: r for r in _manifest(out / "manifest.csv")}
    # 21:58 at -07:00 is 04:58 UTC the next day
    assert manifest["alice"]["submitted_at"] == "2026-10-06T04:58:00Z"
    assert manifest["bob@uni.example"]["submitted_at"] == "2026-10-06T01:00:00Z"
    assert manifest["alice"]["lms_key"] == "submission_11"
    (out / "course.yaml").write_text(COURSE)
    graded_course = load_course(out / "course.yaml")
    assert graded_course.manifest[("alice", "01_softmax")] == parse_time("2026-10-06T04:58:00Z")
    late = graded_course.lateness("alice", "01_softmax", out / "alice" / "01_softmax.ipynb")
    assert late.submitted_from == "manifest" and late.late_seconds == 4 * 3600 + 59 * 60


def test_a_wrong_layout_is_named_with_what_was_expected(tmp_path):
    moodle = _zip(tmp_path / "moodle.zip", {
        "Alice Liddell_301_assignsubmission_file_/01_softmax.ipynb": NB["alice"]})
    with pytest.raises(CollectError, match="not a Canvas download: .* is not named "
                                           "name_userid_attachmentid_file"):
        collect(moodle, tmp_path / "out", layout="canvas")
    with pytest.raises(CollectError, match="not a Gradescope export: no submission_metadata.yml"):
        collect(moodle, tmp_path / "out", layout="gradescope")
    canvas = _zip(tmp_path / "canvas.zip", {"liddellalice_5512_9001_01_softmax.ipynb": b"{}"})
    with pytest.raises(CollectError, match="not a Moodle download"):
        collect(canvas, tmp_path / "out", layout="moodle")
    assert not (tmp_path / "out").exists()


def test_a_notebook_already_collected_is_never_overwritten(tmp_path):
    download = _zip(tmp_path / "c.zip", {"smithbob_5513_9002_01_softmax.ipynb": NB["bob0"]})
    out = tmp_path / "submissions"
    (out / "smithbob").mkdir(parents=True)
    (out / "smithbob" / "01_softmax.ipynb").write_bytes(NB["bob1"])
    with pytest.raises(CollectError, match="exists and differs"):
        collect(download, out, layout="canvas")
    assert (out / "smithbob" / "01_softmax.ipynb").read_bytes() == NB["bob1"]
    assert not (out / "manifest.csv").exists()


def test_the_command(tmp_path, capsys):
    download = _zip(tmp_path / "c.zip", {"smithbob_5513_9002_01_softmax.ipynb": NB["bob0"]})
    out = tmp_path / "submissions"
    assert cli.main(["collect", str(download), "--layout", "canvas", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "wrote 1 notebook(s) of 1 student(s)" in captured.out
    assert "txlearn: warning: Canvas's download names carry no submission time" in captured.err
    assert cli.main(["collect", str(download), "--layout", "moodle", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txlearn: error: not a Moodle download") and err.count("\n") == 1


def test_lateness_from_a_file_time_is_flagged_and_warned(tmp_path):
    from txlearn.course.gradebook.record import Recorder
    from txlearn.course.grading.reports import Submission

    path = tmp_path / "alice" / "01_softmax.ipynb"
    path.parent.mkdir()
    path.write_bytes(NB["alice"])
    course = Course(deadlines={"01_softmax": parse_time("2026-10-05T23:59:00Z")})
    recorder = Recorder(None, course)
    row = recorder.row(Submission(path=path, student="alice", set_name="01_softmax"))
    assert row.submitted_from == "mtime"
    assert "lateness from the file's modification time (no manifest row gives its submission " \
           "time)" in row.integrity
    recorder.finish()
    warning, = recorder.warnings
    assert warning.startswith("1 notebook(s) have no submission time in a manifest") and \
        str(path) in warning
    # with the time in the manifest: no flag, no warning
    course.manifest = {("alice", "01_softmax"): parse_time("2026-10-05T20:00:00Z")}
    quiet = Recorder(None, course)
    row = quiet.row(Submission(path=path, student="alice", set_name="01_softmax"))
    quiet.finish()
    assert row.submitted_from == "manifest" and row.integrity == [] and quiet.warnings == []


def test_a_notebook_larger_than_the_grader_reads_is_left_out_with_a_note(tmp_path, monkeypatch):
    from txlearn.course.grading import submission

    monkeypatch.setattr(submission, "MAX_NOTEBOOK_BYTES", 1000)
    download = _zip(tmp_path / "c.zip", {
        "smithbob_5513_9002_01_softmax.ipynb": b"x" * 1001,
        "liddellalice_5512_9001_01_softmax.ipynb": NB["alice"],
        "liddellalice_5512_9009_report.pdf": b"%PDF" + b"x" * 5000})    # never read
    rows, notes = collect(download, tmp_path / "subs", layout="canvas")
    assert [r["student"] for r in rows] == ["liddellalice"]
    assert "1 notebook(s) larger than the grader reads left out: " \
           "smithbob_5513_9002_01_softmax.ipynb" in notes
    assert not (tmp_path / "subs" / "smithbob").exists()
