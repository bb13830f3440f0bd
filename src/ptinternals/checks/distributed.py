"""The distributed chapter's graded exercises: collectives, DDP, ZeRO and FSDP checked in real gloo ranks.

Three exercises are pure functions (chunking, bucketing, sharding), checked like the strides chapter's against
torch's own answer (``tensor_split``, ``dist._compute_bucket_assignment_by_size``, ``chunk``). The
others run the student's code in 1 to 4 CPU ranks: the probe
(``ptinternals.checks.probes.distributed``) forks the ranks next to the student's code, drives it
(build a model, train a few steps) and returns plain data; the expected values are computed *here*,
in one process, by real torch: the sum of the ranks' tensors, the full-batch gradients of the same
model, single-process AdamW/SGD trajectories, the buckets torch's Reducer makes (its own assignment
function over the order the gradients really arrive in), FSDP2's dim-0 shards (``torch.chunk``, what
``fully_shard`` keeps: tests/distributed compares both with ``fully_shard`` on gloo). The models are built
by the probe module's ``build_model`` on both sides, with frozen, tied, unused, rank-dependent and
non-contiguous parameters where a case asks for them. Every case is one spawn (a fork: about 0.2 s), so
a whole grading stays well under a minute; a hung or crashing rank comes back as an error naming the
rank, the collective it is stuck in and the student's line.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from hypothesis import strategies as st
from torch import nn

from ..grading._runtime import Raised, TensorInfo
from ..grading.cases import draw
from ..grading.compare import close_tensors, describe, same_value
from ..grading.exercise import Case, Chapter, Exercise, Raises
from ..grading.policy import COLLECTIVES, DATA_PARALLEL, Policy
from .probes import distributed as probes

PROBES = "ptinternals.checks.probes.distributed"
SPAWN_S = 12.0  # the probe's deadline per spawn (probes.distributed.DEFAULT_DEADLINE_S)
MiB = 1 << 20


# ================================================================================================
# helpers: models, batches, single-process references
# ================================================================================================
def _values(x):
    """A returned tensor's values (TensorInfo from the sandbox, or a tensor)."""
    return x.values if isinstance(x, TensorInfo) else x


def _rank_results(got, world_size: int) -> str | None:
    if not isinstance(got, (list, tuple)) or len(got) != world_size or not all(isinstance(r, dict) for r in got):
        return f"the probe did not get one result per rank back: {describe(got)}"
    return None


def mlp_arch(widths, **extra) -> dict:
    """An nn.Sequential(Linear, Tanh, ..., Linear) description for ``probes.build_model``."""
    layers: list[tuple] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [("linear", a, b), ("tanh",)]
    return {"layers": layers[:-1], **extra}


def arch_dims(arch) -> tuple[int, int]:
    sizes = [layer[1:] for layer in arch["layers"] if layer[0] != "tanh"]
    first, last = sizes[0], sizes[-1]
    return first[0], last[-1]


def make_state(arch, seed: int) -> dict:
    """Initial values for ``arch`` (nn.Linear's own init under ``seed``), without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = probes.build_model(arch)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def make_batch(n: int, d_in: int, d_out: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randn(n, d_out, generator=g)


def _shard(t, rank, world_size):
    n = t.shape[0] // world_size
    return t[rank * n:(rank + 1) * n]


def full_batch_loss(model, spec, n: int):
    """The loss one process on the whole batch computes: the mean over ranks of each rank's mean loss (equal
    shards), with the layers only rank 0 uses active for rank 0's part only."""
    arch = spec["arch"]
    if not arch.get("rank0_only"):
        return nn.functional.mse_loss(model(spec["x"]), spec["y"])
    total = 0.0
    for r in range(n):
        probes.set_active(model, r, arch)
        total = total + nn.functional.mse_loss(model(_shard(spec["x"], r, n)), _shard(spec["y"], r, n))
    probes.set_active(model, 0, arch)
    return total / n


def param_names(spec) -> list[str]:
    return [name for name, _ in probes.build_model(spec["arch"], spec["state"]).named_parameters()]


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
    pairs = [(g, e) for g, e in zip(got, expected) if g is not None and e is not None]
    if not pairs:
        return None
    g = torch.cat([_values(t).double().flatten() for t, _ in pairs])
    e = torch.cat([t.double().flatten() for _, t in pairs])
    if g.shape != e.shape or not e.numel():
        return None
    k = int(e.abs().argmax())
    if e[k] == 0:
        return None
    r = (g[k] / e[k]).item()
    return r if torch.allclose(g, e * r, rtol=1e-4, atol=1e-6) else None


def _all_close(got, expected, rtol=1e-4, atol=1e-5) -> bool:
    return compare_tensor_lists(got, expected, "", rtol=rtol, atol=atol) is None


def _spec_label(world_size, spec, extra: str = "") -> str:
    kw = spec.get("kwargs") or {}
    caps = ""
    if kw:
        cap, first = kw.get("bucket_cap_mb", 25) * MiB, kw.get("first_bucket_cap_mb", 1) * MiB
        caps = f", buckets of {cap:g} B (the first {first:g} B)"
    arch = spec["arch"]
    notes = [f"{', '.join(arch['frozen'])} frozen" if arch.get("frozen") else "",
             "; ".join(f"{a} tied to {b}" for a, b in arch.get("tie", ())),
             "a parameter its forward never uses" if arch.get("unused") else "",
             "a layer used twice inside one unit (tied)" if any(layer[0] == "pair" for layer in arch["layers"]) else "",
             "a layer only rank 0's batch uses" if arch.get("rank0_only") else "",
             f"{', '.join(arch['noncontig'])} stored column-major" if arch.get("noncontig") else ""]
    shape = " -> ".join(str(layer[1]) for layer in arch["layers"] if layer[0] != "tanh") + f" -> {arch_dims(arch)[1]}"
    text = f"{world_size} ranks, model {shape}, global batch {spec['x'].shape[0]}{caps}"
    return text + "".join(f"; {n}" for n in notes if n) + extra


class _PlainPython(Exercise):
    """A pure function graded through ``probes.calls:record_torch_calls``: its result plus the torch
    functions it called (none allowed). Unlike ``forbid``, this keeps torch importable, so the whole
    chapter is graded in one sandbox run."""

    policy = Policy(no_modules=("torch", "numpy"), why="this is plain Python arithmetic")

    probe = "ptinternals.checks.probes.calls:record_torch_calls"

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        if got.get("calls"):
            return (f"called torch.{', torch.'.join(got['calls'])}: this exercise is plain Python arithmetic; "
                    f"write it without torch")
        return self.compare_out(case, got["out"], expected)

    def diagnose(self, case, got, expected):
        if isinstance(expected, Raises) and (isinstance(got, Raised) or isinstance(got, dict) and not got.get("calls")):
            return self.diagnose_no_error(case, got, expected)  # no exception, or the wrong one
        if isinstance(got, dict) and "out" in got and not got.get("calls"):
            return self.diagnose_out(case, got["out"], expected)
        return None

    def compare_out(self, case, got, expected):
        raise NotImplementedError

    def diagnose_out(self, case, got, expected):
        return None

    def diagnose_no_error(self, case, got, expected):
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
# distributed.chunk_bounds
# ================================================================================================
def _pairs(sizes) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for s in sizes:
        bounds.append((start, start + s))
        start += s
    return bounds


