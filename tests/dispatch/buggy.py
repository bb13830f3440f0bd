"""Known-buggy implementations of the dispatch chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make; the test also checks that the failure message names a
likely cause where the checker has one (``expect`` words). Each source replaces the whole answer cell.
"""

_KEYS_OK = '''
def tensor_keys(device="cpu", *, requires_grad=False, inference=False, subclass=None, functional=False,
                conj=False, sparse=False):
    backend = BACKEND_OF_DEVICE[device]
    keys = {{"Sparse" + backend if sparse else backend}}
    {autograd}
    {autocast}
    if subclass is not None:
        keys |= {python}
    if functional:
        keys.add("Functionalize")
    if conj:
        keys.add("Conjugate")
    return sorted(keys)
'''


def _keys(autograd='if not inference:\n        keys |= {"ADInplaceOrView", "Autograd" + backend}',
          autocast='if backend in ("CPU", "CUDA"):\n        keys.add("Autocast" + backend)',
          python='{"Python", "PythonTLSSnapshot"}'):
    return _KEYS_OK.format(autograd=autograd, autocast=autocast, python=python)


# The correct dispatch_path, with hooks the bugs below replace.
_PATH = '''
def dispatch_path(tensors, *, fallthrough=(), modes=(), grad_mode=True, inference_mode=False, autocast=None,
                  factory_device=None):
    rank = {key: i for i, key in enumerate(KEY_PRIORITY)}
    autograd_keys = {"AutogradCPU", "AutogradCUDA", "AutogradMeta"}
    above_python = {k for k in KEY_PRIORITY if rank[k] < rank["Python"]}
    path = []

    def call(tensors, included, excluded, modes):
        ks = set(included)
        for t in tensors:
            ks |= set(tensor_keys(**t))
        run(ks - excluded - FALLTHROUGH, tensors, included, excluded, modes)

    def run(ks, tensors, included, excluded, modes):
        key = min(ks, key=rank.__getitem__)
        if key != "PythonTLSSnapshot":
            path.append(key)
        if key in ("PythonTLSSnapshot", "ADInplaceOrView") or key in autograd_keys:
            return run({k for k in ks if rank[k] > rank[key]}, tensors, included, excluded, modes)
        if key.startswith("Autocast"):
            return call(tensors, included, excluded | {key}, modes)
        if key == "BackendSelect":
            return run({BACKEND_OF_DEVICE[factory_device or "cpu"]}, tensors, included, excluded, modes)
        if key != "Python":
            return
        EXCLUDE_ABOVE_PYTHON
        if modes:
            mode, rest = modes[-1], modes[:-1]
            if not rest:
                included = included - {"Python", "PythonTLSSnapshot"}
            if mode == "fake":
                FAKE
            MODE_CALL
        owners = [t["subclass"] for t in tensors if t.get("subclass")]
        if not owners:
            return run(ks - {"Python"}, tensors, included, excluded, modes)
        if owners[0] == "fake":
            return call(tensors, included | {"Python", "PythonTLSSnapshot"}, excluded, ["fake"])
        inner = [dict(t, subclass=None) if t.get("subclass") == "wrapper" else t for t in tensors]
        return call(inner, included, excluded, modes)

    included, excluded = {"BackendSelect", "ADInplaceOrView"}, {"AutocastCPU", "AutocastCUDA"}
    if autocast is not None:
        excluded = excluded - {"Autocast" + BACKEND_OF_DEVICE[autocast]}
    if inference_mode:
        included = included - {"ADInplaceOrView"}
        INFERENCE_EXCLUDE
    NO_GRAD
    if modes:
        included = included | {"Python", "PythonTLSSnapshot"}
    call(tensors, included, excluded, list(modes))
    return path
'''
_PATH_HOOKS = {
    "FALLTHROUGH": "set(fallthrough)",
    "EXCLUDE_ABOVE_PYTHON": "excluded = excluded | above_python",
    "FAKE": 'return call(tensors, included | {"Meta"}, excluded | {"Python", "PythonTLSSnapshot"}, rest)',
    "MODE_CALL": "return call(tensors, included, excluded, rest)",
    "INFERENCE_EXCLUDE": "excluded = excluded | autograd_keys",
    "NO_GRAD": "pass",
}


def _path(**hooks):
    src = _PATH
    for name, default in _PATH_HOOKS.items():
        src = src.replace(name, hooks.get(name, default))
    return src


