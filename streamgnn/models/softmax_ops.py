"""Kernels of the softmax (attention) aggregation, whose state rows are
``[shift (heads) | den (heads) | num (heads x channels)]`` (float64):
- ``fold_softmax_``: fold messages that stop and start arriving into state rows in place,
  each read from its source's row of t and its destination's scores (no message is
  built), returning the destinations whose denominator the removals cancelled (they must
  be pulled);
- ``reduce_attention_csr``: state rows of destinations from all their in-edges (pulls,
  bootstrap), computing each edge's logit from per-vertex scores as it goes;
- ``attend_with_self_loop``: the attention output once a vertex's self-loop joins the
  softmax of its in-edges.
Numba loops for CPU tensors work row by row with no per-message temporaries (torch builds
several [messages, heads, channels] tensors, which at a few hundred thousand messages is
most of a GAT batch); torch versions serve other devices (the reduce's is
`SoftmaxAggregation.reduce`). Tests hold each pair to each other.

Owns these kernels only; must not import kafka, mpi4py or the graph store.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit
from torch import Tensor

from streamgnn.models.transfer import upload
from streamgnn.prefetch import AHEAD, prefetch_row


@njit(cache=True)
def _logit(source_score, destination_score, slope):
    """An edge's attention logit: leaky_relu(source score + destination score)."""
    x = source_score + destination_score
    return x if x > 0 else slope * x


@njit(cache=True, inline="always")
def _join(state, r, k, logit, t, u, c):
    """Add a message to head ``k`` of the packed state row ``r``: ``logit``, and
    channels ``t[u, k, :c]``; the row's shift is raised first where the logit exceeds
    it, rescaling what is summed so far (to 0 where the row was empty, shift -inf)."""
    h = t.shape[1]
    at = 2 * h + k * c
    if logit > state[r, k]:
        scale = np.exp(state[r, k] - logit)
        state[r, h + k] *= scale
        for j in range(c):
            state[r, at + j] *= scale
        state[r, k] = logit
    e = np.exp(logit - state[r, k])
    state[r, h + k] += e
    for j in range(c):
        state[r, at + j] += e * t[u, k, j]


@njit(cache=True)
def _fold_loop(state, t, c, region, new_rows, new_at, old_rows, old_at, part, slope,
               cancellation):
    h = t.shape[1]
    touched = np.unique(np.concatenate((region[new_at], region[old_at])))
    den_before = np.empty((len(touched), h))
    for i in range(len(touched)):
        for k in range(h):
            den_before[i, k] = state[touched[i], h + k]
    for m in range(len(old_rows)):  # leaving: subtract at the current shift
        if m + AHEAD < len(old_rows):
            prefetch_row(t, old_rows[m + AHEAD])
            prefetch_row(state, region[old_at[m + AHEAD]])
        u, r = old_rows[m], region[old_at[m]]
        for k in range(h):
            e = np.exp(_logit(t[u, k, c], part[old_at[m], k], slope) - state[r, k])
            state[r, h + k] -= e
            at = 2 * h + k * c
            for j in range(c):
                state[r, at + j] -= e * t[u, k, j]
    cancelled = np.zeros(len(touched), np.bool_)
    for i in range(len(touched)):
        for k in range(h):
            if state[touched[i], h + k] < cancellation * den_before[i, k]:
                cancelled[i] = True
    for m in range(len(new_rows)):  # arriving: a larger logit raises the shift first
        if m + AHEAD < len(new_rows):
            prefetch_row(t, new_rows[m + AHEAD])
            prefetch_row(state, region[new_at[m + AHEAD]])
        u, r = new_rows[m], region[new_at[m]]
        for k in range(h):
            _join(state, r, k, _logit(t[u, k, c], part[new_at[m], k], slope), t, u, c)
    return touched[cancelled]


