"""The course's view of an exercise set, as the grader needs it: its exercises, their check cells
and the names each passes, its setup and answer cells as the course wrote them, and what its
answers may import (with the sets it uses). Also :class:`GradingError`, the one error of a file
that cannot be graded or of a run that cannot start (raised throughout the grading wing).

Everything here comes from the set's source (``exercises/source/NN_name.py``, built once per
run), never from a submission.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from txlearn.checks.registry import exercise_modules
from txlearn.course import build, concepts

__all__ = ["GradingError", "CourseSet", "load_set", "check_objects"]


class GradingError(Exception):
    """A file cannot be graded (the reason in one line), or the grading run cannot start."""


def check_objects(cell_source: str, name: str) -> list[str]:
    """The names a check cell passes to ``check(name, ...)``.

    Raises GradingError when the cell passes something other than names or calls no check()."""
    for node in ast.walk(ast.parse(cell_source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check":
            args = node.args[1:]
            if not all(isinstance(a, ast.Name) for a in args):
                raise GradingError(f"the check cell of {name} passes something other than names")
            return [a.id for a in args]
    raise GradingError(f"the check cell of {name} does not call check()")


@dataclass
class CourseSet:
    """What the course says about one exercise set (from its source, built once per run)."""

    name: str
    info: build.SetInfo
    names: list[str]                      # current exercises, in order
    check_ids: dict[str, str]             # exercise -> id of its check cell
    check_sources: dict[str, str]
    objects: dict[str, list[str]]         # exercise -> the names its check cell passes
    metadata: dict                        # metadata.txlearn of the student notebook
    allowed: list[str]                    # what answers may import (with the sets it uses)
    data: tuple = ()                      # distributions whose files answers may read
    course_cells: list = field(default_factory=list)  # (id, exercise or "", pristine source)
    view_modules: list[str] = field(default_factory=list)   # set by the run (view.py)
    view_dir: str = ""

    @property
    def packages(self) -> tuple[str, ...]:
        """The installed top-level packages besides numpy and torch that the set's answers may
        import (what the sandbox shows of site-packages: :func:`~.installation.package_entries`)."""
        return tuple(sorted({m.split(".")[0] for m in self.allowed
                             if not m.startswith("txlearn")} - {"numpy", "torch"}))


def load_set(source: Path) -> CourseSet:
    """The :class:`CourseSet` of the exercise source ``source``.

    Raises GradingError when a set it uses is not an exercise set, or no check module defines
    one of its exercises (:func:`txlearn.checks.registry.exercise_modules`)."""
    student, _ = build.build_exercises(source)
    info = build.set_info(build.read_source(source), source.stem, source.name)
    checks = [c for c in student.cells if build.is_check(c)]
    names = [c.metadata["exercise"] for c in checks]
    allowed, seen, todo = set(info.imports), {source.stem}, list(info.uses)
    data = set(info.data)
    while todo:
        used = todo.pop()
        if used in seen:
            continue
        seen.add(used)
        used_source = build.find_source(used)
        if used_source is None:
            raise GradingError(f"{source.name} uses {used}, which is not an exercise set")
        used_info = build.set_info(build.read_source(used_source), used, used_source.name)
        allowed |= set(used_info.imports)
        data |= set(used_info.data)
        todo += list(used_info.uses)
    stems = exercise_modules()
    unknown = [n for n in names if n not in stems]
    if unknown:
        raise GradingError(f"no check module defines {', '.join(unknown)}")
    return CourseSet(
        name=source.stem, info=info, names=names,
        check_ids={c.metadata["exercise"]: c.id for c in checks},
        check_sources={c.metadata["exercise"]: c.source for c in checks},
        objects={c.metadata["exercise"]: check_objects(c.source, c.metadata["exercise"])
                 for c in checks},
        metadata=dict(student.metadata.get("txlearn", {})), allowed=sorted(allowed),
        data=tuple(sorted(data)),
        course_cells=[(c.id, c.metadata.get("exercise", "") if build.is_answer(c) else "",
                       c.source) for c in student.cells
                      if c.cell_type == "code" and not build.is_check(c)
                      and not build.is_demo(c) and not concepts.is_concept_cell(c)])
