"""benchmarks/gpu_check.py, the CUDA check of issue 44, kept from rotting between GPU sessions: it
skips cleanly without CUDA, refuses an unknown check in one line, and its quick form runs every
check on the CPU (the rehearsal the GPU machine's few minutes depend on) with every row passing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from benchmarks.gpu_check import main

ROOT = Path(__file__).resolve().parents[1]
CHECKS = [
    "optimizers",
    "schedules",
    "envelopes",
    "resident data",
    "copy_slot",
    "checkpoint",
    "fp16",
    "fp16 first-step skips",
    "bf16",
    "dropout",
    "memory limit",
    "stability",
    "pbt",
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the check would run, not skip")
def test_without_cuda_the_check_skips_with_a_line_and_a_json(tmp_path):
    result = CliRunner().invoke(main, ["--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("gpu_check: skipped, CUDA is not available")
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert record["skipped"] is True and record["torch"] == torch.__version__


def test_an_unknown_check_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(main, ["--out", str(tmp_path), "--device", "cpu", "--only", "optimisers"])
    assert result.exit_code == 2
    assert "no check named ['optimisers']" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_the_quick_check_runs_every_check_on_the_cpu_and_passes(tmp_path):
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path), "--device", "cpu", "--quick"]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    failed = [row for row in record["rows"] if not row["passed"]]
    assert process.returncode == 0 and not failed, (process.stdout[-3000:], process.stderr[-3000:], failed)
    assert list(record["check_seconds"]) == CHECKS
    assert {row["check"] for row in record["rows"]} >= {"optimizers", "envelopes", "dropout", "main job"}
    compared = [row for row in record["rows"] if row["max_diff"] is not None]
    assert compared and all(row["max_diff"] <= row["tolerance"] for row in compared)
