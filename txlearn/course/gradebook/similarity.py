"""Similar answers: pairs of students whose answer cells match after normalising names, comments
and layout, most unusual first, shown side by side. A pointer for a human, never a verdict.

``txlearn similarity class.db --out similarity.html`` compares, per set and exercise, the answer
cells of the run that counts for each student (:func:`~txlearn.course.gradebook.store.counting`).

Normalising (:func:`normalise`): the cell is parsed and printed back by :mod:`ast` (comments,
blank lines, layout and quoting vanish), docstrings are dropped, and every name the cell binds
(functions, classes, arguments, variables, loop and comprehension targets, import aliases,
exception names) is renamed ``v0, v1, ...`` in order of first binding; names it only reads
(``np``, ``torch``, builtins) and attributes (``self.W_Q``, ``x.max``) stay. A cell that does not
parse is compared as its tokens without comments. Stubs and answers that define nothing the
check needs are left out (everyone who did not answer shares them), and so are concept answers
(a letter or a number is no evidence of copying).

Ranking: two students share an exercise's answer when the normalised texts are equal. Each shared
answer scores ``log2(n / k)`` (``n`` students answered the exercise, ``k`` of them gave this
answer: the rarer, the higher), doubled when the answer is wrong (identical *wrong* answers are
the unusual ones; small exercises have few right answers and many students reach the same one),
and scaled by ``min(1, tokens / 20)`` (one-line answers coincide by chance). A pair's score is the
sum over the set's exercises; answers given by more than half of the students (under 1 bit) are
not paired. The page lists the top pairs with both students' cells side by side.
"""

from __future__ import annotations

import ast
import hashlib
import io
import math
import tokenize
from collections import defaultdict
from itertools import combinations
from pathlib import Path

from txlearn.course.gradebook import mistakes
from txlearn.course.gradebook.pages import esc, page, pre, table
from txlearn.course.gradebook.store import NotebookRow, counting

__all__ = ["normalise", "similar_pairs", "write_similarity", "similarity_page", "DISCLAIMER"]

DISCLAIMER = ("A pointer for a human, never a verdict. Identical answers arise by chance on small "
              "exercises, from studying together, from the course's own hints and from the same "
              "textbook; a high score says only that two answers are unusually alike. Read them "
              "side by side, and talk to the students, before concluding anything.")


