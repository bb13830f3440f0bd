# %% [markdown]
# # {{title}}
#
# One GPU trains too slowly, or the model does not fit. **Data parallelism** runs the same training
# step in N processes at once, each on its own slice of the batch, and makes them agree: every
# process (a **rank**) holds a replica of the model, computes gradients on its data, and the ranks
# average their gradients before every optimizer step, so the replicas stay identical. Everything
# else in this chapter is about doing that averaging cheaply (the ring all-reduce, buckets, overlap
# with backward) and about not storing N copies of everything (ZeRO and FSDP shard the optimizer
# state, the gradients and finally the parameters over the ranks).
#
# You will build, from `torch.distributed` primitives only: a ring all-reduce from sends and
# receives, DDP (gradient hooks that finish by themselves when backward ends, then buckets that are
# all-reduced while backward is still running and rebuilt in the order gradients really arrive, then
# `no_sync` for gradient accumulation), a ZeRO-1 sharded AdamW that matches `torch.optim.AdamW` step
# for step (frozen and tied parameters included), a wrapper with FSDP2's design that keeps every
# parameter as a dim-0 shard and gathers a layer's parameters only while it computes, and a
# `torchrun` trainer that saves a checkpoint and resumes bit-identically. The same code runs with the `gloo` backend on CPU tensors
# (here) and with `nccl` on GPUs.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) and a *check cell*. The checks of the multi-rank
# exercises start 2 to 4 real ranks (forked processes joined in a gloo process group), run your code
# in every rank and compare with single-process PyTorch: the sum of the ranks' tensors, the gradients
# of the full batch, the trajectory of `torch.optim.AdamW`. A rank that hangs is stopped after a few
# seconds and the message says which rank is stuck in which call, on which line of yours. The
# grader runs your answer cells in a separate process, without the course's reference
# implementation, on more cases (3 and 4 ranks, awkward sizes). Quiz answers are recorded in
# `distributed.answers.json` beside this notebook: *practice* questions check your answer at once and
# count no points; *graded* ones only record it (the last answer counts) and are scored when your
# notebook is graded.

# %% [setup]
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from ptinternals.distributed.scaffold import TinyMLP, all_gather_flat, make_dataset, reduce_scatter_flat
from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz
from ptinternals.viz.distributed import plot_ddp_timeline, plot_fsdp_memory, plot_ring_all_reduce

torch.manual_seed(0)

# %% [markdown]
# ## 1. Ranks, process groups and collectives
#
# A distributed job is N ordinary processes. Each one calls
# `dist.init_process_group(backend, rank=r, world_size=N)` and meets the others at a **rendezvous**
# (by default `env://`: the environment variables `MASTER_ADDR`, `MASTER_PORT`, `RANK`,
# `WORLD_SIZE`; rank 0 hosts a small key-value `TCPStore` there, through which the ranks exchange
# addresses). The result is the default **process group**: the set of ranks that take part in
# **collectives**. The Python API is `torch/distributed/distributed_c10d.py`; the backends are C++
# classes, `ProcessGroupGloo` (CPU tensors, TCP) and `ProcessGroupNCCL` (GPU tensors, NVLink and
# InfiniBand), in `torch/csrc/distributed/c10d/`.
#
# **`torchrun`** (`torch/distributed/run.py`) is the launcher: `torchrun --nproc_per_node=8
# train.py` starts 8 copies of your script with `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`
# and `MASTER_PORT` set, watches them, and tears the job down if one dies. On several machines you
# run the same command on each, with `--nnodes=2 --node_rank=k --rdzv_endpoint=host:port`: the
# script does not change. The course's `run_ranks` (`ptinternals/distributed/launch.py`) is a small
# torchrun for notebooks: it spawns N processes, sets the same variables, runs one function in each
# and returns what they return, and it never hangs (more in section 7).
#
# A collective is called by **every** rank of the group, in the same order, with matching sizes.
# With N ranks and a tensor of L elements:
#
# | collective | before (rank r has) | after | elements each rank sends (ring) |
# |---|---|---|---|
# | `all_reduce(t)` | `t_r` | every rank: sum over r of `t_r` | 2 (N-1)/N L |
# | `broadcast(t, src=0)` | `t_r` | every rank: `t_0` | about L |
# | `all_gather_single(out, t)` | `t_r`, L elements | every rank: `[t_0, t_1, ...]`, N L elements | (N-1) L |
# | `reduce_scatter_single(out, t)` | `t_r`, N L elements | rank r: sum of slice r of every `t_i` (L elements) | (N-1) L |
# | `send(t, dst)` / `recv(t, src)` | point to point | | L |
#
# All-reduce = reduce-scatter + all-gather: remember this identity, ZeRO and FSDP are built on it.
# (`all_gather_single` and `reduce_scatter_single` are torch 2.13's names for
# `all_gather_into_tensor` and `reduce_scatter_tensor`; the setup cell imported `all_gather_flat` and
# `reduce_scatter_flat`, which call whichever your torch has.)
#
# We start 3 ranks **once** and run every demonstration of this chapter in them
# (`ptinternals/distributed/demos.py`, which uses the reference implementation); the sections below
# show the parts. A spawned rank, like torchrun's, is a fresh interpreter that imports torch
# (seconds); `start_method="fork"` copies this notebook's process instead, torch already loaded, so
# the ranks start at once (fine for gloo on CPU; CUDA does not survive a fork). First, what each
# collective left on each rank, when rank r started with `[10 r + 1, 10 r + 2]`:

# %%
import time

import torch._dynamo  # noqa: F401  (torch.optim imports it on first use: once here, and the forked ranks share it)

from ptinternals.distributed import demos, run_ranks

t0 = time.perf_counter()
tour = run_ranks(demos.tour, 3, start_method="fork")  # [rank 0's results, rank 1's, rank 2's]
print(f"3 ranks started, ran every demo and returned in {time.perf_counter() - t0:.1f} s\n")
for key in ("input", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "recv_from_left"):
    print(f"{key:15s}", "   ".join(f"rank {r}: {tour[r]['collectives'][key]}" for r in range(3)))

# %% [markdown]
# Reduce-scatter's input on rank r was `[10 r + 1, ..., 10 r + 6]` (N L = 6 elements); rank 0 got
# the sum of the first two elements over the ranks, rank 1 of the next two, and so on.

# %% [markdown]
# ## 2. The ring all-reduce
#
# The obvious all-reduce, every rank sending its whole tensor to one rank that sums and sends the
# result back, makes that one rank move (N-1) L elements in and out: its link is the bottleneck. The
# **ring** all-reduce (NCCL's `runRing` in `src/device/all_reduce.h`; gloo's `AllreduceRing` in
# `third_party/gloo/gloo/allreduce_ring_chunked.h`) keeps every link equally busy. The ranks stand
# in a ring, rank r sends only to rank (r + 1) mod N and receives only from (r - 1) mod N, and the
# tensor is cut into N chunks:
#
# * **reduce-scatter**, N - 1 steps: at step s rank r sends chunk (r - s) mod N to the right and adds
#   the chunk it receives from the left, (r - s - 1) mod N, into its own copy. Every step, every
#   chunk gains one more rank's contribution; after N - 1 steps rank r holds the *complete* sum of
#   chunk (r + 1) mod N.
# * **all-gather**, N - 1 steps: at step s rank r sends chunk (r + 1 - s) mod N, a finished sum, and
#   *overwrites* chunk (r - s) mod N with the finished sum it receives.
#
# Each rank sends 2 (N - 1) chunks of L / N elements: **2 (N-1)/N L**, less than 2 L however many
# ranks there are. That is why the ring is bandwidth-optimal; its weakness is latency: 2 (N - 1)
# sequential steps, which is why NCCL switches to trees for small messages. In the usual cost model
# (a latency alpha per message, a time beta per byte) one all-reduce costs about
# 2 (N-1) alpha + 2 (N-1)/N L beta.
#
# ### {{exercise chunk_bounds}}: the chunks
#
# Write `chunk_bounds(length, world_size)` returning a list of `world_size` pairs `(start, end)`:
# the chunks of a flat tensor of `length` elements. Chunk sizes differ by at most one, the **first**
# `length % world_size` chunks get one extra element (the split `torch.tensor_split` makes), nothing
# is dropped, and chunks may be empty when `length < world_size`. A `world_size` below 1 or a negative
# `length` raises `ValueError`. Plain Python only.