class ChunkBounds(_PlainPython):
    id, entry, points = "distributed.chunk_bounds", "chunk_bounds", 1
    title = "the ring's chunks: [start, end) of each of N chunks"

    def visible_cases(self):
        return [Case((12, 4), label="12 elements, 4 ranks: 3 each"),
                Case((10, 4), label="10 elements, 4 ranks: the first 2 chunks get one extra"),
                Case((3, 5), label="fewer elements than ranks: some chunks are empty"),
                Case((0, 2), label="an empty tensor"),
                Case((5, 0), label="0 ranks: ValueError")]

    boundary_classes = {
        "an empty tensor": lambda c, e: c.args[0] == 0 and c.args[1] >= 1,
        "one element": lambda c, e: c.args[0] == 1,
        "one rank": lambda c, e: c.args[1] == 1 and c.args[0] > 1,
        "length == world_size (one element each)": lambda c, e: c.args[0] == c.args[1] > 1,
        "length == world_size - 1 (one empty chunk)": lambda c, e: c.args[0] == c.args[1] - 1 > 0,
        "length == world_size + 1 (one chunk gets an extra)": lambda c, e: c.args[0] == c.args[1] + 1 > 2,
        "length % world_size == world_size - 1": lambda c, e: c.args[1] > 2 and c.args[0] % c.args[1] == c.args[1] - 1,
        "length divisible by world_size": lambda c, e: c.args[1] > 1 and c.args[0] > 0 and c.args[0] % c.args[1] == 0,
        "a length > 256": lambda c, e: c.args[0] > 256,
        "world_size 0 (error)": lambda c, e: c.args[1] == 0,
        "a negative length (error)": lambda c, e: c.args[0] < 0,
    }

    def hidden_cases(self):
        deliberate = [(1, 1), (7, 1), (5, 4), (1023, 4), (2, 8), (4, 4), (3, 4), (5, 4), (11, 4), (300, 7), (0, 3),
                      (1, 3), (7, 0), (-1, 2), (12, 3)]
        return [Case(c) for c in deliberate] + [Case(c) for c in draw(st.tuples(st.integers(0, 300),
                                                                                 st.integers(1, 9)), 70)]

    def expected(self, case):
        length, n = case.args
        if n < 1:
            return Raises(("ValueError",), "world_size must be >= 1")
        if length < 0:
            return Raises(("ValueError",), "length must be >= 0")
        return _pairs([len(c) for c in torch.arange(length).tensor_split(n)])

    def compare_out(self, case, got, expected):
        if isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) for b in got):
            got = [tuple(b) for b in got]
        return same_value(got, expected)

    @staticmethod
    def variants(length, n) -> dict[str, list]:
        """What each plausible mistake returns for this case."""
        base = length // n
        ceil = -(-length // n)
        return {
            "drops_remainder": _pairs([base] * n),
            "remainder_to_last": _pairs([base] * (n - 1) + [base + length % n]),
            "ceil_chunks": [(min(c * ceil, length), min((c + 1) * ceil, length)) for c in range(n)],
        }

    HINTS = {
        "drops_remainder": "the chunks drop the remainder: length % N elements are never reduced. Give one extra "
                           "element to each of the first length % N chunks.",
        "remainder_to_last": "the remainder goes to the FIRST length % N chunks, one extra element each (the split "
                             "torch.tensor_split makes), not all to the last chunk.",
        "ceil_chunks": "chunks of ceil(length / N) (torch.chunk's rule) leave the last chunks short or empty; here "
                       "chunk sizes may differ by at most one: the first length % N get one extra.",
    }

    def diagnose_out(self, case, got, expected):
        length, n = case.args
        if isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) for b in got):
            got = [tuple(b) for b in got]
            if len(got) != n:
                return f"return exactly world_size = {n} pairs, one per chunk (empty chunks included)."
            hints = [self.HINTS[k] for k, v in self.variants(length, n).items() if v == got and v != expected]
            return " Or: ".join(hints) if hints else None
        return None

    def diagnose_no_error(self, case, got, expected):
        return (f"{case.call_text(self.entry)} must raise ValueError: there are no chunks of "
                + ("a negative length." if case.args[0] < 0 else "0 ranks."))


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
    n_spawns = 6
    withheld_from_students = ("diagnose",)  # it simulates the ring (chunk bounds included) to name the bug

    def _case(self, world_size, specs, label=""):
        tests = ring_tests(world_size, specs)
        label = label or (f"{world_size} ranks; each rank's tensor: " + ", ".join(
            f"{tuple(t[0].shape)} {str(t[0].dtype).replace('torch.', '')}"
            + ("" if t[0].is_contiguous() else " non-contiguous") for t in tests))
        return Case((world_size, tests), label=label)

    def visible_cases(self):
        return [self._case(2, [(6, torch.float32, "1d", 0), (5, torch.float32, "1d", 1)]),
                self._case(3, [(10, torch.float32, "1d", 2), (7, torch.int64, "1d", 3), (12, torch.float64, "2d", 4)])]

    boundary_classes = {
        "one rank (no steps at all)": lambda c, e: c.args[0] == 1,
        "an empty tensor": lambda c, e: any(t[0].numel() == 0 for t in c.args[1]),
        "one element": lambda c, e: any(t[0].numel() == 1 for t in c.args[1]),
        "fewer elements than ranks (empty chunks)": lambda c, e: any(0 < t[0].numel() < c.args[0] for t in c.args[1]),
        "length == world_size": lambda c, e: c.args[0] > 1 and any(t[0].numel() == c.args[0] for t in c.args[1]),
        "length == world_size + 1 (one chunk longer)": lambda c, e: any(
            t[0].numel() == c.args[0] + 1 for t in c.args[1]),
        "length % world_size == world_size - 1": lambda c, e: c.args[0] > 2 and any(
            t[0].numel() > c.args[0] and t[0].numel() % c.args[0] == c.args[0] - 1 for t in c.args[1]),
        "a non-contiguous tensor": lambda c, e: any(not t[0].is_contiguous() for t in c.args[1]),
        "a transposed 2-d tensor": lambda c, e: any(t[0].dim() == 2 and not t[0].is_contiguous() for t in c.args[1]),
        "int64 (exact sums)": lambda c, e: any(t[0].dtype == torch.int64 for t in c.args[1]),
        "float64": lambda c, e: any(t[0].dtype == torch.float64 for t in c.args[1]),
        "more than 1000 elements": lambda c, e: any(t[0].numel() > 1000 for t in c.args[1]),
        "four ranks": lambda c, e: c.args[0] == 4,
    }

    def hidden_cases(self):
        spec = st.tuples(st.one_of(st.integers(0, 13), st.integers(14, 40), st.integers(1000, 1100)),
                         st.sampled_from([torch.float32, torch.float64, torch.int64]),
                         st.sampled_from(["1d", "strided", "2d", "2d-transposed"]), st.integers(0, 10_000))
        cases = []
        for n, k in ((2, 6), (3, 8), (4, 8)):
            edge = [(0, torch.float32, "1d", 5), (1, torch.float32, "1d", 6), (n - 1, torch.int64, "1d", 7),
                    (n + 1, torch.float32, "strided", 8), (2 * n + 1, torch.float64, "2d-transposed", 9),
                    (n, torch.float32, "1d", 10), (3 * n - 1, torch.int64, "strided", 14)]
            cases.append(self._case(n, edge + draw(spec, k)))
        cases.append(self._case(1, [(5, torch.float32, "1d", 11), (0, torch.int64, "1d", 12),
                                    (6, torch.float64, "2d-transposed", 13)]))
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
        "send_ahead": ("at reduce-scatter step s rank r must send chunk (r - s) mod N, the one its left "
                       "neighbour's partial sums went into; sending chunk (r + s) mod N adds chunks to the "
                       "wrong partial sums."),
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
            sent = [data[r][slice(*bounds[(r + s if variant == "send_ahead" else r - s) % n])].clone()
                    for r in range(n)]
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
        if isinstance(got, Raised) and "Received data size doesn't match" in got.message:
            return ("a send and the receive it meets have different sizes, so the two ranks disagree on which chunk "
                    "moves: at reduce-scatter step s rank r sends chunk (r - s) mod N and receives chunk "
                    "(r - s - 1) mod N; at all-gather step s it sends (r + 1 - s) mod N and receives (r - s) mod N.")
        if _rank_results(got, world_size):
            return None
        for r, res in enumerate(got):
            for t, (o, e) in enumerate(zip(res.get("out", []), expected)):
                o = _values(o)
                if not isinstance(o, torch.Tensor) or o.shape != e.shape or o.dtype != e.dtype or not e.numel() \
                        or world_size < 2:
                    continue
                if torch.allclose(o.double(), e.double(), rtol=1e-5, atol=1e-5):
                    continue
                for variant, hint in self.VARIANTS.items():
                    want = self.simulate(tests[t], variant)[r]
                    if torch.allclose(o.reshape(-1).double(), want, rtol=1e-5, atol=1e-5):
                        return hint
        return None  # a wrong sum that no single known mistake explains: no guess


# ================================================================================================
# distributed.assign_buckets bucket assignment
# ================================================================================================
def _bucket_runs(nbytes, cap, first) -> list[tuple[int, list[int]]]:
    """Each bucket DDP's rule makes: (its limit, the running byte total after each tensor it takes)."""
    runs, limit, sizes, total = [], first, [], 0
    for b in nbytes:
        total += b
        sizes.append(total)
        if total >= limit:
            runs.append((limit, sizes))
            limit, sizes, total = cap, [], 0
    if sizes:
        runs.append((limit, sizes))
    return runs


def _reaches(c, which: int, delta: int) -> bool:
    """A running total of bucket ``which`` (0: the first, 1: a later one) equals its limit + ``delta``."""
    nbytes, cap, first = c.args
    runs = _bucket_runs(nbytes, cap, first)
    chosen = runs[:1] if which == 0 else runs[1:]
    return any(limit + delta in sizes for limit, sizes in chosen)


