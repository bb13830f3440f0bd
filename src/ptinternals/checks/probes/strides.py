"""The strides chapter's probes (sandbox side): which torch functions a solution called."""


def record_torch_calls(entry, *args, **kwargs):
    """Call ``entry`` and record the names of the torch functions/methods it used.

    The checker uses this to ask for ``as_strided`` rather than ``unfold`` (the point of the
    exercise is the stride arithmetic) and to spot copies.
    """
    from torch.overrides import TorchFunctionMode

    calls = set()

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.add(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Recorder():
        out = entry(*args, **kwargs)
    return {"out": out, "calls": sorted(calls)}