# %% [answer chunk_bounds]
def chunk_bounds(length, world_size):
    """[start, end) of each of the world_size chunks of a flat tensor of `length` elements."""
    ### BEGIN SOLUTION
    # twin: ptinternals.distributed.ring.chunk_bounds
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    base, extra = divmod(length, world_size)
    bounds, start = [], 0
    for c in range(world_size):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds
    ### END SOLUTION


# %% [tests chunk_bounds]
check("distributed.chunk_bounds", chunk_bounds)
### BEGIN HIDDEN TESTS
check("distributed.chunk_bounds", chunk_bounds, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Here is the whole schedule for 4 ranks. Rank r's data is the letter r (`b2` is chunk 2 of rank
# 1's tensor); the red outline is the chunk each rank sends to its right neighbour next.

# %%
plot_ring_all_reduce(4)

# %% [markdown]
# ### {{exercise ring_all_reduce}}: ring all-reduce from sends and receives
#
# Write `ring_all_reduce(tensor)`: sum `tensor` over every rank of the default process group, **in
# place**, with the schedule above, using only point-to-point operations. The checker runs it in 2,
# 3 and 4 ranks on tensors of any length (0, 1, fewer elements than ranks, not divisible by the
# world size, a thousand), in float32, float64 and int64, and 2-d or non-contiguous (then work on a
# contiguous flat copy and copy the result back with `tensor.copy_`). It compares with the sum
# `dist.all_reduce` gives, checks that rank r talks only to its two neighbours, and that it sends at
# most 2 (N - 1) chunks.
#
# Tips:
#
# * `rank, n = dist.get_rank(), dist.get_world_size()`; use your `chunk_bounds`.
# * If every rank first does a blocking `dist.send` and then a `dist.recv`, a large message can
#   deadlock the ring (everybody sends, nobody receives). Post both at once:
#   `works = dist.batch_isend_irecv([dist.P2POp(dist.isend, chunk, right), dist.P2POp(dist.irecv,
#   inbox, left)])`, then `w.wait()` for each.
# * Receive into a temporary buffer during reduce-scatter (you *add* it), directly into the chunk
#   during all-gather (you *overwrite* it). A chunk of a contiguous flat tensor, `flat[s:e]`, is a
#   view: receiving into it writes into `flat`.
# * An empty chunk (when length < N) must be skipped by both its sender and its receiver.

# %% [answer ring_all_reduce]
def ring_all_reduce(tensor):
    """Sum `tensor` over all ranks of the default group, in place, with a ring of sends and receives."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION
    # twin: ptinternals.distributed.ring.ring_all_reduce
    if tensor.numel() == 0:
        return
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)  # (L,)
    bounds = chunk_bounds(flat.numel(), n)
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(send_chunk, recv_into):
        s, e = bounds[send_chunk]
        ops = []
        if e > s:
            ops.append(dist.P2POp(dist.isend, flat[s:e], right))
        if recv_into.numel() > 0:
            ops.append(dist.P2POp(dist.irecv, recv_into, left))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    for step in range(n - 1):  # reduce-scatter: add the received chunk
        s, e = bounds[(rank - step - 1) % n]
        inbox = torch.empty(e - s, dtype=flat.dtype)
        exchange((rank - step) % n, inbox)
        flat[s:e] += inbox
    for step in range(n - 1):  # all-gather: overwrite with the finished chunk
        s, e = bounds[(rank - step) % n]
        exchange((rank + 1 - step) % n, flat[s:e])
    if not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
    ### END SOLUTION


# %% [tests ring_all_reduce]
check("distributed.ring_all_reduce", ring_all_reduce)
### BEGIN HIDDEN TESTS
check("distributed.ring_all_reduce", ring_all_reduce, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The reference ring (`ptinternals/distributed/ring.py`) against gloo's own all-reduce, on 1,000,003
# float32 values (4 MB) over the 3 ranks started above. Python's per-step overhead is small at this
# size; the bytes are the point: each rank sent 2 (N-1)/N = 4/3 of the tensor.

# %%
r0 = tour[0]["ring"]
print(f"max |ring - dist.all_reduce| = {r0['max_error']:.2g}")
print(f"ring: {r0['ms_ring']:.1f} ms, gloo's all_reduce: {r0['ms_gloo']:.1f} ms")
print(f"bytes sent by rank 0: {r0['bytes_sent']:,} = {r0['bytes_sent'] / r0['bytes']:.3f} x the "
      f"{r0['bytes']:,}-byte tensor")

# %% [quiz]
show_quiz("distributed", "q1")

# %% [markdown]
# ## 3. DistributedDataParallel
#
# DDP (`torch/nn/parallel/distributed.py`, and its C++ half, the `Reducer` in
# `torch/csrc/distributed/c10d/reducer.cpp`) makes N replicas train as one model:
#
# 1. **Same start.** At construction, rank 0's parameters and buffers are broadcast to every rank
#    (`_sync_module_states` in `torch/distributed/utils.py`). Without it every replica would start
#    from its own random initialisation and they would never agree.
# 2. **Average the gradients.** Each rank's loss is the mean over its own B/N samples; the mean over
#    ranks of those gradients is the gradient of the mean loss over the whole batch of B, exactly
#    what one process would compute. With no communication hook registered, the Reducer multiplies
#    each gradient by 1/N *while copying it into its bucket* (`mark_variable_ready_dense`: one pass
#    over the data instead of a copy and then a division) and all-reduces the bucket with the C++
#    `_AllReduceBySumCommHook`, a plain SUM. (The Python `allreduce_hook` in
#    `torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py` is what you get when you register
#    it yourself: it divides the bucket, then sums.)
# 3. **Start early.** A gradient is final as soon as autograd has accumulated it into `p.grad`.
#    `p.register_post_accumulate_grad_hook(fn)` calls `fn(p)` at exactly that moment, so the
#    all-reduce of the last layer's gradient can start (asynchronously, `async_op=True` returns a
#    `Work` handle) while backward is still computing the first layers'.
# 4. **Know when backward has ended.** Every handle must be waited on, and the reduced values be in
#    `p.grad`, before `optimizer.step()` reads them; but DDP's user only calls `loss.backward()`.
#    The autograd engine keeps, per backward call, a list of *final callbacks* that it runs once the
#    whole graph has been executed, before `backward()` returns:
#    `torch.autograd.Variable._execution_engine.queue_callback(fn)` appends to it, and may only be
#    called while a backward is running, so the Reducer calls it from the first gradient hook of each
#    backward (`autograd_hook` in reducer.cpp) with `finalize_backward`, which waits for every bucket
#    and writes the averaged gradients into `p.grad`. Nobody calls a "finish" method.
#
# ### {{exercise naive_ddp}}: DDP, one all-reduce per parameter
#
# Write the class `NaiveDDP(module)`: broadcast every parameter and buffer from rank 0 in
# `__init__`; register a post-accumulate-grad hook on every parameter that requires grad, which
# divides `p.grad` by the world size and launches `dist.all_reduce(p.grad, async_op=True)`, keeping
# the handle; the first hook of each backward also queues `finish_gradient_synchronization` on the
# engine (`torch.autograd.Variable._execution_engine.queue_callback`), which waits for every handle
# when backward ends (and lets the next backward queue it again); `forward` runs the module. The
# checker gives each rank a *different* initial model, trains 2 SGD steps, and compares the weights
# after wrapping, every gradient the moment `loss.backward()` returns (it never calls your finish
# method) and the final weights with single-process training on the full batch; it also checks that
# there is exactly one asynchronous all-reduce per parameter that gets a gradient, that the first
# one starts before backward has produced the last gradient, and that every one was waited on
# before backward returned. Its models have frozen parameters (no hook, no gradient), a parameter
# the forward never uses and weights tied between two layers (one parameter, one hook).

# %% [answer naive_ddp]
class NaiveDDP(nn.Module):
    """DDP without buckets: an async all-reduce per parameter, launched from its gradient hook."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        ### BEGIN SOLUTION
        # twin: ptinternals.distributed.naive_ddp.NaiveDDP
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)  # every replica starts from rank 0's values
        self._pending = []  # Work handles of the all-reduces in flight
        self._callback_queued = False
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)
        ### END SOLUTION

    def _hook(self, param):
        """Runs when param.grad holds this parameter's accumulated gradient."""
        ### BEGIN SOLUTION
        if not self._callback_queued:  # the first hook of this backward: wait for everything at its end
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)
        param.grad.div_(self.world_size)  # the sum over ranks of grad / N is the mean
        self._pending.append(dist.all_reduce(param.grad, async_op=True))
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        """Wait until every gradient all-reduce has finished. The autograd engine runs it when backward ends."""
        ### BEGIN SOLUTION
        for work in self._pending:
            work.wait()
        self._pending.clear()
        self._callback_queued = False
        ### END SOLUTION


