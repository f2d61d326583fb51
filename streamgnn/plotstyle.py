"""Styles of the series in one plot: colour, line style and marker each cycle, with
coprime cycle lengths (10, 4, 7), so that no two of a plot's first 140 series look alike
and they stay apart in greyscale too.
"""

from __future__ import annotations

from typing import Any

LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "x", "P")


def series_style(i: int) -> dict[str, Any]:
    """Keyword arguments of ``Axes.plot`` for a plot's ``i``-th series (from 0)."""
    return {"color": f"C{i % 10}", "linestyle": LINESTYLES[i % len(LINESTYLES)],
            "marker": MARKERS[i % len(MARKERS)], "markevery": 0.1, "markersize": 4}
