"""Layer-wise full inference (DGI): one layer at a time over all vertices, destinations in
chunks of bounded in-edge count, so memory stays at a few embedding matrices plus one
chunk of messages.

Owns the full-graph computation of every layer's embeddings; must not import kafka or
mpi4py.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator, Sequence
from itertools import pairwise

import numpy as np
import torch
from torch import Tensor

from streamgnn.graph import DynamicGraph
from streamgnn.models.layers import Layer
from streamgnn.progress import Progress


def chunk_bounds(in_degree: np.ndarray, max_edges: int) -> np.ndarray:
    """Boundaries ``b`` so that slots ``b[k]:b[k+1]`` hold at most ``max_edges`` in-edges
    (or a single vertex that alone has more)."""
    cum = np.concatenate([[0], np.cumsum(in_degree, dtype=np.int64)])
    bounds = [0]
    n = len(in_degree)
    while bounds[-1] < n:
        a = bounds[-1]
        b = int(np.searchsorted(cum, cum[a] + max_edges, side="right")) - 1
        bounds.append(min(n, max(b, a + 1)))
    return np.asarray(bounds)


def layerwise_inference(layers: Sequence[Layer], graph: DynamicGraph, device: str = "cpu",
                        max_edges: int = 1 << 20, progress: bool = True,
                        dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """Every layer's embedding of every slot: ``[h0 (features), h1, ..., hL]``, each of
    shape [graph.num_slots, dim] (rows of deleted slots are meaningless). ``dtype`` must
    match the model's parameters."""
    return layerwise_states(layers, graph, device, max_edges, progress, dtype,
                            keep_states=False)[0]


@torch.inference_mode()
def layerwise_states(layers: Sequence[Layer], graph: DynamicGraph, device: str = "cpu",
                     max_edges: int = 1 << 20, progress: bool = True,
                     dtype: torch.dtype = torch.float32, keep_states: bool = True
                     ) -> tuple[list[Tensor], list[Tensor | None]]:
    """:func:`layerwise_inference` plus each layer's aggregation state rows (None
    without ``keep_states``; a layer that `Layer.keeps_preactivation` keeps that as its
    state)."""
    outputs = [torch.from_numpy(graph.x[:graph.num_slots]).to(device, dtype)]
    states = []
    for h, state in layer_by_layer(layers, graph, device, max_edges, progress, dtype,
                                   keep_states):
        outputs.append(h)
        states.append(state)
    return outputs, states


def layer_by_layer(layers: Sequence[Layer], graph: DynamicGraph, device: str = "cpu",
                   max_edges: int = 1 << 20, progress: bool = True,
                   dtype: torch.dtype = torch.float32, keep_states: bool = True
                   ) -> Generator[tuple[Tensor, Tensor | None], None, None]:
    """`layerwise_states` one layer at a time: yields each layer's (embeddings, states)
    of every slot; rows the caller overwrites in place before asking for the next layer
    (a partition's ghosts) are what the next layer reads."""
    n = graph.num_slots
    h = torch.from_numpy(graph.x[:n]).to(device, dtype)
    in_weight = torch.from_numpy(graph.in_weight[:n]).to(device, dtype)
    bounds = chunk_bounds(graph.in_degree[:n], max_edges)
    with Progress("layer-wise inference", "chunk", len(layers) * (len(bounds) - 1),
                  enabled=progress) as bar:
        for i, layer in enumerate(layers):
            bar.set(bar.n, layer=i + 1)
            with torch.inference_mode():
                t = layer.transform(h)
                scale = layer.source_scale(in_weight)
                out = torch.empty((n, layer.out_dim), dtype=h.dtype, device=device)
                kept = None
                for a, b in pairwise(bounds.tolist()):
                    ptr, src, w = graph.in_edges(np.arange(a, b))
                    src = torch.from_numpy(src.astype(np.int64)).to(device)
                    state = aggregate(layer, t, src, torch.from_numpy(w).to(device, dtype),
                                      scale, torch.arange(a, b, device=device), ptr)[0]
                    count = torch.from_numpy(np.diff(ptr)).to(device)
                    agg = layer.aggr.finalize(state, count).to(dtype)
                    if keep_states and layer.keeps_preactivation:
                        state = layer.preactivation(h[a:b], agg)
                        out[a:b] = layer.activate(state)
                    else:
                        out[a:b] = layer.update(h[a:b], agg, t[a:b], in_weight[a:b])
                    if keep_states:
                        if kept is None:
                            kept = state.new_zeros(
                                (n, *state.shape[1:]),
                                dtype=layer.aggr.state_dtype or state.dtype)
                        kept[a:b] = state
                    bar.update()
            yield out, kept
            h = out


