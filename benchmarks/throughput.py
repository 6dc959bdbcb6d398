"""Training throughput of B models: serial, processes, vmap, array and the fused limit.

    python -m benchmarks.throughput                      # default: 5 workloads, B in 1,8,32,128 (< 10 min on 2 cores)
    python -m benchmarks.throughput --quick   # mlp and cnn1d, B in 1,8, few steps (< 1 min): checks the harness
    python -m benchmarks.throughput --workloads cnn1d --batches 1,2,4 --max-processes 4 --threads 1

For every workload (model family + dataset) and every B, each method trains
the same B models (slot b built after torch.manual_seed(b)) on the same batches
(slot b's order from EpochOrder with data seed b), batch size 100 per model,
Adam with lr 1e-3; see benchmarks/README.md. Each step gathers the batch from
the device-resident training tensors, runs forward, cross-entropy (the sum of
the slots' means for the fused methods), backward and the optimizer step.
Warm-up steps are not timed; the in-process methods of a cell are then
timed together, their repeats in turns, so that a shared machine's drifting
speed affects them alike; throughput is the median over repeats of
samples / seconds summed over all models.

Before timing is trusted, slot 0's loss on its first step in `serial`,
`processes`, `vmap` and `array` is compared with that of a plain model (float32,
rtol 1e-4); a mismatch flags the cell (`!` in the table, "flag" in the JSON).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import platform
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from benchmarks._cli import comma_list, write_result
from benchmarks._memory import PeakMemory, cpu_memory_supported
from benchmarks._methods import RUNNERS, Measured, Timing, Warmed, measure_together, warm_up
from benchmarks._processes import run_processes
from benchmarks._report import METHODS, RATIOS, print_report, ratios
from benchmarks._workloads import BATCH_SIZE, CPU_WORKLOADS, WORKLOADS, prepare
from hfta_nas import keep_freed_memory

DEFAULT_BATCHES = (1, 8, 32, 128)
QUICK_WORKLOADS = ("mlp", "cnn1d")
QUICK_BATCHES = (1, 8)
DEFAULT_TIMING = Timing(warmup=2, repeats=3, min_time_s=0.3, max_steps=200, max_cell_s=45.0)
QUICK_TIMING = Timing(warmup=1, repeats=2, min_time_s=0.02, max_steps=3, max_cell_s=10.0)
SERIAL_MODELS = 4  # serial trains min(B, this) models back to back; its rate does not depend on B
QUICK_SERIAL_MODELS = 2
QUICK_MAX_PROCESSES = 2
EQUIVALENCE_RTOL = 1e-4
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device, threads: int) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": threads,
        "interop_threads": torch.get_num_interop_threads(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({_cpu_model()})",
        "cuda": torch.version.cuda,
        "load_average_at_start": _load_average(),
    }


def _load_average() -> list[float] | None:
    """Other processes on a shared machine slow every method; the JSON says how busy it was."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _unsupported(reason: str) -> dict[str, Any]:
    return {"samples_per_s": None, "unsupported": reason}