def fold_softmax_numba(state: Tensor, t: Tensor, channels: int, region: np.ndarray,
                       new: tuple[np.ndarray, np.ndarray], old: tuple[np.ndarray, np.ndarray],
                       part: Tensor, slope: float, cancellation: float) -> Tensor:
    return torch.from_numpy(_fold_loop(state.numpy(), np.ascontiguousarray(t.numpy()),
                                       channels, region, *new, *old,
                                       np.ascontiguousarray(part.numpy()), slope,
                                       cancellation))


def fold_softmax_torch(state: Tensor, t: Tensor, channels: int, region: np.ndarray,
                       new: tuple[np.ndarray, np.ndarray], old: tuple[np.ndarray, np.ndarray],
                       part: Tensor, slope: float, cancellation: float) -> Tensor:
    h, c = t.shape[1], channels

    def messages(rows: Tensor, at: Tensor, dst: Tensor) -> tuple[Tensor, Tensor]:
        """[logit (heads) | value (heads x channels)] per message, and its destination."""
        rows_t = t.index_select(0, rows)
        logits = F.leaky_relu(rows_t[..., c] + part.index_select(0, at), slope)
        msg = torch.cat([logits, rows_t[..., :c].flatten(1)], dim=1).to(state.dtype)
        return msg, dst

    (rows, at), (old_rows, old_at) = new, old
    uploaded = upload(state.device, rows, at, region[at], old_rows, old_at, region[old_at])
    new_msg, new_dst = messages(*uploaded[:3])
    old_msg, old_dst = messages(*uploaded[3:])
    touched = torch.cat([new_dst, old_dst]).unique()
    at_new = torch.searchsorted(touched, new_dst)
    at_old = torch.searchsorted(touched, old_dst)
    rows = state[touched]
    shift, den, num = rows[:, :h], rows[:, h:2 * h], rows[:, 2 * h:].view(-1, h, c)

    e = torch.exp(old_msg[:, :h] - shift[at_old])
    den_after = den.index_add(0, at_old, e, alpha=-1)
    num = num.index_add(0, at_old, e.unsqueeze(-1) * old_msg[:, h:].view(-1, h, c), alpha=-1)
    cancelled = (den_after < cancellation * den).any(dim=-1)

    logits = new_msg[:, :h]
    raised = shift.index_reduce(0, at_new, logits, "amax", include_self=True)
    rescale = torch.exp(shift - raised).nan_to_num_(0.0)  # -inf - -inf: was empty
    e = torch.exp(logits - raised[at_new])
    den_after = (den_after * rescale).index_add_(0, at_new, e)
    num = (num * rescale.unsqueeze(-1)).index_add_(
        0, at_new, e.unsqueeze(-1) * new_msg[:, h:].view(-1, h, c))
    state[touched] = torch.cat([raised, den_after, num.flatten(1)], dim=1)
    return touched[cancelled]


def fold_softmax_(state: Tensor, t: Tensor, channels: int, region: np.ndarray,
                  new: tuple[np.ndarray, np.ndarray], old: tuple[np.ndarray, np.ndarray],
                  part: Tensor, slope: float, cancellation: float) -> Tensor:
    """Fold messages arriving (``new``) and leaving (``old``), each ``(rows, at)``: from
    the source whose row of ``t`` [n, heads, channels + 2] (values, then source and
    destination scores) is ``rows[k]``, to destination ``region[at[k]]``, whose
    destination scores are ``part[at[k]]``; logit ``leaky_relu(source score +
    destination score, slope)``; into ``state`` in place. Returns the destinations where
    the removals left less than ``cancellation`` of a head's denominator (sorted,
    distinct): they must be pulled."""
    kernel = fold_softmax_numba if state.device.type == "cpu" else fold_softmax_torch
    return kernel(state, t, channels, region, new, old, part, slope, cancellation)


