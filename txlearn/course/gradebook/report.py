"""What the class got wrong: per exercise the pass rate, the mistakes that fired most and on how
many students, how it changed over re-submissions, and what students leave unanswered.

``txlearn report class.db --out report.html`` writes one offline HTML page with its plots (inline
SVG) and a JSON twin (``report.json`` beside it, the same numbers). Counting, per set and
exercise, over the run that counts for each student (the policy,
:func:`~txlearn.course.gradebook.store.counting`):

- ``students``: students with a notebook of the set; ``not_graded``: their notebook could not
  be graded (ERROR); ``pass``, ``fail``: PASS and FAIL rows; ``unanswered``: FAIL rows that are a
  stub, define nothing the check needs, or lack the exercise
  (:func:`~txlearn.course.gradebook.mistakes.is_unanswered`); ``pass_rate`` = pass / (students
  - not_graded); ``hidden_failures``: failed on a hidden case;
- ``mistakes``: each mistake identifier that fired, with its hint's first level, on how many
  students in the run that counts (``students``) and in any of their graded runs
  (``students_ever``: mistakes since fixed count too), most frequent first;
- ``earlier``: for a set that uses earlier sets' answers, how many graded students got them from
  their own notebooks (``own``) and how many from the course's reference answers
  (``reference``: ``txlearn grade --earlier reference``), by the run that counts;
- ``not_graded_notebooks``: each notebook of the set that could not be graded in the run that
  counts, with its student, file name, path and the grader's reason (issue 36);
- ``instructor`` (:mod:`~txlearn.course.gradebook.report_instructor`): per set, the students
  behind each mistake, the roster's students with no notebook of it, and later sets' failures
  whose cause is one of its exercises (a set-09 failure through set 03's attention shown as set
  03's mistake);
- ``attempts``: the pass rate of students' first, second, ... distinct submissions (one per
  notebook digest, :func:`~txlearn.course.gradebook.store.attempts`), and ``fixed``: students
  whose first submission failed the exercise and whose last one passes it;
- ``concepts``: per concept check, how many chose each option and its misconception
  (:mod:`~txlearn.course.gradebook.concept_report`).

Source: issue 24 ("What the class got wrong").
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from txlearn.course.gradebook import mistakes as mistake_ids
from txlearn.course.gradebook.course import shown_time, zone_named
from txlearn.course.gradebook.concept_report import (concept_section, concept_summary,
                                                     is_concept_result)
from txlearn.course.gradebook.pages import esc, figure, page, svg_figure, table
from txlearn.course.gradebook.record import earlier_sets
from txlearn.course.gradebook.report_instructor import instructor_section, instructor_view
from txlearn.course.gradebook.store import NotebookRow, attempts, counting, identity_clashes

__all__ = ["class_report", "write_report", "report_page"]

TOP_MISTAKES = 8


def _exercise_order(rows: list[NotebookRow], set_name: str) -> list[str]:
    order: dict[str, int] = {}
    for row in rows:
        if row.set_name == set_name:
            for r in row.results:
                if r.status != "RETIRED" and r.exercise != "-" and \
                        not is_concept_result(r.exercise):
                    order.setdefault(r.exercise, r.position)
    return sorted(order, key=lambda e: (order[e], e))


def _exercise(name: str, counted: list[NotebookRow], history: dict, tries: dict) -> dict:
    graded = [row for row in counted if row.status != "ERROR"]
    mine = {row.student: next((r for r in row.results if r.exercise == name), None)
            for row in graded}
    status = Counter(r.status for r in mine.values() if r is not None)
    unanswered = sum(1 for r in mine.values() if r is not None and r.status == "FAIL"
                     and mistake_ids.is_unanswered(r.mistake))
    now: dict[str, set] = defaultdict(set)
    ever: dict[str, set] = defaultdict(set)
    hints: dict[str, str] = {}
    for student, r in mine.items():
        if r is not None and r.status == "FAIL" and not mistake_ids.is_unanswered(r.mistake):
            now[r.mistake].add(student)
            hints.setdefault(r.mistake, r.hint)
    for student, rows in history.items():
        for row in rows:
            for r in row.results:
                if r.exercise == name and r.status == "FAIL" and \
                        not mistake_ids.is_unanswered(r.mistake):
                    ever[r.mistake].add(student)
                    hints.setdefault(r.mistake, r.hint)
    found = [{"mistake": m, "hint": hints.get(m, ""), "students": len(now.get(m, ())),
              "students_ever": len(ever[m]), "generic": "DEFAULT" in m}
             for m in ever]
    found.sort(key=lambda m: (-m["students_ever"], -m["students"], m["mistake"]))
    by_attempt: dict[int, list[bool]] = defaultdict(list)
    fixed = 0
    for student, submissions in tries.items():
        passed = []
        for row in submissions:
            r = next((r for r in row.results if r.exercise == name), None)
            if row.status != "ERROR" and r is not None:
                passed.append(r.status == "PASS")
        for k, ok in enumerate(passed, start=1):
            by_attempt[k].append(ok)
        if len(passed) > 1 and not passed[0] and passed[-1]:
            fixed += 1
    n = len(counted)
    not_graded = n - len(graded)
    return {
        "exercise": name, "students": n, "not_graded": not_graded,
        "pass": status.get("PASS", 0), "fail": status.get("FAIL", 0), "unanswered": unanswered,
        "pass_rate": round(status.get("PASS", 0) / len(graded), 4) if graded else None,
        "hidden_failures": sum(1 for r in mine.values() if r is not None and r.hidden),
        "mistakes": found,
        "attempts": [{"attempt": k, "students": len(v), "pass": sum(v),
                      "pass_rate": round(sum(v) / len(v), 4)} for k, v in sorted(by_attempt.items())],
        "fixed": fixed,
    }


def class_report(rows: list[NotebookRow], *, policy: str = "latest", generated: str = "",
                 source: str = "", roster=None, time_zone: str = "UTC") -> dict:
    """The report's numbers (the JSON twin), from every stored notebook row; ``roster``: the
    course file's student names, for the instructor view's non-submitters
    (:func:`~txlearn.course.gradebook.report_instructor.instructor_view`, under
    ``instructor``); ``time_zone``: the course's zone by name, in which the page shows its
    times (the JSON keeps them in UTC)."""
    counted = counting(rows, policy)
    tries = attempts(rows)
    sets = sorted({s for _, s in counted})
    out_sets = []
    for set_name in sets:
        mine = [row for (_, s), row in sorted(counted.items()) if s == set_name]
        history: dict[str, list[NotebookRow]] = defaultdict(list)
        for row in rows:
            if row.set_name == set_name and row.status != "ERROR":
                history[row.student].append(row)
        set_tries = {student: t for (student, s), t in tries.items() if s == set_name}
        graded = [row for row in mine if row.status != "ERROR"]
        out_sets.append({
            "set": set_name, "students": len(mine), "not_graded": len(mine) - len(graded),
            "max_points": max((row.max_points for row in graded), default=0),
            "mean_score": round(sum(row.score for row in graded) / len(graded), 4)
            if graded else None,
            "late": sum(1 for row in graded if row.late_seconds > 0),
            "resubmitted": sum(1 for t in set_tries.values() if len(t) > 1),
            "exercises": [_exercise(e, mine, history, set_tries)
                          for e in _exercise_order(rows, set_name)],
            "earlier": dict(sorted(Counter(row.earlier or "own" for row in graded
                                           if earlier_sets(set_name)).items())),
            "concepts": concept_summary(rows, set_name, policy),
            "not_graded_notebooks": [
                {"student": row.student, "notebook": row.notebook, "path": row.path,
                 "reason": row.error.removeprefix("not graded: ")}
                for row in mine if row.status == "ERROR"],
        })
    return {"generated": generated, "timezone": time_zone, "gradebook": source, "policy": policy,
            "students": len({student for student, _ in counted}),
            "notebooks_recorded": len(rows), "identity_warnings": identity_clashes(rows),
            "sets": out_sets, "instructor": instructor_view(rows, counted, roster)}


# ---- the page ---------------------------------------------------------------------------------

def _status_plot(data: dict):
    exercises = data["exercises"]
    names = [e["exercise"] for e in exercises][::-1]
    parts = [("pass", [e["pass"] for e in exercises][::-1], "#4caf50"),
             ("wrong", [e["fail"] - e["unanswered"] for e in exercises][::-1], "#e57373"),
             ("unanswered", [e["unanswered"] for e in exercises][::-1], "#bdbdbd"),
             ("not graded", [e["not_graded"] for e in exercises][::-1], "#ffb74d")]
    fig, ax = figure(7.5, 0.45 * len(names) + 1.2)
    left = [0] * len(names)
    for label, values, colour in parts:
        ax.barh(names, values, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel("students")
    ax.legend(loc="lower right", fontsize=8, ncol=4)
    ax.set_title(f"{data['set']}: the run that counts, per exercise")
    return fig


def _mistake_plot(data: dict):
    found = [(f"{e['exercise']}: {m['mistake']}", m["students_ever"], m["students"])
             for e in data["exercises"] for m in e["mistakes"]]
    found = sorted(found, key=lambda t: -t[1])[:TOP_MISTAKES][::-1]
    if not found:
        return None
    fig, ax = figure(7.5, 0.4 * len(found) + 1.2)
    ax.barh([f[0] for f in found], [f[1] for f in found], color="#90a4ae",
            label="in any of their runs")
    ax.barh([f[0] for f in found], [f[2] for f in found], color="#e57373",
            label="in the run that counts")
    ax.set_xlabel("students")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{data['set']}: the mistakes that fired most")
    return fig


def _attempt_plot(data: dict):
    if not any(len(e["attempts"]) > 1 for e in data["exercises"]):
        return None
    fig, ax = figure(7.5, 3.2)
    for e in data["exercises"]:
        ax.plot([a["attempt"] for a in e["attempts"]], [a["pass_rate"] for a in e["attempts"]],
                marker="o", label=e["exercise"])
    counts: dict[int, int] = {}
    for e in data["exercises"]:
        for a in e["attempts"]:
            counts[a["attempt"]] = max(counts.get(a["attempt"], 0), a["students"])
    ax.set_xticks(sorted(counts), [f"{k}\n({n} student{'s' * (n != 1)})"
                                   for k, n in sorted(counts.items())])
    ax.set_xlabel("submission (1 = the first), and how many students made one")
    ax.set_ylabel("pass rate")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8)
    ax.set_title(f"{data['set']}: the pass rate over re-submissions")
    return fig


def _set_section(data: dict, plots: bool) -> str:
    parts = [f"<h2>{esc(data['set'])}</h2>",
             f"<p>{data['students']} student(s); {data['not_graded']} not graded; mean score "
             f"{esc(data['mean_score'])} of {data['max_points']}; {data['late']} late; "
             f"{data['resubmitted']} re-submitted.</p>"]
    if data.get("earlier"):
        said = {"own": "their own notebooks", "reference": "the course's reference answers"}
        parts.append(f"<p>The earlier sets' answers this set uses came from "
                     + esc("; ".join(f"{said.get(k, k)}: {n} student(s)"
                                     for k, n in data["earlier"].items())) + ".</p>")
    if data.get("not_graded_notebooks"):
        parts.append(f"<h3>Not graded: {len(data['not_graded_notebooks'])} notebook(s) to "
                     f"follow up (their feedback pages say what to fix)</h3>")
        parts.append(table(["student", "notebook", "file", "reason"],
                           [[n["student"], n["notebook"], n["path"], n["reason"]]
                            for n in data["not_graded_notebooks"]]))
    rows = [[e["exercise"], e["students"],
             "-" if e["pass_rate"] is None else f"{e['pass_rate']:.0%}", e["pass"],
             e["fail"] - e["unanswered"], e["unanswered"], e["hidden_failures"], e["fixed"]]
            for e in data["exercises"]]
    parts.append(table(["exercise", "students", "pass rate", "pass", "wrong", "unanswered",
                        "failed a hidden case", "fixed by re-submitting"], rows,
                       numeric={1, 2, 3, 4, 5, 6, 7}))
    if plots:
        parts.append(svg_figure(_status_plot(data)))
        for make in (_mistake_plot, _attempt_plot):
            fig = make(data)
            if fig is not None:
                parts.append(svg_figure(fig))
    parts.append(concept_section(data.get("concepts", [])))
    for e in data["exercises"]:
        if not e["mistakes"]:
            continue
        parts.append(f"<h3>{esc(e['exercise'])}: what went wrong</h3>")
        parts.append(table(
            ["mistake", "its hint", "students now", "students ever"],
            [[m["mistake"] + (" (the check's generic hint)" if m["generic"] else ""), m["hint"],
              m["students"], m["students_ever"]] for m in e["mistakes"]], numeric={2, 3}))
    return "\n".join(parts)


def report_page(data: dict, *, plots: bool = True) -> str:
    """The HTML of the class report (its text escaped; the plots' labels are course text)."""
    body = [f"<p>{data['students']} student(s), {data['notebooks_recorded']} notebook(s) "
            f"recorded; the run that counts: {esc(data['policy'])}. A mistake is the identifier "
            f"of the hint that fired (<code>module.CONSTANT</code> of the check module; "
            f"<code>module.hint-xxxxxxxx</code> for an inline hint).</p>"]
    body += [f'<p class="note">Warning: {esc(w)}</p>' for w in data.get("identity_warnings", [])]
    body += [_set_section(s, plots) + instructor_section(data["instructor"], s["set"])
             if "instructor" in data else _set_section(s, plots) for s in data["sets"]]
    return page("What the class got wrong", "\n".join(body),
                subtitle=f"from {data['gradebook']}", footer=f"Written by txlearn report on "
                f"{shown_time(data['generated'], zone_named(data.get('timezone', 'UTC')))} "
                f"(times in the course's time zone, {data.get('timezone', 'UTC')}); the numbers "
                f"are in the JSON file beside it. This page "
                f"needs no network.")


def write_report(rows: list[NotebookRow], dest: Path, *, policy: str = "latest",
                 generated: str = "", source: str = "", json_path: Path | None = None,
                 plots: bool = True, roster=None, time_zone: str = "UTC") -> dict:
    """Write the report's HTML page to ``dest`` and its JSON twin to ``json_path`` (default:
    ``dest`` with ``.json``); returns the numbers. ``roster``, ``time_zone``: as for
    :func:`class_report`."""
    data = class_report(rows, policy=policy, generated=generated, source=source, roster=roster,
                        time_zone=time_zone)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(report_page(data, plots=plots), encoding="utf-8")
    Path(json_path or dest.with_suffix(".json")).write_text(json.dumps(data, indent=1) + "\n",
                                                             encoding="utf-8")
    return data
