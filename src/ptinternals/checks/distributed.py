"""The distributed chapter's graded exercises: collectives, DDP, ZeRO and FSDP checked in real gloo ranks.

Three exercises are pure functions (chunking, bucketing, sharding), checked like the strides chapter's against
torch's own answer (``tensor_split``, ``dist._compute_bucket_assignment_by_size``, ``chunk``). The
others run the student's code in 2 to 4 CPU ranks: the probe
(``ptinternals.checks.probes.distributed``) forks the ranks next to the student's code, drives it
(build a model, train a few steps) and returns plain data; the expected values are computed *here*,
in one process, by real torch: the sum of the ranks' tensors, the full-batch gradients of the same
model, single-process AdamW/SGD trajectories. Every case is one spawn (a fork: about 0.2 s), so a
whole grading stays well under a minute; a hung or crashing rank comes back as an error naming the
rank, the collective it is stuck in and the student's line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from hypothesis import strategies as st
from torch import nn

from ..grading._runtime import TensorInfo
from ..grading.cases import draw
from ..grading.compare import close_tensors, describe, same_value
from ..grading.exercise import Case, Chapter, Exercise
from ..grading.policy import COLLECTIVES, DATA_PARALLEL, Policy

PROBES = "ptinternals.checks.probes.distributed"
SPAWN_S = 12.0  # the probe's deadline per spawn (probes.distributed.DEFAULT_DEADLINE_S)
MiB = 1 << 20


# ================================================================================================
# helpers
# ================================================================================================
def _values(x):
    """A returned tensor's values (TensorInfo from the sandbox, or a tensor)."""
    return x.values if isinstance(x, TensorInfo) else x


def _rank_results(got, world_size: int) -> str | None:
    if not isinstance(got, (list, tuple)) or len(got) != world_size or not all(isinstance(r, dict) for r in got):
        return f"the probe did not get one result per rank back: {describe(got)}"
    return None


def _param_names(widths) -> list[str]:
    names = []
    for k in range(len(widths) - 1):
        names += [f"{2 * k}.weight", f"{2 * k}.bias"]
    return names


def mlp_params(widths, seed: int) -> list[torch.Tensor]:
    """Deterministic weights and biases of an MLP with these widths (nn.Linear's init scale)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for a, b in zip(widths[:-1], widths[1:]):
        bound = 1.0 / math.sqrt(a)
        out.append((torch.rand(b, a, generator=g) * 2 - 1) * bound)
        out.append((torch.rand(b, generator=g) * 2 - 1) * bound)
    return out


def build_mlp(widths, params) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)
    return model


def make_batch(n: int, d_in: int, d_out: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randn(n, d_out, generator=g)


def _shard(t, rank, world_size):
    n = t.shape[0] // world_size
    return t[rank * n:(rank + 1) * n]


def local_grads(widths, params, x, y) -> list[torch.Tensor]:
    model = build_mlp(widths, params)
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def compare_tensor_lists(got, expected, where: str, names=None, suffix: str = "", rtol=1e-4,
                         atol=1e-5) -> str | None:
    """First differing tensor of two lists, named "<where>, <names[i]><suffix>", with the strides chapter's message."""
    def label(i):
        return f"{where}, {names[i] if names else f'tensor {i}'}{suffix}"

    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        return f"{where}: expected {len(expected)} tensors, got {describe(got)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        if e is None:
            continue
        if g is None:
            return f"{label(i)}: expected a tensor, got None (no gradient?)"
        problem = close_tensors(g, e, rtol=rtol, atol=atol)
        if problem:
            return f"{label(i)}: {problem}"
    return None


def _ratio(got, expected) -> float | None:
    """got / expected when ``got`` is (close to) a multiple of ``expected``; else None."""
    g = torch.cat([_values(t).double().flatten() for t in got])
    e = torch.cat([t.double().flatten() for t in expected])
    k = int(e.abs().argmax())
    if e[k] == 0:
        return None
    r = (g[k] / e[k]).item()
    return r if torch.allclose(g, e * r, rtol=1e-4, atol=1e-6) else None


def _all_close(got, expected, rtol=1e-4, atol=1e-5) -> bool:
    return compare_tensor_lists(got, expected, "", rtol=rtol, atol=atol) is None


def _grad_diagnosis(got_grads, case_spec, expected_grads, rank, world_size) -> str | None:
    """The likely cause of wrong DDP gradients: unsynced, summed, divided by the wrong N."""
    local = local_grads(case_spec["widths"], case_spec["init"], _shard(case_spec["x"], rank, world_size),
                        _shard(case_spec["y"], rank, world_size))
    if _all_close(got_grads, local):
        return ("rank {r}'s gradients are its own local gradients: they were never averaged. If your hook is "
                "Tensor.register_hook, it fires BEFORE the gradient is accumulated into p.grad (p.grad is "
                "still None, or last step's value, at that moment): use "
                "p.register_post_accumulate_grad_hook, and make sure finish_gradient_synchronization "
                "waits for every all-reduce and copies the result into p.grad.").format(r=rank)
    r = _ratio(got_grads, expected_grads)
    if r is not None and abs(r - 1) > 1e-3:
        if abs(r - world_size) < 1e-3:
            return (f"the gradients are {world_size} x the full-batch gradient: the all-reduce SUMS over ranks; "
                    f"divide by the world size ({world_size}) to get the mean.")
        for label, k in (("world_size - 1", world_size - 1), ("world_size + 1", world_size + 1),
                         ("world_size squared", world_size ** 2)):
            if k and abs(r - world_size / k) < 1e-3:
                return (f"averaging by the wrong world size: the gradients are {r:.3g} x the right ones, as if "
                        f"the sum over {world_size} ranks had been divided by {label} ({k}).")
        return f"the gradients are {r:.3g} x the full-batch gradient: check how you average over ranks."
    return None


