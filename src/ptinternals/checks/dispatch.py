"""The dispatch chapter's graded exercises: cases, expected answers from real torch, and likely causes.

Where the truth comes from (never from this package's reference implementation):

- dispatch.tensor_keys key sets: ``torch._C._dispatch_keys(t)`` of a real tensor built to the description;
- dispatch.dispatch_path dispatch paths: probe operators whose Python kernels, registered at each dispatch key with
  ``torch.library``, log the key the real dispatcher chose (``ptinternals.dispatch.recorded_path``);
- dispatch.flop_counter FLOPs: ``torch.utils.flop_counter.FlopCounterMode``, taught the CPU attention kernels with
  torch's own SDPA formulas (it counts them as 0 otherwise);
- dispatch.graph_tracer graphs: the ops a logging TorchDispatchMode sees, and eager loss and gradients on new values;
- dispatch.int8_tensor int8: ``torch.quantize_per_channel`` and a model whose weights are its dequantised values;
- dispatch.custom_op the custom op: ``F.gelu`` and its autograd, ``opcheck``, ``torch.compile``;
- dispatch.memory_estimate memory: the storages of a real run (CPU, or meta for models too big to allocate).
"""
from __future__ import annotations

import math
import warnings
from functools import lru_cache

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from ..grading._runtime import TensorInfo
from ..grading.cases import draw
from ..grading.compare import close_tensors, describe, same_value
from ..grading.exercise import Case, Chapter, Exercise
from ..grading.policy import Policy
from .probes import dispatch as P

aten = torch.ops.aten


def _keys_of(got):
    """A returned collection of key names as a list, or None when it is not one."""
    if isinstance(got, (list, tuple)) and all(isinstance(k, str) for k in got):
        return list(got)
    return None


# ================================================================================================
# dispatch.tensor_keys the key set of a tensor
# ================================================================================================
def real_tensor(device="cpu", *, requires_grad=False, inference=False, subclass=None, functional=False,
                conj=False, sparse=False) -> torch.Tensor:
    """A real tensor matching a description (the fields of Exercise dispatch.tensor_keys)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..dispatch.recorded_path import ProbeWrapper

    dtype = torch.complex64 if conj else torch.float32

    def build():
        with torch.inference_mode(inference):
            t = torch.ones(2, 3, device=device, dtype=dtype)
            if conj:
                t = t.conj()  # a lazily conjugated view: the Conjugate key, no copy
            if sparse:
                t = t.to_sparse()
        return t

    if subclass == "fake":
        with FakeTensorMode():
            t = build()
    else:
        t = build()
    if requires_grad:
        t.requires_grad_(True)
    if functional:
        t = torch._to_functional_tensor(t)
    if subclass == "wrapper":
        t = ProbeWrapper(t)
    return t


def real_key_names(**desc) -> list[str]:
    text = str(torch._C._dispatch_keys(real_tensor(**desc)))  # "DispatchKeySet(CPU, ADInplaceOrView, ...)"
    return [k.strip() for k in text[len("DispatchKeySet("):-1].split(",") if k.strip()]


@st.composite
def tensor_descriptions(draw_):
    """Descriptions real torch can build: cuda only as a FakeTensor, wrappers around plain dense tensors."""
    subclass = draw_(st.sampled_from([None, None, "wrapper", "fake"]))
    device = draw_(st.sampled_from(["cpu", "meta", "cuda"] if subclass == "fake" else ["cpu", "meta"]))
    desc = {"device": device}
    inference = subclass != "wrapper" and draw_(st.booleans())
    if inference:
        desc["inference"] = True
    elif draw_(st.booleans()):
        desc["requires_grad"] = True
    if subclass:
        desc["subclass"] = subclass
    if subclass != "wrapper":
        layout = draw_(st.sampled_from(["dense", "dense", "conj", "sparse"] if device == "cpu" else ["dense", "conj"]))
        if layout == "conj":
            desc["conj"] = True
        elif layout == "sparse":
            desc["sparse"] = True
        if subclass is None and draw_(st.booleans()):
            desc["functional"] = True
    return desc


class TensorKeys(Exercise):
    id, entry, points = "dispatch.tensor_keys", "tensor_keys", 1
    title = "the dispatch keys a tensor carries"
    forbid = ("torch",)

    def visible_cases(self):
        return [Case((), {"device": "cpu"}, label="a plain CPU tensor"),
                Case((), {"device": "cpu", "requires_grad": True}, label="requires_grad=True"),
                Case((), {"device": "cpu", "inference": True}, label="made under torch.inference_mode()"),
                Case((), {"device": "meta"}, label="a meta tensor: no data"),
                Case((), {"device": "cuda", "subclass": "fake"}, label="a FakeTensor that says it lives on cuda"),
                Case((), {"device": "cpu", "sparse": True}, label="a sparse COO tensor")]

    boundary_classes = {
        "meta: a device without an Autocast key": lambda c, e: c.kwargs["device"] == "meta",
        "a FakeTensor that claims cuda": lambda c, e: c.kwargs["device"] == "cuda",
        "an inference tensor on the CPU (Autocast kept, autograd gone)":
            lambda c, e: c.kwargs.get("inference") and c.kwargs["device"] == "cpu",
        "an inference FakeTensor": lambda c, e: c.kwargs.get("inference") and c.kwargs.get("subclass") == "fake",
        "requires_grad=False outside inference mode (the Autograd keys anyway)":
            lambda c, e: not c.kwargs.get("requires_grad") and not c.kwargs.get("inference"),
        "a wrapper subclass that requires grad":
            lambda c, e: c.kwargs.get("subclass") == "wrapper" and c.kwargs.get("requires_grad"),
        "a functional wrapper around a conj view": lambda c, e: c.kwargs.get("functional") and c.kwargs.get("conj"),
        "a conj view on meta": lambda c, e: c.kwargs.get("conj") and c.kwargs["device"] == "meta",
        "a sparse tensor made under inference_mode": lambda c, e: c.kwargs.get("sparse") and c.kwargs.get("inference"),
        "a sparse tensor that requires grad": lambda c, e: c.kwargs.get("sparse") and c.kwargs.get("requires_grad"),
        "three properties at once": lambda c, e: sum(bool(v) for k, v in c.kwargs.items() if k != "device") >= 3,
    }

    def hidden_cases(self):
        deliberate = [{"device": "meta", "conj": True}, {"device": "cuda", "subclass": "fake", "inference": True},
                      {"device": "cpu", "sparse": True, "inference": True}, {"device": "cpu", "functional": True,
                                                                            "conj": True},
                      {"device": "meta", "subclass": "wrapper", "requires_grad": True},
                      {"device": "cpu", "sparse": True, "requires_grad": True}, {"device": "meta", "inference": True},
                      {"device": "cuda", "subclass": "fake", "conj": True, "requires_grad": True}]
        return [Case((), d) for d in deliberate + draw(tensor_descriptions(), 60)]

    def expected(self, case):
        return sorted(real_key_names(**case.kwargs))

    def compare(self, case, got, expected):
        keys = _keys_of(got)
        if keys is None:
            return f"expected a list of key names like {expected}\n     got {describe(got)}"
        if len(set(keys)) != len(keys):
            return f"a key appears twice: {keys}"
        missing, extra = sorted(set(expected) - set(keys)), sorted(set(keys) - set(expected))
        if missing or extra:
            return (f"expected the keys {expected}\n     got {sorted(keys)}"
                    + (f"\n  missing: {missing}" if missing else "")
                    + (f"\n  not in torch's set: {extra}" if extra else ""))
        return None

    def diagnose(self, case, got, expected):
        if _keys_of(got) is None:
            return None
        keys, want, d = set(got), set(expected), case.kwargs
        missing, extra = want - keys, keys - want
        backend = {"cpu": "CPU", "cuda": "CUDA", "meta": "Meta"}[d["device"]]
        if not d.get("inference") and missing == {"ADInplaceOrView", "Autograd" + backend} and not extra:
            return ("every tensor made outside inference_mode carries ADInplaceOrView and Autograd<Backend>, "
                    "even with requires_grad=False (TensorImpl.cpp: 'TODO: Ideally we only add AutogradBackend "
                    "key when the tensor requires grad').")
        if d.get("inference") and extra and extra <= {"ADInplaceOrView", "Autograd" + backend} and not missing:
            return "an inference tensor has neither ADInplaceOrView nor an Autograd key: that is what makes it cheap."
        if "AutocastMeta" in extra:
            return "there is no AutocastMeta key: only cpu and cuda (among these devices) have an Autocast key."
        if missing == {"Autocast" + backend} and not extra:
            return ("cpu and cuda tensors carry Autocast<Backend> (even inference tensors); autocast is off by "
                    "*excluding* that key in the thread-local set, not by leaving it off the tensor.")
        if missing == {"PythonTLSSnapshot"} and not extra:
            return "a tensor subclass (wrapper or FakeTensor) carries both Python and PythonTLSSnapshot."
        if d.get("sparse") and "Sparse" in extra:
            return "the backend key of a sparse tensor is one name: functionality + device, e.g. 'SparseCPU'."
        return None


# ================================================================================================
# dispatch.dispatch_path the dispatch path
# ================================================================================================
PROBE_OPS = ("probe", "probe_", "probe_factory")


@lru_cache(maxsize=None)
def fallthrough_keys(op: str) -> tuple[str, ...]:
    """The keys whose kernel for probe op ``op`` is a fallthrough, read from torch's dispatch table."""
    from ..dispatch.operator_entry import dispatch_table_from_torch
    from ..dispatch.recorded_path import NAMESPACE, probe_op

    probe_op(op)
    table = dispatch_table_from_torch(f"{NAMESPACE}::{op}")
    return tuple(sorted(k for k, kernel in table.items() if kernel.fallthrough))


