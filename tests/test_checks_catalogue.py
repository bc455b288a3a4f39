"""Every exercise check passes its reference answer and fails, with its targeted hint, on each
catalogued wrong answer (tests/catalogue/<module>.py). Checks run in this process, no kernels."""

import importlib
import re
from pathlib import Path

import pytest

from txlearn.course import build
from txlearn.checks import CheckFailure, check

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
    assert capsys.readouterr().out == f"PASSED: {name}\n"


@pytest.mark.parametrize("stem,name,label", WRONGS)
def test_wrong_answer_fails_with_its_own_hint(stem, name, label, capsys):
    cases = {lab: (objs, text) for lab, objs, text in _load(stem).WRONG[name]}
    objects, text = cases[label]
    with pytest.raises(CheckFailure) as info:
        check(name, *objects)
    failure = info.value
    said = " | ".join((failure.what,) + failure.hints)
    assert text.lower() in said.lower(), (
        f"wrong answer {label!r} failed, but its feedback lacks {text!r}:\n{said}")
    # its own hint, not the check's generic one (the hint given when no mistake is recognised)
    defaults = [tuple([d] if isinstance(d, str) else d)
                for d in getattr(_checks_module(stem), "DEFAULTS", {}).get(name, [])]
    assert failure.hints not in defaults, f"{label!r} got the generic hint: {failure.hints}"
    assert "PASSED" not in capsys.readouterr().out


def _checks_module(stem):
    return importlib.import_module(f"txlearn.checks.{stem}")


def test_every_check_declares_its_generic_hints_and_five_mistakes():
    for stem in MODULES:
        defaults = getattr(_checks_module(stem), "DEFAULTS", None)
        assert isinstance(defaults, dict), f"txlearn/checks/{stem}.py has no DEFAULTS"
        for name, cases in _load(stem).WRONG.items():
            assert name in defaults, f"{stem}: no DEFAULTS entry for {name}"
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
