"""The autograd chapter's probes (sandbox side): run a student's formulas, engine, Functions and training code, and
return plain measurements (gradients, second derivatives, saved bytes, live activation bytes).

Imports torch and the standard library; the mini-engine probes also import the chapter's scaffold
(``ptinternals.autograd.scaffold``, shipped to the sandbox as ``Chapter.sandbox_files``), never the
reference. No solution lives here: the few backward passes below are computed by asking torch itself
for a vector-Jacobian product (``torch.autograd.grad``), which the formula exercises forbid.

The same helpers run in the trusted grader to compute the expected answers with real torch: the
graph programs of the engine exercise (``run_program``) are interpreted once over scaffold
``Variable``s and once over ``torch.Tensor``s, and the live-bytes measurement of the checkpoint
exercise is applied to the plain block.
"""
from __future__ import annotations

import contextlib
import gc

from ptinternals.checks.probes.calls import banned, recording_torch_calls


def _reraise_if_stub(e: BaseException) -> None:
    """A stub's NotImplementedError must reach the harness, which reports "not implemented yet"."""
    if isinstance(e, NotImplementedError):
        raise e


def _raised(e: BaseException):
    """An exception as data: the encoder turns any exception object into ``_runtime.Raised``.

    (Not a ``Raised`` built here: in the sandbox ``_runtime`` runs as ``__main__``, so the class
    imported as ``ptinternals.grading._runtime.Raised`` is another class, which the encoder rejects.)
    """
    return e


# ================================================================================================
# Calls a solution may not make
# ================================================================================================
def _no_autograd_calls(why: str):
    import torch
    import torch.autograd.functional
    import torch.func

    return banned([(torch.autograd, "grad", why), (torch.autograd, "backward", why), (torch.Tensor, "backward", why),
                    (torch.func, "vjp", why), (torch.autograd.functional, "vjp", why)])


def _to_variable(x):
    import torch

    from ptinternals.autograd.scaffold import Variable

    return Variable(x) if isinstance(x, torch.Tensor) else x


def _from_variable(x):
    from ptinternals.autograd.scaffold import Variable

    if isinstance(x, Variable):
        return x.data
    if isinstance(x, tuple):
        return tuple(_from_variable(v) for v in x)
    if isinstance(x, list):
        return [_from_variable(v) for v in x]
    return x


# ================================================================================================
# autograd.unbroadcast / autograd.formulas: unbroadcast and the backward formulas, on tensors and on Variables
# ================================================================================================
def unbroadcast_probe(entry, grad, shape):
    """``entry(grad, shape)`` on a tensor (recording torch calls), then on a scaffold Variable."""
    calls: set = set()
    with recording_torch_calls(calls):
        out = entry(grad, shape)
    try:
        as_variable = _from_variable(entry(_to_variable(grad), shape))
    except Exception as e:  # noqa: BLE001 (reported as data)
        _reraise_if_stub(e)
        as_variable = _raised(e)
    return {"out": out, "variable": as_variable, "calls": sorted(calls)}


def _torch_sum_to(grad, shape):
    """A correct ``unbroadcast`` by torch (``sum_to_size``), for tensors and Variables."""
    from ptinternals.autograd.scaffold import Variable

    if isinstance(grad, Variable):
        return Variable(grad.data.sum_to_size(tuple(shape)))
    return grad.sum_to_size(tuple(shape))


@contextlib.contextmanager
def _torch_unbroadcast_in(entry):
    """Grade the formulas on their own: the student's ``unbroadcast`` (Exercise autograd.unbroadcast, graded there) is
    replaced by torch's ``sum_to_size`` while they run, so one mistake costs points in one exercise."""
    namespace = getattr(entry, "__globals__", None)
    if not isinstance(namespace, dict) or "unbroadcast" not in namespace:
        yield
        return
    theirs = namespace["unbroadcast"]
    namespace["unbroadcast"] = _torch_sum_to
    try:
        yield
    finally:
        namespace["unbroadcast"] = theirs


