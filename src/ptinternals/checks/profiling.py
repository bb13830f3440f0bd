"""The profiling chapter's graded exercises: cases, expected answers, and likely causes of wrong ones.

Where the expected values come from:

- ``sync_reason``: which ops make the host wait on CUDA is a property of CUDA kernels, so a CPU build
  of torch cannot answer it. Each case *class* carries its verdict, written here from torch's own
  test of the feature (``test_sync_warning`` in test/test_torch.py) and the CUDA sources named in
  ``ptinternals.profiling.sync_rules``; generated programs carry the statements' verdicts
  (``sync_programs.STATEMENTS``). The GPU check compares both with ``torch.cuda.set_sync_debug_mode``.
- ``time_gpu``: the simulated device's CUDA events. The student's call log is replayed here on a
  simulator of the same seed, and the statistics of the replayed samples come from ``torch.quantile``.
- ``predict_step`` and ``train_prefetch``: the simulated device running the loops (no CPU-side torch
  has an answer); on a GPU, ``cuda_overlap`` measures the same loops (the GPU check).
- ``op_times``: torch's own tree code (``EventList._populate_cpu_children``, ``_remove_dup_nodes``,
  ``key_averages``) run on the trace's events, which on real profiles agrees with ``prof.key_averages()``
  (``tests/profiling/test_checks.py``).
- ``gpu_activity``: a sweep over every instant of the device rows (no interval merging), and counts.
- ``train_fast``: the losses and parameters torch computes with the original loop; its syncs are
  judged here, from the sandbox's description of every ATen op, with the chapter's rule table.
- ``capstone_costs``: the student's own trace, checked against a profile of the same step made here,
  and its top three read with torch's tree code.

Answers run sandbox-side through ``ptinternals.checks.probes.profiling``. Some exercises also have a
``policy`` (``grading.policy.Policy``): what the answer's code may not do (use torch's profiler tree
code, build a simulator, read the device inside the training loop), checked by the trusted grader on
the notebook's source before the answer runs.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from ..grading.cases import cases_from, draw
from ..grading.compare import close_tensors, describe
from ..grading.exercise import Case, Chapter, Exercise, Raises
from ..grading.policy import Policy
from ..profiling import overlap as ref_overlap
from ..profiling import sync_programs
from ..profiling.scaffold import DEVICE_CATEGORIES, HOST_CATEGORIES, make_batches, make_model
from ..profiling.training_loops import train_with_hidden_syncs
from .probes import profiling as P

PROBES = "ptinternals.checks.probes.profiling"


@dataclass
class KnownCase(Case):
    """A case whose right answer is known from how it was built (``truth``); ``scenario`` names its class."""

    truth: object = None
    scenario: str = ""


def _dict(got) -> bool:
    return isinstance(got, dict)


# ================================================================================================
# profiling.sync_reason
# ================================================================================================
FLOATS = ("float32", "float16", "bfloat16", "float64")
MASKS = ("bool", "uint8")


def T(dtype: str, shape, place: str = "device", layout: str = "contiguous") -> tuple:
    """A tensor description for ``probes.profiling.build_value``."""
    return ("t", dtype, list(shape), place, layout)


def _self(d, dtypes=FLOATS, shapes=((5,), (3, 4), (1,), (0,)), place="device"):
    shape = d(st.sampled_from(shapes))
    layout = d(st.sampled_from(["contiguous", "transposed", "expanded"])) if len(shape) == 2 else "contiguous"
    return T(d(st.sampled_from(dtypes)), shape, place, layout)


def _scalar_read(d, place):
    s = T(d(st.sampled_from(FLOATS + ("int64", "bool"))), d(st.sampled_from([(), (1,)])), place)
    return "aten._local_scalar_dense.default", [s], {}, "scalar_read" if place == "device" else None, \
        "scalar_read" if place == "device" else "host_self", f".item() of a {place} tensor"


def _size_from_data(d, kind):
    reason, place = kind
    s = _self(d, place=place)
    args = [s] + ([T("bool", s[2], place)] if reason == "masked_select" else [])
    return f"aten.{reason}.default", args, {}, reason if place == "device" else None, \
        reason if place == "device" else "host_self", f"{reason} of a {place} tensor of shape {tuple(s[2])}"


def _nonzero_static(d, _):
    s = _self(d)
    return "aten.nonzero_static.default", [s], {"size": d(st.integers(0, 4))}, None, "nonzero_static", \
        "nonzero_static(size=): the output size is given, nothing to read"


UNIQUE_OPS = {
    "aten._unique.default": lambda d: [d(st.booleans())],
    "aten._unique2.default": lambda d: [d(st.booleans()), d(st.booleans()), d(st.booleans())],
    "aten.unique_dim.default": lambda d: [0, d(st.booleans())],
    "aten.unique_consecutive.default": lambda d: [d(st.booleans())],
    "aten.unique_dim_consecutive.default": lambda d: [0],
}


def _unique(d, kind):
    op, place = kind
    s = T(d(st.sampled_from(("float32", "int64"))), d(st.sampled_from([(6,), (1,), (0,)])), place)
    return op, [s] + UNIQUE_OPS[op](d), {}, "unique" if place == "device" else None, \
        "unique" if place == "device" else "host_self", f"{op.split('.')[1]} of a {place} tensor"


def _bincount(d, place):
    s = T("int64", d(st.sampled_from([(7,), (1,), (0,)])), place)
    kwargs = d(st.sampled_from([{}, {"minlength": 10}]))
    return "aten.bincount.default", [s], kwargs, "bincount" if place == "device" else None, \
        "bincount" if place == "device" else "host_self", f"bincount of a {place} tensor"


def _histc(d, kind):
    place, bounds = kind
    s = _self(d, dtypes=("float32", "float64"), place=place)
    bins = d(st.sampled_from([4, 100]))
    equal = d(st.sampled_from([1.5, -2.0, 0.0]))
    lo, hi = {"default": (0, 0), "equal": (equal, float(repr(equal))), "range": (-3.0, 3.0),  # two float objects:
              "range_tiny": (0.0, 1e-30)}[bounds]                                          # `is` is not `==`
    style = d(st.sampled_from(["positional", "keywords", "omitted"] if bounds == "default" else ["positional", "keywords"]))
    if style == "omitted":
        args, kwargs = [s, bins], {}
    elif style == "positional":
        args, kwargs = [s, bins, lo, hi], {}
    else:
        args, kwargs = [s], {"bins": bins, "min": lo, "max": hi}
    equal = lo == hi
    truth = "histc_range" if (equal and place == "device") else None
    scenario = ("histc_default" if bounds == "default" else "histc_equal" if equal else "histc_range") \
        if place == "device" else "host_self"
    return "aten.histc.default", args, kwargs, truth, scenario, \
        f"histc of a {place} tensor, min={lo}, max={hi} ({style})"


def _bool_result(d, kind):
    op, place = kind
    s = _self(d, dtypes=("float32",), place=place)
    return op, [s, T(s[1], s[2], place)], {}, "bool_result" if place == "device" else None, \
        "bool_result" if place == "device" else "host_self", f"{op.split('.')[1]} of {place} tensors"


def _index(d, kind):
    rows, cols = d(st.sampled_from([(4, 3), (1, 1), (0, 3)]))
    self_place = "host" if kind == "host_self" else "device"
    s = T(d(st.sampled_from(FLOATS)), (rows, cols), self_place)
    lead = d(st.sampled_from([[], [None]]))
    shape = (cols,) if lead else (rows, cols)
    if kind in ("mask_bool", "mask_uint8", "host_mask"):
        dtype = "uint8" if kind == "mask_uint8" else d(st.sampled_from(MASKS)) if kind == "host_mask" else "bool"
        idx = [T(dtype, shape, "host" if kind == "host_mask" else "device")]
        truth, scenario = "bool_mask_index", "index_host_mask" if kind == "host_mask" else "index_mask"
    elif kind == "device_long":
        idx = [T("int64", (2,), "device")] + d(st.sampled_from([[], [T("int64", (2,), "device")]]))
        truth, scenario = None, "index_device_long"
    elif kind == "host_long":
        idx = d(st.sampled_from([[T("int64", (2,), "host")], [T("int64", (2,), "device"), T("int64", (2,), "host")]]))
        truth, scenario = "host_index", "index_host_long"
    else:
        idx = [T(d(st.sampled_from(["int64", "bool"])), (rows,), "host")]
        truth, scenario = None, "host_self"
    return "aten.index.Tensor", [s, lead + idx], {}, truth, scenario, \
        f"x[...] with indices {_show(lead + idx)} on a {self_place} x of shape {(rows, cols)}"


PUT_OPS = ("aten.index_put_.default", "aten.index_put.default", "aten._index_put_impl_.default")
PUT_KINDS = ("masked_fill", "masked_fill_shape1", "masked_fill_uint8", "accumulate", "device_value", "multi_value",
             "empty_value", "two_masks", "host_mask", "host_long", "host_long_and_mask", "device_long", "host_self")


def _index_put(d, kind):
    op = d(st.sampled_from(PUT_OPS))
    rows, cols = d(st.sampled_from([(4, 3), (1, 1), (2, 5)]))
    self_place = "host" if kind == "host_self" else "device"
    s = T(d(st.sampled_from(FLOATS)), (rows, cols), self_place)
    mask_dtype = "uint8" if kind == "masked_fill_uint8" else d(st.sampled_from(MASKS))
    lead = d(st.sampled_from([[], [None]]))
    mask = T(mask_dtype, (cols,) if lead else (rows, cols), "host" if kind == "host_mask" else self_place)
    value = T(s[1], (), "host")
    accumulate = False
    if kind in ("masked_fill", "masked_fill_uint8", "host_self", "host_mask"):
        indices = lead + [mask]
    elif kind == "masked_fill_shape1":
        indices, value = lead + [mask], T(s[1], (1,), "host")
    elif kind == "accumulate":
        indices, accumulate = lead + [mask], True
    elif kind == "device_value":
        indices, value = lead + [mask], T(s[1], d(st.sampled_from([(), (1,)])), "device")
    elif kind == "multi_value":
        indices, value = lead + [mask], T(s[1], (2,), "host")
    elif kind == "empty_value":
        indices, value = lead + [mask], T(s[1], (0,), "host")
    elif kind == "two_masks":
        indices = [T(mask_dtype, (rows,), "device"), T(mask_dtype, (cols,), "device")]
    elif kind == "host_long":
        indices = [T("int64", (2,), "host")]
    elif kind == "host_long_and_mask":
        indices = [T("int64", (1,), "host"), T(mask_dtype, (cols,), "device")]
    else:  # device_long
        indices, value = [T("int64", (2,), "device")], d(st.sampled_from([value, T(s[1], (2, cols), "device")]))
    truth = {"masked_fill": None, "masked_fill_shape1": None, "masked_fill_uint8": None, "host_self": None,
             "device_long": None, "host_long": "host_index", "host_long_and_mask": "host_index"}.get(kind,
                                                                                                    "bool_mask_index")
    args = [s, indices, value]
    kwargs = {}
    if accumulate or d(st.booleans()):
        if d(st.booleans()):
            args.append(accumulate)
        else:
            kwargs["accumulate"] = accumulate
    return op, args, kwargs, truth, "host_self" if kind == "host_self" else f"put_{kind}", \
        (f"{op.split('.')[1]}: x[{_show(indices)[1:-1]}] = {_show([value])[1:-1]} on a {self_place} x of shape "
         f"{(rows, cols)}, accumulate={accumulate}")


def _repeat(d, kind):
    overload, place, sized = kind
    n = d(st.sampled_from([3, 1, 0]))
    repeats = T("int64", (n,), place)
    kwargs = {}
    if sized is not None:
        kwargs["output_size"] = 0 if sized == "zero" else 2 * n
    if overload == "Tensor":
        args = [repeats]
    elif overload == "self_Tensor":
        args = [T("float32", (n,), d(st.sampled_from(["device", "host"]))), repeats]
    else:
        args = [T("float32", (n,), place), 2]
    truth = "repeat_interleave" if (overload != "self_int" and place == "device" and sized is None) else None
    scenario = "repeat_int" if overload == "self_int" else ("repeat_sized" if sized else "repeat") \
        if place == "device" else "repeat_host"
    return f"aten.repeat_interleave.{overload}", args, kwargs, truth, scenario, \
        (f"repeat_interleave.{overload}, repeats "
         f"{'an int' if overload == 'self_int' else 'on the ' + place}, output_size={kwargs.get('output_size')}")


OTHER_OPS = ("aten.add.Tensor", "aten.mm.default", "aten.masked_fill_.Scalar", "aten.index_select.default",
             "aten.clone.default", "aten.sum.default", "aten.where.self", "aten.randperm.default")


def _other(d, op):
    x = _self(d, dtypes=("float32",), shapes=((4,), (2, 2), (0,)))
    mask = T("bool", x[2], "device")
    args = {
        "aten.add.Tensor": [x, T("float32", x[2])],
        "aten.mm.default": [T("float32", (2, 3)), T("float32", (3, 2))],
        "aten.masked_fill_.Scalar": [x, mask, 0.0],
        "aten.index_select.default": [T("float32", (4, 3)), 0, T("int64", (2,))],
        "aten.clone.default": [x],
        "aten.sum.default": [x],
        "aten.where.self": [mask, x, T("float32", x[2])],
        "aten.randperm.default": [5],
    }[op]
    return op, args, {}, None, "other", f"{op.split('.')[1]} on device tensors (not in the table)"


PLACES = ("device", "host")
# Every class of case, each drawn a few times: (builder, its kinds).
SCENARIOS = (
    (_scalar_read, PLACES),
    (_size_from_data, [(r, p) for r in ("nonzero", "masked_select") for p in PLACES]),
    (_nonzero_static, [None]),
    (_unique, [(op, p) for op in UNIQUE_OPS for p in PLACES]),
    (_bincount, PLACES),
    (_histc, [("device", b) for b in ("default", "equal", "range", "range_tiny")] + [("host", "equal")]),
    (_bool_result, [(op, p) for op in ("aten.equal.default", "aten.allclose.default") for p in PLACES]),
    (_index, ("mask_bool", "mask_uint8", "host_mask", "device_long", "host_long", "host_self")),
    (_index_put, PUT_KINDS),
    (_repeat, [(o, p, z) for o in ("Tensor", "self_Tensor", "self_int") for p in PLACES for z in (None, "given", "zero")]),
    (_other, OTHER_OPS),
)


def _descs(x) -> list[tuple]:
    """Every tensor description inside a case's arguments."""
    if isinstance(x, tuple) and x and x[0] == "t":
        return [x]
    if isinstance(x, (list, tuple)):
        return [d for v in x for d in _descs(v)]
    if isinstance(x, dict):
        return [d for v in x.values() for d in _descs(v)]
    return []


