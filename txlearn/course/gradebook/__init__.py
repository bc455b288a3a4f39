"""The class gradebook: every graded notebook kept in SQLite, and what an instructor makes of it.

One job per module:

- :mod:`.store`: the SQLite file (versioned schema, safe opening, one transaction per notebook)
  and which run counts (:func:`counting`: latest or best);
- :mod:`.record`: recording a ``txlearn grade --gradebook`` run as it grades;
- :mod:`.mistakes`: the identifier of the catalogued mistake or hint that fired;
- :mod:`.course`: the course file (deadlines, extensions, penalty, manifest, roster);
- :mod:`.feedback`: one HTML page per student and set; :mod:`.report`: what the class got
  wrong (HTML and JSON), with :mod:`.report_instructor`'s view (who, who did not submit, a
  later set's failure under its earlier cause); :mod:`.similarity`: pairs of unusually
  similar answers; :mod:`.exports`: wide CSV, Canvas, Moodle, Gradescope; :mod:`.merge`: gradebooks of several
  machines into one; :mod:`.pages`: the HTML every page shares (escaped, offline; rendered
  from the Jinja2 templates in ``templates/``);
  :mod:`.cli`: the ``txlearn`` commands.

Source: issue 24 ("Teaching a class").
"""

from txlearn.course.gradebook.course import (Course, CourseFileError, find_course_file,
                                             load_course)
from txlearn.course.gradebook.exports import FORMATS, gradescope_results, write_export
from txlearn.course.gradebook.feedback import write_feedback
from txlearn.course.gradebook.merge import merge_gradebooks
from txlearn.course.gradebook.mistakes import mistake_id
from txlearn.course.gradebook.record import Recorder
from txlearn.course.gradebook.report import class_report, write_report
from txlearn.course.gradebook.similarity import normalise, similar_pairs, write_similarity
from txlearn.course.gradebook.store import (SCHEMA_VERSION, Gradebook, GradebookError,
                                            NotebookRow, ResultRow, counting, open_gradebook)

__all__ = ["open_gradebook", "Gradebook", "GradebookError", "NotebookRow", "ResultRow",
           "counting", "SCHEMA_VERSION", "Recorder", "mistake_id", "Course", "CourseFileError",
           "load_course", "find_course_file", "write_feedback", "class_report", "write_report",
           "normalise", "similar_pairs", "write_similarity", "write_export",
           "gradescope_results", "FORMATS", "merge_gradebooks"]
