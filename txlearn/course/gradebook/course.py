"""The instructor's course file: each set's deadline, extensions, the late penalty, the roster.

A YAML file beside the submissions (``submissions/course.yaml``, next to the student folders;
``txlearn grade --course FILE`` names another)::

    timezone: Europe/Berlin     # deadlines written without an offset are in this zone (default UTC)
    policy: latest              # which graded run counts: latest (default) or best
    penalty:                    # for late work (default: none)
      per_day: 0.10             #   this fraction of the raw score per day late or part of one,
      max: 0.50                 #   at most this fraction in all (1.0: late work may score 0),
      grace_minutes: 15         #   and up to this late is not late
    sets:
      01_softmax:
        deadline: 2026-10-05 23:59
        title: "Softmax"        # its column in LMS exports (default: the set's name)
        canvas_id: 4711         # Canvas assignment id: the Canvas column is "title (4711)"
    extensions:                 # per student folder: extra time per set, or "all"
      alice: {01_softmax: 2 days}             # or hours/minutes, or a new deadline (a date)
      bob: {all: 36 hours}
    concepts: {points: 1}       # each right concept answer (docs/concept_checks.md); default 0:
                                #   recorded and reported, not graded
    manifest: manifest.csv      # when each notebook was submitted (below); optional
    roster:                     # each student folder's identity in the LMS; optional, or a CSV
      alice: {name: "Liddell, Alice", email: alice@uni.example, id_number: "1001",
              canvas_id: 5512, sis_user_id: S1001, sis_login_id: aliddell, section: A}

**When a notebook was submitted** comes from the manifest, a CSV file (default
``manifest.csv`` beside the course file, when there is one) with the columns ``student``,
``set`` and ``submitted_at`` (ISO 8601; without an offset, in ``timezone``), as an LMS's
download or a collection script writes it; a notebook it does not list falls back to the file's
modification time, and the gradebook records which of the two it used. Lateness (seconds past the
deadline, extensions included) and the penalty (a fraction of the raw score) are computed when a
notebook is graded and kept apart from its raw score. A roster CSV has a ``student`` column and
any of the roster's keys as the others.

**Time** is elapsed time: deadlines, extensions and submission times are compared and added in
UTC and converted to the course's zone only to be shown, so a deadline just before the clocks
change is 15 minutes away from a submission 15 minutes after it, and a 36-hour extension is 36
hours (Python adds and subtracts two datetimes of one zone on the wall clock: across a change
of daylight saving time that is an hour off). A deadline written as a **date alone**
(``2026-10-05``) is the end of that day: the midnight that starts the next one. Lateness is
exact: a notebook submitted at its deadline is on time, one submitted any time after it is late
(by the seconds, fractions kept, that it is past it).

Times are shown (feedback pages, the class report) in the course's zone with its abbreviation
(:func:`shown_time`: ``2026-10-05 23:59 CEST``) and the zone named on each page; the
gradebook keeps them in UTC.

**Names** (student folders and the course file's keys for them: extensions, roster, manifest)
are compared in Unicode's composed form (NFC, :func:`name_key`): a folder an archive of macOS
names in the decomposed form (NFD, ``e`` + U+0301) is the student the course file names
``\\u00e9``, whichever form each was saved in.

Raises :class:`CourseFileError` naming the file and the key on anything it does not understand
(an unknown key, a deadline that is not a date, a penalty outside [0, 1]).
Sources: issue 24 ("Deadlines"); the public reports on deadlines across daylight saving, a
deadline given as a date alone and names in another normalisation form.
"""

from __future__ import annotations

import csv
import difflib
import math
import os
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["Course", "Penalty", "Lateness", "CourseFileError", "load_course", "find_course_file",
           "COURSE_FILE", "MANIFEST_FILE", "POLICIES", "ROSTER_KEYS", "utc_iso", "parse_time",
           "name_key", "shown_time", "zone_name", "zone_named"]

COURSE_FILE = "course.yaml"
MANIFEST_FILE = "manifest.csv"
POLICIES = ("latest", "best")
ROSTER_KEYS = ("name", "email", "id_number", "canvas_id", "sis_user_id", "sis_login_id",
               "section")
_TOP = ("timezone", "policy", "penalty", "sets", "extensions", "manifest", "roster", "concepts")
_PENALTY = ("per_day", "max", "grace_minutes")
_SET = ("deadline", "title", "canvas_id")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(days?|d|hours?|h|minutes?|min|m)\s*$")


class CourseFileError(Exception):
    """The course file (or its manifest or roster) says something txlearn cannot use."""