def _call_descs(case) -> list[tuple]:
    return _descs(list(case.args[2:])) if case.args[0] == "call" else []


def _numel(shape) -> int:
    return math.prod(shape)


def _show(items) -> str:
    parts = []
    for i in items:
        if i is None:
            parts.append("None")
        elif isinstance(i, tuple) and i and i[0] == "t":
            parts.append(f"{i[3]} {i[1]}{tuple(i[2])}")
        else:
            parts.append(repr(i))
    return "[" + ", ".join(parts) + "]"


SYNC_HINTS = {  # scenario -> (expected, got) -> hint; only where the symptom names the cause
    "host_self": "only work on the device can make the host wait: return None unless the op's self (for "
                 "repeat_interleave: repeats) is on the device (on_device(a['self'])).",
    "repeat_host": "repeat_interleave syncs only when its repeats tensor is on the device.",
    "repeat_sized": "output_size given (even 0) means the host needs no count: test `output_size is None`, not "
                    "`not output_size`.",
    "repeat_int": "an int repeats is already on the host: only a device repeats tensor makes the host wait.",
    "histc_equal": "histc reads the range from the data whenever min == max, whatever the value (not only 0).",
    "histc_default": "bind_arguments(func, args, kwargs) fills the defaults: histc(x, 4) has min=0 and max=0.",
    "histc_range": "with min < max the range is known on the host: no wait.",
    "nonzero_static": "nonzero_static is not nonzero: its size is given, so it exists to avoid the sync "
                      "(compare op names exactly).",
    "put_masked_fill": "x[mask] = scalar runs masked_fill_: one mask index (other indices None), a one-element "
                       "value on the host, accumulate False: no wait.",
    "put_masked_fill_shape1": "the masked_fill_ path needs a one-element host value: value.numel() == 1, not "
                              "value.dim() == 0 (shape (1,) qualifies).",
    "put_masked_fill_uint8": "uint8 masks are masks too (dtype bool or uint8), for the masked_fill_ path as for "
                             "indexing.",
    "put_accumulate": "with accumulate=True there is no masked_fill_ path: the mask becomes nonzero().",
    "put_device_value": "the masked_fill_ path needs the value on the host: a device value means nonzero().",
    "put_multi_value": "the masked_fill_ path needs a one-element value.",
    "put_empty_value": "the masked_fill_ path needs exactly one element in the value (numel() == 1): an empty "
                       "value does not qualify.",
    "put_two_masks": "the masked_fill_ path takes exactly one mask index: with two, both become nonzero().",
    "put_host_long_and_mask": "check for a host (non-mask) index tensor first, as the rule table says: it wins "
                              "over the mask rule.",
    "index_mask": "a bool or uint8 index tensor is a mask: x[mask] runs nonzero().",
    "index_host_long": "an index tensor on the host must be copied to the device first (host_index), unless it "
                       "is a mask.",
    "index_device_long": "an index tensor already on the device needs no wait.",
    "other": "only the ops of the table wait: anything else returns None.",
}


class SyncReason(Exercise):
    """Direct calls of ATen ops built from descriptions (real tensors, a placement the probe controls)
    and generated CUDA programs run emulated with the student's rule; see the module docstring for
    where each verdict comes from."""

    id, entry, points = "profiling.sync_reason", "sync_reason", 3
    title = "which ATen ops make the host wait, and why"
    timeout_s = 60.0
    boundary_classes = {
        "a size-0 device tensor that still waits (nonzero of nothing)": lambda c, e: e not in (None, []) and any(
            0 in d[2] and d[3] == "device" for d in _call_descs(c)),
        "a one-element tensor": lambda c, e: any(_numel(d[2]) == 1 for d in _call_descs(c)),
        "a non-contiguous self (transposed or expanded)": lambda c, e: any(d[4] != "contiguous" for d in _call_descs(c)),
        "output_size=0: given, and falsy": lambda c, e: c.args[0] == "call" and c.args[3].get("output_size") == 0,
        "histc with min == max != 0": lambda c, e: c.scenario == "histc_equal" and "min=0.0" not in c.label,
        "histc with min < max by one step (1e-30)": lambda c, e: c.args[0] == "call" and "max=1e-30" in c.label,
        "a one-element host value of shape (1,)": lambda c, e: c.scenario == "put_masked_fill_shape1",
        "a uint8 mask": lambda c, e: any(d[1] == "uint8" for d in _call_descs(c)),
        "a host long index next to a device mask": lambda c, e: c.scenario == "put_host_long_and_mask",
        "accumulate=True": lambda c, e: c.scenario == "put_accumulate",
        "two masks": lambda c, e: c.scenario == "put_two_masks",
        "a leading None index before the mask": lambda c, e: c.args[0] == "call" and "[None, " in c.label
        and c.scenario.startswith("put_masked_fill"),
        "a host op (nothing to wait for)": lambda c, e: c.scenario == "host_self",
        "an op outside the table": lambda c, e: c.scenario == "other",
        "nonzero_static (a name that starts like nonzero)": lambda c, e: c.scenario == "nonzero_static",
        "an empty program (setup only)": lambda c, e: c.scenario == "program" and
        c.args[1].count("\n") == len(sync_programs.SETUP),
        "two syncs on one program line": lambda c, e: c.scenario == "program" and len(e) != len({line for line, _ in e}),
        "inputs checked after the call": lambda c, e: c.args[0] == "call",
    }

    def visible_cases(self):
        out = [
            self._call("aten._local_scalar_dense.default", [T("float32", ())], {}, "scalar_read", "scalar_read",
                       ".item() of a device scalar"),
            self._call("aten._local_scalar_dense.default", [T("float32", (), "host")], {}, None, "host_self",
                       ".item() of a host scalar: nothing to wait for"),
            self._call("aten.index.Tensor", [T("float32", (4,)), [T("bool", (4,))]], {}, "bool_mask_index",
                       "index_mask", "x[mask] on the device"),
            self._call("aten.index_put_.default", [T("float32", (4,)), [T("bool", (4,))], T("float32", (), "host")],
                       {}, None, "put_masked_fill", "x[mask] = 1.0: masked_fill_, no wait"),
            self._call("aten.index_put_.default", [T("float32", (4,)), [T("bool", (4,))], T("float32", ())],
                       {}, "bool_mask_index", "put_device_value", "x[mask] = y with a device y"),
            self._call("aten.repeat_interleave.Tensor", [T("int64", (3,))], {"output_size": 6}, None, "repeat_sized",
                       "repeat_interleave(repeats, output_size=6)"),
            self._call("aten.histc.default", [T("float32", (5,)), 4], {}, "histc_range", "histc_default",
                       "histc(x, 4): min == max == 0 by default"),
            self._call("aten.add.Tensor", [T("float32", (4,)), T("float32", (4,))], {}, None, "other",
                       "x + y on the device"),
        ]
        out.append(self._program(sync_programs.make_program(7, 6), "a generated program (seed 7)"))
        return out

    def hidden_cases(self):
        calls = [case for build, kinds in SCENARIOS for kind in kinds
                 for case in draw(cases_from(lambda d, b=build, k=kind: self._call(*b(d, k))), 2)]
        calls += [self._call("aten.nonzero.default", [T(dtype, (0,))], {}, "nonzero", "nonzero",
                             f"nonzero of an empty {dtype} device tensor: the host still reads the count (0)")
                  for dtype in ("float32", "bool")]
        calls.append(self._call("aten._unique2.default", [T("int64", (0, ))], {}, "unique", "unique",
                                "_unique2 of an empty device tensor"))
        alone = [self._program(sync_programs.SyncProgram(
            f"<statement-{i}>", "\n".join(sync_programs.SETUP + (s.code,)) + "\n",
            tuple((len(sync_programs.SETUP) + 1, r) for r in s.reasons)), f"one statement: {s.code}")
            for i, s in enumerate(sync_programs.STATEMENTS)]
        deliberate = [(0, 0), (3, 12)]  # the empty program; a long one
        programs = [self._program(sync_programs.make_program(seed, n), f"a generated program (seed {seed}, {n} lines)")
                    for seed, n in deliberate + draw(st.tuples(st.integers(0, 10_000), st.integers(0, 12)), 16)]
        return calls + alone + programs

    probe = f"{PROBES}:sync_rule_case"

    @staticmethod
    def _call(op, args, kwargs, truth, scenario, label):
        return KnownCase(("call", op, args, kwargs), label=label, truth=truth, scenario=scenario)

    @staticmethod
    def _program(program, label):
        return KnownCase(("program", program.source, program.name, sync_programs.N), label=label,
                         truth=[tuple(e) for e in program.expected], scenario="program")

    def expected(self, case):
        return case.truth

    def compare(self, case, got, expected):
        if case.scenario == "program":
            return self._compare_program(case, got, expected)
        if not _dict(got):
            return f"expected the rule's verdict, got {describe(got)}"
        if got["modified"]:
            return f"your rule modified its inputs ({', '.join(got['modified'])}): a rule only looks at them"
        reason = got["reason"]
        if reason is not None and not isinstance(reason, str):
            return f"expected a REASONS key (a str) or None, got {describe(reason)}"
        if reason != expected:
            return f"expected {expected!r}\n     got {reason!r}"
        return None

    @staticmethod
    def _compare_program(case, got, expected):
        if not isinstance(got, list):
            return f"expected the (line, reason) list of the program's syncs, got {describe(got)}"
        got = [tuple(g) for g in got]
        if got == list(expected):
            return None
        lines = case.args[1].splitlines()
        want, have = Counter(expected), Counter(got)
        diffs = []
        for (line, reason), n in sorted((want - have).items()):
            diffs.append(f"line {line} `{lines[line - 1]}`: missing {reason!r}" + (f" (x{n})" if n > 1 else ""))
        for line, reason in sorted(have - want):
            diffs.append(f"line {line} `{lines[line - 1]}`: {reason!r} reported, but it does not wait for that")
        if not diffs:
            diffs.append("the right syncs, in the wrong order")
        return "the detector with your rule disagrees on this program:\n  " + "\n  ".join(diffs[:6])

    def diagnose(self, case, got, expected):
        if case.scenario == "program" or not _dict(got) or got.get("modified"):
            return None
        reason = got["reason"]
        if (reason is None) == (expected is None) and case.scenario != "put_host_long_and_mask":
            return None  # a wrong reason name, not a wrong verdict: the message says which
        if case.scenario == "index_mask" and reason is None and "uint8" in case.label:
            return "uint8 index tensors are masks too (dtype bool or uint8)."
        return SYNC_HINTS.get(case.scenario)


# ================================================================================================
# profiling.time_gpu
# ================================================================================================
def _timing_config(d, overhead, kernel_us, first_call, jitter, depth):
    return {"launch_overhead_us": overhead, "first_call_us": first_call, "device_jitter": jitter[0],
            "host_jitter": jitter[1], "queue_depth": depth, "seed": d(st.integers(0, 1000))}


