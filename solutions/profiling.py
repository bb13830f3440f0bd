# %% [markdown]
# # {{title}}
#
# "My GPU sits at 40%." "Adding one `print` slowed training down." "Is the data loader the
# bottleneck?" All three questions have the same two-part answer. First, the CPU (the *host*) and the
# GPU (the *device*) run **asynchronously**: Python enqueues work and runs ahead, and the GPU is fast
# only while that queue stays full. Second, a **profile** tells you which side is waiting for which,
# if you know how to read it.
#
# This chapter takes both apart. You will find every place a program makes the host wait for the
# device (the ATen ops behind `.item()`, boolean masks and `print`), time GPU work correctly, predict
# and then build a training step whose host-to-device copies overlap its compute (pinned memory,
# `non_blocking`, side streams, events and `record_stream`, the allocator hazard of
# {{chapter allocator}}), read `torch.profiler` traces down to self and total time per op and the
# GPU's idle gaps, fix a training loop full of hidden syncs, and profile the capstone's train step.
#
# **No GPU needed.** Three tools make every idea runnable on a CPU:
#
# * a **sync detector** (`ptinternals.profiling.SyncDetector`) that runs a program *written for CUDA*
#   on CPU tensors and reports each op that would make the host wait on a real GPU;
# * a **simulated asynchronous device** (`SimulatedDevice`): a host clock, streams of queued kernels,
#   events, copies and a tiny caching allocator, so asynchronous behaviour is visible and exact;
# * `torch.profiler` itself, which works the same on CPU traces.
#
# Cells marked *GPU* use a real device when there is one and say so when there is not.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) followed by a *check cell* that gives instant
# feedback. Only the code inside answer cells is graded; define any helper you need inside the same
# answer cell. The grader runs your code in a separate process, without the course's reference
# implementation, on many more cases than the visible ones. Quiz answers are recorded in
# `profiling.answers.json` beside this notebook: *practice* questions check your answer at once and
# count no points; *graded* ones only record it (the last answer counts) and are scored when your
# notebook is graded.
#
# **One CPU thread.** The setup cell below calls `torch.set_num_threads(1)`. The ops in this chapter's
# demonstrations are tiny, and on a small shared machine PyTorch's worker threads spend more time
# waking up than computing (a 64x64 matmul measured 48 ms with two threads on a busy 2-core machine,
# 7 us with one): the profiles would show the thread pool, not the ops. One thread keeps every trace
# readable and every timing repeatable. On your own machine, for your own models, leave the default.

# %% [setup]
import torch
import torch.nn.functional as F

from ptinternals.grading import check
from ptinternals.profiling.scaffold import DEVICE_CATEGORIES, HOST_CATEGORIES, REASONS, bind_arguments, load_trace
from ptinternals.quiz import quiz_progress, show_quiz

HAS_CUDA = torch.cuda.is_available()
torch.manual_seed(0)
torch.set_num_threads(1)  # tiny ops: one thread keeps profiles readable and timings repeatable (see above)

# %% [markdown]
# The demonstrations use the course's reference implementation (`ptinternals.profiling`). It is not
# available while your answers are graded, so your answers cannot call it.

# %%
from IPython.display import display

from ptinternals.profiling import SimulatedDevice, SyncDetector
from ptinternals.viz.profiling import plot_simulated_timeline, plot_trace_timeline

print("CUDA device:", torch.cuda.get_device_name(0) if HAS_CUDA else "none (CPU only: GPU cells will say so)")

# %% [markdown]
# ## 1. The host runs ahead
#
# When Python calls `y = x @ w` on CUDA tensors, PyTorch checks the arguments, picks a kernel and
# calls `cudaLaunchKernel`. That call puts the kernel on a **stream** (a queue of device work) and
# returns after a few microseconds. The multiplication itself runs later, whenever the GPU reaches
# it, while Python is already preparing the next call. Work on one stream runs in order; different
# streams may run at the same time.
#
# The simulated device makes the two clocks visible. Its host pays `launch_overhead_us` per launch;
# its kernels start when their stream is free. Here the host launches three kernels of 100 us and
# returns after 15 us: the device is still busy for another 290 us.

# %%
dev = SimulatedDevice(launch_overhead_us=5)
for name in ("matmul", "gelu", "matmul2"):
    dev.launch(name, 100)
print(f"host clock after three launches: {dev.host_time} us")
print(f"the last kernel ends at:         {dev.current_stream.busy_until} us (device clock)")
dev.synchronize()
print(f"host clock after synchronize():  {dev.host_time} us")
display(plot_simulated_timeline(dev, title="three launches: the host is done long before the device"))

# %% [markdown]
# The host can run ahead only so far: the driver's launch queue holds a bounded number of pending
# operations (about a thousand); a launch into a full queue blocks. And when the host needs a
# *value* the device has not produced yet, it must wait for every kernel queued before it. That wait
# is a **synchronisation** (sync), and while it lasts the host enqueues nothing: when the wait ends
# the queue is empty and the GPU idles until the host catches up.

# %% [quiz]
show_quiz("profiling", "q1")

