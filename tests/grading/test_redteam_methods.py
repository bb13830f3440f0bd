"""Red team, method checks: no exercise can be passed by calling the operation it asks the student to build.

Every exercise with a :class:`~ptinternals.grading.policy.Policy` gets a submission that simply calls torch's own
operation (or hides the call from an import check); each must score 0 under the recommended isolation. The
policy decides before any code runs, so a measurement the student's code could forge in the sandbox
(``DisableTorchFunction``, a subclass of torch's GradScaler) never counts. Exercises whose forbidden tools are
absent instead are attacked in ``test_redteam_forbidden.py``.
"""
import pytest

from ptinternals.grading.exercise import graded_chapters
from ptinternals.grading.policy import effective_policy

from .redteam import body, grade, scored_zero

# exercise id -> (answer cell, a submission that calls the operation the exercise asks for)
CALLS_THE_OPERATION = {
    "strides.sliding_windows": ("sliding_windows_code", """
        def sliding_windows(x, size, step):
            return x.unfold(-1, size, step)
        """),
    "strides.im2col": ("im2col_code", """
        import torch.nn.functional as F
        def im2col(x, kernel_size, stride):
            c, h, w = x.shape
            kh, kw = kernel_size
            return F.unfold(x[None], kernel_size, stride=stride)[0].view(c, kh, kw, (h - kh) // stride + 1, -1)
        """),
    "autograd.unbroadcast": ("unbroadcast_code", """
        def unbroadcast(grad, shape):
            return grad.sum_to_size(shape)
        """),
    "autograd.formulas": ("formulas_code", """
        import torch
        def backward_formula(op, grad, *saved):
            xs = [s.detach().requires_grad_() for s in saved]
            out = getattr(torch, op)(*xs)
            return torch.autograd.grad(out, xs, grad)
        """),
    "autograd.logsumexp": ("logsumexp_code", """
        import torch
        class LogSumExp(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, dim):
                ctx.save_for_backward(x)
                ctx.dim = dim
                return torch.logsumexp(x, dim)
            @staticmethod
            def backward(ctx, grad_out):
                (x,) = ctx.saved_tensors
                return grad_out.unsqueeze(ctx.dim) * torch.softmax(x, ctx.dim), None
        """),
    "autograd.fake_quantize": ("fake_quantize_code", """
        import torch
        class FakeQuantize(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, scale, zero_point, quant_min, quant_max):
                return torch.fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max)
            @staticmethod
            def backward(ctx, grad_out):
                return grad_out, None, None, None, None
        """),
    "autograd.checkpoint": ("checkpoint_code", """
        import torch.utils.checkpoint as tuc
        def checkpoint(fn, x):
            return tuc.checkpoint(fn, x, use_reentrant=False)
        """),
    "dispatch.flop_counter": ("flop_counter_code", """
        from torch.utils.flop_counter import FlopCounterMode
        class FlopCounter(FlopCounterMode):
            @property
            def total(self):
                return self.get_total_flops()
        """),
    "dispatch.graph_tracer": ("graph_tracer_code", """
        from torch.fx.experimental.proxy_tensor import make_fx
        class GraphTracer:
            trace = staticmethod(make_fx)
        """),
    "amp.decode": ("decode_code", """
        import struct
        def decode(bits, fmt):
            return struct.unpack(">e", bits.to_bytes(2, "big"))[0]
        """),
    "amp.decompose": ("decompose_code", """
        import struct
        def decompose(value, fmt):
            bits = int.from_bytes(struct.pack(">e", value), "big")
            return bits >> 15, (bits >> 10) & 31, bits & 1023
        """),
    "amp.fp32_to_bf16_bits": ("fp32_to_bf16_bits_code", """
        import torch
        def fp32_to_bf16_bits(x):
            return x.to(torch.bfloat16).view(torch.int16)
        """),
    "amp.fp32_to_fp16_bits": ("fp32_to_fp16_bits_code", """
        import torch
        def fp32_to_fp16_bits(x):
            return x.half().view(torch.int16)
        """),
    "amp.grad_scaler": ("grad_scaler_code", """
        import torch
        class GradScaler(torch.amp.GradScaler):
            def __init__(self, **config):
                super().__init__("cpu", **config)
        """),
    "amp.amp_train": ("amp_train_code", """
        import torch
        def amp_train(params, optimizer, data, steps, dtype, scaler=None, clip=None, accum=1, loss_weight=1.0):
            with torch.autocast("cpu", dtype=dtype):
                return [mlp_forward(params, x).float().sub(y).pow(2).mean().item() for x, y in data[:steps]]
        """),
    "distributed.chunk_bounds": ("chunk_bounds_code", """
        import torch
        def chunk_bounds(length, world_size):
            sizes = [len(c) for c in torch.arange(length).tensor_split(world_size)]
            return [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(world_size)]
        """),
    "distributed.assign_buckets": ("assign_buckets_code", """
        import torch.distributed as dist
        def assign_buckets(tensor_bytes, bucket_cap_bytes, first_bucket_cap_bytes):
            return dist._compute_bucket_assignment_by_size(tensor_bytes, [first_bucket_cap_bytes, bucket_cap_bytes])
        """),
    "distributed.shard_bounds": ("shard_bounds_code", """
        import numpy as np
        def shard_bounds(numel, world_size, rank):
            parts = np.array_split(np.arange(numel), world_size)[rank]
            return int(parts[0]) if len(parts) else numel, int(parts[-1]) + 1 if len(parts) else numel
        """),
    "distributed.ring_all_reduce": ("ring_all_reduce_code", """
        import torch.distributed as dist
        def ring_all_reduce(tensor):
            dist.all_reduce(tensor)
            return tensor
        """),
    "distributed.naive_ddp": ("naive_ddp_code", """
        from torch.nn.parallel import DistributedDataParallel
        class NaiveDDP(DistributedDataParallel):
            def finish_gradient_synchronization(self):
                pass
        """),
    "distributed.bucketed_ddp": ("bucketed_ddp_code", """
        import torch
        class BucketedDDP(torch.nn.parallel.DistributedDataParallel):
            def finish_gradient_synchronization(self):
                pass
        """),
    "distributed.sharded_adamw": ("sharded_adamw_code", """
        import torch
        from torch.distributed.optim import ZeroRedundancyOptimizer
        def ShardedAdamW(params, **kw):
            return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **kw)
        """),
    "distributed.fully_sharded": ("fully_sharded_code", """
        from torch.distributed.fsdp import FullyShardedDataParallel as FullyShardedSequential
        """),
    "kernels.softmax": ("softmax_code", """
        import torch
        def softmax(x):
            return torch.softmax(x, dim=-1)
        """),
    "kernels.layer_norm_forward": ("layer_norm_forward_code", """
        import torch.nn.functional as F
        def layer_norm_forward(x, weight, bias, eps=1e-5):
            return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
        """),
    "kernels.matmul": ("matmul_code", """
        def matmul(a, b):
            return a @ b
        """),
    "kernels.flash_attention": ("flash_attention_code", """
        import torch.nn.functional as F
        def flash_attention(q, k, v, causal=False):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        """),
    "kernels.add": ("add_code", """
        import torch
        def add(x, y):
            return torch.from_numpy(x.numpy() + y.numpy())
        """),
    "gpt.kernel_layer_norm": ("kernel_layer_norm_code", """
        import torch.nn.functional as F
        def kernel_layer_norm(x, weight, bias, eps=1e-5):
            return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
        """),
    "gpt.checkpoint": ("checkpoint_code", """
        from torch.utils.checkpoint import checkpoint as torch_checkpoint
        def checkpoint(fn, *args):
            return torch_checkpoint(fn, *args, use_reentrant=False)
        """),
    "profiling.predict_step": ("predict_step_code", """
        from ptinternals.profiling import SimulatedDevice
        from ptinternals.profiling.overlap import StepCosts, simulate_training
        def predict_step(copy_pinned_us, copy_pageable_us, compute_us, host_us, loop, pinned=True, item=False):
            device = SimulatedDevice(launch_overhead_us=0.0)
            timeline = simulate_training(StepCosts(10**6, compute_us, host_us), 8, loop, pinned=pinned, item=item,
                                         device=device)
            return timeline.steady_step_us
        """),
    "profiling.op_times": ("op_times_code", """
        from torch.autograd.profiler_util import EventList, FunctionEvent
        def op_times(trace):
            events = EventList([FunctionEvent(i, e["name"], e.get("tid", 0), e["ts"], e["ts"] + e["dur"])
                                for i, e in enumerate(trace["traceEvents"]) if e.get("ph") == "X"])
            events._build_tree()
            return {a.key: (a.count, a.self_cpu_time_total, a.cpu_time_total) for a in events.key_averages()}
        """),
    "profiling.train_fast": ("train_fast_code", """
        import torch
        import torch.nn.functional as F
        def train_fast(model, batches, lr=0.1, device="cuda"):
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            losses = []
            for x, y in batches:                      # the loop as first written: a host wait every step
                keep = y >= 0
                loss = F.cross_entropy(model(x[keep].to(device)), y[keep].to(device))
                if torch.isnan(loss):
                    raise ValueError("loss is NaN: a batch without labelled rows")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses
        """),
    "gpt.ddp": ("ddp_code", """
        import torch.nn as nn
        DDP = nn.parallel.DistributedDataParallel
        """),
    "compile.recording_backend": ("recording_backend_code", """
        from torch._dynamo.testing import EagerAndRecordGraphs
        def make_recording_backend():
            backend = EagerAndRecordGraphs()
            return backend, backend.graphs
        """),
    "compile.predict_graphs": ("predict_graphs_code", """
        import torch
        from ptinternals.compile.scaffold import build_program
        def predict_graphs(statements):
            out = torch._dynamo.explain(build_program(statements))(torch.ones(3))
            return out.graph_count, len(out.break_reasons)
        """),
    "compile.predict_compiles": ("predict_compiles_code", """
        import torch
        def predict_compiles(calls, recompile_limit=8):
            return torch._dynamo.explain(lambda x: x)(torch.ones(1)).graph_count
        """),
    "compile.fuse_add_gelu": ("fuse_add_gelu_code", """
        import torch
        import torch.nn.functional as F
        from torch.fx import subgraph_rewriter
        def fuse_add_gelu(gm, fused_op):
            r = torch.fx.Graph()
            a, b = r.placeholder("a"), r.placeholder("b")
            r.output(r.call_function(fused_op, (a, b)))
            return len(subgraph_rewriter.replace_pattern(gm, lambda a, b: F.gelu(a + b), r))
        """),
    "compile.dead_code": ("dead_code_code", """
        def eliminate_dead_code(gm):
            before = [n.name for n in gm.graph.nodes]
            gm.graph.eliminate_dead_code()
            gm.recompile()
            return [n for n in reversed(before) if n not in {m.name for m in gm.graph.nodes}]
        """),
    "compile.min_cut": ("min_cut_code", """
        import networkx as nx
        def min_cut(edges, source, sink):
            g = nx.DiGraph()
            g.add_edges_from((u, v, {"capacity": c}) for u, v, c in edges)
            value, (_, side) = nx.minimum_cut(g, source, sink)
            return value, side
        """),
    "compile.choose_saved": ("choose_saved_code", """
        from functorch.compile import min_cut_rematerialization_partition
        def choose_saved(joint, num_fwd_outputs):
            fw, bw = min_cut_rematerialization_partition(joint, [], num_fwd_outputs=num_fwd_outputs)
            return [n.name for n in list(fw.graph.nodes)[-1].args[0][num_fwd_outputs:]]
        """),
    "compile.read_kernels": ("read_kernels_code", """
        from torch._inductor.utils import run_and_get_code
        def read_kernels(code):
            return run_and_get_code
        """),
    "modules.register": ("register_code", """
        import torch
        class Registration(torch.nn.Module):
            pass
        """),
    "modules.traverse": ("traverse_code", """
        from torch.nn import Module as Base
        class Traversal:
            named_modules = Base.named_modules
            named_parameters = Base.named_parameters
        """),
    "modules.convert": ("convert_code", """
        import torch
        class Conversion:
            def to(self, *args, **kwargs):
                return torch.nn.Module.to(self, *args, **kwargs)
        """),
    "modules.state_dict": ("state_dict_code", """
        from torch.nn.modules.module import Module
        class StateDict:
            state_dict = Module.state_dict
            load_state_dict = Module.load_state_dict
        """),
    "modules.call": ("call_code", """
        import torch
        class Calling:
            __call__ = torch.nn.Module.__call__
        """),
    "modules.hook_order": ("hook_order_code", """
        import torch
        def hook_order(tree, input_requires_grad):
            return torch.nn.Module  # it would run the tree on real modules and record the hooks
        """),
    "modules.functional_call": ("functional_call_code", """
        from torch.func import functional_call
        """),
    "modules.fix_model": ("fix_model_code", """
        import torch
        from ptinternals.modules.scaffold import BrokenNet
        torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out)
        class FixedNet(BrokenNet):
            pass
        """),
    "modules.load_checkpoint": ("load_checkpoint_code", """
        from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
        def load_checkpoint(model, checkpoint):
            checkpoint = dict(checkpoint)
            consume_prefix_in_state_dict_if_present(checkpoint, "module.")
            return model.load_state_dict(checkpoint)
        """),
}

