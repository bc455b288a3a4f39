"""The gradebook's SQLite file: its versioned schema, opening it safely, and its rows.

One file the instructor names (``class.db``), through the standard library's :mod:`sqlite3`.
Nothing in it is ever overwritten: grading adds a **run** (one ``txlearn grade`` invocation:
where, when, with which hidden cases) and, per notebook graded, one **notebook** row (student,
set, the SHA-256 of the bytes graded, when it was submitted and graded, raw points, lateness and
penalty kept apart) with its **results** (one per exercise: status, points, the feedback text,
the identifier of the catalogued mistake or hint that fired, whether a hidden case failed) and
its **answers** (the text of its answer cells, for the similarity report and the feedback page).
Which of a student's runs counts is a policy applied when reading (:func:`counting`).

Durability and concurrency:

- each notebook is written in one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``) with
  SQLite's rollback journal and ``synchronous=FULL``: a run killed at any instant (SIGKILL, power
  loss) leaves every notebook it had committed and nothing of the one it was writing (the next
  opening rolls the journal back);
- two grading runs on one file at once both land: a writer waits for the other's transaction
  (a busy timeout, 60 s by default) instead of failing;
- opening never writes before the file is known to be a gradebook this txlearn can read: a file
  that is not SQLite, a SQLite file of something else, a corrupt one (``PRAGMA quick_check``), a
  gradebook of a newer schema, or one locked past the timeout gets a :class:`GradebookError`
  saying which, and is left byte for byte as it was.

Identifiers: runs and notebooks carry random UUIDs, so gradebooks written on several machines
merge without ever counting a run twice (:mod:`txlearn.course.gradebook.merge`).

Text is stored losslessly. SQLite holds UTF-8, which a Python string with a lone surrogate
cannot be written as: a folder name that is not UTF-8 (``os.fsdecode(b"Jos\\xe9")`` is
``"Jos\\udce9"``, as ``unzip`` writes raw names) or an answer cell holding ``"\\udcff"``. Such a
text is stored escaped (:func:`stored_text`: :data:`ESCAPED`, then the text with each backslash
doubled and each surrogate written ``\\udce9``) and read back exactly as it was
(:func:`text_of`); every other text is stored as it is. The pages and exports show it with
:func:`readable` (the surrogate as its escape ``\\udce9``, as the grader's table does).

Schema version 3 (``PRAGMA user_version``; ``PRAGMA application_id`` = 0x54584C42, "TXLB"):
the four tables below. Each later version adds a migration to :data:`MIGRATIONS`, run when the
file is opened for writing; a file of an older version opened read-only (a report, an export, a
merge's source) reads a column it lacks as its default (:meth:`Gradebook.columns`). Version 2
added ``results.instructor_note``: what only the instructor sees of a failed hidden case (its
case, got vs expected, the check's reason); no page, export or student ever gets it. Version 3
added ``runs.earlier``: where that run's later sets got the earlier sets' answers (``own``: the
student's notebooks; ``reference``: the course's; ``''`` for runs before it, which were own).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import uuid
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Gradebook", "GradebookError", "NotebookRow", "ResultRow", "open_gradebook",
           "counting", "identity_clashes", "attempts", "SCHEMA_VERSION", "APPLICATION_ID",
           "DEFAULT_WAIT", "stored_text", "text_of", "readable", "ESCAPED"]

SCHEMA_VERSION = 3
APPLICATION_ID = 0x54584C42            # "TXLB"
DEFAULT_WAIT = 60.0                    # seconds a writer waits for another's transaction
HEADER = b"SQLite format 3\x00"

SCHEMA = """
CREATE TABLE runs (
    uuid TEXT PRIMARY KEY,
    machine TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT NOT NULL DEFAULT '',
    txlearn_version TEXT NOT NULL,
    command TEXT NOT NULL,
    hidden TEXT NOT NULL DEFAULT '',
    course_file TEXT NOT NULL DEFAULT '',
    earlier TEXT NOT NULL DEFAULT ''
);
CREATE TABLE notebooks (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    run_uuid TEXT NOT NULL REFERENCES runs(uuid),
    student TEXT NOT NULL,
    set_name TEXT NOT NULL,
    notebook TEXT NOT NULL,
    path TEXT NOT NULL,
    digest TEXT NOT NULL,
    submitted_at TEXT NOT NULL,
    submitted_from TEXT NOT NULL,
    graded_at TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT NOT NULL,
    sandbox TEXT NOT NULL,
    points INTEGER NOT NULL,
    max_points INTEGER NOT NULL,
    deadline TEXT NOT NULL,
    late_seconds REAL NOT NULL,
    penalty REAL NOT NULL,
    integrity TEXT NOT NULL,
    n_results INTEGER NOT NULL
);
CREATE INDEX notebooks_by_student ON notebooks(student, set_name);
CREATE TABLE results (
    notebook_id INTEGER NOT NULL REFERENCES notebooks(id),
    position INTEGER NOT NULL,
    exercise TEXT NOT NULL,
    status TEXT NOT NULL,
    points INTEGER NOT NULL,
    max_points INTEGER NOT NULL,
    feedback TEXT NOT NULL,
    kind TEXT NOT NULL,
    mistake TEXT NOT NULL,
    hint TEXT NOT NULL,
    hidden INTEGER NOT NULL,
    hidden_cases INTEGER NOT NULL,
    flagged TEXT NOT NULL,
    instructor_note TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (notebook_id, position)
);
CREATE TABLE answers (
    notebook_id INTEGER NOT NULL REFERENCES notebooks(id),
    exercise TEXT NOT NULL,
    source TEXT NOT NULL,
    PRIMARY KEY (notebook_id, exercise)
);
"""

# from version N to N + 1: the SQL that does it
MIGRATIONS: dict[int, str] = {
    1: "ALTER TABLE results ADD COLUMN instructor_note TEXT NOT NULL DEFAULT ''",
    2: "ALTER TABLE runs ADD COLUMN earlier TEXT NOT NULL DEFAULT ''",
}

NOTEBOOK_COLUMNS = ("uuid", "run_uuid", "student", "set_name", "notebook", "path", "digest",
                    "submitted_at", "submitted_from", "graded_at", "status", "error", "sandbox",
                    "points", "max_points", "deadline", "late_seconds", "penalty", "integrity",
                    "n_results")
RESULT_COLUMNS = ("position", "exercise", "status", "points", "max_points", "feedback", "kind",
                  "mistake", "hint", "hidden", "hidden_cases", "flagged", "instructor_note")
RUN_COLUMNS = ("uuid", "machine", "started_at", "finished_at", "txlearn_version", "command",
               "hidden", "course_file", "earlier")


ESCAPED = "\ufffe"       # first character of a stored text that was escaped (a noncharacter)
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile(r"\\(\\|ud[89a-f][0-9a-f]{2})")


def stored_text(value):
    """``value`` as the gradebook stores it: a text with a lone surrogate (which UTF-8 cannot
    hold), or one that starts with :data:`ESCAPED`, becomes ``ESCAPED`` + the text with each
    backslash doubled and each surrogate as ``\\udXXX``; any other value is kept as it is.
    ``text_of(stored_text(t)) == t`` for every string ``t``."""
    if not isinstance(value, str) or not (_SURROGATE.search(value) or value.startswith(ESCAPED)):
        return value
    body = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", value.replace("\\", "\\\\"))
    return ESCAPED + body


def text_of(value):
    """The text :func:`stored_text` stored as ``value``, exactly (other values as they are)."""
    if not isinstance(value, str) or not value.startswith(ESCAPED):
        return value
    return _ESCAPE.sub(lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1)[1:], 16)),
                       value[len(ESCAPED):])


def readable(text) -> str:
    """A text as pages and exports show it: valid UTF-8, a lone surrogate written as its
    backslash escape (``Jos\\udce9``), everything else unchanged."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


