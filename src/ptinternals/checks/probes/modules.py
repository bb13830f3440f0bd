"""The modules chapter's probes (sandbox side): drive a student's mixin or function on generated module trees and
return plain data (names, labels, dtypes, values as lists, exception types).

Every scenario is written once, over a *base class*, and runs twice: here, in the sandbox, on the student's
mixin composed with the scaffold's ``ModuleState`` (``compose``; trees filled through the dicts), and in the
trusted grader on ``torch.nn.Module`` (trees built by registration), where its result is the expected answer.
What a scenario reports is measured by this file from the module's dicts (``_parameters``, ``_buffers``,
``_modules``), never through the student's methods, and tensors are named by the spec entry they came from
(``"p3"``: ``spec["params"][3]``), so "the same object" is checked by identity, not by value.

Imports torch, the standard library and the chapter's scaffold (``Chapter.sandbox_files``); no solution here.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections import OrderedDict

import torch

from ptinternals.checks.probes.calls import banned
from ptinternals.modules.scaffold import BrokenNet, build_tree, compose


# ================================================================================================
# Measuring a tree from its dicts
# ================================================================================================
def walk(root) -> list[tuple[str, object]]:
    """Pre-order ``(path, module)`` over ``_modules``, each instance once (the probe's own traversal)."""
    out, seen = [], set()

    def visit(module, path):
        if id(module) in seen:
            return
        seen.add(id(module))
        out.append((path, module))
        for name, child in module._modules.items():
            if child is not None:
                visit(child, f"{path}.{name}" if path else name)

    visit(root, "")
    return out


def labels(spec: dict, nodes: list) -> dict:
    """``{id(tensor): "p<i>" | "b<i>"}``: each spec tensor by its index, read from the freshly built dicts."""
    out = {}
    for node, module in zip(spec["nodes"], nodes):
        for name, index in node.get("params", []):
            if index is not None:
                out[id(module._parameters[name])] = f"p{index}"
        for name, index, _ in node.get("buffers", []):
            if index is not None:
                out[id(module._buffers[name])] = f"b{index}"
    return out


def slots(nodes: list) -> list[tuple[int, str, str, object]]:
    """``(node index, "param" | "buffer", name, tensor or None)`` of every slot of every node, in dict order."""
    return [(i, kind, name, t) for i, m in enumerate(nodes)
            for kind, table in (("param", m._parameters), ("buffer", m._buffers)) for name, t in table.items()]


def values(t) -> list | float | int | bool | None:
    return None if t is None else t.detach().tolist()


def dtype(t) -> str | None:
    return None if t is None else str(t.dtype).replace("torch.", "")


def outcome(fn):
    """``("ok", value)`` or ``("raised", type name)``: an error torch also raises is part of the behaviour.

    ``NotImplementedError`` is re-raised: a stub must reach the harness, which reports "not implemented yet".
    """
    try:
        return ("ok", fn())
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - any other error is compared with torch's
        return ("raised", type(e).__name__)


# ================================================================================================
# modules.register: attribute operations
# ================================================================================================
def make_value(kind: str, base: type, seed: int):
    g = torch.Generator().manual_seed(seed)
    if kind == "parameter":
        return torch.nn.Parameter(torch.randn(2, generator=g))
    if kind == "frozen":
        return torch.nn.Parameter(torch.randn(2, generator=g), requires_grad=False)
    if kind == "tensor":
        return torch.randn(2, generator=g)
    if kind == "buffer":
        return torch.nn.Buffer(torch.randn(2, generator=g))
    if kind == "buffer_np":
        return torch.nn.Buffer(torch.randn(2, generator=g), persistent=False)
    if kind == "module":
        return type("Child", (base,), {})()
    if kind == "none":
        return None
    return 7


def describe(value):
    if isinstance(value, torch.Tensor):
        return [type(value).__name__, value.requires_grad, value.tolist()]
    if value is None or isinstance(value, (int, bool)):
        return value
    if callable(value) and not hasattr(value, "_modules"):
        return "callable"
    return type(value).__name__


def snapshot(module) -> dict:
    """Where every name lives: the three dicts, the non-persistent set and the plain attributes."""
    plain = {k: describe(v) for k, v in vars(module).items() if not k.startswith("_") and k != "training"}
    return {"parameters": {k: describe(v) for k, v in module._parameters.items()},
            "buffers": {k: describe(v) for k, v in module._buffers.items()},
            "non_persistent": sorted(module._non_persistent_buffers_set),
            "modules": {k: describe(v) for k, v in module._modules.items()},
            "plain": plain}


def op_call(module, base: type, op, k: int):
    """The attribute operation ``op = (what, name, value kind, persistent)`` on ``module``, as a function of
    no arguments (its value is the operation's; the value to assign is made now, from seed ``k``)."""
    what, name, kind, persistent = op
    value = make_value(kind, base, k)
    if what == "setattr":
        return lambda: setattr(module, name, value)
    if what == "register_buffer":
        return lambda: module.register_buffer(name, value, persistent=persistent)
    if what == "register_parameter":
        return lambda: module.register_parameter(name, value)
    if what == "add_module":
        return lambda: module.add_module(name, value)
    if what == "delattr":
        return lambda: delattr(module, name)
    return lambda: describe(getattr(module, name))


def apply_op(module, base: type, op, k: int):
    return outcome(op_call(module, base, op, k))


def register_run(base: type, ops: list, early: str | None = None) -> list:
    """Apply ``ops`` to a fresh ``Model(base)``: after each, its outcome and the module's snapshot.

    ``early``: instead, construct a subclass that assigns (``kind``) before ``super().__init__()``.
    """
    if early is not None:
        def init(self):
            if early == "plain":
                self.note = 3
            elif early == "register_buffer":
                self.register_buffer("b", torch.ones(1))
            else:
                self.w = make_value(early, base, 0)
            base.__init__(self)

        cls = type("Early", (base,), {"__init__": init})
        got = outcome(cls)
        return [{"op": 0, "outcome": got[:1] + (None,) if got[0] == "ok" else got,
                 "state": snapshot(got[1]) if got[0] == "ok" else None}]
    module = type("Model", (base,), {})()
    out = []
    for k, op in enumerate(ops):
        got = apply_op(module, base, op, k)
        out.append({"op": k, "outcome": got, "state": snapshot(module)})
    return out


def register_probe(Registration, ops, early=None):
    return register_run(compose(Registration, name="Module"), ops, early)


# ================================================================================================
# modules.traverse: named_modules / named_parameters / named_buffers
# ================================================================================================
def traverse_run(base: type, spec: dict, prefix: str, recurse: bool, remove_duplicate: bool, register: bool) -> dict:
    nodes = build_tree(spec, base, register=register)
    index = {}
    for i, m in enumerate(nodes):
        index.setdefault(id(m), i)
    label = labels(spec, nodes)
    root = nodes[0]

    def module_list(named):
        return [[name, index.get(id(m), -1)] for name, m in named]

    def tensor_list(named):
        return [[name, label.get(id(t), "?")] for name, t in named]

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        return {
            "named_modules": module_list(root.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)),
            "named_modules_memo": module_list(root.named_modules(memo={nodes[-1]}, prefix=prefix)),
            "named_children": module_list(root.named_children()),
            "children": [index.get(id(m), -1) for m in root.children()],
            "named_parameters": tensor_list(root.named_parameters(prefix=prefix, recurse=recurse,
                                                                  remove_duplicate=remove_duplicate)),
            "parameters": [label.get(id(t), "?") for t in root.parameters(recurse=recurse)],
            "named_buffers": tensor_list(root.named_buffers(prefix=prefix, recurse=recurse,
                                                            remove_duplicate=remove_duplicate)),
            "buffers": [label.get(id(t), "?") for t in root.buffers(recurse=recurse)],
            "unchanged": [[name, label.get(id(t), None if t is None else "?")] for _, _, name, t in slots(nodes)],
        }


