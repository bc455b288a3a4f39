"""The offline HTML book (txlearn.book), opened in a real browser with the network off.

Two builds: lessons 00-02 executed with their exercise statements (the cheap lessons: the full
book is `make book`'s), zipped and unzipped elsewhere before it is read; and the other lessons
and their exercise sets unexecuted, with the guides (docs/*.md, CONTRIBUTING.md) and the API
reference, so that the math of every markdown source is checked. Each
page is opened in Debian's Chromium, driven by Playwright over its pipe, with host names
unresolvable and every request not to a file: or data: URL recorded and aborted. On each page:

- every math span of the notebook's markdown cells is typeset by MathJax 3 without an error, with
  its TeX fonts loaded from the book, counted against
  the source with markdown-it's dollarmath/amsmath parser (not nbconvert's: an independent count);
  code cells are not counted (plot labels hold `$`), and MathJax must typeset nothing outside the
  markdown;
- each image output of an executed lesson is an embedded data: image that decodes, with alt
  text saying what it shows (at least MIN_ALT_WORDS words, each figure's own); a figure without
  it stops the build (checked on a probe lesson), and the browser check sees a missing one;
- every request stays on the machine and every link resolves to a file inside the book.

A screenshot of lesson 01 is kept in build/test-artifacts/book-01_softmax.png.
"""

import os
import re
import shutil
import zipfile
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from txlearn.course import book, figures
from txlearn.course.build import ROOT, Layout, solution_texts
from txlearn.plotting import MIN_ALT_WORDS

ARTIFACTS = ROOT / "build" / "test-artifacts"
EXECUTED = ["00", "01", "02"]
CHROMIUM_ARGS = ["--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--host-resolver-rules=MAP * ~NOTFOUND"]   # no host name resolves: network off


