"""Which kernels run for one operator call: a model of the dispatcher loop.

Mirrors ``aten/src/ATen/core/dispatch/Dispatcher.h`` (``Dispatcher::call`` computes the key set,
``redispatch`` reuses a narrowed one) and ``DispatchKeyExtractor.h`` ``computeDispatchKeySet``::

    ks = ((key sets of the tensor arguments, OR-ed) | tls.included) - tls.excluded
    ks = ks & op.nonFallthroughKeys        # fallthrough kernels are never called
    kernel = op.table[ks.highestPriorityTypeId()]

and then what each kind of kernel does next, as written in PyTorch:

- PythonDispatcher / PreDispatch / PythonTLSSnapshot / Conjugate / Negative / ZeroTensor fallbacks
  redispatch to ``ks & FULL_AFTER(key)`` (PythonFallbackKernel.cpp, ConjugateFallback.cpp);
- an Autograd kernel (``VariableType``) records the graph if GradMode is on, then under
  ``AutoDispatchBelowADInplaceOrView`` redispatches ``ks & after_autograd_keyset``;
  a CompositeImplicitAutograd kernel ("math kernel") instead *decomposes*: it calls other ops;
- ADInplaceOrView bumps the version counter / sets up the view, then ``ks & after_ADInplaceOrView``;
- an Autocast kernel casts its inputs and calls the op *again from the top* with its own key
  excluded (autocast_mode.h ``WrapFunction_``);
- the Functionalize fallback unwraps FunctionalTensorWrappers and calls again with Functionalize excluded;
- Python (``pythonFallback``) excludes every key above Python and hands the call to the innermost
  TorchDispatchMode, else to the first tensor subclass; their ``func(*args)`` is a fresh call;
- BackendSelect (factory functions) computes the backend from ``device=`` and redispatches to it;
- a backend kernel (CPU, CUDA, Meta, ...) computes the result. The path ends.

``predict_dispatch`` returns the keys whose kernels run, in order; ``explain_dispatch`` the same with the
key set and what each kernel did. Both check against real PyTorch in ``tests/dispatch``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .keys import (
    AFTER_AD_INPLACE_OR_VIEW_KEYSET,
    AFTER_AUTOGRAD_KEYSET,
    AFTER_PYTHON_KEYSET,
    AUTOGRAD_WITH_AD_INPLACE_OR_VIEW,
    BACKENDS,
    FUNCTIONALITY_KEYS,
    PYTHON_KS,
    RUNTIME_KEYS,
    DispatchKeySet,
    LocalDispatchKeySet,
    backend_of_device,
    tensor_key_set,
    tls_key_sets,
)
from .operator_entry import MODELLED_KEYS, Kernel, dispatch_table_from_torch, non_fallthrough_keys

MODE_KINDS = ("python", "fake")  # a plain TorchDispatchMode that calls func(*args); FakeTensorMode
SUBCLASS_KINDS = ("wrapper", "fake")  # a wrapper subclass that unwraps; FakeTensor
MAX_STEPS = 64

_REDISPATCH_BELOW_ITSELF = ("PythonDispatcher", "PreDispatch", "PythonTLSSnapshot", "Conjugate", "Negative",
                            "ZeroTensor", "FuncTorchDynamicLayerBackMode", "Tracer")
_BACKEND_FUNCTIONALITIES = ("Dense", "Quantized", "Sparse", "SparseCsr", "NestedTensor",
                            "FPGA", "Vulkan", "Metal", "CustomRNGKeyId", "MkldnnCPU")


@dataclass(frozen=True)
class TensorDesc:
    """What the dispatcher sees of a tensor argument. ``requires_grad`` is kept for the reader: it
    changes nothing in the key set (every non-inference tensor carries its Autograd key)."""

    device: str = "cpu"
    requires_grad: bool = False
    inference: bool = False       # created under torch.inference_mode()
    subclass: str | None = None   # None, "wrapper" (a _make_wrapper_subclass) or "fake" (FakeTensor)
    functional: bool = False      # a FunctionalTensorWrapper (torch._to_functional_tensor)
    functionality: str = "Dense"  # "Dense", "Sparse", "SparseCsr", "Quantized", "NestedTensor"

    def __post_init__(self):
        backend_of_device(self.device)  # validates
        for name in ("requires_grad", "inference", "functional"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.subclass is not None and self.subclass not in SUBCLASS_KINDS:
            raise ValueError(f"subclass must be None or one of {SUBCLASS_KINDS}, got {self.subclass!r}")

    def key_set(self) -> DispatchKeySet:
        return tensor_key_set(self.device, functionality=self.functionality, inference=self.inference,
                              python=self.subclass is not None, functional=self.functional)

    @classmethod
    def from_tensor(cls, t) -> "TensorDesc":
        """Describe a real ``torch.Tensor`` (its device, inference flag, subclass, functional wrapper)."""
        import torch

        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
        from torch._subclasses.fake_tensor import FakeTensor

        subclass = None
        if isinstance(t, FakeTensor):
            subclass = "fake"
        elif type(t) not in (torch.Tensor, torch.nn.Parameter) and torch._C._dispatch_keys(t).has(
                torch._C.DispatchKey.Python):
            subclass = "wrapper"
        layout = {torch.sparse_coo: "Sparse", torch.sparse_csr: "SparseCsr"}.get(t.layout, "Dense")
        if t.is_quantized:
            layout = "Quantized"
        if t.is_nested:
            layout = "NestedTensor"
        return cls(device=t.device.type, requires_grad=t.requires_grad, inference=t.is_inference(),
                   subclass=subclass, functional=torch._is_functional_tensor(t), functionality=layout)

    @classmethod
    def coerce(cls, x, name: str = "tensor") -> "TensorDesc":
        if isinstance(x, TensorDesc):
            return x
        if isinstance(x, str):
            return cls(device=x)
        if isinstance(x, dict):
            unknown = set(x) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"{name} has unknown fields {sorted(unknown)}; "
                                 f"known: {list(cls.__dataclass_fields__)}")
            return cls(**x)
        try:
            import torch

            if isinstance(x, torch.Tensor):
                return cls.from_tensor(x)
        except ImportError:  # pragma: no cover
            pass
        raise TypeError(f"{name} must be a TensorDesc, a device string, a dict or a torch.Tensor, "
                        f"got {type(x).__name__}")


@dataclass(frozen=True)
class DispatchStep:
    key: str       # the runtime key whose kernel ran
    kind: str      # where that kernel came from ("kernel", "autograd kernel", "backend fallback", ...)
    key_set: str   # the dispatch key set it was picked from (after TLS and fallthrough masking)
    action: str    # what the kernel did next


class DispatchError(NotImplementedError):
    """Raised where PyTorch raises ``NotImplementedError: Could not run '...' with arguments from ...``."""


def _coerce_table(op: str, table) -> dict[str, Kernel]:
    if table is None:
        return dispatch_table_from_torch(op)
    if not isinstance(table, dict):
        raise TypeError(f"table must be a dict {{runtime key: kind}}, got {type(table).__name__}")
    out = {}
    for key, value in table.items():
        if key not in RUNTIME_KEYS:
            raise ValueError(f"table key {key!r} is not a runtime dispatch key")
        if isinstance(value, Kernel):
            out[key] = value
        elif value == "fallthrough":
            out[key] = Kernel("backend fallback", True)
        elif isinstance(value, str):
            out[key] = Kernel(value, False)
        elif isinstance(value, tuple) and len(value) == 2:
            out[key] = Kernel(str(value[0]), bool(value[1]))
        else:
            raise TypeError(f"table[{key!r}] must be a kind string, 'fallthrough', a (kind, fallthrough) "
                            f"pair or a Kernel, got {value!r}")
    return out


def _coerce_modes(modes) -> tuple[str, ...]:
    if isinstance(modes, int) and not isinstance(modes, bool):
        if modes < 0:
            raise ValueError(f"modes must be >= 0 when an int, got {modes}")
        return ("python",) * modes
    if isinstance(modes, str):
        modes = (modes,)
    if not isinstance(modes, (tuple, list)):
        raise TypeError(f"modes must be an int or a sequence of {MODE_KINDS} (outermost first), "
                        f"got {modes!r}")
    for m in modes:
        if m not in MODE_KINDS:
            raise ValueError(f"modes entries must be one of {MODE_KINDS}, got {m!r}")
    return tuple(modes)


class _Dispatcher:
    def __init__(self, op: str, table: dict[str, Kernel], factory_device: str | None):
        self.op, self.table, self.factory_device = op, table, factory_device
        self.steps: list[DispatchStep] = []

    # Dispatcher::call - a fresh call computes the key set from the arguments and the TLS
    def call(self, tensors: tuple[TensorDesc, ...], tls: LocalDispatchKeySet, modes: tuple[str, ...]):
        ks = DispatchKeySet()
        for t in tensors:
            ks = ks | t.key_set()
        ks = tls.apply(ks)
        ks = ks & non_fallthrough_keys(self.table, ks.highest_backend())
        self.redispatch(ks, tensors, tls, modes)

    def _missing(self, key: str):
        available = [k for k in DispatchKeySet([k for k in self.table if k != "Undefined"])
                     if k in self.table]
        raise DispatchError(
            f"Could not run '{self.op}' with arguments from the '{key}' backend. This could be because the "
            f"operator doesn't exist for this backend. '{self.op}' is only available for these backends: "
            f"[{', '.join(available)}].")

    def redispatch(self, ks: DispatchKeySet, tensors, tls: LocalDispatchKeySet, modes):
        if len(self.steps) >= MAX_STEPS:
            raise RuntimeError(f"dispatch of {self.op} did not finish within {MAX_STEPS} kernels")
        key = ks.highest_priority_key()
        kernel = self.table.get(key)
        if kernel is None:
            self._missing(key)
        if kernel.fallthrough:  # only reachable via a hand-built redispatch set: skip it like the mask would
            return self.redispatch(ks.remove(key), tensors, tls, modes)
        functionality = FUNCTIONALITY_KEYS[RUNTIME_KEYS[key][0]]

        def step(action: str):
            self.steps.append(DispatchStep(key, kernel.kind, str(ks), action))

        if key in _REDISPATCH_BELOW_ITSELF:
            step(f"redispatch to ks & FULL_AFTER({key})")
            return self.redispatch(ks & DispatchKeySet.full_after(key), tensors, tls, modes)
        if key.startswith("Autocast"):
            step(f"cast inputs, call the op again with {key} excluded")
            return self.call(tensors, tls.exclude(DispatchKeySet([key])), modes)
        if functionality in ("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor"):
            if kernel.kind == "ambiguous autogradother":
                raise DispatchError(f"{self.op}: ambiguous autogradother kernel at {key}")
            if kernel.kind in ("math kernel", "nested kernel"):
                step("CompositeImplicitAutograd: decompose into other ops (each dispatched afresh)")
                return
            step("record the autograd graph (if GradMode is on), redispatch to ks & after_autograd_keyset")
            return self.redispatch(ks & AFTER_AUTOGRAD_KEYSET, tensors,
                                   tls.exclude(AUTOGRAD_WITH_AD_INPLACE_OR_VIEW), modes)
        if key == "ADInplaceOrView":
            step("bump the version counter / set up the view, "
                 "redispatch to ks & after_ADInplaceOrView_keyset")
            return self.redispatch(ks & AFTER_AD_INPLACE_OR_VIEW_KEYSET, tensors,
                                   tls.exclude(DispatchKeySet(["ADInplaceOrView"])), modes)
        if key == "Functionalize":
            if kernel.kind != "backend fallback":
                step("generated functionalization kernel: calls the functional/view_copy variant op")
                return
            step("unwrap FunctionalTensorWrappers, call again with Functionalize excluded")
            inner = tuple(replace(t, functional=False) for t in tensors)
            return self.call(inner, tls.exclude(DispatchKeySet(["Functionalize"])), modes)
        if key == "Python":
            return self._python(ks, tensors, tls, modes, step)
        if key == "BackendSelect":
            device = self.factory_device or "cpu"
            step(f"compute the backend from device={device!r}, redispatch to it")
            backend_ks = DispatchKeySet([backend_of_device(device)])
            for t in tensors:
                backend_ks = backend_ks | t.key_set()
            backend_ks = backend_ks & DispatchKeySet.full_after("BackendSelect")
            return self.redispatch(backend_ks, tensors, tls, modes)
        if functionality in _BACKEND_FUNCTIONALITIES or key == "Undefined":
            if key == "Meta" and kernel.kind == "backend fallback":
                raise DispatchError(f"{self.op}: attempted to run this operator with Meta tensors, but there "
                                    f"was no fake impl or Meta kernel registered.")
            step("decompose into other ops" if kernel.kind == "math kernel" else "compute the result")
            return
        raise ValueError(f"key {key!r} is outside this model "
                         f"(functorch, tracer and testing keys are not modelled)")

    def _python(self, ks, tensors, tls: LocalDispatchKeySet, modes, step):
        tls = tls.exclude(AFTER_PYTHON_KEYSET)  # pythonFallback: ExcludeDispatchKeyGuard(after_Python_keyset)
        if modes:  # the innermost mode handles it, popped off the stack while it runs
            mode, rest = modes[-1], modes[:-1]
            if not rest:
                tls = tls.uninclude(PYTHON_KS)
            if mode == "fake":
                for i, t in enumerate(tensors):
                    if t.subclass != "fake":
                        raise ValueError(f"tensors[{i}]: FakeTensorMode needs FakeTensor inputs "
                                         f"(subclass='fake'), got {t}")
                step("FakeTensorMode.__torch_dispatch__: run the op's meta kernel "
                     "(Meta in TLS, torch dispatch off)")
                inner_tls = tls.exclude(PYTHON_KS).include(DispatchKeySet(["Meta"]))
                return self.call(tensors, inner_tls, rest)
            step("TorchDispatchMode.__torch_dispatch__ (mode popped), calls func(*args)")
            return self.call(tensors, tls, rest)
        owner = next((t for t in tensors if t.subclass is not None), None)
        if owner is None:  # no mode and no Python tensor: drop the key and carry on (pytorch#136565)
            step("no mode and no subclass: redispatch without Python")
            no_python = tls.uninclude(DispatchKeySet(["Python"]))
            return self.redispatch(ks.remove("Python"), tensors, no_python, modes)
        if owner.subclass == "fake":
            step("FakeTensor.__torch_dispatch__: enter its FakeTensorMode, call func(*args)")
            return self.call(tensors, tls.include(PYTHON_KS), ("fake",))
        step("wrapper subclass __torch_dispatch__: unwrap, call func(*inner tensors)")
        inner = tuple(replace(t, subclass=None) if t.subclass == "wrapper" else t for t in tensors)
        return self.call(inner, tls, modes)


def explain_dispatch(op, *tensors, table=None, modes=(), grad_mode: bool = True, inference_mode: bool = False,
                     autocast=None, factory_device: str | None = None) -> list[DispatchStep]:
    """Every kernel that runs for ``op(*tensors)``, with its key set and what it did next.

    ``tensors``: TensorDesc, device strings (``"cpu"``), dicts of TensorDesc fields, or real tensors.
    ``table``: ``{runtime key: kind}`` (kind ``"fallthrough"`` for a fallthrough); by default the real
    table of ``op`` read from torch. ``modes``: active TorchDispatchModes, outermost first, each
    ``"python"`` or ``"fake"`` (or an int: that many plain modes). ``autocast``: ``None``, ``"cpu"``,
    ``"cuda"`` or a tuple. ``factory_device``: the ``device=`` of a factory function (BackendSelect)."""
    if not isinstance(op, str):
        from .operator_entry import _qualified

        op = _qualified(op)
    if "::" not in op:
        raise ValueError(f"op must be qualified with its namespace, like 'aten::add.Tensor', got {op!r}")
    if factory_device is not None:
        backend_of_device(factory_device)
    descs = tuple(TensorDesc.coerce(t, f"tensors[{i}]") for i, t in enumerate(tensors))
    modes = _coerce_modes(modes)
    tls = tls_key_sets(grad_mode=grad_mode, inference_mode=inference_mode, autocast=autocast,
                       python_modes=len(modes))
    d = _Dispatcher(op, _coerce_table(op, table), factory_device)
    d.call(descs, tls, modes)
    return d.steps


def predict_dispatch(op, *tensors, table=None, modes=(), grad_mode: bool = True, inference_mode: bool = False,
                     autocast=None, factory_device: str | None = None) -> list[str]:
    """The ordered list of dispatch keys whose kernels run for ``op(*tensors)``.

    >>> predict_dispatch("aten::add.Tensor", "cpu", "cpu")
    ['AutogradCPU', 'CPU']
    >>> predict_dispatch("aten::add.Tensor", "cpu", "cpu", inference_mode=True)
    ['CPU']
    >>> predict_dispatch("aten::mm", "cpu", "cpu", autocast="cpu", modes=["python"])  # autocast calls again
    ['PythonTLSSnapshot', 'AutocastCPU', 'PythonTLSSnapshot', 'AutogradCPU', 'Python', 'CPU']
    """
    return [s.key for s in explain_dispatch(op, *tensors, table=table, modes=modes, grad_mode=grad_mode,
                                            inference_mode=inference_mode, autocast=autocast,
                                            factory_device=factory_device)]


def dispatch_path(tensors, *, fallthrough=(), modes=(), grad_mode: bool = True, inference_mode: bool = False,
                  autocast=None, factory_device: str | None = None) -> list[str]:
    """``predict_dispatch`` for an operator that has a kernel at every key this chapter follows, a
    fallthrough at each key of ``fallthrough`` (like the chapter's probe operators), and an autograd
    kernel (not a decomposition) at the Autograd keys; ``PythonTLSSnapshot`` left out of the path (the
    probes cannot observe it). ``tensors``: a list of tensor descriptions (dicts of TensorDesc fields)."""
    if isinstance(fallthrough, str) or not all(isinstance(k, str) for k in fallthrough):
        raise TypeError(f"fallthrough must be a collection of key names, got {fallthrough!r}")
    table = {key: "fallthrough" if key in fallthrough else
             "autograd kernel" if key.startswith("Autograd") else "kernel"
             for key in MODELLED_KEYS if key != "Undefined"}
    path = predict_dispatch("ptinternals_probe::op", *tensors, table=table, modes=modes, grad_mode=grad_mode,
                            inference_mode=inference_mode, autocast=autocast, factory_device=factory_device)
    return [key for key in path if key != "PythonTLSSnapshot"]


__all__ = ["TensorDesc", "DispatchStep", "DispatchError", "explain_dispatch", "predict_dispatch", "dispatch_path", "BACKENDS"]