def formula_probe(entry, op, grad, *saved):
    """``entry(op, grad, *saved)`` on tensors, then on Variables; torch.autograd is off limits."""
    why = "write the backward formula with tensor operations (torch.autograd would compute it for you)"
    with _no_autograd_calls(why), _torch_unbroadcast_in(entry):
        out = entry(op, grad, *saved)
        try:
            as_variable = _from_variable(entry(op, _to_variable(grad), *(_to_variable(s) for s in saved)))
        except Exception as e:  # noqa: BLE001
            _reraise_if_stub(e)
            as_variable = _raised(e)
    return {"out": out, "variable": as_variable}


# ================================================================================================
# autograd.backward: graph programs, run on the mini engine (student's backward) and on real torch
# ================================================================================================
# A program is a list of steps over a growing list of values (the leaves first):
#   ("add", i, j) ("mul", i, j) ("mulsg", i, j) = values[i] * values[j].detach()  ("tanh", i)
#   ("sigmoid", i) ("sum", i, dim) = sum over dim, keepdim=True     -> append a new value
#   ("hook", i, factor)   register a hook on values[i] that records the gradient it sees and returns
#                         grad * factor (factor None: returns None, the gradient is unchanged)
#   ("retain", i)         values[i].retain_grad()
# The root is the last value; its gradient is given.
def _torch_fns():
    import torch

    return {
        "add": (lambda a, b: a + b, False),
        "mul": (lambda a, b: a * b, True),
        "mulsg": (lambda a, b: a * b.detach(), True),
        "tanh": (torch.tanh, True),
        "sigmoid": (torch.sigmoid, True),
        "sum": (None, False),
    }


_NODE_NAMES = {"add": "AddBackward0", "mul": "MulBackward0", "mulsg": "MulBackward0", "tanh": "TanhBackward0",
               "sigmoid": "SigmoidBackward0", "sum": "SumBackward1"}


def _vjp_backward(fn, shapes):
    """A formula for the mini engine computed by torch: the vector-Jacobian product of ``fn``."""
    import torch

    from ptinternals.autograd.scaffold import Variable

    def backward(grad, *saved):
        if saved:
            xs = [s.data.detach().requires_grad_(True) for s in saved]
        else:  # the op is linear: evaluating at zeros gives the same vector-Jacobian product
            xs = [torch.zeros(shape, dtype=grad.dtype, device=grad.device, requires_grad=True) for shape in shapes]
        with torch.enable_grad():
            out = fn(*xs)
            grads = torch.autograd.grad(out, xs, grad.data, allow_unused=True)
        return tuple(None if g is None else Variable(g) for g in grads)

    return backward


def _apply(step, values, mode):
    op = step[0]
    fn, save = _torch_fns()[op]
    if op == "sum":
        dim = step[2]

        def fn(a, dim=dim):
            return a.sum(dim, keepdim=True)

        args = [values[step[1]]]
    elif op in ("tanh", "sigmoid"):
        args = [values[step[1]]]
    else:
        args = [values[step[1]], values[step[2]]]
    if mode == "torch":
        return fn(*args)
    from ptinternals.autograd.scaffold import custom_op

    return custom_op(_NODE_NAMES[op], fn, _vjp_backward(fn, [tuple(a.shape) for a in args]), *args,
                     save_inputs=save)


def _data(x):
    """A gradient from either engine as a fresh plain tensor (None stays None)."""
    from ptinternals.autograd.scaffold import Variable

    if x is None:
        return None
    return x.data.detach().clone() if isinstance(x, Variable) else x.detach().clone()


def build_program(leaves, requires, program, mode):
    """Run ``program`` in ``mode`` ("torch" or "mini"); return (values, the leaves, hooks' records, retained)."""
    import torch

    if mode == "torch":
        values = [t.detach().clone().requires_grad_(bool(r)) for t, r in zip(leaves, requires, strict=False)]
    else:
        from ptinternals.autograd.scaffold import Variable

        values = [Variable(t.detach().clone(), requires_grad=bool(r)) for t, r in zip(leaves, requires, strict=False)]
    the_leaves = list(values)
    seen: list = []
    retained: list = []
    for step in program:
        if step[0] == "hook":
            record: list = []
            seen.append(record)

            def hook(g, record=record, factor=step[2]):
                record.append(g.detach().clone() if isinstance(g, torch.Tensor) else g.data.clone())
                return None if factor is None else g * factor

            values[step[1]].register_hook(hook)
        elif step[0] == "retain":
            values[step[1]].retain_grad()
            retained.append(values[step[1]])
        else:
            values.append(_apply(step, values, mode))
    return values, the_leaves, seen, retained


