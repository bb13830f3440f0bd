"""Tests of the tests: the gpt chapter's checkers accept the solution and reject every known bug."""
import pytest

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import missing_boundary_classes, namespace_with

from .buggy import BUGGY

CHAPTER = load_chapter("gpt")
SLOW_HIDDEN = {"gpt.train_gpt"}  # its hidden case is the graded 800-step training run (~30 CPU-seconds)


@pytest.fixture(scope="module")
def solution():
    return namespace_with(CHAPTER.assignment)


def test_training_run_solution_passes_visible(solution, capsys):
    assert check("gpt.train_gpt", solution["train_gpt"]) is None
    assert "passed" in capsys.readouterr().out


@pytest.mark.slow
def test_training_run_solution_passes_the_graded_run(solution):
    assert check("gpt.train_gpt", solution["train_gpt"], hidden=True) is None


def test_gpu_exercise_says_it_skipped_on_the_cpu(solution, capsys):
    ex = CHAPTER.exercise("gpt.train_gpu")
    assert ex.gpu and "SKIPPED" in ex.visible_cases()[0].label
    check("gpt.train_gpu", solution["train_gpu"])
    assert "SKIPPED on the CPU: loss and tokens/s are graded on a GPU" in capsys.readouterr().out


def test_a_run_of_a_model_that_sees_the_future_is_refused():
    ns = namespace_with(CHAPTER.assignment, {"gpt_code": BUGGY["gpt.gpt"]["no_causal_mask"][0]})
    with pytest.raises(CheckFailure, match="not causal"):
        check("gpt.train_gpt", ns["train_gpt"])


PARAMETER_EXERCISES = ("gpt.checkpoint", "gpt.train_step", "gpt.ddp")


@pytest.mark.parametrize("exercise_id", PARAMETER_EXERCISES)
def test_parameter_boundary_classes_are_declared_and_drawn(exercise_id):
    """Issue 16: frozen, None-grad and tied parameters in the hidden cases of every exercise that trains,
    checkpoints or reduces parameters (tests/test_exercise_banks.py checks every declared class is drawn)."""
    ex = CHAPTER.exercise(exercise_id)
    names = " | ".join(ex.boundary_classes)
    for words in ("frozen", ".grad stays None", "tied"):
        assert words in names, f"{exercise_id} declares no boundary class about {words!r}: {names}"
    assert not missing_boundary_classes(ex)


def test_the_probe_parameters_behave_as_torch_says():
    """The probe model's frozen, unused and tied parameters: frozen and unused ones end backward with .grad
    None, the head is the embedding's Parameter under a second name, and torch's SGD with weight decay
    leaves a parameter without .grad unchanged (a zero gradient would decay it)."""
    import torch

    from ptinternals.checks.gpt import FROZEN, _batches
    from ptinternals.checks.probes import gpt as probes

    state = probes.probe_state(9, 8, 2, 0, head=True, unused=True)
    model = probes.build_probe(state, FROZEN)
    assert model.head.weight is model.embed.weight
    (x, y), = _batches(9, 2, 4, 1, 0)
    model(x, y)[1].backward()
    none = sorted(k for k, p in model.named_parameters() if p.grad is None)
    assert none == sorted([*FROZEN, "unused"])
    after = probes.probe_trajectory(state, [(x, y)], frozen=FROZEN, weight_decay=0.1)["params"]
    for name in (*FROZEN, "unused"):
        assert torch.equal(after[name], state[name]), name
    with pytest.raises(ValueError, match="frozen names no parameter"):
        probes.build_probe(state, ("nope",))