# %% [markdown]
# ## 2. What makes the host wait
#
# Inside PyTorch, a host wait happens in two C++ helpers (`c10/cuda/CUDAFunctions.h`):
# `memcpy_and_sync` (a copy followed by `cudaStreamSynchronize`) and `stream_synchronize`. Every ATen
# kernel that needs a device value on the host goes through one of them, and both first call
# `warn_or_error_on_sync()`. That is the hook behind **`torch.cuda.set_sync_debug_mode("warn")`**:
# with it set, every such op warns "called a synchronizing CUDA operation".
#
# The usual suspects, and why each waits:
#
# | Python | ATen op | why the host waits |
# |---|---|---|
# | `.item()`, `float(t)`, `if t:`, `f"{t:.3f}"` | `_local_scalar_dense` | the scalar is copied to the host |
# | `t.nonzero()`, `torch.where(mask)` | `nonzero` | the output's length is the count of nonzeros |
# | `x[mask]`, `x[mask] = y` (y a tensor) | `index`, `index_put_` | a boolean mask becomes `nonzero()` |
# | `x.masked_select(mask)`, `torch.unique(x)` | `masked_select`, `_unique2` | output size depends on the data |
# | `torch.repeat_interleave(x, repeats)` | `repeat_interleave` | output size is `repeats.sum()` |
# | `x.cpu()`, `x.tolist()`, `print(x)` | copies | a device-to-host copy with `non_blocking=False` |
# | `x.to("cuda")`, `torch.tensor(data, device="cuda")` | copies | a host-to-device copy from pageable memory |
#
# And some that look similar but do **not** wait: `x[mask] = 1.0` (a Python scalar value turns the
# op into `masked_fill_`, see `canDispatchToMaskedFill` in ATen), `x[index_tensor]` with a device
# index, `torch.repeat_interleave(x, repeats, output_size=n)`, `F.one_hot(i, num_classes=n)`,
# `torch.nonzero_static(x, size=n)`, `torch.any(t)` (a device result). These lists follow PyTorch's
# own test of the feature, `test_sync_warning` in `test/test_torch.py`.
#
# *GPU*: on a CUDA machine you can ask PyTorch directly.

# %%
if HAS_CUDA:
    import warnings

    x = torch.randn(8, device="cuda")
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x[x > 0] = 1.0          # no warning: masked_fill_
        n = (x > 0).sum()       # no warning: stays on the device
        n.item()                # warning
    torch.cuda.set_sync_debug_mode(0)
    print(len(caught), "warning(s):", [str(w.message)[:45] for w in caught])
else:
    print("no GPU: set_sync_debug_mode needs CUDA; the detector below gives the same answers on the CPU")

# %% [markdown]
# ### Finding syncs without a GPU
#
# `SyncDetector` watches a program at the two levels of {{chapter dispatch}}:
#
# * a **TorchDispatchMode** sees every ATen op after autograd and decompositions
#   (`aten._local_scalar_dense.default`, `aten.index.Tensor`...) and judges it with a rule table;
# * a **TorchFunctionMode** sees Python API calls first. Some reads never become a telling ATen op on
#   a CPU tensor (`x.cpu()` of a CPU tensor returns at once, printing switches modes off), and some
#   composite ops take different paths on CPU and CUDA (`F.one_hot` validates its indices with
#   `.item()` on the CPU only), so those are judged here.
#
# On a CPU-only build the detector also **emulates CUDA**: device arguments (`"cuda"`, `.cuda()`,
# `.to("cuda")`, `pin_memory()`) run on CPU tensors, and it remembers, per storage, which tensors
# stand for device memory. A program written for CUDA therefore runs unchanged. Here is one.

# %%
def evaluate(model, batches):
    correct = 0
    for x, y in batches:
        x, y = x.to("cuda"), y.to("cuda")                 # blocking copies from pageable memory
        pred = model(x).argmax(dim=1)
        correct += (pred == y).sum().item()               # a scalar read per batch
        wrong = x[pred != y]                              # a boolean mask
        if len(wrong) > 0:
            print(f"{len(wrong)} wrong, first logits {model(wrong[:1])}")   # printing a device tensor
    return correct


torch.manual_seed(0)
with SyncDetector() as det:
    model = torch.nn.Linear(4, 3).to("cuda")
    batches = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(2)]
    evaluate(model, batches)
print(det.report())

# %% [markdown]
# Every line of the loop that waits is there, with the reason and the ATen op or API call. The
# weights' copy to the device counts too (two blocking host-to-device copies in `.to("cuda")`).
#
# ### {{exercise sync_reason}}: which ATen ops wait
#
# Write the ATen half of the detector: `sync_reason(func, args, kwargs, on_device)` returns the id of
# the reason why the op would make the host wait on CUDA, or `None`. `func` is an `OpOverload`
# (`torch.ops.aten.nonzero.default`; its `func.overloadpacket.__name__` is `"nonzero"`), `args` and
# `kwargs` its arguments as the dispatcher passes them, and `on_device(t)` tells whether tensor `t`
# lives on the device. `bind_arguments(func, args, kwargs)` (imported above) gives the arguments by
# schema name with defaults filled in. Reason ids (keys of `REASONS`):
#
# * `"scalar_read"`: `_local_scalar_dense` of a device tensor;
# * `"nonzero"`: `nonzero`; `"masked_select"`: `masked_select`; `"unique"`: any of `_unique`,
#   `_unique2`, `unique_dim`, `unique_consecutive`, `unique_dim_consecutive`;
# * `"bool_mask_index"`: `index` with a `bool`/`uint8` index tensor; `index_put_`/`index_put`/
#   `_index_put_impl_` with one, **unless** PyTorch turns it into `masked_fill_`: not `accumulate`, the
#   value has exactly one element and is on the host, and the only index tensor is that one mask, on
#   the same device as `self` (other entries of `indices` are `None`);
# * `"host_index"`: `index`/`index_put_` (and its variants) of a device `self` with a non-mask index
#   tensor on the host (checked before the mask rule for `index_put_`);
# * `"repeat_interleave"`: `repeat_interleave` whose `repeats` is a device tensor and whose
#   `output_size` is `None`;
# * `"bincount"`: `bincount`; `"histc_range"`: `histc` with `min == max`; `"bool_result"`: `equal`,
#   `allclose`.
#
# Every rule applies only when the op's `self` is on the device (for `repeat_interleave`: its
# `repeats`); anything else returns `None`. A rule only looks: it must not modify its arguments. The
# checker calls your rule on ATen calls it builds (every op of the table, on the host and on the
# device, and ops outside it) and plugs it into the detector on generated programs.

# %%
for reason, why in REASONS.items():
    print(f"{reason:20s} {why}")

