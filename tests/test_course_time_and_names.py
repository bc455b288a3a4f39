"""The course file's time and names, from public reports against course tools' deadline
arithmetic: lateness across a change of daylight saving time (elapsed time, not the wall clock), a
deadline given as a date alone (the end of that day, compared exactly), and names saved in
another Unicode normalisation form (NFD as macOS archives write them, NFC in the course file)."""

import os
import unicodedata
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.test_gradebook_store import row
from txlearn.course.gradebook import load_course
from txlearn.course.gradebook.course import CourseFileError, name_key
from txlearn.course.gradebook.exports import canvas_rows, moodle_rows

UTC = timezone.utc
NOWHERE = Path("/")            # every submission below is in the manifest: no file time is read


def _course(tmp_path, text, manifest=None):
    (tmp_path / "course.yaml").write_text(text, encoding="utf-8")
    if manifest is not None:
        lines = ["student,set,submitted_at"] + [",".join(r) for r in manifest]
        (tmp_path / "manifest.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_course(tmp_path / "course.yaml")


BERLIN = """\
timezone: Europe/Berlin
penalty: {per_day: 0.1, max: 0.5, grace_minutes: 15}
sets:
  01_softmax: "2026-03-29 01:50"
  02_attention: "2026-10-25 01:50"
  03_heads: "2026-10-24 12:00"
extensions: {ann: {03_heads: 36 hours}}
"""


def test_lateness_across_a_change_of_the_clocks_is_elapsed_time(tmp_path):
    """The report: in Europe/Berlin with a 15-minute grace, a deadline just before the clocks
    change; a submission 15 minutes late was recorded 4,500 s late and penalised inside the grace,
    one 3 hours late read 7,200 s, and a 36-hour extension gave 37 hours (Python subtracts and
    adds datetimes of one zone on the wall clock). Expected: elapsed time, computed in UTC."""
    course = _course(tmp_path, BERLIN, [
        # 29 March 2026: 02:00 CET becomes 03:00 CEST. 01:50 CET is 00:50 UTC; 03:05 CEST is
        # 01:05 UTC: 15 minutes later (the wall clock says 75)
        ("bo", "01_softmax", "2026-03-29T03:05"),
        # 25 October 2026: 03:00 CEST becomes 02:00 CET. 01:50 CEST is 23:50 UTC the day before;
        # 03:50 CET is 02:50 UTC: 3 hours later (the wall clock says 2)
        ("bo", "02_attention", "2026-10-25T03:50"),
        # ann's deadline: 12:00 CEST (10:00 UTC) + 36 h = 22:00 UTC on the 25th = 23:00 CET;
        # she submitted at 23:30 CET, 30 minutes after it (the wall clock put it at midnight)
        ("ann", "03_heads", "2026-10-25T23:30"),
    ])
    spring = course.lateness("bo", "01_softmax", NOWHERE)
    assert (spring.late_seconds, spring.penalty) == (900.0, 0.0)     # within the grace
    autumn = course.lateness("bo", "02_attention", NOWHERE)
    assert (autumn.late_seconds, autumn.penalty) == (3 * 3600.0, 0.1)
    base = course.deadlines["03_heads"]
    assert course.deadline("ann", "03_heads") - base == timedelta(hours=36)   # elapsed: aware
    assert course.deadline("ann", "03_heads") == datetime(2026, 10, 25, 22, tzinfo=UTC)
    ann = course.lateness("ann", "03_heads", NOWHERE)
    assert (ann.deadline, ann.late_seconds, ann.penalty) == ("2026-10-25T22:00:00Z", 1800.0, 0.1)


def test_a_deadline_given_as_a_date_alone_ends_at_the_next_midnight_compared_exactly(tmp_path):
    """The report: a deadline "2026-10-05" ended at 23:59:59, so a submission at 23:59:59.4 was
    late. Expected: a date alone is the end of that day (the midnight that starts the next one);
    at the deadline is on time, one second after it (or any fraction) is late."""
    course = _course(tmp_path, "penalty: {per_day: 0.1}\n"
                     "sets: {01_softmax: 2026-10-05, 02_attention: '2026-10-05'}\n", [
                         ("a", "01_softmax", "2026-10-05T23:59:59.400"),
                         ("b", "01_softmax", "2026-10-06T00:00:00"),
                         ("c", "01_softmax", "2026-10-06T00:00:01"),
                         ("d", "02_attention", "2026-10-06T00:00:00.250")])
    midnight = datetime(2026, 10, 6, tzinfo=UTC)
    assert course.deadlines == {"01_softmax": midnight, "02_attention": midnight}   # YAML or text
    got = {s: course.lateness(s, "01_softmax" if s != "d" else "02_attention", NOWHERE)
           for s in "abcd"}
    assert {s: (t.late_seconds, t.penalty) for s, t in got.items()} == {
        "a": (0.0, 0.0), "b": (0.0, 0.0), "c": (1.0, 0.1), "d": (0.25, 0.1)}
    assert got["a"].deadline == "2026-10-06T00:00:00Z"


NFC, NFD = "Jos\u00e9", "Jose\u0301"          # one name: e-acute composed, and e + combining acute


@pytest.mark.parametrize("folder,in_file", [(NFD, NFC), (NFC, NFD)])
def test_a_name_in_another_unicode_form_is_the_same_student(tmp_path, folder, in_file):
    """The report (and the instructor's trial of a 300-student term): a submission folder named in
    NFD, as macOS archives write names, did not match its NFC entry in the course file: the
    manifest line, the extension and the roster entry were all missed, the file time was used
    and the penalty was the maximum. Expected: names compared in NFC wherever they meet."""
    course = _course(tmp_path, f"""\
penalty: {{per_day: 0.5, max: 1.0}}
sets: {{01_softmax: "2026-10-05T12:00:00Z"}}
extensions: {{"{in_file}": {{01_softmax: 2 days}}}}
roster: {{"{in_file}": {{name: "Garc\u00eda, {in_file}", email: jose@uni.example,
                        sis_login_id: jgarcia}}}}
""", [(in_file, "01_softmax", "2026-10-06T12:00:00Z")])
    assert folder != in_file and unicodedata.normalize("NFC", folder) == \
        unicodedata.normalize("NFC", in_file)                          # two spellings, one name
    notebook = tmp_path / folder / "01_softmax.ipynb"                 # copied long after
    notebook.parent.mkdir()
    notebook.write_text("{}")
    os.utime(notebook, (2e9, 2e9))                                     # 2033: the maximum
    timing = course.lateness(folder, "01_softmax", notebook)
    assert (timing.submitted_from, timing.submitted_at) == ("manifest", "2026-10-06T12:00:00Z")
    assert timing.deadline == "2026-10-07T12:00:00Z"                   # the extension found
    assert (timing.late_seconds, timing.penalty) == (0.0, 0.0)
    assert course.identity(folder)["email"] == "jose@uni.example"
    rows = [row("r", folder, 1)]                                       # a gradebook row
    assert canvas_rows(rows, course)[2][0:4] == [f"Garc\u00eda, {in_file}", "", "", "jgarcia"]
    assert moodle_rows(rows, course)[1][3] == "jose@uni.example"
    assert name_key(NFD) == name_key(NFC) == NFC


def test_one_name_given_twice_in_two_unicode_forms_is_refused(tmp_path):
    """Two roster entries that differ only in their Unicode form are one student: the course file
    must say which identity is theirs."""
    with pytest.raises(CourseFileError, match="one name written in two Unicode forms"):
        _course(tmp_path, f'roster: {{"{NFC}": {{name: A}}, "{NFD}": {{name: B}}}}\n')
