"""txlearn.plotting.heatmap: every heatmap of the course carries a labelled colour bar."""

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from txlearn.plotting import heatmap

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