def traverse_probe(Traversal, spec, prefix="", recurse=True, remove_duplicate=True):
    return traverse_run(compose(Traversal), spec, prefix, recurse, remove_duplicate, register=False)


# ================================================================================================
# modules.convert: _apply and to
# ================================================================================================
CONVERSIONS = {
    "to_float64": lambda m: m.to(torch.float64),
    "to_dtype_float16": lambda m: m.to(dtype=torch.float16),
    "to_tensor_float64": lambda m: m.to(torch.zeros(1, dtype=torch.float64)),
    "to_cpu": lambda m: m.to("cpu"),
    "to_cpu_float64": lambda m: m.to("cpu", torch.float64),
    "to_bfloat16_non_blocking": lambda m: m.to(torch.bfloat16, non_blocking=True),
    "to_int64": lambda m: m.to(torch.int64),
    "apply_times_2": lambda m: m._apply(lambda t: t * 2),
    "apply_float64_no_recurse": lambda m: m._apply(lambda t: t.double(), recurse=False),
}


@contextlib.contextmanager
def overwrite_flag(on: bool):
    old = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(on)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(old)


def convert_run(base: type, spec: dict, conversion: str, overwrite: bool, register: bool) -> dict:
    """Forward + backward (grads exist), an SGD optimizer, the conversion, one step; then every slot's state."""
    nodes = build_tree(spec, base, seed=3, register=register)
    root = nodes[0]
    x = torch.linspace(-1, 1, 2 * spec["dim"]).reshape(2, spec["dim"])
    y = root(x)
    if y.requires_grad:
        y.sum().backward()
    before = slots(nodes)
    grads = [None if t is None or kind == "buffer" else t.grad for _, kind, _, t in before]
    unique = []
    for _, kind, _, t in before:
        if kind == "param" and t is not None and t.requires_grad and all(t is not u for u in unique):
            unique.append(t)
    opt = torch.optim.SGD(unique, lr=0.5) if unique else None
    with overwrite_flag(overwrite):
        got = outcome(lambda: CONVERSIONS[conversion](root) is root)
    if got[0] == "ok" and opt is not None:
        with contextlib.suppress(RuntimeError):  # e.g. a grad whose dtype no longer matches: both worlds alike
            opt.step()
    after = slots(nodes)
    state = []
    for (i, kind, name, old), (_, _, _, new), grad in zip(before, after, grads):
        state.append({"slot": f"{i}.{kind}.{name}", "dtype": dtype(new), "type": type(new).__name__,
                      "requires_grad": None if new is None else new.requires_grad,
                      "same_object": new is old,
                      "grad_dtype": None if new is None or kind == "buffer" else dtype(new.grad),
                      "grad_same_object": None if grad is None or new is None else new.grad is grad,
                      "values": values(new)})
    held = [] if opt is None else opt.param_groups[0]["params"]
    in_model = [any(p is t for _, kind, _, t in after if kind == "param") for p in held]
    return {"outcome": got, "slots": state, "optimizer_params_in_model": in_model}


