"""Known-buggy implementations of the compile chapter's exercises: each one must be rejected by its checker.

Every bug is the solution's answer cell with one edit (``edited``), a mistake a reader of the chapter
plausibly makes: keeping only the last graph, counting explain's ``graph_break_count`` as breaks,
comparing sizes with the previous call instead of the first, matching ``x + x``, forgetting that
``x.add_(1)`` is a side effect, a greedy flow that never cancels, the other extreme of a tied cut,
saving what is recomputed anyway, splitting kernel names at every ``_``, compiling the whole model.
``expect`` words must appear in the failure message (the likely cause), where the checker has one.
"""

from ptinternals.grading.testing import edited


def _bug(name: str, old: str, new: str) -> str:
    return edited(f"compile.{name}", (old, new))


BUGGY = {
    "compile.recording_backend": {
        "keeps_only_the_last_graph": (_bug("recording_backend", "graphs.append(gm)", "graphs[:] = [gm]"),
                                      "only the last graph"),
        "returns_a_result_not_a_callable": (_bug("recording_backend", "return gm.forward\n",
                                                 "return gm.forward(*example_inputs)\n"), None),
        "keeps_the_example_inputs": (_bug("recording_backend", "graphs.append(gm)", "graphs.append(example_inputs)"),
                                     "the torch.fx.GraphModule"),
        "returns_a_copy_of_the_list": (_bug("recording_backend", "return backend, graphs", "return backend, list(graphs)"),
                                       "the very list"),
    },
    "compile.predict_graphs": {
        "empty_regions_are_graphs": (_bug("predict_graphs", "if ops > 0:", "if True:"), "empty region"),
        "helper_compiled_at_every_call": (_bug("predict_graphs", 'if s == "helper" and not helper_compiled:',
                                               'if s == "helper":'), "compiled once"),
        "resume_region_forgotten": (_bug("predict_graphs", 'ops = 1 if s in ("item", "branch") else 0', "ops = 0"),
                                    "resume function"),
        "graph_break_count_as_breaks": (_bug("predict_graphs", "return graphs + (ops > 0), breaks",
                                             "return graphs + (ops > 0), max(graphs + (ops > 0) - 1, 0)"),
                                        "graph_break_count"),
    },
    "compile.predict_compiles": {
        "no_0_1_specialisation": (_bug("predict_compiles", "(want is None and size < 2)",
                                       "(want is None and size < 0)"), "0 and 1"),
        "never_dynamic": (_bug("predict_compiles", "if first is None:", "if True:"), "FIRST call"),
        "limit_off_by_one": (_bug("predict_compiles", "len(entries) >= recompile_limit",
                                  "len(entries) > recompile_limit"), "recompile_limit"),
        "rank_change_keeps_dims_static": (_bug("predict_compiles", "all_dynamic = True", "all_dynamic = False"),
                                          "change of rank"),
        "strides_not_guarded": (_bug("predict_compiles", 'return tuple(c["stride"]) == strides and',
                                     "return True and"), None),
    },
    "compile.fuse_add_gelu": {
        "fuses_a_leaked_add": (_bug("fuse_add_gelu", " or set(add.users) != {node}", ""), "no user but the gelu"),
        "matches_x_plus_x": (_bug("fuse_add_gelu", "(isinstance(a, fx.Node) and a is b) or ", ""),
                             "two different nodes"),
        "forgets_recompile": (_bug("fuse_add_gelu", "    gm.recompile()\n", ""), "gm.recompile()"),
        "fuses_tanh_gelu": (_bug("fuse_add_gelu", " or node.kwargs", ""), "approximate='tanh'"),
        "swaps_the_operands": (_bug("fuse_add_gelu", "graph.call_function(fused_op, (a, b))",
                                    "graph.call_function(fused_op, (b, a))"), "in order"),
    },
    "compile.dead_code": {
        "forward_walk": (_bug("dead_code", "reversed(list(gm.graph.nodes))", "list(gm.graph.nodes)"),
                         "backwards"),
        "in_place_methods_are_pure": (_bug("dead_code", 'return node.target.endswith("_") and not '
                                                        'node.target.endswith("__")', "return False"),
                                      "in-place method"),
        "random_ops_are_pure": (_bug("dead_code", "return op in random_fns or op in _side_effectful_functions",
                                     "return op in _side_effectful_functions"), "random generator"),
        "unused_inputs_erased": (_bug("dead_code", 'if node.op in ("placeholder", "output"):',
                                      'if node.op == "output":'), None),
        "forgets_recompile": (_bug("dead_code", "    gm.recompile()\n", ""), "gm.recompile()"),
    },
    "compile.min_cut": {
        "other_extreme_of_a_tie": (_bug("min_cut", "return value, sink_side",
                                        "return value, (set(residual) | {source, sink}) - set(parent)"),
                                   "can still reach the sink"),
        "repeated_edges_add_up": (_bug("min_cut", "capacity[u, v] = c ",
                                       "capacity[u, v] = capacity.get((u, v), 0) + c "), "replaces"),
        "no_reverse_residual": (_bug("min_cut", "residual[v][u] += push", "residual[v][u] += 0"), "undo"),
        "no_unbounded_check": (_bug("min_cut", "        if math.isinf(push):\n            raise ValueError(",
                                    "        if False:\n            raise ValueError("), "ValueError"),
    },
    "compile.choose_saved": {
        "tangent_closure_drains_its_output": (_bug("choose_saved", 'edges.append((node.name + "_in", "sink", math.inf))',
                                                   'edges.append((node.name + "_out", "sink", math.inf))'),
                                              "(n_in -> sink)"),
        "primals_recomputable": (_bug("choose_saved", "banned = is_primal(node) or", "banned = False or"),
                                 "Primals cannot be recomputed"),
        "saves_what_it_recomputes": (_bug("choose_saved", ' and n.name + "_in" not in sink_side', ""),
                                     "source side"),
        "bans_backward_nodes": (_bug("choose_saved", "node in info.required_fw and ", ""), "forward nodes only"),
    },
    "compile.read_kernels": {
        "misses_triton_kernels": (_bug("read_kernels", r"async_compile\.(?:cpp_pybinding|cpp|triton)\(",
                                       r"async_compile\.(?:cpp_pybinding|cpp)\("), "async_compile.triton"),
        "splits_at_every_underscore": (_bug("read_kernels", "return best.get(len(body), (body,))",
                                            "return tuple(body.split('_'))"), "fewest pieces"),
        "keeps_the_number": (_bug("read_kernels", 'split_ops(re.sub(r"_\\d+$", "", body))', "split_ops(body)"),
                             "trailing _<number>"),
        "library_calls_deduplicated": (_bug("read_kernels", r'return kernels, re.findall(r"\bextern_kernels\.(\w+)\(", code)',
                                            r'return kernels, sorted(set(re.findall(r"\bextern_kernels\.(\w+)\(", code)))'),
                                       None),
    },
    "compile.compile_blocks": {
        "only_the_first_block": (_bug("compile_blocks", "for block in model.transformer.h:",
                                      "for block in model.transformer.h[:1]:"), "every block"),
        "result_dropped": (_bug("compile_blocks", "block.compile(backend=backend)",
                                "torch.compile(block, backend=backend)"), "in place"),
        "whole_model": (_bug("compile_blocks", "for block in model.transformer.h:\n        block.compile(backend=backend)",
                             "model.compile(backend=backend)"), "each block"),
        "returns_the_blocks": (_bug("compile_blocks", "return model\n", "return model.transformer\n"), None),
    },
}

DEPENDS_ON = {"compile.choose_saved": ("compile.min_cut",)}
TESTS_OF_TESTS = {"hints", "twins", "boundaries"}
