"""The CUDA check (issue 44): the engine's equivalence suite, mixed precision, per-slot dropout,
checkpoints, copy_slot, memory limits and the main jobs, on one device, in one command.

    python -m benchmarks.gpu_check --out DIR                   # CUDA; skips (exit 0) without it
    python -m benchmarks.gpu_check --out DIR --device cpu --quick   # the CPU rehearsal

Writes DIR/gpu_check.json: the device (GPU name, driver), torch and CUDA versions, and per check
each comparison's max difference against plain PyTorch on the same device with its tolerance and
pass/fail, and the seconds each check took. Exit 0 when every row passes (or CUDA is absent), 1
when one fails: the JSON says which. Sized for under 6 minutes on an H100/H200.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parents[1]


def _driver() -> str | None:
    try:
        process = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return process.stdout.strip() or None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _machine(device: torch.device) -> dict:
    import hfta_nas

    facts = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "hfta_nas": hfta_nas.__version__,
        "versions": {name: _version(name) for name in ("numpy", "scipy", "optuna", "pydantic", "pandas", "mnist1d")},
        "load_average": os.getloadavg(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        facts |= {
            "gpu": torch.cuda.get_device_name(device),
            "driver": _driver(),
            "cudnn": torch.backends.cudnn.version(),
            "gpu_memory_bytes": torch.cuda.get_device_properties(device).total_memory,
            # float32 is compared exactly: TF32 (cuDNN's default for convolutions) is off for the check
            "tf32_defaults": {
                "matmul": torch.backends.cuda.matmul.allow_tf32,
                "cudnn": torch.backends.cudnn.allow_tf32,
            },
        }
    return facts


def _checks(work: Path):
    """(name, function, extra arguments): the order they run in, cheapest first."""
    from benchmarks import _gpu_equivalence as equivalence
    from benchmarks import _gpu_jobs as jobs
    from benchmarks import _gpu_precision as precision

    return [
        ("optimizers", equivalence.optimizers, ()),
        ("schedules", equivalence.schedules, ()),
        ("envelopes", equivalence.envelopes, ()),
        ("resident data", equivalence.resident_data, ()),
        ("copy_slot", equivalence.copy_slot, ()),
        ("checkpoint", equivalence.checkpoint_resume, ()),
        ("fp16", precision.fp16_scaler, ()),
        ("fp16 first-step skips", precision.forced_first_step_skips, ()),
        ("bf16", precision.bf16, ()),
        ("dropout", precision.dropout, ()),
        ("memory limit", jobs.oom_split, ()),
        ("stability", jobs.stability_study, (work,)),
        ("pbt", jobs.pbt_space, (work,)),
    ]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder for the JSON.")
@click.option("--device", default="cuda", show_default=True, help="cuda, cuda:N, or cpu (the rehearsal).")
@click.option("--quick", is_flag=True, help="A few cases of each check and tiny jobs (the CPU test's size).")
@click.option("--only", multiple=True, help="Run only this check (repeatable), e.g. --only optimizers.")
def main(out: Path, device: str, quick: bool, only: tuple[str, ...]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        click.echo("gpu_check: skipped, CUDA is not available here (torch " + torch.__version__ + ")")
        _write(out, {"skipped": True, "reason": "CUDA not available", "torch": torch.__version__})
        return
    # The tests' helpers import their neighbours as top-level modules (pytest puts tests/ on the path).
    sys.path.insert(0, str(ROOT / "tests"))
    from benchmarks._gpu_compare import Recorder

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    facts = _machine(target)
    recorder = Recorder()
    started = time.perf_counter()
    # The jobs' reports and journals go to a temporary folder: the device returns only 8 files from
    # $OUT, two folders deep, and the JSON holds what the check reads from them.
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        checks = _checks(Path(work))
        unknown = set(only) - {name for name, _, _ in checks}
        if unknown:
            names = [name for name, _, _ in checks]
            raise click.UsageError(f"no check named {sorted(unknown)}; the checks are {names}")
        for name, function, extra in checks:
            if not only or name in only:
                click.echo(f"gpu_check: {name} ...", nl=False)
                recorder.run(name, function, target, quick, *extra)
                failed = sum(not row.passed for row in recorder.rows if row.check == name)
                click.echo(f" {recorder.seconds[name]:.1f} s, {'ok' if not failed else f'{failed} FAILED'}")
                _record(out, facts, recorder, quick, started, finished=False)  # what a timeout leaves
    failures = _record(out, facts, recorder, quick, started, finished=True)
    for row in failures:
        click.echo(f"FAILED {row['check']}: {row['name']}: {row['max_diff']} > {row['tolerance']} {row['detail']}")
    click.echo(
        f"gpu_check: {len(recorder.rows) - len(failures)}/{len(recorder.rows)} passed "
        f"in {time.perf_counter() - started:.0f} s; {out / 'gpu_check.json'}"
    )
    sys.exit(1 if failures else 0)


def _record(out: Path, facts: dict, recorder, quick: bool, started: float, finished: bool) -> list[dict]:
    """Write the JSON as it stands (after every check, so a run stopped by its time limit still tells
    what it found); returns the failed rows."""
    rows = recorder.as_json()
    failures = [row for row in rows if not row["passed"]]
    record = {
        "skipped": False,
        "finished": finished,
        "quick": quick,
        **facts,
        "seconds": round(time.perf_counter() - started, 1),
        "check_seconds": recorder.seconds,
        "passed": finished and not failures,
        "failures": len(failures),
        "rows": rows,
    }
    _write(out, record)
    return failures


def _write(out: Path, record: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