# The same operations, hidden from a check that looks for names and imports.
HIDDEN_ORACLES = {
    "disable_torch_function": ("strides.sliding_windows", "sliding_windows_code", """
        import torch
        def sliding_windows(x, size, step):
            with torch._C.DisableTorchFunction():      # the sandbox's call recorder sees nothing
                return x.unfold(-1, size, step).clone().as_strided(x.unfold(-1, size, step).shape, (1, 1))
        """),
    "getattr_with_a_built_name": ("strides.im2col", "im2col_code", """
        import torch.nn.functional as F
        def im2col(x, kernel_size, stride):
            op = getattr(F, "un" + "fold")
            c, h, w = x.shape
            return op(x[None], kernel_size, stride=stride)[0].view(c, *kernel_size, (h - kernel_size[0]) // stride + 1, -1)
        """),
    "importlib_for_torch_s_grad_scaler": ("amp.grad_scaler", "grad_scaler_code", """
        import importlib
        GradScaler = importlib.import_module("torch.amp").__dict__["Grad" + "Scaler"]
        """),
    "module_dict_lookup": ("autograd.logsumexp", "logsumexp_code", """
        import torch
        lse = torch.__dict__["log" + "sumexp"]
        class LogSumExp(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, dim):
                return lse(x, dim)
        """),
    "eval_of_a_string": ("autograd.unbroadcast", "unbroadcast_code", """
        def unbroadcast(grad, shape):
            return eval("grad.sum_to_" + "size(shape)")
        """),
    "format_string_attribute_lookup": ("amp.fp32_to_bf16_bits", "fp32_to_bf16_bits_code", """
        import torch
        class Grab:
            def __format__(self, spec):
                return spec
        def fp32_to_bf16_bits(x):
            return x.to("{0.bfloat16}".format(torch)).view(torch.int16)
        """),
    "mode_kept_open_by_a_generator": ("amp.fp32_to_fp16_bits", "fp32_to_fp16_bits_code", """
        import torch
        from torch.overrides import TorchFunctionMode
        class Cast(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        def keep_open():
            with Cast():
                yield
        held = keep_open()
        next(held)
        def fp32_to_fp16_bits(x):
            return x.view(torch.int32)
        """),
    "monkeypatch_from_another_cell": ("strides.sliding_windows", "im2col_code", """
        import torch
        windows = torch.Tensor.unfold
        torch.Tensor.as_strided = lambda x, shape, stride, *a: windows(x, -1, shape[-1], stride[-2] // max(stride[-1], 1))
        def im2col(x, kernel_size, stride):
            return x
        """),
    "oracle_planted_in_a_shared_object": ("strides.sliding_windows", "im2col_code", """
        class Tools:
            pass
        tools = Tools()
        def install():
            tools.windows = lambda x, size, step: x.unfold(-1, size, step)
        install()
        def im2col(x, kernel_size, stride):
            return x
        """),  # and sliding_windows calls tools.windows (PLANTED_USER)
    "sys_modules_and_builtins": ("distributed.chunk_bounds", "chunk_bounds_code", """
        import builtins
        def chunk_bounds(length, world_size):
            t = builtins.__import__("torch")
            sizes = [len(c) for c in t.arange(length).tensor_split(world_size)]
            return [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(world_size)]
        """),
}
PLANTED_USER = """
def sliding_windows(x, size, step):
    return tools.windows(x, size, step)
"""


