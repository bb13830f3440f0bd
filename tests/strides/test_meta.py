"""The reference metadata algorithms agree with real torch on random awkward layouts."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.grading import strategies as S
from ptinternals.strides import meta
from ptinternals.strides.tensor import StridedTensor


def torch_view(shape, strides, offset):
    """A real tensor with exactly this layout (over a big enough storage of 0..N-1)."""
    n = meta.storage_extent(shape, strides, offset)
    base = torch.arange(max(n, 1), dtype=torch.float64)
    return base.as_strided(shape, strides, offset)


@given(S.shapes())
def test_contiguous_strides(shape):
    assert meta.contiguous_strides(shape) == torch.empty(shape).stride()


@given(S.layouts())
def test_is_contiguous(layout):
    shape, strides, offset = layout
    assert meta.is_contiguous(shape, strides) == torch_view(shape, strides, offset).is_contiguous()


@given(S.layouts(min_dims=4, max_dims=4))
def test_is_channels_last(layout):
    shape, strides, offset = layout
    t = torch_view(shape, strides, offset)
    assert meta.is_channels_last(shape, strides) == t.is_contiguous(memory_format=torch.channels_last)


@given(S.shapes(4, 4))
def test_channels_last_strides(shape):
    assert meta.channels_last_strides(shape) == torch.empty(shape, memory_format=torch.channels_last).stride()


@given(S.layouts(), st.data())
def test_storage_index(layout, data):
    shape, strides, offset = layout
    if 0 in shape:
        return
    index = tuple(data.draw(st.integers(-s, s - 1)) for s in shape)
    t = torch_view(shape, strides, offset)
    assert meta.storage_index(index, shape, strides, offset) == int(t[index].item())


@given(S.layouts(), st.data())
def test_view_strides_match_torch(layout, data):
    shape, strides, offset = layout
    new_shape = data.draw(S.factorizations(meta.numel(shape)))
    t = torch_view(shape, strides, offset)
    try:
        expected = t.view(new_shape).stride()
    except RuntimeError:
        expected = None
    assert meta.view_strides(shape, strides, new_shape) == expected


def test_view_size_one_dims_do_not_break_chunks():
    # (2, 1, 3) with a junk stride on the size-1 dim is still one chunk: view(6) works in torch.
    t = torch.arange(6.0).view(2, 1, 3).as_strided((2, 1, 3), (3, 99, 1))
    assert meta.view_strides((2, 1, 3), (3, 99, 1), (6,)) == t.view(6).stride() == (1,)


def test_view_of_zero_dim_tensor():
    assert meta.view_strides((), (), (1, 1)) == torch.tensor(1.0).view(1, 1).stride()


@given(S.layouts(min_dims=1), st.data())
def test_permute_and_transpose(layout, data):
    shape, strides, offset = layout
    dims = data.draw(st.permutations(range(len(shape))))
    t = torch_view(shape, strides, offset).permute(dims)
    assert meta.permute_meta(shape, strides, dims) == (tuple(t.shape), t.stride())
    d0, d1 = data.draw(st.integers(-len(shape), len(shape) - 1)), data.draw(st.integers(-len(shape), len(shape) - 1))
    t2 = torch_view(shape, strides, offset).transpose(d0, d1)
    assert meta.transpose_meta(shape, strides, d0, d1) == (tuple(t2.shape), t2.stride())


@given(S.layouts(max_dims=3, allow_overlap=False), st.data())
def test_expand(layout, data):
    shape, strides, offset = layout
    lead = data.draw(st.lists(S.SIZES, max_size=2))
    target = list(lead) + [data.draw(st.sampled_from([s, -1] + ([2, 3] if s == 1 else []))) for s in shape]
    t = torch_view(shape, strides, offset).expand(tuple(target))
    assert meta.expand_meta(shape, strides, target) == (tuple(t.shape), t.stride())


@given(S.shapes(), S.shapes())
def test_broadcast_shapes(a, b):
    try:
        expected = tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        with pytest.raises(ValueError, match="do not broadcast"):
            meta.broadcast_shapes(a, b)
        return
    assert meta.broadcast_shapes(a, b) == expected


@given(S.layouts(min_dims=1), st.data())
def test_slice(layout, data):
    shape, strides, offset = layout
    d = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.none() | st.integers(-8, 8))
    stop = data.draw(st.none() | st.integers(-8, 8))
    step = data.draw(st.integers(1, 3))
    t = torch_view(shape, strides, offset)
    idx = [slice(None)] * len(shape)
    idx[d] = slice(start, stop, step)
    v = t[tuple(idx)]
    got = meta.slice_meta(shape, strides, offset, d, start, stop, step)
    assert got[:2] == (tuple(v.shape), v.stride())
    if v.numel():
        assert got[2] == v.storage_offset()


@given(S.layouts(min_dims=1), st.data())
def test_select_and_narrow(layout, data):
    shape, strides, offset = layout
    d = data.draw(st.integers(0, len(shape) - 1))
    t = torch_view(shape, strides, offset)
    if shape[d]:
        i = data.draw(st.integers(-shape[d], shape[d] - 1))
        v = t.select(d, i)
        assert meta.select_meta(shape, strides, offset, d, i) == (tuple(v.shape), v.stride(), v.storage_offset())
    start = data.draw(st.integers(0, shape[d]))
    length = data.draw(st.integers(0, shape[d] - start))
    v = t.narrow(d, start, length)
    got = meta.narrow_meta(shape, strides, offset, d, start, length)
    assert got[:2] == (tuple(v.shape), v.stride())


@given(S.layouts(min_dims=1), st.data())
def test_unfold(layout, data):
    shape, strides, offset = layout
    d = data.draw(st.integers(0, len(shape) - 1))
    size = data.draw(st.integers(0, shape[d]))
    step = data.draw(st.integers(1, 3))
    v = torch_view(shape, strides, offset).unfold(d, size, step)
    assert meta.unfold_meta(shape, strides, d, size, step) == (tuple(v.shape), v.stride())


@given(S.layouts(), st.data())
def test_strided_tensor_views_read_what_torch_reads(layout, data):
    shape, strides, offset = layout
    t = torch_view(shape, strides, offset)
    st_t = StridedTensor.from_torch(t)
    assert st_t.tolist() == t.tolist()
    c = st_t.contiguous()
    assert c.tolist() == t.contiguous().tolist()
    assert (c.storage is st_t.storage) == t.is_contiguous()
    new_shape = data.draw(S.factorizations(t.numel()))
    assert st_t.reshape(new_shape).tolist() == t.reshape(new_shape).tolist()


# ---- bad input gets a clear error --------------------------------------------------------------
@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: meta.contiguous_strides((2, -3)), ValueError, "shape[1] must be >= 0"),
        (lambda: meta.contiguous_strides("23"), TypeError, "sequence of ints"),
        (lambda: meta.contiguous_strides((2.0, 3)), TypeError, "shape[0] must be an int"),
        (lambda: meta.is_contiguous((2, 3), (1,)), ValueError, "1 entries but shape (2, 3) has 2 dims"),
        (lambda: meta.is_contiguous((2, 3), (3, -1)), ValueError, "negative strides"),
        (lambda: meta.storage_index((2, 0), (2, 3), (3, 1)), IndexError, "index 2 is out of bounds for dim 0"),
        (lambda: meta.storage_index((0,), (2, 3), (3, 1)), IndexError, "has 1 entries but the tensor has 2 dims"),
        (lambda: meta.storage_index((0, 0), (2, 3), (3, 1), -1), ValueError, "storage_offset must be >= 0"),
        (lambda: meta.view_strides((2, 3), (3, 1), (4, 2)), ValueError, "invalid for input of size 6"),
        (lambda: meta.view_strides((2, 3), (3, 1), (-1, -1)), ValueError, "only one dimension can be inferred"),
        (lambda: meta.permute_meta((2, 3), (3, 1), (0, 0)), ValueError, "must be a permutation"),
        (lambda: meta.permute_meta((2, 3), (3, 1), (0, 2)), IndexError, "out of range"),
        (lambda: meta.expand_meta((2, 3), (3, 1), (4, 3)), ValueError, "can only expand to itself"),
        (lambda: meta.expand_meta((2, 3), (3, 1), (3,)), ValueError, "must be >= the number of dims"),
        (lambda: meta.slice_meta((4,), (1,), 0, 0, 0, 4, 0), ValueError, "step must be positive"),
        (lambda: meta.select_meta((4,), (1,), 0, 0, 4), IndexError, "out of bounds for dim 0"),
        (lambda: meta.narrow_meta((4,), (1,), 0, 0, 3, 2), IndexError, "exceeds dim 0"),
        (lambda: meta.unfold_meta((4,), (1,), 0, 5, 1), ValueError, "window size 5"),
        (lambda: meta.unfold_meta((4,), (1,), 0, 2, 0), ValueError, "step must be > 0"),
        (lambda: meta.broadcast_shapes((2, 3), (4, 3)), ValueError, "do not broadcast"),
        (lambda: StridedTensor.arange(4).as_strided((3,), (2,)), ValueError, "only 4 elements"),
        (lambda: StridedTensor.arange(6).view(2, 3).T.view(6), RuntimeError, "is impossible"),
        (lambda: StridedTensor.from_list([1, 2, 3], (2, 2)), ValueError, "cannot fill shape"),
    ],
)
def test_bad_input_names_the_problem(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)
