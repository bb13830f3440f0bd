"""The allocator chapter's probes (sandbox side): drive a student's class through a sequence of operations,
and call a function while keeping an eye on its inputs.

Only the standard library is used: the allocator chapter's exercises are graded without torch or numpy.
"""


def drive_stat(entry, ops):
    """Build ``entry()`` (a ``Stat`` class) and apply ``ops``; return its four numbers after each.

    ``ops`` are tuples like ``("increase", 100)``, ``("decrease", 40)``, ``("reset_peak",)``,
    ``("reset_accumulated",)``. After each op the result holds ``(current, peak, allocated, freed)``,
    or ``("raised", "<ExceptionType>")`` when the op raised (the run goes on with the same object).
    ``NotImplementedError`` is not caught: it means the class is still a stub.
    """
    stat = entry()
    out = []
    for op in ops:
        name, args = op[0], tuple(op[1:])
        try:
            getattr(stat, name)(*args)
        except NotImplementedError:
            raise
        except Exception as e:  # the checker decides whether an exception was expected
            out.append(("raised", type(e).__name__))
            continue
        out.append(tuple(getattr(stat, field, None) for field in ("current", "peak", "allocated", "freed")))
    return out


def call_keeping_inputs(entry, *args, **kwargs):
    """``entry(*args, **kwargs)``, and the positional arguments as they are after the call.

    Returns ``{"out": result, "inputs": [args...]}``: the checker compares the inputs with what it
    passed, for functions that must not modify them. An exception propagates (the checker may
    expect one).
    """
    out = entry(*args, **kwargs)
    return {"out": out, "inputs": list(args)}
