"""Time the gradebook on a class: 200 students x sets 01-03 graded into it with --jobs 2, what
recording costs over grading without it, and the report, exports, feedback and similarity from it.

Each student folder holds the three notebooks, each a copy of the set's solution in which every
exercise's answer is, by a seeded draw, the solution (50%), one of the catalogued wrong answers
of ``tests/catalogue/`` (30%) or the untouched stub (20%), as in ``benchmarks/grading.py``,
except that a wrong answer carries the catalogue module's ``import torch`` only when it uses torch
(``--catalogue-imports`` keeps it: 132 of the 200 set-02 notebooks then import PyTorch, which no
set-02 answer of a learner needs, and cost as much as a set-03 one). The
same 600 notebooks are graded twice in the sandbox with two jobs, after an untimed warm-up: once
without a gradebook and once into a new one (``txlearn grade --gradebook``'s path: a Recorder as
the grader's ``on_graded``); both must give the same verdicts. The time spent inside the
recorder (each notebook's row, lateness, mistake identifiers and its transaction) is measured
too: it runs in the grader's main thread while the workers grade, so the wall-clock difference
is what it costs. Then each reader runs once on that gradebook. Not part of ``make test``.

    .venv/bin/python benchmarks/gradebook.py                  # about 7 minutes here
    .venv/bin/python benchmarks/gradebook.py --students 20    # a quick look
    .venv/bin/python benchmarks/gradebook.py --students 30 --rounds 3   # the overhead, in turn
    .venv/bin/python benchmarks/gradebook.py --students 20 --phases     # where the time goes

Targets (issue 24): grading into the gradebook at most 5 minutes; recording at most 5% over
grading without it; the report and every export at most 10 s each. Results:
``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grading import CATALOGUE, SETS, _answer_cells, _catalogue, _mistake  # noqa: E402

from txlearn.course import build, grading  # noqa: E402
from txlearn.course.grading.sets import load_set  # noqa: E402
from txlearn.course.gradebook import (Recorder, load_course, open_gradebook,  # noqa: E402
                                      write_export, write_feedback, write_report,
                                      write_similarity)


def _needs_torch(answer: str, names: list[str]) -> bool:
    """Whether the functions bound to ``names`` at the end of a catalogued answer cell (``name =
    function``), or the cell's functions they call, use ``torch``."""
    tree = ast.parse(answer)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    todo = [a.value.id for a in tree.body if isinstance(a, ast.Assign)
            and isinstance(a.value, ast.Name) and isinstance(a.targets[0], ast.Name)
            and a.targets[0].id in names]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        used = {n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)}
        if "torch" in used or "nn" in used:
            return True
        todo += sorted(used & set(defs))
    return False


def lean(answer: str, names: list[str]) -> str:
    """A catalogued answer cell without the catalogue module's ``import torch`` when the wrong
    answer it binds does not use torch (a set-02 learner writing NumPy imports no torch; the
    catalogue module imports it for its torch answers)."""
    if _needs_torch(answer, names):
        return answer
    return "".join(line for line in answer.splitlines(keepends=True)
                   if line.strip() not in ("import torch", "from torch import nn"))


def make_class(folder: Path, students: int, seed: int = 0, lean_imports: bool = True
               ) -> list[Path]:
    """``students`` folders, each with a notebook of every set; returns the notebooks' paths.
    ``lean_imports``: a catalogued wrong answer carries ``import torch`` only when it uses torch
    (:func:`lean`); False keeps the catalogue module's imports, as ``benchmarks/grading.py``."""
    rng = random.Random(seed)
    plans = {}
    for set_name in SETS:
        nb, answers = _answer_cells(set_name)
        module, source = _catalogue(CATALOGUE[set_name])
        cs = load_set(build.find_source(set_name))
        plans[set_name] = (nb, answers, module, source, cs.objects)
    paths = []
    for number in range(students):
        for set_name in SETS:
            nb, answers, module, source, objects = plans[set_name]
            copy = json.loads(json.dumps(nb))
            for cell in copy["cells"]:
                exercise = cell.get("metadata", {}).get("exercise")
                if "answer" in cell.get("metadata", {}).get("tags", []):
                    solution, stub = answers[exercise]
                    roll = rng.random()
                    mistake = _mistake(module, source, exercise, objects[exercise], rng) \
                        if roll < 0.3 else None
                    cell["source"] = (lean(mistake[0], objects[exercise]) if lean_imports
                                      else mistake[0]) if mistake else \
                        stub if roll < 0.5 else solution
                if cell.get("cell_type") == "code":
                    cell["outputs"], cell["execution_count"] = [], None
            path = folder / f"student{number:03d}" / f"{set_name}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(copy))
            paths.append(path)
    (folder / "course.yaml").write_text(
        "penalty: {per_day: 0.1, max: 0.5}\n"
        "sets: {01_softmax: 2026-10-05, 02_attention: 2026-10-12, 03_heads: 2026-10-19}\n")
    return paths


