"""Grade exercise notebooks (``txlearn grade``): the grader decides every verdict; each submission
runs sandboxed. This package is the grading wing, one job per module; this file is its face.

``txlearn grade`` treats every submission as hostile. Two processes take part:

- the **grader** (trusted) reads the notebook as data, never runs a line of it, and runs the
  exercise checks of :mod:`txlearn.checks` itself: their cases, hidden cases and hints stay in
  its process;
- a **runner** (:mod:`~txlearn.course.grading.runner`), one per submission in a bubblewrap
  sandbox (:mod:`~txlearn.course.grading.sandbox`; forked by a fork server that imported PyTorch
  once per worker and set, :mod:`~txlearn.course.grading.runner_pool`), executes the
  notebook's setup and answer cells (never its check cells, nor cells the learner added) and
  then only answers requests: call this function with these arrays, build this module, load this state, run
  forward and backward (:mod:`~txlearn.course.grading.protocol`: JSON and ``.npy`` bytes, never
  pickle). What it must compute exactly as the learner's kernel does is in
  :mod:`txlearn.learner_calls`.

The checks reach the learner's objects through proxies (:class:`txlearn.checks.LearnerObject`), so
nothing the learner's code prints, patches, writes or kills can change a verdict but its own.

The modules, in the order a submission meets them:

- ``sets``        the course's view of an exercise set (:class:`~.sets.CourseSet`), GradingError;
- ``view``        the sandbox's file view: which txlearn files a set's runner sees;
- ``hidden``      the instructor's hidden-case folder, validated before any grading;
- ``hidden_trial`` ``txlearn try-hidden``: the hidden cases tried on the course's solutions, each
  failure explained to the instructor;
- ``submission``  reading a notebook as data and planning which of its cells run;
- ``integrity``   the files-changed watch around each runner;
- ``session``     the runner seen from the grader, and the proxies of the learner's objects;
- ``grade_one``   grading one submission, and the run over many (:func:`grade`);
- ``reports``     the table, the CSV and the JSON;
- ``sandbox``, ``runner``, ``protocol``: the bubblewrap sandbox, the runner inside it, and the
  wire format between them;
- ``forkserver``, ``runner_pool``: the fork server inside a sandbox and the grader's servers.

The integrity column (informational) lists check cells edited or removed, metadata altered,
banned imports attempted and files changed outside the runner's private folder during its run.

Source of the design: issue 11 ("Grading an instructor can trust"); nbgrader and otter-grader
for the two halves (checks in the grader, each submission isolated); issue 20 (one job per file).
"""

from txlearn.course.grading.grade_one import grade, sandbox_modes
from txlearn.course.grading.hidden import validate_hidden
from txlearn.course.grading.reports import (CSV_FIELDS, Result, Submission, table, write_csv,
                                            write_json)
from txlearn.course.grading.sets import GradingError

__all__ = ["grade", "table", "write_csv", "write_json", "validate_hidden", "sandbox_modes",
           "GradingError", "Result", "Submission", "CSV_FIELDS"]
