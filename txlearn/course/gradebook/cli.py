"""The gradebook's commands: ``txlearn grade --gradebook``, ``feedback``, ``report``, ``export``,
``similarity`` and ``merge`` (argparse, added to the ``txlearn`` command by ``txlearn.cli``).

Every command opens the gradebook first and stops with one line (exit status 2) when it cannot:
``txlearn: error: gradebook class.db: corrupt (...); the file was left as it is``. The course file
(``--course``) defaults, for ``grade``, to ``course.yaml`` beside the submissions and, for the
others, to the one the latest run recorded; the policy (``--policy``) to the course file's, else
``latest``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_grade_arguments", "start_recording", "add_parsers", "POLICY_HELP"]

POLICY_HELP = ("which run counts for each student and set: latest (the most recent grading) or "
               "best (the highest score after penalty); default: the course file's policy, "
               "else latest")


def _error(text: str) -> int:
    print(f"txlearn: error: {text}", file=sys.stderr)
    return 2


def add_grade_arguments(parser: argparse.ArgumentParser) -> None:
    """The gradebook's options of ``txlearn grade``."""
    parser.add_argument("--gradebook", metavar="FILE",
                        help="record every graded notebook in this SQLite gradebook (made when "
                             "missing; each notebook is one transaction, nothing is overwritten)")
    parser.add_argument("--course", metavar="FILE",
                        help="the course file with deadlines, extensions and the late penalty "
                             "(default: course.yaml beside the student folders, when there is one)")


def start_recording(args, paths: list[Path]):
    """Open the gradebook and course file named by ``args`` and add the run: a Recorder (None
    without ``--gradebook``). Raises GradebookError or CourseFileError before anything is graded."""
    if not getattr(args, "gradebook", None):
        return None
    import txlearn
    from txlearn.course.gradebook.course import find_course_file, load_course
    from txlearn.course.gradebook.record import Recorder
    from txlearn.course.gradebook.store import open_gradebook

    course_path = Path(args.course) if args.course else find_course_file(paths)
    course = load_course(course_path)
    gradebook = open_gradebook(Path(args.gradebook))
    command = "txlearn grade " + " ".join(str(p) for p in paths[:20]) + \
        (f" ... ({len(paths)} notebooks)" if len(paths) > 20 else "")
    return Recorder(gradebook, course, hidden=Path(args.hidden).resolve() if args.hidden else None,
                    command=command, version=txlearn.__version__,
                    earlier=getattr(args, "earlier", "own") or "own")


def _open(args):
    """(gradebook rows, course, policy, gradebook path) for the reading commands."""
    from txlearn.course.gradebook.course import load_course
    from txlearn.course.gradebook.store import open_gradebook

    from txlearn.course.gradebook.store import identity_clashes

    with open_gradebook(Path(args.gradebook), readonly=True) as gb:
        rows = gb.notebooks()
        runs = gb.runs()
    for warning in identity_clashes(rows):
        print(f"txlearn: warning: {warning}", file=sys.stderr)
    course_file = getattr(args, "course", None)
    if not course_file:
        recorded = next((r["course_file"] for r in reversed(runs) if r["course_file"]), "")
        course_file = recorded if recorded and Path(recorded).is_file() else None
    course = load_course(Path(course_file) if course_file else None)
    policy = getattr(args, "policy", None) or course.policy
    return rows, course, policy


def _now() -> str:
    from txlearn.course.gradebook.record import now_utc

    return now_utc()


def _guard(command):
    """Run a command, turning the gradebook's and the course file's errors into one line."""
    def run(args) -> int:
        from txlearn.course.gradebook.course import CourseFileError
        from txlearn.course.gradebook.store import GradebookError

        try:
            return command(args)
        except (GradebookError, CourseFileError, ValueError) as err:
            return _error(str(err))
    return run


@_guard
def _cmd_feedback(args) -> int:
    from txlearn.course.gradebook.feedback import write_feedback

    rows, course, policy = _open(args)
    written = write_feedback(rows, Path(args.out), policy=policy, students=args.student,
                             sets=args.set, generated=_now(), zone=course.zone)
    print(f"wrote {len(written)} feedback page(s) into {args.out} (index: "
          f"{Path(args.out) / 'index.html'}); the run that counts: {policy}")
    return 0


@_guard
def _cmd_report(args) -> int:
    from txlearn.course.gradebook.report import write_report

    rows, course, policy = _open(args)
    json_path = Path(args.json) if args.json else Path(args.out).with_suffix(".json")
    data = write_report(rows, Path(args.out), policy=policy, generated=_now(),
                        source=str(args.gradebook), json_path=json_path, plots=not args.no_plots,
                        roster=sorted(course.roster) or None, time_zone=course.zone_name)
    print(f"wrote {args.out} and {json_path}: {data['students']} student(s), "
          f"{len(data['sets'])} set(s); the run that counts: {policy}")
    return 0