def convert_probe(Conversion, spec, conversion, overwrite=False):
    return convert_run(compose(Conversion), spec, conversion, overwrite, register=False)


# ================================================================================================
# modules.state_dict: state_dict and load_state_dict
# ================================================================================================
MESSAGE_LINES = ("Missing key(s) in state_dict:", "Unexpected key(s) in state_dict:", "size mismatch for ",
                 "While copying the parameter named")


def graded_lines(message: str) -> list[str]:
    """The lines of a load error that are compared word for word (the header line is not)."""
    return [line.strip() for line in message.splitlines() if line.strip().startswith(MESSAGE_LINES)]


def checkpoint_from(items: list, metadata) -> OrderedDict:
    sd = OrderedDict((k, v) for k, v in items)
    if metadata is not None:
        sd._metadata = OrderedDict((k, dict(v)) for k, v in metadata)
    return sd


def state_dict_run(base: type, spec: dict, items: list, metadata, strict: bool, assign: bool,
                   register: bool) -> dict:
    nodes = build_tree(spec, base, register=register)
    root = nodes[0]
    label = labels(spec, nodes)
    live = {}
    for path, module in walk(root):
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None:
                    live.setdefault(f"{path}.{name}" if path else name, t)

    saved = root.state_dict()
    meta = getattr(saved, "_metadata", None)
    with_vars = root.state_dict(keep_vars=True)
    report = {
        "keys": list(saved),
        "metadata": None if meta is None else [[k, dict(v)] for k, v in meta.items()],
        "aliases": [[k, isinstance(v, torch.Tensor) and k in live and v.data_ptr() == live[k].data_ptr()
                     and not v.requires_grad] for k, v in saved.items()],
        "keep_vars": [[k, label.get(id(v), "?")] for k, v in with_vars.items()],
        "prefixed": list(root.state_dict(prefix="net.")),
    }
    sd = checkpoint_from(items, metadata)
    keys_before = list(sd)
    before = slots(nodes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = root.load_state_dict(sd, strict=strict, assign=assign)
            report["load"] = ["ok", list(result.missing_keys), list(result.unexpected_keys),
                              repr(result) == "<All keys matched successfully>",
                              isinstance(result, tuple) and len(result) == 2]
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 - compared with torch's error
            report["load"] = ["raised", type(e).__name__, graded_lines(str(e))]
    report["input_unchanged"] = list(sd) == keys_before
    given = {v.untyped_storage().data_ptr() for v in sd.values() if isinstance(v, torch.Tensor) and v.numel()}
    report["after"] = [{"slot": f"{i}.{kind}.{name}", "dtype": dtype(t), "type": type(t).__name__,
                        "requires_grad": None if t is None else t.requires_grad, "same_object": t is old,
                        "shares_checkpoint_storage": t is not None and t.numel() > 0
                        and t.untyped_storage().data_ptr() in given, "values": values(t)}
                       for (i, kind, name, old), (_, _, _, t) in zip(before, slots(nodes))]
    return report


def state_dict_probe(StateDict, spec, items, metadata, strict=True, assign=False):
    return state_dict_run(compose(StateDict), spec, items, metadata, strict, assign, register=False)


# ================================================================================================
# modules.call: __call__ with hooks
# ================================================================================================
def make_hook(kind: str, k: int, modify: bool, events: list, label: dict):
    """A hook that records ``[kind, node, k]`` and, if ``modify``, changes what it may change."""
    def note(module):
        events.append([kind, label.get(id(module), -1), k])

    if kind == "fpre_kw":
        def hook(module, args, kwargs):
            note(module)
            return ((args[0] * 1.5,), kwargs) if modify else None
    elif kind == "fpre":
        def hook(module, args):
            note(module)
            if not modify:
                return None
            return args[0] * 1.5 if k % 2 else (args[0] * 1.5,)  # a bare value is wrapped in a tuple
    elif kind == "fhook_kw":
        def hook(module, args, kwargs, output):
            note(module)
            return output + 1 if modify else None
    elif kind in ("fhook", "fhook_always"):
        def hook(module, args, output):
            note(module)
            return output + 1 if modify else None
    elif kind == "bpre":
        def hook(module, grad_output):
            note(module)
            return tuple(None if g is None else g * 2 for g in grad_output) if modify else None
    else:
        def hook(module, grad_input, grad_output):
            note(module)
            return tuple(None if g is None else g * 0.5 for g in grad_input) if modify else None
    return hook


def register_hook(module, kind: str, hook, prepend: bool):
    if kind in ("fpre", "fpre_kw"):
        return module.register_forward_pre_hook(hook, prepend=prepend, with_kwargs=kind == "fpre_kw")
    if kind in ("fhook", "fhook_kw", "fhook_always"):
        return module.register_forward_hook(hook, prepend=prepend, with_kwargs=kind == "fhook_kw",
                                            always_call=kind == "fhook_always")
    if kind == "bpre":
        return module.register_full_backward_pre_hook(hook, prepend=prepend)
    return module.register_full_backward_hook(hook, prepend=prepend)


def _float(x):
    return None if x is None else [[None if math.isnan(v) else v for v in row] for row in x.tolist()]


def call_plan(base: type, spec: dict, plan: list, x_requires_grad: bool, grad_mode: bool, register: bool,
              remove: tuple = (), forward_only: bool = False) -> dict:
    nodes = build_tree(spec, base, register=register)
    index = {}
    for i, m in enumerate(nodes):
        index.setdefault(id(m), i)
    events: list = []
    handles = [register_hook(nodes[node], kind, make_hook(kind, k, modify, events, index), prepend)
               for k, (node, kind, prepend, modify) in enumerate(plan)]
    for k in remove:
        handles[k].remove()
        handles[k].remove()  # twice: harmless
    dim = spec["dim"]
    x = torch.linspace(-1, 1, 2 * dim).reshape(2, dim).requires_grad_(x_requires_grad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Full backward hook is firing when ... no inputs require gradients"
        with torch.set_grad_enabled(grad_mode):
            y = nodes[0].forward(x) if forward_only else nodes[0](x)
        n_forward = len(events)
        if y.requires_grad:
            y.sum().backward()
    grads = [[f"{i}.{name}", None if t is None or t.grad is None else t.grad.tolist()]
             for i, kind, name, t in slots(nodes) if kind == "param"]
    return {"events": events, "forward_events": n_forward, "y": _float(y), "y_requires_grad": y.requires_grad,
            "x_grad": _float(x.grad), "grads": grads}


def call_special(base: type, scenario: str) -> dict:
    """Fixed situations: forward raises (always_call), kwargs, bad hook returns."""
    events: list = []
    if scenario in ("always_call", "always_call_failing_hook"):
        class Boom(base):
            def forward(self, x):
                raise ValueError("forward failed")

        m = Boom()
        m.register_forward_hook(lambda mod, a, out: events.append(["plain", out is None]))
        # an always_call hook's return replaces the result for the hooks after it, on the error path too
        m.register_forward_hook(lambda mod, a, out: events.append(["always", out is None]) or torch.zeros(1),
                                always_call=True)
        if scenario == "always_call_failing_hook":
            def bad(mod, a, out):
                events.append(["bad", out is None])
                raise KeyError("hook failed too")

            m.register_forward_hook(bad, always_call=True)
        m.register_forward_hook(lambda mod, a, kw, out: events.append(["always_kw", sorted(kw), out is None]),
                                always_call=True, with_kwargs=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = outcome(lambda: m(torch.ones(1)))
        return {"outcome": got, "events": events}
    if scenario == "kwargs":
        class Scale(base):
            def forward(self, x, *, factor=1.0):
                return x * factor

        m = Scale()
        m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"factor": kwargs["factor"] * 10}),
                                    with_kwargs=True)
        m.register_forward_pre_hook(lambda mod, args: events.append(["pre", len(args)]))
        m.register_forward_hook(lambda mod, args, kwargs, o: events.append(["kw", kwargs["factor"]]), with_kwargs=True)
        m.register_forward_hook(lambda mod, args, o: events.append(["plain", len(args)]))
        y = m(torch.ones(2), factor=2.0)
        return {"y": y.tolist(), "events": events}
    if scenario == "two_inputs":  # a tensor input that needs no grad; tuple outputs; what backward hooks receive
        class Pair(base):
            def forward(self, x, y):
                events.append(["forward: y.requires_grad", y.requires_grad])
                return x * 2 + y, x.sum()

        m = Pair()
        m.register_full_backward_pre_hook(lambda mod, go: events.append(["bpre", type(go).__name__,
                                                                         [g is None for g in go]]))
        m.register_full_backward_hook(lambda mod, gi, go: events.append(["bhook", type(gi).__name__,
                                                                         [g is None for g in gi], type(go).__name__]))
        x, y = torch.ones(2, requires_grad=True), torch.ones(2)
        a, b = m(x, y)
        (a.sum() + b).backward()
        return {"events": events, "x_grad": x.grad.tolist()}
    if scenario == "hook_raises":  # an always_call hook that already ran is not run again
        m = type("Twice", (base,), {"forward": lambda self, x: x * 2})()
        m.register_forward_hook(lambda mod, a, out: events.append(["always A", out is None]), always_call=True)

        def bad(mod, a, out):
            events.append(["raises"])
            raise ValueError("hook failed")

        m.register_forward_hook(bad)
        m.register_forward_hook(lambda mod, a, out: events.append(["always B", out is None]), always_call=True)
        return {"outcome": outcome(lambda: m(torch.ones(1))), "events": events}
    # bad hook returns: a 3-tuple from a with_kwargs pre-hook, wrong numbers of gradients from backward hooks
    cls = type("Twice", (base,), {"forward": lambda self, x: x * 2})
    modules = [cls() for _ in range(6)]
    modules[0].register_forward_pre_hook(lambda m, args, kwargs: (1, 2, 3), with_kwargs=True)
    modules[1].register_forward_pre_hook(lambda m, args, kwargs: (args,), with_kwargs=True)
    modules[2].register_full_backward_hook(lambda m, gi, go: (None, None))  # too many gradients
    modules[3].register_full_backward_hook(lambda m, gi, go: ())  # too few
    modules[4].register_full_backward_pre_hook(lambda m, go: (None, None, None))
    modules[5].register_full_backward_pre_hook(lambda m, go: ())
    x = torch.ones(2, requires_grad=True)
    return {"outcomes": [outcome(lambda m=m: m(x)) for m in modules[:2]] +
                        [outcome(lambda m=m: m(x).sum().backward()) for m in modules[2:]]}


