"""The ``streamgnn`` command: datasets, training, bootstrap and the demo.

Owns argument parsing and terminal output only; the work lives in the subpackages.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="streamgnn: exact, incremental GNN inference over a streaming graph.\n\n"
    "Typical flow: `streamgnn train` a model on a dataset's snapshot, then "
    "`streamgnn bootstrap` every layer's embeddings from the checkpoint. "
    "`streamgnn demo` runs the whole flow on a synthetic graph.",
    no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_show_locals=False)
datasets_app = typer.Typer(help="Generate and inspect graphs.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")
console = Console()

DatasetOpt = Annotated[str, typer.Option(
    "--dataset", "-d", envvar="STREAMGNN_DATASET",
    help="Synthetic preset (tiny, small, arxiv-like, products-like), a .npz written by "
         "`streamgnn datasets generate`, or an OGB node dataset directory.")]
SeedOpt = Annotated[int, typer.Option("--seed", envvar="STREAMGNN_SEED",
                                      help="Seed for generation and splits.")]
HoldoutOpt = Annotated[float, typer.Option(
    "--holdout", help="Fraction of vertices held out of the snapshot as the update "
                      "stream (RIPPLE++ protocol: 0.2). 0 uses the whole graph.")]
DeviceOpt = Annotated[str, typer.Option("--device", envvar="STREAMGNN_DEVICE",
                                        help="torch device for dense work: cpu or cuda.")]


def _snapshot(dataset: str, seed: int, holdout: float):
    from streamgnn.datasets import open_dataset, split_stream

    """(the whole graph, the snapshot to start from, the held-out updates)."""
    t = time.perf_counter()
    full = open_dataset(dataset, seed)
    console.print(f"[bold]{full}[/] loaded in {time.perf_counter() - t:.1f} s")
    if holdout <= 0:
        return full, full, []
    data, events = split_stream(full, holdout, seed)
    console.print(f"snapshot: {data.num_vertices:,} vertices, {data.num_edges:,} edges; "
                  f"{len(events):,} held-out updates")
    return full, data, events


@datasets_app.command("generate")
def datasets_generate(
    preset: Annotated[str, typer.Argument(help="tiny, small, arxiv-like or products-like")],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Where to write the .npz.")] = None,
    seed: SeedOpt = 0,
) -> None:
    """Generate a synthetic preset and save it as .npz."""
    from streamgnn.datasets import save, synthetic

    t = time.perf_counter()
    data = synthetic(preset, seed)
    elapsed = time.perf_counter() - t
    path = save(data, out or Path(f"{preset}-seed{seed}.npz"))
    console.print(f"{data} generated in {elapsed:.1f} s -> {path}")


@datasets_app.command("info")
def datasets_info(dataset: DatasetOpt = "tiny", seed: SeedOpt = 0) -> None:
    """Print size, degree skew and label balance of a dataset."""
    import numpy as np

    from streamgnn.datasets import open_dataset

    data = open_dataset(dataset, seed)
    indeg = np.bincount(data.positions(data.dst), minlength=data.num_vertices)
    table = Table(title=str(data))
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in [("mean in-degree", f"{indeg.mean():.2f}"),
                 ("max in-degree", f"{indeg.max():,}"),
                 ("p99 in-degree", f"{np.percentile(indeg, 99):.0f}"),
                 ("vertices with no in-edge", f"{(indeg == 0).mean():.1%}")]:
        table.add_row(k, v)
    console.print(table)


@app.command()
def train(
    dataset: DatasetOpt = "arxiv-like",
    model: Annotated[str, typer.Option("--model", "-m", help="gcn, sage-mean, sage-sum, "
                                       "sage-max, graphconv-sum, graphconv-mean, "
                                       "graphconv-max, gin, gat")] = "sage-mean",
    hidden: Annotated[int, typer.Option(help="Hidden width.")] = 128,
    layers: Annotated[int, typer.Option(help="Number of GNN layers.")] = 2,
    epochs: Annotated[int, typer.Option(help="Full-batch training epochs.")] = 100,
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint path.")] = Path(
        "artifacts/model.pt"),
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
) -> None:
    """Train a model on the dataset's snapshot, next to an MLP baseline; save a checkpoint."""
    _train(dataset, model, hidden, layers, epochs, out, holdout, seed)


def _train(dataset, model, hidden, layers, epochs, out, holdout, seed):
    from streamgnn.models.train import train as fit
    from streamgnn.models.zoo import ModelSpec

    full, data, events = _snapshot(dataset, seed, holdout)
    spec = ModelSpec(model, data.num_features, data.num_classes, hidden, layers)
    result = fit(data, spec, epochs=epochs, seed=seed)
    table = Table(title=f"{model} on {data.name} ({epochs} epochs, {result.seconds:.1f} s)")
    for col in ("model", "train", "val", "test"):
        table.add_column(col, justify="right")
    for name, acc in ((model, result.gnn), ("MLP (same features)", result.mlp)):
        table.add_row(name, f"{acc.train:.3f}", f"{acc.val:.3f}", f"{acc.test:.3f}")
    console.print(table)
    console.print(f"checkpoint -> {result.checkpoint.save(out)}")
    return full, data, events, result


