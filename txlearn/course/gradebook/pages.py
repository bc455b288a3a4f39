"""The HTML of the gradebook's pages: one self-contained offline file each, everything escaped.

Every page the gradebook writes (feedback, class report, similarity) is built here, rendered
from the Jinja2 templates beside this module (``templates/page.html``: the skeleton;
``templates/table.html``: every table) with autoescaping on: a fixed skeleton with its style
inline, no script, no external resource (figures are inline SVG), and
a Content-Security-Policy that forbids scripts and every load but inline styles and ``data:``
images, so a page works from a folder, a zip or an e-mail attachment. Text reaches a page only
through :func:`esc` (``html.escape`` with quotes) or :func:`pre`: whatever a submission wrote
(a folder name, an exception message, an answer cell holding ``<script>``) is shown as text,
never run; the policy is a second wall, not the first. In the templates every ``{{ value }}``
goes through :func:`esc` (the environment's ``finalize``), so a template cannot forget it; HTML
this module made is passed as :class:`Raw` (a ``markupsafe.Markup``) and kept as it is.
"""

from __future__ import annotations

import html
import io
import re
from pathlib import Path

from txlearn.checks.feedback import show_marks
from txlearn.course.gradebook.store import readable

__all__ = ["esc", "pre", "page", "table", "Raw", "figure", "svg_figure", "badge", "slug",
           "folders", "render", "CSP", "TEMPLATES"]

TEMPLATES = Path(__file__).resolve().parent / "templates"

CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'")

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 70em; padding: 0 1em; color: #1b1b1b; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { margin-top: 1.6em; }
.sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: .6em 0; } th, td { padding: .3em .6em;
        border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; white-space: pre-wrap;
      margin: .2em 0; font-size: 13px; }
.badge { display: inline-block; padding: 0 .5em; border-radius: .8em; font-size: .85em;
         font-weight: 600; }
.PASS { background: #d9f2dc; color: #14532d; } .FAIL { background: #fde2e1; color: #7f1d1d; }
.ERROR { background: #fef3c7; color: #78350f; } .RETIRED { background: #e5e7eb; color: #374151; }
.hidden { background: #ede9fe; color: #4c1d95; }
.note { border-left: 4px solid #999; padding: .3em .8em; background: #fafafa; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
footer { margin-top: 3em; color: #777; font-size: .85em; }
"""


def esc(value) -> str:
    """Any value as HTML text (``<``, ``>``, ``&`` and both quotes escaped; a lone surrogate of
    a name that is not UTF-8 as its escape, :func:`~txlearn.course.gradebook.store.readable`;
    line separators and bidi controls written out, :func:`txlearn.checks.feedback.show_marks`)."""
    return html.escape(show_marks(readable(value)), quote=True)


def pre(text) -> str:
    """Text as a preformatted block, escaped."""
    return f"<pre>{esc(text)}</pre>"


def badge(text: str, kind: str = "") -> str:
    """`text` (escaped) in a status badge whose CSS class is `kind` (default: the text itself),
    kept only when it is plain letters (PASS, FAIL, ERROR ...)."""
    kind = kind or text
    safe = kind if re.fullmatch(r"[A-Za-z]+", kind) else ""
    return f'<span class="badge {safe}">{esc(text)}</span>'


def _escaped(value):
    """What a template shows of ``value``: :func:`esc` of it, or HTML this module made as it is."""
    from markupsafe import Markup

    if isinstance(value, Raw):
        return Markup(value.html)
    return value if isinstance(value, Markup) else Markup(esc(value))


_environment = None


def render(name: str, **values) -> str:
    """Template ``name`` of :data:`TEMPLATES` rendered with ``values`` (autoescaped, each value
    through :func:`esc`; an undefined name raises jinja2's UndefinedError)."""
    global _environment
    if _environment is None:
        from jinja2 import Environment, FileSystemLoader, StrictUndefined

        _environment = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True,
                                   finalize=_escaped, undefined=StrictUndefined,
                                   keep_trailing_newline=True)
    return _environment.get_template(name).render(**values)


def table(header: list[str] | None, rows: list[list], numeric: set[int] = frozenset()) -> str:
    """A table (``header`` None: none); every cell escaped unless it is a :class:`Raw` (HTML
    this module made)."""
    return render("table.html", header=header, rows=rows, numeric=set(numeric)).rstrip("\n")


class Raw:
    """HTML made by this module's functions (already escaped), to put in a table cell."""

    def __init__(self, html_text: str):
        self.html = html_text


def page(title: str, body: str, *, subtitle: str = "", footer: str = "") -> str:
    """A whole page (``templates/page.html``): ``title``, ``subtitle`` and ``footer`` escaped,
    ``body`` HTML built with :func:`esc` and this module's helpers."""
    return render("page.html", title=title, subtitle=subtitle, footer=footer, body=Raw(body),
                  csp=Raw(CSP), style=Raw(STYLE))


def figure(width: float, height: float):
    """A matplotlib Figure and its axes, made without pyplot (no backend is chosen or changed,
    nothing is kept open)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots()


def svg_figure(fig, caption: str = "") -> str:
    """A matplotlib figure as inline SVG (text kept as text, no external reference). The labels
    must be course text (exercise names, mistake identifiers), never a submission's: matplotlib
    escapes them as XML, but they are not checked here."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "txlearn"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight")
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]                      # drop the XML declaration and DOCTYPE
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f"<figure>{svg}{cap}</figure>"


_WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", *(f"{d}{i}" for d in ("COM", "LPT") for i in "123456789")}


def slug(text: str, limit: int = 60) -> str:
    """A file-name-safe form of learner-made text (a student folder): letters, digits, ``-``,
    ``_`` and ``.`` kept, anything else ``_``; a name Windows reserves for a device (``CON``,
    ``aux``, ``nul.txt``, ``COM1``) or ending in a dot gets a leading ``_``; a short digest is
    added when anything changed (two folders that differ only in odd characters keep apart)."""
    import hashlib

    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:limit].lstrip(".") or "_"
    if safe.split(".")[0].upper() in _WINDOWS_DEVICES or safe.endswith("."):
        safe = "_" + safe      # CON, aux, nul.txt; Windows drops a trailing dot
    if safe != text:
        safe += "-" + hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:6]
    return safe


def folders(names, reserved=("index.html",)) -> dict[str, str]:
    """``{name: folder}``: a file-name-safe folder (:func:`slug`) for each learner-made name,
    distinct for distinct names even on a case-insensitive file system, and never one of
    ``reserved`` (the listing beside them). A name that :func:`slug` maps onto another's folder
    (a student who named their folder after a classmate's slug, ``Alice_Smith-1a2b3c`` beside
    ``Alice Smith``; ``ALICE`` beside ``alice`` on macOS) gets 16 more hex digits of its
    SHA-256, as does every name whose folder that would then meet, until all differ."""
    import hashlib

    names = sorted(set(names))
    taken = {n: slug(n) for n in names}
    long = set()
    while True:
        seen: dict[str, list[str]] = {}
        for n in names:
            seen.setdefault(taken[n].casefold(), []).append(n)
        clash = {n for group in seen.values() if len(group) > 1 for n in group if n not in long}
        clash |= {n for n in names if taken[n].casefold() in reserved and n not in long}
        if not clash:
            if any(len(group) > 1 for group in seen.values()):   # 64 bits of SHA-256 met
                raise ValueError("two names share a folder even with their digests")
            return taken
        for n in clash:
            digest = hashlib.sha256(n.encode("utf-8", "backslashreplace")).hexdigest()[:16]
            taken[n] = f"{slug(n)}-{digest}"
            long.add(n)
