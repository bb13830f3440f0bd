# %% [markdown]
# # {{title}}
#
# You call `model(x)`, `model.parameters()`, `model.state_dict()` and `model.eval()` every day. They
# are about 3,000 lines of Python in `torch/nn/modules/module.py`, and you can read every one of
# them: `torch.nn.Module` is not C++. It is bookkeeping: three dictionaries, an attribute hook that
# files every assignment into one of them, a few walks over the tree of modules, and a `__call__`
# that wraps `forward` in hooks.
#
# The bookkeeping is where the quiet bugs live, the ones that raise nothing:
#
# * `model.forward(x)` gives the right output and silently skips every hook on `model`;
# * a tensor stored as `self.mask = torch.ones(...)` is not moved by `.to()` and not saved;
# * a list of layers is invisible to `parameters()`, so the optimizer never trains it;
# * a checkpoint loaded with `strict=False` "loads fine" and trains from scratch;
# * `model.eval()` does not turn off gradient tracking.
#
# In this chapter you rebuild `nn.Module` piece by piece: registration, traversal, `.to()`,
# checkpoints, `__call__` with every kind of hook, and `torch.func.functional_call`. Each piece is
# checked against real `torch.nn.Module` on randomly generated module trees (with tied weights,
# shared blocks, frozen and missing parameters). Then you use what you built to hunt three bugs in a
# small model. Autograd ({{chapter autograd}}) is assumed: module backward hooks are autograd node
# hooks in disguise.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) followed by a *check cell*. Only code inside answer
# cells is graded, in a separate process without the course's reference implementation, on many
# more cases than the visible ones, against real PyTorch. The point is to write the machinery, so
# the grader also reads your answer cells' source: in the exercises that rebuild `nn.Module`, your
# classes may not inherit from `torch.nn.Module` (or any layer) or call its methods, and each exercise
# says what else is torch's own answer to it. In every answer cell: import only `torch`, the
# scaffold (`ptinternals.modules.scaffold`) and plain standard modules (`collections`, `itertools`,
# `functools`, `math`, `typing`, `warnings`...); no `eval`/`exec`, no `getattr` with a computed name,
# no `_private` names of torch, and no assignments into anything you imported. The check cell tells
# you at once if a line breaks one of these rules.
# Quiz answers are recorded beside this notebook: *practice* questions check your answer at once and
# count no points; *graded* ones only record it (the last answer counts) and are scored when your
# notebook is graded.

# %% [setup]
import warnings
from collections import OrderedDict

import torch
import torch.nn as nn

from ptinternals.grading import check
from ptinternals.modules.scaffold import BrokenNet, ModuleState, build_tree, example_spec
from ptinternals.quiz import quiz_progress, show_quiz
from ptinternals.viz.modules import draw_hook_timeline, draw_module_tree, trace_hook_calls

torch.manual_seed(0)

# %% [markdown]
# ## 1. A module is a tree of dictionaries
#
# Here is the model this chapter keeps coming back to. `build_tree` builds it from a plain-data
# description, on `nn.Module` here and later on your own classes, so the two can be compared one for
# one. It has everything that makes module bookkeeping interesting: `head.weight` *is*
# `embed.weight` (weight tying, as in every GPT), `block` is registered twice (as `block` and as
# `again`: one module object, called twice), `block.gamma` is frozen, `embed.bias` is a `None` slot
# (like `nn.Linear(..., bias=False)`), and `block` holds three buffers: a running mean, an int64 step
# counter and a cache that is not saved.

# %%
nodes = build_tree(example_spec(), nn.Module)
net = nodes[0]
print(net)
draw_module_tree(net, title="the example tree (faint: not saved by state_dict)")

# %% [markdown]
# Every module keeps its state in three ordered dicts (plus a set). Look at them directly:

# %%
block = net.block
print("_parameters:", {k: None if v is None else tuple(v.shape) for k, v in block._parameters.items()})
print("_buffers:   ", {k: None if v is None else (tuple(v.shape), v.dtype) for k, v in block._buffers.items()})
print("_non_persistent_buffers_set:", block._non_persistent_buffers_set)
print("_modules of the root:", list(net._modules))
print("'proj' in vars(block):", "proj" in vars(block), " <- not an instance attribute at all")

# %% [markdown]
# `block.proj` works although `proj` is not in `block.__dict__`: Python calls `__getattr__` only when
# normal lookup fails, and `Module.__getattr__` then searches `_parameters`, `_buffers` and `_modules`,
# in that order. The interesting half is the other direction: how does `self.proj = nn.Parameter(...)`
# end up in `_parameters`?
#
# ## 2. Registration: `__setattr__` files every assignment
#
# `Module.__setattr__` (torch/nn/modules/module.py) looks at the **value** first, then at the
# **name**:
#
# 1. a `Parameter` is registered as a parameter (after removing the name from `__dict__`, `_buffers`
#    and `_modules`: a name lives in one place at a time);
# 2. a name that already is a parameter accepts only a `Parameter` or `None` (else `TypeError`);
# 3. a `Module` is registered as a child; a name that already is a child accepts only a module or
#    `None`;
# 4. an `nn.Buffer`, or any tensor/None assigned to a name that already is a buffer, goes to
#    `_buffers` (keeping its persistence, or taking the `nn.Buffer`'s own);
# 5. **everything else**, including a plain tensor assigned to a new name, becomes an ordinary
#    instance attribute: `object.__setattr__`.
#
# Rule 5 is the trap. Watch it:

# %%
class Normalizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.mean = torch.zeros(3)                          # plain attribute: rule 5
        self.register_buffer("var", torch.ones(3))          # a buffer
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def forward(self, x):
        return (x - self.mean) / self.var.sqrt() * self.scale


norm = Normalizer()
print("state_dict keys:", list(norm.state_dict()))
print("buffers:        ", [n for n, _ in norm.named_buffers()])
norm.to(torch.float64)
print("after .to(float64): scale", norm.scale.dtype, "| var", norm.var.dtype, "| mean", norm.mean.dtype,
      " <- .to() never saw it")

# %% [markdown]
# The errors are part of the contract: they are how you learn, at construction time, that an
# assignment was not what you meant.

# %%
def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


class TooEarly(nn.Module):
    def __init__(self):
        self.w = nn.Parameter(torch.ones(1))  # before super().__init__(): there is no _parameters yet
        super().__init__()


print(attempt(lambda: setattr(norm, "scale", torch.ones(3))))               # rule 2
print(attempt(lambda: setattr(norm, "mean", nn.Buffer(torch.zeros(3)))))    # rule 4 meets a plain attribute
print(attempt(lambda: norm.register_buffer("a.b", torch.ones(1))))
print(attempt(TooEarly))
print(attempt(lambda: norm.does_not_exist))

