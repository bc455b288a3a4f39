"""The Gradescope autograder's run: grade ``/autograder/submission/`` and write
``/autograder/results/results.json`` (the zip's ``run_autograder`` runs
``python -m txlearn.course.lms.autograder``; :mod:`~txlearn.course.lms.gradescope` builds the zip).

Gradescope starts a fresh container per submission, unpacks the autograder zip into
``/autograder/source/``, runs its ``setup.sh`` once per image and ``run_autograder`` once per
submission, as root, with the student's files in ``/autograder/submission/`` and
``/autograder/submission_metadata.json`` beside them (Gradescope Autograder Specifications,
gradescope-autograders.readthedocs.io, "Specifications" and "Submission Metadata": ``created_at``
the submission's time, ``assignment.due_date`` and ``late_due_date``, ``users[]`` with ``email``,
``name`` and ``id``). The root is ``TXLEARN_AUTOGRADER_ROOT`` (default ``/autograder``), so the
same script runs in a test's temporary folder.

In order, before any of the student's code runs:

1. the zip's configuration (``source/autograder.json``: the set, the hidden cases' visibility)
   and the submission's metadata are read;
2. **the hidden cases and the results folder are locked**: owned by :data:`LOCK_UID` (a uid no
   process of the container runs as) with mode 0700, so that only the grader (root, with its
   capabilities) reads or writes them. The runner that executes the student's cells runs as a
   leased unprivileged uid where the installed Python lets it, else as root without any
   capability (:func:`txlearn.course.grading.sandbox.others_can_run`); either way it cannot read
   a folder of another owner that others may not enter, nor the grader's memory;
3. the set's notebook and, for a set that builds on earlier ones (``uses``, e.g. set 09 on 03-07),
   those notebooks are found in the submission (by their ``NN_`` prefix, at any depth, symbolic
   links refused) and copied into a private folder named for the student: the submission itself
   is never changed;
4. lateness: ``created_at`` is the submission time; the deadline is the course file's for the set
   (``source/course.yaml``, with its extensions by the student's roster entry), else the
   metadata's ``due_date``; the course file's penalty applies (none without a course file);
5. the notebook is graded (:func:`txlearn.course.grading.grade`, in the bubblewrap sandbox where it
   starts, else in container mode) with the zip's hidden cases, and its row is made as the
   gradebook would record it (:class:`~txlearn.course.gradebook.record.Recorder`);
6. ``results.json``: :func:`~txlearn.course.gradebook.exports.gradescope_results` (a test per
   exercise's public cases and one per exercise's hidden cases, each with name, score,
   max_score, status, output, visibility), plus the lateness in its ``output``.

A submission that cannot be graded (no notebook of the set, an earlier notebook missing) gets a
``results.json`` with score 0 and one line saying what to upload.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

__all__ = ["run", "main", "find_notebooks", "lock", "student_of", "lateness_note",
           "AutograderError", "ROOT_ENV", "CONFIG", "LOCK_UID"]

ROOT_ENV = "TXLEARN_AUTOGRADER_ROOT"
CONFIG = "autograder.json"
LOCK_UID = 65534   # "nobody": owns what the student's code must not read (no process runs as it)


class AutograderError(Exception):
    """The submission cannot be graded (what to upload instead, in one line)."""


def lock(path: Path) -> bool:
    """Make ``path`` (a folder, and everything under it) owned by :data:`LOCK_UID`, folders
    mode 0700 and files 0600: root with its capabilities (the grader) still reads and writes it,
    nothing else does. Returns False when it cannot (not root: then it is left as it is)."""
    if os.geteuid() != 0:
        return False
    path.mkdir(parents=True, exist_ok=True)
    for folder, dirs, files in os.walk(path):
        for name in files:
            entry = os.path.join(folder, name)
            os.lchown(entry, LOCK_UID, LOCK_UID)
            if not os.path.islink(entry):
                os.chmod(entry, 0o600)
        for name in dirs:
            os.lchown(os.path.join(folder, name), LOCK_UID, LOCK_UID)
            os.chmod(os.path.join(folder, name), 0o700)
    os.chown(path, LOCK_UID, LOCK_UID)
    os.chmod(path, 0o700)
    return True


def find_notebooks(submission: Path, wanted: list[str]) -> dict[str, Path]:
    """``{set: path}`` of each wanted set's notebook in the submission folder: a file named
    ``<set>.ipynb``, else the one ``NN_*.ipynb`` of that set's number, at any depth (Gradescope
    keeps the folders of an uploaded zip). Raises AutograderError naming what to upload when one
    is missing, appears twice, or is a symbolic link."""
    found: dict[str, list[Path]] = {s: [] for s in wanted}
    for folder, dirs, files in os.walk(submission):
        dirs[:] = sorted(d for d in dirs if d not in ("__MACOSX", ".ipynb_checkpoints"))
        for name in sorted(files):
            if not name.endswith(".ipynb") or name.startswith("."):
                continue
            for set_name in wanted:
                if name == f"{set_name}.ipynb" or name.startswith(set_name[:3]):
                    found[set_name].append(Path(folder) / name)
    out, missing = {}, []
    for set_name, paths in found.items():
        exact = [p for p in paths if p.name == f"{set_name}.ipynb"]
        paths = exact or paths
        if not paths:
            missing.append(f"{set_name}.ipynb")
        elif len(paths) > 1:
            shown = ", ".join(str(p.relative_to(submission)) for p in paths[:3])
            raise AutograderError(f"{len(paths)} notebooks of {set_name} in the submission "
                                  f"({shown}): upload one")
        elif paths[0].is_symlink():
            raise AutograderError(f"{paths[0].name} is a symbolic link: upload the notebook "
                                  f"itself")
        else:
            out[set_name] = paths[0]
    if missing:
        main_set = wanted[0]
        together = (f" (set {main_set} builds on your earlier answers: upload "
                    f"{', '.join(w + '.ipynb' for w in wanted)} together)"
                    if len(wanted) > 1 else "")
        raise AutograderError(f"the submission has no {', '.join(missing)}{together}")
    return out


def student_of(metadata: dict, course) -> str:
    """The student's folder name: the course file's roster key whose ``email`` is the first
    user's, else that email, else the user's name, else ``student`` (a name fit for a folder)."""
    from txlearn.course.gradebook.course import name_key

    users = metadata.get("users") if isinstance(metadata.get("users"), list) else []
    user = users[0] if users and isinstance(users[0], dict) else {}
    email = str(user.get("email") or "").strip()
    for key, ident in course.roster.items():
        if email and ident.get("email", "").strip().lower() == email.lower():
            return key
    name = email or str(user.get("name") or "").strip() or "student"
    name = re.sub(r"[/\\\x00-\x1f]", "_", name_key(name)).strip(". ") or "student"
    return name[:100]


def lateness_note(row) -> str:
    """One line: when the notebook was submitted, and how late against which deadline."""
    if not row.deadline:
        return f"submitted {row.submitted_at}; no deadline"
    if row.late_seconds <= 0:
        return f"submitted {row.submitted_at}, on time (deadline {row.deadline})"
    hours = row.late_seconds / 3600
    late = f"{hours / 24:.1f} days" if hours >= 24 else f"{hours:.1f} hours"
    penalty = f"late penalty {row.penalty:.0%}" if row.penalty else "no penalty (grace)"
    return f"submitted {row.submitted_at}, {late} after the deadline {row.deadline}: {penalty}"


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AutograderError(f"no {what} at {path}") from None
    except (OSError, ValueError) as err:
        raise AutograderError(f"{what} {path} cannot be read ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise AutograderError(f"{what} {path} is not a JSON object")
    return data


def _course(source: Path, set_name: str, metadata: dict):
    """(the course file of the zip with this submission's time and, where the course file gives
    the set no deadline, the assignment's ``due_date``; the student's folder name)."""
    from txlearn.course.gradebook.course import load_course, name_key, parse_time

    path = source / "course.yaml"
    course = load_course(path if path.is_file() else None)
    course.path = None      # the student's folder is not beside it: no roster folder check
    student = student_of(metadata, course)
    assignment = metadata.get("assignment") if isinstance(metadata.get("assignment"), dict) \
        else {}
    try:
        created = parse_time(str(metadata["created_at"]))
    except (KeyError, ValueError):
        raise AutograderError("submission_metadata.json has no created_at time") from None
    course.manifest = {(name_key(student), set_name): created}
    if set_name not in course.deadlines and assignment.get("due_date"):
        try:
            course.deadlines[set_name] = parse_time(str(assignment["due_date"]))
        except ValueError:
            raise AutograderError(f"submission_metadata.json: due_date "
                                  f"{assignment['due_date']!r} is not a time") from None
    return course, student


def run(root: Path) -> dict:
    """Grade the submission under ``root`` (the ``/autograder`` layout); returns the results
    (``results.json``'s object). Raises AutograderError for a submission that cannot be graded,
    GradingError or CourseFileError for an autograder that cannot start."""
    from txlearn.course import build, grading
    from txlearn.course.gradebook.exports import gradescope_results
    from txlearn.course.gradebook.record import Recorder
    from txlearn.course.grading import sandbox
    from txlearn.course.grading.sets import load_set

    source = root / "source"
    config = _read_json(source / CONFIG, "the autograder's configuration")
    metadata = _read_json(root / "submission_metadata.json", "submission metadata")
    hidden = source / "hidden"
    locked = lock(hidden) if hidden.is_dir() else True
    locked = lock(root / "results") and locked
    set_name = str(config["set"])
    found = build.find_source(set_name)
    if found is None:
        raise grading.GradingError(f"the autograder's course has no set {set_name}")
    cs = load_set(found)
    course, student = _course(source, set_name, metadata)
    notebooks = find_notebooks(root / "submission", [set_name, *cs.info.uses])
    work = root / "work" / student
    work.mkdir(parents=True, exist_ok=True)
    for name, path in notebooks.items():
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as src, open(work / f"{name}.ipynb", "wb") as dst:
            shutil.copyfileobj(src, dst)
    lock(root / "work")
    container = not sandbox.available()[0] or sandbox.container_wanted()
    sub, = grading.grade([work / f"{set_name}.ipynb"], hidden=hidden if hidden.is_dir() else None,
                         jobs=1, container=container)
    row = Recorder(None, course, hidden=hidden if hidden.is_dir() else None).row(sub)
    results = gradescope_results(row, hidden_visibility=config.get("hidden_visibility",
                                                                     "after_published"))
    notes = [lateness_note(row)]
    if not locked:
        notes.append("note: the autograder did not run as root: its hidden cases were not "
                     "locked away from the submission's code")
    results["output"] = "\n".join([results.get("output", "")] + notes).strip()
    results["score"] = float(results["score"])
    if sub.error:
        results["score"] = 0.0
    return results


def _write(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """``python -m txlearn.course.lms.autograder [ROOT]``: grade and write
    ``ROOT/results/results.json`` (ROOT: the argument, else ``TXLEARN_AUTOGRADER_ROOT``, else
    ``/autograder``). Returns 0 when results were written (whatever the score), 2 when the
    autograder itself cannot start (its reason on stderr and in the results' output)."""
    from txlearn.course.gradebook.course import CourseFileError
    from txlearn.course.grading.sets import GradingError

    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0] if argv else os.environ.get(ROOT_ENV) or "/autograder")
    status = 0
    try:
        results = run(root)
    except AutograderError as err:
        results = {"score": 0.0, "output": f"not graded: {err}", "tests": []}
    except (GradingError, CourseFileError, KeyError) as err:
        print(f"txlearn autograder: error: {err}", file=sys.stderr)
        results = {"score": 0.0, "output": f"the autograder could not start: {err}",
                   "tests": []}
        status = 2
    except Exception as err:  # noqa: BLE001 - a bug of the autograder: one line, a result
        first = (str(err).splitlines() or [""])[0][:200]
        print(f"txlearn autograder: error: {type(err).__name__}: {first}", file=sys.stderr)
        results = {"score": 0.0, "output": f"the autograder failed ({type(err).__name__}); "
                                           f"tell your instructor", "tests": []}
        status = 2
    _write(root / "results" / "results.json", results)
    print(results["output"])
    return status


if __name__ == "__main__":
    sys.exit(main())