# %% [answer sync_reason]
def sync_reason(func, args, kwargs, on_device):
    """Why ``func(*args, **kwargs)`` makes the host wait on CUDA (a REASONS key), or None."""
    ### BEGIN SOLUTION
    # twin: ptinternals.profiling.sync_rules.sync_reason
    name = func.overloadpacket.__name__
    a = bind_arguments(func, args, kwargs)
    if name == "repeat_interleave":
        repeats = a["repeats"]
        if isinstance(repeats, torch.Tensor) and on_device(repeats) and a.get("output_size") is None:
            return "repeat_interleave"
        return None
    if not on_device(a.get("self")):
        return None
    is_mask = lambda t: isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
    simple = {"_local_scalar_dense": "scalar_read", "nonzero": "nonzero", "masked_select": "masked_select",
              "_unique": "unique", "_unique2": "unique", "unique_dim": "unique", "unique_consecutive": "unique",
              "unique_dim_consecutive": "unique", "bincount": "bincount", "equal": "bool_result",
              "allclose": "bool_result"}
    if name in simple:
        return simple[name]
    if name == "histc":
        return "histc_range" if a["min"] == a["max"] else None
    if name == "index":
        indices = [i for i in a["indices"] if i is not None]
        if any(is_mask(i) for i in indices):
            return "bool_mask_index"
        if any(isinstance(i, torch.Tensor) and not on_device(i) for i in indices):
            return "host_index"
        return None
    if name in ("index_put_", "index_put", "_index_put_impl_"):
        indices = [i for i in a["indices"] if i is not None]
        if any(isinstance(i, torch.Tensor) and not is_mask(i) and not on_device(i) for i in indices):
            return "host_index"
        if any(is_mask(i) for i in indices):
            value = a["values"]
            masked_fill = (not a["accumulate"] and isinstance(value, torch.Tensor) and value.numel() == 1
                           and not on_device(value) and len(indices) == 1 and on_device(indices[0]))
            return None if masked_fill else "bool_mask_index"
    return None
    ### END SOLUTION