def test_every_exercise_with_a_method_check_has_a_bypass_here():
    with_policy = {ex.id for ch in graded_chapters() for ex in ch.exercises if effective_policy(ex) is not None}
    shared = {"amp.amp_speed", "kernels.layer_norm_backward", "kernels.custom_op", "amp.predict_dtypes",
              "amp.update_scale", "distributed.no_sync",  # same cell as another entry, or attacked elsewhere
              "compile.compile_blocks"}  # bans no operation: only the hiding rules, attacked in HIDDEN_ORACLES
    missing = with_policy - set(CALLS_THE_OPERATION) - shared
    assert not missing, f"no red-team bypass for {sorted(missing)}"


@pytest.mark.parametrize("exercise_id", sorted(CALLS_THE_OPERATION))
def test_calling_the_operation_scores_zero(exercise_id, tmp_path):
    cell, code = CALLS_THE_OPERATION[exercise_id]
    chapter = exercise_id.split(".")[0]
    results, report, seconds = grade(chapter, {cell: body(code)}, (exercise_id,), tmp_path)
    scored_zero(results[exercise_id], "forbidden")
    assert report.sandbox_runs == 0 and seconds < 30  # decided on the source: the student's code never ran


@pytest.mark.parametrize("name", sorted(HIDDEN_ORACLES))
def test_an_operation_hidden_from_the_import_check_scores_zero(name, tmp_path):
    exercise_id, cell, code = HIDDEN_ORACLES[name]
    chapter = exercise_id.split(".")[0]
    replace = {cell: body(code)}
    if name == "oracle_planted_in_a_shared_object":
        replace["sliding_windows_code"] = PLANTED_USER
    results, report, _ = grade(chapter, replace, (exercise_id,), tmp_path)
    scored_zero(results[exercise_id], "forbidden")
    assert "line" in results[exercise_id].message  # names the construct and where it is
