"""Known-buggy implementations of the strides chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make, written as the solution plus one edit
(``edited(exercise_id, (old, new))``: the bug is the edit a reader sees). Its second element is the
hint the failure must give: words of its "likely cause" line, or None when no likely cause may appear
(the checker cannot tell this mistake from its symptom, so it must not guess).
"""
from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}

BUGGY = {
    "strides.contiguous_strides": {
        "reversed": (edited("strides.contiguous_strides", ("return tuple(reversed(strides))", "return tuple(strides)")),
                     "reversed"),
        "zero_size_not_clamped": (edited("strides.contiguous_strides",
                                         ("running *= max(size, 1)", "running *= size")),
                                  "size-0 dim counts as size 1"),
        "off_by_one": (edited("strides.contiguous_strides",  # the product taken from dim k, not after it
                              ("strides.append(running)\n        running *= max(size, 1)",
                               "running *= max(size, 1)\n        strides.append(running)")),
                       "AFTER dim k"),
    },
    "strides.storage_index": {
        "ignores_offset": (edited("strides.storage_index", ("position = storage_offset", "position = 0")),
                           "storage offset is missing"),
        "no_bounds_check": (edited("strides.storage_index", (
            '        if not -size <= i < size:\n'
            '            raise IndexError(f"index {i} is out of bounds for dim {dim} with size {size}")\n', "")),
                            "must raise IndexError"),
        "negative_not_wrapped": (edited("strides.storage_index", ("(i % size) * stride", "i * stride")),
                                 "negative indices"),
        "index_length_unchecked": (edited("strides.storage_index", (  # zip() quietly drops the extra entries
            '    if len(index) != len(shape):\n'
            '        raise IndexError(f"index {index} has {len(index)} entries for {len(shape)} dims")\n', "")),
                                   "one entry per dim"),
    },
    "strides.is_contiguous": {
        "size_one_not_skipped": (edited("strides.is_contiguous", ("        if size == 1:\n            continue\n", "")),
                                 "size-1 dims must be skipped"),
        "empty_not_contiguous": (edited("strides.is_contiguous", (
            "    for size in shape:\n        if size == 0:\n            return True\n", "")),
                                 "no elements is always contiguous"),
        # Two small edits: "contiguous" read as "strides that shrink from dim to dim, gaps allowed".
        "sorted_strides": (edited("strides.is_contiguous", ("if stride != expected:", "if stride < expected:"),
                                  ("expected *= size", "expected = stride * size")), None),
    },
    "strides.view_strides": {
        "ignores_size_one_dims": (edited("strides.view_strides", (  # a size-1 old dim is allowed to end a chunk
            "shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride",
            "strides[tensor_d - 1] != tensor_numel * chunk_base_stride")),
                                  "size-1 dims never end a contiguous chunk"),
        "contiguous_only": (edited("strides.view_strides", (  # "view works on contiguous tensors only"
            "    new_strides = [0] * len(new_shape)\n",
            "    return contiguous_strides(new_shape) if is_contiguous(shape, strides) else None\n")), None),
        "always_contiguous_strides": (edited("strides.view_strides", (
            "    if len(shape) == 0:\n", "    return contiguous_strides(new_shape)\n    if len(shape) == 0:\n")),
                                      "straddle"),
    },
    "strides.expand_strides": {
        "keeps_stride": (edited("strides.expand_strides", (
            "        elif old_size == 1:\n            new_shape.append(size)\n            new_strides.append(0)",
            "        elif old_size == 1:\n            new_shape.append(size)\n            new_strides.append(old_stride)")),
                         "must get stride 0"),
        "lead_not_zero": (edited("strides.expand_strides", (
            "            new_strides.append(0)\n            continue", "            new_strides.append(1)\n            continue")),
                          "leading dims"),
        "no_error": (edited("strides.expand_strides", (  # broadcasts anything, by stride 0
            '            raise ValueError(f"size {old_size} of dim {d - lead} cannot expand to {size}")',
            "            new_shape.append(size)\n            new_strides.append(0)")), None),
    },
    "strides.slice_view": {
        "step_not_in_stride": (edited("strides.slice_view", ("new_strides[dim] = strides[dim] * step",
                                                             "new_strides[dim] = strides[dim]")),
                               "multiplies the dim's stride"),
        "offset_reset": (edited("strides.slice_view", ("offset + start * strides[dim]", "start * strides[dim]")),
                         "existing storage offset"),
        "no_clamp": (edited("strides.slice_view", (  # negative bounds wrapped, but never clamped
            "start, stop, step = slice(start, stop, step).indices(size)",
            "start = 0 if start is None else (start + size if start < 0 else start)\n"
            "    stop = size if stop is None else (stop + size if stop < 0 else stop)")),
                     "clamp start and stop"),
    },
    "strides.sliding_windows": {
        "uses_unfold": (edited("strides.sliding_windows", (
            "return x.as_strided((*lead, count, size), (*lead_strides, s * step, s), x.storage_offset())",
            "return x.unfold(-1, size, step)")), None),
        "copies": (edited("strides.sliding_windows", ("x.storage_offset())", "x.storage_offset()).clone()")), None),
        "offset_zero": (edited("strides.sliding_windows", ("x.storage_offset())", "0)")), "storage_offset"),
        "assumes_contiguous": (edited("strides.sliding_windows", ("(*lead_strides, s * step, s)",
                                                                  "(*lead_strides, step, 1)")),
                               "advances by step * x.stride(-1)"),
    },
    "strides.im2col": {
        "assumes_contiguous": (edited("strides.im2col", ("sc, sh, sw = x.stride()", "sc, sh, sw = h * w, w, 1")),
                               "not be contiguous"),
        "stride_ignored": (edited("strides.im2col", ("(sc, sh, sw, sh * stride, sw * stride)",
                                                     "(sc, sh, sw, sh, sw)")),
                           "stride * x.stride(1)"),
        "copies_with_F_unfold": (edited("strides.im2col", (
            "return x.as_strided((c, kh, kw, h_out, w_out), (sc, sh, sw, sh * stride, sw * stride), x.storage_offset())",
            "return F.unfold(x[None], kernel_size, stride=stride)[0].view(c, kh, kw, h_out, w_out)")), None),
    },
}
