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
# receives, DDP (gradient hooks, then buckets that are all-reduced while backward is still running,
# then `no_sync` for gradient accumulation), a ZeRO-1 sharded AdamW, a ZeRO-3/FSDP-style wrapper
# that gathers each layer's parameters only while it computes, and a `torchrun` trainer that saves a
# checkpoint and resumes bit-identically. The same code runs with the `gloo` backend on CPU tensors
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
# `distributed.answers.json`: **your first answer to each question counts**.

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
# is dropped, and chunks may be empty when `length < world_size`. Plain Python only.

# %% [answer chunk_bounds]
def chunk_bounds(length, world_size):
    """[start, end) of each of the world_size chunks of a flat tensor of `length` elements."""
    ### BEGIN SOLUTION
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
#    what one process would compute. DDP's default communication hook (`allreduce_hook` in
#    `torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py`) divides by the world size and
#    all-reduces with SUM.
# 3. **Start early.** A gradient is final as soon as autograd has accumulated it into `p.grad`.
#    `p.register_post_accumulate_grad_hook(fn)` calls `fn(p)` at exactly that moment, so the
#    all-reduce of the last layer's gradient can start (asynchronously, `async_op=True` returns a
#    `Work` handle) while backward is still computing the first layers'. Before `optimizer.step()`
#    every handle must be waited on.
#
# ### {{exercise naive_ddp}}: DDP, one all-reduce per parameter
#
# Write the class `NaiveDDP(module)`: broadcast every parameter and buffer from rank 0 in
# `__init__`; register a post-accumulate-grad hook on every parameter that divides `p.grad` by the
# world size and launches `dist.all_reduce(p.grad, async_op=True)`, keeping the handle;
# `forward` runs the module; `finish_gradient_synchronization()` waits for every handle (the
# checker calls it after `loss.backward()` and before the optimizer step). The checker gives each
# rank a *different* initial model, trains 2 SGD steps, and compares the weights after wrapping,
# every gradient and the final weights with single-process training on the full batch; it also
# checks that there is exactly one asynchronous all-reduce per parameter and that the first one
# starts before backward has produced the last gradient.

# %% [answer naive_ddp]
class NaiveDDP(nn.Module):
    """DDP without buckets: an async all-reduce per parameter, launched from its gradient hook."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        ### BEGIN SOLUTION
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)  # every replica starts from rank 0's values
        self._pending = []  # Work handles of the all-reduces in flight
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)
        ### END SOLUTION

    def _hook(self, param):
        """Runs when param.grad holds this parameter's accumulated gradient."""
        ### BEGIN SOLUTION
        param.grad.div_(self.world_size)  # the sum over ranks of grad / N is the mean
        self._pending.append(dist.all_reduce(param.grad, async_op=True))
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        """Wait until every gradient all-reduce has finished (call before optimizer.step())."""
        ### BEGIN SOLUTION
        for work in self._pending:
            work.wait()
        self._pending.clear()
        ### END SOLUTION


