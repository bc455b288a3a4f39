"""Feedback packed for the LMS: from a synthetic Canvas and Moodle download collected by
``txlearn collect`` and a gradebook of those students, ``txlearn feedback-upload`` writes the zip
each LMS's bulk feedback upload reads. Each entry is resolved here the way the LMS resolves it
(Canvas: the first two all-digit underscore parts of the file name are the user id and the
attachment id; Moodle: the second underscore part of a folder is the participant id, the third
and fourth the plugin) and must land on the right student's page."""

import html
import re
import zipfile
from pathlib import Path

import pytest

from txlearn import cli
from txlearn.course.gradebook.store import NotebookRow, ResultRow, open_gradebook
from txlearn.course.lms.collect import collect
from txlearn.course.lms.feedback_upload import FeedbackUploadError, pack_feedback


def _row(student: str, points: int, uuid: str) -> NotebookRow:
    return NotebookRow(
        uuid=uuid, run_uuid="r1", student=student, set_name="01_softmax",
        notebook="01_softmax.ipynb", path=f"/s/{student}/01_softmax.ipynb", digest="d",
        submitted_at="2026-10-05T10:00:00Z", submitted_from="manifest",
        graded_at="2026-10-06T10:00:00Z", status="GRADED", error="", sandbox="bwrap",
        points=points, max_points=4, deadline="", late_seconds=0.0, penalty=0.0,
        results=[ResultRow("stable_softmax", "PASS" if points else "FAIL", min(points, 1), 1)])


def _zip(path: Path, files: dict) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def _text(page: str) -> str:
    """A feedback page's visible text (its heading line names the student, then the score)."""
    body = page[page.index("<body"):]
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def test_canvas_reupload_layout(tmp_path):
    download = _zip(tmp_path / "canvas.zip", {
        "smithbob_late_5513_9003_01_softmax.ipynb": b"{}",
        "liddellalice_5512_9001_01_softmax.ipynb": b"{}"})
    subs = tmp_path / "submissions"
    collect(download, subs, layout="canvas")
    rows = [_row("smithbob", 3, "a"), _row("liddellalice", 4, "b"), _row("carol", 1, "c")]
    packed, left_out = pack_feedback(rows, subs / "manifest.csv", "canvas", "01_softmax",
                                     tmp_path / "canvas_feedback.zip", generated="now")
    assert (packed, left_out) == (2, ["carol"])      # carol was not in Canvas's download
    with zipfile.ZipFile(tmp_path / "canvas_feedback.zip") as archive:
        names = sorted(archive.namelist())
        pages = {n: archive.read(n).decode() for n in names}
    assert names == ["liddellalice_5512_9001_feedback.html", "smithbob_5513_9003_feedback.html"]
    # Canvas's rule: the first two all-digit parts are the user id and the attachment id
    ids = {n: [p for p in n.split("_") if re.fullmatch(r"\d+", p)][:2] for n in names}
    assert ids == {"liddellalice_5512_9001_feedback.html": ["5512", "9001"],
                   "smithbob_5513_9003_feedback.html": ["5513", "9003"]}
    bob, alice = (_text(pages[n]) for n in ("smithbob_5513_9003_feedback.html",
                                            "liddellalice_5512_9001_feedback.html"))
    assert "smithbob · notebook" in bob and "raw score 3 / 4" in bob and "liddellalice" not in bob
    assert "liddellalice · notebook" in alice and "raw score 4 / 4" in alice


def test_moodle_feedback_zip_layout(tmp_path):
    download = _zip(tmp_path / "moodle.zip", {
        "José García_302_assignsubmission_file_/01_softmax.ipynb": b"{}",
        "Alice Liddell_301_assignsubmission_file_/01_softmax.ipynb": b"{}"})
    subs = tmp_path / "submissions"
    collect(download, subs, layout="moodle")
    rows = [_row("José García", 2, "a"), _row("Alice Liddell", 4, "b")]
    packed, _ = pack_feedback(rows, subs / "manifest.csv", "moodle", "01_softmax",
                              tmp_path / "moodle_feedback.zip")
    with zipfile.ZipFile(tmp_path / "moodle_feedback.zip") as archive:
        names = sorted(archive.namelist())
        pages = {n: archive.read(n).decode() for n in names}
    assert packed == 2 and names == [
        "Alice Liddell_301_assignfeedback_file_/feedback_01_softmax.html",
        "José García_302_assignfeedback_file_/feedback_01_softmax.html"]
    for name in names:   # Moodle's rule: explode('_', folder, 5)
        info = name.split("/")[0].split("_", 4)
        assert info[1].isdigit() and (info[2], info[3]) == ("assignfeedback", "file")
        owner, points = {"301": ("Alice Liddell", 4), "302": ("José García", 2)}[info[1]]
        assert f"{owner} · notebook" in _text(pages[name])
        assert f"raw score {points} / 4" in _text(pages[name])


def test_a_manifest_from_another_lms_packs_nothing_and_says_so(tmp_path):
    download = _zip(tmp_path / "canvas.zip", {"smithbob_5513_9003_01_softmax.ipynb": b"{}"})
    collect(download, tmp_path / "subs", layout="canvas")
    with pytest.raises(FeedbackUploadError, match="names none of its 1 graded student"):
        pack_feedback([_row("smithbob", 3, "a")], tmp_path / "subs" / "manifest.csv", "moodle",
                      "01_softmax", tmp_path / "out.zip")
    (tmp_path / "plain.csv").write_text("student,set,submitted_at\nsmithbob,01_softmax,\n")
    with pytest.raises(FeedbackUploadError, match="no lms and lms_key columns"):
        pack_feedback([_row("smithbob", 3, "a")], tmp_path / "plain.csv", "canvas",
                      "01_softmax", tmp_path / "out.zip")
    assert not (tmp_path / "out.zip").exists()


def test_the_command_reads_the_gradebook(tmp_path, capsys):
    download = _zip(tmp_path / "canvas.zip", {"smithbob_5513_9003_01_softmax.ipynb": b"{}"})
    collect(download, tmp_path / "subs", layout="canvas")
    db = tmp_path / "class.db"
    with open_gradebook(db) as gb:
        run = gb.start_run(command="test", hidden="", course_file="", started_at="now",
                           version="0")
        row = _row("smithbob", 3, "a")
        row.run_uuid = run
        gb.add_notebook(row)
    out = tmp_path / "fb.zip"
    assert cli.main(["feedback-upload", str(db), "--lms", "canvas", "--set", "01_softmax",
                     "--manifest", str(tmp_path / "subs" / "manifest.csv"), "--out",
                     str(out)]) == 0
    assert "1 feedback page(s)" in capsys.readouterr().out
    with zipfile.ZipFile(out) as archive:
        assert archive.namelist() == ["smithbob_5513_9003_feedback.html"]
