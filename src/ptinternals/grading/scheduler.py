"""Where a grading run sits on a cluster: a Slurm array task, a Kubernetes Indexed Job pod, or one machine.

``--shard auto`` and ``ptgrade doctor`` read the scheduler's own environment variables, so the shard
arithmetic lives here once instead of in each job template:

* Slurm (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES") gives every array task ``SLURM_ARRAY_JOB_ID``,
  ``SLURM_ARRAY_TASK_ID``, ``_MIN``, ``_MAX``, ``_STEP`` and ``_COUNT``. ``--array=0-2`` and
  ``--array=1-3`` are both three shards; a list such as ``--array=0,2,5`` cannot be numbered and needs
  ``PTGRADE_SHARDS`` (then the task id *is* the shard index: ``PTGRADE_SHARDS=3 sbatch --array=1``
  regrades shard 1 of 3 alone).
* Kubernetes gives each pod of an Indexed Job ``JOB_COMPLETION_INDEX`` (batch/v1 Job,
  ``completionMode: Indexed``) but not the number of completions, so the template passes it as
  ``PTGRADE_SHARDS``.
* Anywhere else ``auto`` means no sharding: this machine grades every submission.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    scheduler: str  # "slurm", "kubernetes" or "none"
    task: str  # e.g. "array job 41, task 1 (tasks 0-2)"
    shard: str | None  # "i/N", or None: grade everything


def _int(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _shards_override(environ: Mapping[str, str], index: int, where: str) -> str:
    shards = _int(environ, "PTGRADE_SHARDS")
    if shards < 1 or not 0 <= index < shards:
        raise ValueError(f"PTGRADE_SHARDS={shards} does not fit {where} {index}: need 0 <= {index} < {shards}")
    return f"{index}/{shards}"


def placement(environ: Mapping[str, str] | None = None) -> Placement:
    """Which scheduler task this process is, and the shard ``i/N`` it grades."""
    env = os.environ if environ is None else environ
    if "SLURM_ARRAY_TASK_ID" in env:
        task_id = _int(env, "SLURM_ARRAY_TASK_ID")
        task = f"array job {env.get('SLURM_ARRAY_JOB_ID', '?')}, task {task_id}"
        if "PTGRADE_SHARDS" in env:
            return Placement("slurm", task + " (PTGRADE_SHARDS)", _shards_override(env, task_id, "SLURM_ARRAY_TASK_ID"))
        lo, hi, count = _int(env, "SLURM_ARRAY_TASK_MIN"), _int(env, "SLURM_ARRAY_TASK_MAX"), _int(env, "SLURM_ARRAY_TASK_COUNT")
        step = _int(env, "SLURM_ARRAY_TASK_STEP") if "SLURM_ARRAY_TASK_STEP" in env else 1
        # A range lo-hi:step has count == (hi - lo) / step + 1 tasks; anything else is a list with holes.
        if step < 1 or (hi - lo) % step or (hi - lo) // step + 1 != count:
            raise ValueError(f"the Slurm array of tasks {lo}..{hi} ({count} tasks, step {step}) is not a range, so its "
                             f"tasks cannot be numbered as shards: submit --array=0-{count - 1}, or set PTGRADE_SHARDS")
        return Placement("slurm", f"{task} (tasks {lo}-{hi}" + (f":{step}" if step > 1 else "") + ")",
                         f"{(task_id - lo) // step}/{count}")
    if "JOB_COMPLETION_INDEX" in env:
        index = _int(env, "JOB_COMPLETION_INDEX")
        task = f"Indexed Job pod {env.get('HOSTNAME', '?')}, completion index {index}"
        if "PTGRADE_SHARDS" not in env:
            raise ValueError("JOB_COMPLETION_INDEX is set but PTGRADE_SHARDS is not: set it to the Job's completions")
        return Placement("kubernetes", task, _shards_override(env, index, "JOB_COMPLETION_INDEX"))
    if "SLURM_JOB_ID" in env:
        return Placement("slurm", f"job {env['SLURM_JOB_ID']} (not an array: grades every submission)", None)
    return Placement("none", "no scheduler (this machine grades every submission)", None)


def resolve_shard(spec: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """``--shard`` as given: ``auto`` becomes this task's shard (or None), anything else passes through."""
    return placement(environ).shard if spec == "auto" else spec
