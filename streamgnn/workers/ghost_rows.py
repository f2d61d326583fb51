"""A shard's ghost rows: the rows of its vertices it sends the partitions holding them as
ghosts, and the rows it is sent of its own ghosts. As a routed batch begins, who holds
what (`begin_routed`); between supersteps, the rows of the layer just computed that
changed (`outgoing`) and those taken in, which join the next superstep's sources
(`incoming`); at bootstrap, a whole layer's (`layer_outgoing`, `layer_incoming`). Each
step is one `halo` kernel; the buffers are `exchange`'s wire format.

Owns the shard's side of the exchange; must not import kafka or mpi4py, nor the
superstep, fold, messages or pulls parts of the shard.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.models.layers import Layer
from streamgnn.workers.batch import Batch, Changed
from streamgnn.workers.exchange import Ghosts, pack, unpack
from streamgnn.workers.halo import begin_halo, rows_for, take_ghost_rows
from streamgnn.workers.placement import Routed, held_by
from streamgnn.workers.tables import Tables


def begin_routed(tb: Tables, diff: GraphDiff, routed: Routed, removed: np.ndarray,
                 added: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Who holds what once the coordinator's split ``routed`` of a batch (which made ``diff``
    on the shard's graph, removing and adding these slots) begins (`begin_halo`): the
    owned slots another partition now holds as ghosts, that partition, and the bytes of
    ghosts' features (and ids) the routed batch brought."""
    assert tb.ghost is not None, "a routed batch goes to a partition's shard"
    r, slots = routed, removed[:0]
    if len(r.ghosts) or len(r.subscribed) or len(r.unsubscribed) or len(removed) or len(added):
        unknown, slots = begin_halo(
            tb.graph.id_table, removed, added, r.ghosts, r.ghost_owners, r.subscribed,
            r.subscribers, r.unsubscribed, r.unsubscribers, tb.ghost, tb.ghost_owner,
            tb.holders, tb.owned, tb.graph.in_weight)
        if unknown >= 0:
            named = np.concatenate([r.ghosts, r.subscribed, r.unsubscribed])[unknown]
            raise RuntimeError(f"the coordinator named vertex {named}, which this "
                               "partition does not hold")
    ghost_rows = len(r.ghosts) + (int(np.count_nonzero(tb.ghost[diff.changed]))
                                  if len(diff.changed) else 0)
    return slots, r.subscribers, ghost_rows * (8 + tb.graph.x.itemsize
                                               * tb.graph.num_features)


def outgoing(tb: Tables, b: Batch, hop: int, partitions: int, me: int) -> list[np.ndarray]:
    """Per partition, packed (`exchange.pack`; empty for none), the rows of layer
    ``hop`` as stored (z where the shard keeps it) it holds as ghosts and whose h
    changed in the batch ``b`` (or that it began to hold). A ghost's z may lag its
    owner's where z moved and h did not: its activation is the same h, bit for bit.
    Features come with the routed batch: at layer 0 (degree-normalised layers only) the
    rows whose in-degree changed go, with it."""
    moved = b.edges.degree_changed if hop == 0 else b.changed.slots
    if tb.holders is None or not (len(moved) or len(b.subscribed)):
        return [np.zeros(0, np.uint8)] * partitions
    if hop == 0:
        table, in_weight = torch.from_numpy(tb.graph.x), tb.graph.in_weight
    else:
        table, in_weight = tb.stored(hop), None
    return rows_for(me, partitions, moved, tb.owned, tb.holders, b.subscribed,
                    b.subscribers, table, tb.graph.ext, in_weight, tb.sets.mark,
                    tb.sets.scratch)


def incoming(tb: Tables, b: Batch, hop: int, buffers: Sequence[np.ndarray]) -> None:
    """Take the ghost rows of layer ``hop`` other shards sent (as `outgoing` sends them,
    packed): ghosts whose row differs join the next superstep's sources (with their old
    rows of h), new ghosts join as fresh."""
    received = [g for g in map(unpack, (buf for buf in buffers if len(buf))) if len(g.ids)]
    if not received:
        return
    ids, rows = ((received[0].ids, received[0].rows) if len(received) == 1 else  # as sent
                 (np.concatenate([g.ids for g in received]),
                  np.concatenate([g.rows for g in received])))
    table = torch.from_numpy(tb.graph.x) if hop == 0 else tb.stored(hop)
    activation = (tb.layers[hop - 1].elementwise if hop > 0 and tb.z[hop - 1]
                  else "identity")  # h of a stored row
    c = b.changed
    unknown, slots, sources, old_slots, old = take_ghost_rows(
        tb.graph.id_table, ids, rows, table, activation == "relu", b.added, c.slots,
        c.old_slots, tb.sets.mark, tb.sets.scratch)
    if unknown >= 0:
        raise RuntimeError(f"ghost rows sent for vertex {ids[unknown]}, which this "
                           "partition does not hold")
    if activation is None:
        old = tb.layers[hop - 1].activate(old)
    b.changed = Changed(sources, old_slots, [*c.old_rows, tb.ours(old)])
    weights = [g.in_weight for g in received]
    if weights[0] is not None:  # (degree-normalised layers, before the first)
        w = np.concatenate(weights)
        degree = slots[tb.graph.in_weight[slots] != w]
        tb.graph.in_weight[slots] = w
        b.edges.degree_changed = tb.sets.union(b.edges.degree_changed, degree)


def layer_outgoing(graph: DynamicGraph, holders: np.ndarray, owned: np.ndarray,
                   rows: np.ndarray, me: int, partitions: int) -> list[np.ndarray]:
    """At bootstrap, per partition, packed: the ``rows`` (a whole layer as stored, by
    slot) of the vertices partition ``me`` owns and that partition holds as ghosts."""
    n = graph.num_slots
    sent = []
    for q in range(partitions):
        slots = np.flatnonzero(owned[:n] & held_by(holders[:n], q))
        sent.append(pack(Ghosts(graph.ext[slots], rows[slots])) if q != me else pack(None))
    return sent


def layer_incoming(graph: DynamicGraph, buffers: Sequence[np.ndarray], layer: Layer,
                   table: Tensor, out: Tensor, keeps_z: bool, device: torch.device,
                   dtype: torch.dtype) -> None:
    """At bootstrap, take the ghosts' rows of a whole layer other shards sent
    (`layer_outgoing`), in ``dtype`` on ``device``, into ``table`` (as stored) and, where
    that is the pre-activation (``keeps_z``), their activation into ``out`` (h, which the
    next layer reads)."""
    for g in map(unpack, buffers):
        if g is not None:
            index = torch.from_numpy(graph.slots(g.ids).astype(np.int64))
            with torch.inference_mode():
                got = torch.from_numpy(g.rows).to(device, dtype)
                table[index.to(device)] = got
                for a in range(0, len(index) if keeps_z else 0, 1 << 16):
                    rows = slice(a, a + (1 << 16))  # (a GB on a large graph)
                    out[index[rows].to(device)] = layer.activate(got[rows])
