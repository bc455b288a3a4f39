"""txlearn.plotting: every heatmap of the course carries a labelled colour bar, and every figure
a lesson shows carries its alt text (``show(fig, alt=...)``; the book refuses a figure without)."""

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from txlearn.plotting import MIN_ALT_WORDS, heatmap, show

ROOT = Path(__file__).resolve().parent.parent


def test_heatmap_draws_the_values_with_a_labelled_colour_bar():
    values = np.arange(12.0).reshape(3, 4)
    fig, ax = plt.subplots()
    image, bar = heatmap(ax, values, "attention weight", cmap="Blues", vmin=0, vmax=11)
    np.testing.assert_array_equal(image.get_array(), values)
    assert image.get_clim() == (0, 11)
    assert bar.ax in fig.axes and len(fig.axes) == 2          # the bar has its own axes
    assert bar.ax.get_ylabel() == "attention weight"
    plt.close(fig)


def test_heatmap_takes_tensors_and_draws_booleans_as_0_and_1():
    fig, ax = plt.subplots()
    image, _ = heatmap(ax, torch.tensor([[True, False], [True, True]]), "may attend")
    np.testing.assert_array_equal(image.get_array(), [[1.0, 0.0], [1.0, 1.0]])
    plt.close(fig)


def test_heatmap_rejects_a_matrix_that_is_not_2d():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match=r"2-D .*got shape \(2, 3, 4\)"):
        heatmap(ax, np.zeros((2, 3, 4)), "weight")
    plt.close(fig)


def test_no_lesson_draws_a_heatmap_without_the_helper():
    """A raw imshow/matshow/pcolormesh would draw a heatmap without a colour bar."""
    sources = sorted((ROOT / "lessons").glob("*.py")) + sorted(
        (ROOT / "exercises" / "source").glob("*.py")) + sorted((ROOT / "txlearn").rglob("*.py"))
    raw = [f"{p.relative_to(ROOT)}:{n}" for p in sources if p.name != "plotting.py"
           for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if re.search(r"\.(imshow|matshow|pcolormesh|pcolor)\(", line)]
    assert raw == [], f"draw heatmaps with txlearn.plotting.heatmap (adds a colour bar): {raw}"
    lessons_using_it = [p.stem for p in sources if "heatmap(" in p.read_text(encoding="utf-8")
                        and p.parent.name == "lessons"]
    assert {"02_attention", "03_heads", "04_positional", "09_capstone"} <= set(lessons_using_it)


def test_show_refuses_a_missing_or_too_short_alt_text():
    fig, ax = plt.subplots()
    for alt in ("", "loss curve", None, 42):
        with pytest.raises(ValueError, match="alt must say what the figure shows"):
            show(fig, alt=alt)
    with pytest.raises(TypeError):
        show(fig)                                   # alt is required, by keyword
    plt.close(fig)


def test_show_under_agg_closes_the_figure():
    import matplotlib

    assert matplotlib.get_backend().lower() == "agg"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    show(fig, alt="A straight line falling from 1 at x = 0 to 0 at x = 1.")
    assert fig.number not in plt.get_fignums()


def test_show_with_the_inline_backend_displays_the_png_with_its_alt_text(monkeypatch):
    """What JupyterLab and the book's kernel run: the PNG goes out with the alt text in the
    output's metadata (the book's template writes it as the img's alt), and the figure is closed
    so the backend's end-of-cell flush cannot display it again without it."""
    import IPython.display
    import matplotlib

    shown = []
    monkeypatch.setattr(matplotlib, "get_backend",
                        lambda: "module://matplotlib_inline.backend_inline")
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, metadata=None: shown.append((obj, metadata)))
    fig, ax = plt.subplots()
    alt = "A straight line   falling from 1 at x = 0\n to 0 at x = 1."
    show(fig, alt=alt)
    assert shown == [(fig, {"image/png": {"alt": "A straight line falling from 1 at x = 0 to 0 at "
                                                 "x = 1."}})]
    assert fig.number not in plt.get_fignums()


# show(fig, alt=...), show(plt.gcf(), alt=...), show(alt=...)
SHOW_WITH_ALT = r"(?<![.\w])show\((?:[^()]|\([^()]*\))*?alt="


def _code_cells(path):
    import jupytext

    return [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]


def test_every_lesson_figure_is_shown_with_its_alt_text():
    """A bare plt.show() (or fig.show()) would put a figure in the book without alt text; a cell
    that makes a figure must show it with txlearn.plotting.show(..., alt=...). Executed figures
    are checked again by the book itself (figures_without_alt) and by tests/test_book.py."""
    lessons = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))
    bare, unshown, shown = [], [], 0
    for path in lessons:
        for source in _code_cells(path):
            if re.search(r"\b(plt|fig)\.show\(", source):
                bare.append(f"{path.name}: {source.splitlines()[0][:60]}")
            makes = len(re.findall(r"plt\.(subplots|figure)\(", source))
            shows = len(re.findall(SHOW_WITH_ALT, source, flags=re.S))
            shown += shows
            if makes > shows:
                unshown.append(f"{path.name}: {source.splitlines()[0][:60]}")
    assert bare == [], f"show figures with txlearn.plotting.show(fig, alt=...): {bare}"
    assert unshown == [], f"cells that make more figures than they show with alt text: {unshown}"
    assert shown >= 40                          # every lesson's figures, 00 to 10


def test_the_figure_check_sees_a_bare_show(tmp_path):
    """The check above can fail: a lesson cell with plt.show() is caught."""
    lesson = tmp_path / "99_probe.py"
    lesson.write_text("# %%\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
                      "plt.show()\n", encoding="utf-8")
    (source,) = _code_cells(lesson)
    assert re.search(r"\b(plt|fig)\.show\(", source)
    assert len(re.findall(SHOW_WITH_ALT, source, flags=re.S)) == 0