def call_run(base: type, spec, scenario: str, plan=(), x_requires_grad=True, grad_mode=True, remove=(),
             register=True) -> dict:
    if scenario in ("plan", "forward_only"):
        return call_plan(base, spec, list(plan), x_requires_grad, grad_mode, register, tuple(remove),
                         forward_only=scenario == "forward_only")
    return call_special(base, scenario)


def call_probe(Calling, spec, scenario, plan=(), x_requires_grad=True, grad_mode=True, remove=()):
    return call_run(compose(Calling), spec, scenario, plan, x_requires_grad, grad_mode, remove, register=False)


# ================================================================================================
# modules.functional_call (real torch modules on both sides)
# ================================================================================================
def _functional_banned():
    import torch.func
    import torch.nn.utils.stateless as stateless

    return banned([(torch.func, "functional_call"), (stateless, "functional_call"),
                   (stateless, "_reparametrize_module"), (torch.nn.Module, "load_state_dict")])


def replacement(like, k: int):
    """A new value for a name (same shape, other values); requires grad when floating point."""
    g = torch.Generator().manual_seed(1000 + k)
    if like is None or like.is_floating_point():
        shape = () if like is None else like.shape
        return torch.randn(shape, generator=g).requires_grad_(True)
    return torch.full(like.shape, 5, dtype=like.dtype)