def sgd_trajectory(widths, init, x, y, steps: int, lr: float, momentum: float = 0.0):
    """Single-process reference: per step (grads, params after), full-batch mean loss."""
    model = build_mlp(widths, init)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    grads, params, losses = [], [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        losses.append(loss.item())
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    return grads, params, losses, model


def _ddp_spec(world_size, widths, per_rank: int, seed: int, steps: int = 2, kwargs=None, micro=None):
    x, y = make_batch(world_size * per_rank, widths[0], widths[-1], seed)
    spec = {"widths": tuple(widths), "init": mlp_params(widths, seed), "perturb": 0.25, "x": x, "y": y,
            "lr": 0.2, "steps": steps, "kwargs": dict(kwargs or {})}
    if micro:
        spec["micro"] = micro
    return spec


def _spec_label(world_size, spec) -> str:
    kw = spec.get("kwargs") or {}
    cap, first = kw.get("bucket_cap_mb", 25) * MiB, kw.get("first_bucket_cap_mb", 1) * MiB
    caps = f", buckets of {cap:g} B (the first {first:g} B)" if kw else ""
    return f"{world_size} ranks, MLP widths {spec['widths']}, global batch {spec['x'].shape[0]}{caps}"


class _PlainPython(Exercise):
    """A pure function graded through ``probes.distributed:plain_python``: its result plus the torch
    functions it called (none allowed). Unlike ``forbid``, this keeps torch importable, so the whole
    chapter is graded in one sandbox run."""

    policy = Policy(no_modules=("torch", "numpy"), why="this is plain Python arithmetic")

    probe = f"{PROBES}:plain_python"

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        if got.get("calls"):
            return (f"called torch.{', torch.'.join(got['calls'])}: this exercise is plain Python arithmetic; "
                    f"write it without torch")
        return self.compare_out(case, got["out"], expected)

    def diagnose(self, case, got, expected):
        if isinstance(got, dict) and "out" in got and not got.get("calls"):
            return self.diagnose_out(case, got["out"], expected)
        if isinstance(got, dict) and got.get("calls"):
            return "compute the answer with integer arithmetic (divmod, min, loops) instead."
        return None

    def compare_out(self, case, got, expected):
        raise NotImplementedError

    def diagnose_out(self, case, got, expected):
        return None


@dataclass
class RankCase(Case):
    """A multi-rank case: its "call" line says what every rank runs, not the probe's arguments."""

    shown: str = ""

    def call_text(self, entry: str) -> str:
        return self.shown or super().call_text(entry)


class _MultiRank(Exercise):
    """A multi-rank exercise: ``Case((world_size, ...))``; the probe returns one result per rank."""

    policy = Policy(banned=DATA_PARALLEL, why="build it from torch.distributed's collectives")

    def shown(self, case) -> str:
        """What each rank runs, for the failure message's "call:" line."""
        return ""

    def cases_and_expected(self, hidden: bool = True):
        cases, expected = super().cases_and_expected(hidden)
        return [RankCase(c.args, c.kwargs, c.label, c.hidden, shown=self.shown(c)) for c in cases], expected

    n_spawns = 3  # spawns over all cases; each may use the probe's deadline before it reports

    @property
    def timeout_s(self) -> float:
        return SPAWN_S * self.n_spawns + 10.0

    def compare(self, case, got, expected):
        problem = _rank_results(got, case.args[0])
        if problem:
            return problem
        return self.compare_ranks(case, got, expected)

    def compare_ranks(self, case, got, expected):
        raise NotImplementedError


# ================================================================================================
# distributed.chunk_bounds chunk_bounds
# ================================================================================================
class ChunkBounds(_PlainPython):
    id, entry, points = "distributed.chunk_bounds", "chunk_bounds", 1
    title = "the ring's chunks: [start, end) of each of N chunks"

    def visible_cases(self):
        return [Case((12, 4), label="12 elements, 4 ranks: 3 each"),
                Case((10, 4), label="10 elements, 4 ranks: the first 2 chunks get one extra"),
                Case((3, 5), label="fewer elements than ranks: some chunks are empty"),
                Case((0, 2), label="an empty tensor")]

    def hidden_cases(self):
        fixed = [Case((1, 1)), Case((7, 1)), Case((5, 4)), Case((1023, 4)), Case((2, 8))]
        return fixed + [Case(c) for c in draw(st.tuples(st.integers(0, 300), st.integers(1, 9)), 80)]

    def expected(self, case):
        length, n = case.args
        sizes = [len(c) for c in torch.arange(length).tensor_split(n)]
        bounds, start = [], 0
        for s in sizes:
            bounds.append((start, start + s))
            start += s
        return bounds

    def compare_out(self, case, got, expected):
        if isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) for b in got):
            got = [tuple(b) for b in got]
        return same_value(got, expected)

    def diagnose_out(self, case, got, expected):
        length, n = case.args
        try:
            sizes = [int(e) - int(s) for s, e in got]
        except (TypeError, ValueError):
            return None
        if len(sizes) != n:
            return f"return exactly world_size = {n} pairs, one per chunk (empty chunks included)."
        if sum(sizes) < length:
            return (f"the chunks cover {sum(sizes)} of the {length} elements: the remainder length % N = "
                    f"{length % n} is dropped. Give one extra element to each of the first length % N chunks.")
        if sum(sizes) == length and sizes[-1] > sizes[0]:
            return ("the remainder goes to the FIRST length % N chunks, one extra element each (the split "
                    "torch.tensor_split makes), not all to the last chunk.")
        if sum(sizes) == length and sizes[0] == -(-length // n) and sizes != [e - s for s, e in expected]:
            return ("chunks of ceil(length / N) (torch.chunk's rule) leave the last chunks short or empty; "
                    "here chunk sizes may differ by at most one: the first length % N get one extra.")
        return None


# ================================================================================================
# distributed.ring_all_reduce ring all-reduce
# ================================================================================================
ALLOWED_RING_CALLS = {"send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier"}


def _ring_input(length: int, dtype: torch.dtype, layout: str, rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 31 + rank)
    if dtype.is_floating_point:
        base = torch.randn(length * 2, generator=g, dtype=torch.float64).to(dtype)
    else:
        base = torch.randint(-50, 51, (length * 2,), generator=g).to(dtype)
    if layout == "strided":  # every other element: non-contiguous
        return base[::2]
    if layout == "2d-transposed" and length % 3 == 0 and length:
        return base[:length].view(3, length // 3).t()  # (L/3, 3), strides (1, L/3)
    if layout == "2d" and length % 2 == 0 and length:
        return base[:length].view(2, length // 2)
    return base[:length].clone()


def ring_tests(world_size: int, specs) -> list[list[torch.Tensor]]:
    return [[_ring_input(length, dtype, layout, r, seed) for r in range(world_size)]
            for length, dtype, layout, seed in specs]


class RingAllReduce(_MultiRank):
    id, entry, points = "distributed.ring_all_reduce", "ring_all_reduce", 3
    title = "ring all-reduce from send/recv"
    probe = f"{PROBES}:ring_all_reduce"
    policy = Policy(banned=(*COLLECTIVES, *DATA_PARALLEL), why="build the ring from send/recv (isend/irecv)")
    n_spawns = 5

    def _case(self, world_size, specs, label=""):
        tests = ring_tests(world_size, specs)
        label = label or (f"{world_size} ranks; each rank's tensor: " + ", ".join(
            f"{tuple(t[0].shape)} {str(t[0].dtype).replace('torch.', '')}"
            + ("" if t[0].is_contiguous() else " non-contiguous") for t in tests))
        return Case((world_size, tests), label=label)

    def visible_cases(self):
        return [self._case(2, [(6, torch.float32, "1d", 0), (5, torch.float32, "1d", 1)]),
                self._case(3, [(10, torch.float32, "1d", 2), (7, torch.int64, "1d", 3), (12, torch.float64, "2d", 4)])]

    def hidden_cases(self):
        spec = st.tuples(st.one_of(st.integers(0, 13), st.integers(14, 40), st.integers(1000, 1100)),
                         st.sampled_from([torch.float32, torch.float64, torch.int64]),
                         st.sampled_from(["1d", "strided", "2d", "2d-transposed"]), st.integers(0, 10_000))
        cases = []
        for n, k in ((2, 6), (3, 8), (4, 8)):
            edge = [(0, torch.float32, "1d", 5), (1, torch.float32, "1d", 6), (n - 1, torch.int64, "1d", 7),
                    (n + 1, torch.float32, "strided", 8), (2 * n + 1, torch.float64, "2d-transposed", 9)]
            cases.append(self._case(n, edge + draw(spec, k)))
        return cases

    def shown(self, case):
        return f"ring_all_reduce(x) in each of {case.args[0]} ranks, x = that rank's tensor, for each tensor below"

    def expected(self, case):
        world_size, tests = case.args
        out = []
        for per_rank in tests:
            dtype = per_rank[0].dtype
            acc = torch.stack([t.to(torch.float64 if dtype.is_floating_point else dtype) for t in per_rank]).sum(0)
            out.append(acc.to(dtype))
        return out

    def compare_ranks(self, case, got, expected):
        world_size, tests = case.args
        for r, res in enumerate(got):
            outs, p2p = res.get("out"), res.get("p2p")
            if not isinstance(outs, list) or len(outs) != len(tests) or not isinstance(p2p, list):
                return f"rank {r}: the probe got no result back: {describe(res)}"
            for t, (o, e) in enumerate(zip(outs, expected)):
                tol = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-10, 1e-10)}.get(e.dtype, (0, 0))
                problem = close_tensors(o, e, rtol=tol[0], atol=tol[1])
                if problem:
                    return (f"rank {r}, tensor {t} (shape {tuple(e.shape)}, {str(e.dtype).replace('torch.', '')}): "
                            f"after ring_all_reduce it must hold the sum over the {world_size} ranks.\n  {problem}")
            for t, info in enumerate(p2p):
                used = sorted(set(info["calls"]) - ALLOWED_RING_CALLS)
                if used:
                    return (f"rank {r} called dist.{', dist.'.join(used)}: build the ring from point-to-point "
                            f"sends and receives only (send/recv, isend/irecv, batch_isend_irecv).")
                right, left = (r + 1) % world_size, (r - 1) % world_size
                if any(p not in (right, None) for p in info["to"]) or any(p not in (left, None) for p in info["from"]):
                    return (f"rank {r} (tensor {t}) sent to ranks {info['to']} and received from {info['from']}: in "
                            f"a ring rank r sends only to its right neighbour (r + 1) % N = {right} and receives "
                            f"only from its left neighbour (r - 1) % N = {left}.")
                numel = tests[t][r].numel()
                bound = 2 * (world_size - 1) * -(-numel // world_size)
                if info["sent"] > bound:
                    return (f"rank {r} sent {info['sent']} elements for a tensor of {numel}: a ring all-reduce "
                            f"sends 2 (N-1) chunks of about L/N elements each, at most {bound} here. Send one "
                            f"chunk per step, not the whole tensor.")
        return None

    # The likely wrong rings, simulated on the case's own inputs: if a rank's result equals one of
    # them, that is the diagnosis.
    VARIANTS = {
        "unchanged": "the tensor is unchanged: nothing was received and added (did the steps run?).",
        "no_all_gather": ("each rank holds the full sum of only one chunk: that is where reduce-scatter ends. "
                          "The all-gather phase (N-1 more steps, each OVERWRITING a chunk with the finished sum "
                          "received from the left) is missing."),
        "all_gather_adds": ("in the all-gather phase the received chunk is already the full sum: overwrite your "
                            "copy of it, do not add it."),
        "drop_remainder": ("the last length % N elements were never reduced: the chunks must cover the whole "
                           "tensor. Use chunk_bounds, whose first length % N chunks get one extra element."),
    }

    @staticmethod
    def simulate(inputs, variant: str):
        """Every rank's result of a (possibly wrong) ring all-reduce of the flat ``inputs``, in float64."""
        n = len(inputs)
        data = [x.reshape(-1).double().clone() for x in inputs]
        length = data[0].numel()
        if variant == "unchanged":
            return data
        if variant == "drop_remainder":
            size = length // n
            bounds = [(c * size, (c + 1) * size) for c in range(n)]
        else:
            bounds, start = [], 0
            for c in range(n):
                end = start + length // n + (1 if c < length % n else 0)
                bounds.append((start, end))
                start = end
        for s in range(n - 1):  # reduce-scatter
            sent = [data[r][slice(*bounds[(r - s) % n])].clone() for r in range(n)]
            for r in range(n):
                data[r][slice(*bounds[(r - s - 1) % n])] += sent[(r - 1) % n]
        if variant != "no_all_gather":
            for s in range(n - 1):
                sent = [data[r][slice(*bounds[(r + 1 - s) % n])].clone() for r in range(n)]
                for r in range(n):
                    chunk = slice(*bounds[(r - s) % n])
                    if variant == "all_gather_adds":
                        data[r][chunk] += sent[(r - 1) % n]
                    else:
                        data[r][chunk] = sent[(r - 1) % n]
        return data

    def diagnose(self, case, got, expected):
        world_size, tests = case.args
        if _rank_results(got, world_size):
            return None
        for r, res in enumerate(got):
            for t, (o, e) in enumerate(zip(res.get("out", []), expected)):
                o = _values(o)
                if not isinstance(o, torch.Tensor) or o.shape != e.shape or o.dtype != e.dtype or not e.numel():
                    continue
                if torch.allclose(o.double(), e.double(), rtol=1e-5, atol=1e-5):
                    continue
                for variant, hint in self.VARIANTS.items():
                    want = self.simulate(tests[t], variant)[r]
                    if torch.allclose(o.reshape(-1).double(), want, rtol=1e-5, atol=1e-5):
                        return hint
                return ("a chunk went to the wrong place at some step. At reduce-scatter step s, rank r sends chunk "
                        "(r - s) mod N to the right and adds what it receives into chunk (r - s - 1) mod N; at "
                        "all-gather step s it sends chunk (r + 1 - s) mod N and overwrites chunk (r - s) mod N. "
                        "Compare with the figure above.")
        return None


# ================================================================================================
# distributed.assign_buckets bucket assignment
# ================================================================================================
class AssignBuckets(_PlainPython):
    id, entry, points = "distributed.assign_buckets", "assign_buckets", 1
    title = "DDP's bucket assignment (reducer.cpp compute_bucket_assignment_by_size)"

    def visible_cases(self):
        return [Case(([12, 0, 72, 24, 168, 28, 140], 200, 50), label="a small MLP's gradients, last layer first"),
                Case(([400, 40, 40], 100, 100), label="a tensor bigger than the cap gets a bucket of its own"),
                Case(([8, 8, 8, 8, 8], 16, 8), label="a bucket closes when it REACHES its limit; the first limit is 8"),
                Case(([], 100, 10), label="no tensors")]

    def hidden_cases(self):
        sizes = st.lists(st.sampled_from([0, 4, 8, 12, 40, 64, 100, 256, 1000, 4096]) | st.integers(0, 600).map(
            lambda k: 4 * k), max_size=14)
        limits = st.tuples(st.integers(1, 3000), st.integers(1, 3000))
        return [Case((s, cap, first)) for s, (cap, first) in draw(st.tuples(sizes, limits), 100)]

    def expected(self, case):
        nbytes, cap, first = case.args
        if not nbytes:
            return []
        tensors = [torch.empty(b // 4, device="meta") for b in nbytes]
        buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [first, cap])
        return [list(b) for b in buckets]

    def compare_out(self, case, got, expected):
        if isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) for b in got):
            got = [list(b) for b in got]
        return same_value(got, expected)

    @staticmethod
    def variant(nbytes, cap, first, kind: str) -> list[list[int]]:
        """A plausible wrong bucketing, run on the case (the diagnosis is the variant that matches)."""
        buckets, current, size, limit = [], [], 0, cap if kind == "no_first_cap" else first
        for i, b in enumerate(nbytes):
            if kind == "close_before_overflow" and current and size + b > limit:
                buckets.append(current)
                current, size, limit = [], 0, cap
            current.append(i)
            size += b
            full = size > limit if kind == "strictly_greater" else size >= limit
            if kind != "close_before_overflow" and full:
                buckets.append(current)
                current, size, limit = [], 0, cap
        if current and kind != "drop_last":
            buckets.append(current)
        return buckets

    HINTS = {
        "strictly_greater": "a bucket closes as soon as its size REACHES its limit (size >= limit), not only "
                            "when it exceeds it.",
        "no_first_cap": "the FIRST bucket's limit is first_bucket_cap_bytes (small, so the first all-reduce "
                        "starts early); only later buckets use bucket_cap_bytes.",
        "close_before_overflow": "DDP never closes a bucket early to avoid overflowing it: add the tensor first, "
                                 "then close the bucket when its size is >= the limit (it may overshoot by that "
                                 "last tensor).",
        "drop_last": "keep the last, partly filled bucket too: its gradients need an all-reduce as well.",
    }

    def diagnose_out(self, case, got, expected):
        nbytes, cap, first = case.args
        if not isinstance(got, list) or not all(isinstance(b, list) for b in got):
            return None
        hints = [hint for kind, hint in self.HINTS.items() if self.variant(nbytes, cap, first, kind) == got]
        if hints:
            return " Or: ".join(hints)
        if sorted(i for b in got for i in b) != list(range(len(nbytes))):
            return "every tensor index must appear in exactly one bucket, in order."
        return None


# ================================================================================================
# distributed.naive_ddp, distributed.bucketed_ddp, distributed.no_sync: DDP
# ================================================================================================
def _ddp_expected(spec, world_size, bucket_numels=None):
    grads, params, _, _ = sgd_trajectory(spec["widths"], spec["init"], spec["x"], spec["y"], spec["steps"],
                                         spec["lr"])
    return {"grads": grads, "final": params[-1], "init": spec["init"], "buckets": bucket_numels,
            "n_params": len(spec["init"])}


def _torch_buckets(spec) -> list[int]:
    """Element counts of DDP's buckets, in launch order, for this model and these caps (torch's own rule)."""
    params = list(reversed(spec["init"]))  # gradients become ready last layer first
    kw = spec["kwargs"]
    cap, first = int(kw.get("bucket_cap_mb", 25.0) * MiB), int(kw.get("first_bucket_cap_mb", 1.0) * MiB)
    buckets, _ = dist._compute_bucket_assignment_by_size(params, [first, cap])
    return [sum(params[i].numel() for i in b) for b in buckets]


class NaiveDDPExercise(_MultiRank):
    id, entry, points = "distributed.naive_ddp", "NaiveDDP", 2
    title = "DDP with one all-reduce per parameter, launched from its gradient hook"
    probe = f"{PROBES}:ddp_steps"
    bucketed = False
    n_spawns = 3

    def spec_cases(self):
        return [(2, _ddp_spec(2, (5, 7, 6, 3), 4, seed=0))], \
               [(3, _ddp_spec(3, (4, 9, 1), 2, seed=1)), (4, _ddp_spec(4, (6, 5, 5, 7, 2), 3, seed=2))]

    def visible_cases(self):
        return [Case((n, s), label=_spec_label(n, s)) for n, s in self.spec_cases()[0]]

    def hidden_cases(self):
        return [Case((n, s), label=_spec_label(n, s)) for n, s in self.spec_cases()[1]]

    def shown(self, case):
        n, spec = case.args
        kw = "".join(f", {k}={v * MiB:g} / 2**20" for k, v in spec["kwargs"].items())
        return (f"ddp = {self.entry}(model{kw}) in each of {n} ranks (rank r's model starts different); then "
                f"{spec['steps']} x [loss = mse(ddp(x_r), y_r); loss.backward(); "
                f"ddp.finish_gradient_synchronization(); SGD step]")

    def expected(self, case):
        n, spec = case.args
        return _ddp_expected(spec, n, _torch_buckets(spec) if self.bucketed else None)

    def compare_ranks(self, case, got, expected):
        n, spec = case.args
        names = _param_names(spec["widths"])
        for r, res in enumerate(got):
            problem = compare_tensor_lists(res.get("after_wrap"), expected["init"], f"rank {r}", names,
                                           " right after wrapping", rtol=0, atol=0)
            if problem:
                return (problem + "\n  every replica must start from rank 0's weights: broadcast each parameter "
                                  "(and buffer) from rank 0 in __init__ (the ranks' models start different here).")
        for step in range(spec["steps"]):
            for r, res in enumerate(got):
                problem = compare_tensor_lists(res["grads"][step], expected["grads"][step], f"rank {r}, step {step}",
                                               names, ".grad")
                if problem:
                    return (problem + "\n  after loss.backward() and finish_gradient_synchronization(), every "
                                      "p.grad must equal the full-batch gradient: the mean over ranks.")
        for r, res in enumerate(got):
            problem = compare_tensor_lists(res["final"], expected["final"], f"rank {r}", names,
                                           f" after {spec['steps']} SGD steps")
            if problem:
                return problem
        return self.compare_communication(case, got, expected)

    def compare_communication(self, case, got, expected):
        n, spec = case.args
        for r, res in enumerate(got):
            for step, ov in enumerate(res["overlap"]):
                k = len(ov["all_reduce_numels"])
                if k != expected["n_params"]:
                    return (f"rank {r}, step {step}: {k} all-reduces during one backward; this exercise launches "
                            f"exactly one per parameter ({expected['n_params']}), from its hook.")
                if ov["other_calls"]:
                    return (f"rank {r}, step {step}: unexpected collectives during the step: {ov['other_calls']} "
                            f"(only the gradient all-reduces belong there).")
                problem = self._overlap_problem(r, step, ov)
                if problem:
                    return problem
        return None

    @staticmethod
    def _overlap_problem(r, step, ov):
        if not all(ov["all_reduce_async"]):
            return (f"rank {r}, step {step}: an all-reduce was called without async_op=True: it blocks backward "
                    f"until it finishes. Launch it asynchronously and wait in finish_gradient_synchronization.")
        if ov["reduces_during_backward"] < len(ov["all_reduce_numels"]) or not ov["first_reduce_before_last_ready"]:
            return (f"rank {r}, step {step}: the all-reduces started only after backward had produced every "
                    f"gradient, so communication cannot overlap computation. Launch each one from a hook, as "
                    f"soon as its gradient (or its bucket) is ready.")
        return None

    def diagnose(self, case, got, expected):
        n, spec = case.args
        if _rank_results(got, n):
            return None
        for r, res in enumerate(got):
            grads = res.get("grads")
            if not grads or _all_close(grads[0], expected["grads"][0]):
                continue
            if any(g is None for g in grads[0]):
                return "some p.grad is None after synchronisation: copy the reduced gradient into p.grad."
            return _grad_diagnosis(grads[0], spec, expected["grads"][0], r, n)
        return None


class BucketedDDPExercise(NaiveDDPExercise):
    id, entry, points = "distributed.bucketed_ddp", "BucketedDDP", 3
    title = "DDP with gradient buckets all-reduced while backward runs"
    bucketed = True
    n_spawns = 4

    def spec_cases(self):
        tiny = {"bucket_cap_mb": 200 / MiB, "first_bucket_cap_mb": 50 / MiB}  # 200 B and 50 B
        return ([(2, _ddp_spec(2, (5, 7, 6, 3), 4, seed=0, kwargs=tiny))],
                [(3, _ddp_spec(3, (6, 5, 5, 7, 2), 2, seed=3, kwargs={"bucket_cap_mb": 256 / MiB,
                                                                       "first_bucket_cap_mb": 64 / MiB})),
                 (4, _ddp_spec(4, (4, 9, 3), 2, seed=4, kwargs={"bucket_cap_mb": 100 / MiB,
                                                                "first_bucket_cap_mb": 100 / MiB})),
                 (2, _ddp_spec(2, (5, 7, 6, 3), 3, seed=5))])  # default caps: one bucket

    def compare_communication(self, case, got, expected):
        buckets = expected["buckets"]
        for r, res in enumerate(got):
            for step, ov in enumerate(res["overlap"]):
                numels = ov["all_reduce_numels"]
                if numels != buckets:
                    return (f"rank {r}, step {step}: one backward all-reduced tensors of {numels} elements; torch's "
                            f"bucketing (parameters in REVERSE registration order, limits [first_bucket_cap, "
                            f"bucket_cap]) gives buckets of {buckets} elements, each all-reduced as ONE flat "
                            f"buffer, in that order.")
                if ov["other_calls"]:
                    return (f"rank {r}, step {step}: unexpected collectives during the step: {ov['other_calls']}.")
                if len(buckets) > 1:
                    problem = self._overlap_problem(r, step, ov)
                    if problem:
                        return problem
                elif not all(ov["all_reduce_async"]):
                    return self._overlap_problem(r, step, ov)
        return None

    def diagnose(self, case, got, expected):
        hint = super().diagnose(case, got, expected)
        if hint:
            return hint
        n, spec = case.args
        if _rank_results(got, n):
            return None
        numels = got[0].get("overlap", [{}])[0].get("all_reduce_numels")
        buckets = expected["buckets"]
        if numels and sorted(numels) != sorted(buckets) and sum(numels) == sum(buckets):
            fwd = list(spec["init"])
            cap = int(spec["kwargs"].get("bucket_cap_mb", 25.0) * MiB)
            first = int(spec["kwargs"].get("first_bucket_cap_mb", 1.0) * MiB)
            fb, _ = dist._compute_bucket_assignment_by_size(fwd, [first, cap])
            if [sum(fwd[i].numel() for i in b) for b in fb] == numels:
                return ("the buckets were filled in registration (forward) order; gradients become ready in "
                        "REVERSE order, so DDP assigns buckets to list(module.parameters())[::-1] and the "
                        "first bucket (the last layer) can be all-reduced while backward continues.")
        return None


class AccumulatingDDPExercise(_MultiRank):
    id, entry, points = "distributed.no_sync", "AccumulatingDDP", 2
    title = "no_sync(): gradient accumulation with one all-reduce per step"
    probe = f"{PROBES}:no_sync_steps"

    def _spec(self, n, widths, per_rank, seed, micro):
        return _ddp_spec(n, widths, per_rank, seed, steps=2, micro=micro,
                         kwargs={"bucket_cap_mb": 200 / MiB, "first_bucket_cap_mb": 50 / MiB})

    def visible_cases(self):
        s = self._spec(2, (5, 7, 6, 3), 6, 0, 3)
        return [Case((2, s), label=_spec_label(2, s) + ", 3 micro-batches per step (2 inside no_sync)")]

    def hidden_cases(self):
        out = []
        for n, widths, per_rank, seed, micro in ((3, (4, 9, 1), 4, 1, 2), (4, (6, 5, 5, 2), 3, 2, 3)):
            s = self._spec(n, widths, per_rank, seed, micro)
            out.append(Case((n, s), label=_spec_label(n, s) + f", {micro} micro-batches per step"))
        return out

    def shown(self, case):
        n, spec = case.args
        m = spec["micro"]
        kw = "".join(f", {k}={v * MiB:g} / 2**20" for k, v in spec["kwargs"].items())
        return (f"ddp = AccumulatingDDP(model{kw}) in each of {n} ranks; then {spec['steps']} x [{m - 1} micro-batch"
                f"{'es' if m > 2 else ''} inside `with ddp.no_sync():` (forward, backward, "
                f"finish_gradient_synchronization), 1 outside, SGD step]")

    def expected(self, case):
        n, spec = case.args
        m = spec["micro"]
        model = build_mlp(spec["widths"], spec["init"])
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"])
        rounds = []
        for _ in range(spec["steps"]):
            start = [p.detach().clone() for p in model.parameters()]
            local, last_mean = [], None  # local[r][k]: rank r's p.grad after its k-th micro-batch
            for r in range(n):
                xs, ys = _shard(spec["x"], r, n).chunk(m), _shard(spec["y"], r, n).chunk(m)
                ref = build_mlp(spec["widths"], start)
                acc = []
                for k in range(m):
                    (nn.functional.mse_loss(ref(xs[k]), ys[k]) / m).backward()
                    acc.append([p.grad.detach().clone() for p in ref.parameters()])
                last = [a - b for a, b in zip(acc[-1], acc[-2])] if m > 1 else acc[-1]  # the last micro-batch's
                last_mean = [g / n for g in last] if last_mean is None else [a + g / n for a, g in zip(last_mean, last)]
                local.append(acc)
            opt.zero_grad()
            nn.functional.mse_loss(model(spec["x"]), spec["y"]).backward()  # = mean over ranks of the sums
            rounds.append({"local": [acc[:-1] for acc in local], "local_total": [acc[-1] for acc in local],
                           "last_mean": last_mean, "synced": [p.grad.detach().clone() for p in model.parameters()]})
            opt.step()
        return {"rounds": rounds, "final": [p.detach().clone() for p in model.parameters()]}

    def compare_ranks(self, case, got, expected):
        n, spec = case.args
        names = _param_names(spec["widths"])
        for step in range(spec["steps"]):
            for r, res in enumerate(got):
                rec = res["rounds"][step]
                if rec["calls_in_no_sync"]:
                    calls = ", ".join(f"{rec['calls_in_no_sync'].count(c)} x dist.{c}"
                                      for c in sorted(set(rec["calls_in_no_sync"])))
                    return (f"rank {r}, step {step}: inside no_sync() your code called {calls}: "
                            f"no communication at all may happen there; gradients just accumulate in p.grad.")
                for k, g in enumerate(rec["local_grads"]):
                    problem = compare_tensor_lists(g, expected["rounds"][step]["local"][r][k],
                                                   f"rank {r}, step {step}, after micro-batch {k} (inside no_sync)",
                                                   names, ".grad")
                    if problem:
                        return problem + "\n  inside no_sync() p.grad must hold this rank's own accumulated gradient."
                if "all_reduce" not in rec.get("synced_calls", []):
                    return (f"rank {r}, step {step}: the backward after no_sync() issued no all-reduce: leaving the "
                            f"context must turn synchronisation back on (restore the flag, even after an exception).")
                problem = compare_tensor_lists(rec["synced_grads"], expected["rounds"][step]["synced"],
                                               f"rank {r}, step {step}, after the synced micro-batch", names, ".grad")
                if problem:
                    return (problem + "\n  the synced backward must average the WHOLE accumulated p.grad (all "
                                      "micro-batches) over ranks.")
        for r, res in enumerate(got):
            problem = compare_tensor_lists(res["final"], expected["final"], f"rank {r}", names, " at the end")
            if problem:
                return problem
        return None

    def diagnose(self, case, got, expected):
        n, spec = case.args
        if _rank_results(got, n):
            return None
        for step in range(spec["steps"]):
            exp = expected["rounds"][step]
            for r, res in enumerate(got):
                rec = res["rounds"][step]
                g = rec["synced_grads"]
                if rec["calls_in_no_sync"] or _all_close(g, exp["synced"]):
                    continue
                if _all_close(g, exp["last_mean"]):
                    return ("only the last micro-batch's gradient was averaged: your hook saw the INCOMING gradient "
                            "(Tensor.register_hook fires before accumulation). With "
                            "register_post_accumulate_grad_hook, p.grad already holds the sum over all "
                            "micro-batches when the hook runs.")
                if _all_close(g, exp["local_total"][r]):
                    return ("after the synced backward p.grad is still this rank's own sum: nothing was averaged. "
                            "Leaving no_sync() must turn synchronisation back on.")
                ratio = _ratio(g, exp["synced"])
                if ratio is not None and abs(ratio - n) < 1e-3:
                    return f"the gradients are {n} x too large: divide the all-reduced sum by the world size."
        return None


# ================================================================================================
# distributed.shard_bounds shard_bounds
# ================================================================================================
class ShardBounds(_PlainPython):
    id, entry, points = "distributed.shard_bounds", "shard_bounds", 1
    title = "a rank's shard of a flat parameter: ceil-sized, nothing dropped"

    def visible_cases(self):
        return [Case((12, 4, 1), label="12 elements over 4 ranks, rank 1"),
                Case((10, 4, 3), label="10 over 4: shards of ceil(10/4) = 3, the last rank gets the remainder"),
                Case((10, 4, 0), label="10 over 4, rank 0"),
                Case((5, 4, 3), label="5 over 4: shards of 2, rank 3's is empty"),
                Case((0, 3, 2), label="nothing to shard")]

    def hidden_cases(self):
        def case(numel, n, data):
            return Case((numel, n, data.draw(st.integers(0, n - 1))))

        fixed = [Case((1, 1, 0)), Case((7, 8, 7)), Case((1001, 4, 3)), Case((9, 3, 2))]
        return fixed + draw(st.builds(case, st.integers(0, 500), st.integers(1, 8), st.data()), 80)

    def expected(self, case):
        numel, n, rank = case.args
        sizes = [len(c) for c in torch.arange(numel).chunk(n)] if numel else []
        sizes += [0] * (n - len(sizes))
        start = sum(sizes[:rank])
        return (start, start + sizes[rank])

    def compare_out(self, case, got, expected):
        return same_value(tuple(got) if isinstance(got, list) else got, expected)

    def diagnose_out(self, case, got, expected):
        numel, n, rank = case.args
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(v, int) for v in got)):
            return None
        s, e = got
        if e > numel:
            return f"the shard ends past the last element ({e} > numel = {numel}): clamp start and end to numel."
        if numel % n and e - s == numel // n and rank == n - 1 or (rank == n - 1 and e < numel):
            return ("the last elements belong to nobody: with shards of numel // N the remainder is dropped. Use "
                    "S = ceil(numel / N) (the all-gather needs equal shards; the padding lives past numel).")
        if numel % n and s != expected[0]:
            return ("every shard has S = ceil(numel / N) elements (clamped to numel), so rank r starts at r * S: "
                    "the remainder is not spread over the first ranks here.")
        return None