# %% [tests naive_ddp]
check("distributed.naive_ddp", NaiveDDP)
### BEGIN HIDDEN TESTS
check("distributed.naive_ddp", NaiveDDP, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("distributed", "q2", "q5", "q11")

# %% [markdown]
# ### Buckets
#
# One collective per parameter pays one latency per parameter: a transformer has hundreds of small
# tensors (biases, norms), and launching hundreds of tiny all-reduces per step wastes most of the
# link. DDP therefore copies gradients into **buckets**, flat buffers of about `bucket_cap_mb = 25`
# MiB, and all-reduces a bucket as one tensor when its last gradient arrives. Which gradients share
# a bucket is decided by `compute_bucket_assignment_by_size` (reducer.cpp; callable as
# `dist._compute_bucket_assignment_by_size`): walk the tensors in a given order and add each to the
# open bucket of its dtype and device; close the bucket as soon as its size **reaches** its limit (so
# it may overshoot by its last tensor, and a tensor bigger than the limit gets a bucket of its own);
# the limits are used in turn, the last one repeating. DDP calls it twice:
#
# * **At construction** (`_ddp_init_helper` in `torch/nn/parallel/distributed.py`), over the
#   parameters in *registration* order, and hands the Reducer the bucket list *reversed*, since
#   gradients arrive roughly last layer first. With the defaults the only limit is `sys.maxsize`:
#   the **first iteration runs with one bucket**, all-reduced when backward has produced every
#   gradient. DDP does not know yet in which order the gradients will arrive (a model's forward need
#   not follow its registration order, and a wrong guess could launch an all-reduce on one rank while
#   another is in a different collective), so it does not overlap anything yet. During that first
#   backward the Reducer records the order in which the gradients become ready (`rebuilt_params_`).
# * **At the next forward** (`Reducer::rebuild_buckets`), over the parameters *in that recorded
#   order*, with the limits `[first_bucket_bytes_cap, bucket_bytes_cap]`: the first bucket is small,
#   `dist._DEFAULT_FIRST_BUCKET_BYTES` = 1 MiB (when `bucket_cap_mb` is left at its default; with your
#   own cap the first bucket gets that cap too), so the first all-reduce starts after the first few
#   gradients; the others hold up to 25 MiB. Rank 0's assignment is broadcast so that every rank
#   agrees, and the buckets never change again. (Under `find_unused_parameters=True` there is no
#   rebuild: the construction-time buckets use `[1 MiB, cap]` over the registration order, reversed,
#   so the small bucket holds the first layers and goes out last.)
#
# Buckets are launched strictly in order (`next_bucket_`): every rank then issues the same
# collectives in the same order, even if its gradients arrive in a slightly different order. Here is
# torch's own Reducer on rank 0 of the tour (six 128 x 128 layers of 64.5 KiB, `bucket_cap_mb=0.1`):
# the buckets it holds at construction, and after the first backward, as indices of
# `list(model.parameters())` (12 tensors: weight 0, bias 0, weight 1, ...). The rebuilt buckets start
# with the last layer's bias: its gradient is the first one ready.

# %%
for when in ("at construction", "after the first backward"):
    print(f"{when:26s}", tour[0]["torch_buckets"][when])

# %% [markdown]
# ### {{exercise assign_buckets}}: bucket assignment
#
# Write `assign_buckets(tensor_bytes, bucket_cap_bytes, first_bucket_cap_bytes)`: the rebuild's
# call, for tensors of one dtype and device. `tensor_bytes[i]` is the size in bytes of tensor i,
# listed in the order their gradients became ready. Return the buckets as lists of tensor indices, in
# order: walk the tensors, add each to the open bucket, and close the bucket as soon as its total is
# `>=` its limit (`first_bucket_cap_bytes` for the first bucket, `bucket_cap_bytes` for every later
# one); keep the last, partly filled bucket. The checker compares with
# `dist._compute_bucket_assignment_by_size(tensors, [first_bucket_cap_bytes, bucket_cap_bytes])`,
# with totals exactly at a limit and one byte either side. Plain Python only.

# %% [answer assign_buckets]
def assign_buckets(tensor_bytes, bucket_cap_bytes, first_bucket_cap_bytes):
    """Bucket the tensors (given in ready order) like DDP's Reducer: lists of indices."""
    ### BEGIN SOLUTION
    # twin: ptinternals.distributed.buckets.assign_buckets
    buckets, current, size = [], [], 0
    limit = first_bucket_cap_bytes
    for i, nbytes in enumerate(tensor_bytes):
        current.append(i)
        size += nbytes
        if size >= limit:  # reached: close it (it may overshoot by this tensor)
            buckets.append(current)
            current, size = [], 0
            limit = bucket_cap_bytes
    if current:
        buckets.append(current)
    return buckets
    ### END SOLUTION


# %% [tests assign_buckets]
check("distributed.assign_buckets", assign_buckets)
### BEGIN HIDDEN TESTS
check("distributed.assign_buckets", assign_buckets, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise bucketed_ddp}}: bucketed DDP, overlapping backward
#
# Write `BucketedDDP(module, bucket_cap_mb=25.0, first_bucket_cap_mb=1.0)` the way the Reducer works
# (`first_bucket_cap_mb` stands for `dist._DEFAULT_FIRST_BUCKET_BYTES`):
#
# * `__init__`: broadcast from rank 0 as before. Keep the parameters that require grad
#   (`self.params`) and start with **one** bucket holding all of them, in registration order.
#   Register on every parameter a post-accumulate-grad hook that calls `self._on_grad_ready(index,
#   param)` ({{exercise no_sync}} overrides that method).
# * `build_buckets(assignment)`: for lists of parameter indices, in launch order, give each bucket a
#   flat buffer (`torch.zeros(sum of its numels)`), a count of gradients still missing, and each
#   parameter a slot (bucket, element offset).
# * `_on_grad_ready(index, param)`: the first hook of a backward queues
#   `finish_gradient_synchronization` on the autograd engine. Until the buckets are rebuilt, append
#   `index` to the order of ready gradients. Copy `param.grad` into its slot; when that fills the
#   bucket, launch every bucket that is now complete **in bucket order**: divide its buffer by the
#   world size, `dist.all_reduce(buffer, async_op=True)`, keep the handle.
# * `forward`: when grad is enabled, the buckets not yet rebuilt and the first backward's order
#   complete, rebuild them: `assign_buckets` over the parameters' byte sizes (`p.numel() *
#   p.element_size()`) in that order, limits `int(bucket_cap_mb * 2**20)` and
#   `int(first_bucket_cap_mb * 2**20)`; then run the module.
# * `finish_gradient_synchronization()` (run by the engine when backward ends): wait for every
#   bucket, copy each parameter's slice of its reduced bucket back into `p.grad`, and reset the
#   per-backward state (missing counts, next bucket to launch, the queued-callback flag).
#
# The checker trains with tiny caps (so a small MLP gets several buckets) and checks the gradients
# when `loss.backward()` returns, and that each backward issues exactly torch's buckets (the same
# sizes, in the same order: one bucket in the first backward, then the rebuilt ones) as single flat
# all-reduces, asynchronously, the first one before backward has produced the last gradient (when
# there are several), each waited on before backward returns. Its models have a frozen parameter (not
# bucketed) and weights tied between two layers (one parameter, bucketed once).