@app.command()
def bootstrap(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="From `train`.")] = Path(
        "artifacts/model.pt"),
    dataset: DatasetOpt = "arxiv-like",
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """Compute every layer's embedding of every vertex (layer-wise full inference) and
    compare its time with PyG's own forward pass."""
    from streamgnn.models.zoo import Checkpoint

    _, data, _ = _snapshot(dataset, seed, holdout)
    _bootstrap(data, Checkpoint.load(checkpoint).model(), device)


def _bootstrap(data, model, device: str) -> None:
    import torch

    from streamgnn.graph import DynamicGraph
    from streamgnn.models import decompose, layerwise_inference
    from streamgnn.models.gnn import WEIGHTED_CONVS

    t = time.perf_counter()
    graph = DynamicGraph.from_data(data)
    t_graph = time.perf_counter() - t
    model = model.to(device)
    t = time.perf_counter()
    hs = layerwise_inference(decompose(model), graph, device=device)
    t_ours = time.perf_counter() - t
    g = data.to_pyg().to(device)
    weighted = any(isinstance(m, WEIGHTED_CONVS) for m in model.modules())
    t = time.perf_counter()
    with torch.inference_mode():
        ref = model(g.x, g.edge_index, edge_weight=g.edge_weight if weighted else None)
    t_pyg = time.perf_counter() - t
    err = (hs[-1] - ref).abs().max().item()
    table = Table(title=f"bootstrap of {data.name} ({device})")
    table.add_column("step")
    table.add_column("value", justify="right")
    rows = [("graph store load", f"{t_graph:.2f} s"),
            ("layer-wise inference (all layers)", f"{t_ours:.2f} s"),
            ("PyG forward pass (edge_index)", f"{t_pyg:.2f} s"),
            ("ratio ours / PyG", f"{t_ours / t_pyg:.2f}x"),
            ("max |ours - PyG|", f"{err:.2e}")]
    if data.y is not None:
        y = torch.from_numpy(data.y).to(device)
        acc = (hs[-1].argmax(-1) == y).float().mean().item()
        rows.append(("accuracy of bootstrapped labels (all vertices)", f"{acc:.3f}"))
    for r in rows:
        table.add_row(*r)
    console.print(table)


@app.command()
def demo(
    dataset: DatasetOpt = "arxiv-like",
    model: Annotated[str, typer.Option("--model", "-m")] = "sage-mean",
    epochs: Annotated[int, typer.Option()] = 40,
    batch_size: Annotated[int, typer.Option(help="Updates per engine batch.")] = 1000,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """Synthesize a graph, train a model on its 80 % snapshot, bootstrap all layer
    embeddings, then stream the held-out 20 % through the incremental engine; print
    accuracy, timings and how far the engine is from PyG's forward pass."""
    out = Path("artifacts") / f"{model}-{dataset}.pt"
    full, data, events, result = _train(dataset, model, 128, 2, epochs, out, 0.2, seed)
    _bootstrap(data, result.checkpoint.model(), device)
    _stream(full, data, events, result.checkpoint.model(), device, batch_size)


def _stream(full, snapshot, events, model, device: str, batch_size: int) -> None:
    import numpy as np
    import torch
    from tqdm.auto import tqdm

    from streamgnn.models.gnn import WEIGHTED_CONVS
    from streamgnn.workers import Engine

    engine = Engine.from_pyg(model, snapshot, device=device)
    latencies, changed = [], 0
    for start in tqdm(range(0, len(events), batch_size), desc="streaming held-out updates",
                      unit="batch", leave=False):
        t = time.perf_counter()
        changed += len(engine.apply(events[start:start + batch_size]).changed_labels)
        latencies.append(time.perf_counter() - t)
    ms = np.array(latencies) * 1000
    current = engine.graph.to_data()
    g = current.to_pyg().to(device)
    weighted = any(isinstance(m, WEIGHTED_CONVS) for m in model.modules())
    with torch.inference_mode():
        ref = model(g.x, g.edge_index, edge_weight=g.edge_weight if weighted else None)
    err = float(np.abs(engine.lookup(current.ids) - ref.cpu().numpy()).max())
    acc = float((engine.label(full.ids) == full.y).mean()) if full.y is not None else None
    table = Table(title=f"incremental engine: {len(events):,} held-out updates in batches of "
                        f"{batch_size}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for row in (("updates/s", f"{len(events) / ms.sum() * 1000:,.0f}"),
                ("batch latency p50 / p99", f"{np.median(ms):.1f} / "
                                            f"{np.percentile(ms, 99):.1f} ms"),
                ("predicted labels that changed (incl. new vertices)", f"{changed:,}"),
                ("max |engine - PyG forward on the final graph|", f"{err:.1e}"),
                ("accuracy on the whole graph (new vertices included)",
                 "n/a" if acc is None else f"{acc:.3f}")):
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    app()
