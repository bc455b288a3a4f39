"""txlearn.learner_calls: the one place of each rule the learner's kernel (the checks) and the
grader's sandboxed runner share; both import these functions (no copy of a rule elsewhere)."""

import numpy as np
import pytest
import torch

from txlearn import learner_calls as lc


def _scale_in_place(x, factor=2.0):
    x *= factor
    return None


def test_the_learner_gets_copies_and_a_changed_one_is_named():
    x, y = np.arange(3.0), torch.arange(3.0)
    result, changed = lc.call_on_copies(_scale_in_place, [x], {"factor": 3.0})
    assert result is None and [k for k, _ in changed] == [0]
    np.testing.assert_array_equal(x, [0.0, 1.0, 2.0])        # the caller's array is untouched
    np.testing.assert_array_equal(changed[0][1], [0.0, 3.0, 6.0])
    _, changed = lc.call_on_copies(lambda a, b=None: b.mul_(2), [x], {"b": y})
    assert [k for k, _ in changed] == ["b"] and torch.equal(y, torch.arange(3.0))
    assert lc.parameter_name(_scale_in_place, 0) == "x"
    assert lc.parameter_name(_scale_in_place, 5) == 5 and lc.parameter_name(print, 0) == 0
    assert lc.parameter_name(_scale_in_place, "factor") == "factor"


def test_unchanged_inputs_with_nan_and_a_resize_in_place():
    nan = np.array([np.nan, 1.0])
    _, changed = lc.call_on_copies(lambda a, t: a.sum() + t.sum(), [nan, torch.tensor([np.nan])],
                                   {})
    assert changed == []                                        # NaN equals NaN here
    _, changed = lc.call_on_copies(lambda a: a.resize_(4), [torch.zeros(2)], {})
    assert [k for k, _ in changed] == [0]
    ints = np.arange(4)
    _, changed = lc.call_on_copies(lambda a: a.__setitem__(0, 9), [ints], {})
    assert [k for k, _ in changed] == [0] and ints[0] == 0


def test_load_state_dict_casts_to_the_modules_dtypes_without_grad():
    lin = torch.nn.Linear(2, 3)
    W = np.arange(6.0).reshape(3, 2)
    lc.load_state_dict(lin, {"weight": W, "bias": np.ones(3)})
    assert lin.weight.dtype == torch.float32 and lin.weight.requires_grad
    torch.testing.assert_close(lin.weight, torch.tensor(W, dtype=torch.float32))
    with pytest.raises(RuntimeError, match="Missing key"):
        lc.load_state_dict(lin, {"weight": W})


def test_the_time_limit_interrupts_and_is_removed_afterwards():
    import signal
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(lc.TimeLimitExceeded):
        with lc.time_limit(0.05):
            while True:
                pass
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    try:                                                       # not an Exception: a bare
        with lc.time_limit(0.05):                              # except in learner code cannot
            try:                                               # swallow it
                while True:
                    pass
            except Exception:
                pytest.fail("the limit was swallowed by `except Exception`")
    except lc.TimeLimitExceeded:
        pass
    with lc.time_limit(None):                                  # no limit: nothing installed
        assert signal.getsignal(signal.SIGALRM) is before


def test_learner_frames_keep_the_learners_code_only():
    source = "def answer(x):\n    return helper(x)\ndef helper(x):\n    return np.log(x) / 0\n"
    namespace = {"np": np}
    exec(compile(source, "<cell 4>", "exec"), namespace)
    import linecache
    linecache.cache["<cell 4>"] = (len(source), None, source.splitlines(True), "<cell 4>")
    with np.errstate(all="raise"):
        try:
            lc.call_on_copies(namespace["answer"], [np.zeros(2)], {})
        except FloatingPointError as err:
            frames = lc.learner_frames(err.__traceback__)
    # this test's own frame is not txlearn's either; call_on_copies' frame (txlearn) is left out
    assert frames[-2:] == ["line 2 in answer: return helper(x)",
                           "line 4 in helper: return np.log(x) / 0"], frames
    assert len(frames) == 3 and not any(" in call_on_copies:" in f for f in frames), frames


def test_strip_magics_and_the_given_kinds():
    assert lc.strip_magics("%matplotlib inline\nx = 1\n  !ls\ny = 2") == "x = 1\ny = 2"
    x = np.array([[3.0, 4.0]])
    np.testing.assert_allclose(lc.given("rms_norm", eps=0.0)(x), x / np.sqrt(12.5))
    np.testing.assert_allclose(lc.given("layer_norm", eps=0.0)(x), [[-1.0, 1.0]])
    t = torch.tensor(x, dtype=torch.float32)
    torch.testing.assert_close(lc.given("linear", W=np.eye(2), b=np.ones(2))(t), t + 1)


def test_the_checks_and_the_runner_use_these_functions():
    from txlearn.checks import learner
    from txlearn.course.grading import runner
    assert learner.call_on_copies is lc.call_on_copies
    assert learner.load_state_dict is lc.load_state_dict
    assert learner.learner_frames is lc.learner_frames
    assert learner.local_forward_backward is lc.local_forward_backward
    source = open(runner.__file__, encoding="utf-8").read()
    for name in ("call_on_copies", "load_state_dict", "time_limit", "learner_frames",
                 "strip_magics", "local_forward_backward"):
        assert f"learner_calls.{name}" in source, name
    for rule in ("setitimer", "no_grad", "extract_tb", ".copy()", "clone()"):
        assert rule not in source, f"the runner computes {rule} itself"
