"""Profiling and the host-device boundary: the reference implementation of the ``profiling`` chapter.

Modules (one idea each, each naming the PyTorch source it mirrors):

    sync_rules       which ATen ops make the host wait for a CUDA device, and why (the kernels that
                     reach c10::cuda::memcpy_and_sync / stream_synchronize)
    placement        which (emulated) tensors live on the device or in pinned memory, per storage
    host_boundary    a TorchFunctionMode: transfers, printing, one_hot; CUDA emulation on a CPU build
    sync_recorder    the detector's machinery: a TorchDispatchMode over both layers that records what a rule flags
    sync_detector    SyncDetector (the recorder with the rule table), find_syncs
    sync_programs    generated programs with known syncs; real_sync_lines (set_sync_debug_mode, GPU)
    async_device     SimulatedDevice: host clock, streams, events, copies, launch queue, record_stream
    timing           naive vs synchronised vs event timing; median and IQR; torch.utils.benchmark
    overlap          a training step's copy/compute timeline: simulate_training, predict_step_us
    trace_analysis   exported Chrome traces: self/total time per op, GPU idle gaps, top kernels
    profile_step     torch.profiler with schedule + record_function; the capstone's step, its top costs

Figures live in ``ptinternals.viz.profiling``.
"""
from .async_device import Event, SimulatedDevice, Stream
from .overlap import LOOPS, StepCosts, predict_step_us, simulate_training
from .sync_detector import SyncDetector, SyncEvent, find_syncs
from .sync_recorder import SyncRecorder
from .sync_rules import REASONS, sync_reason
from .timing import TimingResult, benchmark_torch, event_time_ms, naive_time_ms, synced_time_ms
from .trace_analysis import gpu_idle_gaps, load_trace, op_stats, top_kernels, top_ops

__all__ = [
    "Event", "SimulatedDevice", "Stream", "LOOPS", "StepCosts", "predict_step_us", "simulate_training",
    "SyncDetector", "SyncEvent", "SyncRecorder", "find_syncs", "REASONS", "sync_reason", "TimingResult", "benchmark_torch",
    "event_time_ms", "naive_time_ms", "synced_time_ms", "gpu_idle_gaps", "load_trace", "op_stats",
    "top_kernels", "top_ops",
]
