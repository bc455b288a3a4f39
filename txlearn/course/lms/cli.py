"""The commands for the systems a class uses: ``txlearn gradescope``, ``collect`` and
``feedback-upload`` (argparse,
added to the ``txlearn`` command by ``txlearn.cli``). Each stops with one line (exit status 2) on
bad input."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

__all__ = ["add_parsers"]

GRADESCOPE_HELP = """\
Build one Gradescope autograder zip per exercise set (Gradescope: a programming assignment,
"Zip file upload"). Each zip holds setup.sh (Ubuntu's python3 and bubblewrap, a venv with the CPU
build of PyTorch, txlearn's wheel packed in the zip, the set's data), run_autograder (grades
/autograder/submission/ and writes /autograder/results/results.json: a test per exercise and per
exercise's hidden cases), the course's exercise sources, the course file (--course: deadlines,
extensions and the late penalty; lateness from Gradescope's submission time) and the set's
hidden cases (--hidden), which the submission's code cannot read. Students upload the set's
notebook and, for sets that build on earlier answers (04, 07, 09, 10), those notebooks too.
The submission runs in bubblewrap where it starts, else in container mode (docs/containers.md).
"""


def _error(text: str) -> int:
    print(f"txlearn: error: {text}", file=sys.stderr)
    return 2


def _cmd_gradescope(args) -> int:
    from txlearn.course.gradebook.course import CourseFileError
    from txlearn.course.grading.sets import GradingError
    from txlearn.course.lms.gradescope import GradescopeError, build_autograder, build_wheel

    for name, path in (("--hidden", args.hidden), ("--course", args.course),
                       ("--wheel", args.wheel)):
        if path and not Path(path).exists():
            return _error(f"{name} {path}: no such file or folder")
    try:
        with tempfile.TemporaryDirectory(prefix="txlearn-gradescope-") as tmp:
            wheel = Path(args.wheel) if args.wheel else build_wheel(Path(tmp))
            for set_name in args.sets:
                out = build_autograder(set_name, Path(args.out), wheel=wheel,
                                       hidden=Path(args.hidden) if args.hidden else None,
                                       course_file=Path(args.course) if args.course else None,
                                       hidden_visibility=args.hidden_visibility)
                print(f"wrote {out}")
    except (GradescopeError, GradingError, CourseFileError) as err:
        return _error(str(err))
    return 0


def _cmd_collect(args) -> int:
    from txlearn.course.gradebook.course import CourseFileError, load_course
    from txlearn.course.lms.collect import CollectError, collect

    if not Path(args.download).exists():
        return _error(f"{args.download}: no such file or folder")
    try:
        course = load_course(Path(args.course)) if args.course else None
        rows, notes = collect(Path(args.download), Path(args.out), layout=args.layout,
                              set_name=args.set, course=course)
    except (CollectError, CourseFileError) as err:
        return _error(str(err))
    students = {r["student"] for r in rows}
    print(f"wrote {len(rows)} notebook(s) of {len(students)} student(s) into {args.out} and "
          f"{Path(args.out) / 'manifest.csv'}")
    for note in notes:
        print(f"txlearn: warning: {note}", file=sys.stderr)
    return 0


COLLECT_HELP = """\
Turn an LMS's bulk download (a zip, or the folder it was unpacked into) into the folders txlearn
grade reads: OUT/<student>/NN_name.ipynb and OUT/manifest.csv (student, set, submitted_at, and
the LMS's own keys, which the feedback upload needs). Layouts: canvas ("Download Submissions":
name_userid_attachmentid_file, late marker, -N for a file uploaded again), moodle ("Download all
submissions": Full Name_participantid_assignsubmission_file_/file), gradescope ("Export
Submissions": submission_metadata.yml beside submission_<id>/ folders). Only Gradescope's
export carries submission times; for the others submitted_at is left empty and grading says
that lateness then comes from the files' modification times.
"""


def _cmd_feedback_upload(args) -> int:
    from txlearn.course.gradebook.record import now_utc
    from txlearn.course.gradebook.store import GradebookError, open_gradebook
    from txlearn.course.lms.feedback_upload import FeedbackUploadError, pack_feedback

    if not Path(args.manifest).is_file():
        return _error(f"--manifest {args.manifest}: no such file (txlearn collect writes it)")
    try:
        with open_gradebook(Path(args.gradebook), readonly=True) as gb:
            rows = gb.notebooks()
        packed, left_out = pack_feedback(rows, Path(args.manifest), args.lms, args.set,
                                         Path(args.out), policy=args.policy, generated=now_utc())
    except (GradebookError, FeedbackUploadError) as err:
        return _error(str(err))
    print(f"wrote {args.out}: {packed} feedback page(s) for {args.lms}'s bulk upload")
    if left_out:
        print(f"txlearn: warning: {len(left_out)} graded student(s) not in the manifest for "
              f"{args.lms}, left out: {', '.join(left_out[:5])}", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    """Add ``gradescope``, ``collect`` and ``feedback-upload`` to ``sub`` (the ``txlearn``
    command's subparsers)."""
    import argparse

    p = sub.add_parser("feedback-upload", help="pack a set's feedback pages for Canvas's or "
                                               "Moodle's bulk feedback upload",
                       description="Pack each student's feedback page of one set (the run that "
                       "counts) into the zip the LMS's bulk upload reads: canvas (Re-Upload "
                       "Submissions: each page a comment on the student's submission) or moodle "
                       "(Upload multiple feedback files in a zip). The students' LMS keys come "
                       "from the manifest txlearn collect wrote from that LMS's download.")
    p.add_argument("gradebook", metavar="GRADEBOOK", help="the gradebook (e.g. class.db)")
    p.add_argument("--lms", required=True, choices=("canvas", "moodle"))
    p.add_argument("--set", required=True, metavar="SET", help="the set (e.g. 01_softmax)")
    p.add_argument("--manifest", default="submissions/manifest.csv", metavar="FILE",
                   help="collect's manifest (default: submissions/manifest.csv)")
    p.add_argument("--out", required=True, metavar="FILE", help="the zip to write")
    p.add_argument("--policy", choices=("latest", "best"), default="latest",
                   help="which run counts (default: latest)")
    p.set_defaults(func=_cmd_feedback_upload)

    p = sub.add_parser("collect", help="turn a Canvas, Moodle or Gradescope download into "
                                       "submissions/ and its manifest.csv",
                       description=COLLECT_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("download", metavar="DOWNLOAD", help="the download: a zip or a folder")
    p.add_argument("--layout", required=True, choices=("canvas", "moodle", "gradescope"),
                   help="the LMS it came from")
    p.add_argument("--out", default="submissions", metavar="DIR",
                   help="the submissions folder (default: submissions/)")
    p.add_argument("--set", metavar="SET", help="the set of every notebook (default: each "
                                                "file's name)")
    p.add_argument("--course", metavar="FILE", help="a course file whose roster names the "
                                                    "student folders (Canvas id, e-mail)")
    p.set_defaults(func=_cmd_collect)

    p = sub.add_parser("gradescope", help="build a Gradescope autograder zip per exercise set",
                       description=GRADESCOPE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sets", nargs="+", metavar="SET", help="exercise sets (01 or 01_softmax)")
    p.add_argument("--out", default="gradescope", metavar="DIR",
                   help="where the zips go (default: gradescope/)")
    p.add_argument("--hidden", metavar="DIR", help="the hidden-case folder (txlearn grade --help)")
    p.add_argument("--course", metavar="FILE", help="the course file (deadlines, penalty)")
    p.add_argument("--hidden-visibility", default="after_published",
                   choices=("after_published", "hidden", "after_due_date"),
                   help="when students see their hidden-case tests (default after_published)")
    p.add_argument("--wheel", metavar="FILE", help="a txlearn wheel to pack (default: build one)")
    p.set_defaults(func=_cmd_gradescope)
