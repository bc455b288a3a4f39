"""Hidden-case validation: an instructor's ``--hidden DIR`` checked before any grading.

Each file is named like a check module (``softmax.py``, ..., ``capstone.py``, ``decoder.py``: the
stems of :func:`txlearn.checks.registry.exercise_modules`) and each public function in it like
an exercise of that module; the format is :func:`txlearn.checks.hidden_dir`'s. A misnamed file
or function would be a hidden case that silently never runs, so it stops the run instead.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

from txlearn.checks.registry import exercise_modules
from txlearn.course.grading.sets import GradingError

__all__ = ["validate_hidden", "hidden_functions"]


def hidden_functions(folder: Path) -> dict[str, set[str]]:
    """{check module stem: the exercises it has hidden cases for} of a hidden-case folder (the
    public functions of each ``<module>.py``, as the grader reads them); a file that does not
    parse gives none (:func:`validate_hidden` names it)."""
    out: dict[str, set[str]] = {}
    for path in sorted(Path(folder).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        out[path.stem] = {n.name for n in tree.body
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and not n.name.startswith("_")}
    return out


def validate_hidden(folder: Path) -> None:
    """Check an instructor's hidden-case folder before any grading.

    Each ``*.py`` file must be named like a check module and each public function in it like an
    exercise of that module. Raises GradingError naming the first problem, with a did-you-mean.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise GradingError(f"--hidden {folder}: not a folder")
    by_module: dict[str, list[str]] = {}
    for name, stem in exercise_modules().items():
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
