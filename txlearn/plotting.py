"""Shared figure helpers for the lessons.

``show`` displays a figure together with its alt text (what the figure shows, in words, for a
reader who cannot see it); the lessons show every figure with it, never with a bare
``plt.show()``. ``heatmap`` draws a matrix (attention weights, masks, encodings) with a
labelled colour bar, so every heatmap of the course says what its colours mean; the lessons draw every heatmap with it.
``layer_diagram`` draws the transformer layer that the course builds (lesson 00's map): the
sub-layers bottom-up, the residual connections around them, and the lesson that derives each
piece. Plots are never compared byte for byte; tests check what a figure contains (its labels).

Source: Vaswani et al. (2017), figure 1 (the encoder side); ``notebooks/00_map.ipynb``.
"""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

__all__ = ["MIN_ALT_WORDS", "heatmap", "layer_boxes", "layer_diagram", "show"]

MIN_ALT_WORDS = 8  # an alt text is a sentence about the figure, not a title ("loss curve")


def show(fig=None, *, alt: str) -> None:
    """Show `fig` (the current figure when None) with its alt text `alt`.

    In a notebook whose matplotlib backend is the inline one (JupyterLab, and the kernel that
    ``txlearn book`` runs), the figure is displayed as a PNG whose output metadata carries
    ``{"image/png": {"alt": alt}}``; the book writes it as the image's ``alt`` attribute, and
    refuses an executed figure without one (``txlearn.course.book``). The figure is then closed,
    so the backend does not display it a second time without its text. With any other backend
    (``MPLBACKEND=Agg`` under the tests, a window in a script) this is ``plt.show()``; under
    Agg the figure is closed too.

    Args:
        fig: a matplotlib Figure, or None for ``plt.gcf()``.
        alt: what the figure shows, as a reader would need it without the picture: the axes,
            what is drawn, and what it shows ("Validation loss against position for four
            encodings: ..."), at least MIN_ALT_WORDS words.

    Raises:
        ValueError: `alt` is not a string of at least MIN_ALT_WORDS words (the text is quoted).
    """
    if not isinstance(alt, str) or len(alt.split()) < MIN_ALT_WORDS:
        raise ValueError(f"show: alt must say what the figure shows in at least {MIN_ALT_WORDS} "
                         f"words, got {alt!r}")
    fig = plt.gcf() if fig is None else fig
    backend = matplotlib.get_backend().lower()
    if "inline" in backend:
        from IPython.display import display

        display(fig, metadata={"image/png": {"alt": " ".join(alt.split())}})
        plt.close(fig)
        return
    plt.show()
    if backend == "agg":
        plt.close(fig)


def heatmap(ax, values, label: str, **imshow_kwargs):
    """Draw a matrix as an image on `ax`, with a colour bar labelled `label` beside it.

    Row i of `values` is drawn at height i from the top (for attention weights: query i, key j
    in column j), as ``ax.imshow`` draws it.

    Args:
        ax: the matplotlib Axes to draw into; the colour bar takes a slice of its width.
        values: 2-D array-like (rows, columns): a NumPy array or a CPU tensor without grad;
            booleans are drawn as 0 and 1.
        label: what the colours encode, with units where there are any ("attention weight").
        **imshow_kwargs: passed to ``ax.imshow`` (``cmap``, ``vmin``, ``vmax``, ``aspect``).

    Returns:
        (image, colorbar): the ``AxesImage`` and its ``Colorbar`` (set its ticks as needed).

    Raises:
        ValueError: `values` is not 2-D (the message gives its shape).
    """
    values = np.asarray(values)
    if values.ndim != 2:
        raise ValueError(f"heatmap: values must be 2-D (rows, columns), got shape {values.shape}")
    image = ax.imshow(values.astype(float) if values.dtype == bool else values, **imshow_kwargs)
    colorbar = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    colorbar.set_label(label)
    return image, colorbar


_GREY, _POS, _ATTN, _NORM, _FFN = "#dddddd", "#f4d7a1", "#a9cbe8", "#e8e3a9", "#b5e0b0"
_EMBED = ("token embedding  (B, T) -> (B, T, d_model)", "07", _GREY)
_POSENC = ("+ positional encoding  (T, d_model)", "04", _POS)
_ATTENTION = ("multi-head attention  softmax(Q K^T / sqrt(d_k)) V", "01-03", _ATTN)
_NORMBOX = ("LayerNorm  (or RMSNorm)", "06", _NORM)
_FEEDFORWARD = ("feed-forward  d_model -> d_ff -> d_model", "05", _FFN)
_FINAL_NORM = ("final LayerNorm  (pre-LN stacks need it)", "06", _NORM)
_HEAD = ("output head  (B, T, d_model) -> (B, T, vocab)", "07", _GREY)


