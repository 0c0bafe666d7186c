"""The prepared scripts of a GPU visit (benchmarks/gpu_*.sh), what the development machine can check
before a visit spends device time on them: they parse, and gpu_nccl.sh refuses an NCCL too old to let
two ranks share a GPU before it compiles anything."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_prepare.sh", "gpu_nccl.sh"])
def test_the_gpu_visit_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(BENCHMARKS / script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_gpu_nccl_refuses_an_nccl_older_than_2_30(tmp_path):
    source = tmp_path / "nccl"
    (source / "makefiles").mkdir(parents=True)
    (source / "makefiles" / "version.mk").write_text("NCCL_MAJOR   := 2\nNCCL_MINOR   := 28\nNCCL_PATCH   := 9\n")
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_nccl.sh"), str(source)], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "NCCL_BUILD_DIR": str(tmp_path / "build")})
    assert done.returncode == 1
    assert "NCCL 2.28.9 in" in done.stderr and "two ranks on one GPU take 2.30 or later" in done.stderr
    assert not (tmp_path / "build").exists()
