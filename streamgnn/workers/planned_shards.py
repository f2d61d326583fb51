"""Planned batches (`workers.planned`) for the shards of two or more partitions held in
one process on one device (`LocalWorkers`): every shard's supersteps planned on the host
before any device work, uploaded in one copy for all shards, run superstep by superstep
with the ghosts' rows copied device to device between them, and read back in one copy
(`run_together` returns with that copy started).

The host can plan all shards together because of the conservative frontier: shard q's
sources at superstep l + 1 are the rows it recomputed at l and the ghosts it holds whose
owners recomputed them at l or that it began to hold in the batch (a subscription: every
superstep sends it), so only slots cross between shards on the host, never rows. A ghost
whose row did not move sends a zero delta, as any source that did not move.

Before the first superstep, as the exchange before it does (`ghost_rows.outgoing` at
layer 0), the owners' features of the vertices whose features changed (or, for
degree-normalised layers, whose in-degree changed) and of those subscribed go to their
holders on the host: each ghost whose features differ (or that the batch added) joins
the first superstep's sources, with its features before; the in-degrees sent are stored
and those that differ join the vertices whose in-degree changed. Between supersteps, on
the device, each holder reads its joining ghosts' rows before (their messages'
differences read them), then the owners' new rows are copied in (`index_copy_`), with
index arrays from the one upload.

New ghosts, subscriptions, removed vertices and degree-normalised layers take this path
as they come; no batch falls back to the exchange of host bytes. MPI ranks keep their
own devices and exchange host bytes (`Shard.run_routed`).

Owns this coordination; must not import kafka or mpi4py, nor the superstep, pulls or
ghost-row parts of the shard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from torch import Tensor

from streamgnn.models.transfer import download_async
from streamgnn.workers.batch import ApplyResult
from streamgnn.workers.placement import Routed, held_by
from streamgnn.workers.planned import Planned, plans_layers
from streamgnn.workers.shard import Shard

T = TypeVar("T")


def plans_together(shards: list[Shard]) -> bool:
    """Whether the shards' batches run planned together: two or more, on one device,
    each one's layers planning (`plans_layers`)."""
    device = shards[0].tables.device
    return len(shards) > 1 and all(shard.tables.device == device
                                   and plans_layers(shard.tables) for shard in shards)


@dataclass
class _Sent:
    """Rows an owner sends a holder: the owner's slots ``src`` and the holder's ``dst``;
    ``fresh``: the holder's slots the batch added (no rows before)."""

    src: np.ndarray
    dst: np.ndarray
    fresh: np.ndarray


def run_together(shards: list[Shard], routed: list[Routed]
                 ) -> Callable[[], list[ApplyResult]]:
    """Every shard's share ``routed[p]`` of a batch, planned and run together (the
    module's docstring), its copy back started; returns what waits for it and gives their
    results."""
    close = _aborting(shards, lambda: _run(shards, routed))
    return lambda: _aborting(shards, close)


def _aborting(shards: list[Shard], work: Callable[[], T]) -> T:
    """``work()``; where it fails, the shards' batch aborted (it hands no rows on)."""
    try:
        return work()
    except BaseException:
        for shard in shards:
            shard.abort()
        raise


def _run(shards: list[Shard], routed: list[Routed]) -> Callable[[], list[ApplyResult]]:
    """`run_together`'s body."""
    begun = [shard.begin_together(r) for shard, r in zip(shards, routed, strict=True)]
    plans = [planned for _, planned in begun]
    layers = len(shards[0].layers)
    joined = _features(plans)
    sends: list[list[list[tuple[int, _Sent]]]] = []  # per hop, per holder: (owner, rows)
    for hop in range(1, layers + 1):
        for planned, (ghosts, old) in zip(plans, joined, strict=True):
            planned.plan(hop, ghosts, old)
        if hop < layers:
            held = [_held(owner, _region(owner)) for owner in plans]
            sends.append([[(p, sent) for p, owner in enumerate(plans) if p != q and len(
                (sent := _sent(owner, held[p], holder, q)).src)]
                for q, holder in enumerate(plans)])
            joined = [_joined([sent for _, sent in pairs]) for pairs in sends[-1]]
    arrays = {f"{p}/{name}": a for p, planned in enumerate(plans)
              for name, a in planned.arrays.items()}
    for hop, holders in enumerate(sends, start=1):
        for q, pairs in enumerate(holders):
            arrays[f"{hop}/{q}/old"] = _joined([sent for _, sent in pairs])[1]
            for p, sent in pairs:
                arrays[f"{hop}/{p}>{q}/src"], arrays[f"{hop}/{p}>{q}/dst"] = sent.src, sent.dst
    names = list(arrays)
    up = dict(zip(names, shards[0].tables.upload(*arrays.values()), strict=True))
    for p, planned in enumerate(plans):
        planned.take({name[len(f"{p}/"):]: t for name, t in up.items()
                      if name.startswith(f"{p}/")})
    for hop in range(1, layers + 1):
        for planned in plans:
            planned.step(hop)
        if hop < layers:
            _copy(plans, hop, sends[hop - 1], up)
    kept = [planned.kept() for planned in plans]
    pending = download_async(*(t for tensors in kept for t in tensors))

    def close() -> list[ApplyResult]:
        host, results, at = pending.wait(), [], 0
        for shard, (diff, _), tensors in zip(shards, begun, kept, strict=True):
            results.append(shard.finish_together(diff, host[at:at + len(tensors)]))
            at += len(tensors)
        return results
    return close