_FLOPS = '''
class FlopCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        SKIP
        self.total += self.flops(func._overloadpacket, args, out)
        return out

    @staticmethod
    def flops(packet, args, out):
        if packet is aten.mm or packet is aten.addmm:
            a, b = ADDMM_ARGS if packet is aten.addmm else args[:2]
            (m, k), n = a.shape, b.shape[1]
            return FACTOR * m * k * n
        if packet is aten.bmm or packet is aten.baddbmm:
            a, b = args[1:3] if packet is aten.baddbmm else args[:2]
            (batch, m, k), n = a.shape, b.shape[2]
            return FACTOR * batch * m * k * n
        if packet is aten.convolution:
            x, w = args[0], args[1]
            c_out, c_in_per_group, *kernel = w.shape
            return FACTOR * x.shape[0] * c_out * c_in_per_group * math.prod(kernel) * math.prod(out.shape[2:])
        if packet is ATTENTION:
            q, k, v = args[:3]
        elif packet is ATTENTION_BACKWARD:
            q, k, v = args[1:4]
        else:
            return 0
        b, h, s_q, d = q.shape
        s_k, d_v = k.shape[2], v.shape[3]
        if packet is ATTENTION:
            return FACTOR * b * h * s_q * s_k * (d + d_v)
        return FACTOR * b * h * s_q * s_k * BACKWARD_TERMS
'''
_FLOPS_HOOKS = {"SKIP": "pass", "ADDMM_ARGS": "args[-2:]", "FACTOR": "2",
                "ATTENTION_BACKWARD": "aten._scaled_dot_product_flash_attention_for_cpu_backward",
                "ATTENTION": "aten._scaled_dot_product_flash_attention_for_cpu",
                "BACKWARD_TERMS": "(3 * d + 2 * d_v)"}


def _flops(**hooks):
    src = _FLOPS
    for name, default in _FLOPS_HOOKS.items():  # ATTENTION_BACKWARD before ATTENTION
        src = src.replace(name, hooks.get(name, default))
    return src


_TRACER = '''
class GraphTracer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.nodes = []
        self._ref_of = REF_TABLE

    def placeholder(self, t, name):
        self.nodes.append((name, "placeholder", (), {}))
        KEEP_PLACEHOLDER
        self._ref_of[KEY(t)] = Ref(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        SKIP
        name = f"{func._overloadpacket.__name__}_{len(self.nodes)}"
        self.nodes.append((name, func, tree_map(self._ref, args), KWARGS))
        if isinstance(out, torch.Tensor):
            self._ref_of[KEY(out)] = Ref(name)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    self._ref_of[KEY(o)] = Ref(name, INDEX)
        return out

    def _ref(self, x):
        if not isinstance(x, torch.Tensor):
            return x
        REFS_OFF
        if KEY(x) not in self._ref_of:
            name = f"const_{len(self.nodes)}"
            self.nodes.append((name, "constant", (x,), {}))
            self._ref_of[KEY(x)] = Ref(name)
        return self._ref_of[KEY(x)]

    def output(self, *values):
        self.nodes.append(("output", "output", tuple(self._ref(v) for v in values), {}))
'''
_TRACER_HOOKS = {"REF_TABLE": "WeakIdKeyDictionary()", "KEEP_PLACEHOLDER": "pass", "KEY": "", "SKIP": "pass",
                 "KWARGS": "tree_map(self._ref, kwargs)", "INDEX": "i", "REFS_OFF": "pass"}


def _tracer(**hooks):
    src = _TRACER
    for name, default in _TRACER_HOOKS.items():
        src = src.replace(name, hooks.get(name, default))
    return src


_INT8 = '''
class Int8Tensor(torch.Tensor):
    @staticmethod
    def __new__(cls, int_data, scale):
        return torch.Tensor._make_wrapper_subclass(cls, int_data.shape, dtype=LOGICAL_DTYPE, device=int_data.device)

    def __init__(self, int_data, scale):
        self.int_data, self.scale = int_data, scale

    @classmethod
    def quantize(cls, w):
        scale = SCALE
        codes = CODES
        return cls(codes, scale)

    def dequantize(self):
        return self.int_data.to(self.scale.dtype) * (self.scale[:, None] if self.scale.dim() else self.scale)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if DETACH:
            return cls(args[0].int_data, args[0].scale)
        plain = lambda x: x.dequantize() if isinstance(x, Int8Tensor) else x
        return func(*tree_map(plain, args), **tree_map(plain, kwargs))
'''
_INT8_HOOKS = {"LOGICAL_DTYPE": "scale.dtype", "SCALE": "w.abs().amax(dim=1) / 127",
               "CODES": "torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)",
               "DETACH": "func is aten.detach.default"}


def _int8(**hooks):
    src = _INT8
    for name, default in _INT8_HOOKS.items():
        src = src.replace(name, hooks.get(name, default))
    return src