def functional_call_run(fn, spec: dict, names: list, tie_weights: bool, strict: bool, scenario: str = "plain") -> dict:
    """Call ``fn(root, {name: new tensor}, (x,), ...)`` on a torch tree; report output, gradients, restoration."""
    nodes = build_tree(spec, torch.nn.Module)
    root = nodes[0]
    if scenario == "raises":  # a forward that fails half way: the originals must still come back
        def failing(self, x):
            raise ValueError("forward failed")

        type(nodes[-1]).forward = failing
    lookup = dict([*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)])
    new = {n: replacement(lookup.get(n), k) for k, n in enumerate(names)}
    passed = dict(new)
    before = slots(nodes)
    before_values = [values(t) for *_, t in before]
    before_attributes = [set(vars(m)) for m in nodes]
    during: list = []

    def in_place(module, args):  # during the call, does each given name hold the tensor given for it?
        for name, t in new.items():
            owner = root
            *path, leaf = name.split(".")
            for part in path:
                owner = owner._modules.get(part) if owner is not None else None
            held = None if owner is None else next(
                (table[leaf] for table in (owner._parameters, owner._buffers, owner.__dict__) if leaf in table), None)
            during.append([name, held is t])

    hook = root.register_forward_pre_hook(in_place)
    dim = spec["dim"]
    x = torch.linspace(-1, 1, 2 * dim).reshape(2, dim)
    args = x if scenario == "bare_args" else (x,)
    with _functional_banned() if fn is not torch.func.functional_call else contextlib.nullcontext():
        try:
            y = fn(root, passed, args, tie_weights=tie_weights, strict=strict)
            report = {"outcome": "ok", "y": values(y)}
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 - compared with torch's error
            report = {"outcome": "raised", "type": type(e).__name__,
                      "lines": [line.strip() for line in str(e).splitlines()
                                if line.strip().startswith(("Missing key(s)", "Unexpected key(s)"))]}
            y = None
    hook.remove()
    report["during_call"] = during
    if y is not None and isinstance(y, torch.Tensor) and y.requires_grad:
        y.sum().backward()
    report["grads"] = [[n, None if t.grad is None else t.grad.tolist()] for n, t in new.items()] if y is not None else []
    after = slots(nodes)
    report["restored"] = [f"{i}.{kind}.{name}" for (i, kind, name, old), (_, _, _, now) in zip(before, after)
                          if now is not old] + [f"{i}.{kind}.{name} (values)" for (i, kind, name, _), v, (*_, now)
                                                in zip(before, before_values, after)
                                                if kind == "param" and values(now) != v]  # counters may count
    report["restored"] += [f"{i}.attribute.{name}" for i, (m, had) in enumerate(zip(nodes, before_attributes))
                           for name in sorted(set(vars(m)) - had)]
    report["input_unchanged"] = list(passed) == list(new) and all(passed[k] is new[k] for k in new)
    return report


