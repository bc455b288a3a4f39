"""The txlearn command: build, release and grade the course's notebooks; write the book; train
and sample.

Run ``txlearn --help`` or ``txlearn COMMAND --help``.
"""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

# jsonschema (imported by nbformat, which every command but `train` reads notebooks with) imports
# rfc3987_syntax when it is installed (Jupyter's dependencies bring it) only to check the "iri"
# string format, which no notebook schema uses; it builds a Lark parser at import: 2 s of every
# command on this machine, 13 s under heavy load (python -X importtime). Refused here, the
# format checker is skipped as when the package is missing.
sys.modules.setdefault("rfc3987_syntax", None)

GRADE_HELP = """\
Grade exercise notebooks. The grader never runs a submission's code: each notebook gets its own
runner in a bubblewrap sandbox (no network, no view of your files, only numpy, torch and the
packages the set declares, limits on time, memory, processes and output), which runs the
course's setup cells and the notebook's answer cells (never its check cells nor cells it added)
and answers the grader's calls with copies of the checks' arrays; the checks and hidden cases run
in the grader and decide the verdict. Prints one row per exercise (PASS, FAIL, or ERROR "not graded: <reason>"; RETIRED rows
are not counted), a score per notebook and its integrity notes (check cells edited or removed,
metadata altered, banned imports attempted, files changed outside the runner's folder).

The exercise set comes from each file's name (01_softmax.ipynb), or --set; the student is the
file's folder; symbolic links are refused. Exit status: 0 when every file was graded (whatever
the scores), 1 when some could not be, 2 when the run could not start.

Sandbox: bubblewrap (Debian/Ubuntu: apt-get install bubblewrap). Without it, only your own work/
notebooks are graded (unsandboxed); anything else needs --no-sandbox, which runs the code as you
and prints what that risks, or, where each submission has a container of its own (Gradescope, a
Kubernetes job; bubblewrap cannot start in Docker's default profile), --container (or
TXLEARN_SANDBOX=container): resource limits and the seccomp filter, no file view of its own
(docs/containers.md says what it protects and what it does not). Limits per set are declared in its source (exercises/source/, limits:).

--hidden DIR: instructor-only cases. DIR holds one Python file per check module, named like it
(softmax.py for lesson 01's exercises, attention.py for 02, ...), defining one function per
exercise, named like the exercise (helpers start with _), that takes the same objects as the
public check and raises txlearn.checks.CheckFailure on a wrong answer, e.g.

    from txlearn.checks import call, expect_close
    def stable_softmax(softmax):
        got = call(softmax, [[3.0, 3.0, 3.0]], case="ties")
        expect_close(got, [[1/3, 1/3, 1/3]], case="ties")

A misnamed file or function is an error. Hidden cases run in the grader, after every public case
of the notebook; the sandbox never sees the file, and a failed hidden case says only that it
failed (its case name and hint: no values, no exception text). The public cases ship with the
course, so grades that count need hidden cases.

--gradebook FILE: record every graded notebook in a SQLite gradebook, one transaction per
notebook as it is graded (re-grading adds a run, never overwrites one; a run killed half-way
keeps the notebooks it finished). Deadlines, extensions and the late penalty come from the
course file (--course, default course.yaml beside the student folders); when a notebook was
submitted, from its manifest.csv, else the file's modification time. Then: txlearn feedback,
report, export, similarity and merge read the gradebook.
"""