# %% [tests sync_reason]
check("profiling.sync_reason", sync_reason)
### BEGIN HIDDEN TESTS
check("profiling.sync_reason", sync_reason, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Your rule plugs into the detector (`SyncDetector(rule=...)`). The course's test programs are
# generated from a list of statements with known answers; compare the detector's verdicts with
# yours on a few.

# %%
from ptinternals.profiling.sync_programs import make_program

program = make_program(seed=7, n_statements=6)
print(program.source)
try:
    with SyncDetector(rule=sync_reason) as det:
        program.run("cuda")
    mine = [(int(e.where.rsplit(":", 1)[1]), e.reason) for e in det.implicit()]
    print("yours:   ", mine)
except NotImplementedError:
    print("(your sync_reason is not written yet)")
print("expected:", list(program.expected))

# %% [quiz]
show_quiz("profiling", "q2", "q3", "q4")

# %% [markdown]
# ## 3. Timing GPU work correctly
#
# Because a launch returns before the kernel runs, the obvious measurement is wrong:
#
# ```python
# t0 = time.perf_counter(); y = x @ w; t1 = time.perf_counter()   # measures the launch
# ```
#
# Three more things spoil GPU timings: the **first call** of a kernel pays for loading modules,
# autotuning or allocating memory; **earlier work** still in the queue when the clock starts gets
# counted; and single runs are **noisy** (a descheduled host thread, a GPU clock ramping up). The
# recipe that `torch.utils.benchmark.Timer` and `triton.testing.do_bench` follow:
#
# 1. warm up: call the function a few times and discard those runs;
# 2. synchronise, so nothing earlier is still running;
# 3. time on the **device's clock**: record a CUDA event before and after (`torch.cuda.Event(enable_timing=True)`,
#    `.record()`), wait for the end event, read `start.elapsed_time(end)` in milliseconds;
# 4. repeat, and report the **median** with a spread (the interquartile range), not the mean.
#
# On the simulated device (first call +5 ms, occasional 1 ms hiccups on the device):

# %%
from ptinternals.profiling.timing import event_time_ms, naive_time_ms, synced_time_ms


def fresh_device():
    sim = SimulatedDevice(launch_overhead_us=5, first_call_us=5000, device_jitter=(0.15, 1000), seed=1)
    return sim, (lambda: sim.launch("attention", 250))   # the truth: 0.25 ms per call


sim, kernel = fresh_device()
print(f"naive, first call:     {naive_time_ms(kernel, sim):.4f} ms   (the launch only)")
sim, kernel = fresh_device()
print(f"synchronised, no warm: {synced_time_ms(kernel, sim, warmup=0, reps=1)}")
sim, kernel = fresh_device()
print(f"events, warm, median:  {event_time_ms(kernel, sim, warmup=3, reps=21)}")

# %% [markdown]
# The synchronised host clock includes the launch (5 us), and without warm-up the first call's 5 ms
# (plus, in this run, one of the 1 ms hiccups); the event median is the kernel, and the hiccups only
# show in the spread.
#
# On real hardware, `torch.utils.benchmark` does this for you (it synchronises the accelerator around
# its measurements and reports median and IQR):

# %%
from torch.utils import benchmark

a = torch.randn(256, 256)
m = benchmark.Timer(stmt="a @ a", globals={"a": a}).blocked_autorange(min_run_time=0.2)
print(f"median {m.median * 1e6:.1f} us, IQR {m.iqr * 1e6:.1f} us over {len(m.times)} blocks of {m.number_per_run} runs")

# %% [markdown]
# ### {{exercise time_gpu}}: a GPU timer
#
# Write `time_gpu(fn, device, warmup=3, reps=10)` returning `(median_ms, iqr_ms)` of `fn()`'s
# *device* time. `device` offers what `torch.cuda` offers: `device.synchronize()`,
# `device.Event(enable_timing=True)` with `.record()`, `.synchronize()` and `.elapsed_time(end)`
# (milliseconds), and `device.perf_counter()` (the host clock, seconds). Warm up: call `fn()`
# `warmup` times. Then time `reps` runs, recording one event just before and one just after each
# call; a sample is `start.elapsed_time(end)`. Report the median and the interquartile range (75th
# minus 25th percentile, linear interpolation as `numpy.percentile` does). Keep the queue full: do
# not synchronise between timed runs, only before reading the times. Raise `ValueError` for
# `reps < 1` or `warmup < 0`. The checker runs your timer on simulated devices (launch overheads,
# first-call costs, jitter, a short launch queue) and replays your calls to know what your events read.

# %% [answer time_gpu]
def time_gpu(fn, device, warmup=3, reps=10):
    """(median, IQR) in milliseconds of fn()'s device time."""
    ### BEGIN SOLUTION
    # twin: ptinternals.profiling.timing.time_gpu
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    device.synchronize()
    pairs = []
    for _ in range(reps):
        start, end = device.Event(enable_timing=True), device.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    device.synchronize()
    xs = sorted(s.elapsed_time(e) for s, e in pairs)

    def percentile(q):
        pos = (len(xs) - 1) * q
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return percentile(0.5), percentile(0.75) - percentile(0.25)
    ### END SOLUTION


# %% [tests time_gpu]
check("profiling.time_gpu", time_gpu)
### BEGIN HIDDEN TESTS
check("profiling.time_gpu", time_gpu, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("profiling", "q5")

# %% [markdown]
# ## 4. Copies and overlap
#
# A training step starts by copying a batch from host memory to the device. Two properties of that
# copy decide whether it can overlap with compute:
#
# * **Pinned (page-locked) memory.** The GPU's copy engine reads host memory directly (DMA) only if
#   the operating system promises not to move the pages: `tensor.pin_memory()`, or
#   `DataLoader(pin_memory=True)`. From ordinary *pageable* memory the driver first copies the bytes
#   into a pinned staging buffer, on the host's time.
# * **`non_blocking=True`.** `x.to("cuda", non_blocking=True)` from pinned memory enqueues the copy on
#   the current stream and returns. Without it, PyTorch copies and then synchronises
#   (`memcpy_and_sync` in `aten/src/ATen/native/cuda/Copy.cu`). From pageable memory `non_blocking`
#   still makes the host stage the bytes, and `set_sync_debug_mode` does not report that stall (the
#   detector calls it a *stall*).
#
# A copy on the compute stream still waits for the previous step's kernels: same stream, same queue.
# To copy batch *i+1* while batch *i* computes, the copy goes on a **side stream**, and the compute
# stream waits for it with an **event** (`torch.cuda.current_stream().wait_stream(side)`):
#
# ```python
# side = torch.cuda.Stream()
# with torch.cuda.stream(side):
#     nxt = batch.to("cuda", non_blocking=True)          # batch is pinned
# for step in range(steps):
#     torch.cuda.current_stream().wait_stream(side)      # compute waits for the copy, the host does not
#     x = nxt
#     x.record_stream(torch.cuda.current_stream())       # see below
#     with torch.cuda.stream(side):
#         nxt = next_batch().to("cuda", non_blocking=True)
#     loss = train_step(x)
# ```
#
# The simulated device runs the three loops people write (`blocking`, `async` on one stream,
# `prefetch` on a side stream). With a 20 us copy, 30 us of compute and 5 us of host work per step:

# %%
from ptinternals.profiling.overlap import LOOPS, StepCosts, simulate_training

costs = StepCosts(batch_bytes=1_000_000, compute_us=30, host_us=5)      # 1 MB at 50 GB/s pinned: 20 us
for loop in LOOPS:
    for pinned in (False, True):
        tl = simulate_training(costs, steps=8, loop=loop, pinned=pinned)
        print(f"{loop:9s} {'pinned  ' if pinned else 'pageable'}: {tl.steady_step_us:6.1f} us per step")
tl = simulate_training(costs, steps=5, loop="prefetch", device=SimulatedDevice(launch_overhead_us=1))
display(plot_simulated_timeline(tl.device, title="prefetch: batch i+1 copies on stream 1 while step i computes"))

# %% [markdown]
# ### `record_stream`, and the allocator
#
# The batch tensor is allocated while the *side* stream is current, so the caching allocator files
# its block under the side stream ({{chapter allocator}}). When Python drops the tensor, the
# allocator may hand that block to the next allocation on the side stream at once, because work on
# one stream is ordered. But the compute stream may still be reading it: the next copy would
# overwrite a batch in use. `x.record_stream(compute_stream)` tells the allocator the block is in use
# there too; the free then waits (an event on the compute stream) before the block is reused. The
# simulated device checks every access for such races:

# %%
for record in (False, True):
    sim = SimulatedDevice(launch_overhead_us=0)
    simulate_training(StepCosts(1_000_000, compute_us=50), steps=6, loop="prefetch", record_stream=record, device=sim)
    print(f"record_stream={record}: {len(sim.races)} race(s)", sim.races[:1])

# %% [markdown]
# ### {{exercise predict_step}}: predict the step time
#
# Assume launches cost nothing and the loss read (`item`) transfers nothing but waits. With X_pinned
# and X_pageable the copy's duration from each kind of memory, C the compute and H the host's own
# work per step, write `predict_step(copy_pinned_us, copy_pageable_us, compute_us, host_us, loop,
# pinned, item)` returning the steady-state step time in microseconds of each loop:
#
# * `"blocking"`: the copy (from the memory given by `pinned`) then a sync; the next batch's host
#   work overlaps this step's compute unless `item` makes the host wait for the compute first;
# * `"async"`: `non_blocking=True` on the compute stream. Pinned: the device runs copy and compute back
#   to back while the host works in parallel. Pageable: the host first stages the bytes
#   (X_pageable), then the device copies them (X_pinned);
# * `"prefetch"`: the side-stream loop above (the host's work per step is H, plus X_pageable when it
#   must stage pageable memory). With `item`, batch i+1's copy starts when step i's compute starts.
#
# Think in timelines: which resource (host, copy engine, compute stream) is busy when, and who waits
# for whom. Raise `ValueError` for an unknown `loop`. The checker compares your formula with the
# simulator on random costs, including a copy exactly as long as the compute, zero-length copies and
# kernels, and host-bound steps. The answer is a formula: your code may not build a simulated device.

# %% [answer predict_step]
def predict_step(copy_pinned_us, copy_pageable_us, compute_us, host_us, loop, pinned=True, item=False):
    """Steady-state microseconds per training step of ``loop`` ("blocking", "async", "prefetch")."""
    ### BEGIN SOLUTION
    # twin: ptinternals.profiling.overlap.predict_step_us
    xp, xg, c, h = copy_pinned_us, copy_pageable_us, compute_us, host_us
    if loop == "blocking":
        x = xp if pinned else xg
        return x + c + h if item else x + max(h, c)
    if loop == "async":
        if pinned:
            return h + xp + c if item else max(h, xp + c)
        return h + xg + xp + c if item else max(h + xg, xp + c)
    if loop == "prefetch":
        host = h if pinned else h + xg
        return max(host + c, xp) if item else max(host, xp, c)
    raise ValueError(f"loop must be 'blocking', 'async' or 'prefetch', got {loop!r}")
    ### END SOLUTION


# %% [tests predict_step]
check("profiling.predict_step", predict_step)
### BEGIN HIDDEN TESTS
check("profiling.predict_step", predict_step, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise train_prefetch}}: build the prefetching loop
#
# Now write the loop itself, on the simulated device's stream API (the same shape as the CUDA code
# above). `train_prefetch(device, batches, compute_us, host_us)` trains on `batches` (a list of batch
# sizes in bytes). For batch `i`:
#
# * the host loads it: `device.host_work(host_us)`;
# * it is copied into a block allocated on a side stream `s = device.Stream()`:
#   `buf = device.alloc(nbytes, s)`, then `device.copy(nbytes, "h2d", pinned=True, non_blocking=True,
#   stream=s, buffer=buf, name=f"batch{i}")`;
# * the compute stream (`device.current_stream`) must not start before the copy is done: record an
#   event on `s` (`ev = device.Event(); ev.record(s)`) and `device.current_stream.wait_event(ev)`;
# * one kernel computes on it: `device.launch(f"step{i}", compute_us, reads=[buf])`, after which the
#   host drops it: `device.free(buf)`.
#
# Load (and copy) batch `i+1` **before** launching step `i`, so that the copy overlaps the compute,
# and make the freed blocks safe with `buf.record_stream(device.current_stream)`. The host must never
# wait. The checker runs your loop and requires: every step reads its own batch after its copy,
# no races, no host waits, and the step time of the simulator's best loop, `max(H, X, C)`.

# %% [answer train_prefetch]
def train_prefetch(device, batches, compute_us, host_us):
    """Train on ``batches`` (sizes in bytes), copying batch i+1 on a side stream while step i computes."""
    ### BEGIN SOLUTION
    # twin: ptinternals.profiling.overlap.train_prefetch
    side = device.Stream()

    def load(i):
        device.host_work(host_us)
        buf = device.alloc(batches[i], side)
        device.copy(batches[i], "h2d", pinned=True, non_blocking=True, stream=side, buffer=buf, name=f"batch{i}")
        ready = device.Event()
        ready.record(side)
        return buf, ready

    if not batches:
        return
    nxt = load(0)
    for i in range(len(batches)):
        buf, ready = nxt
        device.current_stream.wait_event(ready)
        buf.record_stream(device.current_stream)
        if i + 1 < len(batches):
            nxt = load(i + 1)
        device.launch(f"step{i}", compute_us, reads=[buf])
        device.free(buf)
    ### END SOLUTION


# %% [tests train_prefetch]
check("profiling.train_prefetch", train_prefetch)
### BEGIN HIDDEN TESTS
check("profiling.train_prefetch", train_prefetch, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# *GPU*: the GPU check measures the three loops on an H200 (`ptinternals.profiling.cuda_overlap`)
# next to `predict_step_us` fed with the measured copy and compute times.

# %%
if HAS_CUDA:
    from ptinternals.profiling.cuda_overlap import measure_overlap

    print(measure_overlap(batch_bytes=64 << 20, compute_ms=2.0, steps=8))
else:
    print("no GPU: the measured overlap runs in the GPU check")

# %% [quiz]
show_quiz("profiling", "q6", "q7", "q8", "q9")

# %% [markdown]
# ## 5. Reading a profile: `torch.profiler`
#
# `torch.profiler.profile` records what happened, on which thread or stream, and when:
#
# * `activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]`: host ops (every ATen op is an
#   event), and on a GPU the kernels, copies and the runtime calls that launched them;
# * `record_function("name")` marks a range of your own (`forward`, `backward`, `optimizer`);
# * `schedule(wait=1, warmup=1, active=2)` with `prof.step()` after each iteration: skip the first
#   (slow) step, record one step that is thrown away (the profiler's own start-up lands there), then
#   keep two; each kept step becomes a `ProfilerStep#N` range;
# * `prof.key_averages()` sums events by name; `prof.export_chrome_trace(path)` writes the timeline
#   for Perfetto (https://ui.perfetto.dev) or `chrome://tracing`.

# %%
import os
import tempfile

from torch.profiler import ProfilerActivity, profile, record_function, schedule

torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
xb, yb = torch.randn(32, 64), torch.randint(0, 10, (32,))


def step():
    with record_function("forward"):
        loss = F.cross_entropy(mlp(xb), yb)
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)


trace_path = os.path.join(tempfile.mkdtemp(), "mlp_trace.json")
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
             on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
    for _ in range(4):
        step()
        prof.step()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))