# %% [answer bucketed_ddp]
class BucketedDDP(nn.Module):
    """DDP with gradient buckets, each all-reduced as soon as it is full, while backward runs."""

    def __init__(self, module, bucket_cap_mb=25.0, first_bucket_cap_mb=1.0):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self.require_backward_grad_sync = True  # {{exercise no_sync}} turns this off inside no_sync()
        ### BEGIN SOLUTION
        # twin: ptinternals.distributed.ddp.DistributedDataParallel
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.caps = (int(bucket_cap_mb * 2**20), int(first_bucket_cap_mb * 2**20))
        self.build_buckets([list(range(len(self.params)))])  # first iteration: one bucket, registration order
        self.ready_order, self.rebuilt = [], False  # the first backward's order of ready gradients
        self.callback_queued = False
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._on_grad_ready(i, p))
        ### END SOLUTION

    def build_buckets(self, assignment):
        """One flat buffer per list of parameter indices (in launch order); slot[i] = (bucket, offset)."""
        ### BEGIN SOLUTION
        self.buckets, self.slot = [], {}
        for b, indices in enumerate(assignment):
            total = 0
            for i in indices:
                self.slot[i] = (b, total)
                total += self.params[i].numel()
            self.buckets.append({"params": indices, "pending": len(indices), "work": None,
                                 "buffer": torch.zeros(total, dtype=self.params[indices[0]].dtype)})  # (total,)
        self.next_bucket = 0  # buckets are launched strictly in order
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        ### BEGIN SOLUTION
        if torch.is_grad_enabled() and not self.rebuilt and len(self.ready_order) == len(self.params):
            sizes = [self.params[i].numel() * self.params[i].element_size() for i in self.ready_order]
            positions = assign_buckets(sizes, *self.caps)  # rebuild_buckets: the order gradients really arrived
            self.build_buckets([[self.ready_order[k] for k in bucket] for bucket in positions])
            self.rebuilt = True
        ### END SOLUTION
        return self.module(*args, **kwargs)

    def _on_grad_ready(self, index, param):
        """Hook body: param.grad holds parameter `index`'s accumulated gradient."""
        ### BEGIN SOLUTION
        if not self.callback_queued:  # the first hook of this backward: finish when backward ends
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)
        if not self.rebuilt:
            self.ready_order.append(index)
        b, offset = self.slot[index]
        bucket = self.buckets[b]
        bucket["buffer"][offset:offset + param.numel()].copy_(param.grad.reshape(-1))
        bucket["pending"] -= 1
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket]["pending"] == 0:
            ready = self.buckets[self.next_bucket]
            ready["buffer"].div_(self.world_size)
            ready["work"] = dist.all_reduce(ready["buffer"], async_op=True)
            self.next_bucket += 1
        ### END SOLUTION

    def finish_gradient_synchronization(self):
        """Wait for every bucket, copy the averaged gradients into p.grad, reset for the next backward.
        The autograd engine runs it when backward ends."""
        ### BEGIN SOLUTION
        self.callback_queued = False
        if self.next_bucket < len(self.buckets):
            raise RuntimeError("backward ended before every bucket was all-reduced: a parameter got no gradient")
        with torch.no_grad():
            for bucket in self.buckets:
                bucket["work"].wait()
                for i in bucket["params"]:
                    _, offset = self.slot[i]
                    p = self.params[i]
                    p.grad.copy_(bucket["buffer"][offset:offset + p.numel()].view_as(p))
                bucket["pending"], bucket["work"] = len(bucket["params"]), None
        self.next_bucket = 0
        ### END SOLUTION


