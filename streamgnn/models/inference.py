"""Layer-wise full inference (DGI): one layer at a time over all vertices, destinations in
chunks of bounded in-edge count, so memory stays at a few embedding matrices plus one
chunk of messages.

Owns the full-graph computation of every layer's embeddings; must not import kafka or
mpi4py.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from streamgnn.graph import DynamicGraph
from streamgnn.models.layers import Layer


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


@torch.inference_mode()
def layerwise_inference(layers: Sequence[Layer], graph: DynamicGraph, device: str = "cpu",
                        max_edges: int = 1 << 20, progress: bool = True,
                        dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """Every layer's embedding of every slot: ``[h0 (features), h1, ..., hL]``, each of
    shape [graph.num_slots, dim] (rows of deleted slots are meaningless). ``dtype`` must
    match the model's parameters."""
    n = graph.num_slots
    h = torch.from_numpy(graph.x[:n]).to(device, dtype)
    in_weight = torch.from_numpy(graph.in_weight[:n]).to(device, dtype)
    bounds = chunk_bounds(graph.in_degree[:n], max_edges)
    outputs = [h]
    with tqdm(total=len(layers) * (len(bounds) - 1), desc="layer-wise inference",
              unit="chunk", disable=not progress, leave=False) as bar:
        for i, layer in enumerate(layers):
            bar.set_postfix(layer=i + 1)
            t = layer.transform(h)
            scale = layer.source_scale(in_weight)
            out = torch.empty((n, layer.out_dim), dtype=h.dtype, device=device)
            for a, b in pairwise(bounds.tolist()):
                ptr, src, w = graph.in_edges(np.arange(a, b))
                src = torch.from_numpy(src.astype(np.int64)).to(device)
                w_t = torch.from_numpy(w).to(device, dtype)
                if layer.aggr.spmm is not None:
                    agg = _spmm(layer, t, ptr, src, w_t, scale, layer.aggr.spmm)
                else:
                    local = torch.repeat_interleave(torch.arange(b - a, device=device),
                                                    torch.from_numpy(np.diff(ptr)).to(device))
                    msg = layer.messages(t, src, w_t, scale)
                    logits = layer.edge_logits(t, src, local + int(a))
                    agg = layer.aggr.reduce(msg, local, int(b - a), logits)
                out[a:b] = layer.update(h[a:b], agg, t[a:b], in_weight[a:b])
                bar.update()
            h = out
            outputs.append(h)
    return outputs


def _spmm(layer: Layer, t: Tensor, ptr: np.ndarray, src: Tensor, w: Tensor,
          scale: Tensor | None, reduce: str) -> Tensor:
    """Sum/mean/max of a chunk's messages as one sparse (CSR) x dense product."""
    factor = layer.message_factor(src, w, scale)
    if factor is None:
        factor = torch.ones(len(src), dtype=t.dtype, device=t.device)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        adj = torch.sparse_csr_tensor(torch.from_numpy(ptr).to(t.device), src, factor,
                                      size=(len(ptr) - 1, len(t)), check_invariants=False)
    return adj @ t if reduce == "sum" else torch.sparse.mm(adj, t, reduce=reduce)
