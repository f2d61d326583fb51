"""One message-passing layer split into message / aggregate / update
(docs/architecture.md "The incremental engine"), built from a trained PyG conv: GCNConv,
SAGEConv, GraphConv, GINConv, GATConv.

For source u, edge u -> v (weight w) and destination v:
  t_u   = transform(h_u)                          per-vertex, source side
  m_uv  = w^[edge_weighted] * scale_u * t_u       scale_u from ``source_scale`` (GCN only)
  A_v   = aggr({m_uv}) (softmax over ``edge_logits`` for attention)
  h'_v  = update(h_v, A_v, t_v, in_weight_v)      per-vertex, includes the inter-layer
                                                  activation/norm (``post``)
Owns these decompositions only; must not import kafka, mpi4py or the graph store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from streamgnn.errors import UnsupportedModelError
from streamgnn.models.aggr import (
    Aggregation,
    MaxAggregation,
    MeanAggregation,
    MinAggregation,
    PackedSoftmax,
    SoftmaxAggregation,
    SumAggregation,
)
from streamgnn.models.small_product import is_small, paired_product
from streamgnn.models.softmax_ops import attend_with_self_loop, reduce_attention_csr

if TYPE_CHECKING:
    from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv, SAGEConv

Post = Callable[[Tensor], Tensor] | None

_AGGREGATIONS: dict[str, type[Aggregation]] = {
    "add": SumAggregation, "sum": SumAggregation, "mean": MeanAggregation,
    "max": MaxAggregation, "min": MinAggregation,
}


class Layer:
    """Base class; subclasses set ``aggr`` and override what differs."""

    aggr: Aggregation
    edge_weighted = False      # messages are multiplied by the edge weight
    degree_normalised = False  # messages depend on the source's weighted in-degree
    self_transform = False     # the update needs the vertex's own t (a self-loop term)
    transforms = False         # transform changes h (False: t is h itself)
    in_dim: int
    out_dim: int

    def __init__(self, post: Post = None) -> None:
        self.post = post

    def transform(self, h: Tensor) -> Tensor:
        return h

    def source_scale(self, in_weight: Tensor) -> Tensor | None:
        """Per-source message factor from the source's weighted in-degree, or None."""
        return None

    def host_source_scale(self, in_weight: np.ndarray) -> np.ndarray | None:
        """`source_scale` of host values, on the host: bit for bit what torch gives on the
        CPU."""
        return None

    def edge_logits(self, t: Tensor, src: Tensor, dst_part: Tensor) -> Tensor | None:
        """Per-edge attention logits from the sources' rows of ``t`` and each edge's
        destination part (`destination_part`); None but for attention layers."""
        return None

    def message_factor(self, src: Tensor, w: Tensor, scale: Tensor | None) -> Tensor | None:
        """The scalar each edge's message is ``t[src]`` times (None: 1)."""
        factor = w if self.edge_weighted else None
        if scale is not None:
            factor = scale[src] if factor is None else factor * scale[src]
        return factor

    def reduce_csr(self, t: Tensor, ptr: np.ndarray, src: Tensor, dst: Tensor) -> Tensor | None:
        """Packed aggregation states of destinations ``dst[i]`` from their in-edges
        ``src[ptr[i]:ptr[i+1]]`` (rows of ``t``) by a fused kernel, where the layer has one
        for ``t``'s device; None: the generic reductions run."""
        return None

    def messages(self, t: Tensor, src: Tensor, w: Tensor, scale: Tensor | None) -> Tensor:
        """Messages of the edges ``src -> *`` with weights ``w``."""
        factor = self.message_factor(src, w, scale)
        m = t.index_select(0, src)  # quicker than t[src] on CPU
        return m if factor is None else m.mul_(factor.view(-1, *([1] * (m.dim() - 1))))

    def partial(self, t: Tensor, src: Tensor, dst: Tensor, w: Tensor, num: int,
                dst_part: Tensor | None, raw: bool = False) -> Tensor:
        """Packed aggregation states (``t``'s dtype) of destinations ``0..num`` over the
        edges ``src[k] -> dst[k]`` (rows of ``t``; ``w``: each edge's message factor, a
        degree-normalised layer's source scale included; int64, int64 and float64
        tensors on ``t``'s device, which the caller copies there with what else it
        copies), attention logits against ``dst_part`` (the destinations'
        `destination_part`). A destination with no edge here gets a placeholder row
        that `Aggregation.merge` ignores. Sums and means of rows run as one
        gather-scale-scatter kernel; with ``raw`` their rows are h, not t, and the sums
        are transformed (for linear aggregations ``transform`` is linear without bias,
        so it commutes with them; for others ``raw`` needs an identity ``transform``)."""
        if self.aggr.linear and t.dim() == 2:
            coef = w if self.edge_weighted else torch.ones_like(w)
            state = SumAggregation.combine(t, src, coef, dst, num)
            return self.transform(state.to(t.dtype)) if raw else state.to(t.dtype)
        if raw and self.transforms:
            raise ValueError(f"{self}: partial over untransformed rows")
        logits = None if dst_part is None else self.edge_logits(
            t, src, dst_part.index_select(0, dst))
        msg = self.messages(t, src, w.to(t.dtype), None)
        return self.aggr.pack(self.aggr.reduce(msg, dst, num, logits))

    def destination_part(self, t: Tensor) -> Tensor:
        """What a message needs of its destination's t (destination-dependent
        aggregations)."""
        return t

    def update(self, h: Tensor, agg, t: Tensor | None, in_weight: Tensor) -> Tensor:
        """``t`` may be None unless ``self_transform``."""
        return self.finish(self.combine(h, agg, t, in_weight))

    def finish(self, out: Tensor) -> Tensor:
        """The inter-layer activation/norm."""
        return out if self.post is None else self.post(out)

    def combine(self, h: Tensor, agg, t: Tensor, in_weight: Tensor) -> Tensor:
        raise NotImplementedError

    caches_t = False
    """Whether an engine keeps t of every vertex: for layers whose pulls and updates need
    t of many vertices whose input did not change (attention)."""

    caches_root = False
    """Whether ``update`` is ``finish(combine_root(agg, root(h)))`` with messages arriving
    already transformed: an engine keeping ``root`` per vertex then updates a vertex whose
    own input did not change without any matmul."""

    def root(self, h: Tensor) -> Tensor:
        """The part of the update that depends only on the vertex's own input."""
        raise NotImplementedError

    keeps_preactivation = False
    """Whether the layer is ``activate(z)``, z = the sum (or mean) of messages
    ``w_uv rel(h_u)`` + ``root(h_v)`` + a bias, ``rel`` and ``root`` linear and
    ``activate`` row by row: an engine then keeps z as the layer's only table (messages
    and root changes add to it, a mean's rescales about its root term and bias where the
    in-degree changes, and h is ``activate`` of its rows when read)."""

    def rel_root(self, h: Tensor, paired: int) -> Tensor:
        """``rel`` and ``root`` of the first ``paired`` rows of ``h``, interleaved, then
        ``rel`` of the rest: rows 2i and 2i+1 of the result are those of ``h[i]`` for i <
        ``paired``, row ``paired + i`` that of ``h[i]`` after (layers keeping the
        pre-activation; the root terms of most rows a superstep transforms are not read)."""
        raise NotImplementedError

    def preactivation(self, h: Tensor, agg: Tensor) -> Tensor:
        """z of vertices with inputs ``h`` and aggregated (transformed) messages ``agg``."""
        raise NotImplementedError

    def activate(self, z: Tensor) -> Tensor:
        """The layer's output from its pre-activation ``z``, row by row."""
        raise NotImplementedError

    @property
    def elementwise(self) -> str | None:
        """What `activate` is where it maps each value alone: "identity" or "relu" (a
        kernel then activates rows itself); None where it does more (an MLP, a norm, a
        row's L2 normalisation)."""
        return None

    def empty_preactivation(self) -> Tensor:
        """z of a vertex with no in-edges and a zero root term: the bias."""
        raise NotImplementedError

    def combine_root(self, agg, root: Tensor | None) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_dim}->{self.out_dim}, aggr={self.aggr.name})"


