"""Grading one submission (:func:`grade_one`), and the run over many (:func:`grade`).

Per submission: the set comes from the file name (or ``--set``), never from the notebook's
metadata; the student is the submission's own folder; symbolic links are refused. A file that
cannot be graded (not a notebook, odd metadata, a missing sibling notebook of an earlier set, a
runner that died) gets status ERROR, "not graded: <reason>", without stopping the others. A cell
that runs past its limit is named ("your answer cell did not finish within 20 s") and the runner
restarts without it; a call past its limit fails that exercise. An exercise the copy lacks fails
with "not in your copy: run make lab"; one the course retired is RETIRED and not counted. Every
exercise's public cases run first, then the hidden cases of those that passed, so that no public
feedback can carry what the learner's code saw of a hidden case. The checks themselves are
:func:`txlearn.checks.run_exercise`, in this process, on :class:`~.session.Remote` proxies.
The concept checks that close the notebook are graded as data, never run
(:mod:`~txlearn.course.grading.concept_answers`).
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from txlearn.checks import clean, run_exercise
from txlearn.course import build
from txlearn.course.grading import installation, runner_pool, sandbox
from txlearn.course.grading.concept_answers import concept_results
from txlearn.course.grading.hidden import validate_hidden
from txlearn.course.grading.integrity import changes, fingerprint, watched
from txlearn.course.grading.reports import Result, Submission
from txlearn.course.grading.session import CannotCross, RunnerDied, Session
from txlearn.course.grading.sets import CourseSet, GradingError, load_set
from txlearn.course.grading.submission import plan, read_notebook
from txlearn.course.grading.view import make_view, view_modules

__all__ = ["grade", "grade_one", "run_checks", "run_quietly", "sandbox_modes", "in_work", "Job",
           "error_rows", "linked_paths", "DIED_IN_HIDDEN", "NOT_IN_COPY", "HIDDEN_FAILED",
           "HIDDEN_HINT", "MAX_FEEDBACK_LINE", "instructor_note", "reference_notebook", "EARLIER"]

DIED_IN_HIDDEN = ("not graded: the runner died, broke the protocol or ran out of time during the "
                  "hidden cases (its exit status, output and reply are not shown: they could carry "
                  "a hidden case's inputs)")
# what every failed hidden case reports, whatever the submission did there (raised, returned a
# stub or a wrong value, changed its input in place, ran out of time, died, broke the protocol):
# a report that named the kind of failure let a submission choose it from bits of a hidden input
HIDDEN_FAILED = ("failed a hidden case (it passed every public case; a hidden case reports "
                 "nothing about what your code did there)")
HIDDEN_HINT = "Re-read the exercise: a hidden case tries inputs the public cases do not."
EARLIER = ("own", "reference")   # where later sets get the earlier sets' answers (grade())
MAX_FEEDBACK_LINE = 1000   # characters of one feedback line as recorded (a check quoting what a
# runner reported, a state-dict shape of 500,000 dimensions, made one line of 1.5 MB in the JSON,
# the CSV and the gradebook)
NOT_IN_COPY = ("not in your copy: run make lab (it adds the course's new exercises to your copy "
               "and keeps your answers)")


@dataclass
class Job:
    """One path to grade: its number in the run, the student, the set's source, the mode."""

    number: int
    path: Path
    student: str
    source: Path | None
    mode: str
    refused: str = ""     # why the run refuses this path before reading it (:func:`linked_paths`)
    earlier: str = "own"  # the earlier sets' answers: "own" (its sibling notebooks), "reference"


def error_rows(sub: Submission, cs: CourseSet | None) -> None:
    """The ERROR rows of a notebook that was not graded: one per exercise of its set."""
    names = cs.names if cs is not None else ["-"]
    sub.results = [Result(sub.student, sub.path.name, n, status="ERROR", points=0,
                          max_points=1 if cs is not None else 0, feedback=sub.error,
                          integrity="; ".join(sub.integrity)) for n in names]