class GradebookError(Exception):
    """The gradebook cannot be opened or written (the reason in one line; the file untouched)."""


@dataclass
class ResultRow:
    """One exercise of one graded notebook, as stored."""

    exercise: str
    status: str
    points: int
    max_points: int
    feedback: str = ""
    kind: str = ""
    mistake: str = ""
    hint: str = ""
    hidden: bool = False
    hidden_cases: bool = False
    flagged: str = ""
    position: int = 0
    instructor_note: str = ""       # a failed hidden case's reason, for the instructor only


@dataclass
class NotebookRow:
    """One graded notebook (one student's one set in one run), with its results and answers."""

    uuid: str
    run_uuid: str
    student: str
    set_name: str
    notebook: str
    path: str
    digest: str
    submitted_at: str
    submitted_from: str
    graded_at: str
    status: str                     # GRADED or ERROR (not graded)
    error: str
    sandbox: str
    points: int                     # raw
    max_points: int
    deadline: str
    late_seconds: float
    penalty: float                  # fraction of the raw points taken off
    integrity: list = field(default_factory=list)
    n_results: int = 0
    results: list = field(default_factory=list)
    answers: dict = field(default_factory=dict)
    id: int = 0
    machine: str = ""               # its run's (read with the row; not a column of its own)
    earlier: str = ""               # its run's earlier-sets policy (own, reference; "" before it)

    @property
    def score(self) -> float:
        """The points after the late penalty."""
        return round(self.points * (1.0 - self.penalty), 4)