def _region(planned: Planned) -> np.ndarray:
    """The rows the last superstep planned recomputed (none where it reached none)."""
    plan = planned.hops[-1]
    return planned.b.removed[:0] if plan is None else plan.region


def _held(owner: Planned, moved: np.ndarray) -> np.ndarray:
    """Of the ``moved`` slots and those subscribed in the batch, the ones ``owner`` owns
    and another partition holds (`_sent` picks each holder's)."""
    tb = owner.tb
    slots = np.union1d(moved, owner.b.subscribed).astype(np.int64)
    return slots[tb.owned[slots] & (tb.holders[slots] != 0)]


def _sent(owner: Planned, held: np.ndarray, holder: Planned, q: int) -> _Sent:
    """The rows ``owner`` sends ``holder`` (partition ``q``): those of its slots ``held``
    (`_held`) that ``holder`` holds as ghosts."""
    tb = owner.tb
    slots = held[held_by(tb.holders[held], q)]
    dst = holder.tb.graph.find(tb.graph.ext[slots])
    ghost = dst >= 0
    ghost[ghost] = holder.tb.ghost[dst[ghost]]
    dst = dst[ghost].astype(np.int64)
    return _Sent(slots[ghost], dst, np.isin(dst, holder.b.added))


def _joined(sent: list[_Sent]) -> tuple[np.ndarray, np.ndarray]:
    """The ghosts ``sent`` that join the next superstep's sources (all), and those of
    them with rows before (not fresh), in the order their old rows come."""
    none = np.zeros(0, np.int64)
    return (np.concatenate([none, *(s.dst for s in sent)]),
            np.concatenate([none, *(s.dst[~s.fresh] for s in sent)]))


def _features(plans: list[Planned]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The exchange before the first superstep, on the host (the module's docstring):
    per shard, the ghosts joining the first superstep's sources and those of them with
    features before, which are added to its plan's ``x_before``."""
    degrees = any(layer.degree_normalised for layer in plans[0].tb.layers)
    held = [_held(owner, owner.tb.sets.union(owner.b.changed.old_slots,
                                             owner.b.edges.degree_changed)
                  if degrees else owner.b.changed.old_slots) for owner in plans]
    joined = []
    for q, holder in enumerate(plans):
        g, b = holder.tb.graph, holder.b
        ghosts, old, old_x, degree = [], [], [], []
        for p, owner in enumerate(plans):
            if p == q:
                continue
            sent = _sent(owner, held[p], holder, q)
            src, dst = sent.src, sent.dst
            before, after = g.x[dst], owner.tb.graph.x[src]
            g.x[dst] = after
            joins = (((before != after).any(axis=1) | sent.fresh)
                     & ~np.isin(dst, b.changed.slots))
            ghosts.append(dst[joins])
            old.append(dst[joins & ~sent.fresh])
            old_x.append(before[joins & ~sent.fresh])
            if degrees:
                weight = owner.tb.graph.in_weight[src]
                degree.append(dst[g.in_weight[dst] != weight])
                g.in_weight[dst] = weight
        none = b.removed[:0]
        ghosts, old = np.concatenate([none, *ghosts]), np.concatenate([none, *old])
        holder.arrays["x_before"] = np.concatenate([holder.arrays["x_before"], *old_x])
        if degree:
            b.edges.degree_changed = holder.tb.sets.union(b.edges.degree_changed,
                                                          np.concatenate(degree))
        joined.append((ghosts, old))
    return joined


def _copy(plans: list[Planned], hop: int, holders: list[list[tuple[int, _Sent]]],
          up: dict[str, Tensor]) -> None:
    """After superstep ``hop`` on every shard: each holder's rows before of the ghosts
    joining the next superstep, then the owners' new rows of them copied in."""
    for q, (holder, pairs) in enumerate(zip(plans, holders, strict=True)):
        if not pairs:
            continue
        holder.join(hop, up[f"{hop}/{q}/old"])
        table = holder.tb.stored(hop)
        for p, _ in pairs:
            rows = plans[p].tb.stored(hop).index_select(0, up[f"{hop}/{p}>{q}/src"])
            table.index_copy_(0, up[f"{hop}/{p}>{q}/dst"], rows)
