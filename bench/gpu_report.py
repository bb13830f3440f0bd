"""Assemble the GPU check's results: one JSON + one Markdown file, and the short table printed last.

Called by autograder/gpu_check.sh with the folder its steps wrote into:

    <work>/<step>.step.json     {"name", "rc", "seconds", "timed_out"} for each step
    <work>/<step>.log           each step's output
    <work>/tests.xml            pytest's JUnit report of the GPU-marked tests
    <work>/reports/<student>/<assignment>.json   the trusted grader's report of each solution notebook
    <work>/bench/*.json         bench/run.py's results
    <work>/allocator/*.json     the allocator fidelity recordings and fidelity_summary.json
    <work>/allocator-expandable/  the same, recorded with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import validate as validate_bench  # noqa: E402

SCHEMA_VERSION = 1
STEPS = ("doctor", "tests", "autograde", "bench", "bench_compile", "allocator", "allocator-expandable")


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(work: Path) -> dict:
    steps = {}
    for name in STEPS:
        info = _json(work / f"{name}.step.json") or {"name": name, "rc": None, "seconds": 0, "timed_out": False}
        log = work / f"{name}.log"
        info["tail"] = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        info["status"] = "ok" if info.get("rc") == 0 else ("timeout" if info.get("timed_out") else "failed")
        steps[name] = info
    tests = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if (work / "tests.xml").exists():
        root = ET.parse(work / "tests.xml").getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        for s in suites:
            n, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
            tests["failed"] += f
            tests["errors"] += e
            tests["skipped"] += sk
            tests["passed"] += n - f - e - sk
    else:
        m = re.search(r"(\d+) tests? collected|(\d+)/\d+ tests collected", steps["tests"]["tail"])
        tests["collected"] = int(next(g for g in m.groups() if g)) if m else 0
    autograde = {}
    for report in sorted((work / "reports").glob("*/*.json")):
        if report.name.endswith(".pending.json"):
            continue
        r = _json(report)
        if r:
            autograde[r["assignment"]] = {"score": r["score"], "max_score": r["max_score"], "wall_s": r["wall_s"],
                                          "device": r["device"], "isolation": r["isolation"],
                                          "failed": [e["id"] for e in r["exercises"] if not e["passed"]]}
    bench = None
    for path in sorted((work / "bench").glob("*.json")):  # one file per bench step: their measurements together
        part = _json(path)
        if part is None:
            continue
        if bench is None:
            bench = part
        else:
            bench["measurements"] = bench.get("measurements", []) + part.get("measurements", [])
            bench["suites"] = {**bench.get("suites", {}), **part.get("suites", {})}
    # the recorder's fidelity summaries: default settings, then expandable_segments:True
    allocator = [_json(work / d / "fidelity_summary.json") for d in ("allocator", "allocator-expandable")
                 if (work / d / "fidelity_summary.json").exists()]
    return {"steps": steps, "tests": tests, "autograde": autograde, "bench": bench,
            "allocator": [a for a in allocator if a is not None]}


def validate(report: dict) -> list[str]:
    problems = []
    for key in ("schema", "date", "dry_run", "steps", "tests", "autograde", "bench"):
        if key not in report:
            problems.append(f"missing {key!r}")
    for name in STEPS:
        if name not in report.get("steps", {}):
            problems.append(f"step {name} missing")
    if report.get("bench") is not None:
        problems += [f"bench: {p}" for p in validate_bench(report["bench"])]
    for ch, a in report.get("autograde", {}).items():
        if not {"score", "max_score", "device"} <= set(a):
            problems.append(f"autograde {ch}: incomplete")
    return problems


def short_table(report: dict) -> str:
    lines = [f"GPU check {report['date']}  device: {report.get('device', '?')}  "
             f"{'(DRY RUN on CPU: validates the script, not the GPU)' if report['dry_run'] else ''}"]
    lines.append(f"{'step':10s} {'status':8s} {'seconds':>8s}")
    for name, s in report["steps"].items():
        lines.append(f"{name:10s} {s['status']:8s} {s['seconds']:8d}")
    t = report["tests"]
    lines.append("tests: " + ", ".join(f"{k} {v}" for k, v in t.items()))
    for ch, a in report["autograde"].items():
        mark = "every exercise passes" if not a["failed"] else f"FAILED {a['failed']}"
        lines.append(f"autograde {ch:18s} {a['score']:g}/{a['max_score']:g} on {a['device']} in {a['wall_s']:.1f}s  {mark}")
    bench = report.get("bench")
    if bench:
        for m in bench["measurements"]:
            target = (m.get("extra") or {}).get("target_vs_torch")
            vs = f"{m['vs_torch']:.2f}x torch" if m.get("vs_torch") else ""
            verdict = "" if not target or not m.get("vs_torch") else ("  meets target" if m["vs_torch"] >= target
                                                                      else f"  BELOW target {target}x")
            rate = f"{m['tflops']:.1f} TFLOP/s" if m.get("tflops") else (f"{m['gbps']:.0f} GB/s" if m.get("gbps") else "")
            lines.append(f"bench {m['suite']:9s} {m['name'][:26]:26s} {m['dtype'][:8]:8s} {m['ms']:8.3f} ms {rate:>14s} {vs}{verdict}")
    for a in report.get("allocator", []):
        conf = (a.get("alloc_conf") or "default settings") if isinstance(a, dict) else ""
        for r in a.get("recordings", []) if isinstance(a, dict) else []:
            lines.append(f"allocator fidelity {r.get('workload', '')} ({conf}): "
                         f"{r.get('exact_match_steps')}/{r.get('steps')} steps exact")
        for r in a.get("replays", []) if isinstance(a, dict) else []:
            lines.append(f"allocator replay {r.get('trace', '')} ({conf}): {r.get('exact_match_events')}/"
                         f"{r.get('compared')} events exact, OOM real {r.get('real_oom')} model {r.get('model_oom')}")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    return (f"# GPU check, {report['date']}\n\n"
            f"Device: {report.get('device', '?')}; versions: {json.dumps(report.get('versions', {}))}\n\n"
            "```\n" + short_table(report) + "\n```\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="the folder gpu_check.sh's steps wrote into")
    p.add_argument("--out", type=Path, required=True, help="where gpu-check-<date>.{json,md} go")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if not args.work.is_dir():
        p.error(f"--work {args.work}: not a folder")
    report = {"schema": SCHEMA_VERSION, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "dry_run": args.dry_run, **collect(args.work)}
    if report["bench"]:
        report["device"] = f"{report['bench']['device']['name']} ({report['bench']['device']['kind']})"
        report["versions"] = report["bench"]["versions"]
    problems = validate(report)
    report["problems"] = problems
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"gpu-check-{report['date'][:10]}{'-dryrun' if args.dry_run else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(short_table(report))
    if problems:
        print("report problems:\n  " + "\n  ".join(problems))
    failed_steps = [n for n, s in report["steps"].items() if s["status"] != "ok"]
    if failed_steps:
        print(f"steps not ok: {failed_steps} (logs: {args.work})")
    return 1 if problems or failed_steps else 0


if __name__ == "__main__":
    sys.exit(main())
