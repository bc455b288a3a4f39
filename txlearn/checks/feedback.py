"""Failure and feedback: :class:`CheckFailure`, its hint levels, the rendering a notebook shows,
and :func:`clean` (learner-made text made safe to show).

A wrong answer raises :class:`CheckFailure`: the case, what differs (shape, first differing index,
got vs expected), the learner's own frames when their code raised, and a hint. Hints come in
levels: the first names the concept, the next ones are more specific (:func:`render` shows one
level; the notebook face, :mod:`txlearn.checks.notebook`, chooses which). A notebook shows at
most :data:`MAX_LINES` lines of it. No hint holds a line of a solution (a test enforces it).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

__all__ = ["CheckFailure", "clean", "render", "MAX_LINES", "STUB"]

MAX_LINES = 8              # the most lines a failure shows in a notebook
# what a stub (the handout's `raise NotImplementedError`) is told, and its hint
STUB = ("not implemented yet (the stub still raises NotImplementedError)",
        "replace the `raise NotImplementedError` line with your code")


def _levels(hint) -> tuple[str, ...]:
    """A hint as a tuple of levels (a plain string is one level)."""
    if hint is None:
        return ()
    if isinstance(hint, str):
        return (hint,)
    return tuple(h for h in hint if h)


class CheckFailure(AssertionError):
    """A learner's answer is wrong: which case, what differs, the learner's frames, hint levels.

    ``str(failure)`` is the feedback at hint level 1; :meth:`feedback` gives another level.
    ``kind`` is ``"wrong"`` (a value differs), ``"stub"`` (still ``NotImplementedError``),
    ``"raised"`` (the learner's code raised), ``"timeout"``, ``"dependency"`` (an earlier
    exercise this one uses fails) or ``"missing"`` (the answer is not defined).
    """

    def __init__(self, what: str, *, case: str | None = None, hint=None, kind: str = "wrong",
                 frames: Sequence[str] = (), exercise: str | None = None):
        self.what, self.case, self.hints, self.kind = what, case, _levels(hint), kind
        self.frames, self.exercise = tuple(frames), exercise
        self.level_shown = 1    # the hint level a notebook shows (the notebook face sets it)
        super().__init__(self.feedback(1))

    def feedback(self, level: int = 1) -> str:
        """The feedback text with hint ``level`` (1 = the concept; clipped to the last level)."""
        head = f"case '{self.case}': {self.what}" if self.case else self.what
        lines = head.splitlines()[:3] + [f"  {f}" for f in self.frames[-2:]]
        if self.hints:
            k = min(max(level, 1), len(self.hints))
            more = f" {k} of {len(self.hints)}" if len(self.hints) > 1 else ""
            lines.append(f"Hint{more}: {self.hints[k - 1]}")
        return "\n".join(lines)


_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x1f\x7f-\x9f]")
# line and paragraph separators (str.splitlines and browsers break lines there) and the
# bidirectional marks, embeddings, overrides and isolates (they reorder what follows them)
_MARKS = re.compile("[\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def show_marks(text: str) -> str:
    """``text`` with its line separators and bidirectional controls written out as ``\\uXXXX``
    (a name cannot read backwards, a message cannot start a forged line); what :func:`clean`
    and the gradebook's pages both apply."""
    return _MARKS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def clean(text: Any, limit: int = 400) -> str:
    """Learner-made text made safe to show: one line, no terminal escapes or control characters
    (a message cannot forge a "Hint:" line or repaint a score), no line separator or bidi
    control (:func:`show_marks`), no unpaired surrogates (which cannot be printed or written as
    UTF-8), at most ``limit`` characters."""
    text = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return show_marks(_CONTROL.sub(" ", text))[:limit]


def render(failure: CheckFailure, level: int) -> list[str]:
    """The lines a notebook shows for a failed check (at most :data:`MAX_LINES`)."""
    name = failure.exercise or "check"
    text = failure.feedback(level).splitlines()
    lines = [f"CheckFailure: {name}: {text[0]}"] + text[1:]
    if len(failure.hints) > level:
        lines.append(f'More: run this check again, or call hint("{name}").')
    return lines[:MAX_LINES]
