"""Feedback for each student: one self-contained HTML page per student and set, ready to hand back.

``txlearn feedback class.db --out feedback/`` writes ``feedback/<student>/<set>.html`` for the
run that counts (the policy, :func:`~txlearn.course.gradebook.store.counting`) and an
``index.html`` listing them for the instructor. A page holds the student's rows (status, points,
the grader's feedback and hint for each exercise; a failure on a hidden case named as such), the
raw score, lateness, penalty and final score, the integrity notes, the student's own answer cells
and the history of their runs of that set.

What a page never holds: a hidden case's inputs or expected values (the grader never records
them: a failed hidden case's feedback is its name and hint only), a line of the course's
solutions (only the student's own answer cells and the checks' feedback are shown), anything
that runs (no script; every text escaped, :mod:`~txlearn.course.gradebook.pages`).
"""

from __future__ import annotations

import os
from datetime import timezone
from pathlib import Path

from txlearn.course.gradebook.course import shown_time, zone_name
from txlearn.course.gradebook.pages import Raw, badge, esc, folders, page, pre, slug, table
from txlearn.course.gradebook.record import earlier_sets
from txlearn.course.gradebook.store import NotebookRow, counting

__all__ = ["write_feedback", "feedback_page", "late_text", "what_to_fix", "earlier_note"]