def _unsupported_reason(method: str, error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    if method == "vmap" and ("Batching rule not implemented" in text or "vmap" in text.lower()):
        return f"torch.func.vmap cannot batch this model ({text})"
    return f"failed: {text}"


def _reference_loss(prep, table: torch.Tensor, device: torch.device) -> float:
    """Slot 0's first-step loss from a plain model: what every method's slot 0 must reproduce."""
    model = prep.build(0, device).train()
    index = table[0, 0]
    with torch.no_grad():
        return float(F.cross_entropy(model(prep.x_train[index]), prep.y_train[index]))


def prime(prep, device: torch.device) -> None:
    """One throw-away training step of a plain model and of a 2-slot array.

    torch initialises kernels, autograd threads and functorch lazily, on first
    use; doing that here keeps those one-time costs out of the first measured
    method's memory and time.
    """
    import hfta_nas  # noqa: PLC0415 (only needed here)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, y = prep.x_train[:BATCH_SIZE], prep.y_train[:BATCH_SIZE]
        model = prep.build(0, device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        array = hfta_nas.ModelArray.from_factory(prep.factory(), seeds=[0, 1], device=device).train()
        array_optimizer = hfta_nas.optim.Adam(array, lr=1e-3)
        logits = array(torch.stack([x, x]))
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.cat([y, y])).backward()
        array_optimizer.step()


def _measured_cell(measured: Measured, memory: PeakMemory) -> dict[str, Any]:
    return {
        "samples_per_s": measured.samples_per_s,
        "unsupported": None,
        "repeat_seconds": measured.repeat_seconds,
        "repeats": len(measured.repeat_seconds),
        "steps_per_repeat": measured.steps_per_repeat,
        "samples_per_repeat": measured.samples_per_repeat,
        "models_timed": measured.models,
        "first_loss": measured.first_loss,
        "peak_memory_mb": memory.mb,
        "memory_note": memory.note or None,
        "warnings": measured.warnings,
    }


def _failed_cell(method: str, error: BaseException, say: Callable[[str], None]) -> dict[str, Any]:
    """A method that cannot run a model is a result, not a crash."""
    if method != "vmap":  # vmap refusing a model is expected; anything else is worth a trace
        say(traceback.format_exc(limit=3).rstrip())
    return _unsupported(_unsupported_reason(method, error))


def _run_in_process_cells(
    methods, prep, table, batch, device, timing, serial_models, measure_memory, say
) -> dict[str, Any]:
    """Build and warm up every in-process method (peak memory measured around that), then time
    them together, their repeats in turns (`measure_together`)."""
    cells: dict[str, Any] = {}
    warmed: dict[str, Warmed] = {}
    memories: dict[str, PeakMemory] = {}
    for method in methods:
        try:
            with PeakMemory(device, measure_memory) as memories[method]:
                count = min(batch, serial_models) if method == "serial" else batch
                warmed[method] = warm_up(RUNNERS[method](prep, table, count, device), timing, device)
        except Exception as error:
            warmed.pop(method, None)
            cells[method] = _failed_cell(method, error, say)
    try:
        measured = measure_together(warmed, timing, device)
    except Exception as error:
        measured = {}
        cells.update({method: _failed_cell(method, error, say) for method in warmed})
    for method, result in measured.items():
        cells[method] = _measured_cell(result, memories[method])
    return cells


def _check_equivalence(method: str, cell: dict[str, Any], reference: float) -> str | None:
    loss = cell.get("first_loss")
    if method == "limit" or loss is None:
        return None
    rel = abs(loss - reference) / max(abs(reference), 1e-12)
    # bf16 / fp16 keep 8 / 11 bits: the methods' different summation orders show at 1e-3..1e-2
    tolerance = EQUIVALENCE_RTOL if os.environ.get("HFTA_NAS_BENCH_PRECISION", "float32") == "float32" else 2e-2
    ok = rel <= tolerance
    cell["equivalence"] = {"reference_loss": reference, "slot0_first_loss": loss, "rel_diff": rel, "ok": ok}
    if ok:
        return None
    return (
        f"slot 0's first-step loss {loss:.7g} differs from the plain model's {reference:.7g} "
        f"(rel {rel:.1e} > {tolerance:g})"
    )


def run_benchmark(
    workloads: Sequence[str] | None = None,
    batches: Sequence[int] | None = None,
    methods: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    threads: int = 1,
    quick: bool = False,
    *,
    max_processes: int | None = None,
    serial_models: int | None = None,
    timing: Timing | None = None,
    measure_memory: bool = True,
    keep_freed: bool = False,
    progress: Callable[[str], None] | None = _log,
) -> dict[str, Any]:
    """Run every (workload, B, method) cell and return the result (the JSON document).

    `None` arguments take the defaults of the mode (`quick` or full). Every cell
    of the result holds either a positive `samples_per_s` or `unsupported`
    with the reason (a method that cannot run a model, a skipped cell, a failure).
    """
    workloads = list(workloads or (QUICK_WORKLOADS if quick else CPU_WORKLOADS))
    batches = [int(b) for b in (batches or (QUICK_BATCHES if quick else DEFAULT_BATCHES))]
    unknown = [w for w in workloads if w not in WORKLOADS] + [m for m in (methods or []) if m not in METHODS]
    methods = [m for m in METHODS if m in (methods or METHODS)]
    if unknown or not methods:
        raise ValueError(f"unknown workload/method {unknown}; workloads: {list(WORKLOADS)}, methods: {list(METHODS)}")
    if any(b < 1 for b in batches):
        raise ValueError(f"batches must be positive integers, got {batches}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch.cuda.is_available() is False")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    timing = timing or (QUICK_TIMING if quick else DEFAULT_TIMING)
    serial_models = serial_models or (QUICK_SERIAL_MODELS if quick else SERIAL_MODELS)
    if max_processes is None:
        max_processes = QUICK_MAX_PROCESSES if quick else 2 * usable_cpus()
    say = progress or (lambda message: None)
    memory_method = "memory not measured"
    if measure_memory:
        if device.type == "cuda":
            memory_method = PeakMemory.METHOD_CUDA
        else:
            supported, why = cpu_memory_supported()
            memory_method = PeakMemory.METHOD_CPU if supported else why
            measure_memory = supported

    allocator = "default"
    if keep_freed and device.type == "cpu":
        allocator = keep_freed_memory()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "schema": 1,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "settings": {
            "workloads": workloads,
            "batches": batches,
            "methods": methods,
            "device": str(device),
            "threads": threads,
            "quick": quick,
            "batch_size": BATCH_SIZE,
            "optimizer": "Adam(lr=1e-3)",
            **timing.settings(),
            "serial_models": serial_models,
            "max_processes": max_processes,
            "process_threads": 1,
            "memory_method": memory_method,
            "keep_freed_memory": keep_freed,
            "cpu_allocator": allocator,
            "equivalence_rtol": EQUIVALENCE_RTOL,
        },
        "machine": machine_info(device, threads),
        "workloads": {},
        "results": {},
        "flags": [],
        "ratio_definitions": {name: f"{a} / {b}: {what}" for name, (a, b, what) in RATIOS.items()},
    }
    total = len(workloads) * len(batches) * len(methods)
    done = 0
    try:
        for name in workloads:
            workload = WORKLOADS[name]
            prep = prepare(workload, device)
            prime(prep, device)
            result["workloads"][name] = {
                "family": workload.family,
                "dataset": workload.dataset,
                "config": dict(workload.config),
                "model": workload.note,
                "input_shape": list(prep.input_shape),
                "num_classes": prep.num_classes,
                "parameters_per_model": prep.parameters_per_model,
                "train_samples": len(prep.y_train),
            }
            result["results"][name] = {}
            for batch in batches:
                table = prep.index_table(batch, device)
                reference = _reference_loss(prep, table, device)
                cell_started = time.perf_counter()
                in_process = [m for m in methods if m != "processes"]
                cells = (
                    _run_in_process_cells(
                        in_process, prep, table, batch, device, timing, serial_models, measure_memory, say
                    )
                    if in_process
                    else {}
                )
                if "processes" in methods:
                    if batch > max_processes:
                        cells["processes"] = _unsupported(
                            f"skipped: B={batch} > --max-processes {max_processes} (B processes would only "
                            f"time-slice {usable_cpus()} CPU(s))"
                        )
                    else:
                        try:
                            cells["processes"] = run_processes(
                                prep, table, batch, device, timing, measure_memory, keep_freed
                            )
                            cells["processes"].update(models_timed=batch, unsupported=None)
                        except Exception as error:
                            cells["processes"] = _failed_cell("processes", error, say)
                gc.collect()
                cells = {method: cells[method] for method in methods}
                for method, cell in cells.items():
                    done += 1
                    flag = _check_equivalence(method, cell, reference) if cell.get("samples_per_s") else None
                    cell["flag"] = flag
                    if flag:
                        result["flags"].append(f"{name} B={batch} {method}: {flag}")
                    shown = f"{cell['samples_per_s']:,.0f} samples/s" if cell["samples_per_s"] else cell["unsupported"]
                    say(f"[{done}/{total}] {name} B={batch} {method}: {shown}")
                say(f"    ({time.perf_counter() - cell_started:.1f} s for {name} B={batch})")
                result["results"][name][str(batch)] = {"methods": cells, "ratios": ratios(cells)}
    finally:
        torch.set_num_threads(previous_threads)
    result["duration_s"] = time.perf_counter() - started
    result["machine"]["load_average_at_end"] = _load_average()
    return result


