"""Which catalogued mistake a failed check named: a stable identifier for the hint that fired.

The checks give their hints as module-level constants of their module, tuples of levels from the
concept to the fix (``HINT_NO_SHIFT = ("what does exp() do with a logit of 1000?", ...)`` in
``txlearn/checks/softmax.py``). A failure carries the levels it was raised with, so the hint that
fired is found, without editing any check, by matching those levels against the constants of
the exercise's check module:

- ``softmax.HINT_NO_SHIFT``: the levels equal a module-level constant (a tuple of strings, or a
  string for a one-level hint) of check module ``softmax``; ``heads.DEFAULTS[mask]``: they equal
  the value under key ``mask`` of a module-level dict; the first constant in the module's order
  wins when two hold the same text;
- ``softmax.hint-1a2b3c4d``: the fallback for a hint written inline or built at run time (an
  f-string): the first 8 hex digits of the SHA-256 of its first level, stable as long as that
  text is; a failed hidden case (the instructor's own hints) gets ``softmax.hidden-1a2b3c4d``;
- fixed words for failures that are not a catalogued mistake: ``stub`` (still
  ``NotImplementedError``), ``timeout``, ``changed-input`` (changed an argument in place),
  ``missing`` (the answer cell does not define it), ``not-in-copy``, ``unusable`` (the check could
  not use what the code returned), ``needs:<exercise>`` (an earlier exercise it uses fails),
  ``<module>.raised`` / ``<module>.wrong`` (a failure without any hint), ``error`` (not graded).

:func:`is_unanswered` says which of them mean the learner left the exercise unanswered.
Source: issue 24 ("the catalogued mistake or hint that fired (its identifier, not only text)").
"""

from __future__ import annotations

import hashlib
import re
import threading

__all__ = ["mistake_id", "hint_text", "check_module", "is_unanswered", "UNANSWERED"]

FIXED = {"stub": "stub", "timeout": "timeout", "inplace": "changed-input", "missing": "missing",
         "not-in-copy": "not-in-copy", "unusable": "unusable"}
UNANSWERED = ("stub", "missing", "not-in-copy")
_NEEDS = re.compile(r"fix (\w+) first")

_lock = threading.Lock()
_modules: dict[str, str] = {}              # exercise -> check module stem ("" unknown)
_tables: dict[str, dict[tuple, str]] = {}  # stem -> {levels: constant name}


def _levels(value) -> tuple[str, ...] | None:
    """A constant's value as hint levels, or None when it is not one."""
    if isinstance(value, str):
        return (value,) if value else None
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    return None


def _table(namespace: dict) -> dict[tuple, str]:
    """{levels: name} of a check module's public module-level constants (first name wins)."""
    out: dict[tuple, str] = {}
    for name, value in namespace.items():
        if name.startswith("_") or not name.isupper():
            continue
        levels = _levels(value)
        if levels:
            out.setdefault(levels, name)
        elif isinstance(value, dict):
            for key, item in value.items():
                levels = _levels(item)
                if levels and isinstance(key, (str, int)):
                    out.setdefault(levels, f"{name}[{key}]")
    return out


def check_module(exercise: str) -> str:
    """The stem of the check module that defines ``exercise`` ("" when none does); loads that
    module once per process to read its constants."""
    with _lock:
        if exercise in _modules:
            return _modules[exercise]
        from txlearn import checks
        try:
            fn, stem = checks.find(exercise)
        except KeyError:
            _modules[exercise] = ""
            return ""
        _modules[exercise] = stem
        if stem not in _tables:
            _tables[stem] = _table(fn.__globals__)
        return stem


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:8]


def mistake_id(exercise: str, kind: str, hints, *, hidden: bool = False,
               status: str = "FAIL") -> str:
    """The identifier of what a failed exercise got wrong (module docstring); "" for a pass.

    ``kind``: the failure's ``CheckFailure.kind`` (or the grader's: ``missing``,
    ``not-in-copy``, ``unusable``); ``hints``: its hint levels (a tuple of strings); ``hidden``:
    it failed on a hidden case; ``status``: the row's status (PASS and RETIRED have none, ERROR
    is ``error``)."""
    if status in ("PASS", "RETIRED"):
        return ""
    if status == "ERROR":
        return "error"
    if kind.startswith("concept:"):   # a concept answer: the check and the option chosen
        return f"{exercise}={kind.removeprefix('concept:')}"
    if kind in FIXED:
        return FIXED[kind]
    levels = tuple(h for h in (hints or ()) if isinstance(h, str) and h)
    if kind == "dependency":
        found = _NEEDS.search(" ".join(levels))
        return f"needs:{found.group(1)}" if found else "needs:earlier"
    stem = check_module(exercise) or "unknown"
    if not levels:
        return f"{stem}.{kind or 'wrong'}"
    table = _tables.get(stem, {})
    if levels in table:
        return f"{stem}.{table[levels]}"
    for known, name in table.items():   # a check may pass the first levels of a constant only
        if known[: len(levels)] == levels:
            return f"{stem}.{name}"
    return f"{stem}.{'hidden' if hidden else 'hint'}-{_digest(levels[0])}"


def hint_text(hints) -> str:
    """The first level of a failure's hint (the concept it names), "" when it has none."""
    levels = [h for h in (hints or ()) if isinstance(h, str) and h]
    return levels[0] if levels else ""


def is_unanswered(mistake: str) -> bool:
    """Whether a mistake identifier means the exercise was left unanswered (a stub, an answer
    cell that defines nothing the check needs, or an exercise missing from the copy)."""
    return mistake in UNANSWERED