class TimeGpu(Exercise):
    """The student's timer on a simulated device seen through a recording proxy. Its call log is replayed
    here on a simulator of the same seed: the samples are what its events read, and the expected answer
    is their median and IQR (``torch.quantile``, linear interpolation)."""

    id, entry, points = "profiling.time_gpu", "time_gpu", 2
    withheld_from_students = ("diagnose",)  # it takes unsorted percentiles the way the answer takes sorted ones
    title = "a GPU timer: warm-up, events, median and IQR"
    probe = f"{PROBES}:timer_probe"
    boundary_classes = {
        "reps=1: one sample, IQR 0": lambda c, e: c.kwargs.get("reps", 10) == 1,
        "an even number of runs: the median interpolates": lambda c, e: c.kwargs.get("reps", 10) % 2 == 0,
        "warmup=0 with a slow first call": lambda c, e: c.kwargs.get("warmup", 3) == 0 and c.args[0]["first_call_us"] > 0,
        "a zero-length kernel": lambda c, e: all(us == 0 for _, us in c.args[1]),
        "launch-bound: the kernels are shorter than their launches": lambda c, e: 0 < sum(us for _, us in c.args[1])
        < c.args[0]["launch_overhead_us"] * len(c.args[1]),
        "a full launch queue": lambda c, e: c.args[0]["queue_depth"] == 2,
        "device jitter": lambda c, e: c.args[0]["device_jitter"][0] > 0,
        "host jitter": lambda c, e: c.args[0]["host_jitter"][0] > 0,
        "the defaults (no warmup, no reps given)": lambda c, e: not c.kwargs,
        "reps=0 must raise": lambda c, e: isinstance(e, Raises),
    }

    def visible_cases(self):
        base = {"launch_overhead_us": 5, "first_call_us": 5000, "device_jitter": (0.0, 0.0), "host_jitter": (0.0, 0.0),
                "queue_depth": 1024, "seed": 0}
        return [
            Case((base, [("attention", 250)]), {"warmup": 3, "reps": 10}, label="a 250 us kernel, first call 5 ms slower"),
            Case((dict(base, first_call_us=0), [("tiny", 2)]), {"warmup": 2, "reps": 5},
                 label="launch-bound: a 2 us kernel, 5 us launches (events read the launch gap)"),
            Case((base, [("attention", 250)]), {"warmup": 1, "reps": 1}, label="one timed run: IQR 0"),
            Case((dict(base, device_jitter=(0.3, 400), seed=3), [("gemm", 100), ("gelu", 20)]), {"warmup": 3, "reps": 4},
                 label="two kernels per call, jitter, an even number of runs"),
            Case((base, [("attention", 250)]), {"warmup": 0, "reps": 3},
                 label="no warm-up: the first call lands in the samples"),
            Case((base, [("attention", 250)]), {}, label="the defaults: warmup=3, reps=10"),
            Case((base, [("attention", 250)]), {"warmup": 1, "reps": 0}, label="reps=0: raise ValueError"),
        ]

    def hidden_cases(self):
        def build(d, overhead, first_call, depth):
            kernels = [(f"k{i}", d(st.sampled_from([0, 1, 4, 40, 250, 10_000]))) for i in range(d(st.integers(1, 3)))]
            jitter = (d(st.sampled_from([(0.0, 0.0), (0.2, 300.0), (0.5, 1000.0)])),
                      d(st.sampled_from([(0.0, 0.0), (0.2, 50.0), (0.3, 2000.0)])))
            config = _timing_config(d, overhead, None, first_call, jitter, depth)
            kwargs = {}
            if d(st.booleans()):
                kwargs["warmup"] = d(st.integers(0, 5))
            if d(st.booleans()) or not kwargs:
                kwargs["reps"] = d(st.sampled_from([1, 2, 3, 4, 9, 10, 41]))
            return Case((config, kernels), kwargs)

        base = {"launch_overhead_us": 5, "first_call_us": 5000, "device_jitter": (0.0, 0.0),
                "host_jitter": (0.0, 0.0), "queue_depth": 1024, "seed": 0}
        deliberate = [
            Case((base, [("k", 100)]), {"reps": 1}), Case((base, [("k", 0)]), {"warmup": 2, "reps": 4}),
            Case((base, [("k", 100)]), {"warmup": 0, "reps": 5}), Case((base, [("k", 2), ("k2", 1)]), {"reps": 6}),
            Case((dict(base, queue_depth=2), [("k", 40)] * 3), {"warmup": 1, "reps": 9}),
            Case((dict(base, device_jitter=(0.4, 500.0), host_jitter=(0.4, 80.0), seed=5), [("k", 60)]), {"reps": 41}),
            Case((base, [("k", 250)])), Case((base, [("k", 250)]), {"warmup": -1}),
            Case((base, [("k", 250)]), {"reps": 0}),
        ]
        return deliberate + draw(cases_from(build, st.sampled_from([0, 3, 5, 20]), st.sampled_from([0, 5000]),
                                            st.sampled_from([1024, 1024, 2])), 60)

    def expected(self, case):
        reps, warmup = case.kwargs.get("reps", 10), case.kwargs.get("warmup", 3)
        if reps < 1 or warmup < 0:
            return Raises(("ValueError",), "reps must be >= 1")
        return None  # computed in compare, from the events the student's own protocol recorded

    @staticmethod
    def replay(case, log):
        """Samples (ms) of the timed runs, from the call log replayed on a simulator of the same seed."""
        config, kernels = case.args
        sim = P.simulated_device(config)
        events: dict = {}
        for entry in log:
            kind = entry[0]
            if kind == "fn":
                for name, us in kernels:
                    sim.launch(name, us)
            elif kind == "event":
                events[entry[1]] = sim.Event()
            elif kind == "record":
                events[entry[1]].record()
            elif kind == "event_sync":
                events[entry[1]].synchronize()
            elif kind == "synchronize":
                sim.synchronize()
        return events

    def compare(self, case, got, expected):
        reps, warmup = case.kwargs.get("reps", 10), case.kwargs.get("warmup", 3)
        if not _dict(got):
            return f"expected (median_ms, iqr_ms), got {describe(got)}"
        result, log = got["result"], [tuple(e) for e in got["log"]]
        if not (isinstance(result, (tuple, list)) and len(result) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in result)):
            return f"expected a pair (median_ms, iqr_ms) of numbers, got {describe(result)}"
        calls = [i for i, e in enumerate(log) if e[0] == "fn"]
        if len(calls) != warmup + reps:
            return (f"fn was called {len(calls)} times; a timer calls it warmup + reps = {warmup} + {reps} times "
                    f"(warm-up runs first, then one call per timed run)")
        timed = calls[warmup:]
        bounds = [-1] + calls + [len(log)]
        pairs = []
        for k, i in enumerate(timed):
            j = calls.index(i)
            before = [e[1] for e in log[bounds[j] + 1:i] if e[0] == "record"]
            after = [e[1] for e in log[i + 1:bounds[j + 2]] if e[0] == "record"]
            if not before or not after:
                return (f"timed run {k + 1} of {reps} has no event recorded right {'before' if not before else 'after'} "
                        f"its call of fn: record one event just before and one just after each timed call")
            pairs.append((before[-1], after[0]))
        first = next(i for i, e in enumerate(log) if e[0] == "record" and e[1] == pairs[0][0] and i < timed[0])
        last = max(i for i, e in enumerate(log) if e[0] == "record" and e[1] == pairs[-1][1])
        waits = [e for e in log[first:last] if e[0] in ("synchronize", "event_sync")]
        if waits:
            return (f"the host waited {len(waits)} time(s) between the first and the last timed run "
                    f"({waits[0][0]}): keep the queue full, synchronize only after the last run")
        events = self.replay(case, log)
        xs = [(events[b].time - events[a].time) / 1000.0 for a, b in pairs]
        median, iqr = _median_iqr(xs)
        if math.isclose(result[0], median, rel_tol=1e-9, abs_tol=1e-12) and \
                math.isclose(result[1], iqr, rel_tol=1e-9, abs_tol=1e-12):
            return None
        return (f"your events read {_fmt(xs)} ms\n  median and IQR of these: ({median:.6g}, {iqr:.6g})\n"
                f"     your answer:           ({result[0]:.6g}, {result[1]:.6g})")

    def diagnose(self, case, got, expected):
        if not _dict(got) or not isinstance(got.get("result"), (tuple, list)) or len(got["result"]) != 2:
            return None
        log = [tuple(e) for e in got["log"]]
        reps, warmup = case.kwargs.get("reps", 10), case.kwargs.get("warmup", 3)
        m, i = got["result"]
        n_calls = sum(e[0] == "fn" for e in log)
        if n_calls == reps and warmup > 0:
            return "warm up first: call fn() `warmup` times before the timed runs (and discard those runs)."
        if not any(e[0] == "elapsed" for e in log) and any(e[0] == "perf_counter" for e in log):
            return "time with the device's clock (events: start.elapsed_time(end)); the host clock measures the launch."
        try:
            pairs = _pairs(log, warmup)
            first = min(i for i, e in enumerate(log) if e[0] == "record" and e[1] == pairs[0][0])
            last = max(i for i, e in enumerate(log) if e[0] == "record" and e[1] == pairs[-1][1])
        except Exception:
            return None
        if any(e[0] in ("synchronize", "event_sync") for e in log[first:last]):
            return ("keep the queue full: synchronize once, after the last timed run. A wait between runs drains the "
                    "queue, and every sample then includes the launch.")
        try:
            events = self.replay(case, log)
            xs = [(events[b].time - events[a].time) / 1000.0 for a, b in pairs]
        except Exception:
            return None
        median, iqr = _median_iqr(xs)
        close = lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)  # noqa: E731
        if close(m, -median) and close(i, -iqr) and median:
            return "elapsed_time goes from the start event to the end event: start.elapsed_time(end)."
        if len(xs) % 2 == 0 and close(m, sorted(xs)[len(xs) // 2]) and not close(m, median):
            return "with an even number of runs the median is the mean of the two middle samples."
        unsorted = _linear_quantiles(xs)  # the samples in run order, never sorted
        if (close(m, unsorted[1]) and close(i, unsorted[2] - unsorted[0])) and not (close(m, median) and close(i, iqr)):
            return "sort the samples before taking percentiles (the median is the middle of the SORTED samples)."
        if close(m, xs[len(xs) // 2]) and not close(m, median):
            return "sort the samples before taking the middle one."
        if close(m, statistics.fmean(xs)) and not close(m, median):
            return "report the median, not the mean (a slow first call or a hiccup moves the mean)."
        if len(xs) >= 2 and close(m, median):
            q = statistics.quantiles(xs, n=4)
            if close(i, q[2] - q[0]):
                return ("the IQR uses linear interpolation between samples (numpy.percentile's default, "
                        "statistics.quantiles(..., method='inclusive')), not the 'exclusive' default.")
        return None


def _pairs(log, warmup):
    calls = [i for i, e in enumerate(log) if e[0] == "fn"]
    bounds = [-1] + calls + [len(log)]
    out = []
    for j, i in enumerate(calls):
        if j < warmup:
            continue
        before = [e[1] for e in log[bounds[j] + 1:i] if e[0] == "record"]
        after = [e[1] for e in log[i + 1:bounds[j + 2]] if e[0] == "record"]
        out.append((before[-1], after[0]))
    return out


def _linear_quantiles(xs) -> tuple[float, float, float]:
    """25th, 50th and 75th percentiles by linear interpolation over ``xs`` in the order given."""
    def at(q):
        pos = (len(xs) - 1) * q
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return at(0.25), at(0.5), at(0.75)


def _median_iqr(xs) -> tuple[float, float]:
    t = torch.tensor(xs, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))  # linear interpolation
    return float(q[1]), float(q[2] - q[0])


def _fmt(xs, limit: int = 8) -> str:
    shown = ", ".join(f"{x:.6g}" for x in xs[:limit])
    return f"[{shown}{', ...' if len(xs) > limit else ''}] ({len(xs)} runs)"


# ================================================================================================
# profiling.predict_step
# ================================================================================================
def _step_case(d, nbytes, pinned_bw, pageable_bw, compute, host, loop, pinned, item):
    dev = P.simulated_device({"pinned_gb_per_s": pinned_bw, "pageable_gb_per_s": pageable_bw})
    xp, xg = dev.copy_us(nbytes, True), dev.copy_us(nbytes, False)
    c = {"zero": 0.0, "copy": xp, "copy_pageable": xg, "small": 1e-3}.get(compute, compute)
    h = {"zero": 0.0, "compute": c, "copy": xp, "big": 1e6, "small": 1e-3}.get(host, host)
    kwargs = {}
    if pinned is not None:
        kwargs["pinned"] = pinned
    if item is not None:
        kwargs["item"] = item
    loop = "".join(list(loop))  # a str object of its own, as after the sandbox's JSON: `is` is not `==`
    return KnownCase((xp, xg, c, h, loop), kwargs, truth={"nbytes": nbytes, "pinned_bw": pinned_bw,
                                                           "pageable_bw": pageable_bw})


class PredictStep(Exercise):
    """Expected: the steady step time of ``overlap.simulate_training`` on a zero-overhead simulated device
    whose bandwidths give exactly the case's copy times."""

    id, entry, points = "profiling.predict_step", "predict_step", 2
    title = "the step time of three training loops, in closed form"
    probe = f"{PROBES}:formula_probe"
    policy = Policy(banned=("SimulatedDevice", "async_device", "simulate_training"),
                    why="the answer is a formula: build no simulated device")
    boundary_classes = {
        "zero-byte copies": lambda c, e: c.args[0] == 0 and c.args[4] in ref_overlap.LOOPS,
        "a copy exactly as long as the compute": lambda c, e: c.args[0] == c.args[2] > 0,
        "no compute": lambda c, e: c.args[2] == 0 and c.args[0] > 0,
        "host work exactly as long as the compute": lambda c, e: c.args[3] == c.args[2] > 0,
        "host-bound: the host outlasts copy and compute": lambda c, e: c.args[3] > c.args[0] + c.args[1] + c.args[2],
        "pinned and pageable copies equally fast": lambda c, e: c.args[0] == c.args[1] > 0,
        "a huge time next to a tiny one (1e6 us and 1e-3 us)": lambda c, e: max(c.args[:4]) >= 1e6 and
        0 < min(v for v in c.args[:4] if v) <= 1e-3,
        **{f"{loop}, {'pinned' if pinned else 'pageable'}, {'with' if item else 'without'} .item()":
           (lambda c, e, lp=loop, pn=pinned, it=item: c.args[4] == lp and c.kwargs.get("pinned", True) == pn
            and c.kwargs.get("item", False) == it)
           for loop in ref_overlap.LOOPS for pinned in (True, False) for item in (True, False)},
        "an unknown loop must raise": lambda c, e: isinstance(e, Raises),
        "an unknown loop sorting just before a known one": lambda c, e: c.args[4] in ("Async", "blockinf"),
        "an unknown loop sorting just after a known one": lambda c, e: c.args[4] in ("sync", "prefetch "),
    }

    def visible_cases(self):
        return [self._visible(*a) for a in [
            (1_000_000, 30, 5, "blocking", True, False, "blocking, pinned: the copy, then max(host, compute)"),
            (1_000_000, 30, 5, "async", True, False, "async, pinned: copy and compute back to back"),
            (1_000_000, 30, 5, "async", False, False, "async, pageable: the host stages the bytes"),
            (1_000_000, 30, 5, "prefetch", True, False, "prefetch: max(host, copy, compute)"),
            (1_000_000, 30, 5, "prefetch", True, True, "prefetch with .item(): the host waits for the compute"),
            (1_000_000, 30, 5, "blocking", False, True, "blocking, pageable, .item()"),
            (1_000_000, 20, 0, "async", None, None, "the defaults: pinned=True, item=False"),
            (1_000_000, 30, 5, "overlapped", True, False, "an unknown loop: raise ValueError"),
        ]]

    @staticmethod
    def _visible(nbytes, c, h, loop, pinned, item, label):
        case = _step_case(None, nbytes, 50.0, 12.0, c, h, loop, pinned, item)
        case.label = label
        return case

    def hidden_cases(self):
        def build(d, nbytes, bws, compute, host, loop):
            return _step_case(d, nbytes, bws[0], bws[1], compute, host, loop, d(st.sampled_from([True, False, None])),
                              d(st.sampled_from([True, False, None])))

        deliberate = [_step_case(None, 1_000_000, 50.0, 12.0, c, h, loop, pinned, item)
                      for loop in ref_overlap.LOOPS for pinned in (True, False) for item in (True, False)
                      for c, h in (("copy", "compute"), ("zero", "big"), (1e6, "small"))]
        deliberate += [_step_case(None, 0, 50.0, 12.0, 30.0, 5.0, "async", True, False),
                       _step_case(None, 1_000_000, 25.0, 25.0, 30.0, 5.0, "blocking", False, False),
                       _step_case(None, 1_000_000, 50.0, 12.0, 30.0, 5.0, "pipelined", None, None)]
        # unknown loops that sort just before or after a known one (a comparison mutated into <= or >=)
        deliberate += [_step_case(None, 1_000_000, 50.0, 12.0, 30.0, 5.0, loop, True, False)
                       for loop in ("Async", "sync", "", "blockinf", "prefetch ")]
        return deliberate + draw(cases_from(build, st.sampled_from([0, 1_000_000, 250_000, 3_000_000, 10**9]),
                               st.sampled_from([(50.0, 12.0), (25.0, 25.0), (12.0, 50.0), (50.0, 0.5)]),
                               st.sampled_from(["zero", "copy", "copy_pageable", "small", 30.0, 5.0, 1e6]),
                               st.sampled_from(["zero", "compute", "copy", "big", 5.0, 60.0]),
                               st.sampled_from(ref_overlap.LOOPS)), 150)

    def expected(self, case):
        xp, xg, c, h, loop = case.args
        if loop not in ref_overlap.LOOPS:
            return Raises(("ValueError",), "an unknown loop")
        t = case.truth
        dev = P.simulated_device({"launch_overhead_us": 0.0, "pinned_gb_per_s": t["pinned_bw"],
                                  "pageable_gb_per_s": t["pageable_bw"]})
        costs = ref_overlap.StepCosts(t["nbytes"], c, h)
        timeline = ref_overlap.simulate_training(costs, 7, loop, pinned=case.kwargs.get("pinned", True),
                                                 item=case.kwargs.get("item", False), device=dev)
        return timeline.steady_step_us

    def compare(self, case, got, expected):
        if not _dict(got):
            return f"expected a number of microseconds, got {describe(got)}"
        if got["simulated"]:
            return (f"your answer built {got['simulated']} simulated device(s): predict_step is a formula "
                    f"(draw the timeline on paper, not on the simulator)")
        v = got["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"expected a number of microseconds, got {describe(v)}"
        if math.isclose(v, expected, rel_tol=1e-9, abs_tol=1e-9):
            return None
        return f"expected {expected!r} us per step (the simulator's steady state)\n     got {v!r}"

    def diagnose(self, case, got, expected):
        if not _dict(got) or not isinstance(got.get("value"), (int, float)):
            return None
        xp, xg, c, h, loop = case.args
        pinned, item = case.kwargs.get("pinned", True), case.kwargs.get("item", False)
        host = h if pinned else h + xg
        wrong = []  # (formula, hint): plausible mistakes, named only when the value matches one of them
        if loop == "blocking":
            wrong.append((xp + (c + h if item else max(h, c)), "a blocking copy from pageable memory runs at the "
                                                               "pageable bandwidth: use X_pageable when pinned=False."))
            wrong.append((((xp if pinned else xg) + c + h) if not item else None,
                          "without .item() the host prepares the next batch while the device computes: the host's "
                          "work overlaps the compute."))
        if loop == "async" and not pinned and not item:
            wrong.append((max(h, xg + c), "from pageable memory the host stages the bytes itself (H + X_pageable "
                                          "on the host) and the device then copies at the pinned speed."))
        if loop == "prefetch":
            wrong.append((max(xp, c) if not item else None, "the host's own work per step bounds the loop too: it "
                                                             "cannot load batches faster than it prepares them."))
            wrong.append((host + max(xp, c) if item else None,
                          "with .item() the copy of batch i+1 already runs while step i computes: only the host "
                          "waits for the compute."))
        for value, hint in wrong:
            if value is not None and not math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-9) and \
                    math.isclose(got["value"], value, rel_tol=1e-9, abs_tol=1e-9):
                return hint
        return None


# ================================================================================================
# profiling.train_prefetch
# ================================================================================================
class TrainPrefetch(Exercise):
    """The student's loop runs on a recording proxy; its call log is replayed here on a simulator of the
    same configuration. Expected: every step reads its own batch after its copy, no race, no host wait,
    every block freed, and the timeline of the reference loop (``overlap.train_prefetch``)."""

    id, entry, points = "profiling.train_prefetch", "train_prefetch", 2
    title = "the prefetching loop: side stream, events, record_stream"
    probe = f"{PROBES}:loop_probe"
    boundary_classes = {
        "no batches": lambda c, e: c.args[1] == [],
        "one batch": lambda c, e: len(c.args[1]) == 1,
        "a batch of 0 bytes": lambda c, e: 0 in c.args[1],
        "equal sizes, compute outlasting the copy (the race without record_stream)": lambda c, e: len(set(c.args[1])) == 1
        and len(c.args[1]) > 2 and c.args[2] > c.args[1][0] / 50e3 > 0,
        "compute exactly as long as the copy": lambda c, e: len(c.args[1]) > 1 and c.args[2] == c.args[1][0] / 50e3 > 0,
        "host-bound": lambda c, e: len(c.args[1]) > 2 and c.args[3] > max(c.args[2], max(c.args[1]) / 50e3),
        "launches that cost time": lambda c, e: c.args[0]["launch_overhead_us"] > 0 and len(c.args[1]) > 1,
        "sizes that vary": lambda c, e: len(set(c.args[1])) > 1,
        "more than 256 batches (where `is` stops meaning `==` for ints)": lambda c, e: len(c.args[1]) > 256,
    }

    def visible_cases(self):
        return [
            Case(({"launch_overhead_us": 0.0}, [1_000_000] * 6, 30.0, 5.0),
                 label="compute (30 us) outlasts the copy (20 us): record_stream matters"),
            Case(({"launch_overhead_us": 0.0}, [1_000_000] * 5, 10.0, 40.0), label="host-bound: 40 us of host work"),
            Case(({"launch_overhead_us": 0.0}, [2_000_000] * 5, 10.0, 5.0), label="copy-bound: 40 us copies"),
            Case(({"launch_overhead_us": 0.0}, [], 10.0, 5.0), label="no batches"),
            Case(({"launch_overhead_us": 0.0}, [500_000], 10.0, 5.0), label="one batch"),
            Case(({"launch_overhead_us": 3.0}, [1_000_000, 250_000, 1_000_000, 0], 25.0, 2.0),
                 label="launches cost 3 us; sizes vary (one batch of 0 bytes)"),
        ]

    def hidden_cases(self):
        def build(d, overhead, n, compute, host):
            size = d(st.sampled_from([1_000_000, 500_000, 0]))
            sizes = [size] * n if d(st.booleans()) else [d(st.sampled_from([0, 250_000, 1_000_000, 2_000_000]))
                                                          for _ in range(n)]
            return Case(({"launch_overhead_us": overhead}, sizes, compute, host))

        zero = {"launch_overhead_us": 0.0}
        deliberate = [Case((zero, [], 10.0, 5.0)), Case((zero, [250_000], 10.0, 5.0)),
                      Case((zero, [1_000_000] * 5, 50.0, 5.0)), Case((zero, [1_000_000] * 5, 20.0, 5.0)),
                      Case((zero, [500_000] * 4, 5.0, 40.0)), Case(({"launch_overhead_us": 4.0}, [0, 1_000_000, 0], 8.0, 1.0)),
                      Case((zero, [1000] * 300, 1.0, 0.5))]  # counts past CPython's small-int cache (256)
        return deliberate + draw(cases_from(build, st.sampled_from([0.0, 0.0, 2.0, 10.0]), st.integers(0, 7),
                               st.sampled_from([0.0, 5.0, 20.0, 30.0, 100.0]), st.sampled_from([0.0, 5.0, 40.0])), 40)

    def expected(self, case):
        config, sizes, compute, host = case.args
        sim = P.simulated_device(config)
        ref_overlap.train_prefetch(sim, list(sizes), compute, host)
        return [r.end for r in sim.records if r.kind == "kernel"]

    @staticmethod
    def replay(case, log):
        """The call log run on a fresh simulator: (device, {buffer id: Buffer}, {launch name: record})."""
        config = case.args[0]
        sim = P.simulated_device(config)
        streams, events, buffers = {0: sim.current_stream}, {}, {}
        for e in log:
            kind = e[0]
            if kind == "stream":
                s = sim.Stream()
                streams[e[1]] = s
            elif kind == "event":
                events[e[1]] = sim.Event()
            elif kind == "record":
                events[e[1]].record(streams[e[2]])
            elif kind == "wait_event":
                streams[e[1]].wait_event(events[e[2]])
            elif kind == "wait_stream":
                streams[e[1]].wait_stream(streams[e[2]])
            elif kind in ("stream_sync",):
                streams[e[1]].synchronize()
            elif kind == "event_sync":
                events[e[1]].synchronize()
            elif kind == "synchronize":
                sim.synchronize()
            elif kind == "host_work":
                sim.host_work(e[1])
            elif kind == "alloc":
                buffers[e[1]] = sim.alloc(e[2], streams[e[3]])
            elif kind == "record_stream":
                buffers[e[1]].record_stream(streams[e[2]])
            elif kind == "free":
                sim.free(buffers[e[1]])
            elif kind == "copy":
                _, nbytes, direction, pinned, non_blocking, sid, bid, name = e
                sim.copy(nbytes, direction, pinned=pinned, non_blocking=non_blocking, stream=streams[sid],
                         buffer=buffers.get(bid), name=name)
            elif kind == "launch":
                _, name, us, sid, reads, writes = e
                sim.launch(name, us, streams[sid], reads=[buffers[b] for b in reads],
                           writes=[buffers[b] for b in writes])
        return sim, buffers

    def compare(self, case, got, expected):
        config, sizes, compute, host = case.args
        if not _dict(got):
            return f"the loop returned {describe(got)}"
        if got["result"] is not None:
            return f"train_prefetch returns None (it drives the device), got {describe(got['result'])}"
        log = [tuple(e) for e in got["log"]]
        waits = [e[0] for e in log if e[0] in ("synchronize", "stream_sync", "event_sync")]
        if waits:
            return f"the host waited ({waits[0]}(), {len(waits)} time(s)): a prefetching loop never makes the host wait"
        copies = [e for e in log if e[0] == "copy"]
        launches = [e for e in log if e[0] == "launch"]
        for i, nbytes in enumerate(sizes):
            mine = [c for c in copies if c[7] == f"batch{i}"]
            if len(mine) != 1:
                return f"expected one copy named 'batch{i}', found {len(mine)}"
            _, n, direction, pinned, non_blocking, sid, bid, _ = mine[0]
            if (n, direction, pinned, non_blocking) != (nbytes, "h2d", True, True):
                return (f"copy batch{i}: expected {nbytes} bytes h2d, pinned=True, non_blocking=True; got {n} bytes "
                        f"{direction}, pinned={pinned}, non_blocking={non_blocking}")
            if sid == 0:
                return f"copy batch{i} runs on the compute stream: copy on a side stream (device.Stream())"
            if bid is None:
                return f"copy batch{i} has no buffer: pass buffer=buf (the block it writes)"
            steps = [s for s in launches if s[1] == f"step{i}"]
            if len(steps) != 1:
                return f"expected one kernel named 'step{i}', found {len(steps)}"
            _, _, us, ssid, reads, _ = steps[0]
            if us != compute or ssid != 0:
                return f"step{i} must run {compute} us on the compute stream, got {us} us on stream {ssid}"
            if bid not in reads:
                return f"step{i} does not read the block batch{i} was copied into (reads=[buf])"
        extra = [e[1] for e in launches if e[1] not in {f"step{i}" for i in range(len(sizes))}] + \
                [e[7] for e in copies if e[7] not in {f"batch{i}" for i in range(len(sizes))}]
        if extra:
            return f"unexpected work on the device: {extra[:3]}"
        works = [e[1] for e in log if e[0] == "host_work"]
        if works != [host] * len(sizes):
            return f"expected device.host_work({host}) once per batch ({len(sizes)} calls), got {_fmt(works)}"
        allocated = {e[1] for e in log if e[0] == "alloc"}
        freed = {e[1] for e in log if e[0] == "free"}
        if allocated - freed:
            return f"{len(allocated - freed)} block(s) never freed: free each batch's block after its step"
        try:
            sim, buffers = self.replay(case, log)
        except Exception as e:  # the sandbox ran these calls; a replay error means a forged log
            return f"your calls could not be replayed: {type(e).__name__}: {e}"
        if sim.races:
            return f"a race on the device: {sim.races[0][0]}"
        recs = {r.name: r for r in sim.records if r.kind in ("kernel", "h2d")}
        for i in range(len(sizes)):
            if recs[f"step{i}"].start < recs[f"batch{i}"].end:
                return (f"step{i} starts at {recs[f'step{i}'].start:g} us, before its batch's copy ends "
                        f"({recs[f'batch{i}'].end:g} us): the compute stream must wait for the copy's event")
        ends = [r.end for r in sim.records if r.kind == "kernel"]
        if len(ends) == len(expected) and all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(ends, expected)):
            return None
        k = next((j for j, (a, b) in enumerate(zip(ends, expected)) if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)),
                 0)
        return (f"the steps end at {_fmt(ends)} us\n  a prefetching loop ends them at {_fmt(expected)} us "
                f"(first difference: step{k})")

    def diagnose(self, case, got, expected):
        if not _dict(got):
            return None
        log = [tuple(e) for e in got["log"]]
        if any(e[0] in ("synchronize", "stream_sync", "event_sync") for e in log):
            return "the compute stream waits for the copy with stream.wait_event(event); the host never waits."
        try:
            sim, _ = self.replay(case, log)
        except Exception:
            return None
        if sim.races and any("after it was freed" in r[0] for r in sim.races):
            return "free a batch's block after launching the step that reads it."
        if sim.races and not any(e[0] == "record_stream" for e in log):
            return ("the block was allocated on the side stream and freed while the compute stream still reads it: "
                    "buf.record_stream(device.current_stream) makes the allocator wait before reusing it.")
        order = [e for e in log if e[0] in ("copy", "launch", "record")]
        events_on_compute = {e[1] for e in log if e[0] == "record" and e[2] == 0}
        waited = {e[2] for e in log if e[0] == "wait_event" and e[1] == 0}
        if waited and waited <= events_on_compute:
            return "record the event on the side stream (event.record(side)): it must mark the end of the copy."
        for j, e in enumerate(order):
            if e[0] == "record" and j + 1 < len(order) and order[j + 1][0] == "copy" and order[j + 1][5] == e[2]:
                return "record the event after queueing the copy on the side stream, not before."
        names = [e[1] if e[0] == "launch" else e[7] for e in order if e[0] in ("launch", "copy")]
        for i in range(len(case.args[1]) - 1):
            if f"step{i}" in names and f"batch{i + 1}" in names and names.index(f"step{i}") < names.index(f"batch{i + 1}"):
                return "load and copy batch i+1 before launching step i, so the copy overlaps the compute."
        return None


# ================================================================================================
# profiling.op_times
# ================================================================================================
def torch_key_averages(trace: dict) -> dict[str, tuple[int, float, float]]:
    """``{key: (count, self_us, total_us)}`` by torch's own code: the trace's host events become
    ``FunctionEvent``s, then ``EventList._build_tree`` (``_populate_cpu_children``, ``_remove_dup_nodes``)
    and ``key_averages``. Times go in as integer nanoseconds, the profiler's own unit (the trace's
    microseconds have three decimals), so sums and comparisons are exact."""
    import re

    from torch.autograd.profiler_util import EventList, FunctionEvent

    cats = set(HOST_CATEGORIES)
    if any(e.get("cat") == "python_function" for e in trace["traceEvents"]):
        cats.add("python_function")
    host = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]
    threads: dict = {}
    events = []
    for i, e in enumerate(host):
        thread = threads.setdefault((e.get("pid"), e.get("tid")), len(threads))
        start = round(float(e["ts"]) * 1000)
        name = "ProfilerStep*" if re.match(r"^ProfilerStep#\d+$", e["name"]) else e["name"]
        events.append(FunctionEvent(i, name, thread, start, start + round(float(e.get("dur", 0.0)) * 1000), stack=[]))
    event_list = EventList(events)
    event_list._build_tree()
    return {avg.key: (avg.count, avg.self_cpu_time_total / 1000, avg.cpu_time_total / 1000)
            for avg in event_list.key_averages()}


