"""Neighbor aggregations, one small class each: sum, mean, max, min and softmax
attention.

Each aggregation keeps a per-destination *state* (one row of a tensor) and knows how to
- ``reduce`` all messages of some destinations (full inference, pulls) and ``pack`` the
  result into state rows,
- ``finalize`` state rows into what the layer's update sees (mean divides by in-degree),
- ``apply_delta``: fold messages that stopped and started arriving, as rows of the
  sources' t (`RowMessages`), into stored states, returning the destinations whose state
  it cannot fix that way (a `Pull`: they must be re-aggregated from all their in-edges,
  whole or in some columns, ``pull_columns``); linear ones (sums of messages) never
  pull: ``fold`` takes their messages as rows of the sources' t with coefficients, and
  ``combine`` sums such messages per destination;
- ``merge`` the states of two disjoint sets of a destination's in-edges (computation-graph
  parallelism: each partition aggregates the in-neighbors it owns).
Owns the reductions only; must not import kafka, mpi4py or the graph store.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from streamgnn.models.extremum_ops import fold_max_, max_and_ties, pull_max_columns_
from streamgnn.models.rowops import any_above, combine_rows, fold_rows_, ones
from streamgnn.models.softmax_ops import fold_softmax_

_NONE = np.zeros(0, np.int64)  # no rows (read only)


def _scatter(src: Tensor, index: Tensor, num: int, reduce: str) -> Tensor:
    out = src.new_zeros((num, *src.shape[1:]))
    idx = index.view(-1, *([1] * (src.dim() - 1))).expand_as(src)
    return out.scatter_reduce_(0, idx, src, reduce=reduce, include_self=False)


def _column(x: Tensor, like: Tensor) -> Tensor:
    return x.view(-1, *([1] * (like.dim() - 1)))


@dataclass
class Pull:
    """Destinations whose state a delta could not fix in place, to be re-aggregated from
    all their in-edges: ``dst`` whole, or with ``cols`` ([len(dst), d] bool) only in
    those columns (`Aggregation.pull_columns`)."""

    dst: Tensor
    cols: Tensor | None = None


@dataclass
class RowMessages:
    """Messages ``factor[k] * t[rows[k]]`` to the destinations ``region[at[k]]`` (a
    table ``t`` and ``region`` given beside them)."""

    rows: np.ndarray
    factor: np.ndarray
    at: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.rows, self.factor, self.at


class Aggregation:
    """Base class. ``spmm``: the torch.sparse.mm reduction that computes the state, if any.
    ``state_dtype``: what the engine stores states in (attention's in float64).
    ``ties_dtype``: if set, the engine keeps beside each state row a row of ``ties`` of
    that dtype, as wide as the state, which ``apply_delta`` and ``pull_columns`` keep
    (and ``reduce_with_ties`` counts for whole states)."""

    name: str = ""
    linear = False  # the state is a sum of messages: deltas may be pre-combined by adding
    destination_dependent = False  # messages depend on the destination's own input
    spmm: str | None = None
    state_dtype: torch.dtype | None = None  # None: the embeddings' dtype
    ties_dtype: torch.dtype | None = None

    def reduce(self, msg: Tensor, index: Tensor, num: int, logits: Tensor | None = None):
        raise NotImplementedError

    def pack(self, reduced) -> Tensor:
        """State rows from what ``reduce`` returned."""
        return reduced

    def finalize(self, state: Tensor, count: Tensor):
        return state

    def finalize_stored(self, table: Tensor, index: Tensor, count: Tensor):
        """`finalize` of rows ``index`` of the stored states ``table`` (``count``: their
        in-degrees)."""
        return self.finalize(table.index_select(0, index), count)

    def apply_delta(self, state: Tensor, ties: Tensor | None, t: Tensor, region: np.ndarray,
                    new: RowMessages, old: RowMessages, empty_before: Tensor,
                    part: Tensor | None) -> Pull:
        """Fold messages that start (``new``) and stop (``old``) arriving, rows of ``t``,
        into the ``state`` (and ``ties``) rows of their destinations in ``region``;
        ``empty_before``: destinations that had no in-edge; ``part``: destination-dependent
        aggregations' `Layer.destination_part` of each region vertex. Returns what needs a
        pull. For aggregations that are not linear."""
        raise NotImplementedError

    def pull_columns(self, state: Tensor, ties: Tensor | None, pull: Pull, table: Tensor,
                     begin: np.ndarray, end: np.ndarray, src: np.ndarray,
                     factor: np.ndarray | None) -> None:
        """Re-aggregate the columns ``pull.cols`` of ``pull.dst`` in place (state and
        ties), destination i from its in-edges' messages ``factor[k] * table[src[k]]``,
        k in ``begin[i]:end[i]`` (``factor`` None: 1); for aggregations whose deltas
        return columns."""
        raise NotImplementedError

    def re_anchored(self, wear: np.ndarray) -> np.ndarray:
        """Positions of the rows to recompute from all in-neighbors, given each row's wear
        (`SumAggregation.re_anchored`): none, where deltas do not wear the states."""
        return _NONE

    def merge(self, a: Tensor, a_count: Tensor, b: Tensor, b_count: Tensor) -> Tensor:
        """The state rows over the in-edges of both ``a`` and ``b`` (disjoint sets, of
        ``a_count`` and ``b_count`` edges per destination: a row over none is a
        placeholder)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SumAggregation(Aggregation):
    """States in the embeddings' dtype. A delta adds to a state row with one rounding
    per element; a row whose rounding errors since it was last computed from all
    in-neighbors may add up to more than ``drift_limit`` roundings at its size is
    recomputed so (re-anchored): long delta chains keep the error of a fresh sum. A row
    computed from all in-neighbors starts at ``fresh_roundings`` roundings at its size
    (its own error), so a row that later falls far below that size is re-anchored too.
    Re-anchoring has a fixed cost a superstep beside its rows' share, so once one
    row of a superstep's region must be, every row past ``ripe`` of the limit is
    recomputed with it (`re_anchored`) rather than alone a few batches later."""

    name = "sum"
    linear = True
    spmm = "sum"
    drift_limit = 256.0
    fresh_roundings = 16.0
    ripe = 0.5
    late_share = 0.5
    """Where the wear is read back once a batch and the rows it picks are re-anchored in
    the next batch (`workers/planned.py`), the wear is measured against this share of
    ``drift_limit`` (`late_limit`). A row's bound then passes half the limit in one fold
    at most before the row is recomputed (a batch folds a row once, and the next batch
    pulls it in the superstep that folds it; a shard restored from a checkpoint has lost
    the picks and folds it once more first: a rounding more). A fold makes the bound
    ``g`` times the old one plus one rounding at the larger of the row's sizes before and
    after (``g`` > 1 only where a mean's in-degree fell: `fold_rows_`): where ``g`` is 1
    and the row keeps at least half its size, the bound stays within 2 x 128 + 2
    roundings at its new size, the fixed limit give or take two roundings."""

    @property
    def late_limit(self) -> float:
        """`drift_limit` where the wear is read a batch late (`late_share`)."""
        return self.drift_limit * self.late_share

    def fresh_drift(self, rows: Tensor) -> Tensor:
        """The rounding bounds (float32) of state rows just computed from all
        in-neighbors."""
        unit = torch.finfo(rows.dtype).eps / 2
        chunk = 1 << 16  # rows at a time (a bootstrap's |rows| would double its peak)
        top = (rows.abs().amax(dim=1) if len(rows) <= chunk else
               torch.cat([r.abs().amax(dim=1) for r in rows.split(chunk)]))
        return (top * (self.fresh_roundings * unit)).to(torch.float32)

    def reduce(self, msg, index, num, logits=None) -> Tensor:
        return msg.new_zeros((num, *msg.shape[1:])).index_add_(0, index, msg)

    @staticmethod
    def combine(t: Tensor, rows: Tensor, coef: Tensor, dst: Tensor, num: int) -> Tensor:
        """Messages ``coef[k] * t[rows[k]]`` (t 2-D) summed per destination ``dst[k]`` in
        ``0..num``, in float64: one gather-scale-scatter (`combine_rows`)."""
        return combine_rows(t, rows, coef, dst, num)

    def fold(self, state: Tensor, drift: Tensor, t: Tensor, rows: np.ndarray,
             coef: np.ndarray, local: np.ndarray, region: np.ndarray,
             count: np.ndarray | None, scale: np.ndarray | None = None,
             bias: np.ndarray | None = None, keep: bool = False
             ) -> tuple[Tensor, np.ndarray, Tensor | None]:
        """The delta rule: messages ``coef[k] * t[rows[k]]`` (those that start arriving
        with positive, those that stop with negative coefficients) added to the states of
        their destinations ``region[local[k]]`` (each first rescaled about ``bias`` by
        ``scale[i]`` where given: a mean kept as the pre-activation whose in-degree
        changed), whose rounding bounds ``drift`` grow; returns the finalized states of
        the destinations ``region`` (in-degrees ``count``; None: states that are the
        layer's pre-activation, which nothing divides) in ``t``'s dtype, in one pass,
        how worn their rounding bounds are (`re_anchored` picks the rows to recompute
        from all in-neighbors), and with ``keep`` their states before (`fold_rows_`)."""
        divisor = ones(len(region)) if count is None else self.divisor(count)
        if scale is None:
            scale, bias = ones(len(region)), np.zeros(state.shape[1])
        return fold_rows_(state, drift, t, rows, coef, local, region, divisor,
                          self.drift_limit, scale, bias, keep)

    def re_anchored(self, wear: np.ndarray) -> np.ndarray:
        """Positions of the rows to recompute from all in-neighbors, given each row's
        `fold` wear: none unless one is stale (wear above 1), then all the ripe ones."""
        if not any_above(wear, 1.0):
            return _NONE
        return np.flatnonzero(wear > self.ripe)

    def divisor(self, count: np.ndarray) -> np.ndarray:
        """What `finalize` divides each state row by (float64; not to be written)."""
        return ones(len(count))

    def merge(self, a, a_count, b, b_count) -> Tensor:
        return a + b


class MeanAggregation(SumAggregation):
    """State: the sum; the update sees it divided by the in-degree (0 for no in-edges)."""

    name = "mean"

    def finalize(self, state, count):
        return state / _column(count.clamp(min=1).to(state.dtype), state)

    def divisor(self, count):
        return np.maximum(count, 1).astype(np.float64)


class MaxAggregation(Aggregation):
    """Elementwise max (0 for no in-edges, as in PyG). State: the max of each column;
    ties: per column, how many in-edges are known to carry it (uint8, saturating: a
    lower bound). Messages that start arriving are taken in place (a larger one with one
    tie, an equal one adds a tie); one at the max that stops arriving removes a tie. A
    column is re-aggregated (from all in-edges, that column only) where its last known
    tie leaves, and every column of a destination that had no in-edge (its 0 is a
    placeholder, not a maximum). Ties matter after ReLU: a column that is 0 at all
    in-neighbors has its max 0 many times over."""

    name = "max"
    spmm = "amax"
    ties_dtype = torch.uint8
    sign = 1.0  # the state holds the max of sign * message
    # Relative: an old message recomputed in another order may differ from the stored
    # max in the last bit.
    tolerance = 1e-6

    def reduce(self, msg, index, num, logits=None) -> Tensor:
        return _scatter(msg, index, num, "amax")

    def reduce_with_ties(self, msg: Tensor, index: Tensor, num: int) -> tuple[Tensor, Tensor]:
        """State rows of destinations 0..num from all their messages ``msg`` (message k
        to ``index[k]``) and their ties, on the messages' device (`max_and_ties`)."""
        return max_and_ties(self.sign * msg, index, num)

    def apply_delta(self, state, ties, t, region, new, old, empty_before, part) -> Pull:
        dst, cols = fold_max_(state, ties, t, region, new.arrays(), old.arrays(), self.sign,
                              self.tolerance)
        everything = cols.new_ones((len(empty_before), state.shape[1]))
        return Pull(torch.cat([dst.to(state.device), empty_before]),
                    torch.cat([cols.to(state.device), everything]))

    def pull_columns(self, state, ties, pull, table, begin, end, src, factor) -> None:
        pull_max_columns_(state, ties, pull.dst, pull.cols, table, begin, end, src, factor,
                          self.sign)

    def merge(self, a, a_count, b, b_count) -> Tensor:
        both = torch.maximum(a, b)
        both = torch.where(_column(a_count == 0, a), b, both)
        return torch.where(_column(b_count == 0, b), a, both)


class MinAggregation(MaxAggregation):
    """Elementwise min (0 for no in-edges, as in PyG). A state row holds the max of the
    negated messages, so max's rules apply unchanged."""

    name = "min"
    spmm = "amin"
    sign = -1.0

    def reduce(self, msg, index, num, logits=None) -> Tensor:
        return _scatter(msg, index, num, "amin")

    def pack(self, reduced: Tensor) -> Tensor:
        return -reduced

    def finalize(self, state, count):
        return -state


@dataclass
class SoftmaxPartial:
    """Softmax-weighted sum over a destination's in-edges, per head: ``shift`` (max
    logit), ``den`` = sum exp(logit - shift), ``num`` = sum of exp(logit - shift) *
    message (the self-loop joins in `softmax_ops.attend_with_self_loop`)."""

    shift: Tensor
    den: Tensor
    num: Tensor


@dataclass
class PackedSoftmax:
    """Softmax partials as packed state rows (shift, den, num): rows ``rows`` of
    ``table``, or all of its rows in order (None). Read where they are, in the states'
    dtype: the attention output takes its values' dtype."""

    table: Tensor
    rows: Tensor | None = None

    def to(self, dtype: torch.dtype) -> PackedSoftmax:
        return self


class SoftmaxAggregation(Aggregation):
    """Attention: softmax over each destination's edge logits, then a weighted sum, per
    head. State rows pack (shift, den, num). A message is its source's value and score
    (a row of t) with its destination's score; the logit depending on the destination
    too, a destination whose own input changed is pulled.
    Elsewhere deltas apply to numerator and denominator, rescaled when the shift grows;
    a destination is pulled when removals cancel most of its denominator."""

    name = "softmax"
    destination_dependent = True
    state_dtype = torch.float64
    cancellation = 1e-6  # pull when the denominator falls below this share of itself

    def __init__(self, heads: int, channels: int, negative_slope: float) -> None:
        self.heads, self.channels, self.negative_slope = heads, channels, negative_slope

    def pack(self, reduced: SoftmaxPartial) -> Tensor:
        return torch.cat([reduced.shift, reduced.den, reduced.num.flatten(1)], dim=1)

    def unpack(self, state: Tensor) -> SoftmaxPartial:
        h = self.heads
        return SoftmaxPartial(state[:, :h], state[:, h:2 * h],
                              state[:, 2 * h:].view(-1, h, self.channels))

    def finalize(self, state, count) -> PackedSoftmax:
        return PackedSoftmax(state)

    def finalize_stored(self, table, index, count) -> PackedSoftmax:
        return PackedSoftmax(table, index)  # rows of 5 KB (GAT, 3 layers): not copied

    def apply_delta(self, state, ties, t, region, new, old, empty_before, part) -> Pull:
        """``t``: `GATLayer.transform` rows (values, then source and destination
        scores); ``part``: the region's destination scores."""
        return Pull(fold_softmax_(state, t, self.channels, region, (new.rows, new.at),
                                  (old.rows, old.at), part, self.negative_slope,
                                  self.cancellation))

    def merge(self, a, a_count, b, b_count) -> Tensor:
        """Rescale both to the larger shift (OMEGA's merge, with numerator and
        denominator kept apart): an empty side (shift -inf) weighs 0."""
        pa, pb = self.unpack(a), self.unpack(b)
        shift = torch.maximum(pa.shift, pb.shift)
        ka = torch.exp(pa.shift - shift).nan_to_num_(0.0)  # -inf - -inf: both empty
        kb = torch.exp(pb.shift - shift).nan_to_num_(0.0)
        return self.pack(SoftmaxPartial(shift, pa.den * ka + pb.den * kb,
                                        pa.num * ka.unsqueeze(-1) + pb.num * kb.unsqueeze(-1)))

    def reduce(self, msg, index, num, logits=None) -> SoftmaxPartial:
        shift = _scatter(logits, index, num, "amax")
        empty = torch.bincount(index, minlength=num) == 0
        shift[empty] = float("-inf")
        e = torch.exp(logits - shift[index])
        den = logits.new_zeros(shift.shape).index_add_(0, index, e)
        total = msg.new_zeros((num, *msg.shape[1:])).index_add_(0, index, e.unsqueeze(-1) * msg)
        return SoftmaxPartial(shift, den, total)