# %% [markdown]
# The second line surprises most people: once `mean` is a plain attribute, assigning an
# `nn.Buffer` to it raises `KeyError: "attribute 'mean' already exists"`. Delete it first
# (`del norm.mean`), then assign.
#
# ### {{exercise register}}: registration
#
# Write the mixin `Registration`. It is used on top of the scaffold's `ModuleState`, which only
# creates the attributes `Module.__init__` creates (`training`, `_parameters`, `_buffers`,
# `_non_persistent_buffers_set`, `_modules` and the hook tables), with `object.__setattr__`, so your
# `__setattr__` never sees them. Implement:
#
# * `register_parameter(name, param)`, `register_buffer(name, tensor, persistent=True)`,
#   `add_module(name, module)`: `AttributeError` if the dicts do not exist yet (called before
#   `__init__`); `TypeError` for a name that is not a `str`; `KeyError` for a name containing `"."`,
#   an empty name, or a name that is already an attribute of another kind (`hasattr(self, name)` and
#   not in the dict being filled); `TypeError` for a wrong value (a non-Parameter parameter, a
#   non-tensor buffer, a non-module child). `None` is always allowed: it is a slot that every walk
#   skips. A "module" is any object with a `_modules` dict (`ModuleState` or a subclass).
# * `__setattr__(name, value)` with rules 1-5 above; `__getattr__(name)` searching the three dicts
#   and raising `AttributeError` (not `KeyError`: `hasattr` relies on it); `__delattr__(name)`
#   removing from the right place (and from `_non_persistent_buffers_set`).
#
# The checker applies random sequences of assignments, registrations, deletions and lookups to your
# class and to `torch.nn.Module`, and compares after every step: the outcome (or the exception's
# type), and the contents of the three dicts, the set and the plain attributes.

# %% [answer register]
import torch
from torch.nn import Buffer, Parameter


def _is_module(value):
    return "_modules" in getattr(value, "__dict__", {})


class Registration:
    def register_parameter(self, name, param):
        ### BEGIN SOLUTION
        # twin: ptinternals.modules.registration.ModuleBase
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"parameter name should be a string. Got {type(name).__name__}")
        if "." in name or name == "":
            raise KeyError(f"parameter name {name!r} can't contain '.' or be empty")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(torch.nn.Parameter or None required)")
        if param is not None and param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'")
        self._parameters[name] = param
        ### END SOLUTION

    def register_buffer(self, name, tensor, persistent=True):
        ### BEGIN SOLUTION
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {type(name).__name__}")
        if "." in name or name == "":
            raise KeyError(f"buffer name {name!r} can't contain '.' or be empty")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(torch Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)
        ### END SOLUTION

    def add_module(self, name, module):
        ### BEGIN SOLUTION
        if module is not None and not _is_module(module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {type(name).__name__}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name or name == "":
            raise KeyError(f"module name {name!r} can't contain '.' or be empty")
        self._modules[name] = module
        ### END SOLUTION

    def __getattr__(self, name):
        ### BEGIN SOLUTION
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        ### END SOLUTION

    def __setattr__(self, name, value):
        ### BEGIN SOLUTION
        def remove_from(*places):
            for place in places:
                if name in place:
                    if isinstance(place, dict):
                        del place[name]
                    else:
                        place.discard(name)

        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(self.__dict__, self._buffers, self._modules, self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        else:
            modules = self.__dict__.get("_modules")
            if _is_module(value):
                if modules is None:
                    raise AttributeError("cannot assign module before Module.__init__() call")
                remove_from(self.__dict__, self._parameters, self._buffers, self._non_persistent_buffers_set)
                modules[name] = value
            elif modules is not None and name in modules:
                if value is not None:
                    raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                    "(torch.nn.Module or None expected)")
                modules[name] = value
            else:
                buffers = self.__dict__.get("_buffers")
                if isinstance(value, Buffer) or (buffers is not None and name in buffers):
                    if value is not None and not isinstance(value, torch.Tensor):
                        raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                        "(torch.nn.Buffer, torch.Tensor or None expected)")
                    persistent = value.persistent if isinstance(value, Buffer) else \
                        name not in self._non_persistent_buffers_set
                    self.register_buffer(name, value, persistent)
                else:
                    object.__setattr__(self, name, value)
        ### END SOLUTION

    def __delattr__(self, name):
        ### BEGIN SOLUTION
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)
        ### END SOLUTION


# %% [tests register]
check("modules.register", Registration)
### BEGIN HIDDEN TESTS
check("modules.register", Registration, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("modules", "q1", "q2")

# %% [markdown]
# ## 3. Traversal: one walk, de-duplicated by identity
#
# `named_modules` is a pre-order walk of `_modules` (insertion order). `named_parameters` and
# `named_buffers` are the same walk, each module contributing its own `_parameters` (or `_buffers`)
# in insertion order (`Module._named_members`). Two memo sets make shared objects appear once:
#
# * a module instance reached twice (our `block`/`again`) is yielded once, under the first name, and
#   its subtree is not walked again;
# * a tensor reached twice (the tied `embed.weight`/`head.weight`) is yielded once.
#
# Both compare **objects** (`Module` and `Tensor` hash by identity), not values. With
# `remove_duplicate=False` every name comes out: that is how `torch.func.functional_call` finds all
# the names of a tied tensor (section 8). `state_dict()` never de-duplicates: it saves a tied tensor
# under each of its names.

# %%
print("named_modules:       ", [n for n, _ in net.named_modules()])
print("  remove_duplicate=F:", [n for n, _ in net.named_modules(remove_duplicate=False)])
print("named_parameters:    ", [n for n, _ in net.named_parameters()])
print("  remove_duplicate=F:", [n for n, _ in net.named_parameters(remove_duplicate=False)])
print("state_dict keys:     ", list(net.state_dict()))

# %% [markdown]
# Order matters more than it looks. An optimizer stores its per-parameter state (Adam's two moments)
# in the order `parameters()` gave it, and `optimizer.state_dict()` saves that state **by position**,
# not by name. Reorder the registrations in `__init__` (or add a layer in the middle) and an old
# optimizer checkpoint loads without error onto the wrong tensors, as long as the shapes happen to
# agree. Counting parameters also depends on de-duplication:

# %%
tied = sum(p.numel() for p in net.parameters())
untied = sum(p.numel() for _, p in net.named_parameters(remove_duplicate=False))
print(f"parameters: {tied} counted once each, {untied} if tied weights and shared blocks were counted twice")

# %% [markdown]
# ### {{exercise traverse}}: traversal
#
# Write the mixin `Traversal` with `named_modules(memo=None, prefix="", remove_duplicate=True)`,
# `named_children()`, `children()`, `named_parameters(prefix="", recurse=True, remove_duplicate=True)`,
# `parameters(recurse=True)`, `named_buffers(prefix="", recurse=True, remove_duplicate=True)` and
# `buffers(recurse=True)`, all generators, with torch's names, order and de-duplication. `None`
# entries are never yielded; `named_children` always de-duplicates; names are joined with `"."` only
# when the prefix is not empty; `recurse=False` yields only the module's own members (with the
# prefix). The checker builds random trees of your class (through the dicts directly) and of
# `nn.Module`, and compares names, order, and which yields are the same object.

# %% [answer traverse]
class Traversal:
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        ### BEGIN SOLUTION
        # twin: ptinternals.modules.traversal.Traversal
        if memo is None:
            memo = set()
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)
        ### END SOLUTION

    def named_children(self):
        ### BEGIN SOLUTION
        seen = set()
        for name, module in self._modules.items():
            if module is not None and module not in seen:
                seen.add(module)
                yield name, module
        ### END SOLUTION

    def children(self):
        ### BEGIN SOLUTION
        for _, module in self.named_children():
            yield module
        ### END SOLUTION

    def _named_members(self, get_members, prefix, recurse, remove_duplicate):
        ### BEGIN SOLUTION
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in get_members(module):
                if value is None or value in seen:
                    continue
                if remove_duplicate:
                    seen.add(value)
                yield module_prefix + ("." if module_prefix else "") + name, value
        ### END SOLUTION

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        ### BEGIN SOLUTION
        yield from self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)
        ### END SOLUTION

    def parameters(self, recurse=True):
        ### BEGIN SOLUTION
        for _, p in self.named_parameters(recurse=recurse):
            yield p
        ### END SOLUTION

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        ### BEGIN SOLUTION
        yield from self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)
        ### END SOLUTION

    def buffers(self, recurse=True):
        ### BEGIN SOLUTION
        for _, b in self.named_buffers(recurse=recurse):
            yield b
        ### END SOLUTION


