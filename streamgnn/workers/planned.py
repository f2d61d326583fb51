"""`Planned`: a batch on a shard, off the CPU, planned on the host and run on the device
with two crossings: one upload of every index array and host row the batch's L
supersteps read, one download of what the host keeps (rows rewritten, labels, whether
every row is finite, the states' wear). Each layer is planned by its kind: linear
aggregations (sums, means, GCN's normalised sums, GIN) fold deltas; max, min and
attention are recomputed whole. At one partition the shard plans alone (`plan_all`);
the shards of several partitions in one process are planned superstep by superstep
together (`plan` with the ghosts joining), uploaded, run and read back together by
`planned_shards`, which copies the ghosts' rows between supersteps (`join`); tables by
row (`Tables.by_row`) are then read at their rows.

The host can plan every superstep before any device work because of a conservative
frontier: superstep l + 1's sources are all the rows superstep l recomputed, not only
those that moved. A source whose row did not move sends t of h_new - h_old = 0 (or, where
t is not taken of differences, a message and its exact negative), so the states stay
what the delta rule makes them; the regions are those a batch's L hops reach from its
changes, found from the graph alone (`superstep_region`). The index work is
`superstep_region`, `deltas.message_sources` and `deltas.linear_delta_messages`, as for
the CPU; on the device each superstep is a product, the fold (`fold_rows_tensors`) and
the activation or update, without reading anything back.

Max, min and attention: which states a delta could not fix (a max's last carrier left,
attention's destination moved or its denominator cancelled) is decided by values on the
device, which the host cannot plan. So every destination of such a layer's region is
recomputed from all its in-edges, as a pull does (`pulls.pull_arrays` on the host, its
arrays in the one upload; `pulls.pulled` on the device, reduced from each in-edge's
destination): the states with max/min's ties or attention's packed partials, stored,
then the rows. Exact by construction, with no fold and no wear (a fresh state has no
drift); kept t (attention) is brought up to date for the superstep's sources first. It
costs the region's in-degree sum, gathered and reduced in bulk on the device.

Wear (`SumAggregation`): it comes back with the download, measured against
`SumAggregation.late_limit`; the rows it picks (`SumAggregation.re_anchored`) are
recomputed from all their in-neighbors in the next batch, in the superstep that folds
them (added to its region, their in-edges in that batch's upload, as `pulls.pulled`
recomputes them). The picks live in the tables between batches (`Tables.reanchor`, kept
in checkpoints, so a restored shard re-anchors when the original would have).

Counts (`ApplyResult`): ``recomputed`` counts the conservative regions, larger than the
CPU path's; ``pulled`` the rows re-anchored, and for max, min and attention the whole
regions.

Owns this plan and run; must not import kafka or mpi4py, nor the superstep or ghost-row
parts of the shard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from streamgnn.models.aggr import PackedSoftmax
from streamgnn.models.rowops import (
    difference_table_tensors,
    fill_rows_tensors,
    fold_rows_tensors,
    ones,
)
from streamgnn.models.transfer import download_async
from streamgnn.workers.batch import ApplyResult, Batch
from streamgnn.workers.deltas import linear_delta_messages
from streamgnn.workers.deltas import message_sources as find_sources
from streamgnn.workers.fold import mean_rescaled, root_messages
from streamgnn.workers.labels import ChangedLabels, relabel_
from streamgnn.workers.pulls import pull_arrays, pulled
from streamgnn.workers.region import NO_GHOSTS, superstep_region
from streamgnn.workers.tables import Tables

on_cpu = False
"""Whether shards on the CPU plan their batches too (tests set it with the device
kernels forced: what a device batch runs, on CPU tensors)."""


def plans(tb: Tables) -> bool:
    """Whether the shard's batches run planned on their own: one partition (no ghosts;
    partitions held in one process plan together, `planned_shards`) whose layers plan
    (`plans_layers`)."""
    return tb.ghost is None and plans_layers(tb)


def plans_layers(tb: Tables) -> bool:
    """Whether the shard's layers plan: tables off the CPU (or `on_cpu`), every layer's
    states kept (not RC); a linear aggregation's with no t kept and no root term kept
    beside a table of h (any other is recomputed whole)."""
    if tb.device.type == "cpu" and not on_cpu:
        return False
    return all(state is not None and (not layer.aggr.linear or (
        t is None and (z or root is None) and not (z and layer.degree_normalised)))
               for layer, state, t, z, root in zip(tb.layers, tb.state, tb.t, tb.z, tb.root,
                                                  strict=True))


@dataclass
class _Hop:
    """One superstep's plan on the host: its ``region`` (sorted slots), which of it the
    batch ``added`` (``fresh``), the positions in it pulled (``anchored``), the table of
    t's layout (``differences``: t of h after, before and their difference, `difference_rows`;
    ``paired`` rows with root terms) and whether the sources' factors are computed on the
    device (``scaled``: degree-normalised layers)."""

    region: np.ndarray
    fresh: np.ndarray
    anchored: np.ndarray
    differences: bool
    paired: int
    scaled: bool


class Planned:
    """One batch of a shard that `plans`: planned and uploaded when made, run superstep
    by superstep (`step`), read back at its end (`finish`: the copy started, the batch
    closed when it is done)."""

    def __init__(self, tb: Tables, b: Batch, changed_x_before: np.ndarray,
                 removed_x: np.ndarray) -> None:
        """The plan of batch ``b`` (its graph changes made, its slots placed), before its
        supersteps are planned (`plan`): the rows before the batch of the vertices whose
        features changed (``changed_x_before``) and of those it removed (``removed_x``).
        The rows the last batch's wear picked (`Tables.reanchor`) are re-anchored in it."""
        self.tb, self.b = tb, b
        self.arrays: dict[str, np.ndarray] = {"x_before": changed_x_before,
                                              "removed_x": removed_x, "removed": b.removed}
        self.arrays.update({f"added/{k}": tb.added_rows(k, b.added)
                            for k in range(1, len(tb.layers) + 1)})
        self.hops: list[_Hop | None] = []
        self.sources = (b.changed.slots, b.changed.old_slots)  # the next superstep's
        self.wear: list[Tensor] = []
        self.finite: list[Tensor] = []
        self.last: Tensor | None = None  # the last superstep's rows

    def plan_all(self) -> None:
        """Plan every superstep (`plan`) and upload the plan (`take`)."""
        for hop in range(1, len(self.tb.layers) + 1):
            self.plan(hop)
        names = list(self.arrays)
        self.take(dict(zip(names, self.tb.upload(*self.arrays.values()), strict=True)))

    def plan(self, hop: int, joined: np.ndarray | None = None,
             joined_old: np.ndarray | None = None) -> None:
        """Plan superstep ``hop``: its sources are the rows the superstep before
        recomputed and the ghosts ``joined`` (their rows sent before it), of which
        ``joined_old`` had rows before the batch, whose old rows come after the others'
        (at the first superstep in ``x_before`` of `arrays`; then by `join`)."""
        changed, old_slots = self.sources
        if joined is not None:
            changed = np.concatenate([changed, joined])
            old_slots = np.concatenate([old_slots, joined_old])
        stale = self.tb.reanchor[hop - 1] if self.tb.reanchor else self.b.removed[:0]
        plan = self._plan(hop, changed, old_slots, stale)
        self.hops.append(plan)
        none = self.b.removed[:0]
        self.sources = ((none, none) if plan is None
                        else (plan.region, plan.region[~plan.fresh]))

    def take(self, up: dict[str, Tensor]) -> None:
        """Take the upload of the arrays planned (`arrays`, by name, on the device)."""
        self.up = up
        self.old = self.tb.ours(up["x_before"])  # rows before of the next step's sources
        self.removed_rows = self.tb.ours(up["removed_x"])

    def join(self, hop: int, old: Tensor) -> None:
        """Read the rows of h^hop before the batch of the ghosts joining superstep
        ``hop + 1``'s sources with rows before (``joined_old`` of its `plan`; ``old``:
        their slots, uploaded), before their owners' new rows are copied in."""
        self.old = torch.cat([self.old, self._rows(hop, old)])

    # ---------------------------------------------------------------- host
    def _add(self, hop: int, **arrays: np.ndarray) -> None:
        """Arrays for superstep ``hop``, to go with the batch's upload."""
        self.arrays.update({f"{hop}/{name}": a for name, a in arrays.items()})

    def _read(self, layer: int, slots: np.ndarray) -> np.ndarray:
        """What the device needs to read h^layer of ``slots``: their features' rows at
        layer 0, the slots above (`_rows`)."""
        return self.tb.graph.x[slots] if layer == 0 else slots

    def _plan(self, hop: int, changed: np.ndarray, old_slots: np.ndarray,
              stale: np.ndarray) -> _Hop | None:
        """Superstep ``hop``'s plan, its arrays added to the upload: sources ``changed``
        (those with rows before the batch: ``old_slots``, in the order of those rows)
        and, for degree-normalised layers, the vertices whose in-degree changed; the
        ``stale`` rows re-anchored. A layer whose aggregation is not linear has its
        region's states recomputed whole (`_plan_pull`). None where it reaches no
        vertex."""
        tb, b = self.tb, self.b
        g, layer, edges = tb.graph, tb.layers[hop - 1], b.edges
        sources = (tb.sets.union(changed, edges.degree_changed) if layer.degree_normalised
                   else np.asarray(changed, np.int64))
        if not (len(sources) or len(edges.dst) or len(stale)):
            return None
        keeps_z = tb.z[hop - 1]
        at, v1, w1, region, count, fresh, _, _ = superstep_region(
            g.out.arrays, sources, edges.keys, edges.dst,
            np.concatenate([changed, stale]).astype(np.int64), tb.owned, g.in_degree,
            b.added, edges.src, b.removed, False, tb.sets.mark, tb.sets.scratch, edges.had,
            edges.has, *NO_GHOSTS)
        if not len(region):
            return None
        if layer.aggr.linear:
            differences, paired = self._plan_messages(hop, changed, old_slots, sources, at,
                                                      v1, w1, region, count)
            divisor = ones(len(region)) if keeps_z else layer.aggr.divisor(count)
            self._add(hop, region=region, divisor=divisor)
            anchored = np.flatnonzero(tb.sets.find(stale, region) >= 0 if len(stale)
                                      else fresh[:0])
        else:  # all of it recomputed, from all its in-edges
            differences, paired, anchored = False, 0, np.arange(len(region))
            self._add(hop, region=region)
            if tb.t[hop - 1] is not None:  # t kept: the sources' rows first
                self._add(hop, t_slots=changed, t_read=self._read(hop - 1, changed))
        if tb.ghost is not None:  # tables by row (`Tables.by_row`)
            self._add(hop, state_at=tb.rows_at(hop, region), h_at=tb.h_at(hop, region))
        if len(anchored):
            self._plan_pull(hop, region[anchored], anchored)
        if not keeps_z:  # the update reads the region's own rows and in-degrees
            self._add(hop, own=self._read(hop - 1, region), weight=g.in_weight[region])
        if hop < len(tb.layers):
            self._add(hop, kept=np.flatnonzero(~fresh))
        return _Hop(region, fresh, anchored, differences, paired, layer.degree_normalised)

    def _plan_messages(self, hop: int, changed: np.ndarray, old_slots: np.ndarray,
                       sources: np.ndarray, at: np.ndarray, v1: np.ndarray, w1: np.ndarray,
                       region: np.ndarray, count: np.ndarray) -> tuple[bool, int]:
        """Superstep ``hop``'s messages into ``region`` (in-degrees ``count``) from
        ``sources`` along their unchanged out-edges ``sources[at] -> v1`` (weights ``w1``)
        and the changed edges, as `fold` lists them (`linear_delta_messages`), with the
        rows of h they read and their table's layout; returns whether the table holds
        differences (`difference_rows`) and its rows with root terms. A degree-normalised
        layer's factors are found on the device: a message's coefficient is linear in its
        source's factors after and before the batch, so the host lists it twice (factors
        1, 0 and 0, 1) with the source it reads, and the device combines the two."""
        tb, b = self.tb, self.b
        g, layer, edges = tb.graph, tb.layers[hop - 1], b.edges
        keeps_z = tb.z[hop - 1]
        mean_z = keeps_z and layer.aggr.name == "mean"
        rescaled, at_region, a = (mean_rescaled(tb, b, region, count) if mean_z
                                  else (None, None, None))
        own_slots = changed[tb.owned[changed]] if keeps_z else None
        dst_scale = (np.divide(1.0, count, out=np.zeros(len(count)), where=count > 0)
                     if mean_z else ones(len(region)))
        none = sources[:0]
        differences = not layer.degree_normalised
        (slots, at1, at2, has, had, own, extra_at, prior, new, old, delta, fresh, taken,
         moved, dest, paired) = find_sources(
            sources, at, edges.src, edges.dst, edges.has, edges.had, g.alive, old_slots,
            b.removed, none if rescaled is None else rescaled,
            none if own_slots is None else own_slots, differences, tb.sets.mark,
            tb.sets.scratch)
        if differences:
            self._add(hop, read=self._read(hop - 1, np.concatenate([slots[fresh],
                                                                    slots[moved]])),
                      taken=prior[taken], moved=prior[moved], dest=dest)
        else:
            self._add(hop, read=self._read(hop - 1, slots))

        def messages(scale_new: np.ndarray, scale_old: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            return linear_delta_messages(
                new, old, delta, at1, v1, w1, at2, edges.dst, edges.before, edges.after,
                has, had, layer.edge_weighted, scale_new, scale_old, region, dst_scale,
                tb.sets.scratch, None if own_slots is None else own, own_slots, paired)

        n = len(slots)
        if layer.degree_normalised:
            rows, coef_new, local = messages(ones(n), np.zeros(n))
            owner = np.empty(len(old_slots) + len(b.removed), np.int64)  # of each row before
            has_prior = np.flatnonzero(prior >= 0)
            owner[prior[has_prior]] = has_prior
            source, before = rows.copy(), rows >= n
            source[before] = owner[rows[before] - n]
            self._add(hop, coef_new=coef_new, coef_old=messages(np.zeros(n), ones(n))[1],
                      source=source,
                      in_weight=np.stack([g.in_weight[slots], tb.in_weight[slots]]))
            coef = None
        else:
            rows, coef, local = messages(ones(n), ones(n))
        scale = ones(len(region))
        if mean_z and len(a):
            rows, coef, local, scale = root_messages(rows, coef, local, old[extra_at],
                                                     at_region, a, len(region))
        if coef is not None:
            self._add(hop, coef=coef)
        self._add(hop, rows=rows, local=local, scale=scale)
        return differences, int(paired)

    def _plan_pull(self, hop: int, slots: np.ndarray, anchored: np.ndarray) -> None:
        """The arrays recomputing the states of ``slots`` (at ``anchored`` in the region)
        from all their in-edges reads, as `pulls.pull_arrays` lists them (named
        ``pull_*`` here), with each in-edge's destination (``pull_local``)."""
        arrays, ptr, _ = pull_arrays(self.tb, hop, self.tb.layers[hop - 1], slots)
        self._add(hop, anchored=anchored, pull_local=np.repeat(np.arange(len(slots)),
                                                               np.diff(ptr)),
                  **{f"pull_{name}": a for name, a in arrays.items()})

    # ---------------------------------------------------------------- device
    def _rows(self, layer: int, read: Tensor) -> Tensor:
        """h^layer of the slots `_read` planned (``read``, uploaded): their features'
        rows at layer 0; above, rows of the stored table, activated where it is z."""
        tb = self.tb
        if layer == 0:
            return tb.ours(read)
        if tb.z[layer - 1]:
            return tb.layers[layer - 1].activate(tb.state[layer - 1].index_select(0, read))
        return tb.h[layer].index_select(0, read)

    def step(self, hop: int) -> None:
        """Superstep ``hop`` on the device, as planned; its counts go to the batch's
        result."""
        tb, result = self.tb, self.b.result
        layer, plan = tb.layers[hop - 1], self.hops[hop - 1]
        if hop == 1 and len(self.b.added):  # reused slots and rows: start empty
            for k, z in enumerate(tb.z):  # (others' states are recomputed whole)
                if tb.layers[k].aggr.linear:
                    fill_rows_tensors([tb.state[k], tb.drift[k]], self.up[f"added/{k + 1}"],
                                      [tb.layers[k].empty_preactivation() if z else None,
                                       None])
        last = hop == len(tb.layers)
        if plan is None:
            self._reached_nothing(hop, last)
            return
        up = {name.split("/")[1]: t for name, t in self.up.items()
              if name.startswith(f"{hop}/")}
        keeps_z = tb.z[hop - 1]
        if layer.aggr.linear:
            agg, wear, before = self._folded(hop, up)
        else:
            agg, before = self._recomputed(hop, up), None
            wear = torch.empty(0, dtype=torch.float64, device=tb.device)
        if keeps_z:
            after = layer.activate(agg)
            old_next = None if last else layer.activate(before.index_select(0, up["kept"]))
        else:
            own = self._rows(hop - 1, up["own"])
            t_own = tb.t_rows(hop, layer, up["region"], own) if layer.self_transform else None
            after = layer.update(own, agg, t_own, tb.ours(up["weight"]))
            old_next = None if last else tb.h[hop].index_select(0, up["region"])[up["kept"]]
            tb.h[hop].index_copy_(0, up.get("h_at", up["region"]), after)
        self.wear.append(wear)
        self.finite.append(torch.isfinite(after).all())
        if not last:
            self.old = old_next
            if len(self.b.removed):
                self.removed_rows = self._rows(hop, self.up["removed"])
        self.last = after
        result.record_step(plan.region, after, len(plan.region), len(plan.anchored))

    def _folded(self, hop: int, up: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """A linear superstep ``hop``'s messages folded into the region's states, the
        planned rows re-anchored: the region's finalized states (z where it is kept),
        their wear and their states before the fold."""
        tb, layer, plan = self.tb, self.tb.layers[hop - 1], self.hops[hop - 1]
        keeps_z = tb.z[hop - 1]
        old = self.old if not len(self.b.removed) else torch.cat([self.old, self.removed_rows])
        rows = self._rows(hop - 1, up["read"])
        rows = (difference_table_tensors(rows, old, up["taken"], up["moved"], up["dest"])
                if plan.differences else torch.cat([rows, old]))
        t = layer.rel_root(rows, plan.paired) if keeps_z else layer.transform(rows)
        if plan.scaled:  # the sources' factors after and before the batch
            scale = layer.source_scale(up["in_weight"])
            source = up["source"]
            coef = (up["coef_new"] * scale[0].index_select(0, source)
                    + up["coef_old"] * scale[1].index_select(0, source))
        else:
            coef = up["coef"]
        state, drift = tb.state[hop - 1], tb.drift[hop - 1]
        bias = (layer.empty_preactivation().to(torch.float64)
                if keeps_z and layer.aggr.name == "mean" else
                state.new_zeros(state.shape[1], dtype=torch.float64))
        agg, wear, before = fold_rows_tensors(state, drift, t, up["rows"], coef, up["local"],
                                              up.get("state_at", up["region"]),
                                              up["divisor"], up["scale"], bias,
                                              layer.aggr.late_limit)
        agg = tb.ours(agg)
        if len(plan.anchored):  # (their wear is that of the fold the pull replaced)
            pull = self._pulled(hop, up)
            agg[up["anchored"]] = (pull if keeps_z else layer.aggr.finalize(
                pull, up["pull_count"])).to(agg.dtype)
            wear[up["anchored"]] = 0.0
        return agg, wear, before

    def _recomputed(self, hop: int, up: dict[str, Tensor]) -> Tensor | PackedSoftmax:
        """The region of a superstep ``hop`` whose aggregation is not linear, its states
        recomputed from all its in-edges (`_pulled`; t kept first brought up to date for
        the sources): its finalized states, read from the stored ones as the CPU reads
        them (a tensor, or attention's packed states)."""
        tb, layer = self.tb, self.tb.layers[hop - 1]
        kept = tb.t[hop - 1]
        if kept is not None:
            kept[up["t_slots"]] = layer.transform(self._rows(hop - 1, up["t_read"]))
        self._pulled(hop, up)
        return layer.aggr.finalize_stored(tb.state[hop - 1], up.get("state_at", up["region"]),
                                          up["pull_count"]).to(tb.dtype)

    def _pulled(self, hop: int, up: dict[str, Tensor]) -> Tensor:
        """The states `_plan_pull` planned, computed on the device and stored
        (`pulls.pulled`, reduced from each in-edge's destination); returns what is
        stored."""
        pull = {name.removeprefix("pull_"): t for name, t in up.items()
                if name.startswith("pull_")}
        return pulled(self.tb, hop, self.tb.layers[hop - 1], pull, None)

    def _reached_nothing(self, hop: int, last: bool) -> None:
        """Superstep ``hop`` where its messages reach no vertex: no rows, no counts."""
        tb, result = self.tb, self.b.result
        width = tb.layers[hop - 1].out_dim
        nothing = torch.empty((0, width), dtype=tb.dtype, device=tb.device)
        result.record_step(self.b.removed[:0], nothing)
        self.wear.append(torch.empty(0, dtype=torch.float64, device=tb.device))
        self.finite.append(torch.ones((), dtype=torch.bool, device=tb.device))
        if not last:
            self.old = nothing
            if len(self.b.removed):
                self.removed_rows = self._rows(hop, self.up["removed"])
        self.last = nothing

    def finish(self) -> Callable[[], ApplyResult]:
        """Start the batch's one copy back (`kept`); returns what waits for it and closes
        the batch (`finished`)."""
        pending = download_async(*self.kept())
        return lambda: self.finished(pending.wait())

    def kept(self) -> list[Tensor]:
        """What the host keeps of the batch: its rows, finiteness, wear and labels."""
        hops = self.b.result.rewritten[1:]
        labels = [] if self.hops[-1] is None else [self.last.argmax(-1)]
        return [*(rows for _, rows in hops), torch.stack(self.finite), *self.wear, *labels]

    def finished(self, host: list[np.ndarray]) -> ApplyResult:
        """Close the batch with ``host``, `kept` copied back. Returns its result (label
        changes, counts, the first layer it drove to NaN or inf); the rows its wear
        picks, per layer, go to `Tables.reanchor` for the next batch."""
        tb, b = self.tb, self.b
        result, plan = b.result, self.hops[-1]
        hops = result.rewritten[1:]
        count = len(hops)
        result.rewritten[1:] = [(slots, rows) for (slots, _), rows
                                in zip(hops, host[:count], strict=True)]
        finite, wear = host[count], host[count + 1:count + 1 + len(self.wear)]
        if not finite.all():
            result.non_finite = int(np.argmin(finite)) + 1
        if plan is not None:
            new = host[-1]
            at, old = relabel_(tb.labels, tb.own_rows(plan.region), new, plan.fresh)
            result.changed_labels = ChangedLabels(tb.graph.ext[plan.region[at]], old, new[at])
        stale = [b.removed[:0] if p is None else p.region[layer.aggr.re_anchored(w)]
                 for layer, p, w in zip(tb.layers, self.hops, wear, strict=True)]
        tb.reanchor = stale
        return result