# %% [tests naive_ddp]
check("distributed.naive_ddp", NaiveDDP)
### BEGIN HIDDEN TESTS
check("distributed.naive_ddp", NaiveDDP, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("distributed", "q2", "q5")

# %% [markdown]
# ### Buckets
#
# One collective per parameter pays one latency per parameter: a transformer has hundreds of small
# tensors (biases, norms), and launching hundreds of tiny all-reduces per step wastes most of the
# link. DDP therefore copies gradients into **buckets**, flat buffers of about `bucket_cap_mb = 25`
# MiB, and all-reduces a bucket as one tensor when its last gradient arrives. The Reducer:
#
# * assigns parameters to buckets with `compute_bucket_assignment_by_size` (reducer.cpp; callable as
#   `dist._compute_bucket_assignment_by_size`), visiting them in the order their gradients are
#   expected: **reverse** registration order, last layer first. Each bucket has a size limit; it is
#   closed as soon as its size **reaches** the limit (so it may overshoot by its last tensor), and a
#   tensor bigger than the limit gets a bucket of its own. The **first** bucket's limit is small
#   (`dist._DEFAULT_FIRST_BUCKET_BYTES` = 1 MiB) so that the first all-reduce starts after only a few
#   gradients; the others use the cap.
# * after the first iteration, *rebuilds* the buckets in the order gradients actually arrived
#   (`rebuild_buckets`): a model's forward need not follow its registration order.
# * launches buckets strictly in order (`next_bucket_`): every rank then issues the same
#   collectives in the same order, even if its gradients arrive in a slightly different order.
#
# ### {{exercise assign_buckets}}: bucket assignment
#
# Write `assign_buckets(tensor_bytes, bucket_cap_bytes, first_bucket_cap_bytes)`: `tensor_bytes[i]`
# is the size in bytes of tensor i, listed in the order their gradients become ready. Return the
# buckets as lists of tensor indices, in order: walk the tensors, add each to the open bucket, and
# close the bucket as soon as its total is `>=` its limit (`first_bucket_cap_bytes` for the first
# bucket, `bucket_cap_bytes` for every later one); keep the last, partly filled bucket. The checker
# compares with `dist._compute_bucket_assignment_by_size`. Plain Python only.

# %% [answer assign_buckets]
def assign_buckets(tensor_bytes, bucket_cap_bytes, first_bucket_cap_bytes):
    """Bucket the tensors (given in ready order) like DDP's Reducer: lists of indices."""
    ### BEGIN SOLUTION
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
# Write `BucketedDDP(module, bucket_cap_mb=25.0, first_bucket_cap_mb=1.0)`:
#
# * `__init__`: broadcast from rank 0 as before. Take the parameters that require grad, in
#   **reverse** order (`params[::-1]`), and bucket their byte sizes
#   (`p.numel() * p.element_size()`) with your `assign_buckets`, limits
#   `int(first_bucket_cap_mb * 2**20)` and `int(bucket_cap_mb * 2**20)`. Give each bucket a flat
#   buffer (`torch.zeros(sum of its numels)`), each parameter a slot (bucket, offset) in it, and each
#   bucket a count of gradients still missing. Register on every parameter a post-accumulate-grad
#   hook that calls `self._on_grad_ready(index, param)` ({{exercise no_sync}} overrides that method).
# * `_on_grad_ready(index, param)`: copy `param.grad` into its slot. When that fills the bucket,
#   launch every bucket that is now complete **in bucket order**: divide its buffer by the world
#   size, `dist.all_reduce(buffer, async_op=True)`, keep the handle.
# * `finish_gradient_synchronization()`: wait for every bucket, copy each parameter's slice of its
#   reduced bucket back into `p.grad`, and reset the per-backward state (missing counts, next bucket
#   to launch) for the next iteration.
#
# The checker trains 2 steps with tiny caps (50 and 200 bytes, so this small MLP gets several
# buckets) and checks the gradients, that each backward issues exactly torch's buckets (same sizes,
# same order) as single flat all-reduces, asynchronously, the first one before backward has produced
# the last gradient.

# %% [answer bucketed_ddp]
class BucketedDDP(nn.Module):
    """DDP with gradient buckets, each all-reduced as soon as it is full, while backward runs."""

    def __init__(self, module, bucket_cap_mb=25.0, first_bucket_cap_mb=1.0):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self.require_backward_grad_sync = True  # {{exercise no_sync}} turns this off inside no_sync()
        ### BEGIN SOLUTION
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        order = list(range(len(self.params)))[::-1]  # gradients become ready last layer first
        assignment = assign_buckets([self.params[i].numel() * self.params[i].element_size() for i in order],
                                    int(bucket_cap_mb * 2**20), int(first_bucket_cap_mb * 2**20))
        self.buckets, self.slot = [], {}  # slot[param index] = (bucket index, element offset)
        for b, positions in enumerate(assignment):
            indices = [order[k] for k in positions]
            total = 0
            for i in indices:
                self.slot[i] = (b, total)
                total += self.params[i].numel()
            self.buckets.append({"params": indices, "pending": len(indices), "work": None,
                                 "buffer": torch.zeros(total, dtype=self.params[indices[0]].dtype)})  # (total,)
        self.next_bucket = 0  # buckets are launched strictly in order
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._on_grad_ready(i, p))
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad_ready(self, index, param):
        """Hook body: param.grad holds parameter `index`'s accumulated gradient."""
        ### BEGIN SOLUTION
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
        """Wait for every bucket, copy the averaged gradients into p.grad, reset for the next backward."""
        ### BEGIN SOLUTION
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
# on an exception), and make `_on_grad_ready` and `finish_gradient_synchronization` do nothing while
# it is False. The checker runs 3 micro-batches per step, the first 2 inside `no_sync()` (where
# no collective may be called and each rank keeps its own gradient), then checks the gradients after
# the synced backward against the full batch, for 2 steps.

