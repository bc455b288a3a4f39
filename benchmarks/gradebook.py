"""Time the gradebook on a class: 200 students x sets 01-03 graded into it with --jobs 2, what
recording costs over grading without it, and the report, exports, feedback and similarity from it.

Each student folder holds the three notebooks, each a copy of the set's solution in which every
exercise's answer is, by a seeded draw, the solution (50%), one of the catalogued wrong answers
of ``tests/catalogue/`` (30%) or the untouched stub (20%), as in ``benchmarks/grading.py``. The
same 600 notebooks are graded twice in the sandbox with two jobs, after an untimed warm-up: once
without a gradebook and once into a new one (``txlearn grade --gradebook``'s path: a Recorder as
the grader's ``on_graded``); both must give the same verdicts. The time spent inside the
recorder (each notebook's row, lateness, mistake identifiers and its transaction) is measured
too: it runs in the grader's main thread while the workers grade, so the wall-clock difference
is what it costs. Then each reader runs once on that gradebook. Not part of ``make test``.

    .venv/bin/python benchmarks/gradebook.py                  # about 7 minutes here
    .venv/bin/python benchmarks/gradebook.py --students 20    # a quick look
    .venv/bin/python benchmarks/gradebook.py --students 30 --rounds 3   # the overhead, in turn

Targets (issue 24): grading into the gradebook at most 5 minutes; recording at most 5% over
grading without it; the report and every export at most 10 s each. Results:
``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
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


def make_class(folder: Path, students: int, seed: int = 0) -> list[Path]:
    """``students`` folders, each with a notebook of every set; returns the notebooks' paths."""
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
                    cell["source"] = mistake[0] if mistake else stub if roll < 0.5 else solution
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
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="txlearn-bench-gradebook-") as tmp:
        tmp = Path(tmp)
        paths = make_class(tmp / "submissions", args.students, args.seed)
        course = load_course(tmp / "submissions" / "course.yaml")
        grading.grade(paths[:3], jobs=1)                                   # warm-up
        pairs = []
        for number in range(args.rounds):   # without, then with, in turn (load drifts)
            start = time.perf_counter()
            plain = grading.grade(paths, jobs=2)
            without = time.perf_counter() - start
            db = tmp / f"class{number}.db"
            with open_gradebook(db) as gb:
                recorder = TimedRecorder(gb, course, command="benchmark")
                start = time.perf_counter()
                recorded = grading.grade(paths, jobs=2, on_graded=recorder)
                recorder.finish()
                with_gradebook = time.perf_counter() - start
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
            _timed(f"export {fmt}", lambda: write_export(rows, fmt, out / f"{fmt}.csv", course))
        _timed("export gradescope (a results.json per notebook)",
               lambda: write_export(rows, "gradescope", out / "gradescope", course))
        _timed("feedback pages", lambda: write_feedback(rows, out / "feedback"))
        _timed("similarity", lambda: write_similarity(rows, out / "similarity.html"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