class _Binder(ast.NodeVisitor):
    """The names a cell binds, in order of first binding."""

    def __init__(self):
        self.order: dict[str, str] = {}

    def bind(self, name: str | None) -> None:
        if name and name not in self.order:
            self.order[name] = f"v{len(self.order)}"

    def visit_FunctionDef(self, node):
        self.bind(node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.bind(node.name)
        self.generic_visit(node)

    def visit_arg(self, node):
        self.bind(node.arg)

    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.bind(node.id)

    def visit_alias(self, node):
        self.bind(node.asname or node.name.split(".")[0])

    def visit_ExceptHandler(self, node):
        self.bind(node.name)
        self.generic_visit(node)

    def visit_Global(self, node):
        for name in node.names:
            self.bind(name)

    visit_Nonlocal = visit_Global


class _Renamer(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def _drop_docstring(self, node):
        body = getattr(node, "body", None)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    def visit_Module(self, node):
        self.generic_visit(node)
        return self._drop_docstring(node)

    def visit_FunctionDef(self, node):
        node.name = self.names.get(node.name, node.name)
        self.generic_visit(node)
        return self._drop_docstring(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node.name = self.names.get(node.name, node.name)
        self.generic_visit(node)
        return self._drop_docstring(node)

    def visit_arg(self, node):
        node.arg, node.annotation = self.names.get(node.arg, node.arg), None
        return node

    def visit_Name(self, node):
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_alias(self, node):
        bound = node.asname or node.name.split(".")[0]
        if bound in self.names and "." not in node.name:
            node.asname = self.names[bound]
        return node

    def visit_ExceptHandler(self, node):
        if node.name:
            node.name = self.names.get(node.name, node.name)
        self.generic_visit(node)
        return node

    def visit_Global(self, node):
        node.names = [self.names.get(n, n) for n in node.names]
        return node

    visit_Nonlocal = visit_Global


def _tokens(source: str) -> str:
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                tokenize.DEDENT, tokenize.ENDMARKER):
                out.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass                      # unbalanced brackets at the end: the tokens read so far
    return " ".join(out)


def normalise(source: str) -> str:
    """An answer cell with its names, comments, docstrings and layout normalised (see above); a
    cell too deep for any of the three passes (``0+0+...+0``, 2,000 terms, parses and then
    exceeds the recursion limit in the name binder) is compared as its tokens too."""
    try:
        tree = ast.parse(source)
        binder = _Binder()
        binder.visit(tree)
        return ast.unparse(_Renamer(binder.order).visit(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "unparsed: " + _tokens(source)


def _size(text: str) -> int:
    """Python tokens in a (normalised) answer."""
    return len(_tokens(text).split())


def similar_pairs(rows: list[NotebookRow], *, policy: str = "latest", top: int = 50) -> list[dict]:
    """The ``top`` pairs of students with the most unusual shared answers, highest score first:
    ``{"set", "students": (a, b), "score", "shared": [{"exercise", "wrong", "share", "answered",
    "score", "answers": (a's cell, b's cell)}]}``."""
    counted = counting(rows, policy)
    seen: dict[str, tuple[str, int]] = {}   # source -> (its normalised digest, its tokens)

    def key_of(source: str) -> tuple[str, int]:
        if source not in seen:                # identical cells (a shared answer) parse once
            text = normalise(source)
            seen[source] = (hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest(),
                            _size(text))
        return seen[source]

    answers: dict[tuple[str, str], dict[str, tuple[str, str, bool]]] = defaultdict(dict)
    for (student, set_name), row in counted.items():
        if row.status == "ERROR":
            continue
        for r in row.results:
            source = row.answers.get(r.exercise)
            if source is None or r.status not in ("PASS", "FAIL") or \
                    mistakes.is_unanswered(r.mistake) or r.kind.startswith("concept:"):
                continue
            answers[(set_name, r.exercise)][student] = (key_of(source)[0], source,
                                                        r.status == "FAIL")
    pairs: dict[tuple[str, str, str], dict] = {}
    for (set_name, exercise), given in answers.items():
        groups: dict[str, list[str]] = defaultdict(list)
        for student, (key, _, _) in given.items():
            groups[key].append(student)
        n = len(given)
        for key, students in groups.items():
            k = len(students)
            if k < 2 or k > n / 2:
                continue
            first = given[students[0]]
            weight = math.log2(n / k) * (2.0 if first[2] else 1.0) * \
                min(1.0, key_of(first[1])[1] / 20)
            for a, b in combinations(sorted(students), 2):
                pair = pairs.setdefault((set_name, a, b), {"set": set_name, "students": (a, b),
                                                           "score": 0.0, "shared": []})
                pair["score"] += weight
                pair["shared"].append({"exercise": exercise, "wrong": first[2], "share": k,
                                       "answered": n, "score": round(weight, 3),
                                       "answers": (given[a][1], given[b][1])})
    ranked = sorted(pairs.values(), key=lambda p: (-p["score"], -len(p["shared"]), p["set"],
                                                   p["students"]))
    for pair in ranked:
        pair["score"] = round(pair["score"], 3)
    return ranked[:top]


def similarity_page(pairs: list[dict], *, policy: str, generated: str, source: str) -> str:
    """The HTML of the similarity report (every answer escaped)."""
    body = [f'<p class="note">{esc(DISCLAIMER)}</p>']
    if not pairs:
        body.append("<p>No two students share an unusual answer.</p>")
    summary = [[i, p["set"], p["students"][0], p["students"][1], f"{p['score']:g}",
                ", ".join(s["exercise"] + (" (wrong)" if s["wrong"] else "") for s in p["shared"])]
               for i, p in enumerate(pairs, start=1)]
    if pairs:
        body.append(table(["#", "set", "student", "student", "score", "identical answers"],
                          summary, numeric={0, 4}))
    for i, p in enumerate(pairs, start=1):
        a, b = p["students"]
        body.append(f"<h2>#{i}: {esc(a)} and {esc(b)}, {esc(p['set'])} (score {p['score']:g})</h2>")
        for s in p["shared"]:
            what = "the same wrong answer" if s["wrong"] else "the same right answer"
            body.append(f"<h3>{esc(s['exercise'])}: {what}, given by {s['share']} of "
                        f"{s['answered']} students</h3>")
            body.append('<div class="side">' + "".join(
                f"<div><strong>{esc(who)}</strong>{pre(text)}</div>"
                for who, text in zip((a, b), s["answers"])) + "</div>")
    return page("Similar answers", "\n".join(body), subtitle=f"from {source}; the run that "
                f"counts: {policy}", footer=f"Written by txlearn similarity on {generated}. "
                f"This page needs no network.")


def write_similarity(rows: list[NotebookRow], dest: Path, *, policy: str = "latest",
                     top: int = 50, generated: str = "", source: str = "") -> list[dict]:
    """Write the similarity page to ``dest``; returns its pairs."""
    pairs = similar_pairs(rows, policy=policy, top=top)
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    Path(dest).write_text(similarity_page(pairs, policy=policy, generated=generated,
                                          source=source), encoding="utf-8")
    return pairs
