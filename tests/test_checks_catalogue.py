"""Every exercise check passes its reference answer and fails, with its targeted hint, on each
catalogued wrong answer (tests/catalogue/<module>.py). Checks run in this process, no kernels."""

import functools
import importlib
import re
from pathlib import Path

import numpy as np
import pytest

from txlearn.course import build
from txlearn.checks import CheckFailure, check, run_exercise

CATALOGUE = Path(__file__).parent / "catalogue"
MODULES = sorted(p.stem for p in CATALOGUE.glob("*.py") if not p.name.startswith("_"))


def _load(stem):
    return importlib.import_module(f"tests.catalogue.{stem}")


def _course_exercises():
    names = []
    for source in sorted((build.ROOT / "exercises" / "source").glob("[0-9][0-9]_*.py")):
        names += build.exercise_names(build.read_source(source), source.name)
    return names


REFERENCES = [(stem, name) for stem in MODULES for name in _load(stem).REFERENCE]
WRONGS = [(stem, name, label) for stem in MODULES
          for name, cases in _load(stem).WRONG.items() for label, _, _ in cases]


@pytest.mark.parametrize("stem,name", REFERENCES)
def test_reference_passes(stem, name, capsys):
    check(name, *_load(stem).REFERENCE[name])
    assert capsys.readouterr().out == f"PASSED (public cases): {name}\n"


# --- the generic hint: what the check says about a wrong answer that no catalogue entry describes

def _nudge(value):
    """A right answer made slightly wrong in a way no learner's mistake is: floats scaled by
    1.013 and shifted by 0.0137 (a pattern no scale, sign, axis or order mistake gives), whole
    numbers plus 7, a boolean's first entry flipped, text with " ~" appended; pairs, lists and
    dicts element by element."""
    if isinstance(value, str):
        return value + " ~"
    if isinstance(value, (tuple, list)):
        return type(value)(_nudge(v) for v in value)
    if isinstance(value, dict):
        return {k: _nudge(v) for k, v in value.items()}
    if isinstance(value, (bool, np.bool_)):
        return not value
    if isinstance(value, (int, np.integer)):
        return value + 7
    if isinstance(value, (float, np.floating)):
        return value * 1.013 + 0.0137
    if type(value).__module__.startswith("torch") or isinstance(value, np.ndarray):
        if value.dtype in (bool, np.bool_) or str(value.dtype) == "torch.bool":
            flipped = value.clone() if hasattr(value, "clone") else value.copy()
            if flipped.ndim:
                flipped[(0,) * flipped.ndim] = ~flipped[(0,) * flipped.ndim]
            return flipped
        if "int" in str(value.dtype):
            return value + 7
        return value * 1.013 + 0.0137
    return value


def _nudged(obj):
    """The reference object `obj` (a function or an nn.Module class) with its output nudged."""
    import torch

    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        return type(obj.__name__, (obj,),
                    {"forward": lambda self, *a, **k: _nudge(obj.forward(self, *a, **k))})
    if callable(obj):
        return functools.wraps(obj)(lambda *a, **k: _nudge(obj(*a, **k)))
    return obj


@functools.lru_cache(maxsize=None)
def _generic_hints(stem, name):
    """The hint levels the check of `name` gives to a wrong answer it cannot recognise: its
    reference with the first object's output nudged. It must fail."""
    objects = _load(stem).REFERENCE[name]
    verdict = run_exercise(name, (_nudged(objects[0]),) + tuple(objects[1:]))
    assert not verdict.passed, f"{name}: a nudged reference answer passes the check"
    return verdict.failure.hints


def _hint_text(hints):
    return " | ".join(hints).lower()


@pytest.mark.parametrize("stem,name,label", WRONGS)
def test_wrong_answer_fails_with_its_own_hint(stem, name, label, capsys):
    cases = {lab: (objs, text) for lab, objs, text in _load(stem).WRONG[name]}
    objects, text = cases[label]
    with pytest.raises(CheckFailure) as info:
        check(name, *objects)
    failure = info.value
    # never one of the generic hints the check declares (given when no mistake is recognised)
    defaults = [tuple([d] if isinstance(d, str) else d)
                for d in getattr(_checks_module(stem), "DEFAULTS", {}).get(name, [])]
    assert failure.hints not in defaults, f"{label!r} got a generic hint: {failure.hints}"
    assert "PASSED" not in capsys.readouterr().out
    assert failure.kind not in ("stub", "missing"), f"{label!r}: {failure}"
    assert text.lower() in _hint_text(failure.hints), (
        f"wrong answer {label!r} failed, but its hint levels lack {text!r}:\n{failure.feedback(9)}")
    generic = _generic_hints(stem, name)
    assert failure.hints != generic and text.lower() not in _hint_text(generic), (
        f"wrong answer {label!r} got the generic hint of {name}, not its own: {generic}")


