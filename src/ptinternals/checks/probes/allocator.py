"""The allocator chapter's probes (sandbox side): drive a student's class through a sequence of operations.

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
