"""Canvas and Moodle exports never write a row without the identity their import matches on:
a student the roster does not know (or whose entry lacks the mapped key) is refused with their
name, or left out and listed with --skip-unidentified; without any roster the folder name
stands in, as documented."""

import csv

import pytest

from tests.test_gradebook_store import row
from txlearn.course.gradebook import Course, write_export
from txlearn.course.gradebook.exports import canvas_rows, moodle_rows, unidentified

ROSTER = {"alice": {"name": "Liddell, Alice", "email": "alice@uni.example", "id_number": "1001",
                    "sis_login_id": "aliddell"},
          "dora": {"name": "Dora Maar", "id_number": "1004"}}        # no email, no Canvas id


def _rows():
    # alice and dora on the roster, zed not: one notebook each, 2 of 4 points
    return [row("r1", s, i) for i, s in enumerate(("alice", "dora", "zed"))]


def test_moodle_refuses_students_without_the_email_it_maps_on_and_writes_nothing(tmp_path):
    course = Course(roster=ROSTER)
    dest = tmp_path / "moodle.csv"
    with pytest.raises(ValueError) as err:
        write_export(_rows(), "moodle", dest, course)
    assert str(err.value).startswith("moodle: 2 student(s) have no email in the course file's "
                                     "roster for the import to match on (dora, zed)")
    assert not dest.exists()
    assert unidentified(_rows(), "moodle", course) == ["dora", "zed"]
    # mapped on the ID number instead: dora has one, zed (not on the roster) still not
    assert unidentified(_rows(), "moodle", course, match="idnumber") == ["zed"]


def test_moodle_and_canvas_leave_out_and_list_the_unidentified_when_asked(tmp_path):
    course = Course(roster=ROSTER)
    write_export(_rows(), "moodle", tmp_path / "m.csv", course, skip_unidentified=True)
    moodle = list(csv.reader(open(tmp_path / "m.csv", encoding="utf-8")))
    assert moodle[1:] == [["Alice", "Liddell", "1001", "alice@uni.example", "2"]]
    assert all(r[3] for r in moodle[1:])                 # never a blank email
    write_export(_rows(), "canvas", tmp_path / "c.csv", course, skip_unidentified=True)
    canvas = list(csv.reader(open(tmp_path / "c.csv", encoding="utf-8")))
    assert [r[0] for r in canvas[2:]] == ["Liddell, Alice"]   # dora: no Canvas identity; zed
    assert unidentified(_rows(), "canvas", course) == ["dora", "zed"]
    with pytest.raises(ValueError, match=r"^canvas: 2 student\(s\) have no ID, SIS User ID or "
                                         r"SIS Login ID"):
        write_export(_rows(), "canvas", tmp_path / "c2.csv", course)


def test_without_a_roster_the_folder_name_stands_in_for_the_login_never_a_blank():
    course = Course()
    canvas = canvas_rows(_rows(), course)
    assert [r[3] for r in canvas[2:]] == ["alice", "dora", "zed"]   # SIS Login ID
    moodle = moodle_rows(_rows(), course, match="idnumber")
    assert [r[2] for r in moodle[1:]] == ["alice", "dora", "zed"]   # ID number
    assert unidentified(_rows(), "moodle", course) == ["alice", "dora", "zed"]   # no emails
    assert unidentified(_rows(), "wide", course) == []


def test_the_export_command_refuses_in_one_line_or_lists_whom_it_left_out(tmp_path, capsys):
    from txlearn.cli import main
    from txlearn.course.gradebook import open_gradebook

    db = tmp_path / "class.db"
    with open_gradebook(db) as gb:
        run = gb.start_run(command="test", started_at="2026-10-02T10:00:00Z", version="0")
        for r in _rows():
            r.run_uuid = run
            gb.add_notebook(r)
    course = tmp_path / "course.yaml"
    course.write_text("roster:\n  alice: {email: alice@uni.example}\n")
    out = tmp_path / "m.csv"
    args = ["export", "moodle", str(db), "--out", str(out), "--course", str(course)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("txlearn: error: moodle: 2 student(s) have no email") and \
        err.count("\n") == 1 and not out.exists()
    assert main(args + ["--skip-unidentified"]) == 0
    err = capsys.readouterr().err
    assert "left out, no identity to match on in the roster: dora" in err
    assert "left out, no identity to match on in the roster: zed" in err
    assert [r[3] for r in csv.reader(open(out, encoding="utf-8"))][1:] == ["alice@uni.example"]