def test_the_generic_hint_test_can_fail():
    """An answer the checks cannot tell from an unrecognised one gets the generic hint, and the
    assertion above then fails: the nudged reference itself is such an answer."""
    stem = next(s for s in MODULES if _load(s).REFERENCE)
    name, objects = next(iter(_load(stem).REFERENCE.items()))
    verdict = run_exercise(name, (_nudged(objects[0]),) + tuple(objects[1:]))
    assert not verdict.passed and verdict.failure.hints == _generic_hints(stem, name)


DEPENDENTS = [(stem, name, label) for stem in MODULES
              for name, cases in getattr(_load(stem), "DEPENDENT", {}).items()
              for label, _, _, _ in cases]


@pytest.mark.parametrize("stem,name,label", DEPENDENTS)
def test_failure_caused_by_an_earlier_answer_names_it(stem, name, label):
    cases = {lab: (objs, ns, text) for lab, objs, ns, text in _load(stem).DEPENDENT[name]}
    objects, namespace, text = cases[label]
    verdict = run_exercise(name, objects, namespace=namespace)
    assert not verdict.passed and verdict.failure.kind == "dependency", label
    assert text in verdict.failure.feedback(1), verdict.failure.feedback(1)


def _checks_module(stem):
    return importlib.import_module(f"txlearn.checks.{stem}")


def test_every_exercise_has_five_catalogued_mistakes():
    for stem in MODULES:
        for name, cases in _load(stem).WRONG.items():
            assert len(cases) >= 5, f"{name}: {len(cases)} catalogued mistakes, fewer than 5"


def test_every_exercise_is_catalogued():
    references = {name for stem in MODULES for name in _load(stem).REFERENCE}
    wrongs = {name for stem in MODULES for name, cases in _load(stem).WRONG.items() if cases}
    exercises = _course_exercises()
    assert exercises, "the course has no exercises"
    assert len(exercises) == len(set(exercises)), "exercise names must be unique across the course"
    assert not set(exercises) - references, f"no reference answer for {set(exercises) - references}"
    assert not set(exercises) - wrongs, f"no catalogued wrong answer for {set(exercises) - wrongs}"


def test_check_names_the_first_difference_and_shape():
    from txlearn.checks import expect_close, expect_shape
    with pytest.raises(CheckFailure, match=re.escape("index (1,): got 5, expected 3")):
        expect_close([1.0, 5.0], [1.0, 3.0], case="c")
    with pytest.raises(CheckFailure, match=re.escape("shape (2,), expected (3,)")):
        expect_close([1.0, 5.0], [1.0, 3.0, 4.0], case="c")
    with pytest.raises(CheckFailure, match=re.escape("shape (2, 3), expected (3, 2)")):
        expect_shape([[0] * 3] * 2, (3, 2), case="c")
    with pytest.raises(CheckFailure, match="got nan at index"):
        expect_close([float("nan")], [1.0], case="c")


def test_a_difference_is_shown_in_as_many_digits_as_it_takes():
    """0.15642213 vs 0.15642201 read the same in 6 digits (0.156422): the message widens to 7
    (0.1564221 vs 0.156422, %g drops the trailing 0), and gives the absolute error 1.2e-07 and
    the relative 1.2e-07 / 0.15642201 = 7.67e-07."""
    from txlearn.checks import expect_close
    with pytest.raises(CheckFailure) as info:
        expect_close([0.15642213, 1.0], [0.15642201, 1.0], case="c", rtol=0, atol=1e-9)
    assert "got 0.1564221, expected 0.156422 (error 1.2e-07, relative 7.67e-07)" in info.value.what
    with pytest.raises(CheckFailure) as info:
        expect_close(3.0, 2.0, case="c")
    assert info.value.what == "got 3, expected 2 (error 1, relative 0.5)"
    with pytest.raises(CheckFailure) as info:
        expect_close([1e-3], [0.0], case="c")
    assert "got 0.001, expected 0 (error 0.001)" in info.value.what   # no relative error of 0