# %% [markdown]
# **Self versus total.** An op's *total* (CPU total) time is its whole duration; its *self* time is
# that minus the time of the ops it called. `aten::linear` has a large total and a tiny self time: the
# work happens in `aten::addmm` inside it. Sort by self time to find where time is spent, by total
# time to find which high-level call is expensive.
#
# The trace is plain JSON. Each op is a *complete event* (`"ph": "X"`) with a name, a category, a
# process and thread, a start `ts` and a duration `dur` in microseconds. Drawn as Perfetto draws it,
# nested calls stacked below their callers:

# %%
display(plot_trace_timeline(trace_path, max_depth=4, title="two profiled steps of a small MLP (CPU)"))
data = load_trace(trace_path)
print(len(data["traceEvents"]), "events; one of them:",
      next(e for e in data["traceEvents"] if e.get("cat") == "cpu_op"))

# %% [markdown]
# ### {{exercise op_times}}: self and total time from a trace
#
# Write `op_times(trace)`: for a loaded Chrome trace (a dict), return `{name: (count, self_us,
# total_us)}` summed over the host events, as `prof.key_averages()` reports them. Follow PyTorch
# (`EventList._populate_cpu_children` and `_remove_dup_nodes` in `torch/autograd/profiler_util.py`):
#
# * host events are the complete (`"ph": "X"`) events whose category is in `HOST_CATEGORIES` or is
#   `"python_function"` (Python frames, in profiles taken with `with_stack=True`); other phases
#   (metadata, flows, instant markers, begin/end pairs) are not timed calls;
# * on each thread (`pid`, `tid`), sort by start, longest first on ties; an event's parent is the
#   innermost earlier event that contains it entirely (`start >= parent start` and `end <= parent end`;
#   an event that starts at or after the top candidate's end, or ends after it, closes that
#   candidate);
# * compare times as **integer nanoseconds**: `start = round(ts * 1000)`, `end = start + round(dur * 1000)`.
#   The profiler counts nanoseconds and writes microseconds with three decimals; at the trace's
#   timestamps (about 5e12 us) a floating-point `ts + dur` can miss an exact end by a nanosecond, and
#   a child that ends with its parent would not be nested;
# * an event that has the same name as its parent and is its parent's *only* child is folded into the
#   parent (its children become the parent's); repeat until nothing changes;
# * total = `dur`; self = `dur` minus the children's `dur`; names `ProfilerStep#N` group as `ProfilerStep*`.
#
# Python frames count as host events because torch 2.13's `key_averages()` counts them: they take
# their time out of the ops' self time and have rows of their own. torch 2.11 (the GPU machine's)
# writes the same `python_function` events to the trace but leaves them out of `key_averages()`, whose
# self times there include the Python frames below each op. The answer depends on the trace alone,
# so it is the same on both; only a `with_stack=True` table printed by torch 2.11 differs.
#
# The checker compares your numbers with torch's own tree code run on the same events, on real
# profiles and on hand-built traces of the boundary cases; the trace must not be modified, and
# torch's profiler classes (`EventList`, `FunctionEvent`, `key_averages`) are off limits here.