def functional_call_probe(functional_call, spec, names, tie_weights=True, strict=False, scenario="plain"):
    return functional_call_run(functional_call, spec, names, tie_weights, strict, scenario)


# ================================================================================================
# modules.fix_model
# ================================================================================================
def _blocks(model) -> list:
    blocks = model.__dict__.get("blocks", model._modules.get("blocks"))
    if blocks is None:
        return []
    if isinstance(blocks, dict):
        return list(blocks.values())
    return list(blocks)


def fix_model_run(cls, dim: int, depth: int, max_len: int, T: int, seed: int) -> dict:
    """Build ``cls`` and a seeded ``BrokenNet``, give both the same weights, and measure the plumbing."""
    torch.manual_seed(seed)
    broken = BrokenNet(dim, depth, max_len)
    torch.manual_seed(seed)
    model = cls(dim, depth, max_len)
    with torch.no_grad():  # the same weights, by position (blocks, then the norm)
        for mine, theirs in zip([*_blocks(model), model.norm], [*broken.blocks, broken.norm]):
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
    x = torch.randn(2, T, dim, generator=torch.Generator().manual_seed(seed + 1))
    fired = []
    handles = [b.register_forward_hook(lambda m, a, o: fired.append(1)) for b in _blocks(model)]
    y = model(x)
    hook_calls = len(fired)
    for h in handles:
        h.remove()
    buffers = dict(model.named_buffers())
    report = {"parameters": [n for n, _ in model.named_parameters()], "state_dict": list(model.state_dict()),
              "buffers": sorted(buffers), "y": values(y), "hook_calls": hook_calls}
    model.to(torch.float64)
    report["mask_dtype_after_to"] = dtype(getattr(model, "mask", None))
    model.to(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [b.weight.detach().clone() for b in _blocks(model)]
    model(x).square().sum().backward()
    opt.step()
    report["blocks_trained"] = [not torch.equal(b0, b.weight.detach()) for b0, b in zip(before, _blocks(model))]
    return report


def fix_model_probe(FixedNet, dim, depth, max_len, T, seed):
    return fix_model_run(FixedNet, dim, depth, max_len, T, seed)


# ================================================================================================
# modules.load_checkpoint
# ================================================================================================
class HasModuleChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.module = torch.nn.Linear(2, 2)  # a child really called "module": every key starts with "module."


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(2, 2))
        self.encoder.add_module("submodule", torch.nn.Linear(2, 2))  # "submodule" contains "module."... once


