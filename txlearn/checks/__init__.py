"""Exercise checks: run a learner's answer on chosen cases and diagnose the likely mistake.

A check cell in an exercise notebook is always the same two lines::

    from txlearn.checks import check
    check("stable_softmax", softmax)

`check` finds the exercise by name in the check modules of this folder (one module per exercise
set, named like the package module it checks: ``softmax.py`` for lesson 01, ``attention.py`` for
02, ...), loaded afresh from disk on every call, runs it and prints exactly one line,
``PASSED (public cases): <exercise>`` (the grader may hold hidden cases too). A wrong answer
raises :class:`CheckFailure`, shown in a notebook as at most about eight lines: the case, what
differs (shape, first differing index, got vs expected), the learner's own frames when their
code raised, and a hint. Hints come in levels: the first
names the concept; running the check again with the same mistake, or calling
``hint("stable_softmax")``, gives the next, more specific level. No hint holds a line of a
solution (a test enforces it).

**Learner objects.** A check receives what the check cell passes: functions, classes (PyTorch
modules), values. It never touches them directly: it goes through :func:`call` (call a function,
build a module, run a module's forward), :func:`load_state`, :func:`state_shapes` and
:func:`forward_backward`. In a learner's kernel these act on the real objects; under ``txlearn
grade`` the objects are proxies for a sandboxed runner process (:class:`LearnerObject`), and the
same check runs in the grader's process, so nothing the learner's code does can decide a verdict.
For the same reason a check passes the learner's code only plain data (arrays, tensors, numbers,
strings, tuples, lists, dicts, None) or a :func:`given` callable (a fixed component built from
data, e.g. "a linear map with these weights").

**Dependencies.** ``@exercise("transformer_layer", needs=("multi_head_attention",))``: when the
answer fails, the checks of its dependencies run on the learner's objects of the same names (the
check function's parameter names are the names in the check cell, e.g. ``MultiHeadAttention``);
if one of them fails, the feedback says "fix multi_head_attention first". A stub still says "not
implemented yet" first.

Writing a check (in ``txlearn/checks/<module>.py``)::

    from txlearn.checks import exercise, call, expect_close

    @exercise("stable_softmax")
    def stable_softmax(softmax):
        got = call(softmax, np.array([1000., 1001., 1002.]), case="large logits")
        expect_close(got, [0.090031, 0.244728, 0.665241], case="large logits", atol=1e-6,
                     hint=("what happens to exp() of a large number?",
                           "shift the logits by their maximum before exp()"))

The modules of this package, one job each: :mod:`~txlearn.checks.feedback` (CheckFailure, hint
levels, clean), :mod:`~txlearn.checks.learner` (call, construct, load_state, state_shapes,
forward_backward and the proxy base class), :mod:`~txlearn.checks.compare` (expect_close,
expect_shape, expect_true, diagnose, as_array), :mod:`~txlearn.checks.registry` (exercise, the
exercise -> check-module index, run_exercise, hidden_dir) and :mod:`~txlearn.checks.notebook`
(check, hint); :mod:`~txlearn.checks.modules` holds the helpers the module track's checks share.
This file is their face: every name below imports from ``txlearn.checks`` as it always has.

Source of the design: ``CONTRIBUTING.md`` (the checklist for a check), ``docs/formats.md``
and lesson 01's exercise notebook.
"""

from txlearn.checks.compare import as_array, diagnose, expect_close, expect_shape, expect_true
from txlearn.checks.feedback import CheckFailure, clean
from txlearn.checks.learner import (DEFAULT_TIME_LIMIT, LearnerChangedInput, LearnerError,
                                    LearnerObject, LearnerTimeout, call, construct,
                                    cache_shapes, forward_backward, load_state, method,
                                    record_starts, state_shapes)
from txlearn.checks.notebook import check, hint, passed_line
from txlearn.checks.registry import (Verdict, exercise, find, hidden_dir, parameters,
                                     run_exercise)
from txlearn.learner_calls import GIVEN_KINDS, Given, given

__all__ = [
    "CheckFailure",
    "check",
    "hint",
    "passed_line",
    "exercise",
    "call",
    "construct",
    "load_state",
    "state_shapes",
    "cache_shapes",
    "record_starts",
    "forward_backward",
    "method",
    "given",
    "Given",
    "GIVEN_KINDS",
    "LearnerObject",
    "LearnerError",
    "LearnerTimeout",
    "LearnerChangedInput",
    "clean",
    "expect_close",
    "expect_shape",
    "expect_true",
    "diagnose",
    "as_array",
    "run_exercise",
    "Verdict",
    "hidden_dir",
    "DEFAULT_TIME_LIMIT",
]
