"""Synthetic graph presets: power-law in-degrees with hubs, homophilous classes and
class-conditional features, deterministic per seed.

Owns the generator and the preset table; must not import kafka or mpi4py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamgnn.datasets.graph_data import GraphData
from streamgnn.errors import InputError


@dataclass(frozen=True)
class Preset:
    vertices: int
    edges: int
    features: int
    classes: int
    homophily: float = 0.7     # fraction of edges whose ends share a class
    signal: float = 0.25       # class-centroid strength relative to unit feature noise
    popularity_tail: float = 1.6  # Pareto shape of in-degree propensity (smaller: heavier hubs)


PRESETS: dict[str, Preset] = {
    "tiny": Preset(vertices=1_000, edges=7_000, features=32, classes=6),
    "small": Preset(vertices=20_000, edges=140_000, features=64, classes=16),
    "arxiv-like": Preset(vertices=169_343, edges=1_166_243, features=128, classes=40),
    "products-like": Preset(vertices=2_449_029, edges=61_859_140, features=100, classes=47),
}


def synthetic(preset: str = "arxiv-like", seed: int = 0) -> GraphData:
    """Generate the named preset (see ``PRESETS``). Same preset and seed, same graph."""
    if preset not in PRESETS:
        raise InputError(f"unknown preset {preset!r}", f"choose one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    rng = np.random.default_rng(seed)
    n, c = p.vertices, p.classes

    y = rng.integers(0, c, n)
    # In-degree propensity: Pareto tail (hubs) on top of a floor so most vertices get in-edges.
    popularity = 1.0 + rng.pareto(p.popularity_tail, n)
    # Out-degree propensity: milder skew.
    activity = rng.lognormal(0.0, 0.8, n)

    src, dst = _sample_edges(rng, y, c, popularity, activity, int(p.edges * 1.04), p.homophily)
    key = src * n + dst
    _, first = np.unique(key, return_index=True)
    first = np.sort(first)
    first = first[src[first] != dst[first]][: p.edges]
    src, dst = src[first], dst[first]

    centroids = rng.standard_normal((c, p.features)).astype(np.float32)
    x = rng.standard_normal((n, p.features), dtype=np.float32)
    x += p.signal * centroids[y]
    weight = rng.uniform(0.5, 1.5, len(src)).astype(np.float32)

    # External ids are not positions: a fixed, sparse, shuffled id space.
    ids = rng.permutation(n).astype(np.int64) * 3 + 1_000
    return GraphData(ids=ids, src=ids[src], dst=ids[dst], x=x, y=y, weight=weight, name=preset)


def _sample_edges(rng: np.random.Generator, y: np.ndarray, c: int, popularity: np.ndarray,
                  activity: np.ndarray, m: int, homophily: float) -> tuple[np.ndarray, np.ndarray]:
    """Sources by activity; destinations by popularity, within the source's class with
    probability ``homophily``, else from the whole graph."""
    src = _weighted_choice(rng, activity, m)
    dst = np.empty(m, np.int64)
    same = rng.random(m) < homophily
    dst[~same] = _weighted_choice(rng, popularity, int((~same).sum()))
    # Same-class draws: per class, sample within the class's members by popularity.
    by_class = np.argsort(y, kind="stable")
    bounds = np.searchsorted(y[by_class], np.arange(c + 1))
    want = src[same]
    cls = y[want]
    out = np.empty(len(want), np.int64)
    order = np.argsort(cls, kind="stable")
    cls_sorted = cls[order]
    cuts = np.searchsorted(cls_sorted, np.arange(c + 1))
    for k in range(c):
        members = by_class[bounds[k]:bounds[k + 1]]
        count = cuts[k + 1] - cuts[k]
        if count:
            out[order[cuts[k]:cuts[k + 1]]] = members[
                _weighted_choice(rng, popularity[members], count)]
    dst[same] = out
    return src, dst


def _weighted_choice(rng: np.random.Generator, weights: np.ndarray, k: int) -> np.ndarray:
    cdf = np.cumsum(weights, dtype=np.float64)
    draws = rng.random(k) * cdf[-1]
    order = np.argsort(draws)  # sorted keys: the search walks the cdf instead of jumping
    out = np.empty(k, np.int64)
    out[order] = np.searchsorted(cdf, draws[order], side="right")
    return out.clip(0, len(weights) - 1)