class AssignBuckets(_PlainPython):
    id, entry, points = "distributed.assign_buckets", "assign_buckets", 1
    title = "DDP's bucket rebuild (reducer.cpp compute_bucket_assignment_by_size)"
    withheld_from_students = ("diagnose",)  # its wrong variants share the right algorithm's code

    def visible_cases(self):
        return [Case(([12, 0, 72, 24, 168, 28, 140], 200, 50), label="a small MLP's gradients, in the order they "
                                                                     "became ready"),
                Case(([400, 40, 40], 100, 100), label="a tensor bigger than the cap gets a bucket of its own"),
                Case(([8, 8, 8, 8, 8], 16, 8), label="a bucket closes when it REACHES its limit; the first limit is 8"),
                Case(([], 100, 10), label="no tensors")]

    boundary_classes = {
        "no tensors": lambda c, e: c.args[0] == [],
        "one tensor": lambda c, e: len(c.args[0]) == 1,
        "a zero-byte tensor": lambda c, e: 0 in c.args[0],
        "the first bucket reaches its limit exactly": lambda c, e: _reaches(c, 0, 0),
        "the first bucket one byte short of its limit": lambda c, e: _reaches(c, 0, -1),
        "the first bucket one byte past its limit": lambda c, e: _reaches(c, 0, 1),
        "a later bucket reaches the cap exactly": lambda c, e: _reaches(c, 1, 0),
        "a later bucket one byte short of the cap": lambda c, e: _reaches(c, 1, -1),
        "a later bucket one byte past the cap": lambda c, e: _reaches(c, 1, 1),
        "one tensor bigger than the cap": lambda c, e: any(b > c.args[1] for b in c.args[0][1:]),
        "first limit == cap": lambda c, e: c.args[1] == c.args[2] and len(c.args[0]) > 2,
        "first limit > cap": lambda c, e: c.args[2] > c.args[1] and len(c.args[0]) > 2,
        "more than two buckets": lambda c, e: len(e) > 2,
    }

    def hidden_cases(self):
        deliberate = [([12, 0, 72, 24, 168, 28, 140], 200, 84), ([12, 0, 72, 24, 168, 28, 140], 200, 85),
                      ([12, 0, 72, 24, 168, 28, 140], 200, 83), ([40, 60, 40, 4], 100, 40),
                      ([40, 60, 41, 8], 100, 40), ([40, 60, 39, 8], 100, 40), ([5000, 4, 4], 100, 10),
                      ([8, 8, 8, 8], 16, 16), ([8] * 6, 8, 24), ([], 100, 10), ([4], 100, 10), ([0, 0, 0], 1, 1),
                      ([4] * 40, 12, 4)]
        sizes = st.lists(st.sampled_from([0, 4, 8, 12, 40, 64, 100, 256, 1000, 4096]) | st.integers(0, 600).map(
            lambda k: 4 * k), max_size=14)
        limits = st.tuples(st.integers(1, 3000), st.integers(1, 3000))
        return [Case(c) for c in deliberate] + [Case((s, cap, first)) for s, (cap, first) in
                                                 draw(st.tuples(sizes, limits), 90)]

    def expected(self, case):
        nbytes, cap, first = case.args
        if not nbytes:
            return []
        tensors = [torch.empty(b // 4, device="meta") for b in nbytes]  # the cases' sizes are multiples of 4
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
                current, size, limit = [], 0, first if kind == "first_cap_always" else cap
        if current and kind != "drop_last":
            buckets.append(current)
        return buckets

    HINTS = {
        "strictly_greater": "a bucket closes as soon as its size REACHES its limit (size >= limit), not only "
                            "when it exceeds it.",
        "no_first_cap": "the FIRST bucket's limit is first_bucket_cap_bytes (small, so the first all-reduce "
                        "starts early); only later buckets use bucket_cap_bytes.",
        "first_cap_always": "only the FIRST bucket uses first_bucket_cap_bytes; every later bucket's limit is "
                            "bucket_cap_bytes.",
        "close_before_overflow": "DDP never closes a bucket early to avoid overflowing it: add the tensor first, "
                                 "then close the bucket when its size is >= the limit (it may overshoot by that "
                                 "last tensor).",
        "drop_last": "keep the last, partly filled bucket too: its gradients need an all-reduce as well.",
    }

    def diagnose_out(self, case, got, expected):
        nbytes, cap, first = case.args
        if not isinstance(got, (list, tuple)) or not all(isinstance(b, (list, tuple)) for b in got):
            return None
        got = [list(b) for b in got]
        hints = [hint for kind, hint in self.HINTS.items() if self.variant(nbytes, cap, first, kind) == got]
        if hints:
            return " Or: ".join(hints)
        if sorted(i for b in got for i in b) != list(range(len(nbytes))):
            return "every tensor index must appear in exactly one bucket, in order."
        return None


# ================================================================================================
# distributed.naive_ddp, distributed.bucketed_ddp, distributed.no_sync: DDP
# ================================================================================================
def _ddp_spec(n, arch, per_rank: int, seed: int, steps: int = 2, kwargs=None, micro=None) -> dict:
    d_in, d_out = arch_dims(arch)
    x, y = make_batch(n * per_rank, d_in, d_out, seed)
    spec = {"arch": arch, "state": make_state(arch, seed), "perturb": 0.25, "x": x, "y": y, "lr": 0.2,
            "steps": steps, "kwargs": dict(kwargs or {})}
    if micro:
        spec["micro"] = micro
    return spec


def sgd_trajectory(spec, n: int, momentum: float = 0.0):
    """One process on the whole batch: per step the gradients (None where a parameter got none) and the
    parameters after the SGD step, in ``named_parameters()`` order."""
    model = probes.build_model(spec["arch"], spec["state"])
    opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=momentum)
    grads, params = [], []
    for _ in range(spec["steps"]):
        opt.zero_grad()
        full_batch_loss(model, spec, n).backward()
        grads.append([None if p.grad is None else p.grad.detach().clone() for p in model.parameters()])
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    return grads, params


def local_grads(spec, rank: int, n: int) -> list:
    """Rank ``rank``'s own gradients at the start (its batch only, nothing averaged)."""
    model = probes.build_model(spec["arch"], spec["state"])
    probes.set_active(model, rank, spec["arch"])
    nn.functional.mse_loss(model(_shard(spec["x"], rank, n)), _shard(spec["y"], rank, n)).backward()
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def torch_buckets(spec, n: int) -> dict:
    """The buckets torch's Reducer all-reduces, as element counts in launch order: the first iteration's (one
    bucket: construction passes the limit sys.maxsize) and the rebuilt ones (its assignment function over
    the order this model's gradients really become ready, limits [first bucket, cap])."""
    model = probes.build_model(spec["arch"], spec["state"])
    params = [p for p in model.parameters() if p.requires_grad]
    order: list[int] = []
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, i=i: order.append(i))
    full_batch_loss(model, spec, n).backward()
    kw = spec["kwargs"]
    cap, first = int(kw.get("bucket_cap_mb", 25.0) * MiB), int(kw.get("first_bucket_cap_mb", 1.0) * MiB)
    initial, _ = dist._compute_bucket_assignment_by_size(params, [sys.maxsize])
    rebuilt, _ = dist._compute_bucket_assignment_by_size([params[i] for i in order], [first, cap], [], order)

    def numels(buckets):
        return [sum(params[i].numel() for i in b) for b in buckets]

    wrong_order, _ = dist._compute_bucket_assignment_by_size(params, [first, cap])  # registration order
    return {"first": numels(reversed(initial)), "rebuilt": numels(rebuilt), "order": order,
            "registration_order": numels(wrong_order)}


def _ddp_expected(spec, n, bucketed: bool):
    grads, params = sgd_trajectory(spec, n)
    return {"grads": grads, "final": params[-1], "names": param_names(spec),
            "init": [v.detach() for v in probes.build_model(spec["arch"], spec["state"]).parameters()],
            "buckets": torch_buckets(spec, n) if bucketed else None,
            "n_params": sum(g is not None for g in grads[0])}  # one all-reduce per parameter that gets a gradient


def _arch_classes(index: int = 1) -> dict:
    """The DDP/ZeRO/FSDP boundary classes, on a case whose ``args[index]`` is the spec."""
    def arch(c):
        return c.args[index]["arch"]

    return {
        "a frozen parameter (requires_grad=False)": lambda c, e: bool(arch(c).get("frozen")),
        "a tied parameter (one Parameter in two layers)": lambda c, e: bool(arch(c).get("tie")) or any(
            layer[0] == "pair" for layer in arch(c)["layers"]),
        "a non-contiguous parameter": lambda c, e: bool(arch(c).get("noncontig")),
        "a layer with one output (size-1 dims)": lambda c, e: arch_dims(arch(c))[1] == 1,
        "three and four ranks": lambda c, e: c.args[0] in (3, 4),
    }