# %% [tests traverse]
check("modules.traverse", Traversal)
### BEGIN HIDDEN TESTS
check("modules.traverse", Traversal, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("modules", "q3")

# %% [markdown]
# ## 4. Moving and casting: `_apply` keeps your parameters' identity
#
# `model.to(...)`, `.float()`, `.half()`, `.double()`, `.cuda()` and `.cpu()` all end in
# `Module._apply(fn)`: walk the children first, then, for each of this module's own tensors:
#
# * **parameter**: `param.data = fn(param)` under `torch.no_grad()`. The Parameter *object* stays
#   the same; only the tensor inside it is replaced. Every reference to it stays valid: the
#   optimizer's `param_groups`, the other module a tied weight lives in, your own variables;
# * **its gradient**: converted by the same rule, so `.grad` keeps matching its parameter;
# * **buffer**: replaced, `self._buffers[name] = fn(buf)` (nobody holds buffers by reference);
# * a plain attribute: untouched (section 2).
#
# `Module.to` converts only floating-point and complex tensors to a new dtype: an int64 step counter
# stays int64 (`.type(dtype)` casts everything).

# %%
model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)   # built BEFORE the conversion
weight_before, running_mean_before = model[0].weight, model[1].running_mean
model(torch.randn(4, 3)).sum().backward()

model.to(torch.float64)
print("same Parameter object:", model[0].weight is weight_before, "| dtype", model[0].weight.dtype,
      "| grad dtype", model[0].weight.grad.dtype)
print("the optimizer holds it:", opt.param_groups[0]["params"][0] is model[0].weight)
print("buffer replaced:", model[1].running_mean is not running_mean_before,
      "| num_batches_tracked stays", model[1].num_batches_tracked.dtype)
opt.step()  # steps the float64 parameters of the model: training continues

# %% [markdown]
# Two opt-in flags change this. `torch.__future__.set_overwrite_module_params_on_conversion(True)`
# makes `_apply` put **new** Parameter objects into `_parameters`: an optimizer built before `.to()`
# then updates orphaned tensors and the model silently stops training.
# `torch.__future__.set_swap_module_params_on_conversion(True)` uses `torch.utils.swap_tensors`,
# which exchanges the contents of the two Python objects, so identity survives even where `.data =`
# is impossible (tensor subclasses such as DTensor); `load_state_dict` uses it too when the flag is
# set.

