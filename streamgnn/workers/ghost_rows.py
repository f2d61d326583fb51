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
from streamgnn.graph.batch import find_sorted
from streamgnn.models.layers import Layer
from streamgnn.updates import ADD_VERTEX, DELETE_VERTEX
from streamgnn.workers.batch import Batch, Changed
from streamgnn.workers.exchange import Ghosts, pack, sizes, unpack
from streamgnn.workers.halo import begin_halo, rows_for, take_ghost_rows
from streamgnn.workers.placement import Routed, held_by
from streamgnn.workers.tables import Tables


def begin_routed(tb: Tables, diff: GraphDiff, routed: Routed, removed: np.ndarray,
                 added: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Who holds what once this partition's share ``routed`` of a batch (which made
    ``diff`` on the shard's graph, removing and adding these slots) begins (`begin_halo`):
    the ghosts its edges added (the added slots no vertex addition of the share made),
    owned by the source owners the directory named; the owned slots another partition may
    now hold (each sent its rows), and that partition. Returns those, and the bytes of
    ghosts' ids the share brought."""
    assert tb.ghost is not None, "a routed batch goes to a partition's shard"
    r, ext = routed, tb.graph.ext
    brought = 8 * (len(r.ghosts) + len(r.subscribed))
    if not (len(added) or len(removed) or len(r.subscribed) or len(r.unsubscribed)):
        return removed, removed, brought  # (a share that changes no vertex's holders)
    ghosts, ghost_owners = _new_ghosts(r, ext[added])
    alive_owned = tb.graph.find(r.subscribed)
    keep = alive_owned >= 0
    keep[keep] &= ~tb.ghost[alive_owned[keep]] | np.isin(alive_owned[keep], added)
    subscribed, subscribers = r.subscribed[keep], r.subscribers[keep]
    known = tb.graph.find(r.unsubscribed) >= 0
    unsubscribed, unsubscribers = r.unsubscribed[known], r.unsubscribers[known]
    slots = removed[:0]
    if len(ghosts) or len(subscribed) or len(unsubscribed) or len(removed) or len(added):
        unknown, slots = begin_halo(
            tb.graph.id_table, removed, added, ghosts, ghost_owners, subscribed,
            subscribers, unsubscribed, unsubscribers, tb.ghost, tb.ghost_owner,
            tb.holders, tb.owned, tb.graph.in_weight)
        assert unknown < 0, "the ids were looked up"
    return slots, subscribers, brought


def _new_ghosts(r: Routed, added_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Among the ids of the added slots, those an edge added (a ghost): every one but the
    ids whose last vertex update in the share is an addition; with the owner the
    directory named for the last edge from each."""
    op, ids = r.batch.op, r.batch.src
    vertex = (op == ADD_VERTEX) | (op == DELETE_VERTEX)
    keys, last = _last_of(ids[vertex], op[vertex])
    at, added_last = find_sorted(keys, added_ids)  # its last vertex update: an addition
    added_last[added_last] = last[at[added_last]] == ADD_VERTEX
    ghosts = added_ids[~added_last].astype(np.int64)
    keys, owner = _last_of(r.ghosts, r.ghost_owners)
    return ghosts, owner[find_sorted(keys, ghosts)[0]].astype(np.int64)


def _last_of(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``keys``, ascending, and each one's value at its last occurrence."""
    distinct, first_from_end = np.unique(keys[::-1], return_index=True)
    return distinct, values[len(keys) - 1 - first_from_end]


def outgoing(tb: Tables, b: Batch, hop: int, partitions: int, me: int) -> list[np.ndarray]:
    """Per partition, packed (`exchange.pack`; empty for none), the rows of layer
    ``hop`` as stored (z where the shard keeps it) it holds as ghosts and whose h
    changed in the batch ``b`` (or that it began to hold). A ghost's z may lag its
    owner's where z moved and h did not: its activation is the same h, bit for bit.
    Features come with the routed batch: at layer 0 (degree-normalised layers only) the
    rows whose in-degree changed go, with it."""
    degrees = any(layer.degree_normalised for layer in tb.layers)
    if hop > 0:
        moved = b.changed.slots
    elif degrees:
        moved = tb.sets.union(b.changed.old_slots, b.edges.degree_changed)
    else:
        moved = b.changed.old_slots
    if tb.holders is None or not (len(moved) or len(b.subscribed)):
        return [np.zeros(0, np.uint8)] * partitions
    if hop == 0:
        table = torch.from_numpy(tb.graph.x)
        in_weight = tb.graph.in_weight if degrees else None
    else:
        table, in_weight = tb.stored(hop), None
    return rows_for(me, partitions, moved, tb.owned, tb.holders, b.subscribed,
                    b.subscribers, table, tb.graph.ext, in_weight, tb.sets.mark,
                    tb.sets.scratch)


def incoming(tb: Tables, b: Batch, hop: int, buffers: Sequence[np.ndarray]) -> None:
    """Take the ghost rows of layer ``hop`` other shards sent (as `outgoing` sends them,
    packed), read from the buffers as they lie: each id looked up once, each row copied
    once, into the table. Ghosts whose row differs join the next superstep's sources (with
    their old rows of h), new ghosts join as fresh; rows of vertices the shard no longer
    holds as ghosts are not taken. ``buffers``: a list, or an `exchange.Arriving` sequence,
    each buffer taken as it arrives."""
    if not any(sizes(buffers)):
        return
    table = torch.from_numpy(tb.graph.x) if hop == 0 else tb.stored(hop)
    activation = (tb.layers[hop - 1].elementwise if hop > 0 and tb.z[hop - 1]
                  else "identity")  # h of a stored row
    c = b.changed
    sources, old_slots, old, degree, weighted = take_ghost_rows(
        buffers, tb.graph.id_table, tb.ghost, tb.graph.in_weight, table, activation == "relu",
        b.added, c.slots, c.old_slots, tb.sets.mark, tb.sets.scratch)
    if activation is None:
        old = tb.layers[hop - 1].activate(old)
    b.changed = Changed(sources, old_slots, [*c.old_rows, tb.ours(old)])
    if weighted:  # (degree-normalised layers, before the first)
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
