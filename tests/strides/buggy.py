"""Known-buggy implementations of the strides chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make; the test also checks that the failure message names a
likely cause where the checker has one (``expect`` words).
"""

BUGGY = {
    "strides.contiguous_strides": {
        "reversed": ("""
def contiguous_strides(shape):
    out, running = [], 1
    for size in reversed(shape):
        out.append(running)
        running *= size
    return tuple(out)
""", "reversed"),
        "zero_size_not_clamped": ("""
def contiguous_strides(shape):
    out, running = [], 1
    for size in reversed(shape):
        out.append(running)
        running *= size
    return tuple(reversed(out))
""", "size-0 dim counts as size 1"),
        "off_by_one": ("""
def contiguous_strides(shape):
    out = []
    for k in range(len(shape)):
        p = 1
        for s in shape[k:]:
            p *= max(s, 1)
        out.append(p)
    return tuple(out)
""", "AFTER dim k"),
    },
    "strides.storage_index": {
        "ignores_offset": ("""
def storage_index(index, shape, strides, storage_offset):
    for i, s in zip(index, shape):
        if not -s <= i < s:
            raise IndexError(i)
    return sum((i % s) * st for i, s, st in zip(index, shape, strides))
""", "storage offset is missing"),
        "no_bounds_check": ("""
def storage_index(index, shape, strides, storage_offset):
    return storage_offset + sum((i % s if s else i) * st for i, s, st in zip(index, shape, strides))
""", "must raise IndexError"),
        "negative_not_wrapped": ("""
def storage_index(index, shape, strides, storage_offset):
    for i, s in zip(index, shape):
        if not -s <= i < s:
            raise IndexError(i)
    return storage_offset + sum(i * st for i, st in zip(index, strides))
""", "negative indices"),
    },
    "strides.is_contiguous": {
        "size_one_not_skipped": ("""
def is_contiguous(shape, strides):
    if 0 in shape:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if stride != expected:
            return False
        expected *= size
    return True
""", "size-1 dims must be skipped"),
        "empty_not_contiguous": ("""
def is_contiguous(shape, strides):
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True
""", "no elements is always contiguous"),
        "sorted_strides": ("""
def is_contiguous(shape, strides):
    nonunit = [st for s, st in zip(shape, strides) if s != 1]
    return nonunit == sorted(nonunit, reverse=True)
""", None),
    },
    "strides.view_strides": {
        "ignores_size_one_dims": ("""
def view_strides(shape, strides, new_shape):
    # the plausible bug from the issue: a size-1 old dim is allowed to end a chunk
    if len(shape) == 0:
        return tuple(1 for _ in new_shape)
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return tuple(strides) if tuple(new_shape) == tuple(shape) else contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    base = strides[-1]
    t_numel = v_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        t_numel *= shape[d]
        if d == 0 or strides[d - 1] != t_numel * base:
            while view_d >= 0 and (v_numel < t_numel or new_shape[view_d] == 1):
                new_strides[view_d] = v_numel * base
                v_numel *= new_shape[view_d]
                view_d -= 1
            if v_numel != t_numel:
                return None
            if d > 0:
                base, t_numel, v_numel = strides[d - 1], 1, 1
    return tuple(new_strides) if view_d == -1 else None
""", "size-1 dims never end a contiguous chunk"),
        "contiguous_only": ("""
def view_strides(shape, strides, new_shape):
    if not is_contiguous(shape, strides):
        return None
    return contiguous_strides(new_shape)
""", None),
        "always_contiguous_strides": ("""
def view_strides(shape, strides, new_shape):
    return contiguous_strides(new_shape)
""", "straddle"),
    },
    "strides.expand_strides": {
        "keeps_stride": ("""
def expand_strides(shape, strides, target):
    lead = len(target) - len(shape)
    if lead < 0:
        raise ValueError("fewer dims")
    out_s = [0] * lead
    for d, size in enumerate(shape):
        if size not in (1, target[lead + d]):
            raise ValueError("no broadcast")
        out_s.append(strides[d])
    return tuple(target), tuple(out_s)
""", "must get stride 0"),
        "lead_not_zero": ("""
def expand_strides(shape, strides, target):
    lead = len(target) - len(shape)
    if lead < 0:
        raise ValueError("fewer dims")
    out_s = [1] * lead
    for d, size in enumerate(shape):
        t = target[lead + d]
        if size == t:
            out_s.append(strides[d])
        elif size == 1:
            out_s.append(0)
        else:
            raise ValueError("no broadcast")
    return tuple(target), tuple(out_s)
""", "leading dims"),
        "no_error": ("""
def expand_strides(shape, strides, target):
    lead = len(target) - len(shape)
    out_s = [0] * lead + [0 if s != t else st for s, st, t in zip(shape, strides, target[lead:])]
    return tuple(target), tuple(out_s)
""", None),
    },
    "strides.slice_view": {
        "step_not_in_stride": ("""
def slice_view(shape, strides, offset, dim, start, stop, step):
    start, stop, step = slice(start, stop, step).indices(shape[dim])
    n = max(0, (stop - start + step - 1) // step)
    s, st = list(shape), list(strides)
    s[dim] = n
    return tuple(s), tuple(st), offset + start * strides[dim]
""", "multiplies the dim's stride"),
        "offset_reset": ("""
def slice_view(shape, strides, offset, dim, start, stop, step):
    start, stop, step = slice(start, stop, step).indices(shape[dim])
    n = max(0, (stop - start + step - 1) // step)
    s, st = list(shape), list(strides)
    s[dim], st[dim] = n, strides[dim] * step
    return tuple(s), tuple(st), start * strides[dim]
""", "existing storage offset"),
        "no_clamp": ("""
def slice_view(shape, strides, offset, dim, start, stop, step):
    size = shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    stop = size if stop is None else (stop + size if stop < 0 else stop)
    n = max(0, (stop - start + step - 1) // step)
    s, st = list(shape), list(strides)
    s[dim], st[dim] = n, strides[dim] * step
    return tuple(s), tuple(st), offset + start * strides[dim]
""", None),
    },
    "strides.sliding_windows": {
        "uses_unfold": ("""
def sliding_windows(x, size, step):
    return x.unfold(-1, size, step)
""", None),
        "copies": ("""
def sliding_windows(x, size, step):
    n = x.shape[-1]
    count = (n - size) // step + 1
    import torch
    return torch.stack([x[..., i * step: i * step + size] for i in range(count)], dim=-2) if count and size else x.new_empty(*x.shape[:-1], max(count, 0), size)
""", None),
        "offset_zero": ("""
def sliding_windows(x, size, step):
    *lead, n = x.shape
    *ls, s = x.stride()
    count = (n - size) // step + 1
    return x.as_strided((*lead, count, size), (*ls, s * step, s), 0)
""", "storage_offset"),
        "assumes_contiguous": ("""
def sliding_windows(x, size, step):
    *lead, n = x.shape
    count = (n - size) // step + 1
    ls = []
    running = n
    for d in reversed(lead):
        ls.insert(0, running)
        running *= d
    return x.as_strided((*lead, count, size), (*ls, step, 1), x.storage_offset())
""", None),
    },
    "strides.im2col": {
        "assumes_contiguous": ("""
def im2col(x, kernel_size, stride):
    kh, kw = kernel_size
    c, h, w = x.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    return x.as_strided((c, kh, kw, ho, wo), (h * w, w, 1, w * stride, stride), x.storage_offset())
""", "not be contiguous"),
        "stride_ignored": ("""
def im2col(x, kernel_size, stride):
    kh, kw = kernel_size
    c, h, w = x.shape
    sc, sh, sw = x.stride()
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    return x.as_strided((c, kh, kw, ho, wo), (sc, sh, sw, sh, sw), x.storage_offset())
""", None),
        "copies_with_F_unfold": ("""
def im2col(x, kernel_size, stride):
    import torch.nn.functional as F
    kh, kw = kernel_size
    c, h, w = x.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    return F.unfold(x[None], kernel_size, stride=stride)[0].view(c, kh, kw, ho, wo)
""", None),
    },
}
