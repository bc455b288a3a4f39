"""The course as an offline HTML book: every lesson executed, its math typeset without a network.

``txlearn book DEST`` (``make book``) writes::

    DEST/index.html              contents: README's lesson table (what each lesson measures),
                                 links to every lesson and exercise set, how the book was built
    DEST/NN_name.html            each lesson, executed, figures embedded as data: URLs, with
                                 previous / contents / exercises / next links
    DEST/exercises/NN_name.html  each exercise set's statements: the student version (stubs,
                                 no solutions), shown without executing it; a set with no
                                 lesson of its own name (set 11) follows the last lesson its
                                 header's ``lessons:`` names
    DEST/guides/NAME.html        each guide of docs/ and CONTRIBUTING.md (txlearn.course.book_guides),
                                 rendered like the lessons: same navigation, math and link check
    DEST/reference/txlearn/...   the API reference, one page per public module, from __all__ and
                                 the docstrings (pdoc: txlearn.course.reference)
    DEST/mathjax/                MathJax 3 (tex-chtml.js and what it loads), copied from the PyPI
                                 package django-static-mathjax (txlearn.course.book_mathjax)

Every reference a page loads is a relative path inside DEST (checked when the book is written),
so the folder works when zipped, unzipped elsewhere and opened on a machine with no network.

Math: nbconvert's markdown renderer leaves ``$...$``, ``$$...$$`` and ``\\begin{...}`` spans in
the page for MathJax 3, the typesetter JupyterLab itself uses for the lessons' TeX; here MathJax
is loaded from ``mathjax/`` instead of a CDN and draws with its own web fonts (its TeX fonts),
so pages look the same in every browser and need no math font on the reader's machine. The TeX
packages "noerrors" and "noundefined" are left out: a TeX mistake shows as a red error box (and
fails the browser test in ``tests/test_book.py``) instead of silently printing its source.

The lesson table has one source: the table under "## The lessons" in README.md. Its rows must
match ``notebooks/*.ipynb`` one for one; a lesson missing from either side stops the build.
Lessons are executed with nbclient (cwd ``notebooks/``, a kernel of the running Python) and
exported with nbconvert's ``lab`` template, with its CDN scripts (require.js, mermaid) removed.

Figures: every image a lesson outputs must carry alt text, a sentence saying what it shows (the
lessons display figures with ``txlearn.plotting.show(fig, alt=...)``, which stores it in the
output's metadata as ``{"image/png": {"alt": ...}}``). The template writes it as the ``<img>``'s
``alt`` attribute (nbconvert's own lab template drops it), and an executed lesson with an image
output lacking it, or with fewer than ``MIN_ALT_WORDS`` words, stops the build (BookError naming
the cells).
"""

from __future__ import annotations

import datetime
import html
import importlib.metadata
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import nbformat

from txlearn.course import book_links, reference
from txlearn.course.book_mathjax import (MATHJAX_COMPONENT, MathJaxMissing, copy_mathjax,
                                         mathjax_source)
from txlearn.course.book_guides import Guide, book_markdown, find_guides
from txlearn.course.build import ROOT, Layout, read_source, set_info
from txlearn.course.figures import alt_text, figure_count, figures_without_alt

__all__ = ["BookError", "LessonEntry", "Page", "alt_text", "write_book", "check_links", "execute",
           "figures_without_alt", "lesson_table", "mathjax_source", "REFERENCE_HOME"]

MARKER = ".txlearn-book"  # marks a folder as a book this module wrote (safe to replace)
REFERENCE_HOME = "reference/txlearn.html"
"""The API reference's first page, relative to the book (the package's own page)."""

