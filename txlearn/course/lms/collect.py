"""Intake from an LMS (``txlearn collect``): a Canvas, Moodle or Gradescope bulk download turned
into ``submissions/<student>/NN_name.ipynb`` and ``submissions/manifest.csv``.

The download (a zip, or the folder it was unpacked into) is read as data: its entries' names are
parsed, never used as paths; each notebook is written under a name this module makes (the set's
own file name, in a folder named for the student). Layouts, as each system documents or writes
them:

- **Canvas** ("Download Submissions" of an assignment): one flat zip whose files are named
  ``<name>_<user id>_<attachment id>_<file name>``, with ``late`` after the name when Canvas
  marked the submission late (``smithjane_late_1234_5678_01_softmax.ipynb``); the name is the
  student's sortable name in lower case without separators; a file uploaded again under the same
  name gets ``-N`` before its extension (``01_softmax-1.ipynb``): of a student's files for one
  set the highest ``N`` is the latest. The names carry **no submission time** (only the ``late``
  marker, kept in the manifest's ``lms_late`` column). The re-upload of feedback finds each
  student by the user id and attachment id (canvas-lms,
  ``Assignment#infer_comment_context_from_filename``): both are kept in ``lms_key``.
- **Moodle** ("Download all submissions", one folder per student since Moodle 3.1):
  ``<Full Name>_<participant id>_assignsubmission_file_/<file name>`` (Moodle 4.1 and later
  leave out the last underscore). **No submission time** either (Moodle's grading worksheet has
  it). The participant id (``lms_key``) is what Moodle's feedback-zip import matches
  (mod/assign/feedback/file/importziplib.php).
- **Gradescope** ("Export Submissions"): ``submission_metadata.yml`` beside one folder per
  submission (``submission_<id>/``), the YAML mapping each folder to ``:submitters:`` (each with
  ``:name:``, ``:email:``, ``:sid:``) and ``:created_at:``, the submission's time.

The student's folder is the course file's roster key where one matches (Canvas: ``canvas_id`` =
the user id; Gradescope: ``email``), else the LMS's name (Canvas's ``smithjane``, Moodle's full
name, Gradescope's email), NFC-normalised, with the LMS id appended when two students share it.

``manifest.csv`` has ``student``, ``set``, ``submitted_at`` (empty where the layout carries no
time: the grader then falls back to the file's modification time, and says so), ``lms``,
``lms_key``, ``lms_late`` and ``file`` (the entry it came from). Raises :class:`CollectError`
naming the layout it expected when the download does not look like it.
"""

from __future__ import annotations

import csv
import io
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["collect", "read_download", "parse_canvas", "parse_moodle", "parse_gradescope",
           "Entry", "Collected", "CollectError", "LAYOUTS", "MANIFEST_COLUMNS", "NO_TIME"]

LAYOUTS = ("canvas", "moodle", "gradescope")
MANIFEST_COLUMNS = ["student", "set", "submitted_at", "lms", "lms_key", "lms_late", "file"]
NO_TIME = {"canvas": "Canvas's download names carry no submission time (only a late marker)",
           "moodle": "Moodle's download carries no submission time (its grading worksheet has "
                     "it)"}
_CANVAS = re.compile(r"^(?P<name>[^_/]+?)(?P<late>_late)?_(?P<user>\d+)_(?P<attachment>\d+)_"
                     r"(?P<file>.+)$")
_MOODLE = re.compile(r"^(?P<name>.+)_(?P<participant>\d+)_assignsubmission_file_?$")
_SUFFIX = re.compile(r"^(?P<stem>.+?)-(?P<n>\d+)$")
_GS_TIME = re.compile(r"^(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:\.(\d+))?\s*"
                      r"(Z|[+-]\d\d:?\d\d)?$")


class CollectError(Exception):
    """The download cannot be collected (the reason in one line)."""


@dataclass
class Entry:
    """One file of the download: its path inside it (``/``-separated) and its bytes."""

    name: str
    data: bytes | None      # None: larger than the grader reads (left out, with a note)