class NaiveDDPExercise(_MultiRank):
    id, entry, points = "distributed.naive_ddp", "NaiveDDP", 2
    title = "DDP with one all-reduce per parameter, launched from its gradient hook"
    probe = f"{PROBES}:ddp_steps"
    bucketed = False
    n_spawns = 3

    def spec_cases(self):
        return ([(2, _ddp_spec(2, mlp_arch((5, 7, 6, 3)), 4, seed=0))],
                [(3, _ddp_spec(3, mlp_arch((4, 9, 1), frozen=("0.bias",), unused=(0,)), 2, seed=1)),
                 (4, _ddp_spec(4, mlp_arch((6, 5, 5, 5, 1), tie=(("4.weight", "2.weight"),), noncontig=("0.weight",)),
                               3, seed=2))])

    boundary_classes = {**_arch_classes(), "a parameter its forward never uses (.grad stays None)":
                        lambda c, e: bool(c.args[1]["arch"].get("unused"))}

    def visible_cases(self):
        return [Case((n, s), label=_spec_label(n, s)) for n, s in self.spec_cases()[0]]

    def hidden_cases(self):
        return [Case((n, s), label=_spec_label(n, s)) for n, s in self.spec_cases()[1]]

    def shown(self, case):
        n, spec = case.args
        kw = "".join(f", {k}={v * MiB:g} / 2**20" for k, v in spec["kwargs"].items())
        return (f"ddp = {self.entry}(model{kw}) in each of {n} ranks (rank r's model starts different); then "
                f"{spec['steps']} x [loss = mse(ddp(x_r), y_r); loss.backward(); read every p.grad; SGD step]")

    def expected(self, case):
        n, spec = case.args
        return _ddp_expected(spec, n, self.bucketed)

    def compare_ranks(self, case, got, expected):
        n, spec = case.args
        names = expected["names"]
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
                    return (problem + "\n  when loss.backward() returns, every p.grad must equal the full-batch "
                                      "gradient: the mean over ranks (nobody calls a finish method for you).")
        for r, res in enumerate(got):
            problem = compare_tensor_lists(res["final"], expected["final"], f"rank {r}", names,
                                           f" after {spec['steps']} SGD steps")
            if problem:
                return problem
        return self.compare_communication(case, got, expected)

    def compare_communication(self, case, got, expected):
        for r, res in enumerate(got):
            for step, ov in enumerate(res["overlap"]):
                k = len(ov["all_reduce_numels"])
                if k != expected["n_params"]:
                    return (f"rank {r}, step {step}: {k} all-reduces during one backward; this exercise launches "
                            f"exactly one per parameter that gets a gradient ({expected['n_params']}), from its hook.")
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
                    f"until it finishes. Launch it asynchronously and wait for it when backward ends.")
        if ov["reduces_during_backward"] < len(ov["all_reduce_numels"]) or not ov["first_reduce_before_last_ready"]:
            return (f"rank {r}, step {step}: the all-reduces started only after backward had produced every "
                    f"gradient, so communication cannot overlap computation. Launch each one from a hook, as "
                    f"soon as its gradient (or its bucket) is ready.")
        if ov.get("unwaited"):
            return (f"rank {r}, step {step}: {ov['unwaited']} all-reduce(s) had not been waited on when "
                    f"loss.backward() returned, so the optimizer could read a gradient still being reduced. Queue "
                    f"a callback on the autograd engine from the first hook of each backward "
                    f"(torch.autograd.Variable._execution_engine.queue_callback) and wait for every handle there.")
        return None

    def diagnose(self, case, got, expected):
        n, spec = case.args
        if _rank_results(got, n):
            return None
        for r, res in enumerate(got):
            grads = res.get("grads")
            if not grads or _all_close(grads[0], expected["grads"][0]):
                continue
            if any(g is None and e is not None for g, e in zip(grads[0], expected["grads"][0])):
                return None
            return self._grad_diagnosis(grads[0], spec, expected["grads"][0], r, n, res["overlap"][0])
        return None

    @staticmethod
    def _grad_diagnosis(got_grads, spec, expected_grads, rank, n, overlap) -> str | None:
        """The likely cause of wrong DDP gradients: never averaged, summed, divided by the wrong N."""
        if _all_close(got_grads, local_grads(spec, rank, n)):
            if not overlap["all_reduce_numels"]:
                return (f"rank {rank}'s gradients are its own local ones and no all-reduce ran during backward: "
                        f"the hooks never launched one (a Tensor.register_hook fires BEFORE the gradient is "
                        f"accumulated, when p.grad is still None: use register_post_accumulate_grad_hook).")
            return (f"rank {rank}'s gradients are its own local ones although all-reduces ran: the averaged values "
                    f"never reached p.grad before loss.backward() returned (copy them back in the callback that "
                    f"runs when backward ends).")
        r = _ratio(got_grads, expected_grads)
        if r is not None and abs(r - 1) > 1e-3:
            if abs(r - n) < 1e-3:
                return (f"the gradients are {n} x the full-batch gradient: the all-reduce SUMS over ranks; "
                        f"divide by the world size ({n}) to get the mean.")
            for label, k in (("world_size - 1", n - 1), ("world_size + 1", n + 1), ("world_size squared", n ** 2)):
                if k and abs(r - n / k) < 1e-3:
                    return (f"averaging by the wrong world size: the gradients are {r:.3g} x the right ones, as if "
                            f"the sum over {n} ranks had been divided by {label} ({k}).")
        return None


class BucketedDDPExercise(NaiveDDPExercise):
    id, entry, points = "distributed.bucketed_ddp", "BucketedDDP", 3
    title = "DDP with gradient buckets, rebuilt in the order gradients arrive, all-reduced while backward runs"
    bucketed = True
    n_spawns = 5

    def spec_cases(self):
        tiny = {"bucket_cap_mb": 200 / MiB, "first_bucket_cap_mb": 50 / MiB}  # 200 B and 50 B
        return ([(2, _ddp_spec(2, mlp_arch((5, 7, 6, 3)), 4, seed=0, kwargs=tiny))],
                [(3, _ddp_spec(3, mlp_arch((6, 5, 5, 7, 2), frozen=("2.weight",)), 2, seed=3, steps=3,
                               kwargs={"bucket_cap_mb": 256 / MiB, "first_bucket_cap_mb": 64 / MiB})),
                 (4, _ddp_spec(4, mlp_arch((4, 6, 6, 6, 1), tie=(("4.weight", "2.weight"),), noncontig=("0.weight",)),
                               2, seed=4, kwargs={"bucket_cap_mb": 100 / MiB, "first_bucket_cap_mb": 100 / MiB})),
                 # the first bucket reaches its limit exactly: 4.bias + 4.weight + 2.bias = 12 + 72 + 24 bytes
                 (2, _ddp_spec(2, mlp_arch((5, 7, 6, 3)), 3, seed=5, steps=3,
                               kwargs={"bucket_cap_mb": 196 / MiB, "first_bucket_cap_mb": 108 / MiB})),
                 (2, _ddp_spec(2, mlp_arch((5, 7, 6, 3)), 3, seed=6))])  # default caps: one bucket

    boundary_classes = {
        **_arch_classes(),
        "first_bucket_cap == bucket_cap": lambda c, e: len(c.args[1]["kwargs"]) == 2 and len(
            set(c.args[1]["kwargs"].values())) == 1,
        "the default caps (one bucket)": lambda c, e: not c.args[1]["kwargs"],
        "a bucket that reaches its limit exactly": lambda c, e: c.args[1]["kwargs"].get(
            "first_bucket_cap_mb", 0) * MiB == 108,
        "three steps (the rebuilt buckets used twice)": lambda c, e: c.args[1]["steps"] >= 3,
    }

    def shown(self, case):
        return super().shown(case).replace("read every p.grad", "read every p.grad and the all-reduces issued")

    def compare_communication(self, case, got, expected):
        buckets = expected["buckets"]
        for r, res in enumerate(got):
            for step, ov in enumerate(res["overlap"]):
                numels = ov["all_reduce_numels"]
                want = buckets["first"] if step == 0 else buckets["rebuilt"]
                if numels != want:
                    why = ("the first backward: torch does not know yet in which order the gradients will arrive, so "
                           "every parameter is in ONE bucket (construction passes the limit sys.maxsize), reduced "
                           "when the last gradient is ready" if step == 0 else
                           "from the second forward on, the buckets rebuilt over the order the first backward's "
                           "gradients became ready, with the limits [first_bucket_cap, bucket_cap]")
                    return (f"rank {r}, step {step}: one backward all-reduced tensors of {numels} elements; torch "
                            f"all-reduces buckets of {want} elements here ({why}), each as ONE flat buffer, in "
                            f"that order.")
                others = [c for c in ov["other_calls"] if not (step == 1 and c == "broadcast")]  # the rebuild's
                if others:
                    return f"rank {r}, step {step}: unexpected collectives during the step: {others}."
                if len(want) > 1:
                    problem = self._overlap_problem(r, step, ov)
                    if problem:
                        return problem
                elif not all(ov["all_reduce_async"]) or ov.get("unwaited"):
                    return self._overlap_problem(r, step, ov)
        return None

    def diagnose(self, case, got, expected):
        hint = super().diagnose(case, got, expected)
        if hint:
            return hint
        n, spec = case.args
        if _rank_results(got, n):
            return None
        buckets = expected["buckets"]
        seen = [ov.get("all_reduce_numels") for ov in got[0].get("overlap", [])]
        if len(seen) > 1 and seen[1] == buckets["registration_order"] != buckets["rebuilt"]:
            return ("the buckets follow registration (forward) order; gradients become ready in (roughly) REVERSE "
                    "order, and torch rebuilds the buckets in the order it saw them arrive in the first backward, so "
                    "the first bucket (the last layer's gradients) is all-reduced while backward continues.")
        if seen and seen[0] == buckets["rebuilt"] != buckets["first"]:
            return ("the first backward already used the rebuilt buckets: torch cannot know the order yet, so its "
                    "first iteration has ONE bucket; record the order the hooks fire in, and rebuild at the next "
                    "forward.")
        if len(seen) > 1 and seen[1] == buckets["first"] != buckets["rebuilt"]:
            return ("the buckets were never rebuilt: at the forward after the first backward, assign buckets over "
                    "the order the first backward's hooks fired in (with your assign_buckets) and use those from "
                    "then on.")
        return None