def grade_one(job: Job, sets: dict[str, CourseSet], hidden: Path | None,
              limits_override: dict, pool=None) -> Submission:
    """Grade one notebook in its own runner; never raises (a file that cannot be graded gets
    ``error`` and ERROR rows; a bug of the grader is named in one line, for this file only)."""
    sub = Submission(path=job.path, student=job.student, mode=job.mode)
    cs = None
    lease = None
    session = None
    try:
        if job.source is not None:   # its set, from its file name, even if it cannot be read
            cs = sets[job.source.stem]
            sub.set_name = cs.name
        if job.refused:
            raise GradingError(job.refused)
        nb = read_notebook(job.path, sub)
        if job.source is None:
            raise GradingError(f"no exercise set matches the file name {job.path.name!r} (name "
                               f"it like the handout, NN_name.ipynb, or pass --set)")
        cells, present, notes, retired = plan(nb, cs)
        sub.integrity += notes
        files = []
        for used in cs.info.uses:
            if job.earlier == "reference":   # the course's answers stand in for the student's
                files.append((f"{used}.ipynb", str(reference_notebook(used))))
                continue
            sibling = job.path.parent / f"{used}.ipynb"
            if sibling.is_symlink():
                raise GradingError(f"{used}.ipynb beside it is a symbolic link")
            if not sibling.is_file():
                raise GradingError(f"needs {used}.ipynb beside it (this set uses your answers "
                                   f"there)")
            if sibling.stat().st_nlink > 1:   # a classmate's notebook, run as this one's answers
                raise GradingError(f"{used}.ipynb beside it is a hard link")
            files.append((f"{used}.ipynb", str(sibling)))
        limits = dict(cs.info.limits, **limits_override)
        if os.geteuid() == 0 and (job.mode == "bwrap" or (job.mode == "container"
                                                            and sandbox.others_can_run())):
            lease = sandbox.UidLease()
        folders = watched(job.path, hidden)
        before = fingerprint(folders)
        hide = tuple(str(p) for p in (hidden, Path(os.path.abspath(job.path)).parent.parent) if p)
        session = Session(cs, cells, limits, job.mode, files, lease.uid if lease else None, hide,
                          pool=pool)
        session.boot()
        run_checks(sub, cs, session, present, retired, hidden)
        sub.concepts = concept_results(nb, cs.name, sub.student, sub.path.name)   # data only
        session.report()
        session.close()
        changed = changes(before, fingerprint(folders))
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if
                                                len(changed) > 3 else "")
            sub.integrity.append(f"files changed outside its private folder while it ran: {shown}")
        where = {c.label: c.exercise for c in cells}
        banned = sorted({clean(b.get("module", "?"), 60) for b in session.banned})
        if banned:
            sub.integrity.append(f"banned import attempted: {', '.join(banned)[:200]}")
        for r in sub.results:
            mine = sorted({clean(b.get("module"), 60) for b in session.banned
                           if where.get(b.get("where")) == r.exercise
                           or str(b.get("where", "")).removeprefix("call of ") in
                           cs.objects.get(r.exercise, [])})
            if mine:
                r.flagged = f"tried to import {', '.join(mine)}"[:200]
        sub.output_dropped = session.output_dropped
    except GradingError as err:
        sub.error = f"not graded: {err}"
    except RunnerDied as err:
        # once the hidden cases have started, what the runner made (its exit status, its last
        # line of output, the text of a broken reply) may spell out a hidden input
        sub.error = DIED_IN_HIDDEN if session is not None and session.frozen else \
            f"not graded: {err}"
    except CannotCross as err:
        sub.error = f"not graded: {err}"
    except Exception as err:  # noqa: BLE001 - a bug of the grader: this file only, in one line
        first = (str(err).splitlines() or [""])[0][:200]
        sub.error = f"not graded: the grader failed on this file ({type(err).__name__}" + \
            ("" if session is not None and session.frozen else f": {first}") + ")"
    finally:
        if session is not None:
            session.close()
        if lease is not None:
            lease.release()
    if sub.error:
        error_rows(sub, cs)
        sub.concepts = []       # a notebook that was not graded has no graded answers either
    else:
        for r in sub.results + sub.concepts:
            r.integrity = "; ".join(sub.integrity)
    sub.graded_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return sub


