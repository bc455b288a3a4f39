"""Feedback back into the LMS (``txlearn feedback-upload``): each student's feedback page for one
set, packed in the zip that Canvas's or Moodle's bulk upload of feedback files reads.

The page of each (student, set) is the one ``txlearn feedback`` writes
(:func:`~txlearn.course.gradebook.feedback.feedback_page`, the run that counts); who the student
is in the LMS comes from the ``lms_key`` column of the manifest ``txlearn collect`` wrote from
that LMS's download. Layouts, as each system reads them:

- **Canvas** (an assignment's "Re-Upload Submissions": each file becomes a comment on the
  student's submission, with the file attached): a flat zip whose file names keep the download's
  ``<name>_<user id>_<attachment id>_`` prefix; Canvas takes the first two parts that are all
  digits as the user id and the id of an attachment of that user's submission
  (canvas-lms, ``Assignment#infer_comment_context_from_filename``). Written:
  ``smithjane_1234_5678_feedback.html``.
- **Moodle** (an assignment's "Upload multiple feedback files in a zip", the "Feedback files"
  feedback type enabled): each file in a folder
  ``<Full Name>_<participant id>_<plugin type>_<plugin name>_``; Moodle reads the participant
  id from the second underscore-separated part and the plugin from the third and fourth
  (mod/assign/feedback/file/importziplib.php). Written:
  ``Jane Smith_301_assignfeedback_file_/feedback_01_softmax.html``, a feedback file of the file
  feedback plugin.

A student the manifest does not name for that LMS is left out and listed (they were not in the
download, or were collected from another LMS).
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

__all__ = ["pack_feedback", "read_keys", "entry_name", "LMS", "FeedbackUploadError"]

LMS = ("canvas", "moodle")


class FeedbackUploadError(Exception):
    """The feedback cannot be packed (the reason in one line)."""


def read_keys(manifest: Path, lms: str) -> dict[tuple[str, str], str]:
    """``{(student, set): lms_key}`` of the manifest's rows collected from ``lms``. Raises
    FeedbackUploadError when the manifest lacks the columns ``txlearn collect`` writes."""
    from txlearn.course.gradebook.course import name_key

    try:
        with open(manifest, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise FeedbackUploadError(f"manifest {manifest}: cannot be read ({err})") from None
    if rows and not {"student", "set", "lms", "lms_key"} <= set(rows[0]):
        raise FeedbackUploadError(f"manifest {manifest} has no lms and lms_key columns: write it "
                                  f"with txlearn collect from the {lms} download")
    return {(name_key(r["student"]), r["set"]): r["lms_key"] for r in rows
            if r.get("lms") == lms and r.get("lms_key")}


def entry_name(lms: str, key: str, set_name: str) -> str:
    """The zip entry of one student's page: see the module docstring."""
    if lms == "canvas":
        return f"{key}_feedback.html"
    return f"{key}_assignfeedback_file_/feedback_{set_name}.html"


def pack_feedback(rows, manifest: Path, lms: str, set_name: str, dest: Path, *,
                  policy: str = "latest", generated: str = "") -> tuple[int, list[str]]:
    """Write ``dest``, the zip of ``set_name``'s feedback pages for ``lms`` (one of
    :data:`LMS`), from the gradebook's ``rows``; returns (pages packed, students left out).

    Raises:
        FeedbackUploadError: an unknown LMS, a manifest without the LMS's keys, or no page to
            pack.
    """
    from txlearn.course.gradebook.feedback import feedback_page
    from txlearn.course.gradebook.store import counting

    if lms not in LMS:
        raise FeedbackUploadError(f"LMS {lms!r}: use one of {', '.join(LMS)}")
    keys = read_keys(Path(manifest), lms)
    history: dict[tuple[str, str], list] = {}
    for r in rows:
        history.setdefault((r.student, r.set_name), []).append(r)
    buffer, packed, left_out = io.BytesIO(), 0, []
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for (student, which), row in sorted(counting(rows, policy).items()):
            if which != set_name:
                continue
            key = keys.get((student, which))
            if key is None:
                left_out.append(student)
                continue
            page = feedback_page(row, history[(student, which)], policy=policy,
                                 generated=generated)
            archive.writestr(entry_name(lms, key, which), page.encode("utf-8"))
            packed += 1
    if not packed:
        raise FeedbackUploadError(f"no feedback page of {set_name} to pack: the manifest names "
                                  f"none of its {len(left_out)} graded student(s) for {lms}")
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    Path(dest).write_bytes(buffer.getvalue())
    return packed, left_out
