"""`make lab`'s `txlearn update-work`: new exercise sets are copied, exercises new in an existing set
are inserted into the learner's copy after the previous exercise's check cell, and every cell the
learner already has (answers above all) stays byte-identical."""

import json
import platform
import shutil

import nbformat
import pytest

from txlearn.cli import main
from txlearn.course import build, update

LAYOUT = build.Layout()


def _learner_copy(student_path, drop_exercise, answers):
    """An older copy of a set: one exercise missing (as before a course update), answers written."""
    nb = nbformat.read(student_path, as_version=4)
    blocks = update.exercise_blocks(nb)
    dropped = dict(blocks)[drop_exercise]
    nb.cells = [c for c in nb.cells if not any(c is d for d in dropped)]
    nb.cells = [c for c in nb.cells if c.get("id") != "set-intro"]       # copies made before intros
    for cell in nb.cells:
        if build.is_answer(cell) and cell.metadata["exercise"] in answers:
            cell.source = answers[cell.metadata["exercise"]]
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="my output\n")]
    return nb


def _cells_json(nb, exercise_names):
    return [json.dumps(c, sort_keys=True) for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("exercise") in exercise_names]


def test_new_exercise_is_inserted_after_the_previous_check_and_answers_stay_identical(tmp_path):
    student = sorted(LAYOUT.student.glob("[0-9][0-9]_*.ipynb"))[0]
    course = nbformat.read(student, as_version=4)
    names = [n for n, _ in update.exercise_blocks(course)]
    assert len(names) >= 3
    new = names[1]
    answers = {n: f"def mine_{i}():\n    return {i}  # my answer, untouched\n"
               for i, n in enumerate(names) if n != new}
    old = _learner_copy(student, new, answers)
    work = tmp_path / "work"
    work.mkdir()
    nbformat.write(old, work / student.name)
    before_bytes = _cells_json(nbformat.read(work / student.name, as_version=4), set(answers))

    done = [u for u in update.update_work(work) if u.path.name == student.name]
    assert done and done[0].added == [new] and done[0].backup.exists()
    merged = nbformat.read(work / student.name, as_version=4)
    assert _cells_json(merged, set(answers)) == before_bytes           # every answer byte-identical
    order = [c.metadata["exercise"] for c in merged.cells if build.is_check(c)]
    assert order == names                                              # in course order
    first_check = next(i for i, c in enumerate(merged.cells)
                       if build.is_check(c) and c.metadata["exercise"] == names[0])
    block = dict(update.exercise_blocks(course))[new]
    assert [c.source for c in merged.cells[first_check + 1:first_check + 1 + len(block)]] == \
        [c.source for c in block]                                      # right after it
    inserted = [c for c in merged.cells if c.metadata.get("exercise") == new]
    assert inserted and "NotImplementedError" in inserted[0].source    # the stub, to write
    intro = next(c for c in merged.cells if c.get("id") == "set-intro")
    assert f"{len(names)} exercises" in intro.source
    # nothing new the second time: no change, no second backup
    assert [u for u in update.update_work(work) if u.path.name == student.name] == []
    assert len(list((work / ".backups").glob(f"{student.stem}.*"))) == 1