def name_key(name) -> str:
    """The form in which names (student folders, the course file's keys for them) are compared:
    Unicode NFC. ``name_key("Jose\\u0301") == name_key("Jos\\u00e9") == "Jos\\u00e9"``; a lone
    surrogate (an undecodable byte of a folder name) is kept as it is."""
    return unicodedata.normalize("NFC", str(name))


def utc_iso(moment: datetime) -> str:
    """An aware datetime as ISO 8601 in UTC, to the second: ``2026-10-05T21:59:00Z``."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value, zone: timezone | ZoneInfo = timezone.utc) -> datetime:
    """A date or time (a YAML datetime or date, or ISO 8601 text) as an aware datetime; one
    without an offset is in ``zone``. A date alone means the end of that day: the midnight that
    starts the next day in ``zone`` (``2026-10-05`` -> ``2026-10-06 00:00``). Raises ValueError."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = _end_of_day(value)
    else:
        text = str(value).strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        if len(text) == 10:   # a date alone
            moment = _end_of_day(date.fromisoformat(text))
        else:
            moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=zone)


def _end_of_day(day: date) -> datetime:
    """The end of ``day`` (naive): the midnight that starts the next day."""
    return datetime.combine(day + timedelta(days=1), datetime.min.time())


@dataclass
class Penalty:
    """The late rule: ``min(max, per_day * ceil(days late))`` of the raw score, none within
    ``grace_minutes``."""

    per_day: float = 0.0
    max: float = 1.0
    grace_minutes: float = 0.0

    def fraction(self, late_seconds: float) -> float:
        if late_seconds <= self.grace_minutes * 60 or self.per_day <= 0:
            return 0.0
        return round(min(self.max, self.per_day * math.ceil(late_seconds / 86400)), 6)


@dataclass
class Lateness:
    """One notebook's timing: when it was submitted (and where that came from), its deadline
    with extensions (None without one), how late (s, 0 when on time) and the penalty fraction."""

    submitted_at: str
    submitted_from: str        # "manifest" or "mtime"
    deadline: str = ""
    late_seconds: float = 0.0
    penalty: float = 0.0


@dataclass
class Course:
    """A parsed course file (every field has a default: a missing file is an empty course)."""

    path: Path | None = None
    zone: object = timezone.utc
    policy: str = "latest"
    penalty: Penalty = field(default_factory=Penalty)
    deadlines: dict = field(default_factory=dict)       # set -> aware datetime
    titles: dict = field(default_factory=dict)          # set -> LMS column title
    canvas_ids: dict = field(default_factory=dict)      # set -> Canvas assignment id
    extensions: dict = field(default_factory=dict)      # student -> {set or "all": timedelta|datetime}
    manifest: dict = field(default_factory=dict)        # (student, set) -> aware datetime
    roster: dict = field(default_factory=dict)          # student -> {key: text}
    concept_points: int = 0                             # per right concept answer (0: ungraded)

    def deadline(self, student: str, set_name: str) -> datetime | None:
        """The set's deadline for this student, extensions included (None without one), in UTC:
        an extension of hours or days is that much elapsed time, across a change of the clocks
        too."""
        base = self.deadlines.get(set_name)
        mine = self.extensions.get(name_key(student), {})
        extra = mine.get(set_name, mine.get("all"))
        if isinstance(extra, datetime):
            return extra.astimezone(timezone.utc)
        if base is None:
            return None
        base = base.astimezone(timezone.utc)
        return base + extra if isinstance(extra, timedelta) else base

    def lateness(self, student: str, set_name: str, path: Path) -> Lateness:
        """When ``path`` was submitted (the manifest, else its modification time), and how late:
        the elapsed seconds past the deadline (0 at the deadline itself or before it)."""
        when = self.manifest.get((name_key(student), set_name))
        source = "manifest"
        if when is None:
            when = datetime.fromtimestamp(os.stat(path).st_mtime, timezone.utc)
            source = "mtime"
        out = Lateness(utc_iso(when), source)
        deadline = self.deadline(student, set_name)
        if deadline is not None:
            out.deadline = utc_iso(deadline)
            late = when.astimezone(timezone.utc) - deadline     # in UTC: never on the wall clock
            out.late_seconds = late.total_seconds() if late > timedelta(0) else 0.0
            out.penalty = self.penalty.fraction(out.late_seconds)
        return out

    def identity(self, student: str) -> dict | None:
        """The roster's entry for a student folder (None when it has none), the names compared
        as :func:`name_key` does."""
        return self.roster.get(name_key(student))

    def title(self, set_name: str) -> str:
        return self.titles.get(set_name, set_name)

    @property
    def zone_name(self) -> str:
        """The course's time zone by name (``Europe/Berlin``; ``UTC`` without one)."""
        return zone_name(self.zone)