def _linear(lin: torch.nn.Module, x: Tensor, bias: bool = True) -> Tensor:
    """Apply a PyG/torch Linear, optionally without its bias."""
    b = getattr(lin, "bias", None)
    return F.linear(x, lin.weight, b if bias else None)


class GCNLayer(Layer):
    """GCNConv: h'_v = s_v * sum_u w_uv s_u W h_u + fill * s_v^2 W h_v + b,
    s = (fill + weighted in-degree)^-1/2, fill = 1 (2 if improved, 0 without self-loops)."""

    edge_weighted = True
    degree_normalised = True
    self_transform = True
    transforms = True

    def __init__(self, conv: GCNConv, post: Post = None) -> None:
        super().__init__(post)
        if not conv.normalize:
            raise UnsupportedModelError("GCNConv(normalize=False) is not supported")
        if conv.flow != "source_to_target":
            raise UnsupportedModelError("GCNConv(flow='target_to_source') is not supported")
        self.conv = conv
        self.fill = (2.0 if conv.improved else 1.0) if conv.add_self_loops else 0.0
        self.aggr = SumAggregation()
        self.in_dim, self.out_dim = conv.in_channels, conv.out_channels

    def transform(self, h):
        return self.conv.lin(h)

    def source_scale(self, in_weight):
        deg = in_weight + self.fill
        s = deg.pow(-0.5)
        return s.masked_fill_(torch.isinf(s), 0.0)

    def host_source_scale(self, in_weight):
        with np.errstate(divide="ignore", invalid="ignore"):
            s = 1.0 / np.sqrt(in_weight + self.fill)  # torch's pow(-0.5) on the CPU
        s[np.isinf(s)] = 0.0
        return s

    def combine(self, h, agg, t, in_weight):
        s = self.source_scale(in_weight).unsqueeze(-1)
        out = s * agg + self.fill * s * s * t
        return out if self.conv.bias is None else out + self.conv.bias


