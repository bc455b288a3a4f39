"""Set 12 (byte-level BPE) beyond its catalogue: an instructor's hidden cases for it live in one
``tokens.py`` and run after the public ones, and its checks' own references (txlearn.tokens)
agree with the set's solution on text the public cases never use."""

from tests.catalogue import tokens as catalogue
from txlearn.checks import run_exercise
from txlearn.checks.registry import exercise_modules
from txlearn.course.grading import validate_hidden
from txlearn.tokens import decode, encode, train_bpe

HIDDEN = '''
from txlearn.checks import CheckFailure, call
from txlearn.tokens import train_bpe as reference

TEXT = "Les naïfs cafés ferment; les cafés ouvrent. 12 345 cafés!"


def train_bpe(train):
    got = call(train, TEXT, 12, case="French text with accents")
    if [tuple(p) for p in got] != reference(TEXT, 256 + 12).merges:
        raise CheckFailure("wrong merges", case="French text with accents",
                           hint="ties: the smallest pair")
'''


def test_set_12s_hidden_cases_run_after_its_public_ones(tmp_path):
    assert {exercise_modules()[name] for name in catalogue.REFERENCE} == {"tokens"}
    (tmp_path / "tokens.py").write_text(HIDDEN)
    validate_hidden(tmp_path)
    assert run_exercise("train_bpe", catalogue.REFERENCE["train_bpe"], hidden=tmp_path).passed
    # ties broken by the first pair seen: the hidden text alone (public=False, as the grader
    # runs hidden cases after every public one) fails it, and says only its case and hint
    first_seen = catalogue.trainer(tie="first")
    hidden = run_exercise("train_bpe", (first_seen,), hidden=tmp_path, public=False)
    assert not hidden.passed and hidden.failure.case == "hidden: French text with accents"
    assert hidden.failure.hints == ("ties: the smallest pair",)
    assert "merges" not in hidden.failure.what          # never the case's values


def test_the_sets_solution_equals_the_package_on_unseen_text():
    text = "Tokenisers split text; naïve splitters split words 😀 twice, or thrice!\n\n  x"
    merges = catalogue.train(text * 4, 60)
    bpe = train_bpe(text * 4, 256 + 60)
    assert merges == bpe.merges
    ids = catalogue.encode(text, merges)
    assert ids == encode(bpe, text)
    assert catalogue.decode(ids, merges) == decode(bpe, ids) == text