def zone_name(zone) -> str:
    """A time zone's name: the IANA key of a ZoneInfo (``Europe/Berlin``), else ``UTC``."""
    return getattr(zone, "key", None) or "UTC"


def zone_named(name: str):
    """The time zone of a name :func:`zone_name` gave (``UTC``: :data:`datetime.timezone.utc`).
    Raises CourseFileError for a name that is not a time zone."""
    if not name or name == "UTC":
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CourseFileError(f"timezone {name!r} is not a time zone name") from None


def shown_time(text: str, zone=timezone.utc) -> str:
    """A time as the gradebook stores it (ISO 8601, UTC) shown in ``zone`` to the minute, with
    the zone's abbreviation at that moment, which changes with daylight saving:
    ``2026-10-05T21:59:00Z`` -> ``2026-10-05 23:59 CEST`` in Europe/Berlin, ``2026-11-02 11:00
    CET`` after the clocks changed. A text that is not a time (``""``, ``now``) is returned as
    it is."""
    try:
        moment = parse_time(text) if isinstance(text, str) and len(text) > 10 else None
    except (ValueError, TypeError):
        moment = None
    if moment is None:
        return text
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")


def find_course_file(notebooks: list[Path]) -> Path | None:
    """The course file beside the submissions: ``course.yaml`` in the folder that holds the
    first notebook's student folder, when it exists."""
    if not notebooks:
        return None
    candidate = Path(os.path.abspath(notebooks[0])).parent.parent / COURSE_FILE
    return candidate if candidate.is_file() else None


def _unknown(where: str, keys, known) -> None:
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CourseFileError(f"{where}: unknown key {key!r}{hint}; known: {', '.join(known)}")


