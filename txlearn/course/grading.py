"""Grade exercise notebooks: the grader decides every verdict; each submission runs sandboxed.

``txlearn grade`` treats every submission as hostile. Two processes take part:

- the **grader** (this module, trusted) reads the notebook as data, never runs a line of it, and
  runs the exercise checks of :mod:`txlearn.checks` itself: their cases, hidden cases and hints
  stay in its process;
- a **runner** (:mod:`txlearn.course.runner`), one per submission, started in a bubblewrap sandbox
  (:mod:`txlearn.course.sandbox`), executes the notebook's setup and answer cells (never its
  check cells, nor cells the learner added) and then only answers requests: call this function
  with these arrays, build this module, load this state, run forward and backward
  (:mod:`txlearn.course.protocol`: JSON and ``.npy`` bytes, never pickle).

The checks reach the learner's objects through proxies (:class:`txlearn.checks.LearnerObject`), so
nothing the learner's code prints, patches, writes or kills can change a verdict but its own.

Per submission: the set comes from the file name (or ``--set``), never from the notebook's metadata;
the student is the submission's own folder; symbolic links are refused. A file that cannot be
graded (not a notebook, odd metadata, a missing sibling notebook of an earlier set, a runner that
died) gets status ERROR, "not graded: <reason>", without stopping the others. A cell that runs past
its limit is named ("your answer cell did not finish within 20 s") and the runner restarts without
it; a call past its limit fails that exercise. An exercise the copy lacks fails with "not in your
copy: run make lab"; one the course retired is RETIRED and not counted. The integrity column
(informational) lists check cells edited or removed, metadata altered, banned imports attempted and
files changed outside the runner's private folder during its run.

Source of the design: issue 11 ("Grading an instructor can trust"); nbgrader and otter-grader
for the two halves (checks in the grader, each submission isolated).
"""

from __future__ import annotations

import ast
import csv
import difflib
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from txlearn.checks import (LearnerChangedInput, LearnerError, LearnerObject, LearnerTimeout,
                            clean, run_exercise)
from txlearn.course import build, protocol, sandbox

__all__ = ["grade", "table", "write_csv", "write_json", "validate_hidden", "sandbox_modes",
           "GradingError", "Result", "Submission", "CSV_FIELDS"]

MAX_NOTEBOOK_BYTES = 50 << 20
GRACE_SECONDS = 3.0        # how long past a limit the grader waits before killing the runner
START_SECONDS = 60.0       # the runner's start (Python and NumPy; torch loads with the cells)
CHECKS_DIR = Path(__file__).resolve().parents[1] / "checks"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
DIED_IN_HIDDEN = ("not graded: the runner died, broke the protocol or ran out of time during the "
                  "hidden cases (its exit status, output and reply are not shown: they could carry "
                  "a hidden case's inputs)")
NOT_IN_COPY = ("not in your copy: run make lab (it adds the course's new exercises to your copy "
               "and keeps your answers)")


class GradingError(Exception):
    """A file cannot be graded (the reason in one line), or the grading run cannot start."""


class RunnerDied(BaseException):
    """The runner stopped or broke the protocol: its submission is not graded. A BaseException, so
    that the checks' handlers of the learner's exceptions let it through."""


class _CannotCross(BaseException):
    """A check handed the learner's code something that cannot cross to the sandbox (a course
    bug: checks pass data or given(...) callables)."""


class _WallTimeout(Exception):
    """The runner did not answer within its limit; the grader killed it."""


@dataclass
class Result:
    """One exercise of one notebook: the row of the table, the CSV and the JSON."""

    student: str
    notebook: str
    exercise: str
    status: str = "FAIL"   # PASS, FAIL, ERROR (not graded) or RETIRED (not counted)
    points: int = 0
    max_points: int = 1
    feedback: str = ""
    flagged: str = ""      # the answer tried to import what the set does not allow
    integrity: str = ""    # the submission's integrity notes (informational)
    kind: str = ""         # the failure's CheckFailure.kind ("" when it passed or was not run)
    hints: tuple = ()      # the failure's hint levels, as the check wrote them (for the gradebook)
    hidden: bool = False   # it failed on a hidden case


@dataclass
class Submission:
    """One graded (or not graded) notebook."""

    path: Path
    student: str
    set_name: str = ""
    error: str = ""                       # "not graded: ..." when the file could not be graded
    mode: str = ""                        # "bwrap", "plain" or "" (not started)
    results: list[Result] = field(default_factory=list)
    integrity: list[str] = field(default_factory=list)
    output_dropped: int = 0               # bytes of printed output dropped by the caps
    digest: str = ""                      # SHA-256 of the notebook's bytes, as graded
    graded_at: str = ""                   # when its grading ended (ISO 8601, UTC)

    @property
    def points(self) -> int:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> int:
        return sum(r.max_points for r in self.results)


# ---- the course side: what each set expects --------------------------------------------------