def _cmd_build(args) -> int:
    from txlearn.course import build

    if args.check:
        try:
            problems = build.drift()
        except build.BuildError as err:
            print(f"txlearn build --check: error: {err}", file=sys.stderr)
            return 1
        if problems:
            print("txlearn build --check: generated notebooks are out of date:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            print("run `txlearn build` and commit the result (a learner who saved executed "
                  "lessons restores them with `git checkout notebooks/`)", file=sys.stderr)
            return 1
        print("txlearn build --check: every generated notebook matches its source")
        return 0
    try:
        changed = build.build_course()
    except build.BuildError as err:
        print(f"txlearn build: error: {err}", file=sys.stderr)
        return 1
    for path in changed:
        print(f"wrote {path.relative_to(build.ROOT)}" if path.exists()
              else f"removed {path.relative_to(build.ROOT)}")
    print(f"txlearn build: {len(changed)} file(s) changed")
    return 0


def _cmd_release(args) -> int:
    from txlearn.course import build

    try:
        written = build.release(Path(args.dest))
    except FileExistsError as err:
        print(f"txlearn: error: {err}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


def _cmd_update_work(args) -> int:
    from txlearn.course import update

    for u in update.update_work(Path(args.dest)):
        if u.created:
            print(f"new exercise notebook: {u.path}")
        elif u.added == ["<unreadable>"]:
            print(f"txlearn: warning: {u.path} is not a readable notebook; left as it is",
                  file=sys.stderr)
        elif u.added or u.concepts:
            what = list(u.added) + [f"concept check {c}" for c in u.concepts]
            print(f"{u.path}: added {', '.join(what)} (your answers are unchanged; "
                  f"backup: {u.backup})")
        else:
            print(f"{u.path}: refreshed the set's introduction (backup: {u.backup})")
    return 0


def _cmd_book(args) -> int:
    from txlearn.course import book

    def report(page) -> None:
        if page.seconds is not None:
            print(f"wrote {page.path} (executed in {page.seconds:.1f} s, "
                  f"{page.figures} figure(s))", flush=True)
        elif page.kind not in ("contents", "reference"):
            print(f"wrote {page.path}", flush=True)

    try:
        pages = book.write_book(Path(args.dest), lessons=args.lessons,
                                execute_lessons=not args.no_execute, timeout=args.cell_timeout,
                                progress=report)
    except book.BookError as err:
        print(f"txlearn: error: {err}", file=sys.stderr)
        return 1
    modules = sum(page.kind == "reference" for page in pages)
    print(f"wrote the API reference: {modules} module pages in {Path(args.dest) / 'reference'}")
    index = Path(args.dest) / "index.html"
    print(f"wrote {index}: open it in a browser (the folder works offline and from a zip)")
    return 0


def _expand(patterns: list[str]) -> tuple[list[Path], int]:
    """The files the patterns name, in order, and how many patterns matched nothing."""
    paths, unmatched = [], 0
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            print(f"txlearn: error: {pattern}: no file matches", file=sys.stderr)
            unmatched += 1
        paths.extend(Path(m) for m in matches)
    return paths, unmatched


def _cmd_grade(args) -> int:
    from txlearn.course.gradebook import cli as gradebook_cli
    from txlearn.course.gradebook.course import CourseFileError
    from txlearn.course.gradebook.store import GradebookError

    paths, unmatched = _expand(args.notebooks)
    if not paths:
        return 1
    if args.jobs is not None and args.jobs < 1:
        print("txlearn: error: --jobs must be at least 1", file=sys.stderr)
        return 2
    try:   # the gradebook opens (or refuses to) before anything is graded or even imported
        recorder = gradebook_cli.start_recording(args, paths)
    except (GradebookError, CourseFileError) as err:
        print(f"txlearn: error: {err}", file=sys.stderr)
        return 2
    from txlearn.checks import clean
    from txlearn.course import grading
    from txlearn.course.grading import sandbox

    if args.no_sandbox:
        import getpass
        print("txlearn: warning: " + sandbox.NO_SANDBOX_RISKS.format(user=getpass.getuser()),
              file=sys.stderr)
    elif args.container or sandbox.container_wanted():
        print("txlearn: note: " + sandbox.CONTAINER_RISKS, file=sys.stderr)
    try:
        subs = grading.grade(paths, hidden=Path(args.hidden) if args.hidden else None,
                             set_name=args.set, jobs=args.jobs, no_sandbox=args.no_sandbox,
                             container=args.container, on_graded=recorder,
                             earlier=args.earlier)
    except grading.GradingError as err:
        print(f"txlearn: error: {err}", file=sys.stderr)
        return 2
    except GradebookError as err:
        print(f"txlearn: error: {err} (the notebooks graded before it are recorded)",
              file=sys.stderr)
        return 2
    for sub in subs:
        if sub.error:
            print(clean(f"txlearn: error: {sub.path}: {sub.error}", 600), file=sys.stderr)
    if any(s.mode == "plain" for s in subs) and not args.no_sandbox:
        print("txlearn: note: graded without a sandbox (your own work/; bubblewrap is not "
              "installed): the notebooks' code ran as you, able to read and write your files; "
              "install bubblewrap to grade anyone else's work", file=sys.stderr)
    print(grading.table(subs))
    if args.csv:
        grading.write_csv(subs, Path(args.csv))
        print(f"wrote {args.csv}")
    if args.json:
        grading.write_json(subs, Path(args.json))
        print(f"wrote {args.json}")
    if recorder is not None:
        recorder.finish()
        for problem in recorder.unrecordable:
            print(clean(f"txlearn: error: recorded as not graded: {problem}", 600),
                  file=sys.stderr)
        print(f"recorded {recorder.recorded} notebook(s) in the gradebook {args.gradebook}"
              + (f" (run {recorder.run[:8]})" if recorder.run else ""))
        for warning in recorder.warnings:
            print(f"txlearn: warning: {warning}", file=sys.stderr)
    unrecorded = recorder is not None and recorder.unrecordable
    return 1 if any(s.error for s in subs) or unmatched or unrecorded else 0


def _cmd_try_hidden(args) -> int:
    from txlearn.course.grading import GradingError, hidden_trial

    try:
        trials = hidden_trial.try_hidden(Path(args.hidden), args.set, jobs=args.jobs)
    except GradingError as err:
        print(f"txlearn: error: {err}", file=sys.stderr)
        return 2
    print(hidden_trial.explain(trials))
    return 1 if any(t.outcome != "pass" for t in trials) else 0


def parser(with_training: bool = True) -> argparse.ArgumentParser:
    from txlearn.course.gradebook import cli as gradebook_cli
    from txlearn.course.lms import cli as lms_cli

    top = argparse.ArgumentParser(prog="txlearn", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("build", help="generate notebooks/ and exercises/{student,solutions}/ "
                                     "from their sources")
    p.add_argument("--check", action="store_true",
                   help="write nothing; fail if a generated notebook differs from its source")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser("release", help="write the student notebooks (no solutions) into DEST")
    p.add_argument("dest", metavar="DEST", help="folder to create or fill; nothing is overwritten")
    p.set_defaults(func=_cmd_release)

    p = sub.add_parser("update-work", help="copy new exercise notebooks into DEST and add new "
                                           "exercises to your copies there (make lab runs it)")
    p.add_argument("dest", metavar="DEST", help="your working folder, e.g. work/")
    p.set_defaults(func=_cmd_update_work)

    p = sub.add_parser("book", help="execute every lesson into an offline HTML book in DEST",
                       description="Execute every lesson and write the course as HTML pages: a "
                       "contents page, each lesson with its figures and typeset math, each "
                       "exercise set's statements (no solutions), the guides of docs/ and the API "
                       "reference generated from the docstrings. Everything, MathJax included, "
                       "is inside DEST and linked by relative paths: the folder works offline "
                       "and from a zip. A previous book in DEST is replaced.")
    p.add_argument("dest", metavar="DEST", nargs="?", default="build/book",
                   help="the book's folder (default: build/book)")
    p.add_argument("--lessons", nargs="+", metavar="NN",
                   help="only these lessons (numbers like 01 or names like 01_softmax)")
    p.add_argument("--no-execute", action="store_true",
                   help="render the lessons without running them (text, code and math only)")
    p.add_argument("--cell-timeout", type=int, default=1200, metavar="SECONDS",
                   help="time allowed per cell (default 1200)")
    p.set_defaults(func=_cmd_book)

    p = sub.add_parser("grade", help="grade exercise notebooks", description=GRADE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK",
                   help="notebook files or quoted glob patterns ('submissions/*/01_*.ipynb')")
    p.add_argument("--set", metavar="NAME",
                   help="the exercise set of every file (e.g. 01_softmax); default: each file's "
                        "name")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="notebooks graded at once (default: the number of CPU cores)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run the submissions' code without bubblewrap (prints what it risks)")
    p.add_argument("--container", action="store_true",
                   help="container mode, for a container per submission (Gradescope): limits "
                        "and the seccomp filter without bubblewrap (docs/containers.md)")
    p.add_argument("--hidden", metavar="DIR", help="folder of instructor-only cases (see above)")
    p.add_argument("--earlier", choices=("own", "reference"), default="own",
                   help="where sets that use earlier sets' answers (04, 07, 09, 10) get them: "
                        "own (the student's notebooks beside it; default) or reference (the "
                        "course's solutions: a mistake there is not charged again)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--csv", metavar="FILE", help="write one row per exercise to FILE")
    out.add_argument("--json", metavar="FILE", help="write the results, nested per notebook")
    gradebook_cli.add_grade_arguments(p)
    p.set_defaults(func=_cmd_grade)
    gradebook_cli.add_parsers(sub)
    lms_cli.add_parsers(sub)

    p = sub.add_parser("try-hidden", help="run your hidden cases on the course's solutions and "
                                          "explain each failure",
                       description="Grade the course's solution of every set with a hidden case "
                       "in DIR, with those cases, and say for each exercise whether they pass it; "
                       "a failure names the case, got vs expected and the check's reason (what "
                       "students are never shown). Exit status 1 when one fails.")
    p.add_argument("hidden", metavar="DIR", help="the hidden-case folder (as for grade --hidden)")
    p.add_argument("--set", nargs="+", metavar="NAME", help="only these sets")
    p.add_argument("--jobs", type=int, metavar="N", help="notebooks graded at once")
    p.set_defaults(func=_cmd_try_hidden)

    if with_training:
        from txlearn.training import cli  # imports torch: only for the commands that need it

        cli.add_train_parser(sub)
        cli.add_sample_parser(sub)
    else:
        for name in _TRAINING_COMMANDS:
            sub.add_parser(name)  # listed among the choices; never parsed on this path
    return top


_TRAINING_COMMANDS = ("train", "sample")


def _needs_training(argv: list[str]) -> bool:
    """Whether the command line names train/sample or shows the top-level help (which lists
    them): only then is torch imported, so build, release and grade start fast."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return command is None or command in _TRAINING_COMMANDS


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser(with_training=_needs_training(argv)).parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("txlearn: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a user error from a subcommand: one line, no traceback
        user_error = getattr(sys.modules.get("txlearn.training.data"), "UserError", None)
        if user_error is not None and isinstance(err, user_error):
            print(f"txlearn: error: {err}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
