"""Instant feedback (``grading.check`` in the student's kernel) sees a case's arguments as the sandbox does.

The sandbox reads its cases from a JSON job file, so every string and large int reaches graded code as a
new object. ``check`` used to hand over the case's own objects, so ``fmt is "fp16"`` (a mistake: identity,
not equality) passed the instant check and the mutation runner, then failed when graded.
"""
import warnings

import pytest

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import edited, namespace_with


def test_check_hands_over_new_objects_as_the_sandbox_does():
    seen = []

    def decode(bits, fmt):
        seen.append((bits, fmt))
        return 0.0

    with pytest.raises(CheckFailure):
        check("amp.decode", decode)
    cases = load_chapter("amp").exercise("amp.decode").all_cases(hidden=False)
    assert seen == [c.args for c in cases]
    assert not any(fmt is c.args[1] for (_, fmt), c in zip(seen, cases)), "a case's own str object reached the code"


def test_identity_comparison_with_a_string_fails_the_instant_check():
    source = edited("amp.decode", ('if fmt == "fp8_e4m3fn":', 'if fmt is "fp8_e4m3fn":'))
    ns = namespace_with("amp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # '"is" with a literal': the mistake under test
        exec(compile(source, "<cell decode_code>", "exec"), ns)
    with pytest.raises(CheckFailure) as info:
        check("amp.decode", ns["decode"])
    assert "fp8_e4m3fn" in str(info.value)
