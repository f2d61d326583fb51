"""Synthetic presets, snapshot validation, and the file loaders."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamgnn as sg


def test_presets_are_deterministic_and_shaped():
    a = sg.datasets.synthetic("small", seed=5)
    b = sg.datasets.synthetic("small", seed=5)
    c = sg.datasets.synthetic("small", seed=6)
    for field in ("ids", "src", "dst", "x", "y", "weight"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.src, c.src)
    assert a.num_vertices == 20_000 and abs(a.num_edges - 140_000) < 2_000
    assert (a.num_features, a.num_classes) == (64, 16)
    assert a.ids.dtype == np.int64 and a.x.dtype == np.float32 and a.y.dtype == np.int64


def test_preset_structure_has_hubs_and_homophily():
    data = sg.datasets.synthetic("small", seed=0)
    s, d = data.positions(data.src), data.positions(data.dst)
    indeg = np.bincount(d, minlength=data.num_vertices)
    assert indeg.max() > 50 * indeg.mean()            # hubs
    assert np.percentile(indeg, 50) < indeg.mean()    # skew: median below mean
    same = (data.y[s] == data.y[d]).mean()
    assert same > 0.6                                 # homophily, vs 1/16 at random
    centroids = np.stack([data.x[data.y == k].mean(0) for k in range(data.num_classes)])
    assert np.linalg.norm(centroids, axis=1).min() > 1.0  # class-conditional features


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ValueError, match="arxiv-like"):
        sg.datasets.synthetic("nope")


def test_graph_data_rejects_bad_snapshots():
    ids = np.array([10, 20, 30])
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(sg.SelfLoopError, match="vertex 20"):
        sg.GraphData(ids=ids, src=[20], dst=[20], x=x)
    with pytest.raises(sg.DuplicateEdgeError, match=r"\(10, 20\)"):
        sg.GraphData(ids=ids, src=[10, 10], dst=[20, 20], x=x)
    with pytest.raises(sg.UnknownVertexError, match="40"):
        sg.GraphData(ids=ids, src=[10], dst=[40], x=x)
    with pytest.raises(sg.DuplicateVertexError, match="10"):
        sg.GraphData(ids=[10, 10, 30], src=[], dst=[], x=x)
    with pytest.raises(sg.NonFiniteValueError, match="vertex 30"):
        sg.GraphData(ids=ids, src=[], dst=[], x=np.array([[0, 0], [0, 0], [np.nan, 0]]))
    with pytest.raises(sg.FeatureDimensionError):
        sg.GraphData(ids=ids, src=[], dst=[], x=np.zeros((2, 2)))
    with pytest.warns(UserWarning, match="1 self-loops and 1 parallel"):
        g = sg.GraphData.cleaned(ids=ids, src=[10, 10, 20, 20], dst=[20, 20, 20, 30], x=x)
    assert list(zip(g.src, g.dst)) == [(10, 20), (20, 30)]


def test_save_load_roundtrip(tmp_path):
    data = sg.datasets.synthetic("tiny", seed=2)
    back = sg.datasets.load(sg.datasets.save(data, tmp_path / "g.npz"))
    for field in ("ids", "src", "dst", "x", "y", "weight"):
        np.testing.assert_array_equal(getattr(data, field), getattr(back, field))
    assert back.name == "tiny"


def test_edge_list_loader(tmp_path):
    (tmp_path / "e.csv").write_text("src,dst,weight\n0,1,0.5\n1,2,2.0\n2,2,1.0\n0,1,9.0\n")
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(3, 2))
    np.save(tmp_path / "y.npy", np.array([0, 1, 0]))
    with pytest.warns(UserWarning, match="1 self-loops and 1 parallel"):
        g = sg.datasets.load_edge_list(tmp_path / "e.csv", tmp_path / "x.npy", tmp_path / "y.npy")
    assert list(zip(g.src, g.dst, g.weight)) == [(0, 1, 0.5), (1, 2, 2.0)]
    assert g.num_classes == 2


def test_ogb_directory_loader(tmp_path):
    raw = tmp_path / "ogbn_toy" / "raw"
    raw.mkdir(parents=True)
    for name, text in [("edge.csv.gz", "0,1\n1,2\n2,0\n"),
                       ("node-feat.csv.gz", "0.1,0.2\n0.3,0.4\n0.5,0.6\n"),
                       ("node-label.csv.gz", "1\n0\n1\n")]:
        with gzip.open(raw / name, "wt") as f:
            f.write(text)
    g = sg.datasets.open_dataset(str(tmp_path / "ogbn_toy"))
    assert (g.num_vertices, g.num_edges, g.num_features, g.num_classes) == (3, 3, 2, 2)
    np.testing.assert_allclose(g.x[1], [0.3, 0.4])


def test_open_dataset_explains_what_it_accepts(tmp_path):
    with pytest.raises(ValueError, match=r"missing\.npz does not exist"):
        sg.datasets.open_dataset(str(tmp_path / "missing.npz"))



@settings(max_examples=200, deadline=None)
@given(st.integers(-2**62, 2**62), st.lists(st.integers(0, 60), min_size=1, max_size=30,
                                            unique=True),
       st.sampled_from([1, 2**20]), st.lists(st.integers(-2**63, 2**63 - 1), max_size=5),
       st.randoms())
def test_positions_by_table_and_by_search_agree_with_a_dict(start, offsets, step, strangers,
                                                            rnd):
    """Both ways `positions` looks ids up (a table over dense ids, binary search over
    sparse ones) give each id's row, and name an unknown id, in a gap, next to the range
    or far from it."""
    ids = start + np.array(offsets, np.int64) * step
    rnd.shuffle(ids)
    data = sg.GraphData(ids=ids, src=ids[:0], dst=ids[:0],
                        x=np.zeros((len(ids), 1), np.float32))
    row = {int(v): k for k, v in enumerate(ids)}
    asked = [rnd.choice(ids.tolist()) for _ in range(20)]
    np.testing.assert_array_equal(data.positions(np.array(asked, np.int64)),
                                  [row[v] for v in asked])
    assert data.positions([]).tolist() == []
    near = [start + k * step for k in range(-1, 62)]
    for v in [v for v in strangers + near if v not in row][:8]:
        with pytest.raises(sg.UnknownVertexError, match=str(v)):
            data.positions(np.array([*asked, v], np.int64))
