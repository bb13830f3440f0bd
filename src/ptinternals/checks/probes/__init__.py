"""Sandbox-side probes: measurements a plain call cannot return (saved bytes, storage sharing, timings).

A probe is ``probe(entry, *args, **kwargs) -> data``; it runs in the grading sandbox next to the
student's code, so it may import only torch, numpy and the standard library, and it must contain no
solution. One module per chapter: ``probes/<package>.py``. Its results are judged in the trusted
process like any other returned value.
"""