_OP = '''
def define_op(namespace):
    inv_sqrt2, inv_sqrt_2pi = 1 / math.sqrt(2), 1 / math.sqrt(2 * math.pi)

    @torch.library.custom_op(f"{namespace}::fused_bias_gelu", mutates_args=())
    def fused_bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        z = x + bias
        return FORWARD

    FAKE_DECORATOR
    def _(x, bias):
        return FAKE_RESULT

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad_out):
        x, bias = ctx.saved_tensors
        z = x + bias
        grad_z = grad_out * (0.5 * (1 + torch.erf(z * inv_sqrt2)) + z * torch.exp(-0.5 * z * z) * inv_sqrt_2pi)
        return grad_z, GRAD_BIAS

    REGISTER_AUTOGRAD
    return fused_bias_gelu
'''
_OP_HOOKS = {"FORWARD": "0.5 * z * (1 + torch.erf(z * inv_sqrt2))", "FAKE_DECORATOR": "@fused_bias_gelu.register_fake",
             "FAKE_RESULT": "torch.empty_like(x)", "GRAD_BIAS": "grad_z.reshape(-1, grad_z.shape[-1]).sum(0)",
             "REGISTER_AUTOGRAD": "fused_bias_gelu.register_autograd(backward, setup_context=setup_context)"}


def _op(**hooks):
    src = _OP
    for name, default in _OP_HOOKS.items():
        src = src.replace(name, hooks.get(name, default))
    return src


_MEM = '''
def estimate_memory(model_fn, input_shape, input_dtype=torch.float32, device="cuda"):
    def nbytes(storage):
        n = storage.nbytes()
        return ROUNDED

    with FakeTensorMode():
        model = model_fn()
        make = torch.empty if input_dtype.is_floating_point else torch.zeros
        x = make(input_shape, dtype=input_dtype)
        params = list(model.parameters())
        trainable = TRAINABLE
        skip = SKIP
        saved = {}

        def pack(t):
            storage = t.untyped_storage()
            if STORAGE_KEY not in skip:
                saved[STORAGE_KEY] = storage
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
    gradients = sum(nbytes(p.untyped_storage()) for p in trainable)
    return {"parameters": sum(nbytes(p.untyped_storage()) for p in params), "gradients": gradients,
            "optimizer_state": ADAM * gradients, "activations": sum(nbytes(s) for s in saved.values()),
            "output_shape": tuple(out.shape)}
'''
_MEM_HOOKS = {"ROUNDED": '512 * ((n + 511) // 512) if device == "cuda" else n',
              "TRAINABLE": "[p for p in params if p.requires_grad]",
              "SKIP": "{id(t.untyped_storage()) for t in params + [x]}", "STORAGE_KEY": "id(storage)", "ADAM": "2"}


def _mem(**hooks):
    src = _MEM
    for name, default in _MEM_HOOKS.items():
        src = src.replace(name, hooks.get(name, default))
    return src