def test_missing_sets_are_copied_and_broken_copies_left_alone(tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    students = sorted(LAYOUT.student.glob("[0-9][0-9]_*.ipynb"))
    (work / students[0].name).write_text("not a notebook", encoding="utf-8")
    assert main(["update-work", str(work)]) == 0
    out, err = capsys.readouterr()
    assert (work / students[0].name).read_text(encoding="utf-8") == "not a notebook"
    assert "not a readable notebook" in err
    for s in students[1:]:
        expected = nbformat.read(s, as_version=4)
        expected.metadata["language_info"]["version"] = platform.python_version()
        assert nbformat.read(work / s.name, as_version=4) == expected
        assert f"new exercise notebook: {work / s.name}" in out
    shutil.rmtree(work)


def test_a_set_whose_exercises_were_all_replaced_keeps_old_answers_and_runs_new_ones(tmp_path,
                                                                                   monkeypatch):
    """A copy made before set 05 moved to PyTorch: its only exercise (gelu_exact, a NumPy `gelu`)
    was retired. The update keeps it byte-identical, adds the new setup cell under a new id with
    the set's prefix (no duplicate ids, no second notice or introduction), and puts the new
    exercises after the retired one, so that the new `gelu` is the one a later set loads."""
    import torch

    from txlearn.course import earlier

    course = nbformat.read(LAYOUT.student / "05_ffn.ipynb", as_version=4)
    head = [c for c in course.cells[:4] if not c.metadata.get("exercise")]
    old = nbformat.v4.new_notebook(metadata=course.metadata)
    old.cells = [nbformat.from_dict(dict(c)) for c in head]
    setup = next(c for c in old.cells if c.cell_type == "code")
    setup.source = "import numpy as np"
    answer = nbformat.v4.new_code_cell("def gelu(x):\n    return 'my old NumPy answer'\n")
    answer.id, answer.metadata = "05_ffn-003-gelu_exact", {"tags": ["answer"], "exercise": "gelu_exact"}
    check = nbformat.v4.new_code_cell("from txlearn.checks import check\ncheck('gelu_exact', gelu)")
    check.id = "05_ffn-004-gelu_exact"
    check.metadata = {"tags": ["check", "nbval-check-output"], "exercise": "gelu_exact"}
    old.cells += [answer, check]
    work = tmp_path / "work"
    work.mkdir()
    nbformat.write(old, work / "05_ffn.ipynb")

    done = [u for u in update.update_work(work) if u.path.name == "05_ffn.ipynb"]
    assert done and done[0].added == [n for n, _ in update.exercise_blocks(course)]
    merged = json.loads((work / "05_ffn.ipynb").read_text())
    ids = [c["id"] for c in merged["cells"]]
    assert len(ids) == len(set(ids)), ids
    assert ids.count("generated-notice") == 1 and ids.count("set-intro") == 1
    assert "05_ffn-001-v2" in ids                                    # the new setup cell
    kept = next(c for c in merged["cells"] if c["id"] == "05_ffn-003-gelu_exact")
    assert "".join(kept["source"]) == answer.source                   # the old answer, untouched
    assert ids.index("05_ffn-003-gelu_exact") < ids.index("05_ffn-001-v2")
    monkeypatch.chdir(work)
    gelu = earlier.load("05_ffn", "gelu")
    with pytest.raises(NotImplementedError, match="exercise gelu"):
        gelu(torch.zeros(2))                          # the new stub, not the retired NumPy answer


def test_a_copy_saved_as_nbformat_4_4_stays_valid_with_one_introduction(tmp_path):
    """The report: ``update-work`` on a copy saved as nbformat 4.4 (no cell ids, as some editors
    save) inserted the new exercise's cells with their ids into a notebook that still declared
    minor version 4, so the result failed ``nbformat.validate`` ("'id' was unexpected"), and the
    introduction was inserted a second time because it was found by its cell id. Expected: a
    valid notebook, the introduction refreshed once, the answers kept, the course's ids back."""
    student = LAYOUT.student / "01_softmax.ipynb"
    course = nbformat.read(student, as_version=4)
    names = [n for n, _ in update.exercise_blocks(course)]
    answers = {n: f"def mine_{i}():\n    return {i}\n"
               for i, n in enumerate(names) if n != names[1]}
    old = _learner_copy(student, names[1], answers)
    intro = next(c for c in course.cells if c.get("id") == "set-intro")
    stale = nbformat.v4.new_markdown_cell(intro.source.replace("exercises", "exercise(s)", 1))
    old.cells.insert(1, stale)                     # an introduction of an earlier release
    data = json.loads(nbformat.writes(old))
    data["nbformat_minor"] = 4
    for cell in data["cells"]:
        del cell["id"]                             # as an editor saving 4.4 writes it
    nbformat.validate(nbformat.from_dict(data))
    work = tmp_path / "work"
    work.mkdir()
    (work / student.name).write_text(json.dumps(data), encoding="utf-8")

    done = [u for u in update.update_work(work) if u.path.name == student.name]
    assert done and done[0].added == [names[1]]
    merged = nbformat.read(work / student.name, as_version=4)
    nbformat.validate(merged)                                          # raises when invalid
    assert (merged.nbformat, merged.nbformat_minor) == (4, 5)
    title = intro.source.split("\n", 1)[0]
    assert [c.source.split("\n", 1)[0] for c in merged.cells].count(title) == 1
    assert next(c for c in merged.cells if c.get("id") == "set-intro").source == intro.source
    mine = {c.metadata["exercise"]: c for c in merged.cells if build.is_answer(c)}
    assert {n: mine[n].source for n in answers} == answers             # answers unchanged
    ours = {c.metadata["exercise"]: c.id for c in course.cells if build.is_answer(c)}
    assert {n: mine[n].id for n in names} == ours                      # the course's ids again


def test_a_fresh_copy_already_holds_what_its_kernel_writes_into_it(tmp_path):
    """JupyterLab writes the kernel's kernelspec and language_info into a notebook it opens; a copy
    that holds them already opens unmodified (no "save your changes?" on closing it untouched).
    The kernel's own metadata is what nbclient writes after running a cell with it."""
    from nbclient import NotebookClient

    update.update_work(tmp_path)
    copy = nbformat.read(tmp_path / "10_decoder.ipynb", as_version=4)
    probe = nbformat.v4.new_notebook(metadata=json.loads(json.dumps(copy.metadata)))
    probe.cells.append(nbformat.v4.new_code_cell("1 + 1"))
    before = json.loads(json.dumps(probe.metadata))
    NotebookClient(probe, timeout=60).execute()
    assert probe.metadata["language_info"] == before["language_info"]
    assert probe.metadata["kernelspec"] == before["kernelspec"]
    assert probe.metadata == before