class AccumulatingDDPExercise(_MultiRank):
    id, entry, points = "distributed.no_sync", "AccumulatingDDP", 2
    title = "no_sync(): gradient accumulation with one all-reduce per step"
    probe = f"{PROBES}:no_sync_steps"

    def _spec(self, n, arch, per_rank, seed, micro):
        return _ddp_spec(n, arch, per_rank, seed, steps=2, micro=micro,
                         kwargs={"bucket_cap_mb": 200 / MiB, "first_bucket_cap_mb": 50 / MiB})

    def visible_cases(self):
        s = self._spec(2, mlp_arch((5, 7, 6, 3)), 6, 0, 3)
        return [Case((2, s), label=_spec_label(2, s, ", 3 micro-batches per step (2 inside no_sync)"))]

    boundary_classes = {**_arch_classes(), "two micro-batches (one inside no_sync)": lambda c, e: c.args[1]["micro"] == 2}

    def hidden_cases(self):
        out = []
        for n, arch, per_rank, seed, micro in (
                (3, mlp_arch((4, 9, 1), frozen=("0.bias",), noncontig=("0.weight",)), 4, 1, 2),
                (4, mlp_arch((6, 5, 5, 5, 2), tie=(("4.weight", "2.weight"),)), 3, 2, 3)):
            s = self._spec(n, arch, per_rank, seed, micro)
            out.append(Case((n, s), label=_spec_label(n, s, f", {micro} micro-batches per step")))
        return out

    def shown(self, case):
        n, spec = case.args
        m = spec["micro"]
        kw = "".join(f", {k}={v * MiB:g} / 2**20" for k, v in spec["kwargs"].items())
        return (f"ddp = AccumulatingDDP(model{kw}) in each of {n} ranks; then {spec['steps']} x [{m - 1} micro-batch"
                f"{'es' if m > 2 else ''} inside `with ddp.no_sync():` (forward, backward), 1 outside, SGD step]")

    def expected(self, case):
        n, spec = case.args
        m = spec["micro"]
        model = probes.build_model(spec["arch"], spec["state"])
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"])
        rounds = []

        def grads_of(module):
            return [None if p.grad is None else p.grad.detach().clone() for p in module.parameters()]

        for _ in range(spec["steps"]):
            start = {k: v.detach().clone() for k, v in model.state_dict().items()}
            local, last_mean = [], None  # local[r][k]: rank r's p.grad after its k-th micro-batch
            for r in range(n):
                xs, ys = _shard(spec["x"], r, n).chunk(m), _shard(spec["y"], r, n).chunk(m)
                ref = probes.build_model(spec["arch"], start)
                acc = []
                for k in range(m):
                    (nn.functional.mse_loss(ref(xs[k]), ys[k]) / m).backward()
                    acc.append(grads_of(ref))
                last = ([None if a is None else a - b for a, b in zip(acc[-1], acc[-2])] if m > 1
                        else acc[-1])  # the last micro-batch's own gradient
                last_mean = ([None if g is None else g / n for g in last] if last_mean is None else
                             [None if g is None else a + g / n for a, g in zip(last_mean, last)])
                local.append(acc)
            opt.zero_grad()
            full_batch_loss(model, spec, n).backward()  # = mean over ranks of the sums
            rounds.append({"local": [acc[:-1] for acc in local], "local_total": [acc[-1] for acc in local],
                           "last_mean": last_mean, "synced": grads_of(model)})
            opt.step()
        return {"rounds": rounds, "final": [p.detach().clone() for p in model.parameters()],
                "names": param_names(spec)}

    @staticmethod
    def calls_in_no_sync(rec, step: int) -> list[str]:
        """The collectives called inside no_sync(), but for the broadcast of rank 0's rebuilt buckets, which torch
        makes at the forward after the first backward, inside no_sync or not."""
        return [c for c in rec["calls_in_no_sync"] if not (step == 1 and c == "broadcast")]

    def compare_ranks(self, case, got, expected):
        n, spec = case.args
        names = expected["names"]
        for step in range(spec["steps"]):
            for r, res in enumerate(got):
                rec = res["rounds"][step]
                inside = self.calls_in_no_sync(rec, step)
                if inside:
                    calls = ", ".join(f"{inside.count(c)} x dist.{c}" for c in sorted(set(inside)))
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
                                               f"rank {r}, step {step}, when the synced backward returned", names,
                                               ".grad")
                if problem:
                    return (problem + "\n  the synced backward must average the WHOLE accumulated p.grad (all "
                                      "micro-batches) over ranks, by the time loss.backward() returns.")
                if rec.get("unwaited"):
                    return NaiveDDPExercise._overlap_problem(r, step, {"all_reduce_async": [True],
                                                                       "all_reduce_numels": [],
                                                                       "reduces_during_backward": 0,
                                                                       "first_reduce_before_last_ready": True,
                                                                       "unwaited": rec["unwaited"]})
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
                if self.calls_in_no_sync(rec, step) or _all_close(g, exp["synced"]):
                    continue
                if _all_close(g, exp["last_mean"]):
                    return ("only the last micro-batch's gradient was averaged: your hook saw the INCOMING gradient "
                            "(Tensor.register_hook fires before accumulation). With "
                            "register_post_accumulate_grad_hook, p.grad already holds the sum over all "
                            "micro-batches when the hook runs.")
                if _all_close(g, exp["local_total"][r]) and "all_reduce" not in rec.get("synced_calls", []):
                    return ("after the synced backward p.grad is still this rank's own sum and nothing was "
                            "all-reduced: leaving no_sync() must turn synchronisation back on.")
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
                Case((0, 3, 2), label="nothing to shard"),
                Case((10, 4, 4), label="rank 4 of 4 ranks does not exist: IndexError")]

    boundary_classes = {
        "numel 0": lambda c, e: c.args[0] == 0 and not isinstance(e, Raises),
        "one rank": lambda c, e: c.args[1] == 1 and c.args[0] > 0,
        "numel == world_size": lambda c, e: c.args[0] == c.args[1] > 1,
        "an empty shard (numel < world_size)": lambda c, e: isinstance(e, tuple) and e[0] == e[1] and c.args[0] > 0,
        "the last rank's short shard": lambda c, e: isinstance(e, tuple) and c.args[2] == c.args[1] - 1 and 0 < (
            e[1] - e[0]) < -(-c.args[0] // c.args[1]),
        "numel % world_size == 1 (the most padding)": lambda c, e: c.args[1] > 2 and c.args[0] % c.args[1] == 1,
        "numel divisible by world_size": lambda c, e: c.args[1] > 1 and c.args[0] > 0 and c.args[0] % c.args[1] == 0,
        "a numel > 256": lambda c, e: c.args[0] > 256 and not isinstance(e, Raises),
        "rank == world_size (error)": lambda c, e: c.args[2] == c.args[1] > 0,
        "rank > world_size (error)": lambda c, e: c.args[2] > c.args[1] > 0,
        "numel -1 (error)": lambda c, e: c.args[0] == -1,
        "a negative rank (error)": lambda c, e: c.args[2] < 0,
        "world_size 0 (error)": lambda c, e: c.args[1] == 0,
        "a negative numel (error)": lambda c, e: c.args[0] < 0,
    }

    def hidden_cases(self):
        def case(numel, n, data):
            return Case((numel, n, data.draw(st.integers(0, n - 1))))

        deliberate = [(1, 1, 0), (7, 8, 7), (1001, 4, 3), (9, 3, 2), (4, 4, 3), (13, 4, 3), (13, 4, 0), (12, 4, 3),
                      (300, 7, 6), (3, 5, 4), (10, 4, -1), (10, 0, 0), (-3, 2, 1), (-1, 3, 0), (10, 3, 3), (10, 3, 5),
                      (0, 2, 0)]
        return [Case(c) for c in deliberate] + draw(st.builds(case, st.integers(0, 500), st.integers(1, 8),
                                                                  st.data()), 70)

    def expected(self, case):
        numel, n, rank = case.args
        if n < 1:
            return Raises(("ValueError",), "world_size must be >= 1")
        if numel < 0:
            return Raises(("ValueError",), "numel must be >= 0")
        if not 0 <= rank < n:
            return Raises(("IndexError",), f"rank must be in [0, {n})")
        sizes = [len(c) for c in torch.arange(numel).chunk(n)] if numel else []  # FSDP2's dim-0 split
        sizes += [0] * (n - len(sizes))
        start = sum(sizes[:rank])
        return (start, start + sizes[rank])

    def compare_out(self, case, got, expected):
        return same_value(tuple(got) if isinstance(got, list) else got, expected)

    @staticmethod
    def variants(numel, n, rank) -> dict[str, tuple]:
        base, ceil = numel // n, -(-numel // n)
        extra = numel % n
        start = rank * base + min(rank, extra)
        return {"drops_remainder": (rank * base, (rank + 1) * base),
                "end_not_clamped": (min(rank * ceil, numel), (rank + 1) * ceil),
                "balanced_split": (start, start + base + (1 if rank < extra else 0))}

    HINTS = {
        "drops_remainder": "the last elements belong to nobody: with shards of numel // N the remainder is dropped. "
                           "Use S = ceil(numel / N) (the all-gather needs equal shards; the padding lives past "
                           "numel).",
        "end_not_clamped": "the shard ends past the last element: clamp start and end to numel (the padding is not "
                           "part of any shard).",
        "balanced_split": "every shard has S = ceil(numel / N) elements (clamped to numel), so rank r starts at r * S: "
                          "the remainder is not spread over the first ranks here.",
    }

    def diagnose_out(self, case, got, expected):
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(v, int) for v in got)):
            return None
        hints = [self.HINTS[k] for k, v in self.variants(*case.args).items() if v == tuple(got) != expected]
        return " Or: ".join(hints) if hints else None

    def diagnose_no_error(self, case, got, expected):
        numel, n, rank = case.args
        if n < 1 or numel < 0:
            return f"{case.call_text(self.entry)} must raise ValueError: there is no shard of it."
        return f"rank {rank} does not exist among {n} ranks: raise IndexError (ranks are 0 .. {n - 1})."


