"""Where one method's training step spends its time: phases, torch ops, Python.

    python -m benchmarks._profile --workload cnn1d --batch 32 --method array --threads 1
    python -m benchmarks._profile --workload gru --batch 8 --method array --cprofile

Runs the same Runner the throughput harness times, warmed up, and prints
1. wall time per phase of a step (gather, forward, loss, backward, optimizer),
2. torch.profiler's top operators by self CPU time (what the kernels cost),
3. with --cprofile, cProfile's top functions by own time (Python overhead).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import resource
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks._methods import RUNNERS, synchronizer
from benchmarks._workloads import WORKLOADS, prepare
from hfta_nas import keep_freed_memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="cnn1d")
    parser.add_argument("--batch", type=int, default=32, help="B, the number of models")
    parser.add_argument("--method", choices=list(RUNNERS), default="array")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (after 3 warm-up steps)")
    parser.add_argument("--top", type=int, default=25, help="rows of each listing")
    parser.add_argument(
        "--keep-freed-memory", action="store_true", help="glibc keeps freed memory (see throughput --help)"
    )
    parser.add_argument("--cprofile", action="store_true", help="also run cProfile over the same steps")
    args = parser.parse_args(argv)

    if args.keep_freed_memory:
        print(keep_freed_memory())
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = synchronizer(device)
    prep = prepare(WORKLOADS[args.workload], device)
    table = prep.index_table(args.batch, device)
    runner = RUNNERS[args.method](prep, table, args.batch, device)
    runner.run(range(0, 3))
    sync()
    position = 3

    totals: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def timed(name: str):
        sync()
        started = time.perf_counter()
        yield
        sync()
        totals[name] += time.perf_counter() - started

    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    runner.run(range(position, position + args.steps), timed)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    position += args.steps
    steps = args.steps * (runner.models if args.method == "serial" else 1)
    print(
        f"{args.method} {args.workload} B={args.batch}, {args.threads} thread(s), {args.steps} steps: "
        f"{wall / args.steps * 1e3:.1f} ms per step, {runner.samples_per_unit * args.steps / wall:,.0f} samples/s"
    )
    for name, seconds in totals.items():
        print(f"  {name:<10} {seconds / steps * 1e3:8.2f} ms/step  {seconds / wall:6.1%}")
    # sys time and minor faults show memory being page-faulted in (fresh mmaps of big activations).
    print(
        f"  process: user {(usage.ru_utime - usage_before.ru_utime) / args.steps * 1e3:.1f} ms/step, "
        f"sys {(usage.ru_stime - usage_before.ru_stime) / args.steps * 1e3:.1f} ms/step, "
        f"{(usage.ru_minflt - usage_before.ru_minflt) / args.steps:,.0f} minor page faults/step"
    )

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        runner.run(range(position, position + args.steps), record_function)
        sync()
    position += args.steps
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.top, max_name_column_width=48))
    print(
        prof.key_averages(group_by_input_shape=True).table(
            sort_by=sort, row_limit=args.top, max_name_column_width=40, max_shapes_column_width=70
        )
    )

    if args.cprofile:
        profiler = cProfile.Profile()
        profiler.enable()
        runner.run(range(position, position + args.steps))
        sync()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
