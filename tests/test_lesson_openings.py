"""Each lesson opens with what the learner will be able to do, what it assumes and how long it
takes (issue 22), in its first markdown cell, and flags parts of later lessons as black boxes.

Every lesson, 00 to 11."""

import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
OPENED = ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11"]


def _first_markdown(number):
    (path,) = sorted((ROOT / "lessons").glob(f"{number}_*.py"))
    cells = jupytext.read(path).cells
    return next(c.source for c in cells if c.cell_type == "markdown"), cells


@pytest.mark.parametrize("number", OPENED)
def test_a_lesson_opens_with_its_goals_prerequisites_and_time(number):
    opening, _ = _first_markdown(number)
    goals = re.search(r"\*\*You will be able to:\*\* (.{80,}?)\n#?\s*\n", opening + "\n\n", re.S)
    assert goals, f"lesson {number}: no '**You will be able to:**' paragraph in its first cell"
    assert re.search(r"\*\*You need:\*\* \S.{20,}", opening, re.S), f"lesson {number}: no prerequisites"
    time = re.search(r"\*\*Time:\*\* about (\d+) minutes", opening)
    assert time and 10 <= int(time.group(1)) <= 120, f"lesson {number}: no time estimate in minutes"


def test_the_check_sees_a_missing_opening():
    """The test above can fail: a first cell without the three paragraphs is caught."""
    opening = "# 99 · A lesson\n\nIt derives something."
    assert not re.search(r"\*\*You will be able to:\*\*", opening)
    assert not re.search(r"\*\*Time:\*\* about (\d+) minutes", opening)


@pytest.mark.parametrize("number, later", [("02", "lesson 09"), ("04", "lesson 05"),
                                           ("06", "lesson 07")])
def test_parts_of_later_lessons_are_flagged_as_black_boxes(number, later):
    _, cells = _first_markdown(number)
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    flagged = [p for p in re.split(r"\n\s*\n", text) if re.search(r"black box", p, re.I)]
    assert any(later in p for p in flagged), f"lesson {number}: no black-box note naming {later}"
