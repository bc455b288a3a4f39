"""Feedback pages and the class report show times in the course's time zone, with the zone named
(the gradebook keeps UTC): a Berlin deadline of 23:59 reads 23:59 CEST, not 21:59 UTC."""

from zoneinfo import ZoneInfo

from tests.test_gradebook_store import row
from txlearn.course.gradebook import class_report, write_feedback
from txlearn.course.gradebook.course import shown_time
from txlearn.course.gradebook.report import report_page

BERLIN = ZoneInfo("Europe/Berlin")


def test_a_stored_utc_time_is_shown_in_the_zone_with_its_abbreviation_then():
    # 21:59 UTC on 5 October is 23:59 summer time (UTC+2); on 2 November, after the clocks
    # went back on 25 October, 10:00 UTC is 11:00 winter time (UTC+1)
    assert shown_time("2026-10-05T21:59:00Z", BERLIN) == "2026-10-05 23:59 CEST"
    assert shown_time("2026-11-02T10:00:00Z", BERLIN) == "2026-11-02 11:00 CET"
    assert shown_time("2026-10-05T21:59:00Z") == "2026-10-05 21:59 UTC"
    assert shown_time("now", BERLIN) == "now" and shown_time("", BERLIN) == ""


def test_feedback_pages_show_the_courses_time_zone(tmp_path):
    late = row("r1", "alice", 0)
    late.submitted_at, late.deadline = "2026-10-06T03:59:00Z", "2026-10-05T21:59:00Z"
    late.graded_at, late.late_seconds = "2026-11-02T10:00:00Z", 6 * 3600.0
    page, = write_feedback([late], tmp_path, generated="2026-11-02T10:05:00Z", zone=BERLIN)
    text = page.read_text()
    assert "2026-10-06 05:59 CEST (from the file time)" in text        # submitted
    assert "2026-10-05 23:59 CEST (extensions included)" in text       # the deadline
    assert "graded 2026-11-02 11:00 CET" in text
    assert "Times are in the course&#x27;s time zone, Europe/Berlin." in text
    assert "21:59:00Z" not in text and "03:59" not in text
    index = (tmp_path / "index.html").read_text()
    assert "2026-11-02 11:05 CET (Europe/Berlin)" in index


def test_the_report_names_its_time_zone_and_keeps_utc_in_its_json():
    data = class_report([row("r1", "alice", 0)], generated="2026-10-06T08:00:00Z",
                        time_zone="Europe/Berlin")
    assert (data["generated"], data["timezone"]) == ("2026-10-06T08:00:00Z", "Europe/Berlin")
    html = report_page(data, plots=False)
    assert ("2026-10-06 10:00 CEST (times in the course&#x27;s time zone, Europe/Berlin)"
            in html)