class _LinearRootLayer(Layer):
    """SAGEConv / GraphConv: h'_v = lin_nbr(aggr(m)) + lin_root(h_v) (L2-normalised for
    SAGEConv(normalize=True)). For sum and mean the neighbor weight is applied at the
    source when that shrinks messages (out < in). With a sum or mean and a root term
    without bias the layer keeps its pre-activation: rel = lin_nbr without bias, root =
    lin_root."""

    normalize = False

    def __init__(self, aggr: str, lin_nbr, lin_root, in_dim: int, out_dim: int,
                 post: Post) -> None:
        super().__init__(post)
        if not isinstance(aggr, str) or aggr not in _AGGREGATIONS:
            raise UnsupportedModelError(
                f"aggregation {aggr!r} is not supported; use one of add/sum, mean, max, min")
        self.aggr = _AGGREGATIONS[aggr]()
        self.lin_nbr, self.lin_root = lin_nbr, lin_root
        self.in_dim, self.out_dim = in_dim, out_dim
        self.pre = self.transforms = self.aggr.linear and out_dim < in_dim
        self.keeps_preactivation = (self.aggr.name in ("sum", "mean") and lin_root is not None
                                    and getattr(lin_root, "bias", None) is None)
        self.caches_root = self.pre and lin_root is not None and not self.keeps_preactivation
        # the weights' key, [rel | root] and rel, transposed ([rel | root] as numpy on cpu)
        self._stacked: tuple[tuple, Tensor, Tensor, np.ndarray | None] | None = None

    def transform(self, h):
        return _linear(self.lin_nbr, h, bias=False) if self.pre else h

    def root(self, h):
        return self.lin_root(h)

    def rel_root(self, h, paired):
        rel, root = self.lin_nbr.weight, self.lin_root.weight
        key = (rel.data_ptr(), rel._version, root.data_ptr(), root._version)
        if self._stacked is None or self._stacked[0] != key:  # the weights as they are now
            both = torch.cat((rel, root)).detach().t().contiguous()  # (transposed once)
            self._stacked = key, both, rel.detach().t().contiguous(), (
                both.numpy() if both.device.type == "cpu" else None)
        _, both, rel_t, host = self._stacked
        (n, width), d = h.shape, self.out_dim
        if host is not None and is_small((n + paired) * d * width):  # (on the CPU)
            return paired_product(h, host, paired)
        if paired == n:
            return torch.mm(h, both).view(2 * n, d)
        out = h.new_empty((n + paired, d))
        torch.mm(h[:paired], both, out=out[:2 * paired].view(paired, 2 * d))
        torch.mm(h[paired:], rel_t, out=out[2 * paired:])
        return out

    def combine(self, h, agg, t, in_weight):
        return self.combine_root(agg, None if self.lin_root is None else self.root(h))

    def combine_root(self, agg, root):
        out = self._neighbors(agg)
        return self._normalized(out if root is None else out + root)

    def _neighbors(self, agg: Tensor) -> Tensor:
        """lin_nbr of the aggregated messages (applied at the source when ``pre``)."""
        if not self.pre:
            return self.lin_nbr(agg)
        return agg if self.lin_nbr.bias is None else agg + self.lin_nbr.bias

    def preactivation(self, h, agg):
        return self._neighbors(agg) + self.root(h)

    def activate(self, z):
        return self.finish(self._normalized(z))

    @property
    def elementwise(self):
        if self.normalize:
            return None
        if self.post is None:
            return "identity"
        return "relu" if isinstance(self.post, torch.nn.ReLU) or self.post in (
            F.relu, torch.relu) else None

    def _normalized(self, out: Tensor) -> Tensor:
        """SAGEConv(normalize=True)'s L2 normalisation of each output row (else as is)."""
        return F.normalize(out, p=2.0, dim=-1) if self.normalize else out

    def empty_preactivation(self):
        bias = self.lin_nbr.bias
        return (bias if bias is not None else self.lin_nbr.weight.new_zeros(
            self.out_dim)).detach()