def aggregate(layer: Layer, t: Tensor, src: Tensor, w: Tensor, scale: Tensor | None,
              dst: Tensor, ptr: np.ndarray | None = None, local: Tensor | None = None
              ) -> tuple[Tensor, Tensor | None]:
    """Packed aggregation states of destinations ``dst``, in-edge k from ``src[k]`` to
    ``dst[local[k]]`` (weights ``w``), with max/min's ties where they are counted (else
    None); ``src`` and ``dst`` index rows of ``t`` and ``scale`` (slots, or positions in a
    subset of them). With the in-edges' bounds on the host (``ptr``: destination i's are
    ``ptr[i]:ptr[i+1]``; ``local`` built from them where None): a layer's fused kernel
    where it has one (attention on CPU); sums, and on CPU max and min, as one sparse CSR x
    dense product (torch reduces max/min that way on CPU only); the rest edge by edge
    (`aggregate_edgewise`). Without (a planned batch, which reads nothing back between
    its upload and its download): on ``t``'s device from ``local`` (`_reduced`)."""
    if ptr is None:
        return _reduced(layer, t, src, w, scale, local, dst)
    w = w.to(t.dtype)
    fused = layer.reduce_csr(t, ptr, src, dst)
    if fused is not None:
        return fused, None
    reduce = layer.aggr.spmm
    if reduce == "sum" or (reduce is not None and _reduces_on_cpu(t)):
        return layer.aggr.pack(aggregate_spmm(layer, t, ptr, src, w, scale)), None
    return layer.aggr.pack(aggregate_edgewise(layer, t, ptr, src, w, scale, dst, local)), None


def _reduces_on_cpu(t: Tensor) -> bool:
    """Whether torch's sparse product can reduce ``t`` with max/min (CPU only)."""
    return t.device.type == "cpu"


def aggregate_edgewise(layer: Layer, t: Tensor, ptr: np.ndarray, src: Tensor, w: Tensor,
                       scale: Tensor | None, dst: Tensor, local: Tensor | None = None):
    """`aggregate` by gathering every in-edge's message and reducing per destination
    (``local``: each in-edge's position in ``dst``, built from ``ptr`` where None)."""
    if local is None:
        counts = torch.from_numpy(np.diff(ptr)).to(t.device)
        local = torch.repeat_interleave(torch.arange(len(ptr) - 1, device=t.device), counts)
    logits = (layer.edge_logits(t, src, layer.destination_part(t)[dst[local]])
              if layer.aggr.destination_dependent else None)
    return layer.aggr.reduce(layer.messages(t, src, w, scale), local, len(ptr) - 1, logits)


def _reduced(layer: Layer, t: Tensor, src: Tensor, w: Tensor, scale: Tensor | None,
             local: Tensor, dst: Tensor) -> tuple[Tensor, Tensor | None]:
    """`aggregate` on ``t``'s device from each in-edge's position ``local`` in ``dst``:
    `Layer.partial`, or for max/min `Aggregation.reduce_with_ties`, with the ties (None
    for the others)."""
    num = dst.shape[0]
    if layer.aggr.ties_dtype:
        msg = layer.messages(t, src, w.to(t.dtype), scale)
        return layer.aggr.reduce_with_ties(msg, local, num)
    factor = layer.message_factor(src, w.double(), scale)
    part = (layer.destination_part(t).index_select(0, dst)
            if layer.aggr.destination_dependent else None)
    return layer.partial(t, src, local, torch.ones_like(w, dtype=torch.float64)
                         if factor is None else factor, num, part), None


def aggregate_spmm(layer: Layer, t: Tensor, ptr: np.ndarray, src: Tensor, w: Tensor,
                   scale: Tensor | None) -> Tensor:
    """`aggregate` as a sparse CSR x dense product reducing with ``layer.aggr.spmm``."""
    factor = layer.message_factor(src, w, scale)
    if factor is None:
        factor = torch.ones(len(src), dtype=t.dtype, device=t.device)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        adj = torch.sparse_csr_tensor(torch.from_numpy(ptr).to(t.device), src, factor,
                                      size=(len(ptr) - 1, len(t)), check_invariants=False)
    reduce = layer.aggr.spmm
    return adj @ t if reduce == "sum" else torch.sparse.mm(adj, t, reduce=reduce)
