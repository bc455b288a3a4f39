"""Time `txlearn grade` on 40 distinct submissions of exercise sets 01-03, with 1 and 2 jobs.

Each submission is a copy of a set's solution notebook in which every exercise's answer is, by a
seeded draw, the solution (50%), one of the catalogued wrong answers of ``tests/catalogue/``
(30%) or the untouched stub (20%); no two submissions are alike. The same submissions are graded
with ``--jobs 1`` and ``--jobs 2`` (in the sandbox, each submission its own runner), after one
untimed warm-up that loads the checks and PyTorch into the grader; both runs must give the same
verdicts. Not part of ``make test``.

    .venv/bin/python benchmarks/grading.py            # about 2 minutes here
    .venv/bin/python benchmarks/grading.py --n 10     # fewer submissions

Targets (issue 11): at most 3 minutes with ``--jobs 2`` on a 2-core machine, and ``--jobs 2`` at
least 1.7 times faster than ``--jobs 1``. Results: ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from txlearn.course import build, grading  # noqa: E402
from txlearn.course.grading import sets  # noqa: E402

SETS = ("01_softmax", "02_attention", "03_heads")
CATALOGUE = {"01_softmax": "softmax", "02_attention": "attention", "03_heads": "heads"}


def _catalogue(stem):
    module = importlib.import_module(f"tests.catalogue.{stem}")
    source = Path(module.__file__).read_text(encoding="utf-8")
    return module, source[: source.index("REFERENCE = {")]


def _answer_cells(set_name):
    """{exercise: (solution source, stub source)} of a set's answer cells."""
    sol = json.loads((ROOT / "exercises" / "solutions" / f"{set_name}.ipynb").read_text())
    stu = json.loads((ROOT / "exercises" / "student" / f"{set_name}.ipynb").read_text())
    out = {}
    for a, b in zip(sol["cells"], stu["cells"]):
        if "answer" in a.get("metadata", {}).get("tags", []):
            text = lambda c: "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            out[a["metadata"]["exercise"]] = (text(a), text(b))
    return sol, out


def _mistake(module, source, exercise, objects, rng):
    """An answer cell holding one catalogued wrong answer of `exercise`, or None."""
    cases = module.WRONG.get(exercise, [])
    rng.shuffle(cases := list(cases))
    for label, functions, _ in cases:
        if len(functions) != len(objects) or not all(   # module-level functions only (a
                getattr(module, getattr(f, "__name__", ""), None) is f for f in functions):
            continue                                        # lambda has no name to bind)
        names = "\n".join(f"{name} = {f.__name__}" for name, f in zip(objects, functions))
        return f"# catalogued mistake: {label}\n{source}\n{names}\n", label
    return None


def make_submissions(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """Write `n` distinct submissions (one folder per student) and return their paths."""
    rng = random.Random(seed)
    seen, paths = set(), []
    plans = {}
    for set_name in SETS:
        nb, answers = _answer_cells(set_name)
        module, source = _catalogue(CATALOGUE[set_name])
        cs = sets.load_set(build.find_source(set_name))
        plans[set_name] = (nb, answers, module, source, cs.objects)
    while len(paths) < n:
        set_name = SETS[len(paths) % len(SETS)]
        nb, answers, module, source, objects = plans[set_name]
        choice = {}
        for exercise, (solution, stub) in answers.items():
            roll = rng.random()
            mistake = _mistake(module, source, exercise, objects[exercise], rng) \
                if roll < 0.3 else None
            if mistake is not None:
                choice[exercise] = mistake
            elif roll < 0.5:
                choice[exercise] = (stub, "stub")
            else:
                choice[exercise] = (solution, "solution")
        key = (set_name, tuple(sorted((e, c[1]) for e, c in choice.items())))
        if key in seen:
            continue
        seen.add(key)
        copy = json.loads(json.dumps(nb))
        for cell in copy["cells"]:
            exercise = cell.get("metadata", {}).get("exercise")
            if "answer" in cell.get("metadata", {}).get("tags", []):
                cell["source"] = choice[exercise][0]
            if cell.get("cell_type") == "code":
                cell["outputs"], cell["execution_count"] = [], None
        path = folder / f"student{len(paths):02d}" / f"{set_name}.ipynb"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(copy))
        paths.append(path)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="submissions (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="txlearn-bench-") as tmp:
        paths = make_submissions(Path(tmp), args.n, args.seed)
        grading.grade([paths[i] for i in range(min(3, len(paths)))], jobs=1)   # warm-up
        times, verdicts = {}, {}
        for jobs in (2, 1):
            start = time.perf_counter()
            subs = grading.grade(paths, jobs=jobs)
            times[jobs] = time.perf_counter() - start
            verdicts[jobs] = [[(r.exercise, r.status) for r in s.results] for s in subs]
            errors = [s.error for s in subs if s.error]
            assert not errors, errors
        assert verdicts[1] == verdicts[2], "the verdicts depend on --jobs"
        statuses = [st for sub in verdicts[1] for _, st in sub]
        counts = ", ".join(f"{sum(p.stem == s for p in paths)} of {s}" for s in SETS)
        print(f"{len(paths)} submissions ({counts}); "
              f"{len(statuses)} exercises: {statuses.count('PASS')} PASS, "
              f"{statuses.count('FAIL')} FAIL")
        print(f"--jobs 1: {times[1]:.1f} s ({times[1] / len(paths):.2f} s per submission)")
        print(f"--jobs 2: {times[2]:.1f} s ({times[2] / len(paths):.2f} s per submission)")
        print(f"speed-up: {times[1] / times[2]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
