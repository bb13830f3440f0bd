"""torch.compile from the inside: Dynamo, FX, AOTAutograd and Inductor, one idea per module.

``torch.compile(fn)`` is a pipeline: **Dynamo** (torch/_dynamo) captures the tensor operations of
Python bytecode into FX graphs, guarded by checks on the inputs; **AOTAutograd** (torch/_functorch)
traces each graph's backward ahead of time into a joint ATen graph and *partitions* it into a forward
and a backward, choosing what to save and what to recompute; **Inductor** (torch/_inductor) fuses the
ATen ops into loops and writes C++ (CPU) or Triton (GPU) kernels. Every stage is an FX graph pass.

=================  ===============================================================================
``backends``       ``RecordingBackend``: a Dynamo backend keeping every graph, its ops and guards
``explain``        graph counts and graph-break reasons from ``torch._dynamo.explain``
``graph_breaks``   the break rule as code: ``predict_graphs`` for straight-line programs
``recompiles``     ``run_and_count``: which calls compile, and the guard that failed
``guard_rules``    the cache and automatic-dynamic rule as code: ``predict_compiles``
``fx_pattern``     pattern replacement (``replace_pattern``), ``fuse_bias_gelu`` into a custom op
``fx_dce``         dead code elimination that knows in-place methods and random ops
``fx_cse``         common subexpression elimination (what AOTAutograd runs on the joint graph)
``fx_shape_prop``  ``ShapeProp``: shapes, strides and bytes by an FX Interpreter, real or fake
``fx_interpreter`` ``NonFiniteLocator``: an Interpreter that finds the op that made the first NaN
``joint_graph``    the joint forward-backward graph: node classes, bytes, distances, op kinds
``save_costs``     torch's cost model: what saving a value costs, which values may not be recomputed
``maxflow``        Edmonds-Karp max flow and the canonical minimum cut
``partition``      the min-cut save/recompute partitioner and the "save everything" default
``aot_capture``    ``capture_aot``: AOTAutograd's joint graph, forward, backward and saved tensors
``inductor``       ``compile_and_read``: generated kernels, what the scheduler fused, library calls
``speed``          ``compile_blocks`` (regional compilation), ``compare_gpt``: compiled vs eager
``scaffold``       the program families the exercises predict (shipped to the grading sandbox)
=================  ===============================================================================

Figures live in ``ptinternals.viz.compile``. Importing this package imports no submodule, so
``import ptinternals.compile.maxflow`` stays cheap.
"""