def _snapshot(leaves, seen, retained):
    return {"grads": [_data(v.grad) for v in leaves], "retained": [_data(v.grad) for v in retained],
            "seen": [list(r) for r in seen]}


def run_program(leaves, requires, program, root_grad, options, backward=None):
    """Run a graph program and its backward pass(es).

    ``backward`` is None for real torch (``root.backward``), or the student's
    ``backward(root, grad, retain_graph)`` for the mini engine. ``options``: ``retain_graph`` (bool)
    and ``twice`` (run backward a second time on the same graph).
    """
    mode = "torch" if backward is None else "mini"
    values, the_leaves, seen, retained = build_program(leaves, requires, program, mode)
    root = values[-1]
    retain = bool(options.get("retain_graph", False))

    def run():
        if mode == "torch":
            root.backward(root_grad.clone(), retain_graph=retain)
        else:
            from ptinternals.autograd.scaffold import Variable

            backward(root, Variable(root_grad.clone()), retain_graph=retain)

    try:
        run()
    except Exception as e:  # noqa: BLE001 (an engine that fails is judged on its error message)
        if mode == "torch":
            raise
        _reraise_if_stub(e)
        return {"error": _raised(e)}
    result = _snapshot(the_leaves, seen, retained)
    result["second"] = None
    if options.get("twice"):
        try:
            run()
            result["second"] = _snapshot(the_leaves, seen, retained)
        except Exception as e:  # noqa: BLE001 (a second backward through a freed graph raises: data)
            _reraise_if_stub(e)
            result["second"] = _raised(e)
    return result


def engine_probe(entry, leaves, requires, program, root_grad, options):
    """The student's engine ``entry(root, grad, retain_graph=...)`` on one program."""
    return run_program(leaves, requires, program, root_grad, options, backward=entry)


# ================================================================================================
# autograd.logsumexp, autograd.fake_quantize, autograd.swiglu: custom torch.autograd.Functions
# ================================================================================================
def _storage_key(t):
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr())


def saved_log(fn, *args):
    """Run ``fn(*args)`` under a pack hook; return (out, bytes of distinct storages saved, entries)."""
    import torch

    packed: list = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    per_storage: dict = {}
    entries = []
    for t in packed:
        nbytes = t.numel() * t.element_size()
        key = _storage_key(t)
        per_storage[key] = max(per_storage.get(key, 0), nbytes)
        entries.append((tuple(t.shape), str(t.dtype).replace("torch.", "")))
    return out, sum(per_storage.values()), entries


def function_probe(entry, inputs, params, grad_out, grad_grad, double=True, banned=()):
    """``entry.apply(*leaves, *params)`` with float leaves made from ``inputs``.

    Returns the output, the gradients for the inputs (for ``grad_out``), and, when ``double``, the
    second derivatives: the gradient of ``<grads, grad_grad>`` with respect to the inputs and to
    ``grad_out`` (what ``gradgradcheck`` compares against finite differences). Also the bytes saved
    for backward (each storage once), what was saved, and which of the ``banned`` torch functions
    (the one-call answers, e.g. ``logsumexp``) the forward called.
    """
    import torch

    if not (isinstance(entry, type) and issubclass(entry, torch.autograd.Function)):
        raise TypeError(f"expected a subclass of torch.autograd.Function, got {entry!r:.80}")
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    calls: set = set()
    with recording_torch_calls(calls):
        out, saved_bytes, saved = saved_log(lambda *xs: entry.apply(*xs, *params), *leaves)
    result = {"out": out.detach() if isinstance(out, torch.Tensor) else out, "saved_bytes": saved_bytes,
              "saved": saved, "banned_calls": sorted(c for c in calls if c in banned)}
    if not isinstance(out, torch.Tensor):
        return result
    if tuple(out.shape) != tuple(grad_out.shape):
        return result  # the forward's shape is already wrong: that is the message
    if not out.requires_grad:
        result["grads"] = _raised(RuntimeError("the output does not require grad: did forward detach it?"))
        return result
    v = grad_out.detach().clone().requires_grad_(double)
    try:
        grads = torch.autograd.grad(out, leaves, v, create_graph=double, allow_unused=True)
    except Exception as e:  # noqa: BLE001 (a failing backward is judged on its message)
        _reraise_if_stub(e)
        result["grads"] = _raised(e)
        return result
    result["grads"] = [None if g is None else g.detach() for g in grads]
    if double:
        pairs = [(g, w) for g, w in zip(grads, grad_grad, strict=False) if g is not None]
        if not pairs or not all(g.requires_grad for g, _ in pairs):
            result["gradgrads"] = _raised(RuntimeError(
                "the gradients have no graph (backward ran without recording: .detach(), .data, no_grad(), "
                "or @once_differentiable), so second derivatives cannot be taken"))
        else:
            try:
                gg = torch.autograd.grad([g for g, _ in pairs], [*leaves, v], [w for _, w in pairs],
                                         allow_unused=True)
                result["gradgrads"] = [torch.zeros_like(t) if g is None else g.detach()
                                       for g, t in zip(gg, [*leaves, v], strict=False)]
            except Exception as e:  # noqa: BLE001
                _reraise_if_stub(e)
                result["gradgrads"] = _raised(e)
    return result


