"""One real CPU profile of a small training step, shared by the trace tests (profiling costs ~1 s)."""
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def small_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))

    def step():
        with record_function("forward"):
            logits = model(x)
            # mean() runs aten::mean inside aten::mean: key_averages folds such pairs (_remove_dup_nodes)
            loss = torch.nn.functional.cross_entropy(logits, y) + 0.01 * logits.square().mean()
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad()

    return step


def _profile(tmp_path_factory, with_stack: bool):
    path = str(tmp_path_factory.mktemp("trace") / "trace.json")
    step = small_step()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(path), with_stack=with_stack) as prof:
        for _ in range(4):
            step()
            prof.step()
    with open(path) as f:
        return path, json.load(f), prof.key_averages()


@pytest.fixture(scope="session")
def cpu_trace(tmp_path_factory):
    """(path, loaded dict, key_averages) of 2 active steps, without Python frames."""
    return _profile(tmp_path_factory, with_stack=False)


@pytest.fixture(scope="session")
def cpu_trace_with_stack(tmp_path_factory):
    return _profile(tmp_path_factory, with_stack=True)