# ================================================================================================
# distributed.sharded_adamw ZeRO-1
# ================================================================================================
class ShardedAdamWExercise(_MultiRank):
    id, entry, points = "distributed.sharded_adamw", "ShardedAdamW", 3
    title = "ZeRO-1: AdamW whose state is sharded over the ranks"
    probe = f"{PROBES}:zero_steps"
    hyper = {"lr": 0.05, "betas": (0.9, 0.99), "eps": 1e-3, "weight_decay": 0.1}

    def _spec(self, n, widths, per_rank, seed, steps=3):
        x, y = make_batch(n * per_rank, widths[0], widths[-1], seed)
        return {"widths": tuple(widths), "init": mlp_params(widths, seed), "x": x, "y": y, "steps": steps,
                "hyper": dict(self.hyper)}

    def visible_cases(self):
        s = self._spec(2, (6, 10, 8, 3), 4, 0)
        return [Case((2, s), label=_spec_label(2, s) + f", {sum(p.numel() for p in s['init'])} parameters")]

    def hidden_cases(self):
        out = []
        for n, widths, per_rank, seed in ((3, (4, 9, 5, 1), 2, 1), (4, (6, 5, 5, 7, 2), 3, 2)):
            s = self._spec(n, widths, per_rank, seed)
            out.append(Case((n, s), label=_spec_label(n, s) + f", {sum(p.numel() for p in s['init'])} parameters"))
        return out

    def shown(self, case):
        n, spec = case.args
        kw = ", ".join(f"{k}={v}" for k, v in spec["hyper"].items())
        return (f"opt = ShardedAdamW(model.parameters(), {kw}) in each of {n} ranks; then {spec['steps']} x "
                f"[opt.zero_grad(); mse(model(x_r), y_r).backward(); opt.step()]")

    def expected(self, case):
        n, spec = case.args
        model = build_mlp(spec["widths"], spec["init"])
        opt = torch.optim.AdamW(model.parameters(), **spec["hyper"])
        weights = []
        for _ in range(spec["steps"]):
            opt.zero_grad()
            nn.functional.mse_loss(model(spec["x"]), spec["y"]).backward()
            opt.step()
            weights.append([p.detach().clone() for p in model.parameters()])
        numel = sum(p.numel() for p in spec["init"])
        shard = -(-numel // n)
        return {"weights": weights, "numel": numel, "shard": shard,
                "max_state_bytes": 4 * 3 * shard + 64, "unsharded_bytes": 4 * 2 * numel}

    def compare_ranks(self, case, got, expected):
        n, spec = case.args
        names = _param_names(spec["widths"])
        for step in range(spec["steps"]):
            for r, res in enumerate(got):
                problem = compare_tensor_lists(res["weights"][step], expected["weights"][step], f"rank {r}", names,
                                               f" after step {step + 1}", rtol=1e-4, atol=2e-6)
                if problem:
                    return (problem + "\n  after each step() every rank's parameters must equal torch.optim.AdamW's "
                                      "on the full-batch (mean over ranks) gradient.")
        for r, res in enumerate(got):
            used = res["state_bytes"][-1]
            if used > expected["max_state_bytes"]:
                return (f"rank {r} keeps {used} bytes of optimizer state between steps (tensors reachable from "
                        f"your optimizer, besides the model's parameters and grads). With P = {expected['numel']} "
                        f"parameters over {n} ranks a shard has S = {expected['shard']} elements: the two AdamW "
                        f"moments plus an fp32 copy of the shard are 3 x 4 x S = {12 * expected['shard']} bytes "
                        f"(allowed, with a little for step counters: {expected['max_state_bytes']}); "
                        f"unsharded AdamW keeps "
                        f"{expected['unsharded_bytes']}. Keep state only for your shard, and do not keep "
                        f"full-size buffers as attributes.")
        return None

    @staticmethod
    def _adamw_step(spec, factor: float) -> list[torch.Tensor]:
        """One torch AdamW step on ``factor`` x the full-batch gradient (a plausible wrong average)."""
        model = build_mlp(spec["widths"], spec["init"])
        opt = torch.optim.AdamW(model.parameters(), **spec["hyper"])
        nn.functional.mse_loss(model(spec["x"]), spec["y"]).backward()
        for p in model.parameters():
            p.grad *= factor
        opt.step()
        return [p.detach().clone() for p in model.parameters()]

    def diagnose(self, case, got, expected):
        n, spec = case.args
        if _rank_results(got, n):
            return None
        numel = expected["numel"]
        flat_e = torch.cat([t.flatten() for t in expected["weights"][0]])
        init = torch.cat([t.flatten() for t in spec["init"]])
        for r, res in enumerate(got):
            flat_g = torch.cat([_values(t).flatten() for t in res["weights"][0]])
            if flat_g.shape != flat_e.shape:
                return None
            bad = ~torch.isclose(flat_g, flat_e, rtol=1e-4, atol=2e-6)
            if not bool(bad.any()):
                continue
            unchanged = torch.isclose(flat_g, init, rtol=0, atol=0)
            idx = bad.nonzero().flatten()
            if bool(unchanged[idx].all()):
                if idx.min() >= numel - (numel % n or n) and numel % n:
                    return ("the last elements of the flat parameter were never updated: shards of numel // N drop "
                            "the remainder. Use S = ceil(numel / N) and pad the flat buffers to N * S.")
                return ("some parameters were never updated on this rank: after stepping your shard, all-gather "
                        "every rank's updated shard and copy it back into the parameters.")
            lo, hi = -(-numel // n) * r, min(-(-numel // n) * (r + 1), numel)
            if not bool(bad[lo:hi].any()):
                return ("this rank's own shard is right but the rest is not: all-gather the updated shards (in "
                        "rank order) and copy them into every parameter.")
            for factor, why in ((n, "sums the gradients over ranks without dividing by N"),
                                (n / max(n - 1, 1), "divides the sum over ranks by N - 1"),
                                (n / (n + 1), "divides the sum over ranks by N + 1")):
                if n > 1 and _all_close(res["weights"][0], self._adamw_step(spec, factor), rtol=1e-4, atol=2e-6):
                    return (f"averaging by the wrong world size: your update is AdamW's on a gradient "
                            f"{factor:.3g} x the mean, as if the code {why}. (AdamW barely notices the scale of "
                            f"its gradient, except through eps: the error is small but real.)")
            return ("the update differs from AdamW on the mean gradient: average the gradients over ranks (sum / N), "
                    "and keep AdamW's bias correction and decoupled weight decay (torch.optim.AdamW on the shard "
                    "does both).")
        return None


# ================================================================================================
# distributed.fully_sharded FSDP
# ================================================================================================
FORWARD_WRONG = "The forward is already wrong: check how you unflatten the gathered buffer."
UPDATE_WRONG = "The forward was right before: the gradients or their reduce-scatter are wrong."


class FullyShardedExercise(_MultiRank):
    id, entry, points = "distributed.fully_sharded", "FullyShardedSequential", 3
    title = "ZeRO-3 / FSDP: parameters gathered per layer and freed after use"
    probe = f"{PROBES}:fsdp_steps"

    def _spec(self, n, widths, per_rank, seed, steps=3):
        x, y = make_batch(n * per_rank, widths[0], widths[-1], seed)
        x_eval, _ = make_batch(5, widths[0], widths[-1], seed + 100)
        return {"widths": tuple(widths), "init": mlp_params(widths, seed), "x": x, "y": y, "x_eval": x_eval,
                "steps": steps, "lr": 0.1}

    def visible_cases(self):
        s = self._spec(2, (6, 8, 8, 8, 8, 3), 4, 0)
        return [Case((2, s), label=_spec_label(2, s))]

    def hidden_cases(self):
        return [Case((n, s), label=_spec_label(n, s)) for n, s in (
            (3, self._spec(3, (5, 7, 7, 7, 7, 2), 2, 1)), (4, self._spec(4, (9, 6, 6, 6, 6, 6, 1), 2, 2)))]

    def shown(self, case):
        n, spec = case.args
        return (f"fsdp = FullyShardedSequential(model) in each of {n} ranks; then {spec['steps']} x "
                f"[mse(fsdp(x_r), y_r).backward(); SGD step (lr {spec['lr']}, momentum 0.5) on fsdp.parameters()]; "
                f"then fsdp(x_eval)")

    def expected(self, case):
        n, spec = case.args
        model = build_mlp(spec["widths"], spec["init"])
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.5)
        losses = []
        for _ in range(spec["steps"]):
            per_rank = [nn.functional.mse_loss(model(_shard(spec["x"], r, n)), _shard(spec["y"], r, n)).item()
                        for r in range(n)]
            losses.append(per_rank)
            opt.zero_grad()
            nn.functional.mse_loss(model(spec["x"]), spec["y"]).backward()
            opt.step()
        with torch.no_grad():
            out = model(spec["x_eval"])
        units = [a * b + b for a, b in zip(spec["widths"][:-1], spec["widths"][1:])]
        padded = [n * -(-u // n) for u in units]
        return {"losses": losses, "out": out, "numel": sum(units), "held": sum(-(-u // n) for u in units),
                "max_peak": 4 * 3 * max(padded), "full_bytes": 4 * sum(units), "unit_bytes": 4 * max(padded)}

    def compare_ranks(self, case, got, expected):
        n, spec = case.args
        for r, res in enumerate(got):
            if res["held"] > expected["held"]:
                return (f"rank {r}'s wrapper has {res['held']} parameter elements; a fully sharded rank holds only "
                        f"its shard of each layer: sum over layers of ceil(P_layer / {n}) = {expected['held']} "
                        f"(of {expected['numel']}). parameters() must yield the shards, and the layers must no "
                        f"longer own full parameters.")
        for step in range(spec["steps"]):
            for r, res in enumerate(got):
                g, e = res["losses"][step], expected["losses"][step][r]
                if not isinstance(g, float) or not math.isclose(g, e, rel_tol=1e-4, abs_tol=1e-6):
                    return (f"rank {r}, step {step}: the loss on this rank's batch was {describe(g)}, expected {e!r} "
                            f"(the single-process model trained on the full batch, SGD with momentum). "
                            f"{FORWARD_WRONG if step == 0 else UPDATE_WRONG}")
        for r, res in enumerate(got):
            problem = close_tensors(res["out"], expected["out"], rtol=1e-4, atol=1e-5)
            if problem:
                return f"rank {r}: the trained model's output on a fixed input differs.\n  {problem}"
        for r, res in enumerate(got):
            if res["gathers"] == 0:
                return f"rank {r} never called an all-gather: gather each layer's shards before using it."
            if res["peak_gathered"] > expected["max_peak"] or res["peak_gathered"] >= expected["full_bytes"]:
                return (f"rank {r}: at one moment {res['peak_gathered']} bytes of gathered parameters were alive; "
                        f"the whole unsharded model is {expected['full_bytes']} bytes and one gathered layer at most "
                        f"{expected['unit_bytes']} (allowed: {expected['max_peak']}, three layers, for prefetching "
                        f"and for buffers the backend has not let go of yet). Free each layer's gathered buffer "
                        f"after its forward (and after "
                        f"its backward), and do not let autograd save it: re-gather in backward instead.")
        return None

    def diagnose(self, case, got, expected):
        n, spec = case.args
        if _rank_results(got, n):
            return None
        losses = [res.get("losses") for res in got]
        if not all(isinstance(ls, list) and len(ls) == spec["steps"] for ls in losses):
            return None
        if not all(math.isclose(g, e, rel_tol=1e-4, abs_tol=1e-6) for g, e in zip([ls[0] for ls in losses],
                                                                                   expected["losses"][0])):
            return ("the very first forward is wrong: a layer's flat buffer is its parameters in named_parameters() "
                    "order, each flattened; shard r is [r*S, (r+1)*S) of it padded to N*S; the all-gather puts rank "
                    "r's shard at [r*S, (r+1)*S).")
        if all(math.isclose(g, e, rel_tol=1e-4, abs_tol=1e-6)
               for step in range(spec["steps"]) for g, e in zip([ls[step] for ls in losses], expected["losses"][step])):
            return None  # the training is right: the failure is about memory or sharding, said above
        ref = build_mlp(spec["widths"], spec["init"])  # the same first step with N x the gradient
        opt = torch.optim.SGD(ref.parameters(), lr=spec["lr"], momentum=0.5)
        nn.functional.mse_loss(ref(spec["x"]), spec["y"]).backward()
        for p in ref.parameters():
            p.grad *= n
        opt.step()
        want = [nn.functional.mse_loss(ref(_shard(spec["x"], r, n)), _shard(spec["y"], r, n)).item() for r in range(n)]
        if all(math.isclose(ls[1], w, rel_tol=1e-4, abs_tol=1e-6) for ls, w in zip(losses, want)):
            return (f"the gradient shards are {n} x too big: divide by the world size before (or after) the "
                    f"reduce-scatter, which sums over ranks.")
        return ("the first forward was right, the update was not: in backward, reduce-scatter the gradient of the "
                "whole (N*S,) flat buffer, divided by N, into this rank's shard's .grad (every rank's gradient "
                "must count, not only its own).")


# ================================================================================================
# distributed.train_resume torchrun trainer with checkpoints
# ================================================================================================
class TrainResumeExercise(_MultiRank):
    id, entry, points = "distributed.train_resume", "train", 2
    title = "a torchrun trainer that saves a checkpoint and resumes bit-identically"
    policy = None  # training with torch's DDP is allowed here: the exercise is the resumable loop
    probe = f"{PROBES}:train_resume"
    n_spawns = 6

    def _case(self, n, steps, save_every, stop_after, resume_step, batch_size=16, seed=0):
        cfg = {"steps": steps, "batch_size": batch_size, "lr": 0.01, "seed": seed, "save_every": save_every}
        return Case((n, cfg, stop_after, resume_step),
                    label=(f"{n} ranks, {steps} steps saving every {save_every}; a second run stops after step "
                           f"{stop_after}; a third resumes from its step-{resume_step} checkpoint"))

    def visible_cases(self):
        return [self._case(2, 6, 3, 4, 3)]

    def hidden_cases(self):
        return [self._case(3, 5, 2, 3, 2, batch_size=12, seed=1)]

    def shown(self, case):
        n, cfg, stop_after, k = case.args
        return (f"train(config) in {n} ranks with torchrun's environment, 3 launches: A) config = {cfg}; "
                f"B) the same with stop_after={stop_after}; C) resume=<B's ckpt_dir>/step{k}.pt")

    def expected(self, case):
        n, cfg, stop_after, resume_step = case.args
        return {"steps": cfg["steps"], "resume_step": resume_step}

    def compare_ranks(self, case, got, expected):  # got: one dict (not per rank)
        raise AssertionError("unused")

    def compare(self, case, got, expected):
        n, cfg, stop_after, k = case.args
        if not isinstance(got, dict) or "a" not in got:
            return f"the probe got no result back: {describe(got)}"
        a, c = got["a"], got["c"]
        steps = expected["steps"]
        if not isinstance(a, dict) or not isinstance(a.get("losses"), list) or len(a["losses"]) != steps:
            return f"run A ({steps} steps from scratch) must return {{'start', 'losses', 'model'}}; got {describe(a)}"
        if f"step{k}.pt" not in got["files_b"]:
            return (f"run B (stopped after step {stop_after}) left no checkpoint step{k}.pt in its ckpt_dir (it has "
                    f"{got['files_b']}): save_checkpoint must write the file at the path it is given.")
        if not isinstance(c, dict) or not isinstance(c.get("losses"), list):
            return f"run C (resumed from step{k}.pt) returned {describe(c)}"
        if c.get("start") != k or len(c["losses"]) != steps - k:
            return (f"run C resumed from the step-{k} checkpoint must run steps {k}..{steps - 1}: it started at "
                    f"{c.get('start')!r} and ran {len(c['losses'])} steps. load_checkpoint must return the step "
                    f"stored in the checkpoint.")
        for i, (lc, la) in enumerate(zip(c["losses"], a["losses"][k:])):
            if not math.isclose(lc, la, rel_tol=1e-6, abs_tol=1e-9):
                return (f"step {k + i}: the resumed run's loss is {lc!r}, the uninterrupted run's {la!r}. A resumed "
                        f"run must see exactly the same weights, optimizer state, data and dropout masks.")
        names = sorted(a["model"])
        for name in names:
            problem = close_tensors(c["model"].get(name), _values(a["model"][name]), rtol=1e-6, atol=1e-7)
            if problem:
                return f"final weights, {name}: resumed vs uninterrupted: {problem}"
        return None

    def diagnose(self, case, got, expected):
        if not isinstance(got, dict) or not isinstance(got.get("c"), dict) or not isinstance(got.get("a"), dict):
            return None
        a, c = got["a"], got["c"]
        k = case.args[3]
        if c.get("start") != k or not c.get("losses"):
            return None
        same_first = math.isclose(c["losses"][0], a["losses"][k], rel_tol=1e-6)
        if not same_first:
            return ("the first resumed step already differs: restore the weights AND the optimizer state (AdamW's "
                    "moments and step count), and each rank's own RNG state (dropout draws from it: gather every "
                    "rank's torch.get_rng_state() with dist.all_gather_object; rank r restores entry r).")
        return ("the first resumed step matches, later ones drift: check that the optimizer state and every "
                "rank's RNG state were restored.")


EXERCISES = [ChunkBounds(), RingAllReduce(), NaiveDDPExercise(), AssignBuckets(), BucketedDDPExercise(),
             AccumulatingDDPExercise(), ShardBounds(), ShardedAdamWExercise(), FullyShardedExercise(),
             TrainResumeExercise()]
CHAPTER = Chapter("distributed", exercises=EXERCISES,
                  sandbox_files=("distributed/scaffold.py",),
                  policy_allow=("_parameters", "setattr"))  # what swapping an nn.Module's parameters takes (FSDP)