def _number(where: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise CourseFileError(f"{where}: {value!r} is not a number from {low:g} to {high:g}")
    return float(value)


def _time(where: str, value, zone) -> datetime:
    try:
        return parse_time(value, zone)
    except (ValueError, TypeError):
        raise CourseFileError(f"{where}: {value!r} is not a date or time (write e.g. "
                              f"2026-10-05 23:59 or 2026-10-05T23:59:00+02:00)") from None


def _extension(where: str, value, zone):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return timedelta(days=value)
    match = _DURATION.match(str(value))
    if match:
        amount, unit = float(match.group(1)), match.group(2)[0]
        return timedelta(days=amount) if unit == "d" else \
            timedelta(hours=amount) if unit == "h" else timedelta(minutes=amount)
    try:
        return parse_time(value, zone)
    except (ValueError, TypeError):
        raise CourseFileError(f"{where}: {value!r} is neither extra time (2 days, 36 hours, "
                              f"90 minutes) nor a new deadline") from None


def _read_csv(path: Path, needed: tuple[str, ...], what: str) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
            header = rows[0].keys() if rows else []
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise CourseFileError(f"{what} {path}: cannot be read ({err})") from None
    missing = [c for c in needed if rows and c not in header]
    if missing:
        raise CourseFileError(f"{what} {path}: no column {', '.join(missing)} (it needs "
                              f"{', '.join(needed)})")
    return rows


def _manifest(path: Path, zone) -> dict:
    out = {}
    for number, row in enumerate(_read_csv(path, ("student", "set", "submitted_at"),
                                           "manifest"), start=2):
        if not (row["submitted_at"] or "").strip():   # a layout without times (txlearn collect
            continue                                   # of Canvas, Moodle): the file's time
        key = (name_key(row["student"].strip()), name_key(row["set"].strip()))
        out[key] = _time(f"manifest {path}, line {number}, submitted_at", row["submitted_at"],
                         zone)
    return out


def _named(where: str, pairs) -> dict:
    """``{name_key(name): value}`` of (name, value) pairs; two names that differ only in their
    Unicode form are one student, and the course file may not give them twice."""
    out, spelled = {}, {}
    for name, value in pairs:
        key = name_key(name)
        if key in spelled and spelled[key] != name:
            raise CourseFileError(f"{where}: {spelled[key]!r} and {name!r} are one name written "
                                  f"in two Unicode forms: keep one entry")
        out[key], spelled[key] = value, name
    return out


def _roster(value, base: Path, where: str) -> dict:
    if isinstance(value, str):
        rows = _read_csv(base / value, ("student",), "roster")
        return _named(f"roster {base / value}", (
            (r["student"].strip(), {k: str(v).strip() for k, v in r.items()
                                    if k in ROSTER_KEYS and v}) for r in rows))
    if not isinstance(value, dict):
        raise CourseFileError(f"{where}: roster must map student folders to their identities, "
                              f"or name a CSV file")
    for student, ident in value.items():
        if not isinstance(ident, dict):
            raise CourseFileError(f"{where}: roster.{student} must be a mapping")
        _unknown(f"{where}: roster.{student}", ident, ROSTER_KEYS)
    return _named(f"{where}: roster", ((str(student), {k: str(v) for k, v in ident.items()
                                                       if v is not None})
                                       for student, ident in value.items()))


def load_course(path: Path | None) -> Course:
    """Read the course file at ``path`` (None: an empty course, no deadlines). Raises
    CourseFileError."""
    if path is None:
        return Course()
    import yaml

    path = Path(path)
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as err:
        raise CourseFileError(f"{where}: cannot be read ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        first = (str(err).splitlines() or [""])[0]
        raise CourseFileError(f"{where}: not YAML ({first})") from None
    if not isinstance(data, dict):
        raise CourseFileError(f"{where}: the course file must be a mapping of {', '.join(_TOP)}")
    _unknown(where, data, _TOP)
    course = Course(path=path)
    if "timezone" in data:
        try:
            course.zone = ZoneInfo(str(data["timezone"]))
        except (ZoneInfoNotFoundError, ValueError):
            raise CourseFileError(f"{where}: timezone {data['timezone']!r} is not a time zone "
                                  f"name (e.g. UTC, Europe/Berlin)") from None
    policy = str(data.get("policy", "latest"))
    if policy not in POLICIES:
        raise CourseFileError(f"{where}: policy {policy!r}: use {' or '.join(POLICIES)}")
    course.policy = policy
    penalty = data.get("penalty") or {}
    if not isinstance(penalty, dict):
        raise CourseFileError(f"{where}: penalty must be a mapping of {', '.join(_PENALTY)}")
    _unknown(f"{where}: penalty", penalty, _PENALTY)
    course.penalty = Penalty(
        per_day=_number(f"{where}: penalty.per_day", penalty.get("per_day", 0.0), 0, 1),
        max=_number(f"{where}: penalty.max", penalty.get("max", 1.0), 0, 1),
        grace_minutes=_number(f"{where}: penalty.grace_minutes",
                              penalty.get("grace_minutes", 0), 0, 1e6))
    weights = data.get("concepts") or {}
    if not isinstance(weights, dict):
        raise CourseFileError(f"{where}: concepts must be a mapping of points")
    _unknown(f"{where}: concepts", weights, ("points",))
    course.concept_points = int(_number(f"{where}: concepts.points", weights.get("points", 0),
                                        0, 1000))
    if course.concept_points != weights.get("points", 0):
        raise CourseFileError(f"{where}: concepts.points must be a whole number")
    sets = data.get("sets") or {}
    if not isinstance(sets, dict):
        raise CourseFileError(f"{where}: sets must map set names to their deadlines")
    for name, info in sets.items():
        info = info if isinstance(info, dict) else {"deadline": info}
        _unknown(f"{where}: sets.{name}", info, _SET)
        if info.get("deadline") is not None:
            course.deadlines[str(name)] = _time(f"{where}: sets.{name}.deadline",
                                                info["deadline"], course.zone)
        if info.get("title"):
            course.titles[str(name)] = str(info["title"])
        if info.get("canvas_id") is not None:
            course.canvas_ids[str(name)] = str(info["canvas_id"])
    extensions = data.get("extensions") or {}
    if not isinstance(extensions, dict):
        raise CourseFileError(f"{where}: extensions must map student folders to sets")
    for student, mine in extensions.items():
        if not isinstance(mine, dict):
            raise CourseFileError(f"{where}: extensions.{student} must map sets (or all) to "
                                  f"extra time")
    course.extensions = _named(f"{where}: extensions", (
        (str(student), {str(s): _extension(f"{where}: extensions.{student}.{s}", v, course.zone)
                        for s, v in mine.items()}) for student, mine in extensions.items()))
    manifest = data.get("manifest")
    manifest_path = path.parent / str(manifest) if manifest else path.parent / MANIFEST_FILE
    if manifest or manifest_path.is_file():
        course.manifest = _manifest(manifest_path, course.zone)
    if data.get("roster"):
        course.roster = _roster(data["roster"], path.parent, where)
    return course
