"""Red team, "forbidden means absent": exercises to be written without torch or numpy (strides, allocator, amp,
dispatch) are graded in a sandbox where those packages do not exist, whatever the student's code tries, and the
course's reference implementations do not exist either. Each hostile notebook attacks one such exercise; the
exercise graded in the same run beside it keeps its points."""
import pytest

from .redteam import body, grade, needs_bwrap, scored_zero

# (chapter, answer cell, attack, the exercise it attacks, an honest exercise graded in the same run)
ATTACKS = {
    "strides_import_inside_the_function": ("strides", "contiguous_strides_code", """
        def contiguous_strides(shape):
            import torch
            return tuple(torch.empty(shape).stride())
        """, "strides.contiguous_strides", "strides.storage_index"),
    "strides_torch_through_the_garbage_collector": ("strides", "storage_index_code", """
        import gc
        def storage_index(index, shape, strides, offset):
            torch = next(o for o in gc.get_objects() if type(o).__name__ == "module" and o.__name__ == "torch")
            t = torch.arange(10**6).as_strided(shape, strides, offset)
            return int(t[tuple(index)])
        """, "strides.storage_index", "strides.contiguous_strides"),
    "strides_numpy_from_every_site_packages": ("strides", "is_contiguous_code", """
        import glob, sys
        sys.path += glob.glob("/usr/lib/python3*/*-packages") + glob.glob("/**/site-packages", recursive=True)
        import numpy as np
        def is_contiguous(shape, strides):
            return np.lib.stride_tricks.as_strided(np.empty(1), shape, [8 * s for s in strides]).flags.c_contiguous
        """, "strides.is_contiguous", "strides.contiguous_strides"),
    "strides_importlib_and_sys_modules": ("strides", "view_strides_code", """
        import importlib, sys
        def view_strides(shape, strides, new_shape):
            torch = sys.modules.get("torch") or importlib.import_module("torch")
            t = torch.empty(0).as_strided(shape, strides)
            return tuple(t.view(new_shape).stride())
        """, "strides.view_strides", "strides.contiguous_strides"),
    "strides_libtorch_through_ctypes": ("strides", "expand_strides_code", """
        import ctypes, os
        def expand_strides(shape, strides, target):
            libs = [os.path.join(d, f) for d, _, fs in os.walk("/") for f in fs if f.startswith("libtorch")]
            ctypes.CDLL(libs[0])          # there is none to load
            return tuple(target), (0,) * len(target)
        """, "strides.expand_strides", "strides.contiguous_strides"),
    "strides_torch_in_a_child_process": ("strides", "slice_view_code", """
        import subprocess, sys, json
        def slice_view(shape, strides, offset, dim, start, stop, step):
            code = ("import torch, json; t = torch.empty(10**6).as_strided(%r, %r, %r); "
                    "i = [slice(None)] * %d; i[%d] = slice(%r, %r, %r); v = t[tuple(i)]; "
                    "print(json.dumps([list(v.shape), list(v.stride()), v.storage_offset()]))"
                    % (shape, strides, offset, len(shape), dim, start, stop, step))
            out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout)
            return tuple(out[0]), tuple(out[1]), out[2]
        """, "strides.slice_view", "strides.contiguous_strides"),
    "strides_the_reference_from_the_course_source": ("strides", "contiguous_strides_code", """
        import os, sys
        roots = [d for d, _, fs in os.walk("/") if "meta.py" in fs and d.endswith("strides")]
        sys.path[:0] = [os.path.dirname(os.path.dirname(r)) for r in roots]
        from ptinternals.strides.meta import contiguous_strides
        """, "strides.contiguous_strides", "strides.storage_index"),
    "allocator_torch_cuda_caching_allocator": ("allocator", "round_size_code", """
        def round_size(nbytes, divisions=0):
            import torch
            return torch.cuda.memory._round_size(nbytes)
        """, "allocator.round_size", "allocator.merge_free_neighbours"),
    "allocator_the_reference": ("allocator", "size_plan_code", """
        from ptinternals.allocator.sizes import size_plan
        """, "allocator.size_plan", "allocator.round_size"),
    "allocator_numpy": ("allocator", "should_split_code", """
        import numpy as np
        from ptinternals.allocator.scaffold import SIZE_MAX, kMinBlockSize, kSmallSize
        def should_split(block_size, size, pool, max_split_size=SIZE_MAX):
            return bool(np.greater(block_size - size, kMinBlockSize if pool == "small" else kSmallSize))
        """, "allocator.should_split", "allocator.merge_free_neighbours"),
    "amp_numpy_float16": ("amp", "decode_code", """
        def decode(bits, fmt):
            import numpy as np
            return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])
        """, "amp.decode", "amp.update_scale"),
    "amp_torch_update_scale_kernel": ("amp", "update_scale_code", """
        def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
            import torch
            s, g = torch.tensor([scale]), torch.tensor([growth_tracker], dtype=torch.int32)
            torch._amp_update_scale_(s, g, torch.tensor([float(found_inf)]), growth_factor, backoff_factor,
                                     growth_interval)
            return s.item(), int(g.item())
        """, "amp.update_scale", None),  # a private name: every exercise of the chapter with a policy scores 0
    "amp_autocast_itself": ("amp", "predict_dtypes_code", """
        def predict_dtypes(layers, device_type, autocast_dtype, input_dtype="float32"):
            import torch
            with torch.autocast(device_type, torch.bfloat16):
                return [str(torch.ones(2, 2).mm(torch.ones(2, 2)).dtype) for _ in layers]
        """, "amp.predict_dtypes", "amp.update_scale"),
    "dispatch_the_real_dispatcher": ("dispatch", "dispatch_path_code", """
        def dispatch_path(tensors, **kwargs):
            import torch
            return [str(k) for k in torch._C._dispatch_keys(torch.empty(0))]
        """, "dispatch.dispatch_path", "dispatch.tensor_keys"),
}


@needs_bwrap
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_forbidden_packages_and_the_reference_are_absent(name, tmp_path):
    chapter, cell, code, attacked, honest = ATTACKS[name]
    results, report, _ = grade(chapter, {cell: body(code)}, (attacked, honest or attacked), tmp_path)
    scored_zero(results[attacked], "forbidden", "error", "missing", "wrong", "timeout")
    if honest:
        assert results[honest].passed, f"{name} cost {honest} its points: {results[honest].message}"
    assert report.sandbox_runs == 0 or report.isolation == "bwrap"  # 0: the static policy decided it