def logsumexp_probe(entry, *args):
    """Exercise autograd.logsumexp: the stable computation is the exercise, so torch's one-call versions are flagged."""
    return function_probe(entry, *args, banned=("logsumexp", "softmax", "log_softmax"))


def fake_quantize_probe(entry, *args):
    """Exercise autograd.fake_quantize: torch's fake_quantize would be the whole answer."""
    return function_probe(entry, *args, banned=("fake_quantize_per_tensor_affine",
                                                 "fake_quantize_per_tensor_affine_cachemask"))


def torch_function_reference(fn, inputs, grad_out, grad_grad, double=True):
    """The same measurements for a torch expression ``fn(*leaves)`` (the trusted side's expectation)."""
    import torch

    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out, saved_bytes, saved = saved_log(fn, *leaves)
    v = grad_out.detach().clone().requires_grad_(double)
    grads = torch.autograd.grad(out, leaves, v, create_graph=double, allow_unused=True)
    result = {"out": out.detach(), "saved_bytes": saved_bytes, "saved": saved,
              "grads": [None if g is None else g.detach() for g in grads]}
    if double:
        gg = torch.autograd.grad([g for g in grads if g is not None], [*leaves, v],
                                 [w for g, w in zip(grads, grad_grad, strict=False) if g is not None], allow_unused=True)
        result["gradgrads"] = [torch.zeros_like(t) if g is None else g.detach() for g, t in zip(gg, [*leaves, v], strict=False)]
    return result


# ================================================================================================
# autograd.checkpoint: activation checkpointing
# ================================================================================================
def make_block(weights, biases, dropout_p):
    """``h -> tanh(h @ W_i + b_i)`` for each layer, with dropout after each tanh when ``dropout_p``."""
    import torch

    def block(h):
        for w, b in zip(weights, biases, strict=False):
            h = torch.tanh(h @ w + b)
            if dropout_p:
                h = torch.nn.functional.dropout(h, dropout_p, training=True)
        return h

    return block


@contextlib.contextmanager
def live_storages(log: list):
    """Record (weak reference, address, bytes) of the storage of every floating-point tensor an aten op
    returns: the activations (an RNG state or a bool mask is not one)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type != "meta":
                    s = t.untyped_storage()
                    log.append((StorageWeakRef(s), s.data_ptr(), s.nbytes()))
            return out

    with Recorder():
        yield


def kept_bytes(log: list, exclude, collect_above: int | None = None) -> int:
    """Bytes of the storages in ``log`` still alive, each once, not counting those of ``exclude``.

    Reference counting frees most tensors at once; when the count is above ``collect_above`` the
    cycle collector runs and the count is taken again (a gc.collect costs ~0.1 s, so only when needed).
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}

    def count() -> int:
        alive: dict = {}
        for ref, ptr, nbytes in log:
            if ptr not in skip and not ref.expired():
                alive[ptr] = nbytes
        return sum(alive.values())

    total = count()
    if collect_above is not None and total > collect_above:
        gc.collect()
        total = count()
    return total