def _exercise_modules() -> dict[str, str]:
    """Exercise name -> the stem of its check module, read from the ``@exercise("...")``
    decorators of ``txlearn/checks/*.py`` (without importing them)."""
    found = {}
    for path in sorted(CHECKS_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "exercise" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                found[str(node.args[0].value)] = path.stem
    return found


def _check_objects(cell_source: str, name: str) -> list[str]:
    """The names a check cell passes to ``check(name, ...)``."""
    for node in ast.walk(ast.parse(cell_source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check":
            args = node.args[1:]
            if not all(isinstance(a, ast.Name) for a in args):
                raise GradingError(f"the check cell of {name} passes something other than names")
            return [a.id for a in args]
    raise GradingError(f"the check cell of {name} does not call check()")


@dataclass
class CourseSet:
    """What the course says about one exercise set (from its source, built once per run)."""

    name: str
    info: build.SetInfo
    names: list[str]                      # current exercises, in order
    check_ids: dict[str, str]             # exercise -> id of its check cell
    check_sources: dict[str, str]
    objects: dict[str, list[str]]         # exercise -> the names its check cell passes
    metadata: dict                        # metadata.txlearn of the student notebook
    allowed: list[str]                    # what answers may import (with the sets it uses)
    course_cells: list = field(default_factory=list)  # (id, exercise or "", pristine source)
    view_modules: list[str] = field(default_factory=list)
    view_dir: str = ""


def _load_set(source: Path, stems: dict[str, str]) -> CourseSet:
    student, _ = build.build_exercises(source)
    info = build.set_info(build.read_source(source), source.stem, source.name)
    checks = [c for c in student.cells if build.is_check(c)]
    names = [c.metadata["exercise"] for c in checks]
    allowed, seen, todo = set(info.imports), {source.stem}, list(info.uses)
    while todo:
        used = todo.pop()
        if used in seen:
            continue
        seen.add(used)
        used_source = build.find_source(used)
        if used_source is None:
            raise GradingError(f"{source.name} uses {used}, which is not an exercise set")
        used_info = build.set_info(build.read_source(used_source), used, used_source.name)
        allowed |= set(used_info.imports)
        todo += list(used_info.uses)
    unknown = [n for n in names if n not in stems]
    if unknown:
        raise GradingError(f"no check module defines {', '.join(unknown)}")
    return CourseSet(
        name=source.stem, info=info, names=names,
        check_ids={c.metadata["exercise"]: c.id for c in checks},
        check_sources={c.metadata["exercise"]: c.source for c in checks},
        objects={c.metadata["exercise"]: _check_objects(c.source, c.metadata["exercise"])
                 for c in checks},
        metadata=dict(student.metadata.get("txlearn", {})), allowed=sorted(allowed),
        course_cells=[(c.id, c.metadata.get("exercise", "") if build.is_answer(c) else "",
                       c.source) for c in student.cells
                      if c.cell_type == "code" and not build.is_check(c)])


def _module_file(name: str) -> Path | None:
    rel = Path(*name.split(".")[1:])
    for candidate in (PACKAGE_DIR / rel.with_suffix(".py"), PACKAGE_DIR / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _txlearn_imports(path: Path, module: str) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("txlearn.")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base == "txlearn" or base.startswith("txlearn."):
                if base != "txlearn":
                    out.add(base)
                out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if _module_file(m) is not None}


_ALWAYS_IN_VIEW = ("txlearn.course.protocol", "txlearn.course.runner", "txlearn.course.earlier")


def _view_modules(cs: CourseSet, stems: dict[str, str]) -> list[str]:
    """The txlearn modules the sandbox shows for a set: what it declares and what they import."""
    todo = [m for m in cs.allowed if m.startswith("txlearn.")]
    missing = [m for m in todo if _module_file(m) is None]
    if missing:
        raise GradingError(f"{cs.name} declares imports of {', '.join(missing)}, which do not "
                           f"exist")
    found = set()
    while todo:
        module = todo.pop()
        if module in found:
            continue
        found.add(module)
        todo += sorted(_txlearn_imports(_module_file(module), module) - found)
    graded = {f"txlearn.{stems[n]}" for n in cs.names}
    clash = sorted(found & graded)
    if clash or any(m.startswith("txlearn.checks") for m in found):
        raise GradingError(f"{cs.name} may import {', '.join(clash) or 'txlearn.checks'}, which "
                           f"implements its own exercises (a course bug: fix its imports)")
    return sorted(found | set(_ALWAYS_IN_VIEW))


def _make_view(dest: Path, modules: list[str]) -> None:
    """Write the synthetic txlearn tree the sandbox sees: minimal package files, copies of
    ``modules`` and nothing else."""
    (dest / "txlearn").mkdir(parents=True)
    packages = {"txlearn"}
    for module in modules:
        parts = module.split(".")
        packages |= {".".join(parts[:i]) for i in range(1, len(parts))}
        if _module_file(module).name == "__init__.py":
            packages.add(module)
    for package in sorted(packages):
        folder = dest.joinpath(*package.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        init = folder / "__init__.py"
        if package in modules:
            shutil.copyfile(_module_file(package), init)
        else:
            init.write_text(f'"""{package} as the grading sandbox shows it: only the modules '
                            f'this exercise set may import."""\n', encoding="utf-8")
    for module in modules:
        path = _module_file(module)
        if path.name != "__init__.py":
            shutil.copyfile(path, dest.joinpath(*module.split(".")).with_suffix(".py"))
    for folder, dirs, files in os.walk(dest):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def _all_txlearn_modules() -> list[str]:
    out = []
    for path in PACKAGE_DIR.rglob("*.py"):
        rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return sorted(out)


# ---- hidden cases ----------------------------------------------------------------------------

def validate_hidden(folder: Path) -> None:
    """Check an instructor's hidden-case folder before any grading.

    Each ``*.py`` file must be named like a check module and each public function in it like an
    exercise of that module. Raises GradingError naming the first problem, with a did-you-mean.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise GradingError(f"--hidden {folder}: not a folder")
    stems = _exercise_modules()
    by_module: dict[str, list[str]] = {}
    for name, stem in stems.items():
        by_module.setdefault(stem, []).append(name)
    for path in sorted(folder.iterdir()):
        if path.name.startswith((".", "_")) or path.is_dir():
            continue
        if path.suffix != ".py" or path.stem not in by_module:
            close = difflib.get_close_matches(path.stem, list(by_module), n=1)
            hint = f" (did you mean {close[0]}.py?)" if close else ""
            raise GradingError(f"--hidden: {path.name} is not named like a check module "
                               f"({', '.join(f'{m}.py' for m in sorted(by_module))}){hint}")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError as err:
            raise GradingError(f"--hidden: {path.name}, line {err.lineno}: {err.msg}") from None
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    not node.name.startswith("_") and node.name not in by_module[path.stem]:
                close = difflib.get_close_matches(node.name, by_module[path.stem], n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise GradingError(f"--hidden: {path.name} defines {node.name}, which is not an "
                                   f"exercise of {path.stem} ({', '.join(by_module[path.stem])})"
                                   f"{hint}; name helpers with a leading underscore")


# ---- reading a submission ----------------------------------------------------------------------

def _read_notebook(path: Path, sub: Submission | None = None) -> dict:
    """The notebook at ``path`` as plain JSON data, its structure checked (else GradingError);
    ``sub.digest`` gets the SHA-256 of the bytes read."""
    if path.is_symlink():
        raise GradingError("it is a symbolic link (submit the notebook file itself)")
    if Path(os.path.abspath(path)).parent.is_symlink():   # the student is this folder: a link
        # (say, in an extracted archive) would grade another folder's notebooks under its name
        raise GradingError("its folder is a symbolic link (submit the notebook in a folder of "
                           "its own)")
    if not path.is_file():
        raise GradingError("no such file")
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        raise GradingError(f"larger than {MAX_NOTEBOOK_BYTES >> 20} MB")
    data = path.read_bytes()
    if sub is not None:
        sub.digest = hashlib.sha256(data).hexdigest()
    try:
        nb = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as err:
        first = (str(err).splitlines() or [""])[0][:120]
        raise GradingError(f"not a readable notebook ({type(err).__name__}: {first})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise GradingError("not a notebook (no list of cells)")
    if nb.get("nbformat") != 4:
        raise GradingError(f"nbformat {str(nb.get('nbformat'))[:10]}: only version 4 notebooks "
                           f"are graded")
    meta = nb.get("metadata", {})
    if not isinstance(meta, dict):
        raise GradingError("odd metadata: the notebook's metadata is not a mapping")
    if "txlearn" in meta and not isinstance(meta["txlearn"], dict):
        raise GradingError(f"odd metadata: metadata.txlearn is a {type(meta['txlearn']).__name__},"
                           f" not a mapping")
    for number, cell in enumerate(nb["cells"], start=1):
        where = f"odd metadata: cell {number}"
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise GradingError(f"{where} is not a notebook cell")
        source = cell.get("source", "")
        if not (isinstance(source, str) or isinstance(source, list)
                and all(isinstance(s, str) for s in source)):
            raise GradingError(f"{where}: its source is not text")
        cmeta = cell.get("metadata", {})
        if not isinstance(cmeta, dict):
            raise GradingError(f"{where}: its metadata is not a mapping")
        tags = cmeta.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise GradingError(f"{where}: its tags are a {type(tags).__name__}, not a list of "
                               f"words")
        if "exercise" in cmeta and not isinstance(cmeta["exercise"], str):
            raise GradingError(f"{where}: its exercise name is not text")
        if "id" in cell and not isinstance(cell["id"], str):
            raise GradingError(f"{where}: its id is not text")
    return nb


def _text(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


@dataclass
class _Cell:
    index: int          # the position among the notebook's cells
    source: str
    exercise: str       # "" for a setup cell
    label: str


def _plan(nb: dict, cs: CourseSet) -> tuple[list[_Cell], set[str], list[str], set[str]]:
    """The cells the runner executes, the current exercises the copy has, its integrity notes,
    and the retired exercises it still has.

    The runner executes the course's code cells in the course's order: each setup cell as the
    course wrote it (the copy's own version, edited or not, never runs; a setup cell is trusted
    course code), and for each exercise the copy's answer cells. Cells the learner added, and
    check cells, never run."""
    answers: dict[str, list[tuple[int, str]]] = {}
    retired, notes = set(), []
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {})
        tags = meta.get("tags", [])
        if "answer" not in tags or not meta.get("exercise") or "check" in tags:
            continue
        name = meta["exercise"]
        if name in cs.info.retired:
            retired.add(name)
        elif name not in cs.names:
            notes.append(f"an answer cell names an unknown exercise {clean(name, 40)!r}")
        else:
            answers.setdefault(name, []).append((index, _text(cell)))
    present = set(answers)
    mine_by_id = {c.get("id"): c for c in nb["cells"] if c.get("cell_type") == "code"}
    cells, setup, done = [], 0, set()
    for cid, exercise, source in cs.course_cells:
        if not exercise:
            setup += 1
            mine = mine_by_id.get(cid)
            if mine is not None and _text(mine).strip() != source.strip():
                notes.append(f"setup cell {setup} edited (the course's version ran)")
            cells.append(_Cell(SETUP_INDEX + setup, source, "", f"setup cell {setup}"))
        elif exercise in answers and exercise not in done:
            done.add(exercise)
            for index, text in answers[exercise]:
                cells.append(_Cell(index, text, exercise, f"answer cell of {exercise}"))
    by_id = {c.get("id"): c for c in nb["cells"]}
    for name in cs.names:
        if name not in present:
            continue
        mine = by_id.get(cs.check_ids[name])
        if mine is None:
            notes.append(f"check cell of {name} removed")
        elif _text(mine).strip() != cs.check_sources[name].strip():
            notes.append(f"check cell of {name} edited")
    meta = nb.get("metadata", {}).get("txlearn")
    if meta is not None:   # "version" differs between the handout and the solutions
        changed = [k for k in ("set", "generated_from") if meta.get(k) != cs.metadata.get(k)]
        if changed:
            notes.append(f"notebook metadata altered (txlearn.{', txlearn.'.join(changed)})")
    return cells, present, notes, retired


# ---- files the learner's code must not touch -----------------------------------------------------

def _watched(sub_path: Path, hidden: Path | None) -> list[Path]:
    _, _, sys_path, _ = sandbox.python_layout()
    out = [PACKAGE_DIR, build.ROOT / "exercises", sub_path.parent]
    out += [Path(p) for p in sys_path if p.endswith("site-packages")]
    if hidden is not None:
        out.append(Path(hidden))
    return out


def _fingerprint(folders: list[Path]) -> dict[str, tuple]:
    """Size and modification time of the files in ``folders`` (the package and the exercises
    recursively; a submission's folder and the hidden cases: their own files), and for a
    site-packages folder its listing and the digests of its ``*.pth`` files."""
    out = {}
    for folder in folders:
        recursive = folder in (PACKAGE_DIR, build.ROOT / "exercises")
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            if folder.name == "site-packages":
                for name in dirs + files:
                    key = os.path.join(root, name)
                    out[key] = ("listed",)
                    if name.endswith(".pth"):
                        try:
                            out[key] = (hashlib.sha256(Path(key).read_bytes()).hexdigest(),)
                        except OSError:
                            out[key] = ("unreadable",)
                break
            for name in files:
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out[path] = (st.st_size, st.st_mtime_ns)
            if not recursive:
                break
    return out


def _changes(before: dict, after: dict) -> list[str]:
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return changed


# ---- the runner, seen from the grader ------------------------------------------------------------

def _format_cell_error(cell: _Cell, reply: dict) -> str:
    who = "your answer cell" if cell.exercise else f"your {cell.label}"
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    # the runner's text is the learner's: one line each, so that it cannot add a "Hint:" line
    # or a score line of its own to the table and the CSV
    if err.get("type") == "SyntaxError":
        return clean(f"SyntaxError in {who}, line {err.get('lineno')}: {err.get('message', '')}",
                     300)
    text = clean(f"{who} raised {err.get('type', 'an error')}: {err.get('message', '')}", 300)
    frames = err.get("frames") if isinstance(err.get("frames"), list) else []
    return "\n".join([text] + [f"  {clean(f, 160)}" for f in frames[-2:]])


class _Session:
    """The grader's end of one submission's runner: starts it, runs the cells (restarting without
    a cell that ran past its limit), and serves the proxies' requests."""

    def __init__(self, cs: CourseSet, cells: list[_Cell], limits: dict, mode: str,
                 files: list[tuple[str, str]], uid: int | None):
        self.cs, self.cells, self.limits, self.mode = cs, cells, limits, mode
        self.files, self.uid = files, uid
        self.process = None
        self.generation = 0
        self.seq = 0
        self.skip: set[int] = set()
        self.cell_errors: dict[int, str] = {}
        self.names: dict[str, dict] = {}
        self.output_dropped = 0
        self.banned: list[dict] = []
        self.frozen = False      # set once hidden cases start: no more self-reports are read
        self.seconds = float(limits.get("notebook_seconds", 600))
        self.deadline = time.monotonic() + self.seconds     # the whole notebook, restarts included

    # -- the process --
    def _start(self):
        self.close()
        config = {"limits": self.limits, "imports": self.cs.allowed,
                  "view_modules": self.cs.view_modules, "txlearn_modules": _TXLEARN_MODULES}
        packages = None
        if self.mode == "bwrap":   # only numpy, torch and what the set declares are installed
            tops = tuple(sorted({m.split(".")[0] for m in self.cs.allowed
                                 if not m.startswith("txlearn")} - {"numpy", "torch"}))
            try:
                packages = sandbox.package_entries(tops)
            except RuntimeError as err:
                raise RunnerDied(str(err)) from None
        self.process = sandbox.start(mode=self.mode, view_dir=self.cs.view_dir, files=self.files,
                                     limits=self.limits, config=config, uid=self.uid,
                                     packages=packages)
        self.generation += 1
        try:
            hello = sandbox.wait_hello(self.process, START_SECONDS)
            if self.uid is not None and hello.get("uid") != self.uid:
                raise protocol.ProtocolError(f"it runs as uid {hello.get('uid')}, not "
                                             f"{self.uid}")
        except (EOFError, TimeoutError, protocol.ProtocolError) as err:
            why = self.process.why_dead() if isinstance(err, EOFError) else str(err) or \
                "it did not start in time"
            output = self.process.sink.text().strip()
            self.close()
            raise RunnerDied(f"the runner did not start ({why})"
                             + (f": {output.splitlines()[-1][:200]}" if output else "")) from None

    def freeze(self) -> None:
        """Stop reading what the runner reports about itself (called before any hidden case):
        the output dropped so far is counted now, nothing after."""
        if self.process is not None and not self.frozen:
            self.output_dropped += self.process.sink.dropped
        self.frozen = True

    def close(self):
        if self.process is not None:
            if not self.frozen:
                self.output_dropped += self.process.sink.dropped
            self.process.kill()
            self.process = None

    def boot(self):
        """Start the runner and run the cells; a cell past its limit is skipped from then on."""
        for _ in range(len(self.cells) + 1):
            self._start()
            if all(self._run_cell(c) for c in self.cells if c.index not in self.skip):
                try:
                    reply, _ = self._request({"op": "names"}, timeout=30)
                except _WallTimeout:
                    raise RunnerDied("the runner stopped answering (listing your names)") from None
                self.names = reply.get("names", {}) if isinstance(reply.get("names"), dict) else {}
                return
        raise RunnerDied("every cell ran past its limit")

    def _run_cell(self, cell: _Cell) -> bool:
        seconds = float(self.limits["cell_seconds"])
        try:
            reply, _ = self._request({"op": "cell", "index": cell.index, "source": cell.source,
                                      "label": cell.label, "time_limit": seconds},
                                     timeout=seconds + GRACE_SECONDS)
        except _WallTimeout:
            reply = {"timeout": seconds}
        if "timeout" in reply:
            who = "your answer cell" if cell.exercise else f"your {cell.label}"
            self.cell_errors[cell.index] = f"{who} did not finish within {seconds:g} s"
            self.skip.add(cell.index)
            return False
        self.output_dropped += int(reply.get("dropped", 0) or 0)
        if reply.get("skipped"):
            self.cell_errors[cell.index] = (f"your {cell.label} imports txlearn.checks, so it was "
                                            f"not run (the grader runs the checks itself)")
        elif not reply.get("ok"):
            self.cell_errors[cell.index] = _format_cell_error(cell, reply)
        return True

    def _past_limit(self) -> RunnerDied:
        self.close()
        return RunnerDied(f"the notebook ran past its limit of {self.seconds:g} s in all")

    def _request(self, msg: dict, blobs=(), *, timeout: float):
        if time.monotonic() >= self.deadline:
            raise self._past_limit()
        if self.process is None:
            self.boot()
        self.seq += 1
        msg = dict(msg, id=self.seq)
        deadline = min(time.monotonic() + timeout, self.deadline)
        channel = self.process.channel
        try:
            channel.send(msg, list(blobs), deadline)
            reply, reply_blobs = channel.recv(deadline)
        except TimeoutError:
            if time.monotonic() >= self.deadline:
                raise self._past_limit() from None
            self.close()
            raise _WallTimeout() from None
        except EOFError:
            why = self.process.why_dead()
            self.close()
            raise RunnerDied(f"the runner died: {why}") from None
        except protocol.ProtocolError as err:
            self.close()
            raise RunnerDied(f"the runner's reply broke the protocol ({err})") from None
        if reply.get("id") != self.seq:
            self.close()
            raise RunnerDied("the runner's replies are out of step (something wrote to its "
                             "channel)")
        return reply, reply_blobs

    def report(self) -> None:
        if self.process is None or self.frozen:
            return
        try:
            reply, _ = self._request({"op": "report"}, timeout=30)
        except (_WallTimeout, RunnerDied):
            return
        banned = reply.get("banned", [])
        if isinstance(banned, list):
            self.banned += [b for b in banned if isinstance(b, dict)][:50]

    # -- the proxies' requests --
    def _ref(self, value):
        if isinstance(value, _Remote) and value._session is self:
            if value._generation not in (None, self.generation):
                raise _Stale()
            return {"ref": value._ref}
        raise protocol.ProtocolError(f"a {type(value).__name__} cannot cross to the sandbox")

    def act(self, op: str, target: "_Remote", values: dict, time_limit, label: str):
        cap = float(self.limits["call_seconds"])
        seconds = cap if time_limit is None else min(float(time_limit), cap)
        encoder = protocol.Encoder(on_other=self._ref)
        try:
            payload = {k: encoder.encode(v) for k, v in values.items()}
            ref = self._ref(target)["ref"]
        except _Stale:
            raise LearnerError("RuntimeError", "this object was lost when the runner restarted "
                                               "after a timeout") from None
        except protocol.ProtocolError as err:
            raise _CannotCross(f"the check of this exercise hands your code something that "
                               f"cannot cross to the sandbox ({err}); a course bug") from None
        msg = {"op": op, "target": ref, "time_limit": seconds, "label": label, **payload}
        try:
            reply, blobs = self._request(msg, encoder.blobs, timeout=seconds + GRACE_SECONDS)
        except _WallTimeout:
            raise LearnerTimeout(seconds) from None
        if "timeout" in reply:
            raise LearnerTimeout(seconds)
        if not reply.get("ok"):
            err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            frames = [str(f)[:160] for f in err.get("frames", [])][:6] \
                if isinstance(err.get("frames"), list) else []
            raise LearnerError(str(err.get("type", "Error"))[:80],
                               str(err.get("message", ""))[:2000], frames)
        decoder = protocol.Decoder(blobs, on_handle=self._handle)
        try:
            mutated = reply.get("mutated", [])
            if not isinstance(mutated, list) or not all(isinstance(m, list) and len(m) == 2
                                                        for m in mutated):
                raise protocol.ProtocolError("bad list of changed arguments")
            return decoder.decode(reply.get("value")), [(k, decoder.decode(v))
                                                        for k, v in mutated]
        except protocol.ProtocolError as err:
            self.close()
            raise RunnerDied(f"the runner's reply broke the protocol ({err})") from None

    def _handle(self, obj: dict):
        if "handle" not in obj or not isinstance(obj.get("handle"), int):
            raise protocol.ProtocolError("expected a handle")
        return _remote_class(str(obj.get("type", "object")))(
            self, {"handle": obj["handle"]}, f"your {str(obj.get('type', 'object'))[:40]}",
            bool(obj.get("is_module")), self.generation)

    def proxy(self, name: str) -> "_Remote":
        info = self.names.get(name, {})
        return _remote_class(str(info.get("type", "object")))(
            self, {"name": name}, name, bool(info.get("module")), None)


class _Stale(Exception):
    pass


class _Remote(LearnerObject):
    """A proxy for an object in a submission's runner (a name of its namespace, or a handle to
    something a reply could not send); the checks' call/construct/load_state/... use it."""

    def __init__(self, session, ref, name, is_module, generation):
        self._session, self._ref, self.name = session, ref, name
        self._is_module, self._generation = is_module, generation

    def remote_call(self, args, kwargs, time_limit):
        value, mutated = self._session.act("call", self, {"args": list(args),
                                                          "kwargs": dict(kwargs)},
                                           time_limit, self.name)
        # arrays the learner's code changed in place: the check's own arrays stay as they were
        # (its expected values are computed from them), and the change itself is the failure
        keys = [k for k, _ in mutated
                if (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(args))
                or (isinstance(k, str) and k in kwargs)]
        if keys:
            raise LearnerChangedInput(keys[0] if isinstance(keys[0], str) else int(keys[0]))
        return value

    def remote_load_state(self, state, time_limit):
        self._session.act("load_state", self, {"state": dict(state)}, time_limit, self.name)

    def remote_state_shapes(self, time_limit):
        value, _ = self._session.act("state_shapes", self, {}, time_limit, self.name)
        if not isinstance(value, dict):
            raise RunnerDied("the runner's reply broke the protocol (state shapes)")
        # names are the learner's text: one line each (a name holding "\nHint: ..." added a
        # hint line of its own to the feedback)
        return {clean(k, 200): tuple(v) for k, v in value.items()}

    def remote_forward_backward(self, args, kwargs, grad_output, time_limit):
        value, _ = self._session.act("forward_backward", self,
                                     {"args": list(args), "kwargs": dict(kwargs),
                                      "grad_output": grad_output}, time_limit, self.name)
        if not isinstance(value, tuple) or len(value) != 2:
            raise RunnerDied("the runner's reply broke the protocol (forward_backward)")
        return value

    def remote_is_module(self):
        return self._is_module

    def __repr__(self):
        return f"<{self.name} in the sandbox>"


SETUP_INDEX = 1_000_000   # the runner's numbers for the course's setup cells (above any real index)

_REMOTE_CLASSES: dict[str, type] = {}
MAX_PROXY_CLASSES = 256


def _remote_class(type_name: str) -> type:
    """A proxy class named like the learner's object's type, so a check's message says
    "got function" or "got MyModule" as it would in the learner's kernel."""
    name = "".join(ch for ch in type_name if ch.isalnum() or ch == "_")[:40]
    if not name or not name[0].isalpha():
        name = "object"
    if name not in _REMOTE_CLASSES and len(_REMOTE_CLASSES) >= MAX_PROXY_CLASSES - 1:
        name = "object"  # a runner cannot make the grader keep classes without end
    if name not in _REMOTE_CLASSES:
        _REMOTE_CLASSES[name] = type(name, (_Remote,), {"__module__": __name__})
    return _REMOTE_CLASSES[name]


_TXLEARN_MODULES: list[str] = []


# ---- one submission ----------------------------------------------------------------------------

@dataclass
class _Job:
    number: int
    path: Path
    student: str
    source: Path | None
    mode: str


def _error_rows(sub: Submission, cs: CourseSet | None) -> None:
    names = cs.names if cs is not None else ["-"]
    sub.results = [Result(sub.student, sub.path.name, n, status="ERROR", points=0,
                          max_points=1 if cs is not None else 0, feedback=sub.error,
                          integrity="; ".join(sub.integrity)) for n in names]


def _grade_one(job: _Job, sets: dict[str, CourseSet], hidden: Path | None,
               limits_override: dict) -> Submission:
    sub = Submission(path=job.path, student=job.student, mode=job.mode)
    cs = None
    lease = None
    session = None
    try:
        nb = _read_notebook(job.path, sub)
        if job.source is None:
            raise GradingError(f"no exercise set matches the file name {job.path.name!r} (name "
                               f"it like the handout, NN_name.ipynb, or pass --set)")
        cs = sets[job.source.stem]
        sub.set_name = cs.name
        cells, present, notes, retired = _plan(nb, cs)
        sub.integrity += notes
        files = []
        for used in cs.info.uses:
            sibling = job.path.parent / f"{used}.ipynb"
            if sibling.is_symlink():
                raise GradingError(f"{used}.ipynb beside it is a symbolic link")
            if not sibling.is_file():
                raise GradingError(f"needs {used}.ipynb beside it (this set uses your answers "
                                   f"there)")
            files.append((f"{used}.ipynb", str(sibling)))
        limits = dict(cs.info.limits, **limits_override)
        if job.mode == "bwrap" and os.geteuid() == 0:
            lease = sandbox.UidLease()
        watched = _watched(job.path, hidden)
        before = _fingerprint(watched)
        session = _Session(cs, cells, limits, job.mode, files, lease.uid if lease else None)
        session.boot()
        _run_checks(sub, cs, session, present, retired, hidden)
        session.report()
        session.close()
        changed = _changes(before, _fingerprint(watched))
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
    except _CannotCross as err:
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
        _error_rows(sub, cs)
    else:
        for r in sub.results:
            r.integrity = "; ".join(sub.integrity)
    sub.graded_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return sub


def _verdict(name, objects, namespace, hidden, public=True):
    """run_exercise, with the warnings a learner's odd values may raise kept out of the
    instructor's terminal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_exercise(name, objects, namespace, hidden=hidden, public=public)


def _run_checks(sub: Submission, cs: CourseSet, session: _Session, present: set[str],
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
            verdict = _verdict(name, objects, namespace, None)
        except (RunnerDied, _CannotCross):
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
            result.feedback = "\n".join(prefix + [verdict.failure.feedback(1)])
            result.kind, result.hints = verdict.failure.kind, verdict.failure.hints
    if hidden is not None:
        # what the learner's code reports about itself (banned imports, dropped output) is read
        # now, before it sees any hidden input, and frozen
        session.report()
        session.freeze()
        for result, objects in graded:
            try:
                verdict = _verdict(result.exercise, objects, namespace, hidden, public=False)
            except (RunnerDied, _CannotCross):
                raise
            except Exception as err:  # noqa: BLE001
                verdict = None
                result.feedback = f"a hidden case could not use what your code returned " \
                                  f"({type(err).__name__})"
            if verdict is None or not verdict.passed:
                result.status, result.points, result.hidden = "FAIL", 0, True
                result.kind = "unusable" if verdict is None else verdict.failure.kind
                if verdict is not None:
                    result.feedback = verdict.failure.feedback(1)
                    result.hints = verdict.failure.hints
    for name in sorted(retired):
        sub.results.append(Result(sub.student, sub.path.name, name, status="RETIRED",
                                  max_points=0, feedback=f"retired from the course: "
                                                         f"{cs.info.retired[name]}"[:300]))


# ---- the run -------------------------------------------------------------------------------------

def _in_work(path: Path) -> bool:
    """Whether ``path`` really lies in the repository's ``work/`` (links resolved: a symbolic
    link inside work/ to a folder elsewhere does not count)."""
    try:
        Path(os.path.realpath(path)).relative_to(Path(os.path.realpath(build.ROOT / "work")))
        return True
    except ValueError:
        return False


def sandbox_modes(paths: list[Path], no_sandbox: bool = False) -> list[str]:
    """How each path is graded: ``"bwrap"`` where bubblewrap works, ``"plain"`` with
    ``no_sandbox`` or for a learner's own ``work/`` without bubblewrap. Raises GradingError
    when another path would need a sandbox that is not there."""
    if no_sandbox:
        return ["plain"] * len(paths)
    ok, why = sandbox.available()
    if ok:
        return ["bwrap"] * len(paths)
    outside = [p for p in paths if not _in_work(p)]
    if outside:
        raise GradingError(f"grading {outside[0]} needs a sandbox: {why}; or pass --no-sandbox "
                           f"to run the submissions' code unsandboxed (it prints what that risks)")
    return ["plain"] * len(paths)


def grade(paths: list[Path], hidden: Path | None = None, *, set_name: str | None = None,
          jobs: int | None = None, no_sandbox: bool = False,
          limits: dict | None = None, on_graded=None) -> list[Submission]:
    """Grade notebooks, each in its own sandboxed runner; return one Submission per path, in order.

    ``hidden``: instructor-only cases (:func:`validate_hidden` checks the folder first; format in
    :func:`txlearn.checks.hidden_dir`). ``set_name``: the exercise set of every file (otherwise
    each file's name says it). ``jobs``: submissions graded at once (default: the number of CPU
    cores). ``no_sandbox``: run the runners as plain processes. ``limits``: override the sets'
    sandbox limits (tests shorten them). ``on_graded(sub)``: called in this thread with each
    Submission as soon as it is graded, in the order they finish (the gradebook records each
    notebook then). Originals are only read.

    Raises:
        GradingError: the run cannot start (a misnamed hidden case, an unknown ``set_name``, no
            sandbox for a path that needs one). A file that cannot be graded is not an
            exception: its Submission has ``error`` set and ERROR rows.
    """
    paths = [Path(p) for p in paths]
    if hidden is not None:
        validate_hidden(Path(hidden))
        hidden = Path(hidden).resolve()
    modes = sandbox_modes(paths, no_sandbox)
    forced = None
    if set_name is not None:
        forced = build.find_source(set_name)
        if forced is None:
            raise GradingError(f"--set {set_name}: no such exercise set")
    stems = _exercise_modules()
    if not _TXLEARN_MODULES:
        _TXLEARN_MODULES.extend(_all_txlearn_modules())
    jobs_list = []
    for number, (path, mode) in enumerate(zip(paths, modes)):
        source = forced or build.find_source(path.stem)
        student = Path(os.path.abspath(path)).parent.name
        jobs_list.append(_Job(number, path, student, source, mode))
    sets: dict[str, CourseSet] = {}
    with tempfile.TemporaryDirectory(prefix="txlearn-grade-") as tmp:
        os.chmod(tmp, 0o755)
        for job in jobs_list:
            if job.source is not None and job.source.stem not in sets:
                cs = _load_set(job.source, stems)
                cs.view_modules = _view_modules(cs, stems)
                cs.view_dir = str(Path(tmp) / f"view-{cs.name}")
                _make_view(Path(cs.view_dir), cs.view_modules)
                sets[cs.name] = cs
        workers = max(1, int(jobs or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="txlearn-grade") as pool:
            futures = [pool.submit(_grade_one, job, sets, hidden, dict(limits or {}))
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


# ---- reports -------------------------------------------------------------------------------------

def results(subs: list[Submission]) -> list[Result]:
    return [r for s in subs for r in s.results]


def table(subs: list[Submission]) -> str:
    """A plain-text table (student, notebook, exercise, status, feedback) and a score per notebook.

    The feedback column holds the feedback's first line; its hint, when it has one, follows on a
    line of its own. A notebook that was not graded shows one ERROR row with the reason.
    """
    rows = [("student", "notebook", "exercise", "status", "feedback")]
    hints = {}
    for s in subs:
        shown = s.results[:1] if s.error else s.results
        for r in shown:
            lines = [clean(line, 300) for line in r.feedback.splitlines()]
            first = lines[0] if lines else ""
            if r.flagged:
                first = f"[{clean(r.flagged, 200)}] {first}".strip()
            rows.append((clean(r.student, 60), clean(r.notebook, 60),
                         "-" if s.error else clean(r.exercise, 60), r.status, first))
            hint = next((line for line in lines[1:] if line.startswith("Hint")), "")
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
        score = "not graded" if s.error else f"{s.points}/{s.max_points}"
        lines.append(f"score {clean(s.student, 60)}/{clean(s.path.name, 60)}: {score}")
        if s.integrity:
            lines.append(f"  integrity: {clean('; '.join(s.integrity), 600)}")
    return "\n".join(lines)


CSV_FIELDS = ["student", "notebook", "exercise", "status", "points", "max_points", "feedback",
              "flagged", "integrity"]


def write_csv(subs: list[Submission], path: Path) -> None:
    """One row per exercise (ERROR rows for a notebook that was not graded)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in results(subs):   # learner-made text cleaned: one line each, printable UTF-8
            writer.writerow({k: _no_formula(clean(v, 2000) if k != "feedback" else
                                            "\n".join(clean(x, 2000) for x in v.splitlines()))
                             if isinstance(v, str) else v
                             for k, v in asdict(r).items() if k in CSV_FIELDS})


def _no_formula(text: str) -> str:
    """A CSV cell that a spreadsheet shows as text: one starting with =, +, - or @ (a student
    folder named ``=HYPERLINK(...)`` from an LMS export, say) gets a leading apostrophe."""
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def write_json(subs: list[Submission], path: Path) -> None:
    """The results nested per notebook, with its status, score and integrity notes."""
    data = [{"student": s.student, "notebook": s.path.name, "path": str(s.path),
             "set": s.set_name, "status": "ERROR" if s.error else "GRADED", "error": s.error,
             "points": s.points, "max_points": s.max_points, "integrity": s.integrity,
             "sandbox": s.mode,
             "exercises": [{k: v for k, v in asdict(r).items()
                            if k not in ("student", "notebook", "integrity")}
                           for r in s.results]}
            for s in subs]
    # ensure_ascii (the default) escapes every non-ASCII character, unpaired surrogates included
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
