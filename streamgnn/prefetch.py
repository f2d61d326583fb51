"""Memory prefetch hints for numba loops that read rows of large tables at random: each
loop asks for what it will need ``AHEAD`` iterations on (`prefetch_row`, `prefetch`), so
the memory system fetches several rows at once instead of one after the other (quicker
where the rows are not in cache).

Owns these hints only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

AHEAD = 8  # rows asked for ahead of their use


@intrinsic
def prefetch(typingctx, address):
    """llvm.prefetch of the cache line at ``address`` (for reading, kept in all caches):
    a hint that never faults, whatever the address."""
    def codegen(context, builder, signature, args):
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return types.void(types.intp), codegen


@njit(cache=True, inline="always")
def prefetch_row(table, r):
    """Ask for row ``r`` of ``table`` (each row contiguous, any number of dimensions)
    before it is read."""
    start = table.ctypes.data + r * table.strides[0]
    for offset in range(0, table.itemsize * (table.size // max(table.shape[0], 1)), 64):
        prefetch(start + offset)