BUGGY = {
    "dispatch.tensor_keys": {
        "autograd_only_if_requires_grad": (_keys(
            autograd='if requires_grad:\n        keys |= {"ADInplaceOrView", "Autograd" + backend}'),
            "even with requires_grad=False"),
        "autocast_on_every_device": (_keys(autocast='keys.add("Autocast" + backend)'), "no AutocastMeta"),
        "inference_keeps_ad_inplace_or_view": (_keys(
            autograd='keys.add("ADInplaceOrView")\n    if not inference:\n        keys.add("Autograd" + backend)'),
            "neither ADInplaceOrView nor an Autograd key"),
        "subclass_without_tls_snapshot": (_keys(python='{"Python"}'), "PythonTLSSnapshot"),
        "sparse_as_two_keys": (_keys().replace('keys = {"Sparse" + backend if sparse else backend}',
                                               'keys = {backend, "Sparse"} if sparse else {backend}'), "one name"),
    },
    "dispatch.dispatch_path": {
        "no_grad_skips_autograd": (_path(NO_GRAD="if not grad_mode:\n        excluded = excluded | autograd_keys"),
                                   "changes no key set"),
        "fallthroughs_not_removed": (_path(FALLTHROUGH="set()"), "fallthrough"),
        "inference_mode_only_drops_inplace_view": (_path(INFERENCE_EXCLUDE="pass"), "EXCLUDE set"),
        "mode_call_reruns_autograd": (_path(EXCLUDE_ABOVE_PYTHON="pass"), "ABOVE Python is excluded"),
        "one_python_step_for_all_modes": (_path(
            MODE_CALL='return call(tensors, included - {"Python", "PythonTLSSnapshot"}, excluded, [])'),
            "each TorchDispatchMode"),
        "fake_mode_runs_the_device_kernel": (_path(
            FAKE='return call(tensors, included, excluded | {"Python", "PythonTLSSnapshot"}, rest)'), "meta kernel"),
    },
    "dispatch.flop_counter": {
        "no_factor_2": (_flops(FACTOR="1"), "2 FLOPs"),
        "cpu_attention_counts_zero": (_flops(ATTENTION="None", ATTENTION_BACKWARD="None"),
                                      "attention counts 0"),
        "forgets_backward": (_flops(SKIP="if not torch.is_grad_enabled():\n            return out"),
                             "only the forward pass"),
        "attention_backward_like_forward": (_flops(BACKWARD_TERMS="(d + d_v)"), "recomputes Q K^T"),
        "addmm_reads_the_bias": (_flops(ADDMM_ARGS="args[:2]"), None),
        "wraps_flop_counter_mode": ("""
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count, sdpa_backward_flop_count


class FlopCounter(FlopCounterMode):
    def __init__(self):
        super().__init__(display=False, custom_mapping={
            aten._scaled_dot_product_flash_attention_for_cpu:
                lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
            aten._scaled_dot_product_flash_attention_for_cpu_backward:
                lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(g, q, k, v)})

    @property
    def total(self):
        return self.get_total_flops()
""", None),
    },
    "dispatch.graph_tracer": {
        "stores_traced_tensors": (_tracer(REFS_OFF="return x"), "TRACED run's numbers"),
        "one_ref_for_all_outputs": (_tracer(INDEX="None"), "Ref('native_layer_norm"),
        "drops_kwargs": (_tracer(KWARGS="{}"), "approximate"),
        "skips_backward_ops": (_tracer(SKIP="if not torch.is_grad_enabled():\n            return out"),
                               "including the backward ones"),
        "constants_as_placeholders": (_tracer().replace('self.nodes.append((name, "constant", (x,), {}))',
                                                        'self.nodes.append((name, "placeholder", (), {}))'),
                                      "'constant' node"),
    },
    "dispatch.int8_tensor": {
        "detach_dequantizes": (_int8(DETACH="False"), "detach()"),
        "truncates_instead_of_rounding": (_int8(CODES="(w / scale[:, None]).clamp(-127, 127).to(torch.int8)"),
                                          "do not truncate"),
        "one_scale_per_tensor": (_int8(SCALE="w.abs().amax() / 127",
                                       CODES="torch.round(w / scale).clamp(-127, 127).to(torch.int8)"),
                                 "one scale per OUTPUT row"),
        "scale_over_128": (_int8(SCALE="w.abs().amax(dim=1) / 128"), "max(|w|) over each row / 127"),
        "int8_as_logical_dtype": (_int8(LOGICAL_DTYPE="torch.int8"), "LOGICAL dtype"),
    },
    "dispatch.custom_op": {
        "fake_wrong_shape": (_op(FAKE_RESULT="x.new_empty(x.shape[:-1])"), "SHAPE"),
        "fake_wrong_dtype": (_op(FAKE_RESULT="torch.empty_like(x, dtype=torch.float32)"), "DTYPE"),
        "no_autograd_registration": (_op(REGISTER_AUTOGRAD="pass"), "register_autograd"),
        "forgets_grad_out": (_op().replace("grad_z = grad_out * (", "grad_z = (")
                             .replace("return grad_z, grad_z.reshape", "return grad_z.expand_as(grad_out), grad_z.reshape"),
                             "chain rule"),
        "no_fake_kernel": (_op(FAKE_DECORATOR="", FAKE_RESULT="torch.empty_like(x)").replace(
            "\n    \n    def _(x, bias)", "\n    def _(x, bias)"), "register_fake"),
        "tanh_approximation": (_op(FORWARD="0.5 * z * (1 + torch.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))"),
                               None),
    },
    "dispatch.memory_estimate": {
        "no_512_byte_rounding": (_mem(ROUNDED="n"), "512 bytes"),
        "adam_keeps_one_copy": (_mem(ADAM="1"), "TWO tensors"),
        "gradients_for_frozen_parameters": (_mem(TRAINABLE="params"), "requires_grad=True"),
        "storages_by_data_ptr": (_mem(STORAGE_KEY="storage.data_ptr()"), "id(t.untyped_storage())"),
        "parameters_counted_as_activations": (_mem(SKIP="{id(x.untyped_storage())}"), "leave out the parameters"),
    },
}

# Exercises whose solution builds on another exercise's answer: a bug there also sinks these.
DEPENDS_ON = {
    "dispatch.dispatch_path": ("dispatch.tensor_keys",),  # dispatch_path starts from tensor_keys' key sets
}