def path_case(op: str, tensors: list, *, label: str = "", **ctx) -> Case:
    kwargs = {"fallthrough": list(fallthrough_keys(op))}
    kwargs.update({k: v for k, v in ctx.items() if v not in (None, False, [], ())})
    if "grad_mode" in ctx and ctx["grad_mode"] is False:
        kwargs["grad_mode"] = False
    return Case((tensors,), kwargs, label=f"{op}: {label}" if label else op)


def _ctx_of(case: Case) -> dict:
    return {k: v for k, v in case.kwargs.items() if k != "fallthrough"}


def _op_of(case: Case) -> str:
    return case.label.split(":")[0].strip()


@st.composite
def path_cases(draw_):
    kind = draw_(st.sampled_from(["plain", "plain", "plain", "fake", "factory"]))
    ctx = {"autocast": draw_(st.sampled_from([None, "cpu"])), "inference_mode": draw_(st.booleans())}
    if draw_(st.booleans()):
        ctx["grad_mode"] = False
    if kind == "factory":
        ctx["modes"] = draw_(st.sampled_from([[], ["python"]]))
        ctx["factory_device"] = draw_(st.sampled_from([None, "cpu", "meta"]))
        return path_case("probe_factory", [], label="a factory function", **ctx)
    if kind == "fake":
        device = draw_(st.sampled_from(["cpu", "cuda"]))
        outside = draw_(st.booleans())  # a FakeTensor used outside its mode: its __torch_dispatch__ enters it
        ctx["modes"] = ([] if outside else ["fake"]) + draw_(st.sampled_from([[], ["python"]]))
        d = {"device": device, "subclass": "fake"}
        where = "outside" if outside else "under"
        return path_case("probe", [d, d], label=f"FakeTensors {where} FakeTensorMode", **ctx)
    device = draw_(st.sampled_from(["cpu", "meta"]))
    descs = []
    for _ in range(2):
        d = {"device": device}
        choice = draw_(st.sampled_from(["plain", "grad", "inference", "wrapper"]))
        if choice == "grad":
            d["requires_grad"] = True
        elif choice == "inference":
            d["inference"] = True
        elif choice == "wrapper":
            d["subclass"] = "wrapper"
        descs.append(d)
    ctx["modes"] = draw_(st.sampled_from([[], [], ["python"], ["python", "python"]]))
    op = draw_(st.sampled_from(["probe", "probe_"]))
    return path_case(op, descs, label="out-of-place" if op == "probe" else "in-place", **ctx)


class DispatchPath(Exercise):
    id, entry, points = "dispatch.dispatch_path", "dispatch_path", 3
    title = "predict the kernels that run, in order"
    forbid = ("torch",)

    def visible_cases(self):
        cpu, grad = {"device": "cpu"}, {"device": "cpu", "requires_grad": True}
        wrapper, fake = {"device": "cpu", "subclass": "wrapper"}, {"device": "cuda", "subclass": "fake"}
        return [path_case("probe", [cpu, grad], label="a + b on the CPU"),
                path_case("probe", [cpu, cpu], grad_mode=False, label="under torch.no_grad()"),
                path_case("probe", [cpu, cpu], inference_mode=True, label="under torch.inference_mode()"),
                path_case("probe_", [cpu, cpu], label="in-place: a.add_(b)"),
                path_case("probe", [cpu, cpu], autocast="cpu", label="under torch.autocast('cpu')"),
                path_case("probe", [cpu, cpu], modes=["python"], label="inside one TorchDispatchMode"),
                path_case("probe", [cpu, cpu], modes=["python", "python"], label="inside two TorchDispatchModes"),
                path_case("probe", [wrapper, cpu], label="a wrapper subclass meets a plain tensor"),
                path_case("probe", [fake, fake], modes=["fake"], label="FakeTensors under FakeTensorMode"),
                path_case("probe_factory", [], factory_device="meta", label="torch.empty(..., device='meta')")]

    boundary_classes = {
        "under no_grad (the Autograd kernel still runs)":
            lambda c, e: c.kwargs.get("grad_mode") is False and any(k.startswith("Autograd") for k in e),
        "inference_mode with tensors made outside it": lambda c, e: c.kwargs.get("inference_mode") and any(
            not t.get("inference") for t in c.args[0]),
        "inference tensors outside inference_mode": lambda c, e: not c.kwargs.get("inference_mode") and any(
            t.get("inference") for t in c.args[0]),
        "in place under inference_mode (ADInplaceOrView kept by the tensor)":
            lambda c, e: _op_of(c) == "probe_" and c.kwargs.get("inference_mode") and "ADInplaceOrView" in e,
        "autocast and a dispatch mode together": lambda c, e: c.kwargs.get("autocast") and "python" in c.kwargs.get(
            "modes", []) and "AutocastCPU" in e,
        "autocast('cpu') on meta tensors (no Autocast key)": lambda c, e: c.kwargs.get("autocast") and any(
            t["device"] == "meta" for t in c.args[0]),
        "two dispatch modes": lambda c, e: c.kwargs.get("modes", []).count("python") >= 2,
        "a wrapper subclass inside a dispatch mode":
            lambda c, e: c.kwargs.get("modes") and any(t.get("subclass") == "wrapper" for t in c.args[0]),
        "a dispatch mode inside FakeTensorMode": lambda c, e: c.kwargs.get("modes", [])[:2] == ["fake", "python"],
        "FakeTensors used outside FakeTensorMode (the subclass enters its mode)": lambda c, e: any(
            t.get("subclass") == "fake" for t in c.args[0]) and "fake" not in c.kwargs.get("modes", []),
        "FakeTensors that claim cuda": lambda c, e: any(t["device"] == "cuda" for t in c.args[0]),
        "a factory function on meta": lambda c, e: c.kwargs.get("factory_device") == "meta",
        "a factory function without a device": lambda c, e: _op_of(c) == "probe_factory" and not c.kwargs.get(
            "factory_device"),
        "a factory function inside a dispatch mode":
            lambda c, e: _op_of(c) == "probe_factory" and c.kwargs.get("modes"),
    }

    def hidden_cases(self):
        cpu, meta, inference = {"device": "cpu"}, {"device": "meta"}, {"device": "cpu", "inference": True}
        wrapper, fake = {"device": "cpu", "subclass": "wrapper"}, {"device": "cuda", "subclass": "fake"}
        deliberate = [path_case("probe", [cpu, cpu], grad_mode=False, modes=["python"], label="out-of-place"),
                      path_case("probe_", [cpu, cpu], inference_mode=True, label="in-place"),
                      path_case("probe", [inference, cpu], label="out-of-place"),
                      path_case("probe", [cpu, cpu], autocast="cpu", modes=["python", "python"], label="out-of-place"),
                      path_case("probe", [meta, meta], autocast="cpu", label="out-of-place"),
                      path_case("probe", [wrapper, wrapper], modes=["python"], grad_mode=False, label="out-of-place"),
                      path_case("probe", [fake, fake], modes=["fake", "python"], label="FakeTensors under FakeTensorMode"),
                      path_case("probe", [fake, fake], modes=["python"], label="FakeTensors outside FakeTensorMode"),
                      path_case("probe_factory", [], modes=["python"], label="a factory function"),
                      path_case("probe_factory", [], autocast="cpu", label="a factory function")]
        return deliberate + draw(path_cases(), 80)

    def expected(self, case):
        from ..dispatch.recorded_path import record_dispatch_path

        tensors = case.args[0]
        ctx = _ctx_of(case)
        return record_dispatch_path(_op_of(case), *tensors, **ctx)

    def compare(self, case, got, expected):
        keys = _keys_of(got)
        if keys is None:
            return f"expected a list of key names like {expected}\n     got {describe(got)}"
        if "PythonTLSSnapshot" in keys:
            return "leave PythonTLSSnapshot out of the path (it only saves the TLS and passes on; the probes " \
                   f"cannot see it)\n  expected {expected}\n       got {keys}"
        return same_value(keys, expected)

    def diagnose(self, case, got, expected):
        keys = _keys_of(got)
        if keys is None:
            return None
        ctx, tensors = _ctx_of(case), case.args[0]

        def without(path, *names):
            return [k for k in path if not k.startswith(names)]

        passed_through = sorted(set(case.kwargs["fallthrough"]) & set(keys))
        if passed_through:
            return (f"drop the op's fallthrough keys ({', '.join(passed_through)}) from the key set before picking: "
                    "the dispatcher never calls a fallthrough kernel.")
        if keys != expected and keys == without(expected, "Autograd"):
            if ctx.get("inference_mode") is not True and ctx.get("grad_mode") is False:
                return "torch.no_grad() changes no key set: the Autograd kernel still runs (it just records no graph)."
        if keys != expected and without(keys, "Autograd") == expected and ctx.get("inference_mode"):
            return "inference_mode adds the Autograd keys to the thread-local EXCLUDE set: they never run."
        if ctx.get("autocast") and "AutocastCPU" in expected and keys == without(expected, "AutocastCPU"):
            return ("torch.autocast('cpu') REMOVES AutocastCPU from the thread-local exclude set; the tensor "
                    "already carries the key, and Autocast ranks above Autograd.")
        if keys.count("AutocastCPU") > 1:
            return "the autocast kernel calls the op again with its own key EXCLUDED, so it runs once."
        if "Python" in keys and any(k.startswith(("Autograd", "Autocast")) for k in keys[keys.index("Python"):]):
            return ("inside __torch_dispatch__ every key ABOVE Python is excluded: func(*args) goes to the "
                    "kernels below Python (no second autograd or autocast step).")
        if without(keys, "Python") == without(expected, "Python") and keys.count("Python") < expected.count("Python"):
            modes = ctx.get("modes", [])
            if modes.count("python") > 1 and keys.count("Python") <= expected.count("Python") - modes.count("python") + 1:
                return ("each TorchDispatchMode on the stack handles the op once: the innermost first, then, "
                        "when it calls func(*args), the next one out.")
            if modes and any(t.get("subclass") == "wrapper" for t in tensors):
                return "after the modes, the tensor subclass's __torch_dispatch__ runs too (another Python step)."
        if expected[-1:] == ["Meta"] and keys[:-1] == expected[:-1] and keys[-1:] in (["CPU"], ["CUDA"]):
            return ("FakeTensorMode runs the op's meta kernel: the path ends in Meta, whatever device the "
                    "fake tensors claim.")
        return None


