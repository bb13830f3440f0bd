"""constraints-gpu.txt (the GPU machine's toolchain, built by `make compat`) is constraints.txt with only
the GPU machine's packages rewritten: the two files cannot drift apart anywhere else."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import compat_constraints as cc  # noqa: E402


def test_gpu_constraints_are_derived_from_constraints_txt():
    assert (ROOT / "constraints-gpu.txt").read_text() == cc.derive((ROOT / "constraints.txt").read_text()), \
        "constraints-gpu.txt is stale: run python3 scripts/compat_constraints.py (make compat does)"


def test_the_files_differ_only_in_the_gpu_machines_packages():
    cpu = cc.parse_pins((ROOT / "constraints.txt").read_text())
    gpu = cc.parse_pins((ROOT / "constraints-gpu.txt").read_text())
    assert cpu.keys() == gpu.keys()
    differ = {name for name in cpu if cpu[name] != gpu[name]}
    assert differ == {cc.canonical(n) for n in cc.GPU_MACHINE}
    assert {name: gpu[cc.canonical(name)] for name in cc.GPU_MACHINE} == cc.GPU_MACHINE
    assert gpu["torch"] == "2.11.0" and gpu["triton"] == "3.6.0"


def test_numpy_suits_triton_36_interpreter():
    # TOOLCHAIN.md: with triton 3.6 the interpreter needs numpy < 2.4 (loops with runtime bounds break on 2.4)
    major, minor = (int(x) for x in cc.parse_pins((ROOT / "constraints-gpu.txt").read_text())["numpy"].split(".")[:2])
    assert (major, minor) < (2, 4)


def test_check_mode_notices_drift(tmp_path, monkeypatch):
    source, target = tmp_path / "constraints.txt", tmp_path / "constraints-gpu.txt"
    source.write_text("# comment\nJinja2==3.1.6\ntorch==2.13.0\ntriton==3.7.1\nnumpy==2.3.5\n")
    monkeypatch.setattr(cc, "SOURCE", source)
    monkeypatch.setattr(cc, "TARGET", target)
    assert cc.main(["--check"]) == 1  # missing
    assert cc.main([]) == 0
    assert "Jinja2==3.1.6\ntorch==2.11.0\ntriton==3.6.0\nnumpy==2.3.5\n" in target.read_text()
    assert cc.main(["--check"]) == 0
    source.write_text(source.read_text().replace("numpy==2.3.5", "numpy==2.3.4"))  # a pin moved in one file only
    assert cc.main(["--check"]) == 1


def test_bad_constraints_are_named():
    with pytest.raises(ValueError, match="pins no torch"):
        cc.derive("numpy==2.3.5\n")
    with pytest.raises(ValueError, match="not name==version"):
        cc.derive("torch>=2.11\n")