# %% [tests bucketed_ddp]
check("distributed.bucketed_ddp", BucketedDDP)
### BEGIN HIDDEN TESTS
check("distributed.bucketed_ddp", BucketedDDP, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Seeing the overlap
#
# The reference DDP (`ptinternals/distributed/ddp.py`) records when each gradient became ready and
# when each bucket's all-reduce was launched and finished. Here is one warm iteration on rank 0 of an
# MLP of six 256 x 256 layers with a 0.25 MiB first bucket and 0.5 MiB later ones. Bucket 0 (the
# last layer) goes out as soon as its two gradients are ready, while backward is still computing the
# earlier layers; bucket 1 follows. The last bucket, the first layer's, cannot overlap anything: it
# is ready only when backward ends. On CPUs with gloo an all-reduce is slow next to this little
# compute, so the step still waits after backward; with NCCL on GPUs and real layer sizes the
# balance usually tips the other way, and the communication hides almost entirely.

# %%
d0 = tour[0]["ddp"]
print("buckets (launch order):", d0["buckets"])
print("bucket bytes:", d0["bucket_bytes"])
plot_ddp_timeline(d0["timeline"])

# %% [markdown]
# ### Gradient accumulation: `no_sync()`
#
# To train with a batch bigger than memory allows, run several micro-batches forward and backward and
# step once: gradients **accumulate** in `p.grad`. With DDP, synchronising after every micro-batch
# would waste communication: only the sum matters. `with ddp.no_sync():` turns the hooks off, each
# rank's `p.grad` accumulates its own micro-batches, and the first backward *outside* the context
# all-reduces the accumulated total. This works because a post-accumulate-grad hook sees `p.grad`
# **after** the new gradient was added to it: the whole sum goes into the bucket. (A tensor hook,
# `p.register_hook`, sees only the incoming gradient, before accumulation: the earlier micro-batches
# would be lost.)
#
# ### {{exercise no_sync}}: `no_sync`
#
# Write `AccumulatingDDP(BucketedDDP)` with a context manager `no_sync()` that sets
# `self.require_backward_grad_sync = False` for its duration (and restores the previous value, even
# on an exception), and make `_on_grad_ready` do nothing while it is False: no slot is filled, no
# order recorded, no callback queued, so nothing is left to finish when that backward ends. (torch
# reads the flag in `forward`, not in the hooks: a forward run inside `no_sync()` does not sync even
# if its backward runs outside. The checker runs both inside, where the two agree.) The checker runs 3
# micro-batches per step, the first 2 inside `no_sync()` (where no collective may be called, except
# the broadcast of rank 0's rebuilt buckets that torch makes at the forward after the first
# backward, and each rank keeps its own gradient), then checks the gradients when the synced
# backward returns against the full batch, for 2 steps.

# %% [answer no_sync]
class AccumulatingDDP(BucketedDDP):
    """BucketedDDP plus no_sync(): accumulate gradients locally, synchronise once."""

    @contextlib.contextmanager
    def no_sync(self):
        ### BEGIN SOLUTION
        # twin: ptinternals.distributed.ddp.DistributedDataParallel
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old
        ### END SOLUTION

    def _on_grad_ready(self, index, param):
        ### BEGIN SOLUTION
        if self.require_backward_grad_sync:  # inside no_sync(): no bucket, no callback, no communication
            super()._on_grad_ready(index, param)
        ### END SOLUTION


# %% [tests no_sync]
check("distributed.no_sync", AccumulatingDDP)
### BEGIN HIDDEN TESTS
check("distributed.no_sync", AccumulatingDDP, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Unused parameters, and who reads which sample
#
# A parameter that gets no gradient in some iteration (a branch not taken, a frozen head) never fires
# its hook, its bucket never fills, and DDP waits forever at the end of backward.
# `find_unused_parameters=True` makes the Reducer walk the autograd graph from the forward's
# outputs after every forward (`search_unused_parameters`), mark the parameters it cannot reach as
# ready with a zero gradient, and all-reduce a bitmap of which parameters were used anywhere. Both
# cost time every iteration: prefer removing unused parameters, or `static_graph=True` when the set
# is the same every step. (The reference `DistributedDataParallel` implements the flag; its tests
# show the hang it prevents.)
#
# Each rank must also read *different* samples. `DistributedSampler` (`torch/utils/data/distributed.py`)
# shuffles the indices with a generator seeded by `seed + epoch` (the same permutation on every
# rank), pads it to a multiple of N (or drops the tail with `drop_last=True`) and gives rank r every
# N-th index starting at r. Call `sampler.set_epoch(epoch)` every epoch, or every epoch has the same
# order. It needs no process group:

# %%
from torch.utils.data import TensorDataset

ds = TensorDataset(torch.arange(10))
for epoch in (0, 1):
    per_rank = []
    for r in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=r, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
    print(f"epoch {epoch}:", "  ".join(f"rank {r}: {idx}" for r, idx in enumerate(per_rank)),
          "(10 samples padded to 12: two are read twice)")

# %% [quiz]
show_quiz("distributed", "q3", "q4", "q10")

# %% [markdown]
# ## 4. ZeRO: stop storing N copies
#
# DDP replicates *everything*. With mixed-precision AdamW a parameter costs 16 bytes: 2 (bf16
# weight) + 2 (bf16 gradient) + 12 (fp32 master weight and two fp32 moments); in pure fp32, 4 + 4 +
# 8. A 7-billion-parameter model needs 112 GB per GPU before a single activation. ZeRO (Rajbhandari
# et al., 2020) observed that each rank only needs its *share* of most of it:
#
# | stage | sharded over the N ranks | bytes per parameter per rank (mixed precision) | communication per step |
# |---|---|---|---|
# | DDP | nothing | 16 | all-reduce (= reduce-scatter + all-gather) |
# | ZeRO-1 | optimizer state | 4 + 12 / N | reduce-scatter grads, all-gather params: same as DDP |
# | ZeRO-2 | + gradients | 2 + 14 / N | same as DDP |
# | ZeRO-3 / FSDP | + parameters | 16 / N | all-gather params twice (forward, backward) + reduce-scatter: 1.5 x DDP |
#
# ZeRO-1 in one sentence: flatten all parameters into one vector of P elements, give rank r the range
# `[r S, (r+1) S)` with S = ceil(P / N); each step, **reduce-scatter** the flat gradient so rank r
# receives the summed gradient of its range, step AdamW on that range only (its moments are S
# elements, not P), and **all-gather** the updated ranges back into every rank's parameters.
# torch's version is `torch/distributed/optim/zero_redundancy_optimizer.py` (it partitions whole
# parameters instead of a flat range); DeepSpeed's stage 1 and 2 use flat ranges.
#
# AdamW is elementwise, so this is exactly AdamW, *if* two things `torch.optim.AdamW` does per
# parameter survive the flattening. Each parameter has its own step count (the bias correction
# divides by 1 - beta^t). And a parameter whose `.grad` is None is **skipped**: no moments, no step
# count, and no decoupled weight decay (`p *= 1 - lr * weight_decay` happens only to parameters with a
# gradient). A frozen parameter (`requires_grad=False`) or one the forward did not use keeps its value.
# Treating the missing gradient as zero is a real bug (the course's own reference had it): the
# moments stay 0, but weight decay shrinks the frozen weights a little every step. So rank r keeps its
# range as **pieces**, one per parameter that overlaps it (a parameter may be split between ranks), and
# a `torch.optim.AdamW` over the pieces keeps per-parameter state and skips a piece whose `.grad` is
# None. Whether a parameter has a gradient must be decided over **all** ranks, since its piece may
# live on a rank whose batch did not use it: one small all-reduce of a flag per parameter (DDP's
# `local_used_map` does the same); a gradient missing on some ranks counts as zero in the mean, as
# averaging the full-batch loss over ranks does. Tied parameters are one parameter
# (`model.parameters()` lists each once), with the sum of both uses' gradients.
#
# ### {{exercise shard_bounds}}: a rank's shard
#
# Write `shard_bounds(numel, world_size, rank)` returning `(start, end)` of `rank`'s shard: shards of
# S = ceil(numel / world_size) elements (the all-gather needs equal sizes), clamped to `numel`, so the
# last shards may be short or empty and nothing is dropped: the split `torch.chunk` makes, which is also
# how FSDP2 splits a parameter's rows. A `world_size` below 1 or a negative `numel` raises
# `ValueError`, a `rank` outside `[0, world_size)` `IndexError`. Plain Python only.

# %% [answer shard_bounds]
def shard_bounds(numel, world_size, rank):
    """[start, end) of `rank`'s shard of a flat vector of `numel` elements."""
    ### BEGIN SOLUTION
    # twin: ptinternals.distributed.zero.shard_bounds
    if world_size < 1 or numel < 0:
        raise ValueError(f"need world_size >= 1 and numel >= 0, got world_size={world_size}, numel={numel}")
    if not 0 <= rank < world_size:
        raise IndexError(f"rank must be in [0, {world_size}), got {rank}")
    shard = -(-numel // world_size)  # ceil(numel / world_size)
    return min(rank * shard, numel), min((rank + 1) * shard, numel)
    ### END SOLUTION


# %% [tests shard_bounds]
check("distributed.shard_bounds", shard_bounds)
### BEGIN HIDDEN TESTS
check("distributed.shard_bounds", shard_bounds, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise sharded_adamw}}: ZeRO-1, a sharded AdamW
#
# Write `ShardedAdamW(params, lr, betas, eps, weight_decay)` with `step()` and `zero_grad()`. Every
# rank calls it with the same model's parameters, whose `.grad` hold **local** gradients (no DDP
# here: averaging is your job). In `__init__`, copy your range of the flattened parameters into a
# tensor of `end - start` elements, cut it into one `nn.Parameter` per parameter that overlaps your
# range (`nn.Parameter(shard[a:b])` is a view: stepping it updates the shard), and build a
# `torch.optim.AdamW` over those pieces. In `step()`: all-reduce a flag per parameter saying whether
# its `.grad` is set; flatten the gradients into a zero-padded buffer of N S elements, divide by N,
# `reduce_scatter_flat` it into an S-element buffer, give each piece its slice as `.grad` (None when
# no rank has a gradient for its parameter), step, then `all_gather_flat` the zero-padded updated
# ranges into N S elements and copy them into the parameters that stepped (`p.copy_(...)` under
# `torch.no_grad()`).
#
# The checker trains 3 steps and compares every rank's parameters after every step with
# `torch.optim.AdamW` on the full batch (the expected values come from torch's optimizer), on models
# with a frozen parameter, one the forward never uses, one only rank 0's batch uses, weights tied
# between layers and a column-major weight; then it counts the bytes of the tensors your optimizer
# keeps between steps (everything reachable from its attributes, gradients and the model's
# parameters aside): at most 3 x 4 x S (two moments and the shard) plus a little for step counters.
# Keep the padded full-size buffers local to `step()`.

# %% [answer sharded_adamw]
class ShardedAdamW:
    """AdamW whose state is sharded over the ranks (ZeRO stage 1). Same steps as torch.optim.AdamW."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        ### BEGIN SOLUTION
        # twin: ptinternals.distributed.zero.ZeroRedundancyAdamW
        self.offsets = [0]  # offsets[i]: where params[i] starts in the flat vector of P elements
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.numel = self.offsets[-1]  # P
        self.shard_size = -(-self.numel // self.world_size)  # S = ceil(P / N)
        self.start, self.end = shard_bounds(self.numel, self.world_size, self.rank)
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])  # (P,)
            self.shard = flat[self.start:self.end].clone()  # (end - start,): my range of the weights
        self.pieces = []  # (i, a, b, piece): params[i]'s part [a, b) of my range, a view of the shard
        for i in range(len(self.params)):
            a, b = max(self.offsets[i], self.start), min(self.offsets[i + 1], self.end)
            if a < b:
                self.pieces.append((i, a, b, nn.Parameter(self.shard[a - self.start:b - self.start])))
        pieces = [piece for *_, piece in self.pieces] or [nn.Parameter(torch.zeros(0))]
        self.optimizer = torch.optim.AdamW(pieces, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        ### END SOLUTION

    @torch.no_grad()
    def step(self):
        ### BEGIN SOLUTION
        n, s, dtype = self.world_size, self.shard_size, self.params[0].dtype
        used = torch.tensor([p.grad is not None for p in self.params], dtype=torch.int32)
        dist.all_reduce(used)  # which parameters have a gradient on SOME rank
        flat_grad = torch.zeros(n * s, dtype=dtype)  # (N*S,): local grads, zeros where None and as padding
        for i, p in enumerate(self.params):
            if p.grad is not None:
                flat_grad[self.offsets[i]:self.offsets[i + 1]] = p.grad.reshape(-1)
        flat_grad /= n
        grad_shard = torch.empty(s, dtype=dtype)  # (S,): the mean gradient of my range
        reduce_scatter_flat(grad_shard, flat_grad)
        for i, a, b, piece in self.pieces:  # no gradient anywhere: None, and AdamW skips the piece
            piece.grad = grad_shard[a - self.start:b - self.start].clone() if used[i] else None
        self.optimizer.step()  # per piece: moments, step count, decoupled weight decay
        padded = torch.zeros(s, dtype=dtype)
        padded[: self.end - self.start] = self.shard
        flat = torch.empty(n * s, dtype=dtype)  # (N*S,): every rank's updated range
        all_gather_flat(flat, padded)
        for i, p in enumerate(self.params):
            if used[i]:
                p.copy_(flat[self.offsets[i]:self.offsets[i + 1]].view_as(p))
        ### END SOLUTION

    def zero_grad(self):
        for p in self.params:
            p.grad = None


# %% [tests sharded_adamw]
check("distributed.sharded_adamw", ShardedAdamW)
### BEGIN HIDDEN TESTS
check("distributed.sharded_adamw", ShardedAdamW, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The reference `ZeroRedundancyAdamW` on the 3 ranks, for an MLP of 26,122 parameters, against
# one process's AdamW (which keeps both moments of every parameter, 8 bytes each, plus step
# counters):

# %%
for r in range(3):
    z = tour[r]["zero"]
    print(f"rank {r}: shard {z['shard']}, optimizer state {z['state_bytes']:,} bytes "
          f"(unsharded AdamW: {z['full_state_bytes']:,} bytes)")

# %% [quiz]
show_quiz("distributed", "q6", "q12")

# %% [markdown]
# ## 5. FSDP: sharding the parameters too
#
# ZeRO-3, which PyTorch calls **FSDP** (Fully Sharded Data Parallel), shards the parameters as well:
# between uses, rank r holds only its share of each layer. PyTorch's current FSDP is **FSDP2**,
# `torch.distributed.fsdp.fully_shard` (`torch/distributed/fsdp/_fully_shard/`):
#
# * **Groups.** You call `fully_shard(block)` on each block (a transformer layer), then
#   `fully_shard(model)` on the root. Each call makes one *group* of the parameters in that module
#   that no inner group holds. A group is the unit of communication (one all-gather, one
#   reduce-scatter) and of memory (its parameters exist in full only while it computes).
# * **Every parameter sharded on dim 0.** A parameter of shape (d0, ...) is split like
#   `torch.chunk(p, N, dim=0)`: S = ceil(d0 / N) rows per rank, the last ranks' short or empty. The
#   shard **replaces the parameter on its module**, under the same name: a `DTensor` with placement
#   `Shard(0)` over a `DeviceMesh`, which knows its global shape. So `model.parameters()` yields the
#   shards, `optimizer = AdamW(model.parameters())` works unchanged and keeps state for this rank's
#   rows only, and state dicts keep their names.
# * **All-gather before forward, and again before backward.** Before a group's forward each rank
#   copies its shards, padded to S rows, into one buffer, one all-gather brings every rank's, and
#   each full parameter is copied out of it into an *unsharded parameter* that the modules compute
#   with. After forward, with `reshard_after_forward=True` (the default for every group but the
#   root), the modules get their shards back and the unsharded parameters' storage is freed
#   (`untyped_storage().resize_(0)`): autograd still holds the tensors it saved for backward, with no
#   memory behind them. A hook on the group's outputs re-allocates that storage and all-gathers into
#   it before the group's backward runs. `reshard_after_forward=False` keeps the full parameters from
#   forward to backward: one all-gather fewer, one group more in memory (the root's choice: its
#   backward comes first).
# * **Reduce-scatter of the gradients.** When the group's gradients are ready they are laid out
#   rank-major in one buffer and reduce-scattered (divided by N): each rank receives its rows of the
#   mean gradient, added to its shard's `.grad`, and the full parameters are freed again.
# * **Mixed precision.** `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`
#   casts the shards before the all-gather (half the bytes on the wire, compute in bf16) and
#   reduce-scatters gradients in fp32; the shards and the optimizer stay fp32.
# * **Frozen and tied parameters.** A frozen parameter (`requires_grad=False`) is sharded and
#   gathered like any other and gets no gradient. A parameter used twice inside one group is one
#   parameter. A parameter tied between two groups is refused at the first forward ("use
#   `fully_shard([module_a, module_b])` to place them in the same FSDP group").
#
# **History: FSDP1's flat parameters.** The first FSDP (`FullyShardedDataParallel`;
# `torch/distributed/fsdp/_flat_param.py`, `FlatParamHandle`) flattened each unit's parameters into
# one `FlatParameter`, sharded that flat vector in ranges as ZeRO-1 does above, and made the module's
# parameters views into it. The optimizer saw only flat shards, so parameter names, per-parameter
# settings (no weight decay on biases), frozen parameters mixed with trainable ones and state dicts
# all needed special handling (`use_orig_params=True`). FSDP2 shards each parameter on its own and
# pays for it with a copy into and out of each collective's buffer. The reference keeps both designs:
# `ptinternals/distributed/fsdp2.py` (FSDP2, without DTensor) and `fsdp.py` (FSDP1).
#
# ### {{exercise fully_sharded}}: FSDP2's design, for an `nn.Sequential`
#
# Write `FullyShardedSequential(model)`, whose units are the children of an `nn.Sequential`:
#
# * `__init__`: for every parameter of each child, this rank's rows `[r S, (r+1) S)` of dim 0 (S =
#   ceil(d0 / N), clamped to d0: possibly none) become an `nn.Parameter` with the parameter's
#   `requires_grad`, **set on the child in place of the parameter**, under its own name (`setattr`
#   on the submodule that owns it). Record each unit's `(name, shard)` pairs in `self.units[k]`, each
#   parameter once, and each full shape in `self.shapes[name, k]`. A parameter used twice inside a
#   unit is one shard; a parameter tied between two units may share one shard between them (autograd
#   adds the two units' gradients) or be refused with a `ValueError` naming it, as torch does.
# * `gather(k)`: `{name: full parameter}` of unit k: pad each shard to S rows, all-gather into
#   N S rows, drop the padding rows.
# * `reduce_scatter(k, name, grad_full)`: pad the full gradient to N S rows, divide by N,
#   reduce-scatter, keep this rank's rows.
# * `run_unit(k, full, x)` (given) runs child k with its parameters replaced by the tensors in
#   `full` (`torch.func.functional_call`).
# * `forward`: run the units in order (children without parameters as they are) through the
#   `autograd.Function` `_ShardedUnit`, whose `forward` gathers, runs the unit (no autograd inside a
#   Function's forward, so nothing is saved) and drops the full parameters, and whose `backward`
#   gathers again, re-runs the unit with autograd on, gets the gradients of the input and of the
#   full parameters that require grad with `torch.autograd.grad` (`allow_unused=True`: a parameter
#   the forward never reads gets None) and reduce-scatters them into the shards' gradients. Re-running
#   the unit is activation checkpointing, a simplification: FSDP2 keeps the activations and re-gathers
#   only the parameters, with the storage trick above.
#
# The checker trains 3 SGD (momentum) steps with `torch.optim.SGD(model.parameters())` and compares
# `model.named_parameters()` right after wrapping with what torch's `fully_shard` keeps (the same
# names; shard r is `torch.chunk(p, N, dim=0)[r]`), each rank's losses, the output and every shard
# after training with one process on the full batch. Its models have a frozen parameter, one the
# forward never uses, a layer whose weight is used twice inside one unit, weights tied between two
# units, a column-major weight, and layers with fewer rows than ranks. It tracks the all-gathers'
# outputs: at no moment may more than 3 gathered units be alive, nor as many bytes as the whole
# model. (tests/distributed runs torch's `fully_shard` on gloo on the same kinds of models and checks
# that it agrees with these expected values.)

# %% [answer fully_sharded]
class _ShardedUnit(torch.autograd.Function):
    """forward: gather the unit's parameters, run it, free them. backward: gather again, recompute, and
    reduce-scatter each parameter's gradient into its shard's .grad."""

    @staticmethod
    def forward(ctx, x, owner, k, *shards):
        ### BEGIN SOLUTION
        full = owner.gather(k)  # {name: full parameter}: gathered, freed when this function returns
        out = owner.run_unit(k, full, x)
        ctx.save_for_backward(x)
        ctx.owner, ctx.k = owner, k
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        ### BEGIN SOLUTION
        (x,) = ctx.saved_tensors
        owner, k = ctx.owner, ctx.k
        full = owner.gather(k)  # gather again
        trainable = [name for name, shard in owner.units[k] if shard.requires_grad]
        with torch.enable_grad():
            x = x.detach().requires_grad_(ctx.needs_input_grad[0])
            for name in trainable:
                full[name].requires_grad_()
            out = owner.run_unit(k, full, x)
            inputs = ([x] if x.requires_grad else []) + [full[name] for name in trainable]
            grads = list(torch.autograd.grad(out, inputs, grad_out, allow_unused=True))
        grad_x = grads.pop(0) if x.requires_grad else None
        reduced = {name: None if g is None else owner.reduce_scatter(k, name, g) for name, g in zip(trainable, grads)}
        return (grad_x, None, None, *[reduced.get(name) for name, _ in owner.units[k]])
        ### END SOLUTION


class FullyShardedSequential(nn.Module):
    """FSDP2's design for an nn.Sequential: every parameter of each child sharded on dim 0, the shard registered
    on the child under the parameter's own name; full parameters exist only while their unit computes."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.units = []  # units[k]: [(name, shard)] of child k, each parameter once (a tied one: one shard)
        self.shapes = {}  # shapes[name, k]: the full shape of unit k's parameter `name`
        ### BEGIN SOLUTION
        # twin: ptinternals.distributed.fsdp2.FullyShardedSequential
        n, r = self.world_size, self.rank
        shard_of = {}  # id(original parameter) -> its shard: a parameter tied between units is sharded once
        for child in model:
            unit = []
            for name, p in list(child.named_parameters(remove_duplicate=False)):
                if id(p) not in shard_of:
                    rows = -(-p.shape[0] // n)  # S = ceil(d0 / N) rows per rank, as torch.chunk
                    lo, hi = min(r * rows, p.shape[0]), min((r + 1) * rows, p.shape[0])
                    shard_of[id(p)] = nn.Parameter(p.detach()[lo:hi].clone(), requires_grad=p.requires_grad)
                shard = shard_of[id(p)]
                if all(s is not shard for _, s in unit):
                    unit.append((name, shard))
                    self.shapes[name, len(self.units)] = p.shape
                owner, _, attr = name.rpartition(".")
                setattr(child.get_submodule(owner), attr, shard)  # FSDP2: the shard IS the parameter
            self.units.append(unit)
        ### END SOLUTION

    def gather(self, k):
        """{name: full parameter} of unit k, all-gathered from every rank's shard."""
        ### BEGIN SOLUTION
        n, full = self.world_size, {}
        for name, shard in self.units[k]:
            shape = self.shapes[name, k]
            rows = -(-shape[0] // n)
            padded = torch.zeros((rows,) + tuple(shape[1:]), dtype=shard.dtype)  # (S, *rest)
            padded[: shard.shape[0]] = shard.detach()
            gathered = torch.empty((n * rows,) + tuple(shape[1:]), dtype=shard.dtype)  # (N*S, *rest)
            all_gather_flat(gathered.view(-1), padded.view(-1))
            full[name] = gathered[: shape[0]]  # drop the padding rows
        return full
        ### END SOLUTION

    def reduce_scatter(self, k, name, grad_full):
        """The gradient of unit k's full parameter `name` -> this rank's rows of the mean over ranks."""
        ### BEGIN SOLUTION
        n, shape = self.world_size, self.shapes[name, k]
        rows = -(-shape[0] // n)
        padded = torch.zeros((n * rows,) + tuple(shape[1:]), dtype=grad_full.dtype)  # (N*S, *rest)
        padded[: shape[0]] = grad_full / n
        mine = torch.empty((rows,) + tuple(shape[1:]), dtype=grad_full.dtype)  # (S, *rest)
        reduce_scatter_flat(mine.view(-1), padded.view(-1))
        shard = dict(self.units[k])[name]
        return mine[: shard.shape[0]]
        ### END SOLUTION

    def run_unit(self, k, full, x):
        """Run child k with its parameters replaced by the tensors in `full` (given)."""
        return torch.func.functional_call(self.model[k], full, (x,))

    def forward(self, x):
        ### BEGIN SOLUTION
        for k, child in enumerate(self.model):
            x = _ShardedUnit.apply(x, self, k, *[s for _, s in self.units[k]]) if self.units[k] else child(x)
        return x
        ### END SOLUTION


# %% [tests fully_sharded]
check("distributed.fully_sharded", FullyShardedSequential)
### BEGIN HIDDEN TESTS
check("distributed.fully_sharded", FullyShardedSequential, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Memory over one step
#
# The reference FSDP2 (`ptinternals/distributed/fsdp2.py`, which keeps activations and re-gathers
# only the parameters) on a 6-layer MLP over 3 ranks: the bytes of unsharded parameters alive after
# each all-gather and reshard, in forward then backward. With `reshard_after_forward=True` they never
# exceed one group; with `False` every group stays gathered from its forward to its backward. The
# dashed line is the unsharded model.

# %%
f0 = tour[0]["fsdp"]
print(f"peak unsharded bytes {f0['peak']:,} (reshard_after_forward=False: {f0['peak_no_reshard']:,}) of "
      f"{f0['unsharded_bytes']:,}; this rank holds {f0['shard_elements']:,} parameter elements of "
      f"{f0['unsharded_bytes'] // 4:,}")
plot_fsdp_memory(f0["events"], unsharded_bytes=f0["unsharded_bytes"])

# %% [markdown]
# ### torch's `fully_shard`
#
# Rank 0 of the tour ran torch's FSDP2 on a 10 -> 16 -> 16 -> 3 MLP, every `nn.Linear` a group, with
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`: the first layer's
# weight is a `DTensor` of global shape (16, 10) whose local shard on each of the 3 ranks has
# ceil(16 / 3) = 6 rows (the last rank 4); the forward computes in bf16, the gradients arrive in fp32.

# %%
print({k: v for k, v in tour[0]["fsdp2"].items() if k != "seconds"})

# %% [markdown]
# **Checkpointing sharded state.** No rank has the whole model. Either gather it (FSDP's full state
# dict, rank 0 writes one file: simple, but it must fit in one rank's memory) or let every rank write
# its shards: `torch.distributed.checkpoint` (DCP) saves one file per rank plus metadata describing
# which slice of which tensor each holds, and can **reshard** on load, to a different number of
# ranks. FSDP2's state dict is made of the DTensor shards, which DCP saves as they are; FSDP1's
# reference offers both (`full_state_dict`, `sharded_state_dict`).

# %% [quiz]
show_quiz("distributed", "q7", "q13", "q14")

# %% [markdown]
# ## 6. A torchrun trainer that survives a crash
#
# Long jobs die: a node fails, the time limit expires. A checkpoint must hold everything the *next*
# steps depend on, so that a resumed run is **bit-identical** to one that never stopped:
#
# * the weights (DDP keeps the replicas equal, so rank 0 saves one copy);
# * the optimizer state (AdamW's moments and step counts: without them the first resumed steps are
#   different);
# * the step, from which the data position follows (`DistributedSampler.set_epoch(epoch)` and the
#   batch index within the epoch);
# * **every rank's** RNG state: dropout draws from it, and each rank has its own stream. Collect them
#   with `dist.all_gather_object(states, torch.get_rng_state())`, a collective every rank calls.
#
# Write the file to a temporary name and `os.replace` it onto the final one (atomic on POSIX: a
# crash while saving never leaves a truncated checkpoint), and `dist.barrier()` afterwards so no rank
# runs ahead before the file exists.
#
# ### {{exercise train_resume}}: save and resume
#
# `train(config)` below is one rank of a torchrun job (given): it joins the group from the
# environment torchrun sets, trains `TinyMLP` (which has dropout) with torch's
# `DistributedDataParallel`, AdamW and a `DistributedSampler`, and calls your two functions. Write
# `save_checkpoint(path, step, model, optimizer)` (every rank calls it; rank 0 writes, atomically)
# and `load_checkpoint(path, model, optimizer)` (every rank calls it; restores everything, this rank's
# RNG state included, and returns the step to continue from). `torch.load(path, weights_only=True)`
# reads back tensors, dicts, lists and numbers. The checker launches `train` three times in 2 (and
# 3) ranks with torchrun's environment: A runs 6 steps saving every 3; B stops after step 4 (a
# crash); C resumes from B's `step3.pt`. C must start at step 3 and reproduce A's losses and final
# weights exactly.

# %% [answer train_resume]
def save_checkpoint(path, step, model, optimizer):
    """Every rank calls this; rank 0 writes {step, model, optimizer, every rank's RNG state} atomically."""
    ### BEGIN SOLUTION
    # twin: none (the entry is a whole torchrun training run; the reference trainer, ptinternals.distributed.train_ddp, is a command-line script that saves the same checkpoint contents)
    rng = [None] * dist.get_world_size()
    dist.all_gather_object(rng, torch.get_rng_state())  # rng[r] is rank r's CPU generator state
    if dist.get_rank() == 0:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "rng": rng, "world_size": dist.get_world_size()}
        tmp = path + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    dist.barrier()
    ### END SOLUTION


def load_checkpoint(path, model, optimizer):
    """Every rank calls this: restore model, optimizer and this rank's RNG state; return the step."""
    ### BEGIN SOLUTION
    ckpt = torch.load(path, weights_only=True)
    if ckpt["world_size"] != dist.get_world_size():
        raise ValueError(f"{path} was written by {ckpt['world_size']} ranks, this job has {dist.get_world_size()}")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["rng"][dist.get_rank()])
    return ckpt["step"]
    ### END SOLUTION


def train(config):
    """One rank of a torchrun job. config: steps, batch_size (global), lr, seed, save_every, ckpt_dir,
    resume (a checkpoint path or None), stop_after (None, or stop early: a simulated crash)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = config["batch_size"] // world
    torch.manual_seed(config["seed"])
    model = TinyMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    torch.manual_seed(config["seed"] + 1 + rank)  # each rank its own dropout stream
    start = 0
    if config.get("resume"):
        start = load_checkpoint(config["resume"], model, optimizer)
    ddp = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
    data = make_dataset(seed=config["seed"])
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=config["seed"],
                                 drop_last=True)
    steps_per_epoch = len(sampler) // per_rank
    last = config["steps"] if config.get("stop_after") is None else min(config["steps"], config["stop_after"])
    losses = []
    for step in range(start, last):
        epoch, pos = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)  # the shuffle is a function of (seed, epoch)
        idx = list(sampler)[pos * per_rank:(pos + 1) * per_rank]
        loss = F.mse_loss(ddp(data.tensors[0][idx]), data.tensors[1][idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        if config.get("save_every") and (step + 1) % config["save_every"] == 0:
            save_checkpoint(os.path.join(config["ckpt_dir"], f"step{step + 1}.pt"), step + 1, model, optimizer)
    return {"start": start, "losses": losses, "model": {k: v.detach().clone() for k, v in model.state_dict().items()}}


# %% [tests train_resume]
check("distributed.train_resume", train)
### BEGIN HIDDEN TESTS
check("distributed.train_resume", train, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The same thing with the real launcher. The reference script `ptinternals/distributed/train_ddp.py`
# (this chapter's DDP, the same checkpoint contents) under `torchrun`: 2 processes on this machine.
# On a cluster, the same command runs on every node with `--nnodes`, `--node_rank` and
# `--rdzv_endpoint`.

# %%
import subprocess
import sys
import tempfile

work = tempfile.mkdtemp()
cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
       "-m", "ptinternals.distributed.train_ddp", "--steps", "6", "--save-every", "3", "--ckpt-dir", "ckpt"]
t0 = time.perf_counter()
proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
print("$ torchrun --standalone --nproc_per_node=2 -m ptinternals.distributed.train_ddp --steps 6 --save-every 3 ...")
print(proc.stdout.strip() or proc.stderr[-2000:])
saved = sorted(os.listdir(os.path.join(work, "ckpt"))) if os.path.isdir(os.path.join(work, "ckpt")) else []
print(f"(exit code {proc.returncode}, {time.perf_counter() - t0:.1f} s; checkpoints written: {saved})")

# %% [quiz]
show_quiz("distributed", "q9")

# %% [markdown]
# ## 7. How distributed jobs hang, and how to find out why
#
# A collective is matched by *order*, not by name: the k-th collective of every rank meets the k-th
# of the others. Everything that makes ranks call different sequences hangs the job: one rank takes
# an `if rank == 0:` branch containing a collective; one rank raises and stops calling; shapes
# differ (a different number of buckets because one rank has an unused parameter); one rank skips an
# iteration because its data ran out. NCCL and gloo cannot tell what the peer *meant* to call: each
# rank waits for bytes that never come, until the group's timeout (`init_process_group(timeout=...)`,
# 30 minutes by default for gloo; NCCL's watchdog and its flight recorder report stuck collectives).
#
# What helps: `TORCH_DISTRIBUTED_DEBUG=DETAIL` wraps the process group in a checker that compares
# every collective's type and shapes across ranks before running it and raises "Detected mismatch
# between collectives"; `dist.monitored_barrier()` (gloo) names the ranks that did not arrive;
# `py-spy dump --pid <pid>` shows where each process is in Python. The course's `run_ranks` records
# the last collective each rank entered and kills everything after `timeout_s`. Here rank 0 calls
# `all_reduce` while rank 1 calls `broadcast`:

# %%
from ptinternals.distributed import RankTimeoutError

try:
    run_ranks(demos.mismatched, 2, timeout_s=3, start_method="fork")
except RankTimeoutError as err:
    print(err)

# %% [markdown]
# The checks of this chapter do the same for your code, and add the line each stuck rank is on.

# %% [quiz]
show_quiz("distributed", "q8")

# %% [markdown]
# ## Summary
#
# * A job is N processes in a process group; collectives are called by every rank, in the same
#   order. `torchrun` sets the environment that `init_process_group` reads.
# * The ring all-reduce sends 2 (N-1)/N of the data per rank: reduce-scatter, then all-gather.
# * DDP = broadcast at start + post-accumulate-grad hooks + buckets all-reduced asynchronously while
#   backward runs (one bucket in the first iteration, then rebuilt in the order the gradients arrived,
#   the first bucket small) + a callback queued on the autograd engine that finishes everything before
#   `loss.backward()` returns; `no_sync` accumulates and syncs once.
# * ZeRO shards optimizer state (1), gradients (2), parameters (3 = FSDP): same bytes on the wire for
#   1 and 2, 1.5x for 3, and memory per rank that shrinks like 1/N. Sharded or not, AdamW skips a
#   parameter without a gradient.
# * FSDP2 shards every parameter on dim 0 and keeps the shards as the model's parameters; a group's
#   parameters are all-gathered before its forward and again before its backward, and its gradients
#   reduce-scattered. FSDP1 did the same with one flat parameter per unit.
# * A resumable checkpoint holds weights, optimizer state, data position and every rank's RNG state,
#   written atomically.
# * Hangs are mismatched collectives: compare what each rank was doing last.
#
# Next: {{chapter kernels}} writes the kernels that run inside each of these ranks.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `distributed.answers.json`).

# %% [quiz-grade]
quiz_progress("distributed")