def _fail(path: Path, why: str) -> GradebookError:
    return GradebookError(f"gradebook {path}: {why}; the file was left as it is")


def _header_problem(path: Path) -> str | None:
    """What is wrong with the file's first 100 bytes for a gradebook, read without SQLite
    (None: SQLite may open it). A file with a hot journal beside it is left to SQLite, which
    first rolls that journal back."""
    journal = Path(f"{path}-journal")
    if journal.exists() and journal.stat().st_size > 0:
        return None
    with open(path, "rb") as f:
        head = f.read(100)
    if not head:
        return None                                  # an empty file: a new gradebook
    if not head.startswith(HEADER) or len(head) < 100:
        return "not a SQLite database (not a txlearn gradebook)"
    version = int.from_bytes(head[60:64], "big")
    app = int.from_bytes(head[68:72], "big")
    if app not in (0, APPLICATION_ID):
        return f"a SQLite database of another application (application_id {app:#x})"
    if app == APPLICATION_ID and version > SCHEMA_VERSION:
        return (f"written by a newer txlearn (gradebook schema {version}; this txlearn reads up "
                f"to {SCHEMA_VERSION}): upgrade txlearn to use it")
    return None


def _sqlite_error(path: Path, err: sqlite3.Error, wait: float) -> GradebookError:
    text = str(err)
    if "locked" in text or "busy" in text:
        return _fail(path, f"locked by another process past {wait:g} s (another txlearn "
                           f"grade writing to it, or a program holding it open): try again "
                           f"when it is done")
    if isinstance(err, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text
                                                   or "corrupt" in text):
        return _fail(path, f"corrupt ({text}); restore it from a copy, or merge the good "
                           f"copies of the machines that wrote it")
    return _fail(path, f"SQLite error ({type(err).__name__}: {text})")