@dataclass
class Collected:
    """One notebook found in the download, before it is written."""

    student: str            # the LMS's name for the student (before the roster)
    set_name: str
    data: bytes | None
    submitted_at: str = ""  # ISO 8601, empty where the layout has none
    lms_key: str = ""
    lms_id: str = ""        # the id that tells two students of one name apart
    late: str = ""          # Canvas's marker: "yes" or ""
    file: str = ""
    email: str = ""
    order: int = 0          # resubmission number (Canvas's -N)


def _wanted(name: str) -> bool:
    """Whether collect reads an entry's bytes: notebooks and Gradescope's metadata only (a
    download also holds PDFs and archives nobody grades here)."""
    return name.endswith((".ipynb", "/submission_metadata.yml")) or \
        name == "submission_metadata.yml"


def read_download(path: Path) -> list[Entry]:
    """The files of a download: a zip's members (folders skipped) or a folder's files (symbolic
    links skipped); the bytes of notebooks and metadata only, none of a file larger than the
    grader reads (``MAX_NOTEBOOK_BYTES``: its data is None). Raises CollectError when it is
    neither a folder nor a zip."""
    from txlearn.course.grading.submission import MAX_NOTEBOOK_BYTES

    path = Path(path)
    if path.is_dir():
        out = []
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = Path(folder) / name
                rel = full.relative_to(path).as_posix()
                if full.is_symlink() or not _wanted(rel):
                    continue
                big = full.stat().st_size > MAX_NOTEBOOK_BYTES
                out.append(Entry(rel, None if big else full.read_bytes()))
        return out
    try:
        with zipfile.ZipFile(path) as archive:
            return [Entry(i.filename, None if i.file_size > MAX_NOTEBOOK_BYTES
                          else archive.read(i)) for i in archive.infolist()
                    if not i.is_dir() and _wanted(i.filename)]
    except (zipfile.BadZipFile, OSError) as err:
        raise CollectError(f"{path}: neither a folder nor a zip file ({err})") from None


def _set_of(file_name: str, forced: str | None):
    """(set name, resubmission number) of a notebook's file name, or (None, 0)."""
    from txlearn.course import build

    if not file_name.endswith(".ipynb"):
        return None, 0
    stem, order = file_name[:-len(".ipynb")], 0
    match = _SUFFIX.match(stem)
    if match:
        stem, order = match.group("stem"), int(match.group("n"))
    if forced:
        return forced, order
    source = build.find_source(stem.strip())
    return (source.stem if source is not None else None), order


