"""Grade exercise notebooks: pristine check cells re-inserted into a copy, run under nbval.

nbval compares a cell's output with the output stored in the notebook under test, so a learner's
own saved notebook proves nothing. `grade` therefore works on a copy of each submission: it drops
every check cell the submission has (edited, moved or not), strips all stored outputs, re-inserts
the pristine check cells built from the exercise source, each with its expected
``PASSED: <exercise>`` output, after the answer cell of the same exercise name (at the end when no
such cell remains), and runs ``pytest --nbval-lax`` on the copies. The original files are only
read.

Security: grading executes the submission's code with the rights of whoever runs it. Grade other
people's notebooks inside a container or under a throw-away account.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from txlearn.course import build

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PLUGIN = '''
import json, os

def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        with open(os.environ["TXLEARN_GRADE_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps({"nodeid": report.nodeid, "when": report.when,
                                  "outcome": report.outcome,
                                  "text": report.longreprtext or ""}) + "\\n")
'''


@dataclass
class Result:
    """One exercise of one notebook: the row of the table, the CSV and the JSON."""

    student: str
    notebook: str
    exercise: str
    status: str = "FAIL"  # PASS or FAIL
    points: int = 0
    max_points: int = 1
    feedback: str = ""
    flagged: str = ""  # e.g. "imports txlearn's own softmax"
    syntax_error: str = ""  # a SyntaxError in the exercise's answer cell, reported as feedback


@dataclass
class Submission:
    path: Path
    student: str
    set_name: str
    copy: Path | None = None
    cell_exercise: dict[int, str] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)


class GradingError(Exception):
    """A file cannot be graded (not a notebook, unknown exercise set); one line for the user."""


def _pristine_checks(source: Path) -> tuple[list[str], dict]:
    """Exercise names in order, and each one's check cell (with its expected output)."""
    _, solution = build.build_exercises(source)
    checks = {c.metadata["exercise"]: c for c in solution.cells if build.is_check(c)}
    names = [c.metadata["exercise"] for c in solution.cells if build.is_check(c)]
    return names, checks