# %% [answer op_times]
def op_times(trace):
    """{name: (count, self_us, total_us)} over the host events of a Chrome trace, like key_averages()."""
    ### BEGIN SOLUTION
    # twin: ptinternals.profiling.trace_analysis.op_times
    import re

    cats = set(HOST_CATEGORIES) | {"python_function"}
    events = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in cats:
            start, dur = round(float(e["ts"]) * 1000), float(e["dur"])   # integer nanoseconds
            events.append({"name": e["name"], "thread": (e.get("pid"), e.get("tid")), "start": start,
                           "end": start + round(dur * 1000), "dur": dur, "parent": None, "children": []})
    threads = {}
    for e in events:
        threads.setdefault(e["thread"], []).append(e)
    for evs in threads.values():
        stack = []
        for e in sorted(evs, key=lambda ev: (ev["start"], -ev["end"])):
            while stack and (e["start"] >= stack[-1]["end"] or e["end"] > stack[-1]["end"]):
                stack.pop()
            if stack:
                stack[-1]["children"].append(e)
                e["parent"] = stack[-1]
            stack.append(e)
    while True:  # folding: the order of the events does not matter
        doomed = set()
        for e in events:
            p = e["parent"]
            if p is not None and p["name"] == e["name"] and len(p["children"]) == 1:
                p["children"] = e["children"]
                for c in e["children"]:
                    c["parent"] = p
                doomed.add(id(e))
        if not doomed:
            break
        events = [e for e in events if id(e) not in doomed]
    out = {}
    for e in events:
        name = "ProfilerStep*" if re.match(r"^ProfilerStep#\d+$", e["name"]) else e["name"]
        self_us = e["dur"] - sum(c["dur"] for c in e["children"])
        n, s, t = out.get(name, (0, 0.0, 0.0))
        out[name] = (n + 1, s + self_us, t + e["dur"])
    return out
    ### END SOLUTION


