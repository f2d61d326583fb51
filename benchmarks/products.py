"""A superstep's transform of a few rows: the numba loop (`small_product`) against torch's
matmul, which `Layer.rel_root` takes above `small_product.SMALL` multiply-adds.

Rows of ``h`` (128 wide, the first half paired: rel and root each) by GraphConv's weights
for 128 and 40 outputs, the shapes of arxiv-like's two layers; median microseconds a call
of each, hot, and their ratio. Where the ratio crosses 1 is where SMALL belongs.

    python benchmarks/products.py [--threads 2]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch_geometric.nn import GraphConv

from streamgnn.models import small_product
from streamgnn.models.layers import GraphConvLayer

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def median_us(call, reps: int = 400) -> float:
    for _ in range(50):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table = Table(title=f"rel_root of n rows (n/2 paired), {args.threads} torch threads")
    for column in ("outputs", "rows", "multiply-adds", "loop us", "torch us", "torch / loop"):
        table.add_column(column, justify="right")
    for out in (128, 40):
        torch.manual_seed(0)
        layer = GraphConvLayer(GraphConv(128, out, bias=False).eval())
        for n in ROWS:
            h, paired = torch.randn(n, 128), (n + 1) // 2
            call = functools.partial(layer.rel_root, h, paired)
            with torch.no_grad():
                small_product.SMALL = 1 << 40
                loop = median_us(call)
                small_product.SMALL = 0
                mm = median_us(call)
            table.add_row(str(out), str(n), f"{(n + paired) * out * 128:,}", f"{loop:.1f}",
                          f"{mm:.1f}", f"{mm / loop:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