@_guard
def _cmd_export(args) -> int:
    from txlearn.course.gradebook.exports import unidentified, write_export
    from txlearn.course.gradebook.store import counting, readable

    rows, course, policy = _open(args)
    written = write_export(rows, args.format, Path(args.out), course, policy=policy,
                           hidden_visibility=args.hidden_visibility, student=args.student,
                           set_name=args.set, match=args.match,
                           skip_unidentified=args.skip_unidentified)
    for who in unidentified(rows, args.format, course, policy=policy, match=args.match):
        print(f"txlearn: warning: left out, no identity to match on in the roster: "
              f"{readable(who)} (enter their grades by hand)", file=sys.stderr)
    counted = counting(rows, policy)
    ungraded = sum(1 for r in counted.values() if r.status == "ERROR")
    if ungraded and args.format != "gradescope":
        print(f"txlearn: warning: {ungraded} notebook(s) that count were not graded: their "
              f"cells are blank (txlearn report lists them; re-grade them)", file=sys.stderr)
    if args.format in ("canvas", "moodle"):
        missing = sorted(s for s in {s for s, _ in counted} if course.identity(s) is None)
        if missing and not course.roster:
            shown = readable(", ".join(missing[:3]))
            print(f"txlearn: note: the course file has no roster; the {len(missing)} student "
                  f"folder names stand in for the LMS login "
                  f"({shown}{', ...' if len(missing) > 3 else ''})",
                  file=sys.stderr)
    for path in written[:5]:
        print(f"wrote {path}")
    if len(written) > 5:
        print(f"... and {len(written) - 5} more")
    return 0


@_guard
def _cmd_similarity(args) -> int:
    from txlearn.course.gradebook.similarity import write_similarity

    rows, _, policy = _open(args)
    pairs = write_similarity(rows, Path(args.out), policy=policy, top=args.top,
                             generated=_now(), source=str(args.gradebook))
    print(f"wrote {args.out}: {len(pairs)} pair(s) with an unusual shared answer (a pointer for "
          f"a human, never a verdict)")
    return 0


@_guard
def _cmd_merge(args) -> int:
    from txlearn.course.gradebook.merge import merge_gradebooks

    for m in merge_gradebooks(Path(args.target), [Path(s) for s in args.sources]):
        print(f"{m.source}: {m.runs} new run(s), {m.notebooks} new notebook(s) "
              f"({m.known_runs} run(s) and {m.known_notebooks} notebook(s) already in "
              f"{args.target})")
        for warning in m.warnings:
            print(f"txlearn: warning: {warning}", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    """Add ``feedback``, ``report``, ``export``, ``similarity`` and ``merge`` to ``sub``."""
    def reading(name, help_text, description, first=None):
        p = sub.add_parser(name, help=help_text, description=description)
        if first is not None:
            p.add_argument(first[0], **first[1])
        p.add_argument("gradebook", metavar="GRADEBOOK", help="the gradebook (e.g. class.db)")
        p.add_argument("--policy", choices=("latest", "best"), help=POLICY_HELP)
        p.add_argument("--course", metavar="FILE", help="the course file (default: the one the "
                                                        "latest run recorded)")
        return p

    p = reading("feedback", "write one HTML feedback page per student and set",
                "Write one self-contained HTML page per student and set (the run that counts): "
                "their rows, hints, lateness and penalty, integrity notes and their own answer "
                "cells; never a hidden case's inputs or a solution line. Hand each student the "
                "folder named after them.")
    p.add_argument("--out", default="feedback", metavar="DIR", help="default: feedback/")
    p.add_argument("--student", nargs="+", metavar="NAME", help="only these student folders")
    p.add_argument("--set", nargs="+", metavar="SET", help="only these sets")
    p.set_defaults(func=_cmd_feedback)

    p = reading("report", "write what the class got wrong (HTML and JSON)",
                "Per exercise: the pass rate, the mistakes that fired most and on how many "
                "students, the pass rate over re-submissions, what students leave unanswered; "
                "one offline HTML page with plots and a JSON twin.")
    p.add_argument("--out", default="report.html", metavar="FILE", help="default: report.html")
    p.add_argument("--json", metavar="FILE", help="default: the page's name with .json")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.set_defaults(func=_cmd_report)

    p = reading("export", "export grades for a spreadsheet, Canvas, Moodle or Gradescope",
                "wide: one row per student, one column per set (penalties applied); canvas and "
                "moodle: their gradebook import files (identities from the course file's "
                "roster); gradescope: the autograder's results.json (hidden cases as tests of "
                "their own, shown after publishing).",
                first=("format", {"choices": ("wide", "canvas", "moodle", "gradescope")}))
    p.add_argument("--out", required=True, metavar="PATH",
                   help="the file (for gradescope: results.json for one notebook, or a folder)")
    p.add_argument("--student", metavar="NAME", help="gradescope: this student's notebook")
    p.add_argument("--set", metavar="SET", help="gradescope: this set's notebook")
    p.add_argument("--match", choices=("email", "idnumber"), default="email",
                   help="moodle: the identity its import maps on (default email)")
    p.add_argument("--skip-unidentified", action="store_true",
                   help="canvas, moodle: leave out (and list) students without that identity "
                        "instead of refusing")
    p.add_argument("--hidden-visibility", default="after_published",
                   choices=("after_published", "hidden", "after_due_date"),
                   help="gradescope: when students see their hidden-case tests "
                        "(default after_published)")
    p.set_defaults(func=_cmd_export)

    p = reading("similarity", "rank pairs of students with unusually similar answers",
                "Pairs of students whose answer cells match after normalising names, comments "
                "and layout, identical wrong answers first, side by side: a pointer for a human, "
                "never a verdict.")
    p.add_argument("--out", default="similarity.html", metavar="FILE",
                   help="default: similarity.html")
    p.add_argument("--top", type=int, default=50, metavar="N", help="pairs shown (default 50)")
    p.set_defaults(func=_cmd_similarity)

    p = sub.add_parser("merge", help="merge gradebooks from several machines into one",
                       description="Add to TARGET every run and notebook of the SOURCES it does "
                                   "not hold yet (by their UUIDs: merging twice adds nothing).")
    p.add_argument("target", metavar="TARGET", help="the gradebook to add to (made when missing)")
    p.add_argument("sources", nargs="+", metavar="SOURCE")
    p.set_defaults(func=_cmd_merge)