def _skipped(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return name.startswith("__MACOSX/") or base.startswith(".") or ".ipynb_checkpoints" in name


def parse_canvas(entries: list[Entry], forced: str | None = None) -> list[Collected]:
    """The notebooks of a Canvas download (layout in the module docstring)."""
    out, bad = [], []
    for e in entries:
        if _skipped(e.name):
            continue
        base = e.name.rsplit("/", 1)[-1]
        match = _CANVAS.match(base)
        if not match:
            bad.append(base)
            continue
        set_name, order = _set_of(match.group("file"), forced)
        if set_name is None:
            continue
        out.append(Collected(student=match.group("name"), set_name=set_name, data=e.data,
                             lms_key=f"{match.group('name')}_{match.group('user')}_"
                                     f"{match.group('attachment')}",
                             lms_id=match.group("user"), late="yes" if match.group("late")
                             else "", file=e.name, order=order))
    if bad and not out:
        raise CollectError(f"not a Canvas download: {bad[0]!r} is not named "
                           f"name_userid_attachmentid_file (e.g. smithjane_1234_5678_"
                           f"01_softmax.ipynb)")
    return out


def parse_moodle(entries: list[Entry], forced: str | None = None) -> list[Collected]:
    """The notebooks of a Moodle download (layout in the module docstring)."""
    out, bad = [], []
    for e in entries:
        if _skipped(e.name):
            continue
        parts = e.name.split("/")
        match = _MOODLE.match(parts[0]) if len(parts) >= 2 else None
        if not match:
            bad.append(e.name)
            continue
        set_name, order = _set_of(parts[-1], forced)
        if set_name is None:
            continue
        out.append(Collected(student=match.group("name"), set_name=set_name, data=e.data,
                             lms_key=f"{match.group('name')}_{match.group('participant')}",
                             lms_id=match.group("participant"), file=e.name, order=order))
    if bad and not out:
        raise CollectError(f"not a Moodle download: {bad[0]!r} is not in a folder named "
                           f"'Full Name_participantid_assignsubmission_file_'")
    return out


def _gradescope_time(value) -> str:
    """Gradescope's ``:created_at:`` (``2026-10-05 21:59:00.123456789 -0700``, or a YAML
    datetime) as ISO 8601."""
    from datetime import datetime

    from txlearn.course.gradebook.course import utc_iso

    if isinstance(value, datetime):
        return utc_iso(value) if value.tzinfo else value.isoformat() + "Z"
    match = _GS_TIME.match(str(value).strip())
    if not match:
        raise CollectError(f"submission_metadata.yml: :created_at: {value!r} is not a time")
    day, clock, fraction, zone = match.groups()
    zone = zone or "+00:00"
    if zone != "Z" and ":" not in zone:
        zone = zone[:3] + ":" + zone[3:]
    text = f"{day}T{clock}" + (f".{(fraction or '')[:6]}" if fraction else "") + \
        ("+00:00" if zone == "Z" else zone)
    return utc_iso(datetime.fromisoformat(text))


def parse_gradescope(entries: list[Entry], forced: str | None = None) -> list[Collected]:
    """The notebooks of a Gradescope export (layout in the module docstring)."""
    import yaml

    metas = [e for e in entries if e.name.rsplit("/", 1)[-1] == "submission_metadata.yml"]
    if not metas:
        raise CollectError("not a Gradescope export: no submission_metadata.yml (expected it "
                           "beside one folder per submission, submission_<id>/)")
    meta_entry = metas[0]
    if meta_entry.data is None:
        raise CollectError("submission_metadata.yml is larger than txlearn reads")
    base = meta_entry.name[:-len("submission_metadata.yml")]
    try:
        metadata = yaml.safe_load(meta_entry.data.decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise CollectError(f"submission_metadata.yml is not YAML ({type(err).__name__})") \
            from None
    if not isinstance(metadata, dict):
        raise CollectError("submission_metadata.yml does not map submission folders to their "
                           "submitters")
    out = []
    for e in entries:
        if _skipped(e.name) or not e.name.startswith(base) or e is meta_entry:
            continue
        parts = e.name[len(base):].split("/")
        record = metadata.get(parts[0]) if len(parts) >= 2 else None
        if not isinstance(record, dict):
            continue
        set_name, order = _set_of(parts[-1], forced)
        if set_name is None:
            continue
        submitters = record.get(":submitters") or []
        first = submitters[0] if submitters and isinstance(submitters[0], dict) else {}
        email = str(first.get(":email") or "")
        name = email or str(first.get(":name") or "") or parts[0]
        when = record.get(":created_at")
        out.append(Collected(student=name, set_name=set_name, data=e.data,
                             submitted_at=_gradescope_time(when) if when else "",
                             lms_key=parts[0], lms_id=str(first.get(":sid") or parts[0]),
                             file=e.name, email=email, order=order))
    return out


def _folder_name(name: str) -> str:
    from txlearn.course.gradebook.course import name_key

    clean = re.sub(r"[/\\\x00-\x1f]", "_", name_key(name)).strip(". ")
    return clean[:100] or "student"


def _students(found: list[Collected], lms: str, course) -> dict[int, str]:
    """The student folder of each collected notebook (see the module docstring)."""
    by_id = {}
    for key, ident in (course.roster.items() if course is not None else ()):
        if lms == "canvas" and ident.get("canvas_id"):
            by_id[("id", ident["canvas_id"].strip())] = key
        if ident.get("email"):
            by_id[("email", ident["email"].strip().lower())] = key
    names: dict[str, set[str]] = {}
    for c in found:
        names.setdefault(_folder_name(c.student), set()).add(c.lms_id)
    out = {}
    for i, c in enumerate(found):
        roster = by_id.get(("id", c.lms_id)) or by_id.get(("email", c.email.lower()))
        folder = _folder_name(c.student)
        if roster:
            out[i] = roster
        elif len(names[folder]) > 1:
            out[i] = f"{folder}_{c.lms_id}"
        else:
            out[i] = folder
    return out


def collect(download: Path, dest: Path, *, layout: str, set_name: str | None = None,
            course=None) -> tuple[list[dict], list[str]]:
    """Write the download's notebooks into ``dest/<student>/<set>.ipynb`` and their rows into
    ``dest/manifest.csv`` (rows of other notebooks already there are kept); returns (the rows
    written, notes for the instructor).

    ``layout``: one of :data:`LAYOUTS`; ``set_name``: the set of every notebook (else each
    file's name says it); ``course``: a :class:`~txlearn.course.gradebook.course.Course` whose
    roster names the folders. A student's latest resubmission of a set is kept. A notebook
    already in ``dest`` is never overwritten: a different one stops the run before anything is
    written.

    Raises:
        CollectError: an unknown layout, a download that does not look like it (naming the
            layout expected), an unknown ``set_name``, or a notebook that would replace another.
    """
    from txlearn.course import build

    if layout not in LAYOUTS:
        raise CollectError(f"layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    if set_name is not None:
        source = build.find_source(set_name)
        if source is None:
            raise CollectError(f"--set {set_name}: no such exercise set")
        set_name = source.stem
    parser = {"canvas": parse_canvas, "moodle": parse_moodle,
              "gradescope": parse_gradescope}[layout]
    found = parser(read_download(Path(download)), set_name)
    too_large = [c.file for c in found if c.data is None]
    found = [c for c in found if c.data is not None]
    if not found:
        raise CollectError(f"no exercise notebook (NN_name.ipynb) in the {layout} download "
                           f"{download}")
    folders = _students(found, layout, course)
    latest: dict[tuple[str, str], int] = {}
    for i, c in enumerate(found):
        key = (folders[i], c.set_name)
        if key not in latest or c.order > found[latest[key]].order:
            latest[key] = i
    dest = Path(dest)
    plan = []
    for (student, which), i in sorted(latest.items()):
        target = dest / student / f"{which}.ipynb"
        if target.exists() and target.read_bytes() != found[i].data:
            raise CollectError(f"{target} exists and differs from {found[i].file}: collect "
                               f"into a new folder (nothing was written)")
        plan.append((target, found[i], student))
    rows = []
    for target, c, student in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_bytes(c.data)
        rows.append({"student": student, "set": c.set_name, "submitted_at": c.submitted_at,
                     "lms": layout, "lms_key": c.lms_key, "lms_late": c.late, "file": c.file})
    _write_manifest(dest / "manifest.csv", rows)
    notes = []
    if layout in NO_TIME:
        notes.append(f"{NO_TIME[layout]}: manifest.csv leaves submitted_at empty, so lateness "
                     f"would come from the files' modification times (the time of this "
                     f"collection); fill it in, or give the course no deadline for these sets")
    if too_large:
        notes.append(f"{len(too_large)} notebook(s) larger than the grader reads left out: "
                     f"{', '.join(too_large[:3])}")
    dropped = len(found) - len(plan)
    if dropped:
        notes.append(f"{dropped} earlier resubmission(s) left out (the latest of each student "
                     f"and set is kept)")
    return rows, notes


def _write_manifest(path: Path, rows: list[dict]) -> None:
    """Add ``rows`` to the manifest at ``path`` (a row of the same student and set replaced).
    Cells are written exactly (the course file reads them back to match folder names)."""
    kept = []
    if path.is_file():
        with open(path, newline="", encoding="utf-8-sig") as f:
            new = {(r["student"], r["set"]) for r in rows}
            kept = [r for r in csv.DictReader(f) if (r.get("student"), r.get("set")) not in new]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(MANIFEST_COLUMNS)
    for row in kept + rows:
        writer.writerow([row.get(c, "") or "" for c in MANIFEST_COLUMNS])
    path.write_text(buffer.getvalue(), encoding="utf-8")
