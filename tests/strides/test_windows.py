import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.strides import conv2d_via_im2col, im2col, shares_storage, sliding_windows


@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 3), st.booleans())
def test_sliding_windows_is_unfold_and_a_view(n, size, step, transposed):
    x = torch.randn(n + size, 3)
    if transposed:
        x = torch.randn(3, n + size).t()  # non-contiguous input: windows along dim 0 of a transposed tensor
    w = sliding_windows(x, size, step, dim=0)
    assert torch.equal(w, x.unfold(0, size, step))
    assert shares_storage(w, x)


@given(st.integers(1, 3), st.integers(3, 7), st.integers(3, 8), st.integers(1, 3), st.integers(1, 3), st.integers(1, 2))
def test_im2col_conv_equals_conv2d(c, h, w, kh, kw, stride):
    x = torch.randn(c, h, w, dtype=torch.float64)
    weight = torch.randn(2, c, kh, kw, dtype=torch.float64)
    patches = im2col(x, (kh, kw), stride)
    assert shares_storage(patches, x)  # zero-copy
    expected = F.conv2d(x[None], weight, stride=stride)[0]
    torch.testing.assert_close(conv2d_via_im2col(x, weight, stride), expected)