class Phases:
    """Seconds per notebook, by set, in each phase of its grading (worker-thread time, so under
    --jobs 2 the phases of two notebooks overlap): the runner's start in the sandbox (bubblewrap,
    Python, NumPy, until it says hello), its cells (the learner's imports, PyTorch's among them,
    and definitions), the checks (in the grader, with the runner answering their calls), and the
    rest (reading the notebook, the files-changed watch, closing)."""

    def __init__(self):
        import collections
        import threading
        from txlearn.course.grading import grade_one, session
        self.seconds = collections.defaultdict(lambda: collections.defaultdict(float))
        self.local = threading.local()
        self._wrap(session.Session, "_start", "start")
        self._wrap(session.Session, "_run_cell", "cells")
        self._wrap(grade_one, "run_checks", "checks")
        original = grade_one.grade_one

        def one(job, *args, **kwargs):
            self.local.set_name = job.path.stem
            start = time.perf_counter()
            try:
                return original(job, *args, **kwargs)
            finally:
                self.seconds[job.path.stem]["total"] += time.perf_counter() - start
                self.seconds[job.path.stem]["notebooks"] += 1
        grade_one.grade_one = one

    def _wrap(self, owner, name, label):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                where = getattr(self.local, "set_name", "?")
                self.seconds[where][label] += time.perf_counter() - start
        setattr(owner, name, timed)

    def print(self):
        for set_name, d in sorted(self.seconds.items()):
            n = d["notebooks"] or 1
            rest = d["total"] - d["start"] - d["cells"] - d["checks"]
            print(f"  {set_name} ({d['notebooks']:.0f} notebooks), s per notebook: start "
                  f"{d['start'] / n:.2f}, cells {d['cells'] / n:.2f}, checks {d['checks'] / n:.2f}, "
                  f"rest {rest / n:.2f}, total {d['total'] / n:.2f}")
        self.seconds.clear()


class TimedRecorder(Recorder):
    """A Recorder that adds up the time spent in it."""

    seconds = 0.0

    def __call__(self, sub) -> None:
        start = time.perf_counter()
        super().__call__(sub)
        self.seconds += time.perf_counter() - start


def _timed(label: str, fn) -> float:
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    print(f"{label}: {seconds:.2f} s", flush=True)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=200, help="students (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="pairs of runs (without, with the gradebook) in turn (default 1)")
    parser.add_argument("--catalogue-imports", action="store_true",
                        help="catalogued wrong answers carry their catalogue module's imports "
                             "(import torch in set 02 too), as before 1 Dec 2026")
    parser.add_argument("--phases", action="store_true",
                        help="print where each set's notebooks spend their time")
    args = parser.parse_args(argv)
    phases = Phases() if args.phases else None
    with tempfile.TemporaryDirectory(prefix="txlearn-bench-gradebook-") as tmp:
        tmp = Path(tmp)
        paths = make_class(tmp / "submissions", args.students, args.seed,
                           lean_imports=not args.catalogue_imports)
        course = load_course(tmp / "submissions" / "course.yaml")
        grading.grade(paths[:3], jobs=1)                                   # warm-up
        if phases:
            phases.seconds.clear()
        pairs = []
        for number in range(args.rounds):   # without, then with, in turn (load drifts)
            start = time.perf_counter()
            load = os.getloadavg()[0]
            plain = grading.grade(paths, jobs=2)
            without = time.perf_counter() - start
            print(f"grading without a gradebook: {without:.1f} s, {without / len(paths):.3f} s "
                  f"per notebook (load average {load:.2f} before, {os.getloadavg()[0]:.2f} "
                  f"after)", flush=True)
            if phases:
                phases.print()
            db = tmp / f"class{number}.db"
            with open_gradebook(db) as gb:
                recorder = TimedRecorder(gb, course, command="benchmark")
                start = time.perf_counter()
                recorded = grading.grade(paths, jobs=2, on_graded=recorder)
                recorder.finish()
                with_gradebook = time.perf_counter() - start
            if phases:
                phases.seconds.clear()
            pairs.append((without, with_gradebook, recorder.seconds))
            if args.rounds > 1:
                print(f"round {number + 1}: {without:.1f} s without, {with_gradebook:.1f} s with "
                      f"({(with_gradebook / without - 1) * 100:+.1f}%), {recorder.seconds:.2f} s "
                      f"inside the recorder", flush=True)
        if args.rounds > 1:
            ratios = sorted(w / wo for wo, w, _ in pairs)
            print(f"median over {args.rounds} rounds: {(ratios[len(ratios) // 2] - 1) * 100:+.1f}%")
        assert [[(r.exercise, r.status) for r in s.results] for s in plain] == \
            [[(r.exercise, r.status) for r in s.results] for s in recorded], "verdicts differ"
        assert not [s.error for s in recorded if s.error]
        statuses = [r.status for s in recorded for r in s.results]
        print(f"{len(paths)} notebooks ({args.students} students x {len(SETS)} sets), "
              f"{len(statuses)} exercises: {statuses.count('PASS')} PASS, "
              f"{statuses.count('FAIL')} FAIL; gradebook {db.stat().st_size / 1e6:.1f} MB")
        print(f"grading without a gradebook, --jobs 2: {without:.1f} s")
        print(f"grading into the gradebook, --jobs 2: {with_gradebook:.1f} s "
              f"({(with_gradebook / without - 1) * 100:+.1f}%)")
        print(f"time inside the recorder: {recorder.seconds:.2f} s in all "
              f"({recorder.seconds / len(paths) * 1000:.1f} ms per notebook, "
              f"{recorder.seconds / without * 100:.1f}% of the grading time)")
        with open_gradebook(db, readonly=True) as gb:
            rows = []
            _timed("reading every row", lambda: rows.extend(gb.notebooks()))
        out = tmp / "out"
        _timed("report (HTML with plots + JSON)",
               lambda: write_report(rows, out / "report.html", source=str(db)))
        for fmt in ("wide", "canvas", "moodle"):
            _timed(f"export {fmt}", lambda: write_export(rows, fmt, out / f"{fmt}.csv", course,
                                                         skip_unidentified=True))
        _timed("export gradescope (a results.json per notebook)",
               lambda: write_export(rows, "gradescope", out / "gradescope", course))
        _timed("feedback pages", lambda: write_feedback(rows, out / "feedback"))
        _timed("similarity", lambda: write_similarity(rows, out / "similarity.html"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
