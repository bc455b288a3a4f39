"""CSV cells that a spreadsheet reads as what they are: numbers exactly, text never as a formula.

The one rule for every CSV file the course writes: the grader's ``grades.csv``
(:mod:`txlearn.course.grading.reports`) and the gradebook's wide, Canvas and Moodle exports
(:mod:`txlearn.course.gradebook.exports`).
"""

from __future__ import annotations

import numbers
import re

__all__ = ["csv_cell", "CSV_SEPARATORS"]

CSV_SEPARATORS = ",;|\t\r\n "   # what a spreadsheet's import may split a cell on
_FORMULA = "=+-@"
_NUMBER_PART = (rf"[+-](?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                rf"(?=[{re.escape(CSV_SEPARATORS)}]|$)")
_EXPOSED = re.compile(rf"(?<=[{re.escape(CSV_SEPARATORS)}])(?=[{re.escape(_FORMULA)}])"
                      rf"(?!{_NUMBER_PART})")


def csv_cell(value) -> str:
    """A value as a CSV cell that a spreadsheet reads as what it is.

    Numbers (Python's and NumPy's) are written exactly: an integer as it is, a float as its
    shortest round-trip form (``repr``, an integral one without ``.0``: 1047552.0 ->
    ``1047552``, 0.063417250592446794 -> ``0.0634172505924468``, the same float; -0.5 ->
    ``-0.5``; never ``:g``'s ``1.04755e+06`` or ``0.0634173``), and never guarded. Text is
    guarded against formulas: a text whose first character (after spaces, tabs or line breaks,
    which an import that trims cells drops) is ``=``, ``+``, ``-`` or ``@`` gets a leading
    apostrophe (a student folder named ``=HYPERLINK(...)`` from an LMS export, say), and so does
    each such character right after one of :data:`CSV_SEPARATORS` inside the text, because a
    spreadsheet told to split on semicolons (Excel's separator in German, French or Dutch
    locales), tabs, bars or spaces makes a cell of each part (``x;=1+1;`` is written
    ``x;'=1+1;``); a sign that begins a plain number there (``got -0.5``) is a number and is
    left alone. None is an empty cell.

    Sources: OWASP, "CSV Injection"; the public reports on exported numbers written with ``:g``
    and on a formula behind a semicolon or a tab in a student's folder name."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        text = str(value)
        start = "'" if text.lstrip(" \t\r\n")[:1] in tuple(_FORMULA) else ""
        return start + _EXPOSED.sub("'", text)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)