def test_time_limit_and_stub_feedback():
    from txlearn.checks import call

    def forever():
        while True:
            pass

    def stub():
        raise NotImplementedError

    with pytest.raises(CheckFailure, match="did not finish within 0.2 s"):
        call(forever, case="loop", time_limit=0.2)
    with pytest.raises(CheckFailure, match="not implemented yet"):
        call(stub, case="stub")
    with pytest.raises(CheckFailure, match="raised ZeroDivisionError"):
        call(lambda: 1 / 0, case="error")


def test_unknown_exercise_is_a_key_error():
    with pytest.raises(KeyError, match="no exercise named"):
        check("no_such_exercise")


def test_check_cells_pass_the_names_their_checks_take():
    # a check's parameter names are the learner's names in its check cell: the grader builds its
    # proxies, and a failing exercise finds its dependencies, by these names
    import ast as _ast
    from txlearn.checks import parameters
    for source in sorted((build.ROOT / "exercises" / "source").glob("[0-9][0-9]_*.py")):
        for cell in build.read_source(source).cells:
            if not build.is_check(cell):
                continue
            call_node = next(n for n in _ast.walk(_ast.parse(cell.source))
                             if isinstance(n, _ast.Call) and getattr(n.func, "id", "") == "check")
            passed = [a.id for a in call_node.args[1:]]
            name = cell.metadata["exercise"]
            assert passed == parameters(name), f"{source.name}, {name}: cell passes {passed}, " \
                                               f"the check takes {parameters(name)}"


def test_set_09s_hidden_cases_live_in_one_capstone_file(tmp_path):
    # capstone.py's checks use helper modules (capstone_*.py), but every exercise of set 09 is
    # registered under the stem "capstone": an instructor's hidden cases go in capstone.py
    from tests.catalogue.capstone import REFERENCE
    from txlearn.checks.registry import exercise_modules
    from txlearn.course.grading import GradingError, validate_hidden
    stems = exercise_modules()
    assert {stems[name] for name in REFERENCE} == {"capstone"}
    (tmp_path / "capstone.py").write_text(
        "from txlearn.checks import CheckFailure\n"
        "def top_p(next_token_distribution):\n"
        "    raise CheckFailure('secret case', case='instructor', hint='hidden hint')\n")
    validate_hidden(tmp_path)
    verdict = run_exercise("top_p", REFERENCE["top_p"], hidden=tmp_path)
    assert not verdict.passed and verdict.failure.case == "hidden: instructor"
    (tmp_path / "capstone_model.py").write_text("def char_model(CharModel):\n    pass\n")
    with pytest.raises(GradingError, match="capstone_model.py is not named like a check module"):
        validate_hidden(tmp_path)


def test_training_loops_time_out_saying_how_far_they_got(monkeypatch):
    # set 09's stated run: a time-out says how long the first 10 steps took, so that a slow loop
    # ("where does your loop spend its time?") and one that never ends read differently
    import time

    import torch

    from txlearn.checks import capstone_training as ct
    from txlearn.checks.capstone_model import course_init

    catalogue = _load("capstone")
    CharModel = catalogue.REFERENCE["training_loop"][2]
    sizes = dict(d_model=8, n_heads=2, d_ff=16, n_layers=1, block_size=8, n_vocab=12)
    _, init = course_init(12, {k: v for k, v in sizes.items() if k != "n_vocab"})
    ids = torch.randint(0, 12, (400,))
    run = dict(steps=300, batch_size=4, block_size=8, lr=1e-3, seed=0)

    def slow(model, train_ids, val_ids, steps, batch_size, block_size, lr, seed):
        time.sleep(0.01 * steps)                      # 0.01 s a step: 300 steps take 3 s
        return [1.0]

    def endless(model, train_ids, val_ids, steps, batch_size, block_size, lr, seed):
        while steps > 10:                            # ends for the short run only
            time.sleep(0.01)
        return [1.0]

    monkeypatch.setattr(ct, "TRAIN_SECONDS", 0.5)
    for train, hint, words in ((slow, ct.SLOW, "so 300 steps should take about"),
                               (endless, ct.ENDLESS, "seems not to end")):
        with pytest.raises(CheckFailure) as info:
            ct.paced_run(train, CharModel, init, sizes, ids, ids[:80], run, "stated run")
        failure = info.value
        assert failure.kind == "timeout" and failure.hints == hint, failure.feedback(9)
        assert "300 steps did not finish within 0.5 s" in str(failure), str(failure)
        assert words in str(failure), str(failure)
