"""The sandbox's file view: which txlearn files a set's runner sees, and the synthetic ``txlearn``
tree that holds only those.

The view of a set is what its YAML header declares (``imports:``, with the sets it uses), what
those modules import in turn, and :data:`ALWAYS_IN_VIEW` (the runner, its fork server, the wire
format, the rules shared with the learner's kernel and the earlier-answers loader). A set may
not see the module that implements its own exercises, nor any check: the grader refuses to
start (a course bug).
The view is the real guard of the grading sandbox: what is not in it cannot be imported.
"""

from __future__ import annotations

import ast
import os
import py_compile
import shutil
from functools import lru_cache
from pathlib import Path

from txlearn.checks.registry import exercise_modules
from txlearn.course.grading.sets import CourseSet, GradingError

__all__ = ["ALWAYS_IN_VIEW", "PACKAGE_DIR", "module_file", "view_modules", "make_view",
           "all_txlearn_modules"]

PACKAGE_DIR = Path(__file__).resolve().parents[2]     # txlearn/
ALWAYS_IN_VIEW = ("txlearn.course.grading.protocol", "txlearn.course.grading.runner",
                  "txlearn.course.grading.forkserver", "txlearn.course.earlier",
                  "txlearn.learner_calls")


def module_file(name: str) -> Path | None:
    """The file of txlearn module ``name`` (a module's ``.py`` or a package's ``__init__.py``),
    or None when there is none."""
    rel = Path(*name.split(".")[1:])
    for candidate in (PACKAGE_DIR / rel.with_suffix(".py"), PACKAGE_DIR / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _txlearn_imports(path: Path, module: str) -> set[str]:
    """The txlearn modules the file ``path`` (module ``module``) imports, anywhere in it."""
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
    return {m for m in out if module_file(m) is not None}


# A check module is named like the package module that implements its set, except where the set's
# answers live in several modules: those a set's view must never hold.
IMPLEMENTED_BY = {
    "complexity": ("counting", "measuring", "recurrent", "flash_attention"),
    "capstone": ("sampling", "models.char_lm", "models.minilm", "training.loop",
                 "training.generate"),
    "decoder": ("models.llama", "models.llama_reference"),
}


def view_modules(cs: CourseSet) -> list[str]:
    """The txlearn modules the sandbox shows for a set: what it declares and what they import,
    and :data:`ALWAYS_IN_VIEW`.

    Raises GradingError when a declared module does not exist, or when the view would hold the
    module that implements one of the set's exercises or a check."""
    todo = [m for m in cs.allowed if m.startswith("txlearn.")]
    missing = [m for m in todo if module_file(m) is None]
    if missing:
        raise GradingError(f"{cs.name} declares imports of {', '.join(missing)}, which do not "
                           f"exist")
    found = set()
    while todo:
        module = todo.pop()
        if module in found:
            continue
        found.add(module)
        todo += sorted(_txlearn_imports(module_file(module), module) - found)
    stems = exercise_modules()
    graded = {f"txlearn.{m}" for n in cs.names for m in IMPLEMENTED_BY.get(stems[n], (stems[n],))}
    clash = sorted(found & graded)
    if clash or any(m.startswith("txlearn.checks") for m in found):
        raise GradingError(f"{cs.name} may import {', '.join(clash) or 'txlearn.checks'}, which "
                           f"implements its own exercises (a course bug: fix its imports)")
    return sorted(found | set(ALWAYS_IN_VIEW))


def make_view(dest: Path, modules: list[str]) -> None:
    """Write the synthetic txlearn tree the sandbox sees: minimal package files, copies of
    ``modules`` and nothing else, each compiled once here (its ``__pycache__`` beside it: the
    runners, started with ``-B``, read it and never write one, so without it every runner
    compiled the runner, the wire format and the set's modules again, about 0.1 s each)."""
    (dest / "txlearn").mkdir(parents=True)
    packages = {"txlearn"}
    for module in modules:
        parts = module.split(".")
        packages |= {".".join(parts[:i]) for i in range(1, len(parts))}
        if module_file(module).name == "__init__.py":
            packages.add(module)
    for package in sorted(packages):
        folder = dest.joinpath(*package.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        init = folder / "__init__.py"
        if package in modules:
            shutil.copyfile(module_file(package), init)
        else:
            init.write_text(f'"""{package} as the grading sandbox shows it: only the modules '
                            f'this exercise set may import."""\n', encoding="utf-8")
    for module in modules:
        path = module_file(module)
        if path.name != "__init__.py":
            shutil.copyfile(path, dest.joinpath(*module.split(".")).with_suffix(".py"))
    for path in sorted(dest.rglob("*.py")):
        py_compile.compile(str(path), doraise=True)
    for folder, dirs, files in os.walk(dest):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


@lru_cache(maxsize=1)
def all_txlearn_modules() -> tuple[str, ...]:
    """Every module of the real txlearn package, by full name (the runner's import rule tells a
    txlearn module outside the view from a name that is not txlearn's)."""
    out = []
    for path in PACKAGE_DIR.rglob("*.py"):
        rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return tuple(sorted(out))
