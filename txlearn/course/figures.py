"""The figures of an executed lesson notebook for the book: how many there are, and their alt text
(every figure carries one, written by :func:`txlearn.plotting.show`; the book refuses a lesson
whose figure has none or one under ``MIN_ALT_WORDS`` words)."""

from __future__ import annotations

from txlearn.plotting import MIN_ALT_WORDS

__all__ = ["figure_count", "alt_text", "figures_without_alt"]


def figure_count(nb) -> int:
    """The number of image outputs in the executed notebook `nb`."""
    return sum(1 for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", [])
               if any(k.startswith("image/") for k in out.get("data", {})))


def alt_text(output) -> str | None:
    """The alt text of an image output: its metadata's ``[mime]["alt"]`` or ``["alt"]``."""
    metadata = output.get("metadata", {})
    for mime in output.get("data", {}):
        if mime.startswith("image/"):
            alt = metadata.get(mime, {}).get("alt") if isinstance(metadata.get(mime), dict) else None
            return alt if alt is not None else metadata.get("alt")
    return None


def figures_without_alt(nb) -> list[str]:
    """Image outputs of `nb` whose alt text is missing or under MIN_ALT_WORDS words, each as
    "cell N (first line of its source)"."""
    missing = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if not any(k.startswith("image/") for k in out.get("data", {})):
                continue
            alt = alt_text(out)
            if not isinstance(alt, str) or len(alt.split()) < MIN_ALT_WORDS:
                first = cell.source.strip().splitlines()[0][:60] if cell.source.strip() else ""
                missing.append(f"cell {index} ({first!r}): alt {alt!r}")
    return missing