class SAGELayer(_LinearRootLayer):
    def __init__(self, conv: SAGEConv, post: Post = None) -> None:
        if conv.project:
            raise UnsupportedModelError("SAGEConv(project=True) is not supported")
        super().__init__(conv.aggr, conv.lin_l, conv.lin_r if conv.root_weight else None,
                         conv.in_channels, conv.out_channels, post)
        self.normalize = conv.normalize


class GraphConvLayer(_LinearRootLayer):
    edge_weighted = True

    def __init__(self, conv: GraphConv, post: Post = None) -> None:
        super().__init__(conv.aggr, conv.lin_rel, conv.lin_root, conv.in_channels,
                         conv.out_channels, post)


class GINLayer(Layer):
    """GINConv: h'_v = nn((1 + eps) h_v + sum_u h_u). An engine keeps the pre-activation
    z = sum_u h_u + (1 + eps) h_v (`Layer.keeps_preactivation`: rel the identity, root a
    scaling, no bias), as wide as the input; the output is ``nn`` of z."""

    keeps_preactivation = True

    def __init__(self, conv: GINConv, post: Post = None) -> None:
        super().__init__(post)
        self.conv = conv
        self.aggr = SumAggregation()
        self.in_dim = _in_features(conv.nn)
        with torch.no_grad():
            weight = next(conv.nn.parameters())
            probe = torch.zeros(1, self.in_dim, dtype=weight.dtype, device=weight.device)
            self.out_dim = conv.nn(probe).shape[-1]
        self._scales: tuple[tuple, Tensor] | None = None  # 1 (rel) and 1 + eps (root) per column

    def combine(self, h, agg, t, in_weight):
        return self.conv.nn(self.preactivation(h, agg))

    def rel_root(self, h, paired):
        eps = self.conv.eps
        key = (eps.data_ptr(), eps._version, h.dtype, h.device)
        if self._scales is None or self._scales[0] != key:  # eps as it is now
            ones = torch.ones(self.in_dim, dtype=h.dtype, device=h.device)
            self._scales = key, torch.cat([ones, (1 + eps.detach()).to(ones).expand_as(ones)])
        top = h[:paired]
        both = torch.cat([top, top], dim=1).mul_(self._scales[1]).view(2 * paired, self.in_dim)
        return both if paired == len(h) else torch.cat([both, h[paired:]])  # (rel: identity)

    def preactivation(self, h, agg):
        return agg + (1 + self.conv.eps) * h

    def activate(self, z):
        return self.finish(self.conv.nn(z))

    def empty_preactivation(self):
        return next(self.conv.nn.parameters()).new_zeros(self.in_dim).detach()