def default_out() -> Path:
    return RESULTS_DIR / f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,8,32, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,8,32, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput",
        description="Training throughput (samples/s summed over all models) and peak memory of B models trained "
        "serially, as B processes, with torch.func vmap, as one hfta_nas.ModelArray, and the fused limit.",
    )
    parser.add_argument(
        "--workloads",
        type=comma_list(str, list(WORKLOADS)),
        default=None,
        help=f"comma-separated workloads from {','.join(WORKLOADS)} "
        f"(default: {','.join(CPU_WORKLOADS)}; --quick: mlp,cnn1d)",
    )
    parser.add_argument(
        "--batches",
        type=_int_list,
        default=None,
        help="comma-separated array sizes B (default: 1,8,32,128; --quick: 1,8)",
    )
    parser.add_argument(
        "--methods",
        type=comma_list(str, list(METHODS)),
        default=None,
        help=f"comma-separated methods from {','.join(METHODS)} (default: all)",
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where data, models and training live (default: cpu)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads of the benchmarking process (default: 1; each 'processes' trainer always uses 1)",
    )
    parser.add_argument(
        "--max-processes",
        type=int,
        default=None,
        help="largest B the 'processes' method runs (default: 2 x usable CPUs; --quick: 2)",
    )
    parser.add_argument(
        "--serial-models",
        type=int,
        default=None,
        help=f"models 'serial' actually trains back to back, min(B, this) "
        f"(default {SERIAL_MODELS}; --quick: {QUICK_SERIAL_MODELS})",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help=f"untimed warm-up steps per method (default {DEFAULT_TIMING.warmup}; --quick: {QUICK_TIMING.warmup})",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"timed repeats, the median is reported "
        f"(default {DEFAULT_TIMING.repeats}; --quick: {QUICK_TIMING.repeats})",
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="seconds a repeat should last at least; sets steps per repeat "
        f"(default {DEFAULT_TIMING.min_time_s}; --quick: {QUICK_TIMING.min_time_s})",
    )
    parser.add_argument(
        "--cell-budget",
        type=float,
        default=None,
        help=f"soft seconds per cell: slower cells warm up less and run 2 repeats "
        f"(default {DEFAULT_TIMING.max_cell_s:g}; --quick: {QUICK_TIMING.max_cell_s:g})",
    )
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="CPU: make glibc keep freed memory (mallopt) instead of unmapping it, so large "
        "activations are not page-faulted in again every step; process-wide",
    )
    parser.add_argument("--quick", action="store_true", help="a < 1 minute run that checks the harness, not timings")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory measurement")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON output path (default: benchmarks/results/<timestamp>.json)"
    )
    parser.add_argument("--quiet", action="store_true", help="no per-cell progress lines on stderr")
    parser.add_argument(
        "--precision",
        choices=("float32", "bf16", "fp16"),
        default="float32",
        help="every method's forward and loss under this autocast (float32 weights; default: float32)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (argparse, no click): run, print the table, write the JSON. Returns 0."""
    args = build_parser().parse_args(argv)
    base = QUICK_TIMING if args.quick else DEFAULT_TIMING
    timing = Timing(
        warmup=base.warmup if args.warmup is None else args.warmup,
        repeats=base.repeats if args.repeats is None else args.repeats,
        min_time_s=base.min_time_s if args.min_time is None else args.min_time,
        max_steps=base.max_steps,
        max_cell_s=base.max_cell_s if args.cell_budget is None else args.cell_budget,
    )
    if timing.warmup < 1 or timing.repeats < 1 or timing.min_time_s < 0 or timing.max_cell_s <= 0:
        build_parser().error("--warmup and --repeats must be >= 1, --min-time >= 0 and --cell-budget > 0")
    os.environ["HFTA_NAS_BENCH_PRECISION"] = args.precision  # read by every method, and the processes' workers
    try:
        result = run_benchmark(
            args.workloads,
            args.batches,
            args.methods,
            args.device,
            args.threads,
            args.quick,
            max_processes=args.max_processes,
            serial_models=args.serial_models,
            timing=timing,
            measure_memory=not args.no_memory,
            keep_freed=args.keep_freed_memory,
            progress=None if args.quiet else _log,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result["precision"] = args.precision
    out = args.out or default_out()
    write_result(result, out, "benchmarks.throughput", argv)
    print_report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