# %%
torch.__future__.set_overwrite_module_params_on_conversion(True)
try:
    lin = nn.Linear(2, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    lin.double()
    print("overwrite flag: the optimizer still holds the model's weight?", opt.param_groups[0]["params"][0] is lin.weight)
finally:
    torch.__future__.set_overwrite_module_params_on_conversion(False)

# %% [markdown]
# ### {{exercise convert}}: conversion
#
# Write the mixin `Conversion` with `_apply(fn, recurse=True)` and `to(*args, **kwargs)`:
#
# * `_apply`: if `recurse`, first call `_apply(fn)` on each child in `self._modules` (skip None slots,
#   and visit a child registered under two names once, as `children()` does). Then for each non-None
#   parameter in `self._parameters`: compute `fn(param)` under `torch.no_grad()`; if
#   `has_compatible_shallow_copy_type(param, new)` (from the scaffold: torch's private
#   `torch._has_compatible_shallow_copy_type` under a public name) and not
#   `torch.__future__.get_overwrite_module_params_on_conversion()`, do `param.data = new`, else put
#   `Parameter(new, param.requires_grad)` into `_parameters`. Then the same for `param.grad` (if not
#   None) on the parameter that is now in place. Finally replace every non-None buffer by `fn(buf)`.
#   Return `self`.
# * `to`: parse the arguments with the scaffold's `parse_to(*args, **kwargs)` (torch's
#   `torch._C._nn._parse_to`; it returns `device, dtype, non_blocking, memory_format`), raise
#   `TypeError` for a dtype that is neither floating point nor complex, and `_apply` a function that
#   calls `t.to(device, dtype if t.is_floating_point() or t.is_complex() else None, non_blocking)`.
#
# The checker builds random trees, runs a backward (so gradients exist), builds an optimizer, then
# converts, steps, and compares with torch: dtypes, gradients, which objects are still the same, and
# the values after the step. One of its conversions is not idempotent, so convert each module's own
# `_parameters`, exactly once per module, as torch does.

# %% [answer convert]
import torch
from torch.nn import Parameter

from ptinternals.modules.scaffold import has_compatible_shallow_copy_type, parse_to


class Conversion:
    def _apply(self, fn, recurse=True):
        ### BEGIN SOLUTION
        # twin: ptinternals.modules.conversion.Conversion
        if recurse:
            seen = set()
            for module in self._modules.values():
                if module is not None and module not in seen:
                    seen.add(module)
                    module._apply(fn)

        def keep_object(old, new):
            return (has_compatible_shallow_copy_type(old, new)
                    and not torch.__future__.get_overwrite_module_params_on_conversion())

        for key, param in self._parameters.items():
            if param is None:
                continue
            with torch.no_grad():
                new = fn(param)
            grad = param.grad
            if keep_object(param, new):
                param.data = new
                out = param
            else:
                out = Parameter(new, param.requires_grad)
                self._parameters[key] = out
            if grad is not None:
                with torch.no_grad():
                    new_grad = fn(grad)
                if keep_object(grad, new_grad):
                    out.grad.data = new_grad
                else:
                    out.grad = new_grad.requires_grad_(grad.requires_grad)
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self
        ### END SOLUTION

    def to(self, *args, **kwargs):
        ### BEGIN SOLUTION
        device, dtype, non_blocking, _ = parse_to(*args, **kwargs)
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired dtype={dtype}")

        def convert(t):
            return t.to(device, dtype if (t.is_floating_point() or t.is_complex()) else None, non_blocking)

        return self._apply(convert)
        ### END SOLUTION


# %% [tests convert]
check("modules.convert", Conversion)
### BEGIN HIDDEN TESTS
check("modules.convert", Conversion, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("modules", "q4")

# %% [markdown]
# ## 5. Checkpoints: `state_dict` and `load_state_dict`
#
# `state_dict()` is the same pre-order walk: each module writes `prefix + name` for its non-None
# parameters, then its non-None **persistent** buffers, then recurses with `prefix + child + "."`.
# The values are `detach()`-ed **aliases** of the live tensors, not copies (call `.clone()` if you
# keep a snapshot while training goes on). The returned `OrderedDict` carries a `_metadata`
# attribute: per module path, `{"version": cls._version}`.

# %%
sd = net.state_dict()
print(list(sd))
print("alias, not copy:", sd["block.proj"].data_ptr() == net.block.proj.data_ptr())
print("_metadata:", dict(sd._metadata))
print("BatchNorm1d._version =", nn.BatchNorm1d._version)

# %% [markdown]
# Versions let a module upgrade old checkpoints in its own `_load_from_state_dict`. `BatchNorm`
# gained `num_batches_tracked` in version 2; when it loads a checkpoint whose metadata says version
# < 2, or that has **no metadata at all**, and the counter is missing, it keeps the module's own
# counter (torch/nn/modules/batchnorm.py, `_NormBase._load_from_state_dict`) instead of reporting
# the key. So a checkpoint rebuilt as a plain dict (`dict(sd)` or `{k: v for k, v in sd.items()}`
# drops `_metadata`) is read as "very old": keep `_metadata` when you edit checkpoints.

# %%
bn = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
ckpt = bn.state_dict()
del ckpt["1.num_batches_tracked"]
print("with _metadata:   ", bn.load_state_dict(ckpt, strict=False))
print("without _metadata:", bn.load_state_dict(dict(ckpt), strict=False))

# %% [markdown]
# Loading walks the tree again. Each module looks up `prefix + name` for each of its parameters
# and persistent buffers: present keys are checked for shape and then **copied into** the existing
# tensor (`param.copy_(value)` under `no_grad`: the model keeps its objects, dtypes and devices);
# absent keys are *missing*; keys under the module's prefix that name nothing it owns (and no child)
# are *unexpected*. Then:
#
# * `strict=True` (the default) raises a `RuntimeError` listing both;
# * `strict=False` raises nothing and **returns** them as `_IncompatibleKeys(missing_keys, unexpected_keys)`.
#   The lists are filled either way: `strict` only decides whether they raise;
# * a shape mismatch is an error even with `strict=False`.
#
# The classic silent failure is a checkpoint saved from a wrapper: `nn.DataParallel` and DDP save
# every key under `module.`, `torch.compile` under `_orig_mod.`.

# %%
model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
wrapped_ckpt = nn.DataParallel(model).state_dict()
print(list(wrapped_ckpt)[:2])
fresh = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
result = fresh.load_state_dict(wrapped_ckpt, strict=False)
print("strict=False loaded:", result)
print("strict=True:", attempt(lambda: fresh.load_state_dict(wrapped_ckpt)).split("\n")[0], "...")

# %% [markdown]
# `assign=True` puts the checkpoint's tensors themselves into the module instead of copying (each
# parameter keeps its `requires_grad`). That is how a model built on the `meta` device (shapes, no
# memory) gets its weights without allocating twice; a plain `copy_` into a meta tensor does
# nothing, and torch warns.

# %%
with torch.device("meta"):
    big = nn.Linear(4, 4)
print("meta:", big.weight.is_meta)
big.load_state_dict(nn.Linear(4, 4).state_dict(), assign=True)
print("after assign=True:", big.weight.device, big.weight.requires_grad)

# %% [markdown]
# ### {{exercise state_dict}}: checkpoints
#
# Write the mixin `StateDict` with `state_dict(*, destination=None, prefix="", keep_vars=False)` and
# `load_state_dict(state_dict, strict=True, assign=False)`:
#
# * `state_dict`: as above, `OrderedDict` with `_metadata` (`destination._metadata[prefix[:-1]] =
#   {"version": self._version}` for every module), values `detach()`-ed unless `keep_vars`.
# * `load_state_dict`: walk the tree; per module, for each
#   non-None parameter and persistent buffer: missing key -> `missing_keys`; a value that is not a
#   tensor -> an error message; a 0-dim tensor in the model and a shape-`(1,)` value -> use
#   `value[0]` (old checkpoints); another shape -> `f"size mismatch for {key}: copying a param with
#   shape {value.shape} from checkpoint, the shape in current model is {param.shape}."`; else copy (or,
#   with `assign`, set a `Parameter(value, requires_grad=param.requires_grad)` / the tensor itself in
#   the dict). Unexpected: keys starting with the prefix whose next name part is neither a local
#   tensor (for a key without further dots) nor a child (for `child.rest`). Return
#   `IncompatibleKeys(missing, unexpected)` (defined below: torch's namedtuple); raise
#   `RuntimeError("Error(s) in loading state_dict for <ClassName>:\n\t" + "\n\t".join(messages))` when
#   there are errors or (`strict` and) missing/unexpected keys, with the lines
#   `Missing key(s) in state_dict: "a", "b". ` and `Unexpected key(s) in state_dict: "c". ` first.
#
# The checker loads randomly damaged checkpoints (dropped keys, stray keys, a `module.` prefix,
# wrong shapes, a float64 value...) into random trees of your class and of `nn.Module`, with every
# combination of `strict` and `assign`, and compares the result, the error lines, and the values,
# dtypes and identities of every tensor afterwards.

# %% [answer state_dict]
import itertools
from collections import OrderedDict, namedtuple

import torch
from torch.nn import Parameter


class IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()


class StateDict:
    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        ### BEGIN SOLUTION
        # twin: ptinternals.modules.state_dict.StateDict
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = {"version": self._version}
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        for name, child in self._modules.items():
            if child is not None:
                child.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        return destination
        ### END SOLUTION

    def _load_local(self, state_dict, prefix, assign, missing, unexpected, errors):
        ### BEGIN SOLUTION
        persistent = {k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set}
        local = {k: v for k, v in itertools.chain(self._parameters.items(), persistent.items()) if v is not None}
        for name, param in local.items():
            key = prefix + name
            if key not in state_dict:
                missing.append(key)
                continue
            value = state_dict[key]
            if not isinstance(value, torch.Tensor):
                errors.append(f'While copying the parameter named "{key}", expected torch.Tensor or Tensor-like '
                              f"object from checkpoint but received {type(value)}")
                continue
            if param.dim() == 0 and value.dim() == 1 and value.shape[0] == 1:
                value = value[0]
            if value.shape != param.shape:
                errors.append(f"size mismatch for {key}: copying a param with shape {value.shape} from checkpoint, "
                              f"the shape in current model is {param.shape}.")
                continue
            with torch.no_grad():
                if not assign:
                    param.copy_(value)
                elif name in self._parameters:
                    self._parameters[name] = Parameter(value, requires_grad=param.requires_grad)
                else:
                    self._buffers[name] = value
        for key in state_dict:
            if key.startswith(prefix):
                head, dot, _ = key[len(prefix):].partition(".")
                if (dot and head not in self._modules) or (not dot and head not in local):
                    unexpected.append(key)
        ### END SOLUTION

    def load_state_dict(self, state_dict, strict=True, assign=False):
        ### BEGIN SOLUTION
        missing, unexpected, errors = [], [], []

        def load(module, local_sd, prefix):
            module._load_local(local_sd, prefix, assign, missing, unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    load(child, {k: v for k, v in local_sd.items() if k.startswith(child_prefix)}, child_prefix)

        load(self, OrderedDict(state_dict), "")
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        return IncompatibleKeys(missing, unexpected)
        ### END SOLUTION


# %% [tests state_dict]
check("modules.state_dict", StateDict)
### BEGIN HIDDEN TESTS
check("modules.state_dict", StateDict, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("modules", "q5")

# %% [markdown]
# ## 6. `__call__` is `_call_impl`: hooks around `forward`
#
# `model(x)` runs `Module._call_impl(x)`. Without any hook (the common case) it is just
# `self.forward(x)`. With hooks, step by step:
#
# 1. **forward pre-hooks**: the global ones (`torch.nn.modules.module.register_module_forward_pre_hook`,
#    for every module of the process: profilers use them), then the module's own.
#    `hook(module, args)` may return new args (a bare value is wrapped in a 1-tuple); registered with
#    `with_kwargs=True`, `hook(module, args, kwargs)` may return a new `(args, kwargs)` pair;
# 2. if there are backward hooks: the tensor args pass through an identity autograd Function;
# 3. `result = self.forward(*args, **kwargs)`;
# 4. **forward hooks**, global first: `hook(module, args, result)` (or with kwargs); a non-None
#    return value **replaces** the result, and later hooks see the replacement;
# 5. if there are backward hooks: the result passes through another identity Function;
# 6. if any of this raised, the hooks registered with `always_call=True` that have not run yet run
#    now (with `result` possibly None), and the exception propagates.
#
# `prepend=True` puts a hook first among the module's own hooks of its kind. And `model.forward(x)`
# runs step 3 alone: the module's hooks are skipped, silently. The tools that rely on hooks are not
# exotic: FSDP gathers a layer's sharded weights in a forward pre-hook, activation checkpointing
# wrappers, quantization observers and most profilers use them.

# %%
events = []
seq = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
seq.register_forward_pre_hook(lambda m, args: events.append("pre: seq"))
seq[0].register_forward_hook(lambda m, args, out: events.append("hook: linear") or out * 0)  # replaces!
seq[0].register_forward_hook(lambda m, args, out: events.append(f"second hook sees {out.abs().sum().item()}"))
seq[0].register_forward_pre_hook(lambda m, args: events.append("pre: linear (prepended)"), prepend=True)
print(seq(torch.ones(1, 2)), events)
events.clear()
seq.forward(torch.ones(1, 2))
print("seq.forward(x): the Sequential's own pre-hook is skipped:", events)

# %% [markdown]
# ### Backward hooks: where does a module's gradient come from?
#
# Autograd knows nothing of modules: a module's forward records any number of nodes. So
# `_call_impl` brackets the forward with two **identity** autograd Functions
# (`BackwardHookFunction` in torch/nn/modules/_functions.py, driven by `BackwardHook` in
# torch/utils/hooks.py):
#
#     args --[identity: node In]--> forward --> out --[identity: node Out]--> ...
#
# A node hook on **Out** runs when the gradient of the module's output arrives: it calls the
# **backward pre-hooks** `hook(module, grad_output)`, which may replace `grad_output`. The gradient
# then flows through the forward's own nodes to **In**, whose node hook has the gradients with
# respect to the module's inputs and calls the **full backward hooks**
# `hook(module, grad_input, grad_output)`, which may replace `grad_input`. Two consequences:
#
# * the forward receives a *view* of each input (the identity's output), which is why in-place
#   changes to inputs are refused while backward hooks are registered;
# * if no input requires grad (a first layer fed with data), node In is never created and the full
#   backward hooks fire right away, from Out's hook, with `grad_input` all None; a module whose
#   output needs no gradient (a frozen stem fed with data) gets no backward hook call at all.
#
# The timeline below records every hook of the example tree during one forward and one backward:
# each bar is one call, from its pre-hook to its hook.

# %%
x = torch.ones(2, 3, requires_grad=True)
draw_hook_timeline(trace_hook_calls(net, x), title="hook calls of net(x).sum().backward()")

# %% [markdown]
# ### {{exercise call}}: `__call__` with hooks
#
# Write the mixin `Calling` with:
#
# * `register_forward_pre_hook(hook, *, prepend=False, with_kwargs=False)`,
#   `register_forward_hook(hook, *, prepend=False, with_kwargs=False, always_call=False)`,
#   `register_full_backward_pre_hook(hook, prepend=False)`,
#   `register_full_backward_hook(hook, prepend=False)`: store the hook in the module's table
#   (`self._forward_pre_hooks`... are `OrderedDict`s; `torch.utils.hooks.RemovableHandle(table,
#   extra_dict=...)` gives a handle with a unique `.id` and a `remove()` that cleans the side tables
#   too) and return the handle. Use `table.move_to_end(handle.id, last=False)` for `prepend`.
# * `__call__(*args, **kwargs)`: steps 1-6 above, with the module's own hooks (global hooks are not
#   part of the exercise). For backward hooks write your own identity `torch.autograd.Function`
#   (forward returns its tensor inputs, marking those that do not require grad with
#   `ctx.mark_non_differentiable`; backward returns its gradients) and attach the two node hooks
#   with `grad_fn.register_hook(fn)`, where `fn(grad_inputs, grad_outputs)` may return replacement
#   `grad_inputs`. Only set up the In node when some tensor argument requires grad and grad mode is
#   on; the same for Out.
#
# The checker registers random hooks (each kind, `prepend`, `with_kwargs`, `always_call`, hooks that
# change args, outputs and gradients) on random trees of your class and of `nn.Module`, runs forward
# and backward, and compares the order of hook calls, the outputs and every gradient.

# %% [answer call]
import warnings

import torch
from torch.utils.hooks import RemovableHandle


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *tensors):
        ### BEGIN SOLUTION
        # twin: ptinternals.modules.call.Calling
        ctx.mark_non_differentiable(*[t for t in tensors if not t.requires_grad])
        return tensors
        ### END SOLUTION

    @staticmethod
    def backward(ctx, *grads):
        ### BEGIN SOLUTION
        return grads
        ### END SOLUTION


class Calling:
    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        ### BEGIN SOLUTION
        handle = RemovableHandle(self._forward_pre_hooks, extra_dict=self._forward_pre_hooks_with_kwargs)
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle
        ### END SOLUTION

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        ### BEGIN SOLUTION
        handle = RemovableHandle(self._forward_hooks,
                                 extra_dict=[self._forward_hooks_with_kwargs, self._forward_hooks_always_called])
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle
        ### END SOLUTION

    def register_full_backward_pre_hook(self, hook, prepend=False):
        ### BEGIN SOLUTION
        handle = RemovableHandle(self._backward_pre_hooks)
        self._backward_pre_hooks[handle.id] = hook
        if prepend:
            self._backward_pre_hooks.move_to_end(handle.id, last=False)
        return handle
        ### END SOLUTION

    def register_full_backward_hook(self, hook, prepend=False):
        ### BEGIN SOLUTION
        handle = RemovableHandle(self._backward_hooks)
        self._backward_hooks[handle.id] = hook
        if prepend:
            self._backward_hooks.move_to_end(handle.id, last=False)
        return handle
        ### END SOLUTION

    def _through_identity(self, values, node_hook):
        """Pass the tensors among ``values`` through _Identity; return (new values, their positions or None)."""
        ### BEGIN SOLUTION
        positions = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        if not (torch.is_grad_enabled() and any(values[i].requires_grad for i in positions)):
            return values, None
        outs = _Identity.apply(*[values[i] for i in positions])
        next(t.grad_fn for t in outs if t.grad_fn is not None).register_hook(node_hook)
        new = list(values)
        for i, t in zip(positions, outs):
            new[i] = t
        return tuple(new), positions
        ### END SOLUTION

    def _attach_backward_hooks(self, args, state):
        """Step 2: the In node. ``state`` is a dict shared with step 5."""
        ### BEGIN SOLUTION
        def on_input_grads(grad_inputs, _):
            if state["grad_output"] is None:
                return None
            full = [None] * len(args)
            for i, g in zip(state["in_positions"], grad_inputs):
                full[i] = g
            full = tuple(full)
            for hook in self._backward_hooks.values():
                out = hook(self, full, state["grad_output"])
                if out is not None:
                    if len(out) != len(full):
                        raise RuntimeError("Backward hook returned an invalid number of grad_input, "
                                           f"got {len(out)}, but expected {len(full)}")
                    full = out
            state["grad_output"] = None
            return tuple(full[i] for i in state["in_positions"])

        new_args, state["in_positions"] = self._through_identity(args, on_input_grads)
        state["n_inputs"] = len(args)
        return new_args
        ### END SOLUTION

    def _attach_output_hook(self, result, state):
        """Step 5: the Out node."""
        ### BEGIN SOLUTION
        outputs = result if isinstance(result, tuple) else (result,)

        def on_output_grads(_, grad_outputs):
            full = [None] * len(outputs)
            for i, g in zip(state["out_positions"], grad_outputs):
                full[i] = g
            state["grad_output"] = tuple(full)
            for hook in self._backward_pre_hooks.values():
                new = hook(self, state["grad_output"])
                if new is not None:
                    if len(new) != len(full):
                        raise RuntimeError("Backward pre hook returned an invalid number of grad_output, "
                                           f"got {len(new)}, but expected {len(full)}")
                    state["grad_output"] = new
            passed_on = state["grad_output"]
            if state["in_positions"] is None:  # no input needs grad: the full hooks fire now
                for hook in self._backward_hooks.values():
                    hook(self, (None,) * state["n_inputs"], state["grad_output"])
                state["grad_output"] = None
            return tuple(passed_on[i] for i in state["out_positions"])

        new_outputs, state["out_positions"] = self._through_identity(outputs, on_output_grads)
        return new_outputs if isinstance(result, tuple) else new_outputs[0]
        ### END SOLUTION

    def __call__(self, *args, **kwargs):
        ### BEGIN SOLUTION
        if not (self._forward_pre_hooks or self._forward_hooks or self._backward_pre_hooks or self._backward_hooks):
            return self.forward(*args, **kwargs)
        result = None
        done = set()
        try:
            for hook_id, hook in self._forward_pre_hooks.items():
                if hook_id in self._forward_pre_hooks_with_kwargs:
                    new = hook(self, args, kwargs)
                    if new is not None:
                        if not (isinstance(new, tuple) and len(new) == 2):
                            raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, "
                                               f"new_kwargs), but got {new}.")
                        args, kwargs = new
                else:
                    new = hook(self, args)
                    if new is not None:
                        args = new if isinstance(new, tuple) else (new,)
            state = None
            if self._backward_hooks or self._backward_pre_hooks:
                state = {"grad_output": None}
                args = self._attach_backward_hooks(args, state)
            result = self.forward(*args, **kwargs)
            for hook_id, hook in self._forward_hooks.items():
                if hook_id in self._forward_hooks_always_called:
                    done.add(hook_id)
                if hook_id in self._forward_hooks_with_kwargs:
                    new = hook(self, args, kwargs, result)
                else:
                    new = hook(self, args, result)
                if new is not None:
                    result = new
            if state is not None:
                result = self._attach_output_hook(result, state)
            return result
        except Exception:
            for hook_id, hook in self._forward_hooks.items():
                if hook_id in self._forward_hooks_always_called and hook_id not in done:
                    try:
                        if hook_id in self._forward_hooks_with_kwargs:
                            new = hook(self, args, kwargs, result)
                        else:
                            new = hook(self, args, result)
                        if new is not None:
                            result = new
                    except Exception as e:
                        warnings.warn("module forward hook with ``always_call=True`` raised an exception that was "
                                      f"silenced as another error was raised in forward: {e}", stacklevel=2)
            raise
        ### END SOLUTION


# %% [tests call]
check("modules.call", Calling)
### BEGIN HIDDEN TESTS
check("modules.call", Calling, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise hook_order}}: predict the order
#
# Now without running anything. A *chain tree* describes a model whose modules each multiply their
# input by their own parameter (if they have one; `"trainable"` or `"frozen"`), then call their
# children one after another on the result:
#
#     {"name": "net", "param": None, "children": [
#         {"name": "stem", "param": "frozen", "children": []},
#         {"name": "body", "param": "trainable", "children": [{"same_as": "stem"}]}]}
#
# `{"same_as": path}` is a child that *is* the module defined earlier at that dotted path (called
# again). Every module has the four hooks. Write `hook_order(tree, input_requires_grad)` returning
# the events of `root(x)` and then, if the root's output requires grad, of `root(x).sum().backward()`,
# as a list of `(kind, path)` with kinds `"pre"`, `"fwd"`, `"bwd-pre"`, `"bwd"` and paths like
# `"body"` (`""` for the root; a shared module is reported under the path where it was defined).
# Plain Python: `torch` is not available in this exercise. Work out the backward rules from the
# timeline above and from the two consequences of the identity-Function trick.

# %% [answer hook_order]
def hook_order(tree, input_requires_grad):
    ### BEGIN SOLUTION
    # twin: ptinternals.modules.hook_order.predict_hook_order
    table = {}

    def index(node, path):
        table[path] = node
        for child in node.get("children", []):
            if "same_as" not in child:
                index(child, (path + "." if path else "") + child["name"])

    index(tree, "")
    forward = []

    def call(path, in_req):
        node = table[path]
        forward.append(("pre", path))
        req = in_req or node.get("param") == "trainable"
        calls = []
        for child in node.get("children", []):
            child_path = child["same_as"] if "same_as" in child else (path + "." if path else "") + child["name"]
            sub = call(child_path, req)
            calls.append(sub)
            req = sub[2]
        forward.append(("fwd", path))
        return path, in_req, req, calls

    backward = []

    def back(record):
        path, in_req, out_req, calls = record
        if not out_req:
            return
        backward.append(("bwd-pre", path))
        if not in_req:
            backward.append(("bwd", path))
        for sub in reversed(calls):
            back(sub)
        if in_req:
            backward.append(("bwd", path))

    back(call("", input_requires_grad))
    return forward + backward
    ### END SOLUTION


# %% [tests hook_order]
check("modules.hook_order", hook_order)
### BEGIN HIDDEN TESTS
check("modules.hook_order", hook_order, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("modules", "q6", "q7", "q9", "q10", "q11")

# %% [markdown]
# ## 7. Modes: `train()`/`eval()` is a flag, `no_grad()` is autograd
#
# `model.eval()` is `model.train(False)`: it sets the attribute `training` on every module of the tree
# and does nothing else. Layers read the flag in their forward: `Dropout` stops dropping,
# `BatchNorm` normalises with its running statistics and stops updating them. It does **not**
# touch autograd: an eval-mode forward still records the graph and keeps every activation it needs
# for a backward. That is `torch.no_grad()` (or the stricter `torch.inference_mode()`, see
# {{chapter autograd}}), a thread-local switch of the autograd engine that knows nothing of modules.
# Evaluation wants both.

# %%
mlp = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.BatchNorm1d(8))
batch = torch.randn(16, 4)
mlp.eval()
y = mlp(batch)
print("eval():           training flags", {m.training for m in mlp.modules()}, "| grad_fn", type(y.grad_fn).__name__)
with torch.no_grad():
    y = mlp(batch)
print("eval()+no_grad(): grad_fn", y.grad_fn, "| deterministic:", torch.equal(mlp(batch), mlp(batch)))
mlp.train()
print("train(): dropout is random again:", not torch.equal(mlp(batch), mlp(batch)))

# %% [quiz]
show_quiz("modules", "q8")

# %% [markdown]
# ## 8. Functional calls: a module as a pure function of its parameters
#
# A module is state (its tensors) plus code (its forward). `torch.func.functional_call(model,
# {name: tensor}, args)` separates them for one call: it writes the given tensors into
# `_parameters`/`_buffers` (plain dict writes: any tensor fits, not only Parameters), calls
# `model(*args)` (hooks included), and puts the originals back in a `finally`. The result is a
# function of (parameters, inputs) with no hidden state, which is what the function transforms need:
# `torch.func.grad` differentiates with respect to the dict, `vmap` maps over a batch of inputs or
# of parameter sets (ensembles), and `torch.compile` (its own chapter, after Triton) traces modules the same
# way, lifting parameters to graph inputs. Per-example gradients in three lines:

# %%
from torch.func import functional_call as torch_functional_call
from torch.func import grad, vmap

lin = nn.Linear(3, 1)
params = {k: v.detach() for k, v in lin.named_parameters()}
xs, ys = torch.randn(5, 3), torch.randn(5, 1)


def loss_fn(p, x, y):
    return ((torch_functional_call(lin, p, (x,)) - y) ** 2).mean()


per_example = vmap(grad(loss_fn), in_dims=(None, 0, 0))(params, xs, ys)
print({k: tuple(v.shape) for k, v in per_example.items()}, "<- one gradient per example")
print("the module's own weight is back:", lin.weight is lin._parameters["weight"] and lin.weight.requires_grad)

# %% [markdown]
# Tied weights need care: with `tie_weights=True` (the default), a value given for one name of a
# tied tensor is used for all its names (found with `named_parameters(remove_duplicate=False)`), and
# two different values for one tied tensor raise. With `strict=True` the given names must be exactly
# all parameter and buffer names.
#
# ### {{exercise functional_call}}: `functional_call`
#
# Write `functional_call(module, parameters_and_buffers, args=(), kwargs=None, *, tie_weights=True,
# strict=False)` for real `torch.nn.Module`s (a single dict; `args` a tuple or a single value):
#
# * with `tie_weights`: for every given name that belongs to a tied group (same tensor object under
#   several names, parameters and buffers), give every name of the group that value; raise
#   `ValueError` if the group received two different tensor objects;
# * with `strict`: `RuntimeError` listing `Unexpected key(s): 'a', 'b'.` and `Missing key(s): ...`
#   (names sorted, compared with every parameter and buffer name, duplicates included);
# * for each name, resolve the dotted path through `_modules`, swap the value into `_parameters` or
#   `_buffers` (a name that is neither is a plain attribute for the call: write it into the owner's
#   `__dict__`, and remove it afterwards), remember the original;
# * call `module(*args, **kwargs)`; restore every original in a `finally`, **in reverse order**. Two
#   names can reach one slot (a module registered twice, as in `nn.Sequential(lin, lin)`, plus
#   `tie_weights`): the second swap then saves your tensor as the "original", and restoring in the
#   order of the swaps would leave it in the model. torch 2.13 has exactly this bug
#   (pytorch/pytorch#164759); the checker expects the model restored.
#
# Leave the dict you are given as it was. `torch.func.functional_call`, `torch.nn.utils.stateless` and
# `load_state_dict` are not allowed in this exercise (the grader reads your answer cell's source).
# The checker compares with `torch.func.functional_call`: outputs, errors, the gradients that reach
# the tensors you passed, and that every original tensor object is back in place afterwards.

# %% [answer functional_call]
def functional_call(module, parameters_and_buffers, args=(), kwargs=None, *, tie_weights=True, strict=False):
    ### BEGIN SOLUTION
    # twin: ptinternals.modules.functional.functional_call
    given = dict(parameters_and_buffers)
    everything = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    if tie_weights:
        groups = {}
        for name, tensor in everything:
            groups.setdefault(tensor, set()).add(name)
        for names in groups.values():
            chosen = [n for n in names if n in parameters_and_buffers]
            if not chosen or len(names) == 1:
                continue
            if len({parameters_and_buffers[n] for n in chosen}) != 1:
                raise ValueError(f"functional_call got multiple values for keys {sorted(names)}, which are tied. "
                                 "Consider using tie_weights=False")
            for n in names:
                given[n] = parameters_and_buffers[chosen[0]]
    if strict:
        valid = {n for n, _ in everything}
        missing, unexpected = sorted(valid - set(given)), sorted(set(given) - valid)
        lines = []
        if unexpected:
            lines.append(f"Unexpected key(s): {', '.join(map(repr, unexpected))}.")
        if missing:
            lines.append(f"Missing key(s): {', '.join(map(repr, missing))}.")
        if lines:
            raise RuntimeError(f"Error(s) in reparametrizing for {type(module).__name__}:\n\t" + "\n\t".join(lines))
    absent = object()

    def swap(name, value):
        owner_path, _, leaf = name.rpartition(".")
        owner = module
        for part in owner_path.split(".") if owner_path else []:
            owner = owner._modules[part]
        for table in (owner._parameters, owner._buffers):
            if leaf in table:
                old = table[leaf]
                if value is absent:
                    del table[leaf]
                else:
                    table[leaf] = value
                return old
        plain = owner.__dict__  # any other name: a plain attribute for the call (torch: setattr/delattr)
        old = plain.get(leaf, absent)
        if value is absent:
            plain.pop(leaf, None)
        else:
            plain[leaf] = value
        return old

    originals = {}
    try:
        for name, value in given.items():
            originals[name] = swap(name, value)
        if not isinstance(args, tuple):
            args = (args,)
        return module(*args, **(kwargs or {}))
    finally:
        for name, old in reversed(list(originals.items())):  # last in, first out
            swap(name, old)
    ### END SOLUTION


# %% [tests functional_call]
check("modules.functional_call", functional_call)
### BEGIN HIDDEN TESTS
check("modules.functional_call", functional_call, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("modules", "q12")

# %% [markdown]
# ## 9. Bug hunt
#
# `BrokenNet` (from the scaffold; its source is printed below) is a small causal sequence mixer. Its
# arithmetic is right, its forward runs, its output has the right shape. Three module bugs hide in
# it, each of which raises nothing. Use the tools of this chapter to find them: `named_parameters()`,
# `state_dict()`, `named_buffers()`, `.to()`, a forward hook.

# %%
import inspect

print(inspect.getsource(BrokenNet))
broken = BrokenNet(dim=4, depth=2, max_len=8)
print("parameters:", [n for n, _ in broken.named_parameters()])
print("state_dict:", list(broken.state_dict()))
calls = []
for layer in broken.blocks:
    layer.register_forward_hook(lambda m, a, o: calls.append(1))
broken(torch.randn(1, 5, 4))
print("hooks on the blocks fired", len(calls), "times")

# %% [markdown]
# ### {{exercise fix_model}}: fix the model
#
# Write `FixedNet(nn.Module)` (here subclassing `nn.Module` is the point) with the same constructor
# and the same arithmetic as `BrokenNet`, and correct plumbing: the blocks' parameters registered
# under `blocks.0.weight`, `blocks.0.bias`, ...; the mask moved by `.to()` but not saved in
# `state_dict()` (it is derived from `max_len`); hooks on the blocks firing once per call.

# %% [answer fix_model]
import torch
from torch import nn


class FixedNet(nn.Module):
    def __init__(self, dim, depth, max_len):
        super().__init__()
        ### BEGIN SOLUTION
        # twin: ptinternals.modules.bug_hunt.FixedNet
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len)), persistent=False)
        self.register_buffer("scale", torch.tensor(dim ** -0.5))
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        T = x.shape[1]
        scores = (x @ x.transpose(1, 2)) * self.scale
        weights = scores.masked_fill(self.mask[:T, :T] == 0, float("-inf")).softmax(-1)
        x = weights @ x
        for block in self.blocks:
            x = x + block(x).relu()
        return self.norm(x)
        ### END SOLUTION