def _graded_names(check_cell) -> set[str]:
    """Names of the objects a check cell passes to check() (the graded functions)."""
    names = set()
    for node in ast.walk(ast.parse(check_cell.source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check":
            names |= {a.id for a in node.args[1:] if isinstance(a, ast.Name)}
    return names


def _package_bindings(cells) -> set[str]:
    """Names a learner's cells bind to txlearn's own code (``from txlearn.x import y as z``,
    ``z = txlearn.x.y``); txlearn.checks is exempt."""
    bound = set()
    for cell in cells:
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("txlearn") \
                    and not (node.module or "").startswith("txlearn.checks"):
                bound |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.Assign) and "txlearn" in ast.unparse(node.value):
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return bound


def _syntax_error(source: str) -> str:
    """``"SyntaxError in your answer cell, line N: ..."`` when the cell does not compile (IPython
    magics allowed), else ``""``."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        compile(TransformerManager().transform_cell(source), "<answer cell>", "exec")
    except SyntaxError as err:
        return f"{type(err).__name__} in your answer cell, line {err.lineno}: {err.msg}"
    return ""


def prepare(path: Path, student: str, dest: Path) -> Submission:
    """Write the gradeable copy of the notebook `path` into `dest`; return its Submission.

    Raises:
        GradingError: not a readable notebook, or no exercise set matches it.
    """
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:  # nbformat raises several types for bad JSON / bad schema
        raise GradingError(f"{path}: not a readable notebook ({type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''})") from None
    set_name = nb.metadata.get("txlearn", {}).get("set") or path.stem
    source = build.find_source(set_name)
    if source is None:
        raise GradingError(f"{path}: no exercise set matches {set_name!r}")
    names, checks = _pristine_checks(source)
    sub = Submission(path=path, student=student, set_name=source.stem)

    cells = []
    for cell in nb.cells:
        if build.is_check(cell):
            continue  # the learner's copy of a check cell, edited or not, never counts
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        tags = [t for t in cell.metadata.get("tags", []) if not t.startswith("nbval")]
        cell.metadata["tags"] = tags
        cells.append(cell)
    bound = _package_bindings(c for c in cells if c.cell_type == "code")

    for name in names:
        answers = [i for i, c in enumerate(cells)
                   if build.is_answer(c) and c.metadata.get("exercise") == name]
        position = answers[-1] + 1 if answers else len(cells)
        cells.insert(position, checks[name])
        flagged = sorted(_graded_names(checks[name]) & bound)
        errors = [e for e in (_syntax_error(cells[i].source) for i in answers) if e]
        sub.results.append(Result(
            student, path.name, name,
            flagged=f"uses txlearn's own {', '.join(flagged)}" if flagged else "",
            syntax_error=errors[0] if errors else ""))
    nb.cells = cells
    code_cells = [c for c in cells if c.cell_type == "code"]  # nbval numbers code cells only
    for index, cell in enumerate(code_cells):
        if build.is_check(cell):
            sub.cell_exercise[index] = cell.metadata["exercise"]
    nb.metadata["kernelspec"] = dict(build.KERNELSPEC)
    dest.mkdir(parents=True, exist_ok=True)
    # a set that uses earlier sets loads the learner's answers from the sibling notebooks
    info = build.set_info(build.read_source(source), source.stem, source.name)
    for used in info.uses:
        sibling = path.parent / f"{used}.ipynb"
        if sibling.is_file():
            shutil.copyfile(sibling, dest / sibling.name)
    sub.copy = dest / f"{source.stem}.ipynb"
    nbformat.write(nb, sub.copy)
    return sub


def _feedback(text: str) -> str:
    """The learner-facing part of a failed cell's report."""
    text = ANSI.sub("", text)
    if "Cell outputs differ" in text:
        return ("the check printed something besides its PASSED line "
                "(does your function print? remove the print)")
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("CheckFailure: "):
            return "\n".join(lines[i:]).removeprefix("CheckFailure: ").strip()
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*", line):
            return line.strip()
    if "Timeout" in text or "timed out" in text:
        return "the cell timed out"
    return "the check cell failed (see the notebook for details)"


def _run(subs: list[Submission], workdir: Path, hidden: Path | None, cell_timeout: int) -> None:
    (workdir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (workdir / "conftest.py").write_text(_PLUGIN, encoding="utf-8")
    log = workdir / "results.jsonl"
    env = dict(os.environ, TXLEARN_GRADE_LOG=str(log), MPLBACKEND="Agg")
    env.pop("TXLEARN_HIDDEN", None)
    if hidden is not None:
        env["TXLEARN_HIDDEN"] = str(hidden.resolve())
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
           f"--nbval-cell-timeout={cell_timeout}", "-p", "no:cacheprovider", "-q",
           "-p", "no:xdist", *[str(s.copy.relative_to(workdir)) for s in subs]]
    subprocess.run(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   check=False)
    reports = {}
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            item = json.loads(line)
            if item["outcome"] != "passed" or item["nodeid"] not in reports:
                reports[item["nodeid"]] = item
    for sub in subs:
        rel = sub.copy.relative_to(workdir).as_posix()
        by_name = {r.exercise: r for r in sub.results}
        for index, name in sub.cell_exercise.items():
            report = reports.get(f"{rel}::Cell {index}")
            result = by_name[name]
            if report is None:
                result.feedback = "the check cell did not run (did the kernel die?)"
            elif report["outcome"] == "passed":
                result.status, result.points, result.feedback = "PASS", result.max_points, ""
            else:
                result.feedback = result.syntax_error or _feedback(report["text"])


def grade(paths: list[Path], hidden: Path | None = None, cell_timeout: int = 300
          ) -> tuple[list[Submission], list[str]]:
    """Grade notebooks; return (graded submissions, one-line errors for files that could not be).

    The student is named by each file's parent folder. `hidden`: a folder of instructor-only
    cases (format in :func:`txlearn.checks.hidden_dir`). Originals are never written.
    """
    errors, subs = [], []
    with tempfile.TemporaryDirectory(prefix="txlearn-grade-") as tmp:
        workdir = Path(tmp)
        for number, path in enumerate(paths):
            path = Path(path)
            student = path.resolve().parent.name
            try:
                if not path.is_file():
                    raise GradingError(f"{path}: no such file")
                subs.append(prepare(path, student, workdir / f"s{number:03d}"))
            except GradingError as err:
                errors.append(str(err))
        if subs:
            _run(subs, workdir, hidden, cell_timeout)
    return subs, errors


def results(subs: list[Submission]) -> list[Result]:
    return [r for s in subs for r in s.results]


def table(subs: list[Submission]) -> str:
    """A plain-text table (student, notebook, exercise, status, feedback) and scores.

    The feedback column holds the feedback's first line (what went wrong, in which case); its hint,
    when it has one, follows on a line of its own.
    """
    rows = [("student", "notebook", "exercise", "status", "feedback")]
    hints = {}
    for r in results(subs):
        lines = r.feedback.splitlines()
        first = lines[0] if lines else ""
        if r.flagged:
            first = f"[{r.flagged}] {first}".strip()
        rows.append((r.student, r.notebook, r.exercise, r.status, first))
        hint = next((line for line in lines[1:] if line.startswith("Hint:")), "")
        if hint:
            hints[len(rows) - 1] = hint
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    indent = " " * (sum(widths) + 2 * 4)
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
        if i in hints:
            lines.append(indent + hints[i])
    lines.insert(1, "-" * min(120, max(len(line) for line in lines)))
    lines.append("")
    for s in subs:
        got = sum(r.points for r in s.results)
        total = sum(r.max_points for r in s.results)
        lines.append(f"score {s.student}/{s.path.name}: {got}/{total}")
    return "\n".join(lines)


CSV_FIELDS = ["student", "notebook", "exercise", "status", "points", "max_points", "feedback",
              "flagged"]


def write_csv(subs: list[Submission], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in results(subs):
            writer.writerow({k: v for k, v in asdict(r).items() if k in CSV_FIELDS})


def write_json(subs: list[Submission], path: Path) -> None:
    data = [{"student": s.student, "notebook": s.path.name, "path": str(s.path),
             "points": sum(r.points for r in s.results),
             "max_points": sum(r.max_points for r in s.results),
             "exercises": [{k: v for k, v in asdict(r).items()
                            if k not in ("student", "notebook", "syntax_error")}
                           for r in s.results]}
            for s in subs]
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
