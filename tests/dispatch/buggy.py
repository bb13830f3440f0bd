"""Known-buggy implementations of the dispatch chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make, written as the solution's answer cell plus one edit
(``edited(exercise_id, (old, new))``: the bug is the edit a reader sees). Its second element is the
hint the failure must give: words of its "likely cause" line, or None when no likely cause may appear
(the checker cannot tell this mistake from its symptom, so it must not guess).
"""
from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}

BUGGY = {
    "dispatch.tensor_keys": {
        "autograd_only_if_requires_grad": (edited("dispatch.tensor_keys", (
            "    if not inference:  # every non-inference tensor, requires_grad or not\n",
            "    if requires_grad:\n")), "even with requires_grad=False"),
        "autocast_on_every_device": (edited("dispatch.tensor_keys", (
            '    if backend in ("CPU", "CUDA"):\n        keys.add("Autocast" + backend)',
            '    keys.add("Autocast" + backend)')), "no AutocastMeta"),
        "inference_keeps_ad_inplace_or_view": (edited("dispatch.tensor_keys", (  # "only autograd is switched off"
            '        keys |= {"ADInplaceOrView", "Autograd" + backend}',
            '        keys.add("Autograd" + backend)\n    keys.add("ADInplaceOrView")')),
            "neither ADInplaceOrView nor an Autograd key"),
        "subclass_without_tls_snapshot": (edited("dispatch.tensor_keys", (
            'keys |= {"Python", "PythonTLSSnapshot"}', 'keys |= {"Python"}')), "PythonTLSSnapshot"),
        "sparse_as_two_keys": (edited("dispatch.tensor_keys", (
            'keys = {"Sparse" + backend if sparse else backend}',
            'keys = {backend, "Sparse"} if sparse else {backend}')), "one name"),
        "autocast_only_outside_inference": (edited("dispatch.tensor_keys", (  # autocast read as part of autograd
            '    if backend in ("CPU", "CUDA"):\n', '    if backend in ("CPU", "CUDA") and not inference:\n')),
            "even inference tensors"),
    },
    "dispatch.dispatch_path": {
        "no_grad_skips_autograd": (edited("dispatch.dispatch_path", (
            "    if modes:\n        included = included |",
            "    if not grad_mode:\n        excluded = excluded | autograd_keys\n"
            "    if modes:\n        included = included |")), "changes no key set"),
        "fallthroughs_not_removed": (edited("dispatch.dispatch_path", (
            "run(ks - excluded - set(fallthrough),", "run(ks - excluded,")), "fallthrough"),
        "inference_mode_only_drops_inplace_view": (edited("dispatch.dispatch_path", (
            "        excluded = excluded | autograd_keys\n", "")), "EXCLUDE set"),
        "mode_call_reruns_autograd": (edited("dispatch.dispatch_path", (
            "        excluded = excluded | above_python\n", "")), "ABOVE Python is excluded"),
        "one_python_step_for_all_modes": (edited("dispatch.dispatch_path", (
            "            return call(tensors, included, excluded, rest)",
            '            return call(tensors, included - {"Python", "PythonTLSSnapshot"}, excluded, [])')),
            "each TorchDispatchMode"),
        "fake_mode_runs_the_device_kernel": (edited("dispatch.dispatch_path", (
            'included | {"Meta"}', "included")), "meta kernel"),
        "autocast_left_excluded": (edited("dispatch.dispatch_path", (  # autocast thought to ADD the key
            '        excluded = excluded - {"Autocast" + BACKEND_OF_DEVICE[autocast]}',
            '        included = included | {"Autocast" + BACKEND_OF_DEVICE[autocast]}')), "REMOVES AutocastCPU"),
        "mode_keeps_python_included": (edited("dispatch.dispatch_path", (  # the last mode leaves Python on
            '            if not rest:\n                included = included - {"Python", "PythonTLSSnapshot"}\n', "")),
            None),
    },
    "dispatch.flop_counter": {
        "no_factor_2_in_mm": (edited("dispatch.flop_counter", (
            "return 2 * m * k * n  #", "return m * k * n  #")), "2 FLOPs"),
        "cpu_attention_counts_zero": (edited("dispatch.flop_counter", (  # only the ops of the first rows counted
            "math.prod(out.shape[2:])\n", "math.prod(out.shape[2:])\n        return 0\n")),
            "attention counts 0"),
        "forgets_backward": (edited("dispatch.flop_counter", (
            "        out = func(*args, **(kwargs or {}))\n",
            "        out = func(*args, **(kwargs or {}))\n"
            "        if not torch.is_grad_enabled():  # a backward op, surely nothing to count\n"
            "            return out\n")), "only the forward pass"),
        "attention_backward_like_forward": (edited("dispatch.flop_counter", (
            "(3 * d + 2 * d_v)", "(d + d_v)")), "recomputes Q K^T"),
        "addmm_reads_the_bias": (edited("dispatch.flop_counter", ("args[-2:] if packet", "args[:2] if packet")), None),
        "uses_torchs_formulas": (edited("dispatch.flop_counter", (  # the grader empties torch's table: 0 FLOPs
            "        self.total += self.flops(func._overloadpacket, args, out)\n",
            "        from torch.utils.flop_counter import flop_registry\n"
            "        if func._overloadpacket in flop_registry:\n"
            "            self.total += flop_registry[func._overloadpacket](*args, **(kwargs or {}), out_val=out)\n")),
            None),
        "conv_ignores_groups": (edited("dispatch.flop_counter", (  # c_in read from the input, not the weight
            "c_out, c_in_per_group, *kernel = w.shape", "c_out, _, *kernel = w.shape\n"
            "            c_in_per_group = x.shape[1]")), "c_in/groups"),
    },
    "dispatch.graph_tracer": {
        "stores_traced_tensors": (edited("dispatch.graph_tracer", (
            "        if x not in self._ref_of:  # neither", "        return x\n        if x not in self._ref_of:  # neither")),
            "TRACED run's numbers"),
        "one_ref_for_all_outputs": (edited("dispatch.graph_tracer", (
            "self._ref_of[o] = Ref(name, i)", "self._ref_of[o] = Ref(name)")), "Ref(node, i)"),
        "drops_kwargs": (edited("dispatch.graph_tracer", (
            "tree_map(self._ref, args), tree_map(self._ref, kwargs))", "tree_map(self._ref, args), {})")),
            "approximate"),
        "skips_backward_ops": (edited("dispatch.graph_tracer", (
            "        out = func(*args, **kwargs)\n",
            "        out = func(*args, **kwargs)\n        if not torch.is_grad_enabled():\n            return out\n")),
            "including the backward ones"),
        "constants_as_placeholders": (edited("dispatch.graph_tracer", (
            'self.nodes.append((name, "constant", (x,), {}))', 'self.nodes.append((name, "placeholder", (), {}))')),
            "'constant' node"),
    },
    "dispatch.int8_tensor": {
        "detach_dequantizes": (edited("dispatch.int8_tensor", (
            "        if func is aten.detach.default:  # nn.Parameter(t) calls t.detach()\n"
            "            return cls(args[0].int_data, args[0].scale)\n", "")), "detach()"),
        "truncates_instead_of_rounding": (edited("dispatch.int8_tensor", (
            "torch.round(w / scale[:, None])", "(w / scale[:, None])")), "do not truncate"),
        # Two small edits: one scale for the whole tensor, used to quantise as well.
        "one_scale_per_tensor": (edited("dispatch.int8_tensor", ("w.abs().amax(dim=1) / 127", "w.abs().amax() / 127"),
                                        ("torch.round(w / scale[:, None])", "torch.round(w / scale)")),
                                 "one scale per OUTPUT row"),
        "scale_over_128": (edited("dispatch.int8_tensor", ("w.abs().amax(dim=1) / 127", "w.abs().amax(dim=1) / 128")),
                           "over each row / 127"),
        "int8_as_logical_dtype": (edited("dispatch.int8_tensor", (
            "dtype=scale.dtype, device=int_data.device)", "dtype=int_data.dtype, device=int_data.device)")),
            "LOGICAL dtype"),
        "rounds_half_away_from_zero": (edited("dispatch.int8_tensor", (  # the school rule, not torch's
            "torch.round(w / scale[:, None])",
            "(w / scale[:, None]).abs().add(0.5).floor().copysign(w)")), "half to even"),
        "clamps_to_128": (edited("dispatch.int8_tensor", (".clamp(-127, 127)", ".clamp(-128, 127)")), None),
        "quantizes_in_place": (edited("dispatch.int8_tensor", (  # divides the caller's weight in place
            "codes = torch.round(w / scale[:, None])", "codes = torch.round(w.div_(scale[:, None]))")),
            "modified the weight"),
    },
    "dispatch.custom_op": {
        "fake_wrong_shape": (edited("dispatch.custom_op", (
            "return torch.empty_like(x)  # metadata only", "return x.new_empty(x.shape[:-1])")), "SHAPE"),
        "fake_wrong_dtype": (edited("dispatch.custom_op", (
            "return torch.empty_like(x)  # metadata only", "return torch.empty_like(x, dtype=torch.float32)")),
            "DTYPE"),
        "no_autograd_registration": (edited("dispatch.custom_op", (
            "    fused_bias_gelu.register_autograd(backward, setup_context=setup_context)\n", "")),
            "register_autograd"),
        "forgets_grad_out": (edited("dispatch.custom_op", ("grad_z = grad_out * (", "grad_z = (")), "chain rule"),
        "no_fake_kernel": (edited("dispatch.custom_op", ("    @fused_bias_gelu.register_fake\n", "")), "register_fake"),
        "tanh_approximation": (edited("dispatch.custom_op", (
            "return 0.5 * z * (1 + torch.erf(z * inv_sqrt2))",
            "return 0.5 * z * (1 + torch.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))")), None),
        "bias_grad_summed_over_features": (edited("dispatch.custom_op", (
            "return grad_z, grad_z.reshape(-1, grad_z.shape[-1]).sum(0)", "return grad_z, grad_z.sum(-1)")),
            "sum grad_z over every dim but the last"),
    },
    "dispatch.cpp_op": {
        "python_cpu_kernel": (edited("dispatch.cpp_op", (  # the C++ kernel overridden from Python
            "        torch.library.register_fake(qualname, fake, lib=lib)\n",
            "        torch.library.register_fake(qualname, fake, lib=lib)\n"
            "        lib.impl(\"fused_bias_gelu\", lambda x, bias: torch.nn.functional.gelu(x + bias), \"CPU\")\n")),
            None),
        # Two small edits: the header of aten::gelu, and a kernel that calls it.
        "calls_aten_gelu": (edited("dispatch.cpp_op", ("#include <ATen/ops/empty.h>\n",
                                                       "#include <ATen/ops/empty.h>\n#include <ATen/ops/add.h>\n"
                                                       "#include <ATen/ops/gelu.h>\n"),
                                   ("  const int64_t n = bc.numel(), total = xc.numel();\n",
                                    "  return at::gelu(at::add(xc, bc));\n"
                                    "  const int64_t n = bc.numel(), total = xc.numel();\n")), None),
        "fake_keeps_strides": (edited("dispatch.cpp_op", (
            "return x.new_empty(x.shape)  # the C++ kernel returns a contiguous tensor", "return torch.empty_like(x)")),
            "strides included"),
        "no_cpu_kernel": (edited("dispatch.cpp_op", (  # the schema declared, no kernel registered
            'TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) {\n  m.impl("fused_bias_gelu", &fused_bias_gelu_cpu);\n}\n', "")),
            "TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m)"),
        "no_autograd_registration": (edited("dispatch.cpp_op", (
            "        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)\n",
            "")), "register_autograd"),
    },
    "dispatch.memory_estimate": {
        "no_512_byte_rounding": (edited("dispatch.memory_estimate", (
            'return 512 * ((n + 511) // 512) if device == "cuda" else n', "return n")), "512 bytes"),
        "adam_keeps_one_copy": (edited("dispatch.memory_estimate", (
            '"optimizer_state": 2 * gradients', '"optimizer_state": gradients')), "TWO tensors"),
        "gradients_for_frozen_parameters": (edited("dispatch.memory_estimate", (
            "trainable = [p for p in params if p.requires_grad]", "trainable = params")), "requires_grad=True"),
        "storages_by_data_ptr": (edited("dispatch.memory_estimate", (
            "            if id(storage) not in skip:\n                saved[id(storage)] = storage",
            "            if storage.data_ptr() not in skip:\n                saved[storage.data_ptr()] = storage")),
            "id(t.untyped_storage())"),
        "parameters_counted_as_activations": (edited("dispatch.memory_estimate", (
            "skip = {id(t.untyped_storage()) for t in params + [x]}", "skip = {id(x.untyped_storage())}")),
            "leave out the parameters"),
    },
}

# Exercises whose solution builds on another exercise's answer: a bug there also sinks these.
DEPENDS_ON = {
    "dispatch.dispatch_path": ("dispatch.tensor_keys",),  # dispatch_path starts from tensor_keys' key sets
}