def math_spans(nb) -> int:
    """Math spans in the markdown cells, as markdown-it's dollarmath and amsmath plugins see
    them ($...$, $$...$$, \\begin{env}...\\end{env}); code spans and fences hold none."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.amsmath import amsmath_plugin
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    md = (MarkdownIt("commonmark").enable("table")
          .use(dollarmath_plugin, allow_space=True, allow_digits=True, double_inline=True)
          .use(amsmath_plugin))
    counts = Counter()

    def walk(tokens):
        for tok in tokens:
            if tok.type.startswith("math") or tok.type == "amsmath":
                counts[tok.type] += 1
            walk(tok.children or [])

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            walk(md.parse(cell.source))
    return sum(counts.values())


# Run in the page once MathJax 3 has typeset it: what was typeset, what failed, what it left raw.
REPORT_JS = r"""() => {
  const items = Array.from(MathJax.startup.document.math);
  const errors = items.filter(item => {
    let bad = false;
    item.root.walkTree(node => { if (node.isKind("merror")) bad = true; });
    return bad;
  }).map(item => item.math);
  const unrendered = items.filter(item => !item.typesetRoot ||
                                  item.typesetRoot.getBoundingClientRect().width === 0)
                          .map(item => item.math);
  const outside = items.filter(item => item.typesetRoot &&
                                       !item.typesetRoot.closest(".jp-MarkdownOutput"))
                       .map(item => item.math);
  const raw = [];
  document.querySelectorAll(".jp-MarkdownOutput").forEach(md => {
    const prose = md.cloneNode(true);
    prose.querySelectorAll("code, pre, script, mjx-container").forEach(e => e.remove());
    const text = prose.textContent;
    const at = text.search(/\$|\\\(|\\\[|\\begin\{/);
    if (at >= 0) raw.push(text.slice(Math.max(0, at - 40), at + 40));
  });
  const images = [...document.querySelectorAll(".jp-OutputArea-output img")].map(img => ({
    data: img.src.startsWith("data:image/"), width: img.naturalWidth,
    alt: img.hasAttribute("alt") ? img.getAttribute("alt") : null}));
  const fonts = [...document.fonts].filter(f => f.family.startsWith("MJXZERO") ||
                                                f.family.startsWith("MJXTEX"))
                                   .map(f => [f.family, f.status]);
  return {typeset: items.length, errors, unrendered, outside, raw, images, fonts,
          version: MathJax.version,
          links: [...document.querySelectorAll("a[href]")].map(a => a.href),
          text: document.body.innerText};
}"""


def chromium_path() -> str:
    path = os.environ.get("TXLEARN_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.fail("Chromium is missing: `make test` installs Debian's `chromium` when run as "
                    "root; otherwise run `sudo apt-get install chromium` (or point "
                    "TXLEARN_CHROMIUM at a Chromium binary)")
    return path


@pytest.fixture(scope="module")
def executed_book(tmp_path_factory):
    """Lessons 00-02 executed, zipped, and unzipped into another folder."""
    tmp = tmp_path_factory.mktemp("book")
    pages = book.write_book(tmp / "book", lessons=EXECUTED, guides=False, reference=False)
    archive = shutil.make_archive(str(tmp / "book"), "zip", root_dir=tmp / "book")
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp / "elsewhere")
    shutil.rmtree(tmp / "book")                  # only the unzipped copy is left to read
    return tmp / "elsewhere", pages


@pytest.fixture(scope="module")
def text_book(tmp_path_factory):
    """The lessons after 02 and their exercise sets, not executed; the guides; the reference."""
    folder = tmp_path_factory.mktemp("text") / "book"
    rest = [e.number for e in book.lesson_table() if e.number not in EXECUTED]
    return folder, book.write_book(folder, lessons=rest, execute_lessons=False)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium (fresh profile, sandbox off: the tests run as root) in which every
    request for anything but a file: or data: URL is aborted."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=executable,
            headless=True, chromium_sandbox=False, args=CHROMIUM_ARGS,
            viewport={"width": 1100, "height": 900})
        context.route("**/*", lambda route: route.continue_()
                      if route.request.url.startswith(("file:", "data:")) else route.abort())
        yield context
        context.close()


def open_page(context, path: Path, screenshot: Path | None = None) -> dict:
    """Open `path`, wait for MathJax's start-up typesetting to end, and report on the page,
    with every URL the page requested."""
    page = context.new_page()
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    try:
        page.goto(path.as_uri())
        page.wait_for_function("() => window.MathJax && MathJax.startup && "
                               "MathJax.startup.promise", timeout=60_000)
        # MathJax 3's start-up promise resolves once the first typesetting is done; then the
        # web fonts its output asked for
        page.evaluate("() => MathJax.startup.promise.then(() => document.fonts.ready)"
                      ".then(() => true)")
        report = page.evaluate(REPORT_JS)
        if screenshot is not None:
            page.evaluate("() => { const d = document.querySelector('mjx-container[display]'); "
                          "if (d) d.scrollIntoView(); window.scrollBy(0, -120); }")
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot))
    finally:
        page.close()
    report["requested"] = requested
    return report


@pytest.fixture(scope="module")
def reports(executed_book, text_book, browser):
    """Every page of both books, opened once: {(book, page path): (Page, report)}."""
    out = {}
    for name, (folder, pages) in {"executed": executed_book, "text": text_book}.items():
        for page in pages:
            if page.kind == "reference":
                continue                     # pdoc's pages load no MathJax: their own test
            shot = (ARTIFACTS / "book-01_softmax.png"
                    if name == "executed" and page.path == Path("01_softmax.html") else None)
            out[name, page.path] = page, open_page(browser, folder / page.path, shot)
    return out


def test_the_books_hold_the_pages_asked_for(executed_book, text_book):
    _, pages = executed_book
    assert [p.path.as_posix() for p in pages] == [
        "index.html", "00_map.html", "01_softmax.html", "exercises/01_softmax.html",
        "02_attention.html", "exercises/02_attention.html"]
    all_pages = pages + text_book[1]            # between them, every lesson and exercise set
    lessons = sorted(p.stem for p in Layout().notebooks.glob("*.ipynb"))
    exercises = sorted(p.stem for p in Layout().student.glob("*.ipynb"))
    assert sorted(p.path.stem for p in all_pages if p.kind == "lesson") == lessons
    assert sorted(p.path.stem for p in all_pages if p.kind == "exercises") == exercises
    assert all(p.seconds is not None for p in pages if p.kind == "lesson")
    assert all(p.seconds is None for p in text_book[1])
    guides = [p.path.as_posix() for p in text_book[1] if p.kind == "guide"]
    docs = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert sorted(guides) == sorted([f"guides/{d}.html" for d in docs] + ["guides/contributing.html"])
    assert guides.index("guides/learners.html") < guides.index("guides/instructors.html")
    references = [p.path for p in text_book[1] if p.kind == "reference"]
    assert Path("reference/txlearn/attention.html") in references and len(references) > 60


def test_every_math_span_of_every_page_is_typeset(reports):
    checked = 0
    for (name, path), (page, report) in reports.items():
        where = f"{name} book, {path}"
        expected = math_spans(page.notebook)
        assert report["typeset"] == expected, (
            f"{where}: MathJax typeset {report['typeset']} spans, the markdown holds {expected}")
        assert report["errors"] == [], f"{where}: TeX errors in {report['errors'][:5]}"
        assert report["unrendered"] == [], f"{where}: not drawn: {report['unrendered'][:5]}"
        assert report["outside"] == [], f"{where}: math typeset outside markdown cells"
        assert report["raw"] == [], f"{where}: raw TeX left in the prose: {report['raw'][:3]}"
        assert report["version"].startswith("3."), f"{where}: MathJax {report['version']}"
        if expected:
            statuses = {status for _, status in report["fonts"]}
            assert "loaded" in statuses and "error" not in statuses, (
                f"{where}: MathJax's TeX fonts did not load from the book: {report['fonts']}")
        checked += expected
    import nbformat

    sources = sorted(Layout().notebooks.glob("*.ipynb")) + sorted(Layout().student.glob("*.ipynb"))
    in_sources = sum(math_spans(nbformat.read(p, as_version=4)) for p in sources)
    guides = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "CONTRIBUTING.md"]
    in_sources += sum(math_spans(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell(g.read_text(encoding="utf-8"))])) for g in guides)
    assert checked == in_sources > 300, "every lesson's and exercise set's math, once"


def test_the_math_check_sees_tex_errors_and_untypeset_math(browser, tmp_path):
    """The oracle of the test above can fail: TeX errors are reported, and a paragraph that
    MathJax skips (as when it never loads) is missing from its count and left raw."""
    import nbformat

    (tmp_path / "mathjax").symlink_to(book.mathjax_source(), target_is_directory=True)
    nb = nbformat.v4.new_notebook(cells=[
        # MathJax 3 scans for a closing $ at brace depth 0, so the broken span keeps its braces
        nbformat.v4.new_markdown_cell("Fine: $\\sqrt{d_k}$. Broken: $x^2^3$ and "
                                      "$\\nosuchmacro{x}$."),
        nbformat.v4.new_markdown_cell("Skipped: $y$.")])
    book._write(book._exporter(0), nb, tmp_path / "probe.html", "probe", "", "")
    page = tmp_path / "probe.html"
    page.write_text(page.read_text().replace("<p>Skipped:", '<p class="tex2jax_ignore">Skipped:'))
    report = open_page(browser, page)
    assert math_spans(nb) == 4 and report["typeset"] == 3
    assert len(report["errors"]) == 2 and "\\nosuchmacro{x}" in report["errors"]
    assert len(report["raw"]) == 1 and "$y$" in report["raw"][0]


def test_every_figure_of_the_executed_lessons_is_an_embedded_image(reports):
    for (name, path), (page, report) in reports.items():
        if name != "executed" or page.kind != "lesson":
            continue
        assert page.seconds is not None and page.figures >= 1, path
        assert len(report["images"]) == page.figures, (
            f"{path}: {len(report['images'])} images on the page, {page.figures} figure outputs")
        for image in report["images"]:
            assert image["data"] and image["width"] > 0, f"{path}: {image}"
        assert images_without_alt(report) == [], f"{path}: figures without alt text"
        alts = [image["alt"] for image in report["images"]]
        assert len(set(alts)) == len(alts), f"{path}: two figures share one alt text"


def images_without_alt(report) -> list[int]:
    """Indexes of the page's output images whose alt text is missing or under MIN_ALT_WORDS."""
    return [i for i, image in enumerate(report["images"])
            if image["alt"] is None or len(image["alt"].split()) < MIN_ALT_WORDS]


def _figure_notebook(cell: str):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# figures"),
                                         nbformat.v4.new_code_cell(cell)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def test_a_lesson_figure_without_alt_text_stops_the_book(tmp_path):
    import nbformat

    (tmp_path / "notebooks").mkdir()
    nbformat.write(_figure_notebook("import matplotlib.pyplot as plt\nplt.plot([0, 1])\nplt.show()"),
                   tmp_path / "notebooks" / "00_figure.ipynb")
    (tmp_path / "README.md").write_text("| NN | lesson | what it measures |\n|---|---|---|\n"
                                        "| 00 | [a figure](notebooks/00_figure.ipynb) | a line |\n")
    with pytest.raises(book.BookError, match="(?s)1 figure.* without alt text.*cell 1"):
        book.write_book(tmp_path / "out", layout=Layout(root=tmp_path), timeout=120)
    assert not (tmp_path / "out").exists()


def test_alt_text_reaches_the_page_and_the_browser_check_sees_a_missing_one(browser, tmp_path):
    """The book writes show()'s alt text as the img's alt attribute, HTML-escaped; the same page
    with the attribute removed fails the check of the test above (its oracle can fail)."""
    import nbformat

    alt = 'A line rising from 0 to 1, drawn "as a test" <with> & without markup.'
    nb = _figure_notebook("import matplotlib.pyplot as plt\nfrom txlearn.plotting import show\n"
                          f"fig, ax = plt.subplots()\nax.plot([0, 1])\nshow(fig, alt={alt!r})")
    book.execute(nb, tmp_path, timeout=120)
    assert book.figures_without_alt(nb) == [] and figures.figure_count(nb) == 1
    (tmp_path / "mathjax").symlink_to(book.mathjax_source(), target_is_directory=True)
    book._write(book._exporter(0), nb, tmp_path / "probe.html", "probe", "", "")
    report = open_page(browser, tmp_path / "probe.html")
    assert [image["alt"] for image in report["images"]] == [alt]
    assert images_without_alt(report) == []
    page = tmp_path / "probe.html"
    # the alt attribute removed wherever nbconvert puts it (before or after src) and whichever
    # quotes it uses (single ones when the text holds a double quote)
    html_text, removed = re.subn(r"""(<img\b[^>]*?)\s+alt=("[^"]*"|'[^']*')""", r"\1",
                                 page.read_text())
    assert removed == 1
    page.write_text(html_text)
    stripped = open_page(browser, page)
    assert len(stripped["images"]) == 1 and images_without_alt(stripped) == [0]


def test_no_page_requests_anything_off_the_machine(reports):
    for (name, path), (_, report) in reports.items():
        files = [u for u in report["requested"] if u.startswith("file:")]
        assert any("/mathjax/" in u for u in files), f"{name} {path}: MathJax not loaded"
        off = [u for u in report["requested"]
               if not u.startswith(("file:", "data:")) and u != "about:blank"]
        assert off == [], f"{name} book, {path} requested {off[:5]}"


def test_the_request_recorder_sees_a_remote_load(browser, tmp_path):
    """The oracle of the test above can fail: a page that loads from a host is caught."""
    probe = tmp_path / "probe.html"
    probe.write_text('<html><head><script src="mathjax/none.js"></script></head><body>'
                     '<img src="http://example.invalid/figure.png"></body></html>')
    page = browser.new_page()
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(probe.as_uri())
    page.wait_for_load_state("load")
    page.close()
    assert "http://example.invalid/figure.png" in requested


def test_every_link_resolves_inside_the_unzipped_book(executed_book, reports):
    folder, _ = executed_book
    folder = folder.resolve()
    for (name, path), (_, report) in reports.items():
        if name != "executed":
            continue
        for href in report["links"]:
            parts = urlsplit(href)
            if parts.scheme in ("http", "https", "mailto"):
                continue
            assert parts.scheme == "file", f"{path}: {href}"
            target = Path(unquote(parts.path)).resolve()
            assert folder in target.parents and target.is_file(), f"{path}: {href} is broken"


def test_lessons_link_previous_next_contents_and_their_exercises(executed_book, reports):
    folder, _ = executed_book

    def links(path):
        return {Path(unquote(urlsplit(h).path)).resolve().relative_to(folder.resolve()).as_posix()
                for h in reports["executed", Path(path)][1]["links"] if h.startswith("file:")}

    assert {"index.html", "00_map.html", "02_attention.html",
            "exercises/01_softmax.html"} <= links("01_softmax.html")
    assert {"index.html", "01_softmax.html", "exercises/02_attention.html"} \
        <= links("02_attention.html")
    assert {"01_softmax.html", "index.html"} <= links("exercises/01_softmax.html")


def test_contents_page_lists_every_lesson_of_readme_with_what_it_measures(reports):
    entries = book.lesson_table()
    # lesson 11 (tokens) is read after lesson 02: the table's order is the book's
    assert [e.number for e in entries] == ["00", "01", "02", "11"] + [f"{i:02d}" for i in range(3, 11)]
    page, report = reports["executed", Path("index.html")]
    text = report["text"]
    for entry in entries:
        assert entry.title in text
    assert "Var(q.k) grows as d_k" in text               # lesson 01's row of README
    assert "(not in this build)" in text                # lessons 03-10 were not built here
    folder_links = [h for h in report["links"] if h.startswith("file:")]
    for stem in ["00_map", "01_softmax", "02_attention"]:
        assert any(h.endswith(f"/{stem}.html") for h in folder_links), stem


def test_exercise_pages_show_statements_and_no_solution(reports):
    checked = 0
    for (name, path), (page, report) in reports.items():
        if page.kind != "exercises":
            continue
        source = ROOT / "exercises" / "source" / f"{path.stem}.py"
        assert "NotImplementedError" in report["text"], path
        # a bare control-flow header ("if use_cache:") also reads as prose in a statement
        lines = [line for line in solution_texts(source) if not line.endswith(":")]
        leaks = [line for line in lines if line in report["text"]]
        assert leaks == [], f"{name} book, {path} shows solution lines: {leaks[:3]}"
        checked += 1
    assert checked == len(list(Layout().student.glob("*.ipynb")))


def test_a_screenshot_of_lesson_01_is_kept(reports):
    shot = ARTIFACTS / "book-01_softmax.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000              # a page of text and math, not a blank


def test_check_links_refuses_remote_loads_and_missing_files(tmp_path):
    (tmp_path / "ok.html").write_text('<a href="https://arxiv.org/abs/1706.03762">paper</a>'
                                      '<a href="#top">top</a><img src="data:image/png;base64,">'
                                      '<a href="">this page</a>')      # pdoc's self-links
    book.check_links(tmp_path)
    (tmp_path / "bad.html").write_text('<script src="https://cdn.example/mathjax.js"></script>'
                                       '<a href="missing.html">next</a>'
                                       '<img src="/abs/figure.png">')
    with pytest.raises(book.BookError) as err:
        book.check_links(tmp_path)
    message = str(err.value)
    assert "3 reference(s)" in message
    assert "cdn.example" in message and "missing.html" in message and "/abs/figure.png" in message


def test_build_refuses_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(book.BookError, match="not a book written by txlearn"):
        book.write_book(tmp_path, lessons=["00"], execute_lessons=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_lesson_table_rejects_a_row_without_its_notebook_link(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("| NN | lesson | what it measures |\n|---|---|---|\n"
                      "| 00 | [the map](notebooks/00_map.ipynb) | a diagram |\n"
                      "| 01 | softmax | Var(q.k) |\n")
    with pytest.raises(book.BookError, match="must link to notebooks/NN_name.ipynb"):
        book.lesson_table(readme)


def test_readme_table_and_notebooks_must_agree(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("| NN | lesson | what it measures |\n|---|---|---|\n"
                      "| 00 | [the map](notebooks/00_map.ipynb) | a diagram |\n")
    with pytest.raises(book.BookError, match="without a row: .*01_softmax"):
        book.write_book(tmp_path / "out", execute_lessons=False, readme=readme)


def test_math_span_count_ignores_code_and_counts_blocks():
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Cost $O(T^2)$ and `$HOME`; $$\\sqrt{d_k}$$\n\n"
                                      "```\nprice = $5\n```\n\n"
                                      "\\begin{align}\na &= b\n\\end{align}"),
        nbformat.v4.new_code_cell('plt.xlabel("$d_k$")')])
    assert math_spans(nb) == 3


def test_cli_book_writes_a_text_only_book_and_reports_bad_lessons(tmp_path, capsys):
    from txlearn.cli import main

    # lesson 00 links to exercise set 01, which this build leaves out: the link loses its target
    assert main(["book", str(tmp_path / "b"), "--lessons", "00", "07", "--no-execute"]) == 0
    out = capsys.readouterr().out
    assert "wrote 07_layer.html" in out and "wrote exercises/07_layer.html" in out
    assert "01_softmax" not in " ".join(re.findall(r'href="[^"]*"', (
        tmp_path / "b" / "00_map.html").read_text()))
    assert (tmp_path / "b" / "index.html").is_file()
    assert (tmp_path / "b" / "mathjax" / "tex-chtml.js").is_file()
    assert main(["book", str(tmp_path / "c"), "--lessons", "42", "--no-execute"]) == 1
    assert "no lesson 42 in README's lesson table" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_a_lesson_whose_claim_fails_stops_the_book(tmp_path):
    import nbformat

    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# a claim"),
        nbformat.v4.new_code_cell("assert 1 + 1 == 3, 'measured 2'")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "notebooks" / "00_claim.ipynb")
    (tmp_path / "README.md").write_text("| NN | lesson | what it measures |\n|---|---|---|\n"
                                        "| 00 | [a claim](notebooks/00_claim.ipynb) | 1 + 1 |\n")
    with pytest.raises(book.BookError, match="(?s)lesson 00_claim: a cell failed.*measured 2"):
        book.write_book(tmp_path / "out", layout=Layout(root=tmp_path), timeout=60)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def _local_links(report, folder: Path) -> set[str]:
    return {Path(unquote(urlsplit(h).path)).resolve().relative_to(folder.resolve()).as_posix()
            for h in report["links"] if h.startswith("file:")}


def test_a_guide_page_renders_its_tables_and_links_the_book(text_book, reports):
    folder, _ = text_book
    page, report = reports["text", Path("guides/security.html")]
    assert page.kind == "guide"
    text = report["text"]
    assert "Guaranteed, and the test that attacks it" in text and "Not guaranteed, and why" in text
    assert "test_forkserver.py::test_the_filter_refuses_io_uring" in text
    links = _local_links(report, folder)
    assert {"index.html", "reference/txlearn.html", "guides/instructors.html"} <= links, links
    for href in links:                           # and every one of them is a file of the book
        assert (folder / href).is_file(), href
    # a heading's anchor on the code host (#conda-instead-of-the-makefile) is the heading's id in
    # the book
    contributing = reports["text", Path("guides/contributing.html")][1]
    anchored = [h for h in contributing["links"] if "/guides/learners.html#" in h]
    assert anchored, contributing["links"]
    fragment = urlsplit(anchored[0]).fragment
    assert fragment == "Conda-instead-of-the-Makefile"
    assert f'id="{fragment}"' in (folder / "guides" / "learners.html").read_text(encoding="utf-8")
    # a link to a repository file that is not in the book keeps its text and names the file
    performance = reports["text", Path("guides/performance.html")][1]["text"]
    assert "benchmarks/README.md" in performance


def test_the_contents_page_links_every_guide_and_the_reference(text_book, reports):
    folder, pages = text_book
    links = _local_links(reports["text", Path("index.html")][1], folder)
    guides = {p.path.as_posix() for p in pages if p.kind == "guide"}
    assert guides <= links and "reference/txlearn.html" in links, guides - links


def test_a_reference_page_opens_offline_and_links_back_to_the_contents(text_book, browser):
    folder, _ = text_book
    page = browser.new_page()
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    try:
        page.goto((folder / "reference" / "txlearn" / "attention.html").as_uri())
        page.wait_for_load_state("load")
        text = page.evaluate("() => document.body.innerText")
        links = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
        page.fill("input[type=search]", "causal_mask")     # pdoc's search, from search.js
        page.wait_for_selector(".search-result", timeout=30_000)
        found = page.evaluate("() => [...document.querySelectorAll('.search-result')]"
                              ".map(e => e.innerText).join(' ')")
    finally:
        page.close()
    assert "scaled_dot_product_attention" in text and "return_weights" in text
    assert "causal_mask" in found
    contents = (folder / "index.html").resolve().as_uri()
    assert contents in [Path(unquote(urlsplit(h).path)).resolve().as_uri() for h in links
                        if h.startswith("file:")]
    assert any(u.endswith("/reference/search.js") for u in requested)
    off = [u for u in requested if not u.startswith(("file:", "data:")) and u != "about:blank"]
    assert off == [], off
