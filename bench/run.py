"""Run the course's benchmarks: every ``bench/bench_<suite>.py`` module's ``run(ctx)``.

    python bench/run.py                      # CPU: small sizes, clearly labelled CPU numbers
    python bench/run.py --device cuda        # GPU: real sizes
    python bench/run.py --only kernels amp   # some suites
    python bench/run.py --skip compile       # all suites but some
    python bench/run.py --check FILE.json    # validate a results file against the schema

Each run measures the device's ceilings once (copy bandwidth; a large bf16 matmul on GPU, fp32 on
CPU), then reports every measurement as achieved GB/s or TFLOP/s, as a fraction of those measured
peaks (and of the H200 datasheet on GPU), and as a ratio to torch's own op timed in the same run.
Results go to ``bench/results/<date>-<device>.json`` and ``.md`` (the GPU ones are committed).
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ptinternals.benchmark import Measurement, Peaks, measure_peaks  # noqa: E402

SCHEMA_VERSION = 1
REQUIRED_TOP = {"schema": int, "date": str, "device": dict, "versions": dict, "peaks": dict, "small": bool,
                "suites": dict, "measurements": list}
REQUIRED_MEASUREMENT = {"suite": str, "name": str, "device": str, "shape": str, "dtype": str, "ms": (int, float)}


@dataclass
class Context:
    device: str
    small: bool
    peaks: Peaks | None
    out_dir: Path


def discover() -> dict[str, Path]:
    return {p.stem.removeprefix("bench_"): p for p in sorted((ROOT / "bench").glob("bench_*.py"))}


def load_suite(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "run"):
        raise AttributeError(f"{path.name} has no run(ctx) function")
    return module


def device_info(device: str) -> dict:
    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "sms": props.multi_processor_count}
    return {"kind": "cpu", "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}


def versions() -> dict:
    import numpy
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
           "cuda": torch.version.cuda}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        out["triton"] = None
    return out


def validate(results: dict) -> list[str]:
    """Problems with a results dict (empty list when it matches the schema)."""
    problems = []
    for key, typ in REQUIRED_TOP.items():
        if key not in results:
            problems.append(f"missing key {key!r}")
        elif not isinstance(results[key], typ):
            problems.append(f"{key!r} should be {typ.__name__}, got {type(results[key]).__name__}")
    if results.get("schema") != SCHEMA_VERSION:
        problems.append(f"schema {results.get('schema')} != {SCHEMA_VERSION}")
    for i, m in enumerate(results.get("measurements", [])):
        for key, typ in REQUIRED_MEASUREMENT.items():
            if not isinstance(m.get(key), typ):
                problems.append(f"measurement {i} ({m.get('name')}): {key!r} missing or not {typ}")
        if not (m.get("bytes_moved") or m.get("flops") or m.get("extra")):
            problems.append(f"measurement {i} ({m.get('name')}): neither bytes_moved, flops nor extra: a number without meaning")
    for name, suite in results.get("suites", {}).items():
        if suite.get("status") not in ("ok", "error", "skipped"):
            problems.append(f"suite {name}: status {suite.get('status')!r}")
    return problems


def table(results: dict) -> str:
    lines = [f"{'suite':10s} {'name':34s} {'shape':22s} {'dtype':9s} {'ms':>9s} {'GB/s':>8s} {'TFLOP/s':>8s} {'vs torch':>8s}"]
    for m in results["measurements"]:
        def f(v, fmt):
            return format(v, fmt) if isinstance(v, (int, float)) else "-"

        lines.append(f"{m['suite'][:10]:10s} {m['name'][:34]:34s} {m['shape'][:22]:22s} {m['dtype'][:9]:9s} "
                     f"{f(m['ms'], '9.3f')} {f(m.get('gbps'), '8.1f')} {f(m.get('tflops'), '8.2f')} "
                     f"{(f(m.get('vs_torch'), '7.2f') + 'x') if m.get('vs_torch') else '       -'}")
    for name, suite in results["suites"].items():
        if suite["status"] != "ok":
            lines.append(f"{name}: {suite['status']} {suite.get('error', '')[:200]}")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    d, v = results["device"], results["versions"]
    peaks = results["peaks"]
    out = [f"# Benchmarks: {d['name']} ({d['kind']}), {results['date']}", "",
           f"torch {v['torch']}, triton {v['triton']}, CUDA {v['cuda']}, Python {v['python']}"
           + ("  \n**CPU run with small sizes: these numbers say nothing about GPU performance.**"
              if d["kind"] == "cpu" else ""), "",
           f"Measured ceilings: {peaks.get('bytes_per_s', 0) / 1e9:.0f} GB/s copy, "
           f"{peaks.get('flops', 0) / 1e12:.1f} TFLOP/s matmul ({peaks.get('how', '')}).", "",
           "| suite | name | shape | dtype | ms | GB/s | TFLOP/s | frac. peak | vs torch |", "|---|---|---|---|---|---|---|---|---|"]
    for m in results["measurements"]:
        frac = m.get("frac_peak_flops") or m.get("frac_peak_bw")
        cells = [m["suite"], m["name"], m["shape"], m["dtype"], f"{m['ms']:.3f}",
                 f"{m['gbps']:.1f}" if m.get("gbps") else "", f"{m['tflops']:.2f}" if m.get("tflops") else "",
                 f"{frac:.2f}" if frac else "", f"{m['vs_torch']:.2f}x" if m.get("vs_torch") else ""]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def run(device: str, small: bool, only: list[str] | None, out_dir: Path, skip: list[str] | None = None) -> dict:
    suites = discover()
    unknown = sorted((set(only or []) | set(skip or [])) - set(suites))
    if unknown:
        raise SystemExit(f"unknown suite(s) {unknown}; available: {sorted(suites)}")
    peaks = measure_peaks(device, small=small)
    ctx = Context(device=device, small=small, peaks=peaks, out_dir=out_dir)
    results = {"schema": SCHEMA_VERSION, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "device": device_info(device), "versions": versions(), "small": small,
               "peaks": {"bytes_per_s": peaks.bytes_per_s, "flops": peaks.flops, "how": peaks.how},
               "suites": {}, "measurements": []}
    for name, path in suites.items():
        if (only and name not in only) or name in (skip or ()):
            continue
        t0 = time.perf_counter()
        try:
            measurements: list[Measurement] = load_suite(path).run(ctx)
            results["measurements"] += [m.to_dict(peaks) for m in measurements]
            results["suites"][name] = {"status": "ok", "seconds": round(time.perf_counter() - t0, 2),
                                       "count": len(measurements)}
        except Exception as e:  # one broken suite must not lose the others' numbers
            results["suites"][name] = {"status": "error", "seconds": round(time.perf_counter() - t0, 2),
                                       "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        print(f"  {name}: {results['suites'][name]['status']} in {results['suites'][name]['seconds']} s", flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", help="small sizes (default on CPU)")
    size.add_argument("--full", action="store_true", help="real sizes (default on CUDA)")
    parser.add_argument("--only", nargs="+", metavar="SUITE", help=f"suites to run (from {sorted(discover())})")
    parser.add_argument("--skip", nargs="+", metavar="SUITE", help="suites not to run (e.g. one a separate step runs)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder for the JSON/Markdown results")
    parser.add_argument("--tag", default="", help="extra word in the file names")
    parser.add_argument("--check", type=Path, metavar="FILE", help="validate a results JSON file and exit")
    args = parser.parse_args(argv)
    if args.check:
        problems = validate(json.loads(args.check.read_text()))
        print("\n".join(problems) if problems else f"{args.check}: valid")
        return 1 if problems else 0
    from ptinternals.device import pick_device

    device = pick_device(None if args.device == "auto" else args.device)
    if device == "cpu":  # Triton kernels run in the interpreter: it must be on before triton is imported
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    small = args.small or (device == "cpu" and not args.full)
    results = run(device, small, args.only, args.out, args.skip)
    problems = validate(results)
    if problems:
        print("results do not match the schema:\n  " + "\n  ".join(problems), file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{results['date'][:10]}-{device}{'-' + args.tag if args.tag else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(results))
    print(table(results))
    print(f"results: {args.out / (stem + '.json')}")
    return 1 if problems or any(s["status"] == "error" for s in results["suites"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
