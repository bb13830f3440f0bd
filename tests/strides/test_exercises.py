"""Tests of the tests: the strides chapter's checkers accept the solution and reject every known bug."""
import pytest

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import namespace_with

CHAPTER = load_chapter("strides")
def test_using_torch_where_forbidden_is_caught():
    src = "def contiguous_strides(shape):\n    return tuple(torch.empty(shape).stride())\n"
    ns = {"__name__": "__main__"}
    exec("import torch\n" + src, ns)
    with pytest.raises(CheckFailure) as info:
        check("strides.contiguous_strides", ns["contiguous_strides"])
    assert info.value.category == "forbidden"
    assert "implement the algorithm yourself" in str(info.value)


def test_failure_message_shows_first_difference():
    ns = namespace_with(CHAPTER.assignment)
    exec("def contiguous_strides(shape):\n    return (1,) * len(shape)\n", ns)
    with pytest.raises(CheckFailure) as info:
        check("strides.contiguous_strides", ns["contiguous_strides"])
    text = str(info.value)
    assert "first difference at position 0" in text and "expected" in text and "got" in text