# ================================================================================================
# distributed.sharded_adamw ZeRO-1
# ================================================================================================
def _numel(spec) -> int:
    return sum(p.numel() for p in probes.build_model(spec["arch"], spec["state"]).parameters())


class ShardedAdamWExercise(_MultiRank):
    id, entry, points = "distributed.sharded_adamw", "ShardedAdamW", 3
    title = "ZeRO-1: AdamW whose state is sharded over the ranks"
    probe = f"{PROBES}:zero_steps"
    n_spawns = 4
    hyper = {"lr": 0.05, "betas": (0.9, 0.99), "eps": 1e-3, "weight_decay": 0.1}

    def _spec(self, n, arch, per_rank, seed, steps=3):
        d_in, d_out = arch_dims(arch)
        x, y = make_batch(n * per_rank, d_in, d_out, seed)
        return {"arch": arch, "state": make_state(arch, seed), "x": x, "y": y, "steps": steps,
                "hyper": dict(self.hyper)}

    def _case(self, n, spec):
        return Case((n, spec), label=_spec_label(n, spec, f", {_numel(spec)} parameters"))

    def visible_cases(self):
        return [self._case(2, self._spec(2, mlp_arch((6, 10, 8, 3), frozen=("0.bias",)), 4, 0))]

    boundary_classes = {
        **_arch_classes(),
        "a parameter its forward never uses (.grad None on every rank)": lambda c, e: bool(
            c.args[1]["arch"].get("unused")),
        "a parameter only rank 0's batch uses (.grad None on the others)": lambda c, e: bool(
            c.args[1]["arch"].get("rank0_only")),
        "P not divisible by the world size (a short last shard)": lambda c, e: e["numel"] % c.args[0] != 0,
        "P divisible by the world size (no padding)": lambda c, e: e["numel"] % c.args[0] == 0,
        "a rank whose range is empty (P < (N - 1) S)": lambda c, e: e["numel"] <= (c.args[0] - 1) * e["shard"],
        "the first parameter frozen": lambda c, e: "0.weight" in c.args[1]["arch"].get("frozen", ()),
    }

    def hidden_cases(self):
        pair = {"layers": [("linear", 4, 9), ("tanh",), ("pair", 9), ("tanh",), ("linear", 9, 4), ("tanh",),
                           ("linear", 4, 1)], "unused": (4,), "noncontig": ("0.weight",)}  # P = 192 = 3 x 64
        maybe = {"layers": [("linear", 6, 5), ("tanh",), ("maybe", 5), ("tanh",), ("linear", 5, 5), ("tanh",),
                            ("linear", 5, 5), ("tanh",), ("linear", 5, 3)], "rank0_only": (2,),
                 "tie": (("6.weight", "4.weight"),), "frozen": ("0.weight", "8.bias")}
        tiny = mlp_arch((1, 1))  # P = 2 over 4 ranks: ranks 2 and 3 own nothing
        return [self._case(3, self._spec(3, pair, 2, 1)), self._case(4, self._spec(4, maybe, 3, 2)),
                self._case(4, self._spec(4, tiny, 1, 3))]

    def shown(self, case):
        n, spec = case.args
        kw = ", ".join(f"{k}={v}" for k, v in spec["hyper"].items())
        return (f"opt = ShardedAdamW(model.parameters(), {kw}) in each of {n} ranks; then {spec['steps']} x "
                f"[opt.zero_grad(); mse(model(x_r), y_r).backward(); opt.step()]")

    def expected(self, case):
        n, spec = case.args
        model = probes.build_model(spec["arch"], spec["state"])
        opt = torch.optim.AdamW(model.parameters(), **spec["hyper"])
        weights = []
        for _ in range(spec["steps"]):
            opt.zero_grad()
            full_batch_loss(model, spec, n).backward()
            opt.step()
            weights.append([p.detach().clone() for p in model.parameters()])
        numel = _numel(spec)
        shard = -(-numel // n)
        n_params = len(weights[0])
        return {"weights": weights, "numel": numel, "shard": shard, "names": param_names(spec),
                "max_state_bytes": 4 * 3 * shard + 8 * n_params + 64, "unsharded_bytes": 4 * 2 * numel}

    def compare_ranks(self, case, got, expected):
        n, spec = case.args
        names = expected["names"]
        for r, res in enumerate(got):
            if res.get("torch_zero"):
                return (f"rank {r}: your optimizer holds a {res['torch_zero']}: this exercise asks you to write the "
                        f"sharding yourself (flat shards, reduce-scatter, AdamW on your shard, all-gather).")
        for step in range(spec["steps"]):
            for r, res in enumerate(got):
                problem = compare_tensor_lists(res["weights"][step], expected["weights"][step], f"rank {r}", names,
                                               f" after step {step + 1}", rtol=1e-4, atol=2e-6)
                if problem:
                    return (problem + "\n  after each step() every rank's parameters must equal torch.optim.AdamW's "
                                      "on the full-batch (mean over ranks) gradient, which skips a parameter whose "
                                      ".grad is None.")
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
    def _adamw_step(spec, n, factor: float = 1.0, optimizer=torch.optim.AdamW) -> list[torch.Tensor]:
        """One step of ``optimizer`` (torch's AdamW, or a plausible wrong one) on ``factor`` x the full-batch
        gradient (a plausible wrong average)."""
        model = probes.build_model(spec["arch"], spec["state"])
        full_batch_loss(model, spec, n).backward()
        opt = optimizer(model.parameters(), **spec["hyper"])
        for p in model.parameters():
            if p.grad is not None:
                p.grad *= factor
        opt.step()
        return [p.detach().clone() for p in model.parameters()]

    def diagnose(self, case, got, expected):
        n, spec = case.args
        if _rank_results(got, n) or any(res.get("torch_zero") for res in got):
            return None
        init = list(probes.build_model(spec["arch"], spec["state"]).parameters())
        want = expected["weights"][0]
        numel = expected["numel"]
        h = spec["hyper"]
        names = expected["names"]
        for r, res in enumerate(got):
            mine = res["weights"][0]
            if len(mine) != len(want) or _all_close(mine, want, rtol=1e-4, atol=2e-6):
                continue
            decayed = [k for k, (g, e, i) in enumerate(zip(mine, want, init)) if torch.equal(e, i.detach())
                       and not torch.equal(_values(g), e)
                       and torch.allclose(_values(g), i.detach() * (1 - h["lr"] * h["weight_decay"]), atol=1e-7)]
            if decayed:
                return (f"{names[decayed[0]]} has no gradient (frozen, or unused by the forward) but your step "
                        f"moved it by AdamW's decoupled weight decay: torch.optim.AdamW skips a parameter whose .grad "
                        f"is None, weight decay included (a missing gradient is not a zero gradient).")
            flat_g = torch.cat([_values(t).flatten() for t in mine])
            flat_e = torch.cat([t.flatten() for t in want])
            flat_i = torch.cat([t.detach().flatten() for t in init])
            bad = ~torch.isclose(flat_g, flat_e, rtol=1e-4, atol=2e-6)
            unchanged = torch.isclose(flat_g, flat_i, rtol=0, atol=0)
            idx = bad.nonzero().flatten()
            if bool(unchanged[idx].all()):
                if numel % n and int(idx.min()) >= numel - numel % n:
                    return ("the last elements of the flat parameter were never updated: shards of numel // N drop "
                            "the remainder. Use S = ceil(numel / N) and pad the flat buffers to N * S.")
                if spec["arch"].get("rank0_only"):
                    return ("a parameter only rank 0's batch uses was not stepped where another rank owns its shard: "
                            "whether a parameter has a gradient is decided over ALL ranks (all-reduce one flag per "
                            "parameter); a missing gradient on some ranks counts as zero in the mean.")
                lo, hi = -(-numel // n) * r, min(-(-numel // n) * (r + 1), numel)
                if not bool(bad[lo:hi].any()):
                    return ("this rank's own shard is right but the rest was never updated: all-gather the updated "
                            "shards (in rank order) and copy them into every parameter.")
                return None
            for factor, why in ((n, "sums the gradients over ranks without dividing by N"),
                                (n / max(n - 1, 1), "divides the sum over ranks by N - 1"),
                                (n / (n + 1), "divides the sum over ranks by N + 1")):
                if n > 1 and _all_close(mine, self._adamw_step(spec, n, factor), rtol=1e-4, atol=2e-6):
                    return (f"averaging by the wrong world size: your update is AdamW's on a gradient "
                            f"{factor:.3g} x the mean, as if the code {why}. (AdamW barely notices the scale of "
                            f"its gradient, except through eps: the error is small but real.)")
            if _all_close(mine, self._adamw_step(spec, n, optimizer=torch.optim.Adam), rtol=1e-4, atol=2e-6):
                return ("your step is torch.optim.Adam's, whose weight_decay is an L2 term added to the gradient; "
                        "AdamW decays the weights directly (decoupled weight decay): use torch.optim.AdamW.")
            return None
        return None


# ================================================================================================
# distributed.fully_sharded FSDP2's design
# ================================================================================================
def _chunk(t: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s rows of ``t``: ``torch.chunk(t, n, dim=0)`` padded with empty chunks, what fully_shard keeps."""
    chunks = list(torch.chunk(t.detach(), n, dim=0))
    return chunks[rank] if rank < len(chunks) else t.detach()[t.shape[0]:]


def _refusable(arch) -> tuple[str, ...]:
    """Names of the parameters torch's fully_shard refuses: tied between two children of the Sequential (two
    groups), or not contiguous. A student's wrapper may refuse them too, with an error naming one."""
    out = []
    for name, source in arch.get("tie", ()):
        if name.split(".")[0] != source.split(".")[0]:
            out += [name, source]
    return tuple(out) + tuple(arch.get("noncontig", ()))


class FullyShardedExercise(_MultiRank):
    id, entry, points = "distributed.fully_sharded", "FullyShardedSequential", 3
    title = "FSDP2's design: every parameter sharded on dim 0, gathered per unit, the shards stay the model's"
    probe = f"{PROBES}:fsdp_steps"
    n_spawns = 4

    def _spec(self, n, arch, per_rank, seed, steps=3):
        d_in, d_out = arch_dims(arch)
        x, y = make_batch(n * per_rank, d_in, d_out, seed)
        x_eval, _ = make_batch(5, d_in, d_out, seed + 100)
        return {"arch": arch, "state": make_state(arch, seed), "x": x, "y": y, "x_eval": x_eval, "steps": steps,
                "lr": 0.1}

    def visible_cases(self):
        s = self._spec(2, mlp_arch((6, 8, 8, 8, 8, 3), frozen=("0.bias",)), 4, 0)
        return [Case((2, s), label=_spec_label(2, s))]

    boundary_classes = {
        **_arch_classes(),
        "a parameter its forward never uses (.grad stays None)": lambda c, e: bool(c.args[1]["arch"].get("unused")),
        "a parameter with fewer rows than ranks (empty shards)": lambda c, e: any(
            layer[0] == "linear" and layer[2] < c.args[0] for layer in c.args[1]["arch"]["layers"]),
        "a parameter tied between two units (torch refuses it)": lambda c, e: any(
            a.split(".")[0] != b.split(".")[0] for a, b in c.args[1]["arch"].get("tie", ())),
        "rows not divisible by the world size": lambda c, e: any(
            layer[0] == "linear" and layer[2] % c.args[0] for layer in c.args[1]["arch"]["layers"]),
    }

    def hidden_cases(self):
        a = {"layers": [("linear", 5, 7), ("tanh",), ("pair", 7), ("tanh",), ("linear", 7, 7), ("tanh",),
                        ("linear", 7, 2)], "frozen": ("2.a.bias",), "unused": (4,)}
        b = mlp_arch((6, 5, 5, 5, 1), tie=(("4.weight", "2.weight"),), noncontig=("0.weight",))
        c = mlp_arch((9, 6, 6, 6, 6, 6, 1), frozen=("2.weight", "4.bias"))  # 4.bias: the last of a later unit
        return [Case((n, s), label=_spec_label(n, s)) for n, s in (
            (3, self._spec(3, a, 2, 1)), (4, self._spec(4, b, 2, 2)), (4, self._spec(4, c, 2, 3)))]

    def shown(self, case):
        n, spec = case.args
        return (f"fsdp = FullyShardedSequential(model) in each of {n} ranks; then {spec['steps']} x "
                f"[mse(fsdp(x_r), y_r).backward(); SGD step (lr {spec['lr']}, momentum 0.5) on model.parameters()]; "
                f"then fsdp(x_eval)")

    def expected(self, case):
        n, spec = case.args
        model = probes.build_model(spec["arch"], spec["state"])
        names = param_names(spec)
        start = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.5)
        losses = []
        for _ in range(spec["steps"]):
            per_rank = [nn.functional.mse_loss(model(_shard(spec["x"], r, n)), _shard(spec["y"], r, n)).item()
                        for r in range(n)]
            losses.append(per_rank)
            opt.zero_grad()
            full_batch_loss(model, spec, n).backward()
            opt.step()
        with torch.no_grad():
            out = model(spec["x_eval"])
        final = [p.detach().clone() for p in model.parameters()]
        units = []  # bytes each unit's gather brings in: N * ceil(d0 / N) rows of every parameter
        for child in probes.build_model(spec["arch"], spec["state"]):
            units.append(sum(4 * n * -(-p.shape[0] // n) * math.prod(p.shape[1:]) for p in child.parameters()))
        return {"names": names, "losses": losses, "out": out,
                "shards": [[_chunk(t, r, n) for t in start] for r in range(n)],
                "final": [[_chunk(t, r, n) for t in final] for r in range(n)],
                "requires_grad": [p.requires_grad for p in model.parameters()],
                "numel": sum(p.numel() for p in start), "may_refuse": _refusable(spec["arch"]),
                "max_peak": 3 * max(units), "full_bytes": sum(units), "unit_bytes": max(units)}

    def compare_ranks(self, case, got, expected):
        n, spec = case.args
        refused = [res.get("refused") for res in got]
        if any(refused):
            r, why = next((r, w) for r, w in enumerate(refused) if w)
            if expected["may_refuse"] and all(refused) and all(
                    any(f"'{t}'" in w or f'"{t}"' in w or f" {t} " in f" {w} " for t in expected["may_refuse"])
                    for w in refused):
                return None  # refused by name, as torch's fully_shard refuses it
            allowed = (f" (only what torch's fully_shard refuses, a parameter tied between two units or a "
                       f"non-contiguous one, may be refused, with an error naming it: "
                       f"{' or '.join(expected['may_refuse'])})" if expected["may_refuse"] else
                       " on a model torch's fully_shard accepts (frozen parameters, a parameter used twice inside "
                       "one unit, a parameter the forward never uses)")
            return f"rank {r}: your wrapper raised {why}{allowed}."
        names = expected["names"]
        for r, res in enumerate(got):
            if res.get("torch_fsdp"):
                return (f"rank {r}: the model holds {res['torch_fsdp']}: build the sharding yourself instead of "
                        f"calling torch.distributed.fsdp.")
            if res["names"] != names:
                return (f"rank {r}: model.named_parameters() after wrapping gives {res['names']}; FSDP2 keeps every "
                        f"parameter registered under its own name, as its shard: expected {names}. (Replace each "
                        f"parameter on its module by an nn.Parameter holding this rank's rows.)")
            for k, (g, e) in enumerate(zip(res["shards"], expected["shards"][r])):
                g = _values(g)
                if tuple(g.shape) != tuple(e.shape):
                    return (f"rank {r}: the shard of {names[k]} has shape {tuple(g.shape)}; torch's fully_shard keeps "
                            f"torch.chunk(p, {n}, dim=0)[{r}]: rows [{r} S, {r + 1} S) of dim 0 with S = ceil(d0 / {n}), "
                            f"empty past the last row, here shape {tuple(e.shape)}.")
                problem = close_tensors(g, e, rtol=0, atol=0)
                if problem:
                    return f"rank {r}: the shard of {names[k]} right after wrapping is not rank {r}'s rows of it:\n  " \
                           + problem
            flags = res["requires_grad"]
            for k, (g, e) in enumerate(zip(flags, expected["requires_grad"])):
                if g != e:
                    return (f"rank {r}: the shard of {names[k]} has requires_grad={g}; the parameter it replaces had "
                            f"requires_grad={e} (a frozen parameter stays frozen: no gradient, no update).")
        for step in range(spec["steps"]):
            for r, res in enumerate(got):
                g, e = res["losses"][step], expected["losses"][step][r]
                if not isinstance(g, float) or not math.isclose(g, e, rel_tol=1e-4, abs_tol=1e-6):
                    return (f"rank {r}, step {step}: the loss on this rank's batch was {describe(g)}, expected {e!r} "
                            f"(the single-process model trained on the full batch, SGD with momentum). "
                            + ("The forward is already wrong: check how you gather the shards."
                               if step == 0 else "The forward was right before: the gradients or their "
                                                 "reduce-scatter are wrong."))
        for r, res in enumerate(got):
            problem = close_tensors(res["out"], expected["out"], rtol=1e-4, atol=1e-5)
            if problem:
                return f"rank {r}: the trained model's output on a fixed input differs.\n  {problem}"
            problem = compare_tensor_lists(res["final"], expected["final"][r], f"rank {r}", names,
                                           f"'s shard after {spec['steps']} steps", rtol=1e-4, atol=1e-5)
            if problem:
                return problem
        for r, res in enumerate(got):
            if res["gathers"] == 0:
                return f"rank {r} never called an all-gather: gather each unit's shards before using it."
            if res["peak_gathered"] > expected["max_peak"] or res["peak_gathered"] >= expected["full_bytes"]:
                return (f"rank {r}: at one moment {res['peak_gathered']} bytes of gathered parameters were alive; "
                        f"every unit gathered at once is {expected['full_bytes']} bytes and one gathered unit at most "
                        f"{expected['unit_bytes']} (allowed: {expected['max_peak']}, three units, for prefetching "
                        f"and for buffers the backend has not let go of yet). Free each unit's gathered parameters "
                        f"after its forward (and after its backward), and do not let autograd save them: gather "
                        f"again in backward instead.")
        return None

    @staticmethod
    def _first_update(spec, n, kind: str) -> list[float]:
        """Each rank's step-1 loss after a first SGD step whose gradient shards were ``kind``: "sum" (N x the
        mean) or "own" (each rank's rows of its own local gradient: no reduce-scatter)."""
        model = probes.build_model(spec["arch"], spec["state"])
        params = list(model.parameters())
        if kind == "sum":
            full_batch_loss(model, spec, n).backward()
            grads = [None if p.grad is None else p.grad * n for p in params]
        else:
            locals_ = [local_grads(spec, r, n) for r in range(n)]
            grads = []
            for k in range(len(params)):
                if locals_[0][k] is None:
                    grads.append(None)
                    continue
                rows = [_chunk(locals_[q][k], q, n) for q in range(n)]
                grads.append(torch.cat(rows))
        with torch.no_grad():
            for p, g in zip(params, grads):
                if g is not None and p.requires_grad:
                    p -= spec["lr"] * g.view_as(p)
        return [nn.functional.mse_loss(model(_shard(spec["x"], r, n)), _shard(spec["y"], r, n)).item()
                for r in range(n)]

    def diagnose(self, case, got, expected):
        n, spec = case.args
        if _rank_results(got, n) or any(res.get("refused") or res.get("torch_fsdp") for res in got):
            return None
        losses = [res.get("losses") for res in got]
        if not all(isinstance(ls, list) and len(ls) == spec["steps"] for ls in losses):
            return None
        first_ok = all(math.isclose(g, e, rel_tol=1e-4, abs_tol=1e-6)
                       for g, e in zip([ls[0] for ls in losses], expected["losses"][0]))
        if not first_ok:
            shards_ok = all(all(tuple(_values(g).shape) == tuple(e.shape) and torch.equal(_values(g), e)
                                for g, e in zip(res["shards"], expected["shards"][r])) for r, res in enumerate(got))
            if shards_ok:
                return ("the shards are right but the very first forward is not: the gathered parameters are not the "
                        "originals. All-gather every rank's shard padded to ceil(d0 / N) rows, in rank order, and drop "
                        "the padding rows past d0.")
            return None
        if len(losses[0]) < 2 or all(math.isclose(ls[1], e, rel_tol=1e-4, abs_tol=1e-6)
                                     for ls, e in zip(losses, expected["losses"][1])):
            return None
        for kind, hint in (("sum", f"the gradient shards are {n} x too big: divide by the world size before (or "
                                   f"after) the reduce-scatter, which sums over ranks."),
                           ("own", "each rank's shard was updated with its rows of its OWN gradient: reduce-scatter "
                                   "the full gradient (divided by N), so every rank's batch counts in every shard.")):
            want = self._first_update(spec, n, kind)
            if all(math.isclose(ls[1], w, rel_tol=1e-4, abs_tol=1e-6) for ls, w in zip(losses, want)):
                return hint
        return None


# ================================================================================================
# distributed.train_resume torchrun trainer with checkpoints
# ================================================================================================
class TrainResumeExercise(_MultiRank):
    id, entry, points = "distributed.train_resume", "train", 2
    title = "a torchrun trainer that saves a checkpoint and resumes bit-identically"
    policy = None  # training with torch's DDP is allowed here: the exercise is the resumable loop
    probe = f"{PROBES}:train_resume"
    n_spawns = 9

    def _case(self, n, steps, save_every, stop_after, resume_step, batch_size=16, seed=0):
        cfg = {"steps": steps, "batch_size": batch_size, "lr": 0.01, "seed": seed, "save_every": save_every}
        return Case((n, cfg, stop_after, resume_step),
                    label=(f"{n} ranks, {steps} steps saving every {save_every}; a second run stops after step "
                           f"{stop_after}; a third resumes from its step-{resume_step} checkpoint"))

    def visible_cases(self):
        return [self._case(2, 6, 3, 4, 3)]

    boundary_classes = {
        "resume from the first checkpoint (step == save_every)": lambda c, e: c.args[3] == c.args[1]["save_every"],
        "a crash between two checkpoints": lambda c, e: c.args[2] % c.args[1]["save_every"] != 0,
        "an odd world size": lambda c, e: c.args[0] % 2 == 1,
        "one rank": lambda c, e: c.args[0] == 1,
        "a batch that is not a power of two": lambda c, e: c.args[1]["batch_size"] & (c.args[1]["batch_size"] - 1),
    }

    def hidden_cases(self):
        return [self._case(3, 5, 2, 3, 2, batch_size=12, seed=1), self._case(1, 3, 1, 2, 1, batch_size=8, seed=2)]

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
        if c.get("start") != k or not c.get("losses") or len(c["losses"]) != len(a["losses"][k:]):
            return None  # the failure says what is missing
        if not math.isclose(c["losses"][0], a["losses"][k], rel_tol=1e-6):
            # no optimizer step has run yet in run C: only what the forward reads can differ
            return ("the first resumed step already differs, before any optimizer step: what the forward reads was "
                    "not restored: the weights, or some rank's RNG state (dropout draws from it: gather every "
                    "rank's torch.get_rng_state() with dist.all_gather_object; rank r restores entry r).")
        if any(not math.isclose(lc, la, rel_tol=1e-6) for lc, la in zip(c["losses"], a["losses"][k:])):
            return ("the first resumed step matches and later ones drift: the weights and RNG were restored, the "
                    "update was not the same: restore the optimizer state (AdamW's moments and step count).")
        return None


EXERCISES = [ChunkBounds(), RingAllReduce(), NaiveDDPExercise(), AssignBuckets(), BucketedDDPExercise(),
             AccumulatingDDPExercise(), ShardBounds(), ShardedAdamWExercise(), FullyShardedExercise(),
             TrainResumeExercise()]
CHAPTER = Chapter("distributed", exercises=EXERCISES,
                  sandbox_files=("distributed/scaffold.py",),
                  policy_allow=("_parameters", "setattr", "Variable._execution_engine"))  # swapping an nn.Module's parameters (FSDP); DDP's end-of-backward callback