# %% [tests op_times]
check("profiling.op_times", op_times)
### BEGIN HIDDEN TESTS
check("profiling.op_times", op_times, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Device rows: kernels, idle gaps, launch-bound steps
#
# On a GPU the trace gains rows for the device: one per CUDA stream, holding `kernel`, `gpu_memcpy`
# and `gpu_memset` events, each tagged with the `External id` of the host op that launched it (the
# host side shows the `cudaLaunchKernel` call inside that op). Reading such a trace, look for:
#
# * **idle gaps** between device activity: time the GPU waited for the host (Python overhead, a
#   sync that drained the queue, a data loader);
# * the **top kernels** by total time: what to optimise if the GPU is busy;
# * whether the step is **launch-bound**: many kernels shorter than their launch (a few microseconds
#   each), so the GPU finishes each before the host has launched the next.
#
# The simulated device writes the same trace format. Here the host spends 500 us of Python in the
# middle of a step, longer than the work it had queued, and the GPU waits for it:

# %%
from ptinternals.profiling.trace_analysis import gpu_idle_gaps, gpu_utilization, top_kernels

sim = SimulatedDevice(launch_overhead_us=5)
sim.copy(2_000_000, pinned=True, non_blocking=True)
for i in range(4):
    sim.launch(f"gemm{i % 2}", 60)
sim.host_work(500, name="python: logging, data")
for _ in range(20):
    sim.launch("elementwise", 2)
sim.synchronize()
gpu_trace = sim.chrome_trace()
print("top kernels:", top_kernels(gpu_trace, 3))
print("idle gaps (us):", gpu_idle_gaps(gpu_trace, min_gap_us=1.0)[:4], "...")
print(f"GPU busy {gpu_utilization(gpu_trace):.0%} of the time")
display(plot_trace_timeline(gpu_trace, title="simulated GPU trace: a host stall, then a launch-bound tail"))

# %% [markdown]
# The tail of 20 two-microsecond kernels is launch-bound: each takes 2 us on the device but 5 us to
# launch, so the GPU idles 3 us out of every 5. Fusing the kernels (`torch.compile`) or
# **CUDA graphs** fix this. A CUDA graph records a sequence of kernels once
# (`torch.cuda.graph(g)`) and replays it with one launch (`g.replay()`), so the per-kernel host cost
# disappears:

# %%
kernels = [("elementwise", 2)] * 20
eager, graph = SimulatedDevice(launch_overhead_us=5), SimulatedDevice(launch_overhead_us=5)
for name, us in kernels:
    eager.launch(name, us)
graph.launch_graph(kernels)
eager.synchronize()
graph.synchronize()
print(f"eager: {eager.host_time} us, one graph replay: {graph.host_time} us for the same 20 kernels")

# %% [markdown]
# ### {{exercise gpu_activity}}: the GPU's side of a trace
#
# Write `gpu_activity(trace, k=3, min_gap_us=0.0)` returning a dict with:
#
# * `"gaps"`: the idle intervals `(start, end)` between the first and the last device activity
#   (events of a category in `DEVICE_CATEGORIES`, on any stream) during which nothing runs, sorted,
#   keeping only gaps *longer* than `min_gap_us`; activities that overlap or touch leave no gap;
# * `"top_kernels"`: the `k` device activities with the largest total duration, as
#   `(name, count, total_us)`, ties broken by name;
# * `"utilization"`: the busy fraction of the span from the first start to the last end
#   (`None` without device events; `1.0` when that span is zero).
#
# A zero-length activity is an instant of activity: it ends a gap. Raise `ValueError` for `k < 0` or
# `min_gap_us < 0`. The checker sweeps every instant of the device rows to know the answer, on traces
# of the simulated device and on hand-built ones (touching activities, a gap exactly `min_gap_us`
# long, another stream busy in a gap, ties, annotations on the device rows).

# %% [answer gpu_activity]
def gpu_activity(trace, k=3, min_gap_us=0.0):
    """Idle gaps, top device activities and utilisation of the device rows of a trace."""
    ### BEGIN SOLUTION
    # twin: ptinternals.profiling.trace_analysis.gpu_activity
    if k < 0 or min_gap_us < 0:
        raise ValueError(f"k and min_gap_us must be >= 0, got k={k}, min_gap_us={min_gap_us}")
    spans, totals = [], {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES:
            s, d = float(e["ts"]), float(e.get("dur", 0.0))
            spans.append((s, s + d))
            n, t = totals.get(e["name"], (0, 0.0))
            totals[e["name"]] = (n + 1, t + d)
    merged = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    gaps = [(a[1], b[0]) for a, b in zip(merged, merged[1:]) if b[0] - a[1] > min_gap_us]
    top = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:k]
    if merged:
        span = merged[-1][1] - merged[0][0]
        utilization = 1.0 if span == 0 else sum(e - s for s, e in merged) / span
    else:
        utilization = None
    return {"gaps": gaps, "top_kernels": [(name, n, t) for name, (n, t) in top], "utilization": utilization}
    ### END SOLUTION


# %% [tests gpu_activity]
check("profiling.gpu_activity", gpu_activity)
### BEGIN HIDDEN TESTS
check("profiling.gpu_activity", gpu_activity, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("profiling", "q10", "q11", "q12")

# %% [markdown]
# ### Memory in the profiler
#
# `profile(profile_memory=True)` also records every allocation and free. `key_averages()` then
# reports each op's memory (`CPU Mem`, and `CUDA Mem` on a GPU): positive where an op allocates its
# outputs, negative in "Self" columns where an op frees more than it allocates. For the allocator's
# own view over time, use the snapshot tools of {{chapter allocator}}.

# %%
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as mprof:
    step()
print(mprof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=6))

# %% [markdown]
# ## 6. Fixing a training loop with hidden syncs
#
# Here is a training loop as it is often first written. Run it under the detector.

# %%
import inspect

from ptinternals.profiling.training_loops import make_batches, make_model, train_with_hidden_syncs

print(inspect.getsource(train_with_hidden_syncs))
batches = make_batches(seed=0, steps=3, batch=8)
with SyncDetector() as det:
    model = make_model(0)
det.events.clear()                      # the model's own copy to the device is not the loop's
with det:
    slow_losses = train_with_hidden_syncs(model, batches)
print(det.report())

# %% [markdown]
# Six host waits per step. On a GPU each one drains the queue: the host cannot enqueue step *i+1*
# while it waits for step *i*, so the GPU idles while Python runs.
#
# ### {{exercise train_fast}}: a loop without hidden syncs
#
# Write `train_fast(model, batches, lr=0.1, device="cuda")` that returns the **same losses** as
# `train_with_hidden_syncs` (to float rounding) with **one** implicit sync in total (none for an
# empty `batches`) and no stalls. Keep its behaviour: SGD with `lr`, rows labelled `-1` left out of
# the loss, and `ValueError` when a batch has no labelled row (its loss is NaN), raised after the
# loop is fine. Hints: `cross_entropy` has an `ignore_index`; a NaN can be found in the host values
# you read at the end; pinned memory makes `non_blocking` copies real.
#
# The checker runs your loop on the emulated device and counts every host sync, with its line; the
# parameters must stay on the device and the batches must not change. It also reads your loop's code:
# no `.item()`, `.cpu()`, `.tolist()`, `.numpy()`, `.nonzero()`, `.masked_select()`, `.unique()`,
# `synchronize()` or `print(...)` inside a `for`/`while` body, no indexing with a boolean mask there,
# and no `if`/`while` whose condition calls torch inside a loop. (On a GPU, the GPU check measures
# the speed-up over the original loop.)

# %% [answer train_fast]
def train_fast(model, batches, lr=0.1, device="cuda"):
    """The losses of train_with_hidden_syncs, with one host wait at the end."""
    ### BEGIN SOLUTION
    # twin: ptinternals.profiling.training_loops.train_without_syncs
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.pin_memory().to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y, ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    if not losses:
        return []
    values = torch.stack(losses).tolist()
    if any(v != v for v in values):
        raise ValueError("loss is NaN: a batch without labelled rows")
    return values
    ### END SOLUTION


# %% [tests train_fast]
check("profiling.train_fast", train_fast)
### BEGIN HIDDEN TESTS
check("profiling.train_fast", train_fast, hidden=True)
### END HIDDEN TESTS

# %%
try:
    with SyncDetector() as det:
        model = make_model(0)
    det.events.clear()
    with det:
        fast_losses = train_fast(model, batches)
    print(det.report())
    print("same losses:", torch.allclose(torch.tensor(fast_losses), torch.tensor(slow_losses), atol=1e-6))
except NotImplementedError:
    print("(your train_fast is not written yet)")

# %% [markdown]
# ## 7. Profiling the capstone's train step
#
# The capstone ({{chapter gpt}}) trains a character-level GPT. Its step has three phases; the course
# gives them as three functions (`capstone_parts`): `forward()` draws a batch and computes the loss,
# `backward()` back-propagates it, `optimizer()` clips the gradients and takes an AdamW step.
#
# ### {{exercise capstone_costs}}: name the top costs
#
# Write `capstone_costs(forward, backward, optimizer, trace_path)`. Profile the step with
# `torch.profiler` (CPU activity; `schedule(wait=1, warmup=1, active=2)`, calling `prof.step()` after
# each of the 4 steps), wrapping each phase in a `record_function` range named `"forward"`,
# `"backward"` and `"optimizer"`; export the trace to `trace_path`; and return the names of the
# three ATen ops (`"aten::..."`) with the most self CPU time in that trace (ties by name). The
# checker reads your trace: it must hold exactly two `ProfilerStep` ranges, each with the three
# phases once and the ops the step runs; your three names must be the top three of your own trace.
# (While grading, the three parts are a stand-in for the capstone's step built from torch's own
# layers, since the grading sandbox has no reference GPT; each part counts its calls, and each must
# run exactly four times.)

# %% [answer capstone_costs]
def capstone_costs(forward, backward, optimizer, trace_path):
    """Profile 4 steps (wait 1, warm-up 1, active 2), export the trace, return its top-3 ATen ops by self time."""
    ### BEGIN SOLUTION
    # twin: ptinternals.profiling.profile_step.capstone_costs
    import json

    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
        for _ in range(4):
            with record_function("forward"):
                forward()
            with record_function("backward"):
                backward()
            with record_function("optimizer"):
                optimizer()
            prof.step()
    with open(trace_path) as f:
        times = op_times(json.load(f))
    aten = [(name, s) for name, (_, s, _) in times.items() if name.startswith("aten::")]
    return [name for name, _ in sorted(aten, key=lambda kv: (-kv[1], kv[0]))[:3]]
    ### END SOLUTION


# %% [tests capstone_costs]
check("profiling.capstone_costs", capstone_costs)
### BEGIN HIDDEN TESTS
check("profiling.capstone_costs", capstone_costs, hidden=True)
### END HIDDEN TESTS

# %%
from ptinternals.profiling.profile_step import capstone_parts, capstone_step, profile_steps

report = profile_steps(capstone_step(batch_size=4, n_layer=1), wait=1, warmup=1, active=2)
print("top 3 by self CPU time:", [(name, f"{us / 1e3:.1f} ms") for name, us in report.top(3)])
print("phases (ms):", {k: round(v / 1e3, 1) for k, v in report.phase_us().items()})
try:
    print("yours:", capstone_costs(*capstone_parts(batch_size=4, n_layer=1),
                                   os.path.join(tempfile.mkdtemp(), "capstone.json")))
except NotImplementedError:
    print("(your capstone_costs is not written yet)")

# %% [markdown]
# On the CPU the matrix multiplications (`aten::mm`, `aten::addmm`) dominate, with attention and the
# backward of GELU next. On a GPU, sort by device time instead (`report.top(3, by="device_self_us")`),
# and look at the trace's device rows: at this size the step is launch-bound, which is what CUDA
# graphs and `torch.compile` address.
#
# ## Summary
#
# * The host enqueues kernels and runs ahead; it waits only when it needs a device value. The ops
#   that make it wait are few and nameable (`_local_scalar_dense`, `nonzero`, mask indexing, `unique`,
#   blocking copies, printing) and `set_sync_debug_mode` or the detector finds them.
# * Time GPU work with warm-up, synchronisation, events, medians and a spread; never with a host clock
#   around an unsynchronised call.
# * Pinned memory plus `non_blocking=True` plus a side stream hides copies behind compute; the step
#   then costs `max(host, copy, compute)`. `record_stream` keeps the allocator from reusing a batch's
#   block while another stream still reads it.
# * A profile answers "where does time go": self time for the hot ops, total time for the expensive
#   calls, device rows for idle gaps and launch-bound tails.
#
# Next: {{chapter amp}} halves the bytes every kernel moves with mixed precision; profile it with what
# you built here.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `profiling.answers.json`).

# %% [quiz-grade]
quiz_progress("profiling")