def layer_boxes(norm_first: bool = False) -> list[tuple[str, str, str]]:
    """The diagram's boxes, bottom-up, as (label, lesson, colour).

    Post-LN (the paper, ``norm_first=False``): ``x = norm(x + sublayer(x))``, so each norm
    follows its sub-layer. Pre-LN (``norm_first=True``): ``x = x + sublayer(norm(x))``, so each
    norm precedes it, and the stack needs one more norm before the output head (its residual
    stream is never normalised otherwise). Either way the residual addition sits right after each
    sub-layer.
    """
    if norm_first:
        return [_EMBED, _POSENC, _NORMBOX, _ATTENTION, _NORMBOX, _FEEDFORWARD, _FINAL_NORM, _HEAD]
    return [_EMBED, _POSENC, _ATTENTION, _NORMBOX, _FEEDFORWARD, _NORMBOX, _HEAD]


def _box(ax, y: float, label: str, lesson: str, colour: str) -> None:
    ax.add_patch(FancyBboxPatch((2.0, y), 6.0, 0.5, boxstyle="round,pad=0.05",
                                facecolor=colour, edgecolor="black", linewidth=1))
    ax.text(5.0, y + 0.25, label, ha="center", va="center", fontsize=8.5)
    ax.text(8.3, y + 0.25, f"lesson {lesson}", ha="left", va="center", fontsize=8,
            color="dimgray")


def _arrow(ax, points: list[tuple[float, float]], colour: str = "black") -> None:
    """A polyline through `points` with an arrow head at the last one."""
    xs, ys = zip(*points)
    ax.plot(xs[:-1], ys[:-1], color=colour, linewidth=1)
    ax.add_patch(FancyArrowPatch(points[-2], points[-1], arrowstyle="-|>", mutation_scale=10,
                                 color=colour, linewidth=1, shrinkA=0, shrinkB=0))


def layer_diagram(norm_first: bool = False, ax=None):
    """Draw one transformer layer bottom-up, with residual paths and lesson numbers.

    The two sub-layers (attention, FFN), their norms and their residual additions (the circled
    "+") sit inside a dashed frame marked "x n_layers"; the embedding and positional encoding
    feed it from below and the output head reads it from above.

    Args:
        norm_first: draw the pre-LN order (norm before each sub-layer) instead of post-LN.
        ax: a matplotlib Axes to draw into; a new 8 x 6 inch figure when None.

    Returns:
        the matplotlib Figure holding the diagram.

    Source: Vaswani et al. (2017), figure 1; lessons 00 and 07.
    """
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 6))
    else:
        fig = ax.figure
    boxes = layer_boxes(norm_first)
    for i, (label, lesson, colour) in enumerate(boxes):
        _box(ax, i, label, lesson, colour)
        if i > 0:
            _arrow(ax, [(5.0, i - 0.45), (5.0, i - 0.05)])
    sublayers = (3, 5) if norm_first else (2, 4)  # box index of attention and of the FFN
    for j, sub in enumerate(sublayers):
        start_y = 2 + 2 * j - 0.25                # the sub-block's input, below its first box
        plus_y = sub + 0.75                       # between the sub-layer and the next box
        ax.add_patch(Circle((5.0, plus_y), 0.13, facecolor="white", edgecolor="firebrick"))
        ax.text(5.0, plus_y, "+", ha="center", va="center", color="firebrick", fontsize=10)
        _arrow(ax, [(5.0, start_y), (1.3, start_y), (1.3, plus_y), (4.87, plus_y)], "firebrick")
    ax.add_patch(FancyBboxPatch((0.9, 1.65), 8.9, 4.2, boxstyle="round,pad=0.05",
                                fill=False, linestyle="--", edgecolor="gray"))
    ax.text(9.7, 1.8, "x n_layers", ha="right", va="center", fontsize=9, color="gray")
    order = "pre-LN: x + sublayer(norm(x))" if norm_first else "post-LN: norm(x + sublayer(x))"
    ax.set_title(f"One transformer layer, bottom-up ({order}); red: residual paths", fontsize=10)
    ax.set_xlim(0.5, 10.2)
    ax.set_ylim(-0.3, len(boxes))
    ax.axis("off")
    return fig