@njit(cache=True)
def _reduce_loop(t, c, ptr, src, dst, slope):
    num_dst, h = len(ptr) - 1, t.shape[1]
    out = np.zeros((num_dst, 2 * h + h * c))
    for i in range(num_dst):
        d = dst[i]
        for k in range(h):
            out[i, k] = -np.inf
        for e in range(ptr[i], ptr[i + 1]):  # one pass: the shift rises as logits come
            if e + AHEAD < len(src):
                prefetch_row(t, src[e + AHEAD])
            u = src[e]
            for k in range(h):
                _join(out, i, k, _logit(t[u, k, c], t[d, k, c + 1], slope), t, u, c)
    return out


def reduce_attention_csr(t: Tensor, channels: int, ptr: np.ndarray, src: Tensor, dst: Tensor,
                         slope: float) -> Tensor:
    """Packed float64 states of destinations ``dst[i]``, whose in-edges come from
    ``src[ptr[i]:ptr[i+1]]``, for attention logits ``leaky_relu(a_src[u] + a_dst[v],
    slope)`` per head; ``t`` [n, heads, channels + 2] holds each vertex's values and then
    its source and destination scores (`GATLayer.transform`), read whole: a contiguous
    table lets the loops over channels run as vector code (quicker than on views of its
    parts). On CPU in one pass over the edges (online softmax: quicker than a pass for
    the shift and one for the sums) with no per-edge temporaries. No
    in-edge: shift -inf, sums 0."""
    return torch.from_numpy(_reduce_loop(np.ascontiguousarray(t.numpy()), channels,
                                         ptr.astype(np.int64), src.numpy(), dst.numpy(),
                                         slope))


@njit(cache=True)
def _self_loop_loop(state, rows, own, values):
    n, h, c = values.shape
    out = np.empty((n, h, c), values.dtype)
    for i in range(n):
        if i + AHEAD < n:
            prefetch_row(state, rows[i + AHEAD])
        r = rows[i]
        for k in range(h):
            shift = state[r, k]
            top = max(shift, own[i, k])
            kept = np.exp(shift - top)  # 0 where nothing arrived (shift -inf)
            mine = np.exp(own[i, k] - top)
            total = state[r, h + k] * kept + mine
            at = 2 * h + k * c
            for j in range(c):
                out[i, k, j] = (state[r, at + j] * kept + mine * values[i, k, j]) / total
    return out


def attend_with_self_loop_numba(state: Tensor, rows: Tensor | None, own: Tensor,
                                values: Tensor) -> Tensor:
    rows = np.arange(len(own)) if rows is None else rows.numpy()
    return torch.from_numpy(_self_loop_loop(state.numpy(), rows, own.numpy(),
                                            values.numpy()))


def attend_with_self_loop_torch(state: Tensor, rows: Tensor | None, own: Tensor,
                                values: Tensor) -> Tensor:
    packed = state if rows is None else state.index_select(0, rows)
    h, c = values.shape[1:]
    shift, den, num = packed[:, :h], packed[:, h:2 * h], packed[:, 2 * h:].view(-1, h, c)
    top = torch.maximum(shift, own)
    kept = torch.exp(shift - top).unsqueeze(-1)  # 0 where nothing arrived (shift -inf)
    mine = torch.exp(own - top).unsqueeze(-1)
    out = (num * kept + mine * values) / (den.unsqueeze(-1) * kept + mine)
    return out.to(values.dtype)


def attend_with_self_loop(state: Tensor, rows: Tensor | None, own: Tensor,
                          values: Tensor) -> Tensor:
    """Each destination's attention output [n, heads, channels], in ``values``' dtype,
    once its self-loop (logit ``own`` [n, heads], value ``values``) joins the partial
    softmax of its in-edges: row ``rows[i]`` of the packed states ``state`` (shift |
    den | num, `SoftmaxAggregation.pack`; rows 0..n-1 when ``rows`` is None), read in
    place."""
    cpu = values.device.type == "cpu"
    kernel = attend_with_self_loop_numba if cpu else attend_with_self_loop_torch
    return kernel(state, rows, own, values)