def reference_notebook(set_name: str) -> Path:
    """The course's solution notebook of an earlier set, whose answer cells stand in for a
    student's own under ``earlier="reference"`` (:func:`grade`). Raises GradingError when the
    course has none (run txlearn build)."""
    path = build.Layout().solutions / f"{set_name}.ipynb"
    if not path.is_file():
        raise GradingError(f"--earlier reference: the course has no {path.name} in "
                           f"{path.parent} (run txlearn build)")
    return path


def _bounded(text: str) -> str:
    """Feedback with each line cut to :data:`MAX_FEEDBACK_LINE` characters."""
    return "\n".join(line if len(line) <= MAX_FEEDBACK_LINE else
                     line[:MAX_FEEDBACK_LINE - 3] + "..." for line in text.splitlines())


def run_quietly(name, objects, namespace, hidden, public=True):
    """run_exercise, with the warnings a learner's odd values may raise kept out of the
    instructor's terminal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_exercise(name, objects, namespace, hidden=hidden, public=public)


def instructor_note(failure) -> str:
    """What the instructor is told of a failed hidden case: the hidden check's own failure
    (its case, what differs, got vs expected, its hint), as
    :func:`txlearn.checks.run_exercise` keeps it (``unredacted``). Never shown to the student:
    it may quote the hidden case's inputs and what the submission's code made of them."""
    original = getattr(failure, "unredacted", None) or failure
    return original.feedback(1)


def run_checks(sub: Submission, cs: CourseSet, session: Session, present: set[str],
                retired: set[str], hidden: Path | None) -> None:
    """Every exercise's public cases first, then the hidden cases of those that passed: a
    learner's code sees a hidden case's inputs only once no more public feedback is written."""
    setup_errors = [e for c in session.cells if not c.exercise
                    for e in [session.cell_errors.get(c.index)] if e]
    namespace = {n: session.proxy(n) for n in session.names}
    graded = []
    for name in cs.names:
        result = Result(sub.student, sub.path.name, name)
        sub.results.append(result)
        if name not in present:
            result.feedback, result.kind = NOT_IN_COPY, "not-in-copy"
            continue
        cell_error = next((session.cell_errors[c.index] for c in session.cells
                           if c.exercise == name and c.index in session.cell_errors), "")
        prefix = [e for e in [cell_error] + setup_errors[:1] if e]
        missing = [o for o in cs.objects[name] if o not in session.names]
        if missing:
            result.feedback = "\n".join(prefix) or (
                f"your answer cell does not define {', '.join(missing)} (the check needs it)")
            result.kind = "missing"
            continue
        objects = [namespace[o] for o in cs.objects[name]]
        try:
            verdict = run_quietly(name, objects, namespace, None)
        except (RunnerDied, CannotCross):
            raise
        except Exception as err:  # noqa: BLE001 - a check that could not use the result
            result.feedback = clean(f"the check could not use what your code returned "
                                    f"({type(err).__name__}: {err})", 300)
            result.kind = "unusable"
            continue
        if verdict.passed:
            result.status, result.points = "PASS", result.max_points
            graded.append((result, objects))
        else:
            result.feedback = "\n".join(prefix + [_bounded(verdict.failure.feedback(1))])
            result.kind, result.hints = verdict.failure.kind, verdict.failure.hints
    if hidden is not None:
        # what the learner's code reports about itself (banned imports, dropped output) is read
        # now, before it sees any hidden input, and frozen
        session.report()
        session.freeze()
        for result, objects in graded:
            try:
                verdict = run_quietly(result.exercise, objects, namespace, hidden, public=False)
                failed = not verdict.passed
                note = "" if verdict.passed else instructor_note(verdict.failure)
            except CannotCross:
                raise
            except RunnerDied as err:   # the next exercise's hidden cases start a fresh runner
                session.close()
                failed, note = True, f"the runner died during the hidden cases ({err})"
            except Exception as err:  # noqa: BLE001 - a hidden case that could not use the value
                failed = True
                note = f"the hidden case itself raised {type(err).__name__}: {err}"
            if failed:
                result.status, result.points, result.hidden = "FAIL", 0, True
                result.kind, result.feedback, result.hints = "hidden", HIDDEN_FAILED, \
                    (HIDDEN_HINT,)
                result.instructor_note = _bounded("\n".join(
                    clean(line, MAX_FEEDBACK_LINE) for line in note.splitlines()[:12]))
    for name in sorted(retired):
        sub.results.append(Result(sub.student, sub.path.name, name, status="RETIRED",
                                  max_points=0, feedback=f"retired from the course: "
                                                         f"{cs.info.retired[name]}"[:300]))


# ---- the run over many ---------------------------------------------------------------------

def in_work(path: Path) -> bool:
    """Whether ``path`` really lies in the repository's ``work/`` (links resolved: a symbolic
    link inside work/ to a folder elsewhere does not count)."""
    try:
        Path(os.path.realpath(path)).relative_to(Path(os.path.realpath(build.ROOT / "work")))
        return True
    except ValueError:
        return False


def sandbox_modes(paths: list[Path], no_sandbox: bool = False,
                  container: bool = False) -> list[str]:
    """How each path is graded: ``"bwrap"`` where bubblewrap works, ``"plain"`` with
    ``no_sandbox`` or for a learner's own ``work/`` without bubblewrap, ``"container"`` when
    asked (``container``, or ``TXLEARN_SANDBOX=container``: a container of its own per
    submission, whether bubblewrap works or not). Raises GradingError when another path would
    need a sandbox that is not there (its text names container mode as the way out)."""
    if no_sandbox:
        return ["plain"] * len(paths)
    if container or sandbox.container_wanted():
        return ["container"] * len(paths)
    ok, why = sandbox.available()
    if ok:
        return ["bwrap"] * len(paths)
    outside = [p for p in paths if not in_work(p)]
    if outside:
        raise GradingError(f"grading {outside[0]} needs a sandbox: {why}; "
                           f"{sandbox.CONTAINER_WAY_OUT}; or pass --no-sandbox to run the "
                           f"submissions' code unsandboxed (it prints what that risks)")
    return ["plain"] * len(paths)


def linked_paths(paths: list[Path]) -> list[str]:
    """Why each path of one run is refused ("" where it is not): a symbolic link in any folder
    between the run's common folder and the notebook (``submissions/mallory -> alice`` graded
    with ``submissions/*/*/01_*.ipynb`` graded alice's notebook twice, once as mallory's), or the
    same file as an earlier path of the run (a hard link, or a link above the common folder)."""
    if not paths:
        return []
    absolute = [Path(os.path.abspath(p)) for p in paths]
    try:
        root = Path(os.path.commonpath([str(p.parent) for p in absolute]))
    except ValueError:
        root = Path("/")
    out, seen = [], {}
    for path in absolute:
        why = ""
        below = path.parent.relative_to(root).parts if path.parent != root else ()
        for i in range(len(below) - 1):   # the notebook's own folder: read_notebook's check
            folder = root.joinpath(*below[: i + 1])
            if folder.is_symlink():
                why = (f"{folder.relative_to(root)} on its path is a symbolic link (each "
                       f"student's notebook must lie in folders of its own)")
                break
        if not why:
            try:
                st = os.stat(path)
                key = (st.st_dev, st.st_ino)
            except OSError:
                key = None
            if key is not None and st.st_nlink > 1:
                why = (f"it is a hard link (the same file has {st.st_nlink} names; find out who "
                       f"submitted it)")
            elif key is not None and key in seen and seen[key] != str(path):
                why = f"it is the same file as {seen[key]} (a link), graded there"
            elif key is not None:
                seen[key] = str(path)
        out.append(why)
    return out


def grade(paths: list[Path], hidden: Path | None = None, *, set_name: str | None = None,
          jobs: int | None = None, no_sandbox: bool = False, container: bool = False,
          limits: dict | None = None, on_graded=None, earlier: str = "own") -> list[Submission]:
    """Grade notebooks, each in its own sandboxed runner; return one Submission per path, in order.

    ``hidden``: instructor-only cases (:func:`validate_hidden` checks the folder first; format in
    :func:`txlearn.checks.hidden_dir`). ``set_name``: the exercise set of every file (otherwise
    each file's name says it). ``jobs``: submissions graded at once (default: the number of CPU
    cores). ``no_sandbox``: run the runners as plain processes. ``container``: container mode
    (:func:`sandbox_modes`; docs/containers.md). ``limits``: override the sets'
    sandbox limits (tests shorten them). ``on_graded(sub)``: called in this thread with each
    Submission as soon as it is graded, in the order they finish (the gradebook records each
    notebook then). ``earlier``: where a set that uses earlier sets' answers (04, 07, 09, 10)
    gets them: ``"own"``, the student's sibling notebooks (a mistake there costs points here
    too), or ``"reference"``, the course's solution notebooks of those sets
    (:func:`reference_notebook`: each set graded on its own answers only, no double jeopardy;
    the student's earlier notebooks are then not needed). Originals are only read.

    Raises:
        GradingError: the run cannot start (a misnamed hidden case, an unknown ``set_name``, no
            sandbox for a path that needs one, an ``earlier`` other than own or reference). A
            file that cannot be graded is not an exception: its Submission has ``error`` set
            and ERROR rows.
    """
    paths = [Path(p) for p in paths]
    if earlier not in EARLIER:
        raise GradingError(f"--earlier {earlier}: use {' or '.join(EARLIER)}")
    if hidden is not None:
        validate_hidden(Path(hidden))
        hidden = Path(hidden).resolve()
    modes = sandbox_modes(paths, no_sandbox, container)
    forced = None
    if set_name is not None:
        forced = build.find_source(set_name)
        if forced is None:
            raise GradingError(f"--set {set_name}: no such exercise set")
    jobs_list = []
    refused = linked_paths(paths)
    for number, (path, mode) in enumerate(zip(paths, modes)):
        source = forced or build.find_source(path.stem)
        student = Path(os.path.abspath(path)).parent.name
        jobs_list.append(Job(number, path, student, source, mode, refused[number], earlier))
    # notebooks of one set in two folders of one name (a/alice/ and b/alice/): the gradebook and
    # the reports would take one for the other (the later counted, the earlier lost), so neither
    # is graded; which of them is the student's own cannot be told here
    named: dict[tuple[str, str], list[Job]] = {}
    for job in jobs_list:
        if job.source is not None and not job.refused:
            named.setdefault((job.student, job.source.stem), []).append(job)
    for (student, stem), same in named.items():
        folders = {os.path.abspath(j.path.parent) for j in same}
        if len(folders) > 1:
            for job in same:
                others = sorted(folders - {os.path.abspath(job.path.parent)})
                job.refused = (f"another {stem} notebook of this run lies in a folder of the same "
                               f"name, {', '.join(others)[:200]} (each student's folder name must "
                               f"be unique: rename one)")
    sets: dict[str, CourseSet] = {}
    with tempfile.TemporaryDirectory(prefix="txlearn-grade-") as tmp:
        os.chmod(tmp, 0o755)
        for job in jobs_list:
            if job.source is not None and job.source.stem not in sets:
                cs = load_set(job.source)
                cs.view_modules = view_modules(cs)
                cs.view_dir = str(Path(tmp) / f"view-{cs.name}")
                make_view(Path(cs.view_dir), cs.view_modules)
                sets[cs.name] = cs
                if "bwrap" in modes:
                    # once per run, before the workers start: the probe imports torch, and two
                    # workers asking for the same set at once each ran it (the cache is not locked)
                    try:
                        installation.package_entries(cs.packages)
                    except RuntimeError:
                        pass   # each of the set's notebooks is then not graded, with the reason
        workers = max(1, int(jobs or os.cpu_count() or 1))
        # each worker's runners forked from a sandbox per set that imported PyTorch once
        servers = runner_pool.Pool() if "bwrap" in modes and runner_pool.supported()[0] \
            else None
        try:
            with ThreadPoolExecutor(max_workers=workers,
                                    thread_name_prefix="txlearn-grade") as pool:
                futures = [pool.submit(grade_one, job, sets, hidden, dict(limits or {}), servers)
                           for job in jobs_list]
                if on_graded is not None:
                    try:
                        for future in as_completed(futures):
                            on_graded(future.result())
                    except BaseException:
                        for future in futures:   # a recording that fails stops the run
                            future.cancel()
                        raise
                return [f.result() for f in futures]
        finally:
            if servers is not None:
                servers.close()