# %% [answer no_sync]
class AccumulatingDDP(BucketedDDP):
    """BucketedDDP plus no_sync(): accumulate gradients locally, synchronise once."""

    @contextlib.contextmanager
    def no_sync(self):
        ### BEGIN SOLUTION
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old
        ### END SOLUTION

    def _on_grad_ready(self, index, param):
        ### BEGIN SOLUTION
        if self.require_backward_grad_sync:
            super()._on_grad_ready(index, param)
        ### END SOLUTION

    def finish_gradient_synchronization(self):
        ### BEGIN SOLUTION
        if self.require_backward_grad_sync:
            super().finish_gradient_synchronization()
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
# AdamW is elementwise, so this is exactly AdamW. torch's version is
# `torch/distributed/optim/zero_redundancy_optimizer.py` (it partitions whole parameters instead of
# a flat range); DeepSpeed's stage 1 and 2 use flat ranges.
#
# ### {{exercise shard_bounds}}: a rank's shard
#
# Write `shard_bounds(numel, world_size, rank)` returning `(start, end)` of `rank`'s shard: shards of
# S = ceil(numel / world_size) elements (the all-gather needs equal sizes), clamped to `numel`, so the
# last shards may be short or empty and nothing is dropped. Plain Python only.

# %% [answer shard_bounds]
def shard_bounds(numel, world_size, rank):
    """[start, end) of `rank`'s shard of a flat vector of `numel` elements."""
    ### BEGIN SOLUTION
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
# here: averaging is your job). In `__init__`, copy your shard of the flattened parameters into an
# `nn.Parameter` of `end - start` elements and build a `torch.optim.AdamW` over that one tensor (or
# write Adam yourself). In `step()`: flatten the gradients into a zero-padded buffer of N S
# elements, divide by N, `reduce_scatter_flat` it into an S-element buffer, give its first
# `end - start` elements to your shard as `.grad`, step, then `all_gather_flat` the zero-padded
# updated shards into N S elements and copy them into the parameters (`p.copy_(...)` under
# `torch.no_grad()`).
#
# The checker trains 3 steps and compares every rank's parameters after every step with
# `torch.optim.AdamW` on the full batch, then counts the bytes of the tensors your optimizer keeps
# between steps (everything reachable from its attributes, gradients and the model's parameters
# aside): at most 3 x 4 x S (two moments and the shard) plus a little. Keep the padded full-size
# buffers local to `step()`.