# ================================================================================================
# dispatch.flop_counter FLOP counter
# ================================================================================================
def _cpu_sdpa_formulas():
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    return {
        aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(g, q, k, v),
    }


def torch_flops(spec, backward: bool, *, cpu_attention: bool = True, attention_backward: str = "full",
                zero_ops: tuple = (), half_ops: tuple = ()) -> int:
    """FlopCounterMode's count for the workload, with torch's SDPA formulas for the CPU kernels.

    The wrong answers diagnose looks for: ``attention_backward`` "zero" (the backward kernel not counted)
    or "forward" (counted with the forward formula) instead of "full" (the truth); ``zero_ops``: overload
    packets counted as 0 (``aten.addmm``: a counter that only knows ``mm``); ``half_ops``: packets among
    mm, addmm, bmm, baddbmm counted at m*k*n (a multiply-add taken as one FLOP)."""
    from torch.utils import flop_counter as fc
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    mapping = _cpu_sdpa_formulas() if cpu_attention else {}
    mapping.update({op: (lambda *a, out_shape=None, **kw: 0) for op in zero_ops})
    halved = {aten.mm: lambda a, b, *r, out_shape=None, **kw: fc.mm_flop(a, b) // 2,
              aten.addmm: lambda c, a, b, *r, out_shape=None, **kw: fc.addmm_flop(c, a, b) // 2,
              aten.bmm: lambda a, b, *r, out_shape=None, **kw: fc.bmm_flop(a, b) // 2,
              aten.baddbmm: lambda c, a, b, *r, out_shape=None, **kw: fc.baddbmm_flop(c, a, b) // 2}
    mapping.update({op: halved[op] for op in half_ops})
    if cpu_attention and attention_backward != "full":
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = (
            (lambda g, q, k, v, *a, out_shape=None, **kw: 0) if attention_backward == "zero" else
            (lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v)))
    w = P.make_workload(spec)
    with FlopCounterMode(display=False, custom_mapping=mapping) as mode:
        loss = w.loss()
        if backward:
            loss.backward()
    return mode.get_total_flops()


def flop_spec_label(spec, backward):
    return f"{spec[0]} {spec[1:]}" + (", forward and backward" if backward else ", forward only")


@st.composite
def flop_cases(draw_):
    dim = st.sampled_from([1, 2, 3, 5, 8, 13])
    kind = draw_(st.sampled_from(["linear", "mlp", "bmm", "baddbmm", "conv2d", "attention", "attention", "block"]))
    backward = draw_(st.booleans()) if kind != "conv2d" else False
    if kind == "linear":
        batch = tuple(draw_(st.lists(st.sampled_from([0, 1, 2, 3, 5]), max_size=2)))  # 0: an empty batch
        spec = ("linear", batch, draw_(dim), draw_(dim), draw_(st.booleans()))
    elif kind == "mlp":
        spec = ("mlp", draw_(dim), draw_(dim), draw_(dim), draw_(dim))
    elif kind in ("bmm", "baddbmm"):
        spec = (kind, draw_(dim), draw_(dim), draw_(dim), draw_(dim))
    elif kind == "conv2d":
        groups = draw_(st.sampled_from([1, 2]))
        spec = ("conv2d", draw_(st.sampled_from([1, 2])), 2 * groups, draw_(st.sampled_from([2, 4, 6])),
                draw_(st.sampled_from([5, 8, 9])), draw_(st.sampled_from([1, 3])), draw_(st.sampled_from([1, 2])),
                groups)
    elif kind == "attention":
        s_q = draw_(dim)
        causal = draw_(st.booleans())
        spec = ("attention", draw_(st.sampled_from([1, 2])), draw_(st.sampled_from([1, 3])), s_q,
                s_q if causal else draw_(dim), draw_(st.sampled_from([4, 8, 12])), causal)
    else:
        h = draw_(st.sampled_from([1, 2]))
        spec = ("block", draw_(st.sampled_from([1, 2])), draw_(dim), h * draw_(st.sampled_from([2, 4])), h)
    return Case((spec, backward), label=flop_spec_label(spec, backward))


class FlopCounterExercise(Exercise):
    id, entry, points = "dispatch.flop_counter", "FlopCounter", 2
    title = "a FLOP-counting TorchDispatchMode"
    policy = Policy(banned=("FlopCounterMode", "flop_counter", "flop_registry", "register_flop_formula",
                            "get_flop_counts"), why="write the FLOP formulas yourself")
    probe = "ptinternals.checks.probes.dispatch:count_flops"
    timeout_s = 60.0

    def visible_cases(self):
        specs = [(("linear", (4,), 16, 8, True), False), (("linear", (4,), 16, 8, True), True),
                 (("bmm", 3, 5, 7, 2), True), (("conv2d", 1, 2, 4, 8, 3, 1, 1), False),
                 (("attention", 1, 2, 6, 6, 8, True), False), (("attention", 1, 2, 6, 6, 8, True), True),
                 (("block", 2, 5, 8, 2), True)]
        return [Case((s, b), label=flop_spec_label(s, b)) for s, b in specs]

    boundary_classes = {
        "an empty batch (0 FLOPs from a real matmul)": lambda c, e: c.args[0][0] == "linear" and 0 in c.args[0][1],
        "a linear layer on a 3-d input": lambda c, e: c.args[0][0] == "linear" and len(c.args[0][1]) == 2,
        "a linear layer without bias (aten.mm, not addmm)": lambda c, e: c.args[0][0] == "linear" and not c.args[0][4],
        "size-1 dims": lambda c, e: 1 in [v for v in c.args[0][1:] if isinstance(v, int)],
        "baddbmm (bmm plus a matrix)": lambda c, e: c.args[0][0] == "baddbmm",
        "attention: query and key lengths differ": lambda c, e: c.args[0][0] == "attention" and c.args[0][3] != c.args[0][4],
        "attention: causal, forward and backward": lambda c, e: c.args[0][0] == "attention" and c.args[0][6] and c.args[1],
        "attention: not causal, forward only": lambda c, e: c.args[0][0] == "attention" and not c.args[0][6] and not c.args[1],
        "attention: query length 1": lambda c, e: c.args[0][0] == "attention" and c.args[0][3] == 1,
        "a grouped convolution": lambda c, e: c.args[0][0] == "conv2d" and c.args[0][7] > 1,
        "a strided convolution": lambda c, e: c.args[0][0] == "conv2d" and c.args[0][6] > 1,
        "a 1x1 convolution": lambda c, e: c.args[0][0] == "conv2d" and c.args[0][5] == 1,
        "a transformer block, forward and backward": lambda c, e: c.args[0][0] == "block" and c.args[1],
    }

    def hidden_cases(self):
        fixed = [(("block", 2, 7, 12, 3), True), (("mlp", 3, 13, 5, 1), True), (("linear", (2, 3), 5, 7, True), True),
                 (("linear", (0,), 4, 3, True), True), (("linear", (1,), 1, 1, False), True),
                 (("baddbmm", 2, 1, 3, 5), True), (("attention", 1, 2, 1, 5, 8, False), True),
                 (("attention", 2, 3, 7, 11, 12, False), False), (("attention", 1, 1, 6, 6, 4, True), True),
                 (("conv2d", 2, 4, 6, 9, 3, 2, 2), False), (("conv2d", 1, 2, 4, 5, 1, 1, 1), False),
                 # a batch of 3: 2*b and 2**b agree at b = 1 and b = 2
                 (("conv2d", 3, 2, 2, 5, 3, 1, 1), False), (("attention", 3, 1, 2, 3, 4, False), True)]
        return [Case((s, b), label=flop_spec_label(s, b)) for s, b in fixed] + draw(flop_cases(), 40)

    def expected(self, case):
        return torch_flops(*case.args)

    def diagnose(self, case, got, expected):
        spec, backward = case.args
        if isinstance(got, bool) or not isinstance(got, int) or got == expected:
            return None
        if 2 * got == expected or got in (torch_flops(spec, backward, half_ops=(aten.mm, aten.addmm)),
                                          torch_flops(spec, backward, half_ops=(aten.bmm, aten.baddbmm))):
            return "one multiply-add is 2 FLOPs: an (m, k) @ (k, n) product costs 2*m*k*n."
        if spec[0] in ("attention", "block") and got == torch_flops(spec, backward, cpu_attention=False):
            return ("attention counts 0: count aten._scaled_dot_product_flash_attention_for_cpu (2 bmms) and "
                    "its _backward (5 bmms), the fused CPU kernels FlopCounterMode has no formula for.")
        if backward and got == torch_flops(spec, False):
            return "only the forward pass was counted: the backward pass's mm/bmm and attention-backward ops " \
                   "come through __torch_dispatch__ too."
        if spec[0] in ("attention", "block") and backward and got in (
                torch_flops(spec, True, attention_backward="zero"), torch_flops(spec, True, attention_backward="forward")):
            return "the attention backward recomputes Q K^T and does 4 more bmms: 2*b*h*s_q*s_k*(3*d + 2*d_v)."
        if spec[0] in ("linear", "mlp", "block") and got == torch_flops(spec, backward, zero_ops=(aten.addmm,)):
            return "nn.Linear reaches the mode as aten.addmm (with bias, 2-d input) or aten.mm: count both; " \
                   "for addmm the matrices are args[1] and args[2] (args[0] is the bias)."
        if spec[0] == "conv2d" and spec[7] > 1 and got == spec[7] * expected:
            return ("a grouped convolution multiplies each output channel with c_in/groups input channels: read "
                    "c_in/groups from the weight's shape (c_out, c_in/groups, kh, kw), not from the input.")
        return None


