"""Known-buggy implementations of the modules chapter's exercises: each one must be rejected by its checker.

Each bug is the solution's answer cell with one edit (``edited``): a mistake people make when they write
this machinery themselves, and most of them the silent module bugs the chapter is about (a plain tensor
becoming a buffer, identity lost in ``.to()``, ``strict=False`` reporting nothing, hooks skipped, a
checkpoint that loads without its ``_metadata``). ``expect``: words the failure message must contain (the
likely cause the checker gives, in its "likely cause" line).
"""

from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}

BUGGY = {
    "modules.register": {
        "plain_tensor_becomes_buffer": (edited(
            "modules.register",
            ("if isinstance(value, Buffer) or (buffers is not None and name in buffers):",
             "if isinstance(value, torch.Tensor) or (buffers is not None and name in buffers):")),
            "only nn.Buffer or register_buffer make a buffer"),
        "getattr_raises_key_error": (edited(
            "modules.register",
            ("""        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")""",
             """        raise KeyError(name)""")), "must raise AttributeError"),
        "parameter_not_moved_out_of_dict": (edited(
            "modules.register",
            ("            remove_from(self.__dict__, self._buffers, self._modules, self._non_persistent_buffers_set)\n"
             "            self.register_parameter(name, value)",
             "            self.register_parameter(name, value)")), "remove the name from the other places"),
        "persistent_again_not_discarded": (edited(
            "modules.register",
            ("        if persistent:\n            self._non_persistent_buffers_set.discard(name)",
             "        if persistent:\n            pass")), "_non_persistent_buffers_set"),
        "none_deletes_parameter_slot": (edited(
            "modules.register",
            ("""                                "(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)""",
             """                                "(torch.nn.Parameter or None expected)")
            del params[name]""")), "keeps the slot"),
    },
    "modules.traverse": {
        "remove_duplicate_ignored": (edited(
            "modules.traverse", ("        if remove_duplicate:\n            memo.add(self)", "        memo.add(self)")),
            "remove_duplicate=False"),
        "tied_tensor_yielded_twice": (edited(
            "modules.traverse", ("                if remove_duplicate:\n                    seen.add(value)",
                                 "                if remove_duplicate:\n                    pass")),
            "yielded once"),
        "leading_dot": (edited(
            "modules.traverse", ("module.named_modules(memo, prefix + (\".\" if prefix else \"\") + name, remove_duplicate)",
                                 "module.named_modules(memo, prefix + \".\" + name, remove_duplicate)")),
            "only when the prefix is not empty"),
        "none_yielded": (edited(
            "modules.traverse", ("                if value is None or value in seen:", "                if value in seen:")),
            "never yielded"),
    },
    "modules.convert": {
        "new_parameter_objects": (edited(
            "modules.convert", ("                param.data = new\n                out = param",
                                "                out = Parameter(new, param.requires_grad)\n"
                                "                self._parameters[key] = out")), "the optimizer holds the Parameter"),
        "grads_not_converted": (edited(
            "modules.convert", ("            if grad is not None:\n                with torch.no_grad():",
                                "            if grad is not None and False:\n                with torch.no_grad():")),
            ".grad is converted with it"),
        "int_buffers_cast": (edited(
            "modules.convert", ("return t.to(device, dtype if (t.is_floating_point() or t.is_complex()) else None, "
                                "non_blocking)", "return t.to(device, dtype, non_blocking)")), "int64 buffer stays int64"),
        "children_not_visited": (edited("modules.convert", ("        if recurse:", "        if recurse and False:")),
                                 "converts the children first"),
        "buffers_skipped": (edited("modules.convert", ("                self._buffers[key] = fn(buf)",
                                                       "                pass")), "buffers are converted too"),
    },
    "modules.state_dict": {
        "non_persistent_saved": (edited(
            "modules.state_dict", ("            if buf is not None and name not in self._non_persistent_buffers_set:\n"
                                   "                destination",
                                   "            if buf is not None:\n                destination")), "persistent=False"),
        "strict_false_reports_nothing": (edited(
            "modules.state_dict", ("        return IncompatibleKeys(missing, unexpected)",
                                   "        return IncompatibleKeys([], [])")), "still reports"),
        "child_keys_unexpected_at_parent": (edited(
            "modules.state_dict", ("if (dot and head not in self._modules) or (not dot and head not in local):",
                                   "if dot or head not in local:")), "the child's to judge"),
        "data_instead_of_copy": (edited("modules.state_dict", ("                    param.copy_(value)",
                                                               "                    param.data = value")),
                                 "copies into the existing tensors"),
        "no_shape_check": (edited("modules.state_dict", ("            if value.shape != param.shape:",
                                                         "            if False:")), "shape mismatch is an error"),
        "metadata_with_trailing_dot": (edited("modules.state_dict", ("destination._metadata[prefix[:-1]]",
                                                                     "destination._metadata[prefix]")), "_metadata"),
    },
    "modules.call": {
        "forward_hook_return_ignored": (edited(
            "modules.call", ("                if new is not None:\n                    result = new\n"
                             "            if state is not None:", "            if state is not None:")),
            "replaces the output"),
        "bare_pre_hook_value_not_wrapped": (edited(
            "modules.call", ("args = new if isinstance(new, tuple) else (new,)", "args = new")), "1-tuple"),
        "prepend_ignored": (edited(
            "modules.call", ("        if prepend:\n            self._forward_pre_hooks.move_to_end(handle.id, last=False)",
                             "        pass")), "prepend=True"),
        "always_call_not_run_on_error": (edited(
            "modules.call", ("if hook_id in self._forward_hooks_always_called and hook_id not in done:",
                             "if False:")), "always_call=True"),
        "backward_pre_hook_return_ignored": (edited(
            "modules.call", ("                    state[\"grad_output\"] = new", "                    pass")),
            "backward pre-hook"),
        "kwargs_not_passed_to_forward_hooks": (edited(
            "modules.call", ("                    new = hook(self, args, kwargs, result)\n                else:\n"
                             "                    new = hook(self, args, result)\n                if new is not None:\n"
                             "                    result = new\n            if state",
                             "                    new = hook(self, args, result)\n                else:\n"
                             "                    new = hook(self, args, result)\n                if new is not None:\n"
                             "                    result = new\n            if state")), "with_kwargs"),
    },
    "modules.hook_order": {
        "backward_in_forward_order": (edited("modules.hook_order", ("for sub in reversed(calls):", "for sub in calls:")),
                                      "reverse"),
        "no_early_backward_hook": (edited(
            "modules.hook_order", ("        backward.append((\"bwd-pre\", path))\n        if not in_req:\n"
                                   "            backward.append((\"bwd\", path))",
                                   "        backward.append((\"bwd-pre\", path))")), "right after its backward pre-hooks"),
        "hooks_without_gradient": (edited("modules.hook_order", ("        if not out_req:\n            return\n", "")),
                                   "no backward hook call at all"),
        "own_parameter_ignored": (edited(
            "modules.hook_order", ("req = in_req or node.get(\"param\") == \"trainable\"", "req = in_req")),
            "trainable parameter of its own"),
    },
    "modules.functional_call": {
        "restored_first_in_first_out": (edited(
            "modules.functional_call", ("for name, old in reversed(list(originals.items())):",
                                        "for name, old in list(originals.items()):")), "reverse order"),
        "no_finally": (edited(
            "modules.functional_call",
            ("        return module(*args, **(kwargs or {}))\n    finally:\n"
             "        for name, old in reversed(list(originals.items())):  # last in, first out\n            swap(name, old)",
             "        out = module(*args, **(kwargs or {}))\n    except KeyError:\n        raise\n"
             "    for name, old in reversed(list(originals.items())):  # last in, first out\n        swap(name, old)\n"
             "    return out")), "finally"),
        "tie_weights_ignored": (edited("modules.functional_call", ("    if tie_weights:", "    if False:")),
                                "used for all its names"),
        "values_copied_not_swapped": (edited(
            "modules.functional_call", ("                else:\n                    table[leaf] = value\n",
                                        "                elif table[leaf] is not None:\n"
                                        "                    table[leaf].data = value\n")), "no gradient reaches"),
        "strict_ignored": (edited("modules.functional_call", ("    if strict:", "    if False:")), "strict=True"),
    },
    "modules.fix_model": {
        "blocks_called_through_forward": (edited("modules.fix_model", ("x = x + block(x).relu()",
                                                                       "x = x + block.forward(x).relu()")),
                                          "skips every hook"),
        "mask_persistent": (edited("modules.fix_model", ("torch.ones(max_len, max_len)), persistent=False)",
                                                         "torch.ones(max_len, max_len)), persistent=True)")),
                            "persistent=False"),
        "mask_as_parameter": (edited(
            "modules.fix_model", ('self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len)), persistent=False)',
                                  "self.mask = nn.Parameter(torch.tril(torch.ones(max_len, max_len)), "
                                  "requires_grad=False)")), "not a Parameter"),
        "blocks_in_a_list": (edited("modules.fix_model", ("nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))",
                                                          "[nn.Linear(dim, dim) for _ in range(depth)]")),
                             "nn.ModuleList"),
    },
    "modules.load_checkpoint": {
        "strict_false": (edited("modules.load_checkpoint", ("model.load_state_dict(best, strict=True)",
                                                            "model.load_state_dict(best, strict=False)")),
                         "load strictly"),
        "replace_anywhere": (edited("modules.load_checkpoint", ("k[len(prefix):] if k.startswith(prefix) else k",
                                                                "k.replace(prefix, \"\")")), "only at the start"),
        "metadata_dropped": (edited("modules.load_checkpoint", (
            "    if hasattr(checkpoint, \"_metadata\"):\n        first._metadata = OrderedDict(checkpoint._metadata)\n",
            "")), "keep `_metadata`"),
        "always_most_stripped": (edited("modules.load_checkpoint", (
            "best = max(candidates, key=lambda c: sum(k in own for k in c))", "best = candidates[-1]")),
            "a child may really be called `module`"),
    },
}