# %% [answer sharded_adamw]
class ShardedAdamW:
    """AdamW whose state is sharded over the ranks (ZeRO stage 1). Same steps as torch.optim.AdamW."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        ### BEGIN SOLUTION
        self.numel = sum(p.numel() for p in self.params)  # P
        self.shard_size = -(-self.numel // self.world_size)  # S = ceil(P / N)
        self.start, self.end = shard_bounds(self.numel, self.world_size, self.rank)
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])  # (P,)
            self.shard = nn.Parameter(flat[self.start:self.end].clone())  # (end - start,)
        self.optimizer = torch.optim.AdamW([self.shard], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        ### END SOLUTION

    @torch.no_grad()
    def step(self):
        ### BEGIN SOLUTION
        n, s, dtype = self.world_size, self.shard_size, self.params[0].dtype
        flat_grad = torch.zeros(n * s, dtype=dtype)  # (N*S,): local grads, zero padding at the end
        offset = 0
        for p in self.params:
            if p.grad is not None:
                flat_grad[offset:offset + p.numel()] = p.grad.reshape(-1)
            offset += p.numel()
        flat_grad /= n
        grad_shard = torch.empty(s, dtype=dtype)  # (S,): the mean gradient of my range
        reduce_scatter_flat(grad_shard, flat_grad)
        self.shard.grad = grad_shard[: self.end - self.start].clone()
        self.optimizer.step()  # moments: 2 x (end - start) elements
        self.shard.grad = None
        padded = torch.zeros(s, dtype=dtype)
        padded[: self.end - self.start] = self.shard
        flat = torch.empty(n * s, dtype=dtype)  # (N*S,): every rank's updated range
        all_gather_flat(flat, padded)
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
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
show_quiz("distributed", "q6")

# %% [markdown]
# ## 5. FSDP: sharding the parameters too
#
# ZeRO-3, which PyTorch calls **FSDP** (Fully Sharded Data Parallel), shards the parameters as well:
# between uses, rank r holds only its shard of each layer. The model is cut into **units** (usually
# one per transformer block). For each unit (FSDP1: `torch/distributed/fsdp/_flat_param.py`,
# `FlatParamHandle`; `_runtime_utils.py`):
#
# * **init**: flatten the unit's parameters into one vector of P elements, pad it to N S with S =
#   ceil(P / N), keep the shard `[r S, (r+1) S)` as an `nn.Parameter`, and delete the full
#   parameters. The optimizer only ever sees shards.
# * **forward**: all-gather the shards into the full flat buffer ("unshard"), point the layer's
#   `weight`/`bias` at views of it, run the layer, and drop the buffer ("reshard"). At any moment only
#   about one unit's full parameters exist (two with prefetching).
# * **backward**: all-gather again (the buffer was freed), compute the unit's backward, and
#   **reduce-scatter** the gradient of the flat buffer: rank r receives the summed gradient of its own
#   shard, divided by N. Autograd would normally *save* the full weights for backward, keeping every
#   unit alive; FSDP frees them and re-gathers (FSDP1 frees the storage; the reference uses
#   `saved_tensors_hooks`).
# * **prefetch**: issue the next unit's all-gather asynchronously before it is needed
#   (`forward_prefetch`, `BackwardPrefetch.BACKWARD_PRE`), overlapping communication with compute at
#   the cost of one more unit in memory.
#
# ### {{exercise fully_sharded}}: a fully sharded `nn.Sequential`
#
# Write `FullyShardedSequential(model)` for an `nn.Sequential` whose children are the units. The
# simplest correct backward re-runs the layer: a custom `autograd.Function` whose `forward` gathers,
# runs the layer on views of the gathered buffer (no autograd inside a Function's forward, so nothing
# is saved) and drops the buffer; whose `backward` gathers again, re-runs the layer with autograd
# on, gets the gradients of the input and of the flat buffer with `torch.autograd.grad`, and
# reduce-scatters the latter (divided by N) into the shard's gradient. (Re-running the forward is
# "activation checkpointing", a separate trick; real FSDP keeps the layer's activations and only
# re-gathers the weights.) Use FSDP's layout: a unit's flat vector is its `named_parameters()`, each
# flattened, in order, zero-padded to N S; shard r is `[r S, (r+1) S)` of it. `self.parameters()`
# must yield only the shards, so delete the layers' own parameters (`del layer._parameters[name]`).
# `gather(k)` all-gathers layer k's shards into a new (N S,) buffer; `run_layer(k, full, x)` (given)
# runs layer k with its parameters set to views of `full`; `forward` runs the units in order
# (layers without parameters, like `Tanh`, run as they are).
#
# The checker trains 3 SGD (momentum) steps and compares each rank's losses and the final outputs
# with one process on the full batch. It counts the parameter elements each rank holds (only
# shards), and tracks the buffers returned by all-gathers: at no moment may more than 3 gathered
# layers be alive, nor as many bytes as the whole model.

# %% [answer fully_sharded]
class _ShardedLayer(torch.autograd.Function):
    """forward: gather the layer's parameters, run it, free them. backward: gather again, recompute,
    reduce-scatter the gradient of the flat parameter."""

    @staticmethod
    def forward(ctx, x, shard, owner, k):
        ### BEGIN SOLUTION
        full = owner.gather(k)  # (N*S,) gathered; freed when this function returns
        out = owner.run_layer(k, full, x)
        ctx.save_for_backward(x)
        ctx.owner, ctx.k = owner, k
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        ### BEGIN SOLUTION
        (x,) = ctx.saved_tensors
        owner, k = ctx.owner, ctx.k
        full = owner.gather(k).requires_grad_()  # gather again: (N*S,)
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            out = owner.run_layer(k, full, x)
            grad_x, grad_full = torch.autograd.grad(out, (x, full), grad_out)
        grad_shard = torch.empty_like(owner.shards[k])  # (S,)
        reduce_scatter_flat(grad_shard, grad_full / owner.world_size)
        return grad_x, grad_shard, None, None
        ### END SOLUTION


class FullyShardedSequential(nn.Module):
    """ZeRO-3: each child of `model` keeps 1/N of its flat parameters; full ones exist only while used."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.shards = nn.ParameterList()  # shards[k]: (S_k,) the only parameters this module has
        self.layouts = []  # layouts[k]: [(name, shape, offset, numel)] of layer k's parameters
        ### BEGIN SOLUTION
        n = self.world_size
        for layer in model:
            named = list(layer.named_parameters())
            layout, offset = [], 0
            for name, p in named:
                layout.append((name, p.shape, offset, p.numel()))
                offset += p.numel()
            self.layouts.append(layout)
            if not named:
                self.shards.append(nn.Parameter(torch.empty(0)))
                continue
            shard_size = -(-offset // n)
            flat = torch.zeros(n * shard_size)  # (N*S,) zero padding past the P real elements
            with torch.no_grad():
                flat[:offset] = torch.cat([p.detach().reshape(-1) for _, p in named])
            self.shards.append(nn.Parameter(flat[self.rank * shard_size:(self.rank + 1) * shard_size].clone()))
            for name, _ in named:  # the layer no longer owns its full parameters
                owner, _, attr = name.rpartition(".")
                module = layer.get_submodule(owner)
                del module._parameters[attr]
                setattr(module, attr, None)
        ### END SOLUTION

    def gather(self, k):
        """All-gather layer k's shards into a new (N*S,) buffer."""
        ### BEGIN SOLUTION
        shard = self.shards[k].detach()
        full = torch.empty(self.world_size * shard.numel(), dtype=shard.dtype)
        all_gather_flat(full, shard)
        return full
        ### END SOLUTION

    def run_layer(self, k, full, x):
        """Run layer k with its parameters set to views of `full` (given)."""
        layer = self.model[k]
        for name, shape, offset, numel in self.layouts[k]:
            owner, _, attr = name.rpartition(".")
            setattr(layer.get_submodule(owner), attr, full[offset:offset + numel].view(shape))
        try:
            return layer(x)
        finally:
            for name, *_ in self.layouts[k]:
                owner, _, attr = name.rpartition(".")
                setattr(layer.get_submodule(owner), attr, None)

    def forward(self, x):
        ### BEGIN SOLUTION
        for k, layer in enumerate(self.model):
            x = _ShardedLayer.apply(x, self.shards[k], self, k) if self.layouts[k] else layer(x)
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
# The reference `FullyShardedDataParallel` (`ptinternals/distributed/fsdp.py`, which keeps
# activations and re-gathers only the weights, with `saved_tensors_hooks`) on a 6-layer MLP over 3
# ranks: the bytes of full parameters alive after each all-gather and reshard. They never exceed one
# layer; the dashed line is the unsharded model.

# %%
f0 = tour[0]["fsdp"]
print(f"peak full-parameter bytes {f0['peak']:,} of {f0['unsharded_bytes']:,}; "
      f"this rank holds {f0['shard_elements']:,} parameter elements of {f0['unsharded_bytes'] // 4:,}")
plot_fsdp_memory(f0["events"], unsharded_bytes=f0["unsharded_bytes"])

# %% [markdown]
# ### FSDP2: `fully_shard` and DTensor
#
# PyTorch's current FSDP (`torch.distributed.fsdp.fully_shard`, in
# `torch/distributed/fsdp/_fully_shard/`) keeps each parameter as a **DTensor** sharded on dim 0
# over a `DeviceMesh`, instead of one flat buffer per unit: a parameter knows its global shape and
# its placement, state dicts are per-parameter, and the collectives are the same (all-gather into a
# unit's buffer, reduce-scatter of its gradient). You call `fully_shard` on each block, then on the
# root. A `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` casts the
# shards before the all-gather (half the bytes on the wire, compute in bf16) and reduce-scatters
# gradients in fp32; the sharded parameters and the optimizer stay fp32. Rank 0 of the tour ran it on
# a 10 -> 16 -> 16 -> 3 MLP:

# %%
print({k: v for k, v in tour[0]["fsdp2"].items() if k != "seconds"})

# %% [markdown]
# **Checkpointing sharded state.** No rank has the whole model. Either gather it (FSDP's full state
# dict, rank 0 writes one file: simple, but it must fit in one rank's memory) or let every rank write
# its shards: `torch.distributed.checkpoint` (DCP) saves one file per rank plus metadata describing
# which slice of which tensor each holds, and can **reshard** on load, to a different number of
# ranks. The reference FSDP offers both (`full_state_dict`, `sharded_state_dict`).

# %% [quiz]
show_quiz("distributed", "q7")

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
# * DDP = broadcast at start + post-accumulate-grad hooks + buckets (reverse order, first one small)
#   all-reduced asynchronously while backward runs; `no_sync` accumulates and syncs once.
# * ZeRO shards optimizer state (1), gradients (2), parameters (3 = FSDP): same bytes on the wire for
#   1 and 2, 1.5x for 3, and memory per rank that shrinks like 1/N.
# * FSDP gathers a unit's parameters just before use and frees them after, in forward and again in
#   backward, and reduce-scatters its gradients; FSDP2 does it per parameter with DTensor.
# * A resumable checkpoint holds weights, optimizer state, data position and every rank's RNG state,
#   written atomically.
# * Hangs are mismatched collectives: compare what each rank was doing last.
#
# Next: {{chapter kernels}} writes the kernels that run inside each of these ranks.
#
# ### Your quiz score so far
# The grader counts your first answer to each question (recorded in `distributed.answers.json`).

# %% [quiz-grade]
quiz_progress("distributed")
