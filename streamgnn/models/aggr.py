"""Neighbour aggregations, one small class each, over per-edge messages grouped by
destination: sum, mean, max and softmax attention.

Each knows how to reduce all messages of a set of destinations (full inference) and how
to merge partial results of the same destinations (the self term of attention now;
partitions' partial aggregates later). Owns the reductions only; must not import kafka,
mpi4py or the graph store.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def _scatter(src: Tensor, index: Tensor, num: int, reduce: str) -> Tensor:
    out = src.new_zeros((num, *src.shape[1:]))
    idx = index.view(-1, *([1] * (src.dim() - 1))).expand_as(src)
    return out.scatter_reduce_(0, idx, src, reduce=reduce, include_self=False)


class Aggregation:
    """Reduce messages ``msg[e]`` sent to ``index[e]`` into one value per destination."""

    name: str = ""
    spmm: str | None = None  # torch.sparse.mm reduction equal to this one, if any

    def reduce(self, msg: Tensor, index: Tensor, num: int, logits: Tensor | None = None):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SumAggregation(Aggregation):
    name = "sum"
    spmm = "sum"

    def reduce(self, msg, index, num, logits=None) -> Tensor:
        return msg.new_zeros((num, *msg.shape[1:])).index_add_(0, index, msg)


class MeanAggregation(Aggregation):
    """Sum divided by the in-degree (an empty neighbourhood gives 0, as in PyG)."""

    name = "mean"
    spmm = "mean"

    def reduce(self, msg, index, num, logits=None) -> Tensor:
        total = msg.new_zeros((num, *msg.shape[1:])).index_add_(0, index, msg)
        count = torch.bincount(index, minlength=num).clamp_(min=1).to(msg.dtype)
        return total / count.view(-1, *([1] * (msg.dim() - 1)))


class MaxAggregation(Aggregation):
    """Elementwise max (an empty neighbourhood gives 0, as in PyG)."""

    name = "max"
    spmm = "amax"

    def reduce(self, msg, index, num, logits=None) -> Tensor:
        return _scatter(msg, index, num, "amax")


@dataclass
class SoftmaxPartial:
    """Softmax-weighted sum over a subset of a destination's edges, kept mergeable:
    ``shift`` (max logit, per head), ``den`` = sum exp(logit - shift), ``num`` = sum of
    exp(logit - shift) * message."""

    shift: Tensor
    den: Tensor
    num: Tensor

    def value(self) -> Tensor:
        return self.num / self.den.unsqueeze(-1)


class SoftmaxAggregation(Aggregation):
    """Attention: softmax over each destination's edge logits, then a weighted sum."""

    name = "softmax"

    def reduce(self, msg, index, num, logits=None) -> SoftmaxPartial:
        shift = _scatter(logits, index, num, "amax")
        empty = torch.bincount(index, minlength=num) == 0
        shift[empty] = float("-inf")
        e = torch.exp(logits - shift[index])
        den = logits.new_zeros(shift.shape).index_add_(0, index, e)
        total = msg.new_zeros((num, *msg.shape[1:])).index_add_(0, index, e.unsqueeze(-1) * msg)
        return SoftmaxPartial(shift, den, total)

    @staticmethod
    def merge(a: SoftmaxPartial, b: SoftmaxPartial) -> SoftmaxPartial:
        shift = torch.maximum(a.shift, b.shift)
        ea = torch.exp(a.shift - shift).nan_to_num_(0.0)  # -inf - -inf: an empty side
        eb = torch.exp(b.shift - shift).nan_to_num_(0.0)
        return SoftmaxPartial(shift, a.den * ea + b.den * eb,
                              a.num * ea.unsqueeze(-1) + b.num * eb.unsqueeze(-1))