# nbconvert's lab template, minus its CDN scripts, plus the book's navigation and a local MathJax 3
# with the delimiters and AMS numbering of nbconvert's own configuration.
TEMPLATE = r"""{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js_mathjax -%}
<script>
window.MathJax = {
  tex: {inlineMath: [["$", "$"], ["\\(", "\\)"]], displayMath: [["$$", "$$"], ["\\[", "\\]"]],
        processEscapes: true, processEnvironments: true, tags: "ams",
        packages: {"[-]": ["noerrors", "noundefined"]}},
  options: {ignoreHtmlClass: "tex2jax_ignore", processHtmlClass: "tex2jax_process"}
};
</script>
<script src="{{ resources.mathjax_url }}" id="MathJax-script"></script>
<style type="text/css">
  .txlearn-nav { display: flex; flex-wrap: wrap; gap: 0.5em 2em; justify-content: space-between;
                 max-width: 1100px; margin: 0 auto; padding: 0.7em 1em;
                 font-family: var(--jp-ui-font-family); font-size: 0.95em; }
  .txlearn-nav a { text-decoration: none; }
  .txlearn-note { max-width: 1100px; margin: 0.5em auto; padding: 0.6em 1em;
                  background: #f3f6fa; border-left: 4px solid #6b8fb8;
                  font-family: var(--jp-ui-font-family); }
</style>
{%- endblock html_head_js_mathjax -%}
{% block data_png scoped %}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}"
{%- set alt = output | get_metadata('alt', 'image/png') -%}
{%- if alt is not none %} alt="{{ alt | escape_html }}"{%- endif -%}
{%- set width = output | get_metadata('width', 'image/png') -%}
{%- if width is not none %} width={{ width | escape_html }}{%- endif -%}
{%- set height = output | get_metadata('height', 'image/png') -%}
{%- if height is not none %} height={{ height | escape_html }}{%- endif -%}
{%- if output | get_metadata('needs_background', 'image/png') == 'light' %} class="jp-needs-light-background"{%- endif -%}
>
</div>
{% endblock data_png %}
{%- block body_header -%}
{{ super() }}
{{ resources.txlearn_top }}
{%- endblock body_header -%}
{% block body_footer %}
{{ resources.txlearn_bottom }}
{{ super() }}
{% endblock body_footer %}
"""


class BookError(Exception):
    """The book cannot be written: a lesson failed, the lesson table and notebooks/ disagree,
    a page references something outside the book, or DEST is not a book folder."""


@dataclass(frozen=True)
class LessonEntry:
    """One row of README's lesson table: ``number`` "01", ``stem`` "01_softmax", ``title`` (plain
    text), ``measures`` (the row's markdown, as written in README)."""

    number: str
    stem: str
    title: str
    measures: str


@dataclass
class Page:
    """A page the book wrote: ``path`` relative to DEST; ``kind`` "contents", "lesson",
    "exercises", "guide" or "reference"; ``notebook`` as rendered (executed for lessons when
    asked; None for a reference page, which pdoc writes); ``seconds`` of execution (None when
    not executed); ``figures``: image outputs embedded in the page."""

    path: Path
    kind: str
    notebook: nbformat.NotebookNode | None
    seconds: float | None = None
    figures: int = 0


def lesson_table(readme: Path = ROOT / "README.md") -> list[LessonEntry]:
    """Parse the lesson table of README.md (header ``NN | lesson | what it measures``).

    The lesson cell must be a link to ``notebooks/NN_name.ipynb``. Raises BookError when the
    table is missing or a row does not have that form.
    """
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(readme.read_text(encoding="utf-8"))
    rows, row, in_table, header = [], [], False, []
    for tok in tokens:
        if tok.type == "table_open":
            in_table, header, rows = True, [], []
        elif tok.type == "table_close":
            if [h.lower() for h in header] == ["nn", "lesson", "what it measures"]:
                return [_entry(cells, readme) for cells in rows]
            in_table = False
        elif in_table and tok.type == "tr_open":
            row = []
        elif in_table and tok.type == "inline":
            row.append(tok)
        elif in_table and tok.type == "tr_close":
            if header:
                rows.append(row)
            else:
                header = [t.content.strip() for t in row]
    raise BookError(f"{readme}: no table with the header 'NN | lesson | what it measures'")


def _entry(cells, readme: Path) -> LessonEntry:
    number, lesson, measures = cells
    children = lesson.children or []
    link = next((t for t in children if t.type == "link_open"), None)
    href = link.attrGet("href") if link is not None else ""
    if not re.fullmatch(r"notebooks/\d\d_\w+\.ipynb", str(href)):
        raise BookError(f"{readme}: lesson {number.content!r}: the lesson cell must link to "
                        f"notebooks/NN_name.ipynb, got {lesson.content!r}")
    title = "".join(t.content for t in children if t.type in ("text", "code_inline"))
    return LessonEntry(number.content.strip(), Path(href).stem, title.strip(),
                       measures.content.strip())