def block_leaves(x, weights, biases, frozen=(), shared=()):
    """Fresh leaves for a block: ``frozen`` lists layers whose weight has requires_grad=False, ``shared`` pairs
    ``(k, j)``: layer k uses layer j's weight (tied parameters; its gradient is the sum over both layers)."""
    xl = x.detach().clone().requires_grad_(True)
    ws = [w.detach().clone().requires_grad_(k not in frozen) for k, w in enumerate(weights)]
    bs = [b.detach().clone().requires_grad_(True) for b in biases]
    for k, j in shared:
        ws[k] = ws[j]
    return xl, ws, bs


def run_block(call, x, weights, biases, dropout_p, seed, grad_out, collect_above=None, frozen=(), shared=()):
    """Forward through ``call(block, x_leaf)``, measure the activations it keeps, then backward."""
    import torch

    xl, ws, bs = block_leaves(x, weights, biases, frozen, shared)
    block = make_block(ws, bs, dropout_p)
    log: list = []
    torch.manual_seed(seed)
    gc.freeze()  # what exists now is not garbage: a later gc.collect() scans only the new objects (fast)
    try:
        with live_storages(log):
            out = call(block, xl)
        if not isinstance(out, torch.Tensor):
            return {"out": out}
        kept = kept_bytes(log, [xl, out, *ws, *bs], collect_above)
    finally:
        gc.unfreeze()
    result = {"out": out.detach().clone(), "kept_bytes": kept}
    if not out.requires_grad:
        result["grads"] = _raised(RuntimeError("the output does not require grad, so no gradient can flow back"))
        return result
    out.backward(grad_out)
    result["grads"] = [None if t.grad is None else t.grad.detach() for t in [xl, *ws, *bs]]
    return result


def checkpoint_probe(entry, x, weights, biases, dropout_p, seed, grad_out, frozen=(), shared=()):
    """``entry(block, x)``, the student's checkpoint, around a tanh MLP block; torch's own is off limits."""
    import torch.utils.checkpoint as tuc

    why = "build checkpointing yourself (a torch.autograd.Function or saved_tensors_hooks)"
    with banned([(tuc, "checkpoint", why), (tuc, "checkpoint_sequential", why)]):
        return run_block(lambda block, xl: entry(block, xl), x, weights, biases, dropout_p, seed, grad_out,
                         collect_above=x.numel() * x.element_size(), frozen=frozen, shared=shared)


# ================================================================================================
# autograd.accumulate: gradient accumulation
# ================================================================================================
def make_model(weights, frozen=()):
    """``Linear -> Tanh -> Linear`` in float64 with the given (w1, b1, w2, b2); the parameters at the positions
    in ``frozen`` get requires_grad=False (a frozen layer, as in fine-tuning)."""
    import torch

    w1, b1, w2, b2 = weights
    model = torch.nn.Sequential(torch.nn.Linear(w1.shape[1], w1.shape[0]), torch.nn.Tanh(),
                                torch.nn.Linear(w2.shape[1], w2.shape[0])).double()
    with torch.no_grad():
        for k, (p, w) in enumerate(zip(model.parameters(), weights, strict=False)):
            p.copy_(w)
            p.requires_grad_(k not in frozen)
    return model


def loss_function(kind: str):
    import torch.nn.functional as F

    return {"cross_entropy": F.cross_entropy, "mse": F.mse_loss}[kind]


def accumulation_probe(entry, weights, batch_x, batch_y, micro_batches, loss_kind, frozen=()):
    """``entry(model, loss_fn, x, y, micro_batches)``: the parameters' .grad afterwards, the returned loss,
    and the batch sizes the model saw (a forward hook on the model: runs only through ``model(x)``)."""
    import torch

    model = make_model(weights, frozen)
    for p in model.parameters():  # stale gradients from an earlier step: must not leak into this one
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    sizes: list = []
    model.register_forward_hook(lambda module, args, output: sizes.append(int(args[0].shape[0])))
    loss = entry(model, loss_function(loss_kind), batch_x, batch_y, micro_batches)
    if isinstance(loss, torch.Tensor):
        loss = loss.detach().reshape(-1)[0].item() if loss.numel() == 1 else loss.detach()
    return {"grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
            "loss": loss, "batch_sizes": sizes}