class Gradebook:
    """An open gradebook (use :func:`open_gradebook`). Not shared between threads."""

    def __init__(self, path: Path, conn: sqlite3.Connection, wait: float, readonly: bool):
        self.path, self.conn, self.wait, self.readonly = path, conn, wait, readonly

    # -- writing ------------------------------------------------------------------------
    def write(self, statements):
        """Run ``statements(cursor)`` in one immediate transaction (all of it or nothing)."""
        if self.readonly:
            raise GradebookError(f"gradebook {self.path}: opened read-only")
        cur = self.conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                out = statements(cur)
                cur.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as err:
            raise _sqlite_error(self.path, err, self.wait) from None
        return out

    def start_run(self, *, command: str, hidden: str = "", course_file: str = "",
                  started_at: str, version: str, earlier: str = "own") -> str:
        """Add a run; returns its UUID. ``earlier``: where its later sets got the earlier sets'
        answers (``own`` or ``reference``)."""
        run = uuid.uuid4().hex
        self.write(lambda cur: cur.execute(
            "INSERT INTO runs (uuid, machine, started_at, txlearn_version, command, hidden, "
            "course_file, earlier) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [stored_text(v) for v in (run, socket.gethostname(), started_at, version, command,
                                      hidden, course_file, earlier)]))
        return run

    def finish_run(self, run: str, finished_at: str) -> None:
        self.write(lambda cur: cur.execute("UPDATE runs SET finished_at = ? WHERE uuid = ?",
                                            (finished_at, run)))

    def add_notebook(self, row: NotebookRow) -> None:
        """Write one notebook, its results and its answers in one transaction (``row.id`` is
        set to its new row id)."""
        def statements(cur):
            values = [stored_text(getattr(row, c)) for c in NOTEBOOK_COLUMNS]
            values[NOTEBOOK_COLUMNS.index("integrity")] = json.dumps(list(row.integrity))
            cur.execute(f"INSERT INTO notebooks ({', '.join(NOTEBOOK_COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(NOTEBOOK_COLUMNS))})", values)
            notebook_id, count = cur.lastrowid, 0
            for position, r in enumerate(row.results):
                r.position, count = position, position + 1
                cur.execute(f"INSERT INTO results (notebook_id, {', '.join(RESULT_COLUMNS)}) "
                            f"VALUES (?, {', '.join('?' * len(RESULT_COLUMNS))})",
                            [notebook_id] + [int(getattr(r, c)) if c in ("hidden", "hidden_cases")
                                             else stored_text(getattr(r, c))
                                             for c in RESULT_COLUMNS])
            cur.executemany("INSERT INTO answers (notebook_id, exercise, source) VALUES (?, ?, ?)",
                            [(notebook_id, stored_text(e), stored_text(s))
                             for e, s in sorted(row.answers.items())])
            cur.execute("UPDATE notebooks SET n_results = ? WHERE id = ?", (count, notebook_id))
            row.id, row.n_results = notebook_id, count
        self.write(statements)

    # -- reading ------------------------------------------------------------------------
    def read(self, sql: str, params=()) -> list[tuple]:
        """The rows of a query, as stored (escaped texts still escaped: :func:`text_of`)."""
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as err:
            raise _sqlite_error(self.path, err, self.wait) from None

    def columns(self, table: str, wanted) -> str:
        """A SELECT list of ``wanted`` columns of ``table``: a column this file lacks (a
        gradebook of an older schema, opened read-only) is read as its default, ``''``."""
        have = {r[1] for r in self.read(f"PRAGMA table_info({table})")}
        return ", ".join(c if c in have else f"'' AS {c}" for c in wanted)

    def _texts(self, sql: str) -> list[tuple]:
        return [tuple(text_of(v) for v in r) for r in self.read(sql)]

    def runs(self) -> list[dict]:
        """Every run, oldest first."""
        rows = self._texts(f"SELECT {self.columns('runs', RUN_COLUMNS)} FROM runs "
                           f"ORDER BY started_at, uuid")
        return [dict(zip(RUN_COLUMNS, r)) for r in rows]

    def notebooks(self, *, with_answers: bool = True) -> list[NotebookRow]:
        """Every graded notebook with its results (and answers), oldest grading first (within one
        second, in the order they were recorded). One read transaction: a writer's half-done
        notebook is never seen."""
        try:
            self.conn.execute("BEGIN")
            earlier = "r.earlier" if self.columns("runs", ["earlier"]) == "earlier" else "''"
            rows = self._texts(f"SELECT n.id, {', '.join('n.' + c for c in NOTEBOOK_COLUMNS)}, "
                               f"r.machine, {earlier} FROM notebooks n "
                               f"LEFT JOIN runs r ON r.uuid = n.run_uuid")
            results = self._texts(f"SELECT notebook_id, {self.columns('results', RESULT_COLUMNS)}"
                                  f" FROM results ORDER BY notebook_id, position")
            answers = self._texts("SELECT notebook_id, exercise, source FROM answers") \
                if with_answers else []
        finally:
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")
        out = {}
        for r in rows:
            data = dict(zip(NOTEBOOK_COLUMNS, r[1:-2]))
            data["integrity"] = json.loads(data["integrity"] or "[]")
            out[r[0]] = NotebookRow(id=r[0], machine=r[-2] or "", earlier=r[-1] or "", **data)
        for r in results:
            values = dict(zip(RESULT_COLUMNS, r[1:]))
            values["hidden"], values["hidden_cases"] = bool(values["hidden"]), \
                bool(values["hidden_cases"])
            out[r[0]].results.append(ResultRow(**values))
        for notebook_id, exercise, source in answers:
            out[notebook_id].answers[exercise] = source
        return sorted(out.values(), key=lambda n: (n.graded_at, n.id or 0, n.uuid))

    def check(self) -> list[str]:
        """Problems of the stored rows (a notebook whose results are not all there): []."""
        rows = self.read("SELECT n.uuid, n.n_results, COUNT(r.position) FROM notebooks n "
                          "LEFT JOIN results r ON r.notebook_id = n.id GROUP BY n.id")
        return [f"notebook {u}: {got} of {n} results" for u, n, got in rows if n != got]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _initialise(conn: sqlite3.Connection) -> None:
    """Create the schema in a new (empty) file, or migrate an older one, in one transaction;
    another process initialising the same new file at once waits, then finds it done."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if version == 0 and tables == 0:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        while 0 < version < SCHEMA_VERSION:
            for statement in MIGRATIONS[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def open_gradebook(path, *, create: bool = True, readonly: bool = False,
                   wait: float = DEFAULT_WAIT) -> Gradebook:
    """Open (or, with ``create``, make) the gradebook at ``path``.

    ``readonly``: never write (reports and exports). ``wait``: seconds to wait for another
    process's transaction. Raises GradebookError (the file left as it is) for a missing file
    without ``create``, a folder, a file that is not a txlearn gradebook, a corrupt one, one of a
    newer schema, or one locked past ``wait``.
    """
    path = Path(path)
    if path.is_dir():
        raise _fail(path, "a folder, not a file")
    exists = path.exists()
    if not exists and (readonly or not create):
        raise GradebookError(f"gradebook {path}: no such file (txlearn grade ... --gradebook "
                             f"{path} makes it)")
    if exists:
        try:
            problem = _header_problem(path)
        except OSError as err:
            raise _fail(path, f"cannot be read ({err.strerror or err})") from None
        if problem:
            raise _fail(path, problem)
        if readonly and path.stat().st_size == 0:
            raise _fail(path, "empty (no run was recorded in it)")
    # a killed writer's hot journal is rolled back by the first connection that reads the file,
    # which must be able to write it: a reader opens such a file read-write (it writes nothing
    # itself), so that a report right after a killed run works
    hot = Path(f"{path}-journal").exists()
    try:
        uri = f"{path.resolve().as_uri()}?mode={'ro' if readonly and not hot else 'rwc'}"
        conn = sqlite3.connect(uri, uri=True, timeout=wait, isolation_level=None,
                               check_same_thread=False)
    except sqlite3.Error as err:
        raise _sqlite_error(path, err, wait) from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
        # one read of all three: read one by one, a second `txlearn grade` creating the same
        # new file committed in between, and this one saw no txlearn id but its tables
        app, version, tables = conn.execute(
            "SELECT (SELECT application_id FROM pragma_application_id()), "
            "(SELECT user_version FROM pragma_user_version()), "
            "(SELECT count(*) FROM sqlite_master)").fetchone()
        if app != APPLICATION_ID and (tables or version):
            raise _fail(path, "a SQLite database, but not a txlearn gradebook")
        if version > SCHEMA_VERSION:
            raise _fail(path, f"written by a newer txlearn (gradebook schema {version}; this "
                              f"txlearn reads up to {SCHEMA_VERSION}): upgrade txlearn to use it")
        found = conn.execute("PRAGMA quick_check").fetchall()
        if found != [("ok",)]:
            raise _fail(path, f"corrupt (SQLite's quick_check: {found[0][0][:200]}); restore it "
                              f"from a copy, or merge the good copies of the machines that "
                              f"wrote it")
        if not readonly and version < SCHEMA_VERSION:
            _initialise(conn)
        conn.execute("PRAGMA synchronous = FULL")
    except GradebookError:
        conn.close()
        raise
    except sqlite3.Error as err:
        conn.close()
        raise _sqlite_error(path, err, wait) from None
    return Gradebook(path, conn, wait, readonly)


def counting(rows: list[NotebookRow], policy: str = "latest") -> dict[tuple[str, str], NotebookRow]:
    """The notebook that counts for each (student, set), by ``policy``:

    - ``latest``: the most recently graded run of the student's notebook (re-grading the same
      file, or grading a newer submission, replaces the count, never the row; a latest run that
      could not be graded counts as not graded: re-grade it);
    - ``best``: the run with the highest score after the late penalty (ties: the latest).

    Notebooks whose file name matched no exercise set are left out."""
    if policy not in ("latest", "best"):
        raise ValueError(f"policy {policy!r}: use latest or best")
    out: dict[tuple[str, str], NotebookRow] = {}
    for row in sorted(rows, key=lambda n: (n.graded_at, n.id or 0, n.uuid)):
        if not row.set_name:
            continue
        key = (row.student, row.set_name)
        if policy == "latest" or key not in out or row.score >= out[key].score:
            out[key] = row
    return out


def identity_clashes(rows: list[NotebookRow]) -> list[str]:
    """One warning per (student, set) recorded from more than one student folder or machine
    (``late/alice/`` and ``alice/``, or another machine's ``alice`` merged in): the student is
    only its folder's name, so the run that counts may be another student's notebook."""
    places: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for row in rows:
        if row.set_name:
            places.setdefault((row.student, row.set_name), set()).add(
                (os.path.dirname(row.path), row.machine))
    return [readable(f"{student!r}, {set_name}: recorded from {len(where)} places ("
            + "; ".join(f"{folder} on {machine or 'an unknown machine'}"
                        for folder, machine in sorted(where)[:3])
            + f"{'; ...' if len(where) > 3 else ''}): each counts as the same student (give "
              f"each its own folder name, or a roster in the course file)")
            for (student, set_name), where in sorted(places.items()) if len(where) > 1]


def attempts(rows: list[NotebookRow]) -> dict[tuple[str, str], list[NotebookRow]]:
    """Each (student, set)'s distinct submissions in the order they were submitted: one row per
    notebook digest (its latest grading), the first attempt first."""
    latest: dict[tuple[str, str, str], NotebookRow] = {}
    for row in sorted(rows, key=lambda n: (n.graded_at, n.id or 0, n.uuid)):
        if row.set_name:
            latest[(row.student, row.set_name, row.digest)] = row
    out: dict[tuple[str, str], list[NotebookRow]] = {}
    for (student, set_name, _), row in latest.items():
        out.setdefault((student, set_name), []).append(row)
    for rows_ in out.values():
        rows_.sort(key=lambda n: (n.submitted_at, n.graded_at, n.id or 0))
    return out