# ================================================================================================
# dispatch.graph_tracer tracing mode
# ================================================================================================
class _OpLog:
    """The ops a TorchDispatchMode sees while the workload runs forward and backward (the truth)."""

    @staticmethod
    def ops(spec) -> tuple[list[str], list[list[str]]]:
        """(op names, the names of each op's kwargs), in dispatch order."""
        from torch.utils._python_dispatch import TorchDispatchMode

        seen, kwarg_names = [], []

        class Log(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(str(func))
                kwarg_names.append(sorted(kwargs or {}))
                return func(*args, **(kwargs or {}))

        w = P.make_workload(spec)
        with Log():
            w.loss().backward()
        return seen, kwarg_names


TRACE_SPECS_VISIBLE = [("linear", (3,), 4, 2, True), ("mlp", 3, 5, 7, 2), ("masked", 4, 3)]


@st.composite
def trace_specs(draw_):
    dim = st.sampled_from([1, 2, 3, 5, 7])
    kind = draw_(st.sampled_from(["linear", "mlp", "masked", "attention", "block", "bmm", "baddbmm"]))
    if kind == "linear":
        return ("linear", tuple(draw_(st.lists(dim, max_size=2))), draw_(dim), draw_(dim), draw_(st.booleans()))
    if kind == "mlp":
        return ("mlp", draw_(dim), draw_(dim), draw_(dim), draw_(dim))
    if kind == "masked":
        return ("masked", draw_(st.sampled_from([2, 3, 5])), draw_(dim))
    if kind == "attention":
        s = draw_(dim)
        return ("attention", 1, draw_(st.sampled_from([1, 2])), s, s, draw_(st.sampled_from([4, 6])), draw_(st.booleans()))
    if kind == "block":
        return ("block", 1, draw_(st.sampled_from([2, 3, 5])), 4, draw_(st.sampled_from([1, 2])))
    return (kind, draw_(dim), draw_(dim), draw_(dim), draw_(dim))


class GraphTracerExercise(Exercise):
    id, entry, points = "dispatch.graph_tracer", "GraphTracer", 2
    title = "record the ATen graph of forward and backward"
    policy = Policy(banned=("make_fx", "proxy_tensor", "symbolic_trace", "fx", "export", "aot_function",
                            "aot_module", "dynamo", "compile"), why="record the ops yourself, from __torch_dispatch__")
    probe = "ptinternals.checks.probes.dispatch:trace_and_replay"
    timeout_s = 60.0

    def visible_cases(self):
        return [Case((s,), label=f"{s[0]} {s[1:]}") for s in TRACE_SPECS_VISIBLE]

    boundary_classes = {
        "a constant the graph did not make (a mask captured by a closure)": lambda c, e: c.args[0][0] == "masked",
        "a leaf used twice (its gradients add up)": lambda c, e: c.args[0][0] == "masked",
        "ops with several outputs (native_layer_norm, split)":
            lambda c, e: any(op.startswith(("aten.native_layer_norm", "aten.split")) for op in e["ops"]),
        "an op with kwargs": lambda c, e: any(e["kwargs"]),
        "in-place ops (copy_ in the attention backward)": lambda c, e: any(op.endswith("_.default") for op in e["ops"]),
        "a linear layer without bias on a 3-d input":
            lambda c, e: c.args[0][0] == "linear" and not c.args[0][4] and len(c.args[0][1]) == 2,
        "a size-1 dim": lambda c, e: 1 in [v for v in c.args[0][1:] if isinstance(v, int)],
        "baddbmm": lambda c, e: c.args[0][0] == "baddbmm",
    }

    def hidden_cases(self):
        fixed = [("block", 2, 3, 8, 2), ("mlp", 2, 3, 5, 1), ("attention", 1, 2, 5, 5, 4, True),
                 ("linear", (2, 3), 5, 1, False), ("masked", 3, 2), ("baddbmm", 1, 2, 3, 1)]
        return [Case((s,), label=f"{s[0]} {s[1:]}") for s in fixed + draw(trace_specs(), 16)]

    def expected(self, case):
        spec = case.args[0]
        ops, kwargs = _OpLog.ops(spec)
        names = ["loss"] + [f"gradient of {name}" for name in P.make_workload(spec).leaves]
        return {"ops": ops, "kwargs": kwargs, "replay": P.eager_loss_and_grads(spec, seed=1), "names": names}

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "ops" not in got:
            return f"the grader could not read your result: {describe(got)}"
        problem = same_value(got["ops"], expected["ops"])
        if problem:
            return "the recorded call nodes are not the ops torch dispatched (forward, then backward):\n  " + problem
        for i, (op, g, e) in enumerate(zip(expected["ops"], got.get("kwargs", []), expected["kwargs"], strict=False)):
            if list(g) != e:
                return f"call node {i} ({op}) has the kwargs {list(g)}; torch passed {e}"
        outs, want = got["replay"], expected["replay"]
        if not isinstance(outs, list) or len(outs) != len(want):
            return f"the output node should hold the loss and {len(want) - 1} gradients, got {describe(outs)}"
        for name, g, e in zip(expected["names"], outs, want, strict=False):
            problem = close_tensors(g, e, rtol=1e-5, atol=1e-6)
            if problem:
                return (f"replaying your graph on NEW input values gives the wrong {name} "
                        f"(compared with running the model eagerly on those values):\n  {problem}")
        return None

    def diagnose(self, case, got, expected):
        from ..grading._runtime import Raised

        if isinstance(got, Raised):  # the probe's replay names what it could not resolve
            if "points at a node that returned" in got.message:
                return ("an op that returns several tensors (native_layer_norm, split, the attention kernels) "
                        "makes one node: refer to its i-th output as Ref(node, i).")
            if "is not one of the inputs" in got.message:
                return ("a tensor the graph neither produced nor took as a placeholder (a mask captured by a "
                        "closure) must be a 'constant' node that holds the tensor.")
            return None
        if not isinstance(got, dict) or "replay" not in got:
            return None
        ops, want = got.get("ops"), expected["ops"]
        if isinstance(ops, list) and len(ops) < len(want) and ops == want[:len(ops)]:
            return "record every op that reaches __torch_dispatch__, in order, including the backward ones."
        if ops == want and all(k == [] for k in got.get("kwargs", [])) and any(expected["kwargs"]):
            return "keep each op's kwargs (with tensors in them replaced by Refs): e.g. gelu's approximate='tanh'."
        outs = got["replay"]
        old = P.eager_loss_and_grads(case.args[0], seed=0)
        if isinstance(outs, list) and len(outs) == len(old) and all(
                isinstance(o, TensorInfo) and close_tensors(o, e) is None for o, e in zip(outs, old, strict=False)):
            return ("the replay reproduced the TRACED run's numbers: your nodes hold the traced tensors "
                    "themselves; store Ref(name) for every tensor the graph produced or took as a placeholder.")
        return None


# ================================================================================================
# dispatch.int8_tensor int8 wrapper subclass
# ================================================================================================
def torch_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 of ``w`` by torch itself: (codes, scales).

    ``torch.quantize_per_channel`` multiplies by the INVERSE scale in float32, which is inf for a subnormal
    scale (a row of subnormal weights): torch then returns -128/127 instead of round(w / scale). Those rows
    (and only those) are quantised with torch's elementwise ops, round(w / scale) clamped to [-127, 127]."""
    scale = w.abs().amax(dim=1) / 127
    fallback = torch.round(w / scale[:, None]).nan_to_num(0.0).clamp(-127, 127).to(torch.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torch.quantize_* creation functions are deprecated
        try:
            q = torch.quantize_per_channel(w, scale.double(), torch.zeros(w.shape[0], dtype=torch.long), 0,
                                           torch.qint8).int_repr()
        except (AttributeError, RuntimeError):  # a torch without quantised tensors
            return fallback, scale
    overflow = torch.isinf(1 / scale.float()) & (scale > 0)
    return torch.where(overflow[:, None], fallback, q), scale


def expected_quantize_only(w: torch.Tensor) -> dict:
    q, scale = torch_int8(w)
    return {"types": ["Int8Tensor"], "dtypes": [str(w.dtype).replace("torch.", "")], "int_data": [q],
            "scale": [scale], "dequantized": q.to(scale.dtype) * scale[:, None], "w_modified": False}


def expected_quantized_run(spec):
    if isinstance(spec, torch.Tensor):
        return expected_quantize_only(spec)
    model, x, target = P.quantized_model(spec)
    codes, scales = [], []
    for m in model:
        if isinstance(m, torch.nn.Linear):
            q, s = torch_int8(m.weight.detach())
            codes.append(q)
            scales.append(s)
            m.weight = torch.nn.Parameter(q.float() * s[:, None], requires_grad=False)  # the dequantised weight
    out, loss = P.train_step(model, x, target, spec[-1])
    trainable = [p.detach() for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        out_after = model(x)
    return {"types": ["Int8Tensor"] * len(codes), "int_data": codes, "scale": scales, "out": out.detach(),
            "loss": loss.detach(), "x_grad": x.grad, "trainable_after": trainable, "out_after_step": out_after,
            "types_after": ["Int8Tensor"] * len(codes), "dtypes": ["float32"] * len(codes)}


def _tiny_row(values, k=1):
    """Weights that are multiples of the smallest subnormal float32 (2**-149)."""
    return [v * k * 2.0 ** -149 for v in values]


def special_weights() -> list[tuple[str, torch.Tensor]]:
    """Weights whose quantisation sits on a boundary: exact ties, zero and subnormal rows, values near
    float32's max, a negative largest value, odd shapes and layouts."""
    ties = torch.tensor([[127.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, 126.5],
                         [-127.0, 64.5, -64.5, 100.5, 1.0, 0.0, -3.5, 10.5]])
    rows = torch.tensor([[0.0, 0.0, 0.0, 0.0], [3e38, -1e38, 1e37, 2.0], [1.0, -4.0, 2.5, 0.125],
                         _tiny_row([100, -38, 6, 1], k=10), _tiny_row([-190, 95, 3, 60]), _tiny_row([190, -95, 3, 60]),
                         [1e-30, -2e-31, 5e-31, 0.0]])
    g = torch.Generator().manual_seed(7)
    wide = torch.randn(3, 257, generator=g) * 1000 + 5000  # a large offset next to a small spread
    return [("exact ties (w / scale = k + 1/2)", ties),
            ("rows: all zero, near float32's max, plain, subnormal (two), tiny normal", rows),
            ("a transposed (non-contiguous) weight", torch.randn(6, 4, generator=g).t()),
            ("one output row", torch.randn(1, 5, generator=g)), ("one input column", torch.randn(5, 1, generator=g)),
            ("no rows at all", torch.zeros(0, 5)), ("a large offset next to a small spread", wide)]


@st.composite
def quant_specs(draw_):
    dim = st.sampled_from([1, 2, 3, 5, 8, 13])
    batch = tuple(draw_(st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=2)))
    return (batch, draw_(dim), draw_(dim), draw_(dim), draw_(st.sampled_from([0.1, 0.5])))


def quant_label(spec):
    batch, d_in, d_hidden, d_out, lr = spec
    return (f"input {(*batch, d_in)}: Linear({d_in}, {d_hidden}) -> ReLU -> LayerNorm -> Linear({d_hidden}, {d_out}), "
            f"SGD lr={lr}")


class Int8TensorExercise(Exercise):
    id, entry, points = "dispatch.int8_tensor", "Int8Tensor", 2
    title = "an int8 wrapper subclass that survives a training step"
    probe = "ptinternals.checks.probes.dispatch:train_quantized"
    timeout_s = 60.0

    def visible_cases(self):
        return [Case((s,), label=quant_label(s)) for s in [((4,), 8, 16, 3, 0.1), ((2, 3), 5, 7, 1, 0.5)]]

    boundary_classes = {
        "an exact tie w / scale = k + 1/2 (round half to even)": lambda c, e: _is_weight(c) and bool(
            (_ratios(c.args[0]) % 1 == 0.5).any()),
        "an all-zero row (scale 0)": lambda c, e: _is_weight(c) and bool((c.args[0].abs().amax(1) == 0).any()),
        "a row of subnormal weights": lambda c, e: _is_weight(c) and bool(
            ((c.args[0].abs().amax(1) < torch.finfo(torch.float32).tiny) & (c.args[0].abs().amax(1) > 0)).any()),
        "the clamp at -127 bites (a subnormal scale rounded down)": lambda c, e: _is_weight(c) and bool(
            (_ratios(c.args[0]) < -127.5).any()),
        "weights near float32's max": lambda c, e: _is_weight(c) and bool((c.args[0].abs() > 1e38).any()),
        "a row whose largest magnitude is negative (code -127)": lambda c, e: _is_weight(c) and bool(
            (e["int_data"][0] == -127).any()),
        "a large offset next to a small spread": lambda c, e: _is_weight(c) and c.args[0].numel() > 0 and bool(
            c.args[0].mean() > 3 * c.args[0].std()),
        "a non-contiguous weight": lambda c, e: _is_weight(c) and not c.args[0].is_contiguous(),
        "one output row": lambda c, e: _is_weight(c) and c.args[0].shape[0] == 1,
        "one input column": lambda c, e: _is_weight(c) and c.args[0].shape[1] == 1,
        "no rows (an empty weight)": lambda c, e: _is_weight(c) and c.args[0].shape[0] == 0,
        "the weight checked after quantize (it must not change)": lambda c, e: _is_weight(c),
        "frozen int8 weights beside trainable biases and LayerNorm, batch of 1":
            lambda c, e: not _is_weight(c) and c.args[0][0] == (1,),
        "a layer with one output (d_out == 1)": lambda c, e: not _is_weight(c) and c.args[0][3] == 1,
        "a layer with one input (d_in == 1)": lambda c, e: not _is_weight(c) and c.args[0][1] == 1,
    }

    def hidden_cases(self):
        weights = [Case((w,), label=f"Int8Tensor.quantize(w): {name}") for name, w in special_weights()]
        fixed = [((1,), 1, 3, 1, 0.5), ((2, 1), 4, 1, 2, 0.1)]
        return weights + [Case((s,), label=quant_label(s)) for s in fixed + draw(quant_specs(), 20)]

    def expected(self, case):
        return expected_quantized_run(case.args[0])

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "types" not in got:
            return f"the grader could not read your result: {describe(got)}"
        if got.get("w_modified"):
            return "Int8Tensor.quantize(w) modified the weight it was given: quantize must leave w as it was"
        if got["types"] != expected["types"]:
            return (f"after `nn.Parameter(Int8Tensor.quantize(w), requires_grad=False)` the weights are "
                    f"{got['types']}, not Int8Tensor")
        if got.get("dtypes") != expected["dtypes"]:
            return f"the weights' (logical) dtypes are {got.get('dtypes')}, expected {expected['dtypes']}"
        for i, (q, want) in enumerate(zip(got["int_data"], expected["int_data"], strict=False)):
            problem = close_tensors(q, want)
            if problem:
                return f"int_data of Linear layer {i} differs from torch.quantize_per_channel(...).int_repr():\n  {problem}"
        for i, (s, want) in enumerate(zip(got["scale"], expected["scale"], strict=False)):
            problem = close_tensors(s, want, rtol=1e-6, atol=0)
            if problem:
                return f"scale of Linear layer {i} (max |row| / 127):\n  {problem}"
        if "dequantized" in expected:
            problem = close_tensors(got.get("dequantized"), expected["dequantized"], rtol=1e-6, atol=0)
            return None if problem is None else f"dequantize() should give int_data * scale per row:\n  {problem}"
        if "train_error" in got:
            return f"the training step with your Int8Tensor weights failed: {got['train_error']}"
        checks = [("out", "the forward output"), ("loss", "the loss"), ("x_grad", "the gradient of the input")]
        for key, what in checks:
            problem = close_tensors(got[key], expected[key], rtol=1e-4, atol=1e-5)
            if problem:
                return f"{what} differs from the same model run with dequantised float weights:\n  {problem}"
        if len(got["trainable_after"]) != len(expected["trainable_after"]):
            return (f"{len(got['trainable_after'])} parameters require grad after the step, expected "
                    f"{len(expected['trainable_after'])} (the int8 weights are frozen; biases and LayerNorm train)")
        for i, (p, want) in enumerate(zip(got["trainable_after"], expected["trainable_after"], strict=False)):
            problem = close_tensors(p, want, rtol=1e-4, atol=1e-5)
            if problem:
                return f"trainable parameter {i} after the SGD step:\n  {problem}"
        if got["types_after"] != expected["types_after"]:
            return f"after the training step the weights are {got['types_after']}, not Int8Tensor"
        return close_tensors(got["out_after_step"], expected["out_after_step"], rtol=1e-4, atol=1e-5)

    def diagnose(self, case, got, expected):
        from ..grading._runtime import Raised

        if isinstance(got, Raised) and "requires that detach() returns an instance of the same type" in got.message:
            return ("nn.Parameter(t) calls t.detach(): handle aten.detach.default in __torch_dispatch__ by "
                    "returning a new Int8Tensor over the same int_data and scale.")
        if not isinstance(got, dict) or "types" not in got:
            return None
        if got.get("w_modified"):
            return ("quantize modified the weight it was given (an in-place op such as div_ on w, which is the "
                    "caller's tensor): compute the codes into a new tensor.")
        if got["types"] != expected["types"]:
            if all(t in ("Tensor", "Parameter") for t in got["types"]):
                return ("nn.Parameter(t) calls t.detach(): handle aten.detach.default in __torch_dispatch__ by "
                        "returning a new Int8Tensor over the same int_data and scale.")
            return None
        if got.get("dtypes") != expected["dtypes"]:
            if all(d == "int8" for d in got.get("dtypes") or ()):
                return ("the wrapper's dtype (what _make_wrapper_subclass gets as dtype=) is the LOGICAL dtype: the "
                        "float dtype the weight stands for (scale's dtype), not the int8 of the storage inside.")
            return None
        pairs = zip(got["int_data"], expected["int_data"], got["scale"], expected["scale"], strict=False)
        weights = [case.args[0]] if _is_weight(case) else None
        for i, (q, want, s, w_scale) in enumerate(pairs):
            if not isinstance(q, TensorInfo) or not isinstance(s, TensorInfo):
                return "store the codes in an attribute named int_data (an int8 tensor) and the scales in scale."
            if q.dtype != "int8":
                return f"int_data must be int8, got {q.dtype}"
            if tuple(s.shape) != tuple(w_scale.shape):
                return (f"scale has shape {tuple(s.shape)}: one scale per OUTPUT row (dim 0 of the weight), shape "
                        f"{tuple(w_scale.shape)}")
            if close_tensors(s, w_scale, rtol=1e-6, atol=0) is not None:
                ratio = s.values.double() / w_scale.double()
                if bool((w_scale > 0).all()) and bool(torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio),
                                                                      rtol=1e-6)):
                    return (f"the scales are {float(ratio.flatten()[0]):.4g} times torch's: scale = max(|w|) over "
                            f"each row / 127, and codes = round(w / scale) clamped to [-127, 127].")
                return None
            qv, wv = q.values.to(torch.int32), want.to(torch.int32)
            if tuple(qv.shape) != tuple(wv.shape) or torch.equal(qv, wv):
                continue
            ratio = None
            if weights is not None:
                ratio = _ratios(weights[0])
            elif i == 0 and not _is_weight(case):
                model, _, _ = P.quantized_model(case.args[0])
                ratio = _ratios(model[0].weight.detach())
            if ratio is not None and tuple(ratio.shape) == tuple(qv.shape):
                if torch.equal(qv, ratio.trunc().clamp(-127, 127).to(torch.int32)):
                    return "round to the nearest code (torch.round), do not truncate with .to(torch.int8)."
                wrong = qv != wv
                if bool(((ratio.abs() % 1 == 0.5) | ~wrong).all()):
                    return ("an exact tie (w / scale = k + 1/2) rounds half to even, like torch.round and "
                            "quantize_per_channel (nearbyint): round(2.5) == 2, round(-0.5) == -0.")
            return None
        return None


