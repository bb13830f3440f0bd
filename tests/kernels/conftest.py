"""The kernels chapter's tests run on CUDA when there is a GPU (compiled Triton), else on the CPU
(the interpreter, switched on by the root conftest). On a GPU, the device becomes torch's default for
each test module, so tensors a test makes without naming a device land where the kernels run."""
import pytest
import torch
from kernels_testing import DEVICE


@pytest.fixture(autouse=True, scope="module")
def _kernels_default_device():
    if DEVICE == "cpu":
        yield
        return
    torch.set_default_device(DEVICE)
    try:
        yield
    finally:
        torch.set_default_device(None)