BASE_NS = 5_285_481_573_471_000  # a Kineto-like timestamp: nanoseconds since the profiler's epoch


def _us(ns: int) -> float:
    """Microseconds as a trace file holds them: a decimal with three places, read as the nearest float."""
    return float(f"{ns // 1000}.{ns % 1000:03d}")


def _hand_trace(events, extra=()):
    """A trace from ``(name, cat, tid, ts, dur)`` rows (microseconds from the start, at most three decimals),
    placed at a large timestamp like Kineto's (large offsets next to nanosecond spans)."""
    out = [{"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": _us(BASE_NS + round(ts * 1000)),
            "dur": round(dur * 1000) / 1000, "args": {}} for name, cat, tid, ts, dur in events]
    return {"traceEvents": out + list(extra), "displayTimeUnit": "ms"}


_META = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
         {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 1, "pid": 1, "tid": 1, "ts": _us(BASE_NS)},
         {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": _us(BASE_NS + 1000), "s": "t"},
         {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": _us(BASE_NS), "dur": 50.0}]

HAND_TRACES = {
    "nested at the end": [("outer", "cpu_op", 1, 0, 10), ("inner", "cpu_op", 1, 4, 6)],
    "sibling at the end": [("outer", "cpu_op", 1, 0, 10), ("next", "cpu_op", 1, 10, 5)],
    "partial overlap": [("a", "cpu_op", 1, 0, 10), ("b", "cpu_op", 1, 5, 10)],
    "zero-length events": [("outer", "cpu_op", 1, 0, 10), ("blip", "cpu_op", 1, 0, 0), ("blip", "cpu_op", 1, 10, 0),
                           ("inner", "cpu_op", 1, 3, 0)],
    "equal starts, longest first": [("short", "cpu_op", 1, 0, 2), ("long", "cpu_op", 1, 0, 8), ("mid", "cpu_op", 1, 0, 5)],
    "an op calling itself": [("aten::mean", "cpu_op", 1, 0, 10), ("aten::mean", "cpu_op", 1, 1, 8),
                             ("aten::sum", "cpu_op", 1, 2, 3)],
    "three deep, folded twice": [("f", "cpu_op", 1, 0, 10), ("f", "cpu_op", 1, 1, 8), ("f", "cpu_op", 1, 2, 6),
                                 ("g", "cpu_op", 1, 3, 1)],
    "same name, two children: no folding": [("f", "cpu_op", 1, 0, 10), ("f", "cpu_op", 1, 1, 3), ("g", "cpu_op", 1, 5, 3)],
    "a range named like its only child": [("aten::mul", "user_annotation", 1, 0, 10), ("aten::mul", "cpu_op", 1, 2, 6)],
    "two threads": [("step", "user_annotation", 1, 0, 20), ("work", "cpu_op", 2, 2, 10), ("work", "cpu_op", 1, 3, 4)],
    "profiler steps": [("ProfilerStep#3", "user_annotation", 1, 0, 10), ("aten::add", "cpu_op", 1, 1, 2),
                       ("ProfilerStep#4", "user_annotation", 1, 10, 12), ("aten::add", "cpu_op", 1, 11, 3)],
    "python frames": [("train.py(10): step", "python_function", 1, 0, 10), ("aten::mm", "cpu_op", 1, 1, 5),
                      ("nn.Module: Linear", "python_function", 1, 0.5, 7)],
    "runtime calls": [("aten::mm", "cpu_op", 1, 0, 10), ("cudaLaunchKernel", "cuda_runtime", 1, 2, 3),
                      ("cuLaunchKernel", "cuda_driver", 1, 2.5, 1)],
    "out of order": [("inner", "cpu_op", 1, 3, 2), ("outer", "cpu_op", 1, 0, 10), ("other", "cpu_op", 1, 12, 1)],
    "fractional microseconds": [("outer", "cpu_op", 1, 0.125, 10.375), ("inner", "cpu_op", 1, 0.125, 0.001),
                                ("inner", "cpu_op", 1, 10.499, 0.001)],
    # ts + dur in floating point puts the inner end 1 ulp after the outer end; in nanoseconds they are equal
    "an exact end at a large timestamp": [("outer", "cpu_op", 1, 3.545, 5.976), ("inner", "cpu_op", 1, 3.563, 5.958)],
    "a partial overlap by 100 ns": [("a", "cpu_op", 1, 0, 1000), ("b", "cpu_op", 1, 500, 500.1)],
    # a zero-length event at the end of an inner event belongs to the outer one (had it been inner's only
    # child, the same name would fold it)
    "a zero-length event at the end of its sibling": [("outer", "cpu_op", 1, 0, 10), ("f", "cpu_op", 1, 2, 4),
                                                      ("f", "cpu_op", 1, 6, 0)],
    "markers on the host rows (not complete events)": [("outer", "cpu_op", 1, 0, 10), ("inner", "cpu_op", 1, 2, 3)],
}


# Events on the host rows that are not complete events: an instant marker inside "inner" (it would split
# nothing but would be counted) and a begin/end pair around both.
HOST_MARKERS = [{"ph": "i", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": _us(BASE_NS + 3000), "s": "t"},
                {"ph": "B", "cat": "user_annotation", "name": "range", "pid": 1, "tid": 1, "ts": _us(BASE_NS)},
                {"ph": "E", "cat": "user_annotation", "name": "range", "pid": 1, "tid": 1, "ts": _us(BASE_NS + 10_000)}]


def _profile_trace(layers: str, loss: str, optim: str, with_stack: bool, ranges: bool, active: int, seed: int) -> dict:
    """A real CPU profile of a small training step (the trusted side makes it; the sandbox sees only JSON)."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.manual_seed(seed)
    act = {"relu": torch.nn.ReLU(), "gelu": torch.nn.GELU(), "ln": torch.nn.LayerNorm(16)}[layers]
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), act, torch.nn.Linear(16, 4))
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optim](model.parameters(), lr=0.01)
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))

    def step():
        out = model(x)
        value = F.cross_entropy(out, y) if loss == "xent" else (out.square().mean() + out.mean())  # mean in mean
        if ranges:
            with record_function("aten::mul"):  # a range named like its only child: folded
                value = value * 1.0
        value.backward()
        opt.step()
        opt.zero_grad()

    path = os.path.join(tempfile.mkdtemp(prefix="ptprof-"), "trace.json")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=active),
                     on_trace_ready=lambda p: p.export_chrome_trace(path), with_stack=with_stack) as prof:
            for _ in range(2 + active):
                step()
                prof.step()
    finally:
        torch.set_num_threads(threads)
    with open(path) as f:
        data = json.load(f)
    keep = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "s")
    return {"traceEvents": [{k: e[k] for k in keep if k in e} for e in data["traceEvents"]],
            "displayTimeUnit": data.get("displayTimeUnit", "ms")}


class OpTimes(Exercise):
    """Expected: torch's tree code on the trace's host events (:func:`torch_key_averages`); on real
    profiles that equals ``prof.key_averages()`` within the trace's rounding. Python frames
    (``python_function``) are host events on every torch, as torch 2.13's ``key_averages()`` counts them;
    torch 2.11's leaves them out of its table, but the expected answer depends on the trace alone."""

    id, entry, points = "profiling.op_times", "op_times", 3
    withheld_from_students = ("diagnose",)  # its wrong variants (_variant_times) share the right algorithm's code
    title = "self and total time per op, from an exported trace"
    probe = f"{PROBES}:trace_probe"
    timeout_s = 60.0
    policy = Policy(banned=("profiler_util", "EventList", "FunctionEvent", "key_averages", "_build_tree",
                            "_populate_cpu_children", "_remove_dup_nodes", "profiler"),
                    why="this exercise is to write what torch's profiler tree code does")
    boundary_classes = {
        **{name: (lambda c, e, n=name: c.label == n) for name in HAND_TRACES},
        "a trace without host events": lambda c, e: e == {},
        "metadata, flow, instant and device events mixed in": lambda c, e: any(
            ev.get("ph") in ("M", "s", "i") for ev in c.args[0]["traceEvents"]) and c.label in HAND_TRACES,
        "a real profile with Python frames (with_stack=True)": lambda c, e: c.label.startswith("a real profile")
        and any(ev.get("cat") == "python_function" for ev in c.args[0]["traceEvents"]),
        "a real profile of several active steps": lambda c, e: e.get("ProfilerStep*", (0,))[0] >= 2,
        "the trace checked after the call": lambda c, e: True,
    }

    def visible_cases(self):
        out = [Case((_profile_trace("relu", "xent", "sgd", False, False, 1, 0),),
                    label="a real CPU profile: one step of a small MLP with SGD")]
        for name in ("nested at the end", "sibling at the end", "an op calling itself", "profiler steps"):
            out.append(Case((_hand_trace(HAND_TRACES[name], _META),), label=name))
        out.append(Case(({"traceEvents": []},), label="an empty trace"))
        return out

    def hidden_cases(self):
        deliberate = [("gelu", "mse", "adam", True, True, 2, 1)]  # Python frames, a folded range, two steps
        real = [Case((_profile_trace(*spec),), label=f"a real profile {spec}") for spec in deliberate + draw(st.tuples(
            st.sampled_from(["relu", "gelu", "ln"]), st.sampled_from(["xent", "mse"]),
            st.sampled_from(["sgd", "adam", "adamw"]), st.booleans(), st.booleans(), st.integers(1, 2),
            st.integers(0, 100)), 4)]
        hand = [Case((_hand_trace(events, HOST_MARKERS if name.startswith("markers") else _META if i % 2 else ()),),
                      label=name) for i, (name, events) in enumerate(HAND_TRACES.items())]
        return real + hand + [Case(({"traceEvents": list(_META)},), label="an empty trace (no host events)")]

    def expected(self, case):
        return torch_key_averages(case.args[0])

    def compare(self, case, got, expected):
        if not _dict(got):
            return f"expected a dict, got {describe(got)}"
        if got["modified"]:
            return "your code modified the trace it was given"
        value = got["value"]
        if not isinstance(value, dict):
            return f"expected a dict {{name: (count, self_us, total_us)}}, got {describe(value)}"
        missing, extra = sorted(set(expected) - set(value)), sorted(set(value) - set(expected))
        if missing or extra:
            return (f"names differ from key_averages(): missing {describe(missing, 120)}, "
                    f"unexpected {describe(extra, 120)}")
        for name in sorted(expected, key=lambda n: -expected[n][1]):
            row = value[name]
            if not (isinstance(row, (tuple, list)) and len(row) == 3):
                return f"{name!r}: expected (count, self_us, total_us), got {describe(row)}"
            n, s, t = expected[name]
            if row[0] != n:
                return f"{name!r}: count {row[0]}, key_averages() says {n}"
            for what, mine, theirs in (("self", row[1], s), ("total", row[2], t)):
                if not isinstance(mine, (int, float)) or abs(mine - theirs) > 1e-3 * n + 1e-6 * abs(theirs):
                    return f"{name!r}: {what} time {describe(mine)} us, key_averages() says {theirs:.3f} us"
        return None

    def diagnose(self, case, got, expected):
        if not _dict(got) or not isinstance(got.get("value"), dict):
            return None
        value = got["value"]
        for flag, hint in OP_TIMES_MISTAKES:
            variant = _variant_times(case.args[0], **{flag: True})
            if _same_times(variant, expected) is None:
                continue  # this mistake changes nothing on this trace
            if _same_times(value, variant) is None:
                return hint
        return None


OP_TIMES_MISTAKES = (  # (flag of _variant_times, what it means): named only when the answer equals that variant
    ("float_ends", "compare times as integer nanoseconds (start = round(ts * 1000), end = start + round(dur * 1000)): "
                   "at these timestamps ts + dur in floating point misses an exact end by a nanosecond."),
    ("close_ge", "a child that ends exactly when its parent ends is inside it: an event closes the candidate parent "
                 "only if it starts at or after its end, or ends after it."),
    ("sort_start_only", "sort each thread's events by start and, on equal starts, the longest first (key (start, -end))."),
    ("descendants", "subtract only the direct children's durations from an event's duration, not every descendant."),
    ("no_fold", "an op whose only child has its own name is folded into it (EventList._remove_dup_nodes): "
                "key_averages() counts one call, not two."),
    ("no_python", "with Python frames in the trace (with_stack=True), python_function events are host events too."),
    ("no_step_key", "key_averages() groups ProfilerStep#N under one key, 'ProfilerStep*'."),
)


def _same_times(got, expected) -> str | None:
    """None when two ``{name: (count, self, total)}`` tables agree (1 ns per call), else the first difference."""
    if set(got) != set(expected):
        return "names"
    for name, (n, s, t) in expected.items():
        row = got[name]
        if not (isinstance(row, (tuple, list)) and len(row) == 3) or row[0] != n or \
                any(not isinstance(a, (int, float)) or abs(a - b) > 1e-3 * n + 1e-6 * abs(b)
                    for a, b in ((row[1], s), (row[2], t))):
            return name
    return None


def _variant_times(trace, *, float_ends=False, close_ge=False, sort_start_only=False, descendants=False,
                   no_fold=False, no_python=False, no_step_key=False) -> dict:
    """The op table computed with one known mistake (diagnosis only: the expected answer is torch's)."""
    cats = set(HOST_CATEGORIES)
    if not no_python and any(e.get("cat") == "python_function" for e in trace["traceEvents"]):
        cats.add("python_function")
    events = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in cats:
            dur = float(e.get("dur", 0.0))
            start = float(e["ts"]) if float_ends else round(float(e["ts"]) * 1000)
            end = start + (dur if float_ends else round(dur * 1000))
            events.append({"name": e["name"], "thread": (e.get("pid"), e.get("tid")), "start": start, "end": end,
                           "dur": dur, "parent": None, "children": []})
    order = (lambda ev: ev["start"]) if sort_start_only else (lambda ev: (ev["start"], -ev["end"]))
    threads: dict = {}
    for e in events:
        threads.setdefault(e["thread"], []).append(e)
    for evs in threads.values():
        stack = []
        for e in sorted(evs, key=order):
            while stack and (e["start"] >= stack[-1]["end"] or
                             (e["end"] >= stack[-1]["end"] if close_ge else e["end"] > stack[-1]["end"])):
                stack.pop()
            if stack:
                stack[-1]["children"].append(e)
                e["parent"] = stack[-1]
            stack.append(e)
    events.sort(key=lambda ev: (ev["start"], -ev["end"]))
    while not no_fold:
        doomed = set()
        for e in events:
            parent = e["parent"]
            if parent is not None and parent["name"] == e["name"] and len(parent["children"]) == 1:
                parent["children"] = e["children"]
                for c in e["children"]:
                    c["parent"] = parent
                doomed.add(id(e))
        if not doomed:
            break
        events = [e for e in events if id(e) not in doomed]

    def below(e):
        return sum(c["dur"] + (below(c) if descendants else 0.0) for c in e["children"])

    out: dict = {}
    for e in events:
        name = e["name"] if no_step_key or not e["name"].startswith("ProfilerStep#") else "ProfilerStep*"
        n, s_, t = out.get(name, (0, 0.0, 0.0))
        out[name] = (n + 1, s_ + e["dur"] - below(e), t + e["dur"])
    return out


# ================================================================================================
# profiling.gpu_activity
# ================================================================================================
def sweep_activity(trace: dict, k: int, min_gap_us: float) -> dict:
    """The expected answer by brute force: every instant between two consecutive boundaries of the device
    rows is busy or idle (no interval merging); top kernels by counting."""
    spans, totals = [], {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES:
            s, dur = float(e["ts"]), float(e.get("dur", 0.0))
            spans.append((s, s + dur))
            n, t = totals.get(e["name"], (0, 0.0))
            totals[e["name"]] = (n + 1, t + dur)
    top = [(name, n, t) for name, (n, t) in sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:k]]
    if not spans:
        return {"gaps": [], "top_kernels": top, "utilization": None}
    points = sorted({p for s in spans for p in s})
    gaps, busy = [], 0.0
    for a, b in zip(points, points[1:]):  # every boundary is an instant of activity; between two, all or nothing
        if any(s <= a and b <= e and s < e for s, e in spans):
            busy += b - a
        elif b - a > min_gap_us:
            gaps.append((a, b))
    span = points[-1] - points[0]
    return {"gaps": gaps, "top_kernels": top, "utilization": 1.0 if span == 0 else busy / span}


def _device_trace(d, n_ops, seed):
    """A simulated GPU run as a Chrome trace: copies, kernels on one or two streams, host stalls, graph replays."""
    sim = P.simulated_device({"launch_overhead_us": d(st.sampled_from([0.0, 2.0, 5.0])), "seed": seed})
    side = sim.Stream()
    for _ in range(n_ops):
        op = d(st.sampled_from(["kernel", "kernel", "side", "copy", "host", "graph", "sync"]))
        if op in ("kernel", "side"):
            sim.launch(d(st.sampled_from(["gemm", "gelu", "softmax", "add"])), d(st.sampled_from([0.0, 1.0, 3.0, 40.0])),
                       side if op == "side" else None)
        elif op == "copy":
            sim.copy(d(st.sampled_from([0, 100_000, 1_000_000])), d(st.sampled_from(["h2d", "d2h"])), pinned=True,
                     non_blocking=True, stream=d(st.sampled_from([side, sim.current_stream])))
        elif op == "host":
            sim.host_work(d(st.sampled_from([1.0, 50.0, 300.0])))
        elif op == "graph":
            sim.launch_graph([("graph_kernel", 2.0)] * d(st.integers(1, 4)))
        else:
            sim.synchronize()
    trace = sim.chrome_trace()
    trace["traceEvents"].append({"ph": "X", "cat": "gpu_user_annotation", "name": "forward", "pid": 1, "tid": 7,
                                 "ts": 0.0, "dur": 1e4})  # Kineto's range of a record_function on the device rows
    return trace


GPU_HAND = {
    "touching kernels: no gap": [("a", "kernel", 7, 0, 10), ("b", "kernel", 7, 10, 5)],
    "a gap exactly min_gap_us long": [("a", "kernel", 7, 0, 10), ("b", "kernel", 7, 14, 5)],
    "another stream is busy in the gap": [("a", "kernel", 7, 0, 10), ("b", "kernel", 7, 20, 5),
                                          ("c", "gpu_memcpy", 8, 8, 14)],
    "overlapping streams": [("a", "kernel", 7, 0, 10), ("b", "kernel", 8, 5, 10), ("a", "kernel", 7, 30, 10)],
    "zero-length activities": [("a", "kernel", 7, 0, 10), ("z", "gpu_memset", 7, 20, 0), ("b", "kernel", 7, 25, 5)],
    "one activity": [("a", "kernel", 7, 0, 10)],
    "one zero-length activity": [("z", "kernel", 7, 5, 0)],
    "no device activity": [("aten::mm", "cpu_op", 1, 0, 10)],
    "ties in total time": [("b", "kernel", 7, 0, 10), ("a", "kernel", 7, 20, 4), ("a", "kernel", 7, 30, 6),
                           ("c", "kernel", 7, 40, 10)],
    "annotations and host rows": [("a", "kernel", 7, 0, 10), ("forward", "gpu_user_annotation", 7, 0, 100),
                                  ("b", "kernel", 7, 50, 10), ("aten::mm", "cpu_op", 1, 0, 100)],
    "copies and memsets": [("Memcpy HtoD", "gpu_memcpy", 9, 0, 30), ("Memset", "gpu_memset", 7, 40, 2),
                           ("gemm", "kernel", 7, 45, 20)],
    "out of order": [("b", "kernel", 7, 50, 10), ("a", "kernel", 7, 0, 10), ("c", "kernel", 8, 20, 5)],
    "markers on the device rows (not complete events)": [("a", "kernel", 7, 0, 10), ("b", "kernel", 7, 40, 10)],
}

# Events on the device rows that are not complete ("ph": "X") events: an instant marker and a begin/end pair.
GPU_MARKERS = [{"ph": "i", "cat": "kernel", "name": "marker", "pid": 1, "tid": 7, "ts": _us(BASE_NS + 20_000), "s": "t"},
               {"ph": "B", "cat": "kernel", "name": "range", "pid": 1, "tid": 7, "ts": _us(BASE_NS + 25_000)},
               {"ph": "E", "cat": "kernel", "name": "range", "pid": 1, "tid": 7, "ts": _us(BASE_NS + 30_000)}]


class GpuActivity(Exercise):
    """Expected: :func:`sweep_activity` (a brute-force sweep, independent of interval merging); on a GPU the
    GPU check compares the top kernels with the CUDA rows of ``key_averages()``."""

    id, entry, points = "profiling.gpu_activity", "gpu_activity", 2
    title = "the device rows: idle gaps, top kernels, utilisation"
    probe = f"{PROBES}:trace_probe"
    boundary_classes = {
        **{name: (lambda c, e, n=name: c.label == n) for name in GPU_HAND},
        "k=0": lambda c, e: c.kwargs.get("k", 3) == 0,
        "k above the number of names": lambda c, e: not isinstance(e, Raises) and
        c.kwargs.get("k", 3) > len(e["top_kernels"]) > 0,
        "a gap exactly min_gap_us long (excluded)": lambda c, e: c.label == "a gap exactly min_gap_us long" and
        c.kwargs.get("min_gap_us") == 4.0,
        "a gap one step longer than min_gap_us": lambda c, e: not isinstance(e, Raises) and any(
            math.isclose(b - a, c.kwargs.get("min_gap_us", 0.0) + 1.0) for a, b in e["gaps"]),
        "a simulated GPU run (graph replays, copies, two streams)": lambda c, e: c.label == "" and not isinstance(e, Raises),
        "k < 0 must raise": lambda c, e: c.kwargs.get("k", 3) < 0,
        "min_gap_us < 0 must raise": lambda c, e: c.kwargs.get("min_gap_us", 0.0) < 0,
        "the trace checked after the call": lambda c, e: True,
    }

    def visible_cases(self):
        out = []
        for name, k, gap in (("touching kernels: no gap", 3, 0.0), ("a gap exactly min_gap_us long", 3, 4.0),
                             ("another stream is busy in the gap", 2, 0.0), ("no device activity", 3, 0.0),
                             ("ties in total time", 2, 0.0), ("annotations and host rows", 3, 0.0)):
            out.append(Case((_hand_trace(GPU_HAND[name]),), {"k": k, "min_gap_us": gap}, label=name))
        out.append(Case((_hand_trace(GPU_HAND["overlapping streams"]),), label="the defaults: k=3, min_gap_us=0"))
        out.append(Case((_hand_trace(GPU_HAND["one activity"]),), {"k": -1}, label="k < 0: raise ValueError"))
        return out

    def hidden_cases(self):
        sims = draw(cases_from(lambda d, n, seed, k, gap: Case((_device_trace(d, n, seed),), {"k": k, "min_gap_us": gap}),
                               st.integers(1, 25), st.integers(0, 1000), st.integers(0, 6),
                               st.sampled_from([0.0, 1.0, 3.0, 10.0])), 30)
        hand = [Case((_hand_trace(events, GPU_MARKERS if name.startswith("markers") else ()),),
                     {"k": k, "min_gap_us": gap}, label=name)
                for name, events in GPU_HAND.items() for k, gap in ((0, 0.0), (10, 4.0), (1, 5.0), (3, 0.0))]
        deliberate = [Case((_hand_trace(GPU_HAND["a gap exactly min_gap_us long"]),), {"k": 3, "min_gap_us": 3.0},
                           label="a gap one step longer than min_gap_us")]
        bad = [Case((_hand_trace(GPU_HAND["one activity"]),), {"min_gap_us": -1.0}, label="min_gap_us < 0"),
               Case((_hand_trace(GPU_HAND["one activity"]),), {"k": -2}, label="k < 0")]
        return sims + hand + deliberate + bad

    def expected(self, case):
        k, gap = case.kwargs.get("k", 3), case.kwargs.get("min_gap_us", 0.0)
        if k < 0 or gap < 0:
            return Raises(("ValueError",), "k and min_gap_us must be >= 0")
        return sweep_activity(case.args[0], k, gap)

    def compare(self, case, got, expected):
        if not _dict(got):
            return f"expected a dict, got {describe(got)}"
        if got["modified"]:
            return "your code modified the trace it was given"
        value = got["value"]
        if not isinstance(value, dict) or set(value) != {"gaps", "top_kernels", "utilization"}:
            return f"expected a dict with keys 'gaps', 'top_kernels', 'utilization', got {describe(value)}"
        gaps = value["gaps"]
        if not isinstance(gaps, (list, tuple)) or not all(isinstance(g, (list, tuple)) and len(g) == 2 for g in gaps):
            return f"gaps: expected a list of (start, end) pairs, got {describe(gaps)}"
        if len(gaps) != len(expected["gaps"]) or not all(
                math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-6) for g, e in zip(gaps, expected["gaps"]) for a, b in zip(g, e)):
            return f"gaps: expected {describe(expected['gaps'])}\n     got {describe(gaps)}"
        top = [tuple(t) if isinstance(t, (list, tuple)) else t for t in value["top_kernels"]] \
            if isinstance(value["top_kernels"], (list, tuple)) else value["top_kernels"]
        want = expected["top_kernels"]
        if not isinstance(top, list) or len(top) != len(want) or any(
                not isinstance(t, tuple) or len(t) != 3 or t[0] != w[0] or t[1] != w[1]
                or not math.isclose(t[2], w[2], rel_tol=1e-9, abs_tol=1e-9) for t, w in zip(top, want)):
            return f"top_kernels: expected {describe(want)}\n     got {describe(value['top_kernels'])}"
        u, w = value["utilization"], expected["utilization"]
        if w is None:
            return None if u is None else f"utilization: expected None (no device activity), got {describe(u)}"
        if not isinstance(u, (int, float)) or isinstance(u, bool) or not math.isclose(u, w, rel_tol=1e-9, abs_tol=1e-12):
            return f"utilization: expected {w!r}\n     got {describe(u)}"
        return None

    def diagnose(self, case, got, expected):
        if isinstance(expected, Raises) or not _dict(got) or not isinstance(got.get("value"), dict):
            return None
        value = got["value"]
        gap = case.kwargs.get("min_gap_us", 0.0)
        gaps = value.get("gaps")
        if isinstance(gaps, (list, tuple)):
            if any(isinstance(g, (list, tuple)) and len(g) == 2 and math.isclose(g[1] - g[0], gap, abs_tol=1e-9)
                   for g in gaps) and len(gaps) > len(expected["gaps"]):
                return "keep only gaps longer than min_gap_us (>, not >=); touching activities leave no gap."
            if len(gaps) > len(expected["gaps"]) and "stream" in case.label:
                return "merge the activities of every stream first: the GPU is idle only when no stream runs anything."
        u, w = value.get("utilization"), expected["utilization"]
        spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in case.args[0]["traceEvents"]
                 if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
        if isinstance(u, (int, float)) and w is not None and spans and not math.isclose(u, w, rel_tol=1e-9):
            span = max(e for _, e in spans) - min(s for s, _ in spans)
            if span and math.isclose(u, sum(e - s for s, e in spans) / span, rel_tol=1e-9):
                return "utilisation is the busy time (the union of the activities) over the span, not the sum of durations."
        top = value.get("top_kernels")
        if isinstance(top, (list, tuple)) and any(isinstance(t, (list, tuple)) and t and t[0] == "forward" for t in top):
            return "only events of a category in DEVICE_CATEGORIES are device activity (gpu_user_annotation is not)."
        if isinstance(top, (list, tuple)) and all(isinstance(t, (list, tuple)) and len(t) == 3 for t in top) and \
                len(top) == len(expected["top_kernels"]) and [t[0] for t in top] != [t[0] for t in expected["top_kernels"]] \
                and all(math.isclose(t[2], e[2], rel_tol=1e-9) for t, e in zip(top, expected["top_kernels"])):
            return "rank by total time, and break ties by name."
        return None


# ================================================================================================
# profiling.train_fast
# ================================================================================================
def _rebuild(x, device: set):
    """An argument from its description (``probes.profiling.describe_value``): tensors become meta tensors,
    the ids of those on the device go into ``device``."""
    if isinstance(x, dict) and "tensor" in x:
        dtype, shape, on_device = x["tensor"]
        t = torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
        if on_device:
            device.add(id(t))
        return t
    if isinstance(x, list):
        return [_rebuild(v, device) for v in x]
    return x


def judge_aten_calls(calls: list) -> list[tuple[str, str, str]]:
    """``(where, op, reason)`` of every described ATen call that makes the host wait, by the chapter's
    rule table (``sync_rules.sync_reason``) applied to meta tensors rebuilt from the descriptions."""
    from ..profiling.sync_rules import sync_reason

    out = []
    for op, args, kwargs, where in calls:
        namespace, packet, overload = op.split(".")
        func = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
        device: set[int] = set()
        real_args = tuple(_rebuild(a, device) for a in args)
        real_kwargs = {k: _rebuild(v, device) for k, v in kwargs.items()}
        reason = sync_reason(func, real_args, real_kwargs, lambda t, d=device: id(t) in d)
        if reason is not None:
            out.append((where, op, reason))
    return out


FAST_HINTS = {
    "scalar_read": "keep each loss on the device (loss.detach()) and read them all once, after the loop; a NaN "
                   "check can use those host values.",
    "bool_mask_index": "leave the unlabelled rows to cross_entropy: ignore_index=-1 skips them without a mask.",
    "host_to_device": "copy the batches with non_blocking=True from pinned memory (x.pin_memory()).",
    "pageable_async": "non_blocking=True from pageable memory still makes the host stage the bytes: pin first "
                      "(x.pin_memory().to(device, non_blocking=True)).",
    "device_to_host": "read the device once, after the loop.",
}


class TrainFast(Exercise):
    """Expected: the losses and final parameters of ``training_loops.train_with_hidden_syncs`` (torch on the
    CPU); one implicit sync (none without batches), no explicit sync and no stall, judged here from the
    sandbox's description of the run; no device read inside the loop (``policy``, checked on the source)."""

    id, entry, points = "profiling.train_fast", "train_fast", 2
    title = "a training loop without hidden syncs"
    probe = f"{PROBES}:train_probe"
    timeout_s = 90.0
    boundary_classes = {
        "no batches": lambda c, e: c.args[1] == 0,
        "one step of one row": lambda c, e: c.args[1] == 1 and c.args[2] == 1,
        "every row labelled": lambda c, e: c.args[3] == 0.0 and not isinstance(e, Raises),
        "one labelled row per batch (unlabelled fraction 1)": lambda c, e: c.args[3] == 1.0 and not isinstance(e, Raises),
        "a batch with no labelled row must raise (the first)": lambda c, e: isinstance(e, Raises) and c.args[4] == 0,
        "a batch with no labelled row must raise (the last)": lambda c, e: isinstance(e, Raises) and
        c.args[4] == c.args[1] - 1 > 0,
        "pinned batches": lambda c, e: c.args[5] and c.args[1] > 0,
        "pageable batches": lambda c, e: not c.args[5] and c.args[1] > 0,
        "a learning rate other than the default": lambda c, e: len(c.args) > 6,
        "the batches checked after the call": lambda c, e: c.args[1] > 0 and not isinstance(e, Raises),
    }
    # The check counts host syncs with the chapter's rule table (sync_rules.sync_reason), the answer to
    # profiling.sync_reason: the student edition cannot ship it, so its check says so and the grader judges.
    withheld_from_students = ("compare", "diagnose")
    policy = Policy(in_loops=("item", "cpu", "tolist", "numpy", "nonzero", "masked_select", "unique", "synchronize",
                              "print"),
                    mask_index_in_loops=True, tensor_tests_in_loops=True,
                    why="each of these makes the host wait for the device every step: keep each loss on the device "
                        "(loss.detach()) and read them all once, after the loop; leave unlabelled rows to "
                        "cross_entropy (ignore_index=-1 skips them without a mask)")

    def visible_cases(self):
        return [
            Case((0, 3, 8, 0.25, None, False), label="3 steps, pageable batches, some rows unlabelled"),
            Case((1, 2, 4, 0.25, None, True), label="pinned batches"),
            Case((2, 0, 4, 0.25, None, False), label="no batches: no losses, no sync"),
            Case((3, 1, 1, 0.0, None, False), label="one step of one row"),
            Case((4, 3, 4, 0.25, 1, False), label="batch 1 has no labelled row: raise ValueError"),
        ]

    def hidden_cases(self):
        def build(d, seed, steps, batch):
            unlabelled = d(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
            bad = d(st.sampled_from([None, None, None, 0, steps - 1])) if steps else None
            lr = d(st.sampled_from([None, 0.05, 0.5]))
            return Case((seed, steps, batch, unlabelled, bad, d(st.booleans())) + ((lr,) if lr is not None else ()))

        deliberate = [Case((10, 0, 4, 0.25, None, True)), Case((11, 1, 1, 0.0, None, False)),
                      Case((12, 3, 6, 1.0, None, True, 0.5)), Case((13, 3, 4, 0.25, 0, False)),
                      Case((14, 4, 4, 0.25, 3, True))]
        return deliberate + draw(cases_from(build, st.integers(0, 1000), st.integers(0, 6), st.integers(1, 16)), 10)

    def expected(self, case):
        seed, steps, batch, unlabelled, bad, pin = case.args[:6]
        lr = case.args[6] if len(case.args) > 6 else 0.1
        if bad is not None and steps:
            return Raises(("ValueError",), "a batch without labelled rows")
        model = make_model(seed, "cpu")
        losses = train_with_hidden_syncs(model, make_batches(seed, steps, batch, unlabelled, bad), lr, "cpu")
        return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "syncs": 1 if steps else 0}

    def compare(self, case, got, expected):
        if not _dict(got):
            return f"expected the list of losses, got {describe(got)}"
        losses = got["losses"]
        want = expected["losses"]
        if not isinstance(losses, list) or len(losses) != len(want) or \
                not all(isinstance(v, float) for v in losses):
            return f"expected a list of {len(want)} Python floats (one loss per step), got {describe(losses)}"
        for i, (a, b) in enumerate(zip(losses, want)):
            if not math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6):
                return f"loss of step {i}: expected {b!r}, got {a!r}\n  expected {_fmt(want)}\n       got {_fmt(losses)}"
        for name, t in expected["params"].items():
            problem = close_tensors(got["params"].get(name), t, rtol=1e-5, atol=1e-6)
            if problem:
                return f"the model's {name} after training differs from the original loop's: {problem}"
        if not got["params_on_device"]:
            return "the model's parameters are no longer on the device: train on the device, do not move the model"
        if not got["batches_unchanged"]:
            return "your loop modified the batches it was given"
        syncs = [(w, op, r) for w, op, r in judge_aten_calls(got["aten"])]
        syncs += [(w, op, r) for op, r, kind, w in got["events"] if kind == "implicit"]
        explicit = [(w, op) for op, r, kind, w in got["events"] if kind == "explicit"]
        stalls = [(w, op) for op, r, kind, w in got["events"] if kind == "stall"]
        if explicit:
            return f"{len(explicit)} explicit torch.cuda.synchronize() call(s) (at {explicit[0][0]}): the host must not wait"
        if stalls:
            return (f"{len(stalls)} stall(s): non_blocking copies from pageable memory make the host stage the bytes "
                    f"(first at {stalls[0][0]})")
        if len(syncs) != expected["syncs"]:
            shown = "\n  ".join(f"{w}: {op} ({r})" for w, op, r in syncs[:6])
            return (f"{len(syncs)} host sync(s); expected {expected['syncs']} "
                    f"({'one read of all the losses, after the loop' if expected['syncs'] else 'no batches, no read'})"
                    + (f":\n  {shown}" if syncs else ""))
        return None

    def diagnose(self, case, got, expected):
        if isinstance(expected, Raises):
            if _dict(got) and isinstance(got.get("losses"), list) and all(v == v for v in got["losses"]):
                return ("a batch without labelled rows must give a NaN loss (and then ValueError): leave the unlabelled "
                        "rows out with cross_entropy(..., ignore_index=-1), do not relabel them.")
            return None
        if not _dict(got):
            return None
        reasons = [r for _, _, r in judge_aten_calls(got.get("aten", []))] + \
                  [r for _, r, kind, _ in got.get("events", []) if kind in ("implicit", "stall")]
        for reason in ("bool_mask_index", "pageable_async", "host_to_device", "scalar_read"):
            if reason in reasons:
                return FAST_HINTS[reason]
        losses = got.get("losses")
        if isinstance(losses, list) and losses and case.args[3] > 0 and len(losses) == len(expected["losses"]):
            return "unlabelled rows (label -1) must not count: cross_entropy(..., ignore_index=-1)."
        return None


# ================================================================================================
# profiling.capstone_costs
# ================================================================================================
def step_ranges(events) -> list[dict]:
    """The ``ProfilerStep#N`` ranges of a trace's complete events, in time order."""
    return sorted((e for e in events if isinstance(e.get("name"), str) and e["name"].startswith("ProfilerStep#")),
                  key=lambda e: e["ts"])


def _inside(e, r) -> bool:
    return e["tid"] == r["tid"] and r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"]


def step_ops(events) -> list[Counter]:
    """Per profiled step: the multiset of ``aten::`` op names inside its range."""
    return [Counter(e["name"] for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")
                    and _inside(e, r)) for r in step_ranges(events)]


class CapstoneCosts(Exercise):
    """The student's profile of the capstone's step (a stand-in built from torch's own layers in the
    sandbox). Expected: a trace with two profiled steps, each holding the three phases once and exactly
    the ATen ops a profile of the same step made here holds; names: the top three by self time in that
    trace, read with torch's tree code (:func:`torch_key_averages`)."""

    id, entry, points = "profiling.capstone_costs", "capstone_costs", 2
    title = "profile the capstone's step and name its top costs"
    probe = f"{PROBES}:capstone_probe"
    timeout_s = 120.0
    boundary_classes = {
        "one block": lambda c, e: c.args[0] == 1,
        "two blocks": lambda c, e: c.args[0] == 2,
        "the smallest batch (2)": lambda c, e: c.args[1] == 2,
    }

    def visible_cases(self):
        return [Case((1, 4, 0), label="one block, batch 4")]

    def hidden_cases(self):
        deliberate = [(2, 2, 1)]
        return [Case(args) for args in deliberate + draw(st.tuples(st.integers(1, 2), st.sampled_from([2, 4, 8]),
                                                                   st.integers(0, 100)), 2)]

    def expected(self, case):
        from torch.profiler import ProfilerActivity, profile, record_function, schedule

        forward, backward, optimizer, _ = P.capstone_parts(*case.args)
        path = os.path.join(tempfile.mkdtemp(prefix="ptprof-"), "trace.json")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
                         on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
                for _ in range(4):
                    with record_function("forward"):
                        forward()
                    with record_function("backward"):
                        backward()
                    with record_function("optimizer"):
                        optimizer()
                    prof.step()
        finally:
            torch.set_num_threads(threads)
        events = P.trace_host_events(path)
        ops = step_ops(events)
        return {"ops": ops[-1] if ops else Counter(), "steps": [r["name"] for r in step_ranges(events)]}

    def compare(self, case, got, expected):
        if not _dict(got):
            return f"expected a list of three op names, got {describe(got)}"
        if got["calls"] != [4, 4, 4]:
            return (f"forward, backward and optimizer were called {got['calls']} times; profile 4 steps "
                    f"(wait 1, warm-up 1, active 2), each running the three phases once")
        events = got["events"]
        if events is None:
            return "no readable trace at trace_path: export it there with prof.export_chrome_trace(trace_path)"
        steps = step_ranges(events)
        if len(steps) != 2:
            return (f"the trace holds {len(steps)} profiled steps (ProfilerStep#N ranges); schedule(wait=1, warmup=1, "
                    f"active=2) with prof.step() after each step keeps exactly 2")
        if [r["name"] for r in steps] != expected["steps"]:
            return (f"the trace records {[r['name'] for r in steps]}; schedule(wait=1, warmup=1, active=2) records "
                    f"{expected['steps']}: one step skipped, one warm-up step thrown away, then two kept")
        for r in steps:
            for phase in ("forward", "backward", "optimizer"):
                n = sum(e["name"] == phase and e.get("cat") == "user_annotation" and _inside(e, r) for e in events)
                if n != 1:
                    return f"{r['name']} holds {n} record_function range(s) named {phase!r}; expected exactly 1"
        for r, ops in zip(steps, step_ops(events)):
            if ops != expected["ops"]:
                diff = (ops - expected["ops"]) + (expected["ops"] - ops)
                return (f"{r['name']} does not hold the ops of one training step (differences: "
                        f"{describe(dict(diff), 120)}): profile the three parts you were given, unchanged")
        names = got["names"]
        if not (isinstance(names, list) and len(names) == 3 and all(isinstance(n, str) for n in names)):
            return f"expected a list of three op names, got {describe(names)}"
        times = torch_key_averages({"traceEvents": events})
        aten = {n: v[1] for n, v in times.items() if n.startswith("aten::")}
        ranking = sorted(aten, key=lambda n: (-aten[n], n))[:3]
        for i, name in enumerate(names):
            if name not in aten:
                return f"{name!r} is not an ATen op of your trace; its top three by self time: {ranking}"
            truth = aten[ranking[i]]
            if len(set(names)) != 3 or abs(aten[name] - truth) > 2.0 + 0.02 * truth:
                return (f"position {i + 1}: {name!r} ({aten[name]:.1f} us of self time); your trace's top three by "
                        f"self time: {[(n, round(aten[n], 1)) for n in ranking]}")
        return None

    def diagnose(self, case, got, expected):
        if not _dict(got) or got.get("events") is None:
            return None
        steps = step_ranges(got["events"])
        if len(steps) in (0, 4) and got.get("calls") == [4, 4, 4]:
            return ("without a schedule the profiler records everything and names no steps: "
                    "profile(..., schedule=schedule(wait=1, warmup=1, active=2)) and prof.step() after each step.")
        for r in steps:
            for phase in ("forward", "backward", "optimizer"):
                if not any(e["name"] == phase and e.get("cat") == "user_annotation" and _inside(e, r)
                           for e in got["events"]):
                    return (f"wrap the {phase} phase in record_function({phase!r}): every profiled step needs a range "
                            f"named {phase!r}.")
        names = got.get("names")
        if isinstance(names, list) and any(isinstance(n, str) and not n.startswith("aten::") for n in names):
            return "only ATen ops count (names starting with 'aten::'): not ProfilerStep*, forward, backward, optimizer."
        if isinstance(names, list) and len(names) == 3 and all(isinstance(n, str) for n in names):
            aten = {n: v for n, v in torch_key_averages({"traceEvents": got["events"]}).items()
                    if n.startswith("aten::")}
            by_total = sorted(aten, key=lambda n: (-aten[n][2], n))[:3]
            by_self = sorted(aten, key=lambda n: (-aten[n][1], n))[:3]
            if (by_total != by_self and len(by_total) == 3 and all(n in aten for n in names)
                    and all(abs(aten[n][2] - aten[t][2]) <= 2.0 + 0.02 * aten[t][2] for n, t in zip(names, by_total))):
                return ("rank by self time: your three are the top by total time, and an op's total includes the "
                        "ops it calls (aten::linear's total is mostly the aten::addmm inside it).")
            if any(n in ("aten::linear", "aten::matmul") for n in names):
                return "rank by self time: aten::linear's total is mostly aten::addmm inside it."
        return None


EXERCISES = [SyncReason(), TimeGpu(), PredictStep(), TrainPrefetch(), OpTimes(), GpuActivity(), TrainFast(),
             CapstoneCosts()]
CHAPTER = Chapter("profiling", exercises=EXERCISES,
                  sandbox_files=("profiling/scaffold.py", "profiling/async_device.py", "profiling/placement.py",
                                 "profiling/host_boundary.py", "profiling/sync_recorder.py"))