def late_text(seconds: float) -> str:
    """How late, in words: ``on time``, ``3 h 20 min late``, ``2 days 4 h late``."""
    if seconds <= 0:
        return "on time"
    minutes = int(seconds // 60) or 1
    days, minutes = divmod(minutes, 1440)
    hours, minutes = divmod(minutes, 60)
    parts = ([f"{days} day{'s' * (days != 1)}"] if days else []) + \
        ([f"{hours} h"] if hours else []) + ([f"{minutes} min"] if minutes and not days else [])
    return " ".join(parts) + " late"


# what a student does about a notebook that could not be graded, by the grader's reason (its
# first words, as txlearn.course.grading writes them); the first that matches is said
_FIXES = [
    (("not a readable notebook", "not a notebook", "nbformat", "odd metadata"),
     "your upload could not be read as a notebook: re-download it from JupyterLab with "
     "File > Download and submit again"),
    (("larger than", "more than"),
     "your notebook is too large to grade: clear its outputs (Kernel > Restart Kernel and Clear "
     "Outputs), save it and submit again"),
    (("it is a symbolic link", "its folder is a symbolic link", "it is a hard link"),
     "upload the notebook file itself, not a link to it, and submit again"),
    (("no exercise set matches",),
     "name the file as the handout does (NN_name.ipynb, e.g. 01_softmax.ipynb) and submit again"),
    (("needs ",),
     "this set uses your earlier notebooks: submit them together with this one"),
    (("not recorded:",),
     "nothing for you to fix: the grades file could not take your notebook, and your "
     "instructor will grade it again"),
]
FIX_DEFAULT = "ask your instructor what went wrong before you submit again"


def what_to_fix(error: str) -> str:
    """What the student should do about a notebook that could not be graded (``error``, the
    grader's reason): e.g. an upload that is not a notebook is re-downloaded and submitted."""
    reason = error.removeprefix("not graded: ")
    for starts, fix in _FIXES:
        if reason.startswith(starts):
            return fix
    return FIX_DEFAULT


def _score_block(row: NotebookRow, zone) -> str:
    if row.status == "ERROR":
        return (f'<p class="note">Not graded: {esc(row.error.removeprefix("not graded: "))}</p>\n'
                f'<p><strong>What to do:</strong> {esc(what_to_fix(row.error))}.</p>')
    how = "from the file time" if row.submitted_from == "mtime" else "as collected"
    rows = [["raw score", f"{row.points} / {row.max_points}"],
            ["submitted", f"{shown_time(row.submitted_at, zone)} ({how})"]]
    if row.deadline:
        rows.append(["deadline", shown_time(row.deadline, zone) + " (extensions included)"])
        rows.append(["lateness", late_text(row.late_seconds)])
        rows.append(["late penalty", f"{row.penalty:.0%} of the raw score"])
    rows.append(["score", f"{row.score:g} / {row.max_points}"])
    return table(None, rows)


def earlier_note(row: NotebookRow) -> str:
    """What a page says of where a set that uses earlier sets got their answers ("" for a set
    that uses none): the run's policy (``txlearn grade --earlier``)."""
    used = earlier_sets(row.set_name)
    if not used:
        return ""
    if row.earlier == "reference":
        return (f"This set was graded with the course's reference answers for {', '.join(used)} "
                f"in place of your own, so a mistake there is counted in its own set only.")
    return (f"This set was graded with your own answers in {', '.join(used)} (the notebooks "
            f"beside it).")


def _exercise_rows(row: NotebookRow) -> str:
    out = []
    for r in row.results:
        status = badge(r.status) + (" " + badge("hidden case", "hidden") if r.hidden else "")
        text = r.feedback
        if r.hidden:
            text = ("A hidden case (one the course does not publish) failed:\n" + text).strip()
        out.append([r.exercise, Raw(status), f"{r.points} / {r.max_points}",
                    Raw(pre(text) if text else "")])
    return table(["exercise", "status", "points", "feedback"], out)


def _answers(row: NotebookRow) -> str:
    if not row.answers:
        return ""
    order = [r.exercise for r in row.results if r.exercise in row.answers]
    order += sorted(set(row.answers) - set(order))
    parts = [f"<details><summary>{esc(name)}</summary>{pre(row.answers[name])}</details>"
             for name in order]
    return "<h2>Your answer cells, as graded</h2>\n" + "\n".join(parts)


def _history(rows: list[NotebookRow], counted: NotebookRow, zone) -> str:
    if len(rows) < 2:
        return ""
    body = [[shown_time(r.graded_at, zone), shown_time(r.submitted_at, zone), r.digest[:12] or "-",
             "not graded" if r.status == "ERROR" else f"{r.score:g} / {r.max_points}",
             "counts" if r.uuid == counted.uuid else ""] for r in rows]
    return ("<h2>Every grading of this set</h2>\n"
            + table(["graded", "submitted", "notebook (SHA-256)", "score", ""], body))


def feedback_page(row: NotebookRow, history: list[NotebookRow], *, policy: str,
                  generated: str, zone=timezone.utc) -> str:
    """The HTML of one student's feedback page for one set; its times in ``zone`` (the course's
    time zone, named on the page)."""
    hidden_ran = any(r.hidden_cases for r in row.results)
    parts = [_score_block(row, zone)]
    if row.status != "ERROR":
        parts.append("<h2>Exercises</h2>")
        if earlier_note(row):
            parts.append(f'<p class="note">{esc(earlier_note(row))}</p>')
        if hidden_ran:
            parts.append('<p class="note">"PASSED (public cases)" in your notebook means the '
                         'public cases passed; the grader also ran hidden cases, named "hidden" '
                         'below when one failed (their inputs are not shown).</p>')
        parts.append(_exercise_rows(row))
    if row.integrity:
        parts.append("<h2>Integrity notes</h2>\n<ul>"
                     + "".join(f"<li>{esc(n)}</li>" for n in row.integrity) + "</ul>")
    parts.append(_answers(row))
    parts.append(_history(history, row, zone))
    return page(f"Feedback: {row.set_name}", "\n".join(p for p in parts if p),
                subtitle=f"{row.student} · notebook {row.notebook} · graded "
                         f"{shown_time(row.graded_at, zone)}",
                footer=f"Written by txlearn feedback on {shown_time(generated, zone)} from the "
                       f"gradebook (the run that counts: {policy}). Times are in the course's "
                       f"time zone, {zone_name(zone)}. This page needs no network.")


def write_feedback(rows: list[NotebookRow], dest: Path, *, policy: str = "latest",
                   students=None, sets=None, generated: str = "",
                   zone=timezone.utc) -> list[Path]:
    """Write one page per (student, set) that counts into ``dest`` (``<student>/<set>.html``,
    the student's folder name made file-safe and distinct from every other student's,
    :func:`~txlearn.course.gradebook.pages.folders`),
    and ``index.html``; ``students``/``sets`` limit which; ``zone``: the course's time zone
    (:attr:`~txlearn.course.gradebook.course.Course.zone`), in which every page shows its times
    and which it names. Returns the pages' paths."""
    dest = Path(dest)
    counted = counting(rows, policy)
    history: dict[tuple[str, str], list[NotebookRow]] = {}
    for r in rows:
        history.setdefault((r.student, r.set_name), []).append(r)
    written, listing = [], []
    # one folder per student, whatever the names: a student named after a classmate's folder
    # would otherwise be handed (or overwrite) that classmate's page
    folder_of = folders(student for student, _ in counted)
    for (student, set_name), row in sorted(counted.items()):
        if (students and student not in students) or (sets and set_name not in sets):
            continue
        folder = dest / folder_of[student]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{slug(set_name)}.html"
        text = feedback_page(row, history[(student, set_name)], policy=policy,
                             generated=generated, zone=zone)
        tmp = path.with_suffix(".html.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        written.append(path)
        link = f'<a href="{esc(path.relative_to(dest).as_posix())}">{esc(set_name)}</a>'
        listing.append([student, Raw(link), "not graded" if row.status == "ERROR"
                        else f"{row.score:g} / {row.max_points}",
                        f"{row.notebook}: {row.error.removeprefix('not graded: ')}"
                        if row.status == "ERROR" else ""])
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "index.html").write_text(page(
        "Feedback pages", table(["student", "set", "score", "not graded because"], listing),
        subtitle=f"{len(written)} page(s), the run that counts: {policy}. Hand each student "
                 f"their own folder.", footer=f"Written by txlearn feedback on "
                                             f"{shown_time(generated, zone)} "
                                             f"({zone_name(zone)})."),
        encoding="utf-8")
    return written
