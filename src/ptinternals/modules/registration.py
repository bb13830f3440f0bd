"""Registration: how ``self.w = nn.Parameter(...)`` ends up in ``_parameters``.

Mirrors torch/nn/modules/module.py: ``Module.__init__``, ``register_buffer``, ``register_parameter``,
``add_module``, ``__getattr__``, ``__setattr__``, ``__delattr__``, ``get_submodule``,
``get_parameter``, ``get_buffer``. The error types and messages are torch's, word for word.

A module keeps its state in three ordered dicts, set with ``object.__setattr__`` so that they never
pass through the routing below::

    _parameters  {name: Parameter | None}     what an optimizer updates; in state_dict
    _buffers     {name: Tensor | None}        state that is not learned (running stats); in
                                              state_dict unless the name is in
    _non_persistent_buffers_set               (e.g. a cached causal mask: moved by .to(), not saved)
    _modules     {name: Module | None}        children; their state is reached by recursion

``__setattr__`` routes by the *value's type* first (Parameter, Module, ``nn.Buffer``) and by the
*name's current home* second (assigning to an existing parameter name requires a Parameter or None;
to an existing buffer name, a tensor or None). Anything else, including a plain tensor assigned to a
new name, becomes an ordinary instance attribute: it is invisible to ``parameters()``, ``.to()`` and
``state_dict()``, the most common silent bug this chapter exists for. ``__getattr__`` only runs when
normal lookup fails, so the three dicts are searched after the instance ``__dict__``.

Simplified: no global registration hooks, no ``call_super_init``, no ScriptModule checks, and the
``register_buffer``-without-``persistent`` compatibility path of ``__setattr__`` is left out.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch.nn import Buffer, Parameter

__all__ = ["ModuleBase"]


class ModuleBase:
    """The part of :class:`MiniModule` that owns the state dicts and the attribute routing."""

    training: bool
    _version: int = 1  # saved in state_dict()._metadata; bump it when a module's state layout changes

    def __init__(self, *args, **kwargs) -> None:
        # torch (call_super_init=False): Module.__init__ takes no arguments and says so.
        if kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        if args:
            raise TypeError(f"{type(self).__name__}.__init__() takes 1 positional argument but "
                            f"{len(args) + 1} were given")
        setattr_ = super().__setattr__  # bypass our own __setattr__, as torch does
        setattr_("training", True)
        setattr_("_parameters", {})
        setattr_("_buffers", {})
        setattr_("_non_persistent_buffers_set", set())
        setattr_("_backward_pre_hooks", OrderedDict())
        setattr_("_backward_hooks", OrderedDict())
        setattr_("_forward_hooks", OrderedDict())
        setattr_("_forward_hooks_with_kwargs", OrderedDict())
        setattr_("_forward_hooks_always_called", OrderedDict())
        setattr_("_forward_pre_hooks", OrderedDict())
        setattr_("_forward_pre_hooks_with_kwargs", OrderedDict())
        setattr_("_modules", {})

    # ---- explicit registration ----------------------------------------------------------------------
    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Add a buffer; ``persistent=False`` keeps it out of ``state_dict`` (still moved by ``.to``)."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {torch.typename(name)}")
        if "." in name:
            raise KeyError('buffer name can\'t contain "."')
        if name == "":
            raise KeyError('buffer name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not (isinstance(tensor, torch.Tensor) or hasattr(tensor, "__torch_function__")):
            raise TypeError(f"cannot assign '{torch.typename(tensor)}' object to buffer '{name}' "
                            "(torch Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_parameter(self, name: str, param) -> None:
        """Add a parameter (a leaf ``nn.Parameter``, or None: a slot that state_dict and .to skip)."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"parameter name should be a string. Got {torch.typename(name)}")
        if "." in name:
            raise KeyError('parameter name can\'t contain "."')
        if name == "":
            raise KeyError('parameter name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is None:
            self._parameters[name] = None
        elif not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{torch.typename(param)}' object to parameter '{name}' "
                            "(torch.nn.Parameter or None required)")
        elif param.grad_fn:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                             f"created explicitly. To express '{name}' as a function of another Tensor, "
                             "compute the value in the forward() method.")
        else:
            self._parameters[name] = param

    def add_module(self, name: str, module) -> None:
        """Add a child module (or None: a slot that traversal skips)."""
        if not isinstance(module, ModuleBase) and module is not None:
            raise TypeError(f"{torch.typename(module)} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {torch.typename(name)}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError('module name can\'t be empty string ""')
        self._modules[name] = module

    # ---- attribute routing --------------------------------------------------------------------------
    def __getattr__(self, name: str):
        # Only called when normal lookup (instance __dict__, then the class) failed.
        d = self.__dict__
        if "_parameters" in d and name in d["_parameters"]:
            return d["_parameters"][name]
        if "_buffers" in d and name in d["_buffers"]:
            return d["_buffers"][name]
        if "_modules" in d and name in d["_modules"]:
            return d["_modules"][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value) -> None:
        def remove_from(*dicts_or_sets) -> None:  # a name lives in one place at a time
            for d in dicts_or_sets:
                if name in d:
                    if isinstance(d, dict):
                        del d[name]
                    else:
                        d.discard(name)

        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):  # 1. by type: a Parameter always becomes a parameter
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(self.__dict__, self._buffers, self._modules, self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif params is not None and name in params:  # 2. by name: a parameter slot takes a Parameter or None
            if value is not None:
                raise TypeError(f"cannot assign '{torch.typename(value)}' as parameter '{name}' "
                                "(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        else:
            modules = self.__dict__.get("_modules")
            if isinstance(value, ModuleBase):
                if modules is None:
                    raise AttributeError("cannot assign module before Module.__init__() call")
                remove_from(self.__dict__, self._parameters, self._buffers, self._non_persistent_buffers_set)
                modules[name] = value
            elif modules is not None and name in modules:
                if value is not None:
                    raise TypeError(f"cannot assign '{torch.typename(value)}' as child module '{name}' "
                                    "(torch.nn.Module or None expected)")
                modules[name] = value
            else:
                buffers = self.__dict__.get("_buffers")
                if isinstance(value, Buffer) or (buffers is not None and name in buffers):
                    if value is not None and not (isinstance(value, torch.Tensor)
                                                  or hasattr(value, "__torch_function__")):
                        raise TypeError(f"cannot assign '{torch.typename(value)}' as buffer '{name}' "
                                        "(torch.nn.Buffer, torch.Tensor or None expected)")
                    if isinstance(value, Buffer):
                        persistent = value.persistent
                    else:  # re-assigning a buffer keeps its persistence
                        persistent = name not in self._non_persistent_buffers_set
                    self.register_buffer(name, value, persistent)
                else:  # 3. anything else (a plain tensor too!) is an ordinary attribute
                    super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            super().__delattr__(name)

    # ---- lookup by dotted path ----------------------------------------------------------------------
    def _get_name(self) -> str:
        return self.__class__.__name__

    def get_submodule(self, target: str):
        """``"a.b.c"`` -> the module at that path (``""`` is self); AttributeError as torch words it."""
        if not isinstance(target, str):
            raise TypeError(f"target must be a str, got {type(target).__name__}")
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(mod._get_name() + " has no attribute `" + item + "`")
            mod = getattr(mod, item)
            if not isinstance(mod, ModuleBase):
                raise AttributeError("`" + item + "` is not an nn.Module")
        return mod

    def get_parameter(self, target: str) -> Parameter:
        if not isinstance(target, str):
            raise TypeError(f"target must be a str, got {type(target).__name__}")
        module_path, _, param_name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, param_name):
            raise AttributeError(mod._get_name() + " has no attribute `" + param_name + "`")
        param = getattr(mod, param_name)
        if not isinstance(param, Parameter):
            raise AttributeError("`" + param_name + "` is not an nn.Parameter")
        return param

    def get_buffer(self, target: str) -> torch.Tensor:
        if not isinstance(target, str):
            raise TypeError(f"target must be a str, got {type(target).__name__}")
        module_path, _, buffer_name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, buffer_name):
            raise AttributeError(mod._get_name() + " has no attribute `" + buffer_name + "`")
        buffer = getattr(mod, buffer_name)
        if buffer_name not in mod._buffers:
            raise AttributeError("`" + buffer_name + "` is not a buffer")
        return buffer