# %% [tests fix_model]
check("modules.fix_model", FixedNet)
### BEGIN HIDDEN TESTS
check("modules.fix_model", FixedNet, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise load_checkpoint}}: a checkpoint loader that cannot fail silently
#
# Write `load_checkpoint(model, checkpoint)`. Checkpoints come from the bare model, from
# `DataParallel`/DDP (every key under `module.`), from `torch.compile` (every key under
# `_orig_mod.`), or from both stacked (`_orig_mod.module.`). Build the candidates: the checkpoint,
# then, while every key of the last candidate starts with `module.` or `_orig_mod.`, a copy with that
# prefix removed from every key (and from the keys of `_metadata`, where the wrapper's own entry
# `""` is dropped and `"module"` becomes `""`). Load the candidate with the most keys matching
# `model.state_dict()`'s keys (the least stripped on a tie: a child may really be called `module`)
# with `strict=True`, and return what `load_state_dict` returns. Do not modify `checkpoint`.
# `torch.nn.modules.utils.consume_prefix_in_state_dict_if_present` is not allowed in this exercise.

# %% [answer load_checkpoint]
from collections import OrderedDict


def load_checkpoint(model, checkpoint):
    ### BEGIN SOLUTION
    # twin: ptinternals.modules.bug_hunt.load_checkpoint
    def strip(sd, prefix):
        out = OrderedDict((k[len(prefix):] if k.startswith(prefix) else k, v) for k, v in sd.items())
        meta = getattr(sd, "_metadata", None)
        if meta is not None:
            new_meta = OrderedDict(meta)
            for key in list(new_meta):
                if key and (key == prefix.rstrip(".") or key.startswith(prefix)):
                    new_meta[key[len(prefix):]] = new_meta.pop(key)
            out._metadata = new_meta
        return out

    first = OrderedDict(checkpoint)
    if hasattr(checkpoint, "_metadata"):
        first._metadata = OrderedDict(checkpoint._metadata)
    own = set(model.state_dict())
    candidates = [first]
    while candidates[-1]:
        prefix = next((p for p in ("module.", "_orig_mod.") if all(k.startswith(p) for k in candidates[-1])), None)
        if prefix is None:
            break
        candidates.append(strip(candidates[-1], prefix))
    best = max(candidates, key=lambda c: sum(k in own for k in c))
    return model.load_state_dict(best, strict=True)
    ### END SOLUTION


