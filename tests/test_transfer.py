"""Host arrays packed into one buffer and viewed back as tensors, and tensors packed and
viewed back as arrays: the two halves of `transfer.upload` and `transfer.download` around
their one copy (run here on the CPU; the copy itself runs where a GPU is)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamgnn.models.transfer import array_views, packed_arrays, packed_tensors, tensor_views

DTYPES = [np.float64, np.float32, np.int64, np.int32, np.int16, np.int8, np.uint8, np.bool_]
shapes = st.sampled_from([(), (0,), (1,), (7,), (3, 5), (0, 4), (2, 3, 2)])


@given(parts=st.lists(st.tuples(st.sampled_from(DTYPES), shapes), min_size=1, max_size=6),
       seed=st.integers(0, 2**31))
def test_arrays_packed_and_viewed_back_are_the_arrays_in_both_directions(parts, seed):
    rng = np.random.default_rng(seed)
    arrays = [np.ascontiguousarray(rng.integers(-100, 100, shape).astype(dtype))
              for dtype, shape in parts]
    buffer, offsets = packed_arrays(arrays)
    assert all(at % 8 == 0 for at in offsets)  # any dtype may view its part
    tensors = tensor_views(torch.from_numpy(buffer), arrays, offsets)
    for a, t in zip(arrays, tensors, strict=True):
        assert t.shape == a.shape and t.numpy().dtype == a.dtype
        np.testing.assert_array_equal(t.numpy(), a)
    packed, offsets = packed_tensors(tuple(tensors))
    for a, b in zip(arrays, array_views(packed.numpy(), tuple(tensors), offsets), strict=True):
        assert b.shape == a.shape and b.dtype == a.dtype
        np.testing.assert_array_equal(b, a)
