"""An exercise set with no lesson of its own name (set 11, backpropagation by hand) names the
lessons it draws on in its header (`lessons:`): its intro links each of them, a name that is not
a lesson is a build error, and the book shows the set after the last of them."""

from pathlib import Path

import nbformat
import pytest

from txlearn.course import book, build

SOURCE = build.ROOT / "exercises" / "source" / "11_backward.py"


def test_the_intro_links_every_lesson_the_header_names():
    info = build.set_info(build.read_source(SOURCE), SOURCE.stem, SOURCE.name)
    assert info.lessons == ("01_softmax", "02_attention", "06_norms", "07_layer", "08_complexity")
    student, _ = build.build_exercises(SOURCE)
    intro = student.cells[1].source
    for stem in info.lessons:
        assert f"](../notebooks/{stem}.ipynb)" in intro, stem
        assert (build.ROOT / "lessons" / f"{stem}.py").exists()
    assert "notebooks/11_backward.ipynb" not in intro


def test_a_header_naming_no_lesson_is_a_build_error(tmp_path):
    layout = build.Layout(tmp_path)
    layout.exercise_sources.mkdir(parents=True)
    layout.lessons.mkdir()
    text = SOURCE.read_text().replace("lessons: [01_softmax,", "lessons: [99_nowhere, 01_softmax,")
    (layout.exercise_sources / SOURCE.name).write_text(text)
    (layout.lessons / "01_softmax.py").write_text("# %% [markdown]\n# a lesson\n")
    with pytest.raises(build.BuildError, match=r"lessons name no lesson source: \['99_nowhere'"):
        build.build_exercises(layout.exercise_sources / SOURCE.name, layout)


def test_the_book_shows_the_set_after_the_last_lesson_it_names(tmp_path):
    entries = book.lesson_table()
    assert book._sets_after_lessons(build.Layout(), entries) == {"08_complexity": ["11_backward"],
                                                                  "11_tokens": ["12_tokens"]}
    pages = book.write_book(tmp_path / "book", lessons=["08"], execute_lessons=False,
                            guides=False, reference=False)
    paths = [p.path.as_posix() for p in pages]
    assert paths == ["index.html", "08_complexity.html", "exercises/08_complexity.html",
                     "exercises/11_backward.html"]
    page = (tmp_path / "book" / "exercises" / "11_backward.html").read_text()
    assert 'href="../08_complexity.html"' in page and "set 11 (after lesson 08)" in page
    contents = (tmp_path / "book" / "index.html").read_text()
    assert 'href="exercises/11_backward.html"' in contents
    nb = nbformat.read(Path(book.__file__).parents[2] / "exercises" / "student" / "11_backward.ipynb",
                       as_version=4)
    assert nb.metadata["txlearn"]["set"] == "11_backward"