# %% [tests load_checkpoint]
check("modules.load_checkpoint", load_checkpoint)
### BEGIN HIDDEN TESTS
check("modules.load_checkpoint", load_checkpoint, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 10. Putting it together
#
# Your mixins plus `ModuleState` are a working `nn.Module`. Build a two-layer MLP on it and on
# `nn.Module` with the same weights, train both for a few steps with `torch.optim.SGD`, convert one
# to float64 halfway (the optimizer was built before), checkpoint and reload: the losses agree.
# (This cell only runs once every mixin above is implemented.)

# %%
def make_mlp(base):
    class Linear(base):
        def __init__(self, n_in, n_out, seed):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.weight = nn.Parameter(torch.randn(n_out, n_in, generator=g) / n_in ** 0.5)
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            return x @ self.weight.T + self.bias

    class MLP(base):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = Linear(4, 16, seed=1), Linear(16, 1, seed=2)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    return MLP()


def train(model, steps=20):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
    losses = []
    for step in range(steps):
        if step == steps // 2:
            model.to(torch.float64)
            xs, ys = xs.double(), ys.double()
        loss = ((model(xs) - ys) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.load_state_dict(model.state_dict())
    return losses


class MyModule(Registration, Traversal, Conversion, StateDict, Calling, ModuleState):
    pass


try:
    mine, theirs = train(make_mlp(MyModule)), train(make_mlp(nn.Module))
    print(f"loss {mine[0]:.4f} -> {mine[-1]:.4f} on your modules; the same on nn.Module: {mine == theirs}")
except NotImplementedError:
    print("Finish the exercises above first: this cell uses all of your mixins.")

# %% [markdown]
# ## Summary
#
# * A module is three dicts (`_parameters`, `_buffers`, `_modules`) filled by `__setattr__`, which
#   routes by the value's type and then by the name's current home. Anything else, a plain tensor or
#   a list of layers included, is an ordinary attribute: not moved, not saved, not trained.
# * Every walk (`named_modules`, `parameters`, `state_dict`, `_apply`, `train`) is a pre-order walk of
#   `_modules`. Traversal de-duplicates shared modules and tied tensors by identity; `state_dict`
#   does not.
# * `_apply` keeps each Parameter object and swaps the data inside, so optimizers and ties survive
#   `.to()`; gradients move with their parameters; buffers are replaced.
# * `load_state_dict` copies into the existing tensors and always computes missing and unexpected
#   keys; `strict` only decides whether they raise. Check the return value of a non-strict load.
# * `model(x)` is `_call_impl`: pre-hooks, forward, hooks, and identity Functions around the forward
#   for backward hooks. `model.forward(x)` skips all of it.
# * `eval()` is a flag for layers; `no_grad()` is an autograd switch.
# * `functional_call` makes a module a pure function of its tensors: the door to `grad`, `vmap`
#   and `torch.compile`.
#
# Next, {{chapter dispatch}} follows a single operation below `forward`: through the dispatcher to
# a kernel.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `modules.answers.json`).

# %% [quiz-grade]
quiz_progress("modules")