def make_model(recipe: str, seed: int):
    torch.manual_seed(seed)
    if recipe == "linear_bn":
        return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    if recipe == "has_module_child":
        return HasModuleChild()
    if recipe == "encoder":
        return Encoder()
    if recipe == "empty":
        return torch.nn.Sequential()
    if recipe == "bn":  # a versioned module at the root: its _metadata entry is the root's ("")
        return torch.nn.BatchNorm1d(3)
    return torch.nn.Sequential(torch.nn.Linear(2, 1))


def load_checkpoint_run(fn, recipe: str, items: list, metadata) -> dict:
    model = make_model(recipe, seed=0)
    sd = checkpoint_from(items, metadata)
    keys_before = list(sd)
    meta_before = None if metadata is None else [[k, dict(v)] for k, v in sd._metadata.items()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = fn(model, sd)
            report = {"outcome": "ok", "result": [list(result.missing_keys), list(result.unexpected_keys)]}
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 - compared with torch's error
            report = {"outcome": "raised", "type": type(e).__name__, "lines": graded_lines(str(e))}
    report["values"] = [[k, values(v)] for k, v in model.state_dict().items()]
    meta_after = None if not hasattr(sd, "_metadata") else [[k, dict(v)] for k, v in sd._metadata.items()]
    report["input_unchanged"] = list(sd) == keys_before and meta_after == meta_before
    return report


def load_checkpoint_probe(load_checkpoint, recipe, items, metadata):
    import torch.nn.modules.utils as utils

    with banned([(utils, "consume_prefix_in_state_dict_if_present")]):
        return load_checkpoint_run(load_checkpoint, recipe, items, metadata)