def _select(entries: list[LessonEntry], lessons) -> list[LessonEntry]:
    if lessons is None:
        return entries
    wanted = [str(x) for x in lessons]
    chosen = [e for e in entries if e.number in wanted or e.stem in wanted]
    unknown = set(wanted) - {e.number for e in chosen} - {e.stem for e in chosen}
    if unknown:
        raise BookError(f"no lesson {', '.join(sorted(unknown))} in README's lesson table "
                        f"(lessons: {', '.join(e.number for e in entries)})")
    return chosen


def _check_table(entries: list[LessonEntry], layout: Layout) -> None:
    on_disk = {p.stem for p in layout.notebooks.glob("*.ipynb")}
    in_table = {e.stem for e in entries}
    if on_disk != in_table:
        raise BookError("README's lesson table and notebooks/ disagree: "
                        f"without a row: {sorted(on_disk - in_table)}; "
                        f"without a notebook: {sorted(in_table - on_disk)}")


def _sets_after_lessons(layout: Layout, entries: list[LessonEntry]) -> dict[str, list[str]]:
    """{lesson stem: exercise sets shown after it} for the sets with no lesson of their own name:
    each follows the last lesson of its header's ``lessons:`` (BookError when none is in the
    table)."""
    stems = [e.stem for e in entries]
    after: dict[str, list[str]] = {}
    for student in sorted(layout.student.glob("[0-9][0-9]_*.ipynb")):
        source = layout.exercise_sources / f"{student.stem}.py"
        if student.stem in stems or not source.exists():
            continue
        info = set_info(read_source(source), student.stem, source.name)
        known = [s for s in info.lessons if s in stems]
        if not known:
            raise BookError(f"exercise set {student.stem} has no lesson of its name and its "
                            f"header names no lesson of the table (lessons: {list(info.lessons)})")
        after.setdefault(max(known, key=stems.index), []).append(student.stem)
    return after


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)      # let ipykernel choose its inline backend: figures as PNG
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int) -> float:
    """Run every cell of `nb` in place (outputs stored in `nb`) in a fresh kernel of the running
    Python, with working folder `cwd`; `timeout` per cell in seconds. Returns wall seconds.
    Raises BookError naming the failing cell's error."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    start = time.perf_counter()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    # The kernel's own log (a start-up warning on every run) is kept out of the build's output
    # and quoted only when the kernel dies.
    with tempfile.TemporaryFile("w+") as log:
        try:
            client.execute(env=_kernel_env(), stderr=log)
        except CellExecutionError as err:
            raise BookError(f"a cell failed:\n{str(err)[-2000:]}") from None
        except DeadKernelError as err:
            log.seek(0)
            raise BookError(f"the kernel died ({err}); its log:\n{log.read()[-2000:]}") from None
    return time.perf_counter() - start


def _exporter(depth: int):
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", template_file="txlearn_book.html.j2",
                            extra_loaders=[DictLoader({"txlearn_book.html.j2": TEMPLATE})],
                            embed_images=True)
    exporter.mathjax_url = "../" * depth + f"mathjax/{MATHJAX_COMPONENT}"
    return exporter


def _nav(links: list[tuple[str, str, str]]) -> str:
    """links: (rel, href, text); an empty href keeps the slot without a link."""
    parts = []
    for rel, href, text in links:
        if href:
            rel_attr = f' rel="{rel}"' if rel else ""
            parts.append(f'<a{rel_attr} href="{html.escape(href)}">{html.escape(text)}</a>')
        else:
            parts.append("<span></span>")
    return '<nav class="txlearn-nav">' + "".join(parts) + "</nav>"


def _rewrite_links(nb, lesson_pages: dict[str, str], exercise_pages: dict[str, str]) -> None:
    """Point markdown links at notebooks to the book's pages: a lesson's ``NN_name.ipynb`` to
    its page, the learner's ``../work/NN_name.ipynb`` (or exercises/student/) to the statements
    page (``NN_name.ipynb#Heading`` keeps its ``#Heading``). A link to a course notebook that
    this build leaves out keeps its text and loses its target; any other link is left for
    check_links to judge."""
    def target(match: re.Match) -> str:
        text, href, fragment = match.group(1), match.group(2), match.group(3) or ""
        stem = Path(urlsplit(href).path).stem
        exercises = "work/" in href or "exercises/" in href
        pages = exercise_pages if exercises else lesson_pages
        if stem in pages:
            return f"[{text}]({pages[stem]}{fragment})"   # a heading's anchor is kept
        if re.fullmatch(r"\d\d_\w+", stem):
            return text                        # a course notebook not in this build
        return match.group(0)

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = re.sub(r"\[([^\]]*)\]\(([^)\s#]+\.ipynb)(#[^)\s]*)?\)", target,
                                 cell.source)


def _write(exporter, nb, path: Path, title: str, top: str, bottom: str) -> None:
    nb.metadata["title"] = title
    body, _ = exporter.from_notebook_node(nb, resources={"txlearn_top": top,
                                                         "txlearn_bottom": bottom})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body, encoding="utf-8")


def _contents(entries, built: dict[str, Page], exercises: dict[str, str], execute_: bool,
              sets_after: dict[str, list[str]] | None = None, guides=(),
              reference_pages: int = 0) -> str:
    rows = ["| NN | lesson | what it measures | exercises | run (s) |",
            "|---|---|---|---|---|"]
    for e in entries:
        page = built.get(e.stem)
        title = e.title.replace("|", "\\|")
        lesson = f"[{title}]({page.path.as_posix()})" if page else f"{title} (not in this build)"
        ex = f"[statements]({exercises[e.stem]})" if e.stem in exercises else ""
        ex = ", ".join([ex] * bool(ex) + [f"[set {s.split('_', 1)[0]}]({exercises[s]})"
                                          for s in (sets_after or {}).get(e.stem, [])])
        run = f"{page.seconds:.1f}" if page and page.seconds is not None else ""
        measures = re.sub(r"\]\(notebooks/(\w+)\.ipynb\)", r"](\1.html)", e.measures)
        rows.append(f"| {e.number} | {lesson} | {measures} | {ex} | {run} |")
    budget = os.environ.get("TXLEARN_TRAIN_SECONDS")
    if not execute_:
        how = ("The lessons were **not executed** for this build (text and code only, no "
               "outputs): `make book` writes the executed book.")
    else:
        how = ("Every lesson listed with a link was executed for this build; each ends its "
               "measured claims in an `assert`, so a page exists only if its claims held. ")
        how += (f"The capstone's training budget was cut to {budget} s (`TXLEARN_TRAIN_SECONDS`, "
                "as under `make test`), so its numbers are not the full run's."
                if budget else "The capstone trained with its full default budget.")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(f"{name} {_version(name)}" for name in ("txlearn", "torch", "numpy"))
    return "\n".join([
        "# txlearn: the transformer from first principles",
        "",
        "An open course that derives the transformer layer one component at a time and measures "
        "every claim it makes. Read the lessons in order; each links to the statements of its "
        "exercises. To solve the exercises, run `make lab` in the course's repository: it copies "
        "them into `work/` and opens JupyterLab, and each check cell says what is wrong.",
        "",
        *rows,
        "",
        how,
        "",
        *_guides_section(guides, reference_pages),
        f"Built {stamp} with {versions}. This folder needs no network: every page, figure and "
        "the math typesetter (MathJax, in `mathjax/`) are inside it, linked by relative paths, "
        "so it can be zipped and opened anywhere.",
    ])


def _guides_section(guides, reference_pages: int) -> list[str]:
    """The contents page's list of the guides and the API reference (none: no lines)."""
    lines = [f"- [{g.title}]({g.page})" for g in guides]
    if reference_pages:
        lines.append(f"- [API reference]({REFERENCE_HOME}): {reference_pages} public modules, "
                     "generated from their `__all__` and docstrings")
    return ["## Guides and reference", "", *lines, ""] if lines else []


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _prepare(dest: Path) -> Path:
    if dest.exists() and any(dest.iterdir()) and not (dest / MARKER).exists():
        raise BookError(f"{dest} exists and is not a book written by txlearn: choose a new or "
                        "empty folder (the book replaces its folder's contents)")
    partial = dest.with_name(dest.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    return partial


def write_book(dest: Path, lessons=None, execute_lessons: bool = True, timeout: int = 1200,
               layout: Layout = Layout(), readme: Path | None = None,
               progress=None, guides: bool = True, reference: bool = True) -> list[Page]:
    """Write the book into `dest` (created; a previous book there is replaced).

    Args:
        dest: the book's folder. Refused (BookError) when it exists, is not empty and was not
            written by this function.
        lessons: lesson numbers ("01") or stems ("01_softmax") to include; None for all. The
            contents page lists every lesson of the table either way.
        execute_lessons: run each lesson first (outputs and figures on the page); False renders
            the sources as they are (a quick look at the text and the math).
        timeout: seconds allowed per cell.
        layout: where lessons/notebooks/exercises live (the repository by default).
        readme: the file holding the lesson table (``layout.root / "README.md"``).
        progress: called with each Page as soon as it is written.
        guides: write the guides (docs/*.md, CONTRIBUTING.md) as pages of the book.
        reference: write the API reference (pdoc), one page per public module.

    Returns:
        the pages written: contents first, then each lesson followed by its exercises page,
        then the guides, then the reference's module pages.

    Raises:
        BookError: a cell of a lesson failed (the error is quoted), README's table and
            notebooks/ disagree, a page references a file outside the book, or `dest` is refused.
            Nothing is left behind: the book is written beside `dest` and moved there at the end.
    """
    dest = Path(dest).resolve()
    entries = lesson_table(readme or layout.root / "README.md")
    _check_table(entries, layout)
    chosen = _select(entries, lessons)
    partial = _prepare(dest)
    try:
        writer = _Writer(partial, layout, chosen, execute_lessons, timeout, progress,
                         _sets_after_lessons(layout, entries))
        pages = writer.lessons()
        references = writer.reference() if reference else []   # the guides link its home
        pages += (writer.guides(find_guides(layout.root)) if guides else []) + references
        pages.insert(0, writer.contents(entries, pages))
        check_links(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    (partial / MARKER).write_text("written by txlearn.book; replaced by the next build\n")
    if dest.exists():
        shutil.rmtree(dest)
    partial.rename(dest)
    return pages


class _Writer:
    """Writes the pages of one build into `folder` (MathJax first)."""

    def __init__(self, folder: Path, layout: Layout, chosen: list[LessonEntry],
                 execute_lessons: bool, timeout: int, progress,
                 sets_after: dict[str, list[str]] | None = None):
        self.folder, self.layout, self.chosen = folder, layout, chosen
        self.execute, self.timeout, self.progress = execute_lessons, timeout, progress
        self.lesson_pages = {e.stem: f"{e.stem}.html" for e in chosen}
        self.exercise_pages = {e.stem: f"exercises/{e.stem}.html" for e in chosen
                               if (layout.student / f"{e.stem}.ipynb").exists()}
        self.sets_after = {lesson: sets for lesson, sets in (sets_after or {}).items()
                           if lesson in self.lesson_pages}
        for sets in self.sets_after.values():
            self.exercise_pages.update({s: f"exercises/{s}.html" for s in sets})
        self.top_level, self.nested = _exporter(0), _exporter(1)
        self.written_guides: list[Guide] = []
        self.reference_written = False
        try:
            copy_mathjax(folder / "mathjax")
        except MathJaxMissing as err:
            raise BookError(str(err)) from None

    def _done(self, page: Page) -> Page:
        if self.progress is not None:
            self.progress(page)
        return page

    def lessons(self) -> list[Page]:
        pages = []
        for i, entry in enumerate(self.chosen):
            before = self.chosen[i - 1] if i > 0 else None
            after = self.chosen[i + 1] if i + 1 < len(self.chosen) else None
            pages.append(self._done(self.lesson(entry, before, after)))
            if entry.stem in self.exercise_pages:
                pages.append(self._done(self.exercises(entry)))
            for stem in self.sets_after.get(entry.stem, []):
                pages.append(self._done(self.exercises(entry, stem)))
        return pages

    def lesson(self, entry: LessonEntry, before, after) -> Page:
        nb = nbformat.read(self.layout.notebooks / f"{entry.stem}.ipynb", as_version=4)
        seconds = None
        if self.execute:
            try:
                seconds = execute(nb, self.layout.notebooks, self.timeout)
            except BookError as err:
                raise BookError(f"lesson {entry.stem}: {err}") from None
            missing = figures_without_alt(nb)
            if missing:
                raise BookError(f"lesson {entry.stem}: {len(missing)} figure(s) without alt text "
                                "(show them with txlearn.plotting.show(fig, alt='what it "
                                "shows')):\n  " + "\n  ".join(missing))
        _rewrite_links(nb, self.lesson_pages, self.exercise_pages)
        nav = _nav([
            ("prev", self.lesson_pages[before.stem] if before else "",
             f"\u2039 {before.number} {before.title}" if before else ""),
            ("contents", "index.html", "contents"),
            ("", self.exercise_pages.get(entry.stem, ""), f"exercises {entry.number}"),
            ("next", self.lesson_pages[after.stem] if after else "",
             f"{after.number} {after.title} \u203a" if after else ""),
        ])
        note = "" if self.execute else (
            '<p class="txlearn-note">Not executed: this build shows the lesson\'s text and code '
            "without outputs (<code>make book</code> writes the executed book).</p>")
        path = Path(self.lesson_pages[entry.stem])
        _write(self.top_level, nb, self.folder / path,
               f"{entry.number} {entry.title} \u00b7 txlearn", nav + note, nav)
        return Page(path, "lesson", nb, seconds, figure_count(nb))

    def exercises(self, entry: LessonEntry, stem: str | None = None) -> Page:
        """The statements page of set `stem` (the lesson's own set when None), after `entry`."""
        stem = stem or entry.stem
        number = stem.split("_", 1)[0]
        nb = nbformat.read(self.layout.student / f"{stem}.ipynb", as_version=4)
        _rewrite_links(nb, {k: f"../{v}" for k, v in self.lesson_pages.items()}, {})
        nav = _nav([("prev", f"../{self.lesson_pages[entry.stem]}",
                     f"\u2039 lesson {entry.number}: {entry.title}"),
                    ("contents", "../index.html", "contents")])
        whose = (f"lesson {html.escape(entry.number)}" if stem == entry.stem else
                 f"set {html.escape(number)} (after lesson {html.escape(entry.number)})")
        note = (f'<p class="txlearn-note">The exercise statements of {whose}, as a learner '
                "receives them (no solutions, not executed). To solve them, run <code>make "
                "lab</code> in the course's repository: it copies this notebook to "
                f"<code>work/{html.escape(stem)}.ipynb</code>, where each check cell says what "
                "is wrong.</p>")
        path = Path(self.exercise_pages[stem])
        _write(self.nested, nb, self.folder / path, f"{number} exercises \u00b7 txlearn",
               nav + note, nav)
        return Page(path, "exercises", nb)

    def guides(self, guides: list[Guide]) -> list[Page]:
        """Each guide as a page of guides/, with previous / contents / next links."""
        pages = []
        for i, guide in enumerate(guides):
            before = guides[i - 1] if i > 0 else None
            after = guides[i + 1] if i + 1 < len(guides) else None
            nav = _nav([
                ("prev", Path(before.page).name if before else "",
                 f"\u2039 {before.title}" if before else ""),
                ("contents", "../index.html", "contents"),
                ("", f"../{REFERENCE_HOME}" if self.reference_written else "", "API reference"),
                ("next", Path(after.page).name if after else "",
                 f"{after.title} \u203a" if after else ""),
            ])
            text = book_markdown(guide, guides, self.layout.root, self.lesson_pages)
            nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
            _write(self.nested, nb, self.folder / guide.page, f"{guide.title} \u00b7 txlearn",
                   nav, nav)
            pages.append(self._done(Page(Path(guide.page), "guide", nb)))
        self.written_guides = list(guides)
        return pages

    def reference(self) -> list[Page]:
        """The API reference (pdoc) in reference/: one page per public module."""
        try:
            written = reference.write_reference(self.folder / "reference")
        except reference.ReferenceBuildError as err:
            raise BookError(str(err)) from None
        self.reference_written = bool(written)
        return [self._done(Page(Path("reference") / p, "reference", None)) for p in written]

    def contents(self, entries: list[LessonEntry], pages: list[Page]) -> Page:
        built = {p.path.stem: p for p in pages if p.kind == "lesson"}
        text = _contents(entries, built, self.exercise_pages, self.execute, self.sets_after,
                         self.written_guides, sum(p.kind == "reference" for p in pages))
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
        _write(self.top_level, nb, self.folder / "index.html", "txlearn: the course as a book",
               "", "")
        return Page(Path("index.html"), "contents", nb)


def check_links(folder: Path) -> None:
    """Check that every page under `folder` loads nothing from outside it (the rule of
    :func:`txlearn.course.book_links.check_links`); raises BookError listing the references."""
    try:
        book_links.check_links(folder)
    except book_links.LinkError as err:
        raise BookError(str(err)) from None