def _is_weight(case: Case) -> bool:
    return isinstance(case.args[0], torch.Tensor)


def _ratios(w: torch.Tensor) -> torch.Tensor:
    """w / scale per row, in float32 as the codes are computed (NaN for an all-zero row)."""
    return w / (w.abs().amax(dim=1) / 127)[:, None]


# ================================================================================================
# dispatch.custom_op custom op
# ================================================================================================
def expected_custom_op(shape, dtype_name, full, values="normal"):
    """gelu(x + bias) and its gradients by F.gelu and autograd. z = x + bias is rounded in the input's dtype
    (it is the op's own first step); gelu and the backward run in float64 and are rounded once, so the
    truth near the dtype's max is gelu's (z), not float32 F.gelu's overflow to inf."""
    x, bias, grad_out = P.op_inputs(shape, dtype_name, values=values)
    z = (x + bias).double().requires_grad_()
    out = F.gelu(z)
    (grad_z,) = torch.autograd.grad(out, z, grad_out.double())
    dtype = x.dtype
    grads = [grad_z.to(dtype), grad_z.reshape(-1, shape[-1]).sum(0).to(dtype)]
    meta = (tuple(shape), dtype_name, None)
    result = {"out": out.detach().to(dtype), "grads": grads,
              "fake": {"cpu": meta[:2] + ("cpu",), "cuda": meta[:2] + ("cuda",)},
              "table": {"CPU": "default backend kernel", "Meta": "kernel", "AutogradCPU": "autograd kernel"}}
    if full:
        result["opcheck"] = {k: "SUCCESS" for k in
                             ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")}
        result["compiled"] = (F.gelu(x + bias).sum(-1) * 2).detach()
    return result


def layout_problem(layout, shape) -> str | None:
    """The fake kernel's result against the real one on the same (non-contiguous) x: shape, dtype and the
    strides of every dim longer than 1 (none when the result is empty), the rule of torch's
    ``check_significant_strides``. The course checks this itself on every case: ``opcheck`` compares fake
    strides on CPU tensors only from torch 2.13 on."""
    if not isinstance(layout, dict) or not isinstance(layout.get("real"), list):
        return f"the grader could not read the real result's layout: {describe(layout)}"
    real, fake = layout["real"], layout.get("fake")
    on = f"on x of shape {tuple(shape)} with x's own strides (non-contiguous when it has 2 dims or more)"
    if not (isinstance(fake, list) and len(fake) == 3):
        return f"under FakeTensorMode {on} the op gives {describe(fake)}"
    (rs, rst, rd), (fs, fst, fd) = real, fake
    if not all(isinstance(v, list) and len(v) == len(rs) and all(type(n) is int for n in v) for v in (rs, rst, fst)):
        return f"the grader could not read the layouts: real {describe(real)}, fake {describe(fake)}"
    if fs != rs or fd != rd:
        return (f"under FakeTensorMode {on} the fake kernel gives shape {tuple(fs)}, dtype {fd}; "
                f"the real kernel returns shape {tuple(rs)}, dtype {rd}")
    numel = math.prod(rs)
    for dim, (size, a, b) in enumerate(zip(rs, rst, fst, strict=True)):
        if numel > 0 and size > 1 and a != b:
            return (f"under FakeTensorMode {on} the fake kernel gives strides {tuple(fst)}, the real kernel returns "
                    f"strides {tuple(rst)} (first difference at dim {dim}): the fake kernel must describe the "
                    f"tensor the kernel returns, strides included")
    return None


def op_label(shape, dtype_name, full, values="normal"):
    what = "values, gradients, fake kernel, dispatch table" + (", opcheck, torch.compile" if full else "")
    kind = "" if values == "normal" else f", {values} values"
    return f"x of shape {tuple(shape)} ({dtype_name}{kind}), bias of shape ({shape[-1]},): {what}"


class CustomOpExercise(Exercise):
    id, entry, points = "dispatch.custom_op", "define_op", 2
    title = "a custom operator with fake and autograd registrations"
    probe = "ptinternals.checks.probes.dispatch:check_custom_op"
    timeout_s = 90.0

    def visible_cases(self):
        return [Case(((4, 6), "float64", True), label="opcheck and torch.compile(fullgraph=True) on a 4x6 input"),
                Case(((2, 3, 5), "float32", False), label="a 3-d float32 input"),
                Case(((7,), "float64", False), label="a 1-d input")]

    boundary_classes = {
        "an empty x (a size-0 dim)": lambda c, e: 0 in c.args[0],
        "size-1 dims": lambda c, e: 1 in c.args[0],
        "a 1-d x": lambda c, e: len(c.args[0]) == 1,
        "a non-contiguous x": lambda c, e: not P.op_inputs(*c.args[:2], values=_values(c))[0].is_contiguous(),
        "values near the dtype's max": lambda c, e: _values(c) == "huge",
        "subnormal values": lambda c, e: _values(c) == "tiny",
        "NaN (gelu and its gradient stay NaN)": lambda c, e: _values(c) == "nan",
        "a large offset next to a small spread": lambda c, e: _values(c) == "offset",
        "saturated gelu (|z| >= 20)": lambda c, e: _values(c) == "saturated",
        "float32 and float64 (float64 here)": lambda c, e: c.args[1] == "float64",
        "opcheck and torch.compile on a float32 input": lambda c, e: c.args[2] and c.args[1] == "float32",
    }

    def hidden_cases(self):
        shapes = st.lists(st.sampled_from([0, 1, 2, 3, 5, 7]), min_size=1, max_size=3).map(tuple).filter(
            lambda s: s[-1] > 0)
        drawn = draw(st.tuples(shapes, st.sampled_from(["float32", "float64"])), 10)
        cases = [Case((s, d, False), label=op_label(s, d, False)) for s, d in drawn]
        special = [((4, 3), "float32", "huge"), ((2, 5), "float64", "huge"), ((3, 4), "float32", "tiny"),
                   ((6, 2), "float32", "nan"), ((2, 3, 4), "float32", "offset"), ((5, 3), "float64", "saturated")]
        cases += [Case((s, d, False, v), label=op_label(s, d, False, v)) for s, d, v in special]
        full = [((3, 5), "float32"), ((1, 2, 7), "float64")]
        return cases + [Case((s, d, True), label=op_label(s, d, True)) for s, d in full]

    def expected(self, case):
        return expected_custom_op(*case.args)

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        problem = close_tensors(got["out"], expected["out"], **({"atol": 0} if _values(case) == "tiny" else {}))
        if problem:
            return "fused_bias_gelu(x, bias) differs from F.gelu(x + bias):\n  " + problem
        if isinstance(got["grads"], str):
            return "backward failed: " + got["grads"]
        for name, g, e in zip(("x", "bias"), got["grads"], expected["grads"], strict=False):
            problem = close_tensors(g, e)
            if problem:
                return f"the gradient for {name} differs from autograd through F.gelu(x + bias):\n  {problem}"
        for device in ("cpu", "cuda"):
            g, e = got["fake"].get(device), expected["fake"][device]
            g = tuple(g) if isinstance(g, list) else g
            if g != e:
                return (f"under FakeTensorMode on {device!r} the op gives {describe(g)}\n"
                        f"  expected (shape, dtype, device) {e}")
        problem = layout_problem(got.get("layout"), case.args[0])
        if problem:
            return problem
        for key, kind in expected["table"].items():
            if got["table"].get(key) != kind:
                return f"the dispatch table entry for {key} is {got['table'].get(key)!r}, expected {kind!r}"
        if "opcheck" in expected:
            bad = {k: v for k, v in got.get("opcheck", {}).items() if v != "SUCCESS"}
            if bad or set(got.get("opcheck", {})) != set(expected["opcheck"]):
                return f"torch.library.opcheck failed: {describe(bad or got.get('opcheck'), 600)}"
            compiled = got.get("compiled")
            if isinstance(compiled, str):
                return "torch.compile(fullgraph=True) failed: " + compiled
            problem = close_tensors(compiled, expected["compiled"])
            if problem:
                return "the compiled function gives different values:\n  " + problem
        return None

    def diagnose(self, case, got, expected):
        if not isinstance(got, dict) or "fake" not in got:
            return None
        if isinstance(got["grads"], str):
            if "no autograd formula" in got["grads"] or "register_autograd" in got["grads"]:
                return "register the backward with op.register_autograd(backward, setup_context=setup_context)."
            if "invalid gradient at index 1" in got["grads"]:
                return "the gradient for bias must have bias's shape: sum grad_z over every dim but the last."
        if isinstance(got["grads"], list) and got["grads"] and isinstance(got["grads"][0], TensorInfo):
            x, bias, grad_out = P.op_inputs(*case.args[:2], values=_values(case))
            z = (x + bias).detach().requires_grad_()
            local = torch.autograd.grad(F.gelu(z).sum(), z)[0]  # dgelu/dz, without grad_out
            if close_tensors(got["grads"][0], local) is None and close_tensors(got["grads"][0], expected["grads"][0]):
                return "backward must multiply by grad_out (the chain rule): grad_z = grad_out * gelu'(z)."
        for device in ("cpu", "cuda"):
            g, e = got["fake"].get(device), expected["fake"][device]
            g = tuple(g) if isinstance(g, list) else g
            if isinstance(g, str) and "fake" in g.lower() and ("impl" in g or "register" in g):
                return "register a fake kernel with @op.register_fake: FakeTensorMode and torch.compile call it."
            if isinstance(g, tuple) and g != e:
                if g[0] != e[0]:
                    return "the fake kernel must return a tensor with the output's SHAPE (x's shape): " \
                           "torch.empty_like(x)."
                if g[1] != e[1]:
                    return "the fake kernel must return the output's DTYPE (x's dtype): torch.empty_like(x)."
            if isinstance(g, str) and "data" in g.lower():
                return "the fake kernel may only read shapes, dtypes and devices: it gets tensors without data."
        if isinstance(got.get("table"), dict) and got["table"].get("AutogradCPU") != "autograd kernel":
            return "register_autograd puts your backward at the Autograd key; without it there is no autograd kernel."
        return None


def _values(case: Case) -> str:
    return case.args[3] if len(case.args) > 3 else "normal"


# ================================================================================================
# dispatch.cpp_op the same operator with a C++ kernel
# ================================================================================================
BANNED_KERNEL_CALLS = ("aten.gelu.default", "aten.gelu.out", "aten.gelu_.default", "aten.gelu_backward.default")


class CppOpExercise(CustomOpExercise):
    id, entry, points = "dispatch.cpp_op", "FusedBiasGeluCpp", 2
    title = "the operator in C++: TORCH_LIBRARY, a CPU kernel, fake and autograd from Python"
    probe = "ptinternals.checks.probes.dispatch:check_cpp_op"
    timeout_s = 300.0  # one C++ build (about 10 s of g++, at most 180 s) and the cases

    def visible_cases(self):
        return [Case(((4, 6), "float64", True), label="opcheck and torch.compile(fullgraph=True) on a 4x6 input"),
                Case(((2, 3, 5), "float32", False), label="a 3-d float32 input")]

    def hidden_cases(self):
        shapes = [(0, 3), (1,), (7,), (3, 1, 4), (2, 5)]
        cases = [Case((s, d, False), label=op_label(s, d, False)) for s, d in zip(shapes, ["float32", "float64"] * 3)]
        special = [((4, 3), "float32", "huge"), ((2, 5), "float64", "huge"), ((3, 4), "float32", "tiny"),
                   ((6, 2), "float32", "nan"), ((2, 3, 4), "float32", "offset"), ((5, 3), "float64", "saturated")]
        cases += [Case((s, d, False, v), label=op_label(s, d, False, v)) for s, d, v in special]
        return cases + [Case(((3, 5), "float32", True), label=op_label((3, 5), "float32", True))]

    def expected(self, case):
        result = expected_custom_op(*case.args)
        result["table"] = {"CPU": "kernel", "Meta": "kernel", "AutogradCPU": "autograd kernel"}
        return result

    def compare(self, case, got, expected):
        if isinstance(got, dict) and "skipped" in got:
            from .probes.cpp_build import compiler_missing

            if compiler_missing() is None:  # this process can compile: so must the one that ran the case
                return f"the case was not run ({got['skipped']}), but this machine has a C++ compiler and ninja"
            return None
        if not isinstance(got, dict) or "origins" not in got:
            return f"the grader could not read your result: {describe(got)}"
        kind, origin = got["origins"].get("CPU", ("missing", ""))
        if origin != "your C++":
            return (f"the CPU kernel of fused_bias_gelu is a {kind!r} registered from {origin or 'nowhere'}, not a "
                    f"kernel compiled from your C++: register it with TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m)")
        called = [op for op in got.get("kernel_calls", []) if op in BANNED_KERNEL_CALLS]
        if called:
            return (f"your C++ kernel calls {', '.join(called)}: compute gelu in the kernel itself "
                    f"(0.5 * z * (1 + erf(z / sqrt(2))) per element)")
        return super().compare(case, got, expected)

    def summary(self, cases, results):
        skipped = {r["skipped"] for r in results if isinstance(r, dict) and "skipped" in r}
        return "\n".join(f"  SKIPPED: {why}: the C++ operator is built and graded only where g++ and ninja are "
                         f"installed (the course's machines have both)" for why in sorted(skipped)) or None

    def diagnose(self, case, got, expected):
        hint = self._diagnose(case, got, expected)
        if hint:  # the parent's hints name custom_op's API: here the registrations are torch.library's, into lib
            hint = hint.replace("op.register_autograd(backward, setup_context=setup_context)",
                                "torch.library.register_autograd(qualname, backward, setup_context=setup_context, "
                                "lib=lib)").replace("@op.register_fake", "torch.library.register_fake(qualname, "
                                                    "fake, lib=lib)").replace("torch.empty_like(x)", "x.new_empty(x.shape)")
        return hint

    def _diagnose(self, case, got, expected):
        from ..grading._runtime import Raised

        no_kernel = ("TORCH_LIBRARY only declares the schema: the kernel goes in its slot with "
                     "TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl(\"fused_bias_gelu\", &your_function); }.")
        if isinstance(got, Raised):
            return no_kernel if "with arguments from the 'CPU' backend" in got.message else None
        if not isinstance(got, dict) or "origins" not in got:
            return None
        if got["origins"].get("CPU", ("", ""))[1] != "your C++" or any(
                op in BANNED_KERNEL_CALLS for op in got.get("kernel_calls", [])):
            return None  # compare's message already says what is wrong, and the rest follows from it
        opcheck = got.get("opcheck") or {}
        if "strides included" in (layout_problem(got.get("layout"), case.args[0]) or "") or \
                "Stride mismatch" in str(opcheck.get("test_faketensor", "")):
            return ("the fake kernel must describe the tensor your C++ kernel returns, strides included: a "
                    "kernel that writes a fresh contiguous tensor (at::empty(x.sizes(), x.options())) needs "
                    "x.new_empty(x.shape), not torch.empty_like(x), which copies x's strides.")
        return super().diagnose(case, got, expected)


# ================================================================================================
# dispatch.memory_estimate memory estimate with FakeTensorMode
# ================================================================================================
MEM_KEYS = ("parameters", "gradients", "optimizer_state", "activations", "output_shape")


def _round(n: int, device: str) -> int:
    return 512 * ((n + 511) // 512) if device == "cuda" else n


def real_memory(spec, input_shape, input_dtype: str, device: str, run_on: str = "cpu", *,
                skip_parameters: bool = True) -> dict:
    """Bytes of one training step of a REAL run on ``run_on`` ("cpu", "meta" for huge models, or
    "cuda"), each storage rounded as ``device``'s allocator would. ``saved_sizes``: the bytes of each
    storage autograd saved (for diagnosis). ``skip_parameters=False`` gives the answer of a mistake: the
    parameters' storages counted as activations."""
    with torch.device(run_on):
        torch.manual_seed(0)
        model = P.memory_model(spec)
    dtype = getattr(torch, input_dtype)
    if dtype.is_floating_point:
        x = torch.randn(input_shape, dtype=dtype, device=run_on)
    else:
        x = torch.zeros(input_shape, dtype=dtype, device=run_on)
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    skip = {id(t.untyped_storage()) for t in (params if skip_parameters else []) + [x]}
    saved: dict[int, object] = {}

    def pack(t):
        s = t.untyped_storage()
        if id(s) not in skip:
            saved[id(s)] = s  # keep the storage object alive while we hold its id
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    activations = sum(_round(s.nbytes(), device) for s in saved.values())
    out.float().mean().backward()
    opt = torch.optim.AdamW(trainable, foreach=False)
    opt.step()
    state = [t for per_param in opt.state.values() for t in per_param.values()
             if isinstance(t, torch.Tensor) and t.dim() > 0]  # exp_avg, exp_avg_sq; not the 0-d step
    total = lambda ts: sum(_round(t.untyped_storage().nbytes(), device) for t in ts)  # noqa: E731
    return {"parameters": total(params), "gradients": total([p.grad for p in trainable]),
            "optimizer_state": total(state), "activations": activations, "output_shape": tuple(out.shape),
            "saved_sizes": sorted(_round(s.nbytes(), device) for s in saved.values())}


def _parameter_bytes(spec) -> list[int]:
    with torch.device("meta"):
        return [p.nbytes for p in P.memory_model(spec).parameters()]


BIG = 50_000_000  # parameters: above this, the truth runs on the meta device


def _n_params(spec) -> int:
    kind, *a = spec
    if kind == "mlp":
        d_in, d_h, d_out = a[:3]
        return d_in * d_h + d_h + d_h * d_out + d_out
    if kind == "lm":
        vocab, d = a[:2]
        return 2 * vocab * d + 2 * d
    if kind == "masked":
        d_in, d_h = a[:2]
        return d_in * d_h + d_h + d_h + 1
    c_in, c_mid, k = a[:3]
    return 2 * c_in * c_mid * k * k + c_in + c_mid


def mem_case(spec, input_shape, input_dtype="float32", device="cuda", label=""):
    kind, *a = spec
    if not label:
        frozen = " (first layer frozen)" if kind in ("mlp", "lm") and a[-1] else ""
        label = f"{kind} {tuple(a)}{frozen} on an input {tuple(input_shape)} {input_dtype}, {device} rules"
    return Case((spec, tuple(input_shape), input_dtype, device), label=label)


@st.composite
def mem_cases(draw_):
    dim = st.sampled_from([1, 3, 5, 16, 100, 257])
    device = draw_(st.sampled_from(["cuda", "cuda", "cpu"]))
    kind = draw_(st.sampled_from(["mlp", "mlp", "lm", "conv"]))
    if kind == "mlp":
        dtype = draw_(st.sampled_from(["float32", "bfloat16", "float64"]))
        spec = ("mlp", draw_(dim), draw_(dim), draw_(dim), dtype, draw_(st.booleans()))
        return mem_case(spec, (draw_(st.sampled_from([1, 2, 7, 32])), spec[1]), dtype, device)
    if kind == "lm":
        spec = ("lm", draw_(st.sampled_from([7, 50, 300])), draw_(st.sampled_from([4, 16, 48])), "float32",
                draw_(st.booleans()))
        return mem_case(spec, (draw_(st.sampled_from([1, 3])), draw_(st.sampled_from([1, 5, 33]))), "int64", device)
    c = draw_(st.sampled_from([1, 3]))
    spec = ("conv", c, draw_(st.sampled_from([2, 5])), draw_(st.sampled_from([1, 3])), "float32")
    size = draw_(st.sampled_from([4, 7, 9]))
    return mem_case(spec, (draw_(st.sampled_from([1, 2])), c, size, size), "float32", device)


class MemoryEstimateExercise(Exercise):
    id, entry, points = "dispatch.memory_estimate", "estimate_memory", 2
    title = "a training step's memory, estimated with FakeTensorMode"
    probe = "ptinternals.checks.probes.dispatch:estimate_memory_probe"
    timeout_s = 60.0
    withheld_from_students = ("diagnose",)  # it measures a real run with the answer's own saved-tensor hooks

    def visible_cases(self):
        return [mem_case(("mlp", 16, 64, 4, "float32", False), (8, 16), label="a small MLP on cuda"),
                mem_case(("mlp", 16, 64, 4, "float32", False), (8, 16), device="cpu", label="the same MLP on cpu"),
                mem_case(("mlp", 16, 64, 4, "float32", True), (8, 16), label="the first layer frozen"),
                mem_case(("lm", 50, 16, "float32", False), (2, 9), "int64", label="embedding -> layernorm -> head"),
                mem_case(("mlp", 8192, 32768, 8192, "bfloat16", False), (4, 8192), "bfloat16",
                         label="a bf16 MLP with 537 M parameters (1 GiB): it does not fit here, so fake it")]

    boundary_classes = {
        "a storage of exactly 512 bytes under cuda rules": lambda c, e: c.args[3] == "cuda" and 512 in _parameter_bytes(
            c.args[0]),
        "a storage one float short of 512 bytes (508)": lambda c, e: c.args[3] == "cuda" and 508 in _parameter_bytes(
            c.args[0]),
        "a storage one float past 512 bytes (516)": lambda c, e: c.args[3] == "cuda" and 516 in _parameter_bytes(
            c.args[0]),
        "an empty batch (storages of 0 bytes)": lambda c, e: 0 in c.args[1],
        "a batch of one": lambda c, e: c.args[1][0] == 1,
        "a frozen layer (no gradient, no optimizer state)": lambda c, e: c.args[0][0] in ("mlp", "lm") and c.args[0][-1],
        "bfloat16 parameters": lambda c, e: "bfloat16" in c.args[0],
        "float64 parameters": lambda c, e: "float64" in c.args[0],
        "token ids (an int64 input)": lambda c, e: c.args[2] == "int64",
        "cpu rules (no rounding)": lambda c, e: c.args[3] == "cpu",
        "a conv net": lambda c, e: c.args[0][0] == "conv",
        "a storage one byte past 512 (a 513-element bool mask)": lambda c, e: c.args[3] == "cuda" and (
            c.args[0][0] == "masked" and c.args[1][0] * c.args[0][2] == 513),
        "a model too big for this machine (the truth runs on meta)": lambda c, e: _n_params(c.args[0]) > BIG,
    }

    def hidden_cases(self):
        big = [mem_case(("mlp", 4096, 16384, 4096, "float32", True), (16, 4096)),
               mem_case(("lm", 50257, 4096, "float32", False), (2, 1024), "int64")]
        edges = [mem_case(("mlp", 16, 8, 1, "float32", False), (4, 16)),    # weight: 16*8 floats = 512 bytes
                 mem_case(("mlp", 1, 127, 2, "float32", False), (3, 1)),    # 127 floats = 508 bytes
                 mem_case(("mlp", 1, 129, 1, "float32", True), (1, 1)),     # 129 floats = 516 bytes
                 mem_case(("mlp", 16, 8, 4, "float32", False), (0, 16)),    # no rows: activations of 0 bytes
                 mem_case(("mlp", 3, 5, 2, "float64", True), (2, 3), "float64", "cpu"),
                 mem_case(("masked", 1, 513, "float32"), (1, 1))]  # masked_fill saves a bool mask of 513 bytes
        return edges + draw(mem_cases(), 24) + big

    def expected(self, case):
        spec, input_shape, input_dtype, device = case.args
        run_on = "meta" if _n_params(spec) > BIG else "cpu"
        if run_on == "cpu" and device == "cuda" and torch.cuda.is_available():
            run_on = "cuda"  # a real run on the GPU (same storages, real CUDA kernels)
        return real_memory(spec, input_shape, input_dtype, device, run_on)

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"expected a dict with keys {list(MEM_KEYS)}, got {describe(got)}"
        missing = [k for k in MEM_KEYS if k not in got]
        if missing:
            return f"the dict lacks {missing}; expected keys {list(MEM_KEYS)}"
        for k in MEM_KEYS:
            g = tuple(got[k]) if k == "output_shape" and isinstance(got[k], list) else got[k]
            problem = same_value(g, expected[k])
            if problem:
                return f"{k}: {problem}\n  all expected: {describe({k: expected[k] for k in MEM_KEYS}, 300)}"
        return None

    def diagnose(self, case, got, expected):
        spec, input_shape, input_dtype, device = case.args
        if not isinstance(got, dict) or any(not isinstance(got.get(k), int) for k in MEM_KEYS[:4]):
            return None
        run_on = "meta" if _n_params(spec) > BIG else "cpu"
        if device == "cuda":
            unrounded = real_memory(spec, input_shape, input_dtype, "cpu", run_on)
            if all(got[k] == unrounded[k] for k in MEM_KEYS[:4]) and any(got[k] != expected[k] for k in MEM_KEYS[:4]):
                return ("on 'cuda' every storage takes a multiple of 512 bytes (the caching allocator rounds each "
                        "request up): round each tensor's bytes before adding them.")
        if got["gradients"] == expected["parameters"] != expected["gradients"]:
            return "only parameters with requires_grad=True get a .grad (and optimizer state): a frozen layer has none."
        if got["optimizer_state"] * 2 == expected["optimizer_state"] > 0:
            return "AdamW keeps TWO tensors per trainable parameter: exp_avg and exp_avg_sq."
        if got["activations"] != expected["activations"]:
            mistake = real_memory(spec, input_shape, input_dtype, device, run_on, skip_parameters=False)
            if got["activations"] == mistake["activations"]:
                return ("leave out the parameters' storages (a saved weight.t() is a view of the parameter) and the "
                        "input's: they exist anyway, whatever autograd saves.")
            if len(expected["saved_sizes"]) > 1 and got["activations"] in expected["saved_sizes"]:
                return ("your activations are the bytes of ONE saved storage: fake storages all have data_ptr() 0, "
                        "so tell them apart by id(t.untyped_storage()) and keep them alive while you hold their ids.")
        return None


EXERCISES = [TensorKeys(), DispatchPath(), FlopCounterExercise(), GraphTracerExercise(), Int8TensorExercise(),
             CustomOpExercise(), CppOpExercise(), MemoryEstimateExercise()]
CHAPTER = Chapter("dispatch", exercises=EXERCISES, sandbox_files=("dispatch/scaffold.py",),
                  policy_allow=("_overloadpacket", "_scaled_dot_product_flash_attention_for_cpu",
                                "_scaled_dot_product_flash_attention_for_cpu_backward", "_make_wrapper_subclass",
                                "_C._disabled_torch_function_impl"))