class GATLayer(Layer):
    """GATConv: softmax over leaky_relu(a_src . t_u + a_dst . t_v) of the in-edges plus
    the self-loop, t = W h split into heads; heads concatenated or averaged, + bias."""

    self_transform = True
    transforms = True
    caches_t = True

    def __init__(self, conv: GATConv, post: Post = None) -> None:
        super().__init__(post)
        if conv.lin is None:
            raise UnsupportedModelError("GATConv with separate source/target weights "
                                        "(tuple in_channels) is not supported")
        if conv.edge_dim is not None:
            raise UnsupportedModelError("GATConv(edge_dim=...) is not supported")
        if not conv.add_self_loops:
            raise UnsupportedModelError("GATConv(add_self_loops=False) is not supported")
        self.conv = conv
        self.aggr = SoftmaxAggregation(conv.heads, conv.out_channels, conv.negative_slope)
        self.heads, self.channels = conv.heads, conv.out_channels
        self.in_dim = conv.in_channels
        self.out_dim = conv.heads * conv.out_channels if conv.concat else conv.out_channels

    def transform(self, h):
        """W h split into heads, each head's source and destination attention scores
        appended as two more channels (so whoever keeps t keeps the scores)."""
        t = self.conv.lin(h).view(-1, self.heads, self.channels)
        return torch.cat([t, (t * self.conv.att_src).sum(-1, keepdim=True),
                          (t * self.conv.att_dst).sum(-1, keepdim=True)], dim=-1)

    def values(self, t: Tensor) -> Tensor:
        """The W h part of t, [n, heads, channels]."""
        return t[..., :self.channels]

    def scores(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """Per-vertex source and destination attention scores, [n, heads] each."""
        return t[..., self.channels], t[..., self.channels + 1]

    def logits(self, a_src: Tensor, a_dst: Tensor) -> Tensor:
        return F.leaky_relu(a_src + a_dst, self.conv.negative_slope)

    def edge_logits(self, t, src, dst_part):
        return self.logits(self.scores(t)[0][src], dst_part)

    def messages(self, t, src, w, scale):
        return self.values(t.index_select(0, src))

    def reduce_csr(self, t, ptr, src, dst):
        if t.device.type != "cpu":
            return None
        return reduce_attention_csr(t, self.channels, ptr, src, dst,
                                    self.conv.negative_slope)

    def destination_part(self, t):
        return self.scores(t)[1]

    def combine(self, h, agg: PackedSoftmax, t, in_weight):
        a_src, a_dst = self.scores(t)
        out = attend_with_self_loop(agg.table, agg.rows, self.logits(a_src, a_dst),
                                    self.values(t))
        out = out.reshape(len(t), self.out_dim) if self.conv.concat else out.mean(dim=1)
        if self.conv.res is not None:
            out = out + self.conv.res(h)
        return out if self.conv.bias is None else out + self.conv.bias


@functools.cache
def layer_types() -> dict[type, type[Layer]]:
    """PyG conv class -> its decomposition (PyG loads here, on first use: a conv to
    decompose has loaded it already)."""
    from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv, SAGEConv

    return {GCNConv: GCNLayer, SAGEConv: SAGELayer, GraphConv: GraphConvLayer,
            GINConv: GINLayer, GATConv: GATLayer}


def layer_from_conv(conv: torch.nn.Module, post: Post = None) -> Layer:
    """The decomposition of a PyG conv; raises UnsupportedModelError naming what is."""
    cls = layer_types().get(type(conv))
    if cls is None:
        raise UnsupportedModelError(
            f"{type(conv).__name__} is not supported; supported layers: "
            + ", ".join(t.__name__ for t in layer_types()))
    return cls(conv, post)


def _in_features(module: torch.nn.Module) -> int:
    for m in module.modules():
        for name in ("in_features", "in_channels"):
            if isinstance(getattr(m, name, None), int) and getattr(m, name) > 0:
                return getattr(m, name)
    raise UnsupportedModelError(f"cannot tell the input size of {type(module).__name__}")
