"""The kernels chapter's tests run on CUDA when there is a GPU (compiled Triton), else on the CPU
(the interpreter, switched on by the root conftest). On a GPU, the device becomes torch's default for
each test module, so tensors a test makes without naming a device land where the kernels run; on the
CPU, torch runs single-threaded during these tests (the interpreter's many tiny ops only pay for threads)."""
import pytest
import torch

from .kernels_testing import DEVICE


@pytest.fixture(autouse=True, scope="module")
def _kernels_default_device():
    if DEVICE == "cpu":  # the interpreter runs thousands of tiny ops: one thread is much faster
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
        return
    torch.set_default_device(DEVICE)
    try:
        yield
    finally:
        torch.set_default_device(None)
