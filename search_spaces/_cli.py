"""The `hfta-nas search` command: options, `--workers` (K local worker processes on one study), and
the call to `run_search` (or `plan_search` for --dry-run).

Loaded by cli.py the first time the command runs or shows its --help, so that the rest of the
`hfta-nas` command starts without it; the engine, Optuna and rich are imported when the command
runs. User errors end as one line with exit status 2 through the `hfta-nas` group, which wraps every
command.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from ._search_output import SearchProgress, print_pbt_summary, print_search_plan, print_search_summary


def _search_workers(command: Callable[..., Any]) -> Callable[..., Any]:
    """`search --workers K` (K > 1): run K copies of this command without --workers,
    on one study, and print what they left in it (hfta_nas.search._workers)."""

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        ctx = click.get_current_context()
        workers = ctx.meta.get("hfta_nas.workers", 1)
        kwargs["n_trials"] = _n_trials(kwargs.pop("n_more"), kwargs)  # once, before any worker starts
        if workers <= 1 or kwargs.get("dry_run"):
            return command(**kwargs)
        from hfta_nas.runtime import checked_out_dir as _checked_out_dir
        from hfta_nas.search import StorageUnreachable, open_storage, run_workers, study_report

        from ._search import storage_patience_of, study_name_of
        from ._space import load_space

        if kwargs.get("storage_patience") is not None:  # refused once, here, not by K workers
            from hfta_nas.search import check_patience

            check_patience(kwargs["storage_patience"])
        if kwargs.get("log_to"):  # a bad --log fails once, here; a new MLflow database gets its tables once
            from hfta_nas.tracking import trackers_from

            trackers_from(kwargs["log_to"])
        loaded = load_space(kwargs["space"], kwargs["overrides"])  # a bad space fails once, here, not K times
        if loaded.pbt is not None:
            raise click.UsageError(
                f"--workers {workers}: {loaded.source} has a pbt block, whose population trains as one array in one "
                "process; run it without --workers"
            )
        _print_sweep_notes(loaded)
        if kwargs.get("out_dir") is not None:
            _checked_out_dir(kwargs["out_dir"], "--out")
        study_name = study_name_of(loaded, kwargs.get("study_name"))
        # an unreachable storage fails once, here (waited for when a patience is given); a fresh database gets
        # its tables once
        patience, explicit = storage_patience_of(loaded, kwargs.get("storage_patience"))
        open_storage(kwargs.get("storage"), patience, wait_at_start=explicit)
        arguments = worker_arguments(ctx, drop=("workers", "n_more", "n_trials"))
        if kwargs["n_trials"] is not None:  # --n-more resolved here: every worker gets the same total
            arguments += ["--n-trials", str(kwargs["n_trials"])]
        from hfta_nas.search import counted_trials, visible_gpus

        device = kwargs.get("device") or "cpu"
        budget = kwargs["n_trials"] if kwargs["n_trials"] is not None else loaded.budget.n_trials
        left = None if budget is None else budget - counted_trials(kwargs.get("storage"), study_name)
        gpus = len(visible_gpus()) if device.startswith("cuda") else 0
        workers, notes = workers_to_start(
            workers, left, kwargs.get("threads"), os.cpu_count() or 1, gpus, available_memory()
        )
        for note in notes:
            click.echo(note, err=True)
        exits = run_workers(worker_commands(arguments, workers, device=device))
        try:
            report = study_report(kwargs.get("storage"), study_name, exits)
        except KeyError:  # no worker got as far as creating the study
            report = {"study": study_name, "workers": [{"worker": e.worker, "pid": e.pid, "how": e.how} for e in exits]}
        except StorageUnreachable:
            failed = [e.returncode for e in exits if e.returncode != 0]
            if not failed:
                raise
            # the workers stopped on the outage, each with its line (the last word); reading the study
            # for a report would only add a wrong-URL message
            sys.exit(max(failed) if max(failed) > 0 else 1)
        if kwargs.get("as_json"):
            click.echo(json.dumps(report, indent=2, default=str))
        else:
            trials = ", ".join(f"{n} {s.lower()}" for s, n in sorted(report.get("trials", {}).items()))
            click.echo(
                f"study {study_name}: {trials or 'no trials'}; {report.get('counted', 0)} count against the budget "
                f"({report.get('interrupted_and_retried', 0)} interrupted and retried, "
                f"{report.get('surplus', 0)} surplus)"
            )
            for best in report.get("best") or []:
                click.echo(f"best: trial {best['number']} {best['values']}")
            for worker in report["workers"]:
                click.echo(f"worker {worker['worker']} (pid {worker['pid']}): {worker['how']}")
        if any(e.returncode != 0 for e in exits):
            sys.exit(1)

    return wrapper


WORKER_MEMORY_BYTES = 512 * 2**20  # what one search worker holds at the least (measured: 500 MB on the MLP space)


def workers_to_start(
    asked: int,
    trials_left: int | None,
    threads: int | None,
    cores: int,
    gpus: int,
    memory_bytes: int | None = None,
) -> tuple[int, list[str]]:
    """How many of the `asked` workers to start, and a line for each thing the user should know:
    never more workers than trials left in the budget (None: a timeout-only budget), nor than
    the available memory (`memory_bytes`; None: unknown) holds at WORKER_MEMORY_BYTES each; more
    workers than GPUs, or workers x threads beyond the cores, are started but said."""
    notes = []
    count = asked
    if trials_left is not None and asked > max(trials_left, 1):
        count = max(trials_left, 1)
        notes.append(f"--workers {asked}: {max(trials_left, 0)} trial(s) left in the budget, so {count} started")
    fit = max(1, memory_bytes // WORKER_MEMORY_BYTES) if memory_bytes is not None else None
    if fit is not None and count > fit:
        notes.append(
            f"--workers {count}: the {memory_bytes / 2**30:.1f} GiB of memory available holds {fit} worker(s) "
            f"of {WORKER_MEMORY_BYTES // 2**20} MiB each, so {fit} started"
        )
        count = fit
    if gpus > 0 and count > gpus:
        notes.append(f"--workers {count} on {gpus} GPU(s): workers share GPUs (worker i uses GPU i mod {gpus})")
    per_worker = threads if threads is not None else max(1, cores // count)  # as worker_commands shares them
    if gpus == 0 and count * per_worker > cores:
        notes.append(
            f"--workers {count} x {per_worker} thread(s) = {count * per_worker} threads on {cores} core(s): "
            "they compete for the cores; fewer workers or threads are faster"
        )
    return count, notes


def available_memory() -> int | None:
    """Bytes of memory this machine can give new processes (Linux's MemAvailable); None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def worker_arguments(ctx: Any, drop: Sequence[str] = ("workers",)) -> list[str]:
    """The command line of a click command as invoked (`ctx`), less the options in
    `drop`: what each worker runs. Only values given on the command line or by the
    environment are repeated; defaults stay defaults."""
    from click.core import ParameterSource

    arguments: list[str] = []
    options: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if name in drop or ctx.get_parameter_source(name) in (None, ParameterSource.DEFAULT):
            continue
        value = ctx.params.get(name)
        if isinstance(param, click.Argument):
            arguments.extend(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
            continue
        opt = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        if getattr(param, "count", False):
            options.extend([opt] * int(value or 0))
        elif param.is_flag:
            if value:
                options.append(opt)
            elif param.secondary_opts:
                options.append(param.secondary_opts[0])
        elif param.multiple:
            for item in value or ():
                options.extend([opt, str(item)])
        elif value is not None:
            options.extend([opt, str(value)])
    return [*options, *arguments]


def _set_option(args: list[str], opt: str, value: str) -> list[str]:
    """`args` with `opt` set to `value` (replaced where present, else added)."""
    args = list(args)
    for i, arg in enumerate(args):
        if arg == opt and i + 1 < len(args):
            args[i + 1] = value
            return args
        if arg.startswith(opt + "="):
            args[i] = f"{opt}={value}"
            return args
    return [opt, value, *args]


def _has_option(args: list[str], opt: str) -> bool:
    return any(a == opt or a.startswith(opt + "=") for a in args)


def worker_commands(args: list[str], workers: int, *, device: str) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, environment) for each worker: `hfta-nas search ARGS` with per-worker settings: with
    several GPUs visible and a CUDA device asked for, worker i sees only GPU i mod count
    (`CUDA_VISIBLE_DEVICES`); on CPU the cores are shared out with `--threads` unless given."""
    from hfta_nas.search import visible_gpus

    script = shutil.which("hfta-nas", path=os.path.dirname(sys.executable)) or shutil.which("hfta-nas")
    base = [script] if script else [sys.executable, "-m", "hfta_nas.cli"]
    gpus = visible_gpus() if device.startswith("cuda") else []
    commands = []
    for worker in range(workers):
        env = dict(os.environ, HFTA_NAS_WORKER=str(worker), PYTHONUNBUFFERED="1")
        worker_args = list(args)
        if len(gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = gpus[worker % len(gpus)]
            worker_args = _set_option(worker_args, "--device", "cuda")
        elif not device.startswith("cuda") and not _has_option(worker_args, "--threads"):
            worker_args = _set_option(worker_args, "--threads", str(max(1, (os.cpu_count() or 1) // workers)))
        commands.append(([*base, "search", *worker_args], env))
    return commands


def _print_sweep_notes(space: Any) -> None:
    """How a W&B sweep file was read: one line per key, on stderr (nothing for our own files); what a
    pbt block leaves unused."""
    from ._pbt import pbt_notes

    if space.notes:
        click.echo(f"{space.source} is a W&B sweep file, read as:", err=True)
        for note in space.notes:
            click.echo(f"  {note}", err=True)
    for note in pbt_notes(space):
        click.echo(note, err=True)


def _n_trials(n_more: int | None, options: dict[str, Any]) -> int | None:
    """--n-trials as given, or with --n-more N: the trials the study already counts, plus N."""
    if n_more is None:
        return options["n_trials"]
    if options["n_trials"] is not None:
        raise click.UsageError("give --n-trials (the study's total) or --n-more (this many more), not both")
    from hfta_nas.search import counted_trials

    from ._search import study_name_of
    from ._space import load_space

    name = study_name_of(load_space(options["space"], options.get("overrides", ())), options.get("study_name"))
    return counted_trials(options.get("storage"), name) + n_more


@click.command("search")
@click.argument("space", type=click.Path(dir_okay=False))
@click.option(
    "--n-trials",
    type=int,
    default=None,
    help=(
        "Trials in the study when done [default: the space's budget.n_trials]; finished trials of an earlier run count."
    ),
)
@click.option(
    "--n-more",
    type=click.IntRange(min=1),
    default=None,
    help=(
        "Train this many trials more than the study already counts (what Optuna's optimize(n_trials=N) "
        "means); instead of --n-trials."
    ),
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Stop starting new arrays after this many seconds [default: the space's budget.timeout].",
)
@click.option(
    "--array-size",
    default=None,
    help=(
        "Slots per array: an integer, or 'auto' (per shape: as many as fit in memory, up to where throughput "
        "stops rising by 10% per doubling; measured) [default: the space's array.size]."
    ),
)
@click.option(
    "--storage",
    default=None,
    help=(
        "Optuna storage URL (sqlite:///f.db, postgresql://...) or a journal file path [default: runs/hfta-nas.journal]."
    ),
)
@click.option(
    "--storage-patience",
    type=float,
    default=None,
    metavar="SECONDS",
    help=(
        "How long a worker waits for an unreachable storage (a database restart, a network blip), retrying, "
        "before it stops; training waits at its next write and goes on when the storage is back "
        "[default: the space's study.storage_patience, 600]."
    ),
)
@click.option("--study-name", default=None, help="[default: the space's study.name, else the file name].")
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the best config and weights go [default: runs/<study>].",
)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float64"]))
@click.option(
    "--threads", default=None, type=click.IntRange(min=1), help="torch CPU threads [default: torch's choice]."
)
@click.option(
    "--sampler",
    default=None,
    metavar="NAME",
    help=(
        "Override the space's sampler: tpe, random, cmaes, gp, grid, nsga2 (its defaults; the file's kwargs "
        "go with the file's sampler)."
    ),
)
@click.option(
    "--pruner",
    default=None,
    metavar="NAME",
    help="Override the space's pruner: none, median, successive_halving, hyperband (its defaults).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Override the space's seed (sampler and every trial's init/data/dropout seeds).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help=(
        "Set a setting of SPACE (repeatable): a dotted key, a YAML value, validated with the file, e.g. --set "
        "training.epochs=2 --set array.size=4 --set params.training.optimizer.lr=1e-3."
    ),
)
@click.option(
    "--dry-run",
    is_flag=True,
    help=(
        "Print the packing plan (which trials go into which array, their padding and estimated time, by the "
        "policy the run uses) without training; nothing is written to the storage."
    ),
)
@click.option("--quiet", is_flag=True, help="No live progress display (the summary is still printed).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the summary (or the --dry-run plan) as JSON (for machines)."
)
@click.option(
    "--log",
    "log_to",
    multiple=True,
    metavar="BACKEND[:WHERE]",
    help=(
        "Log a run per trial, grouped by the study, to mlflow[:URI], tensorboard[:DIR] (default runs/tensorboard) or "
        "wandb[:PROJECT] (default hfta-nas; WANDB_MODE=offline logs without a network); repeatable. Each needs its "
        "extra: pip install 'hfta-nas[mlflow]'."
    ),
)
@click.option(
    "--adopt",
    is_flag=True,
    help=(
        "Search a stored study of this name that hfta-nas did not make (plain Optuna's): its RUNNING trials "
        "are failed as interrupted and this space's trials join it. Without it such a study is refused."
    ),
)
@click.option(
    "--new-space",
    is_flag=True,
    help=(
        "Search SPACE in a stored study that was searched with another space (another model, params, "
        "training, data, sampler, seed or metric): it becomes the study's space, and the earlier trials keep "
        "theirs. Without it such a study is refused, naming what differs."
    ),
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    expose_value=False,
    callback=lambda ctx, param, value: ctx.meta.__setitem__("hfta_nas.workers", value),
    help=(
        "Start this many local worker processes on the same storage and study (one per GPU when several are "
        "visible); see docs/search.md, 'Running many workers'."
    ),
)
@_search_workers
def search_command(
    space,
    n_trials,
    timeout,
    array_size,
    storage,
    storage_patience,
    study_name,
    out_dir,
    device,
    dtype,
    threads,
    sampler,
    pruner,
    seed,
    overrides,
    dry_run,
    quiet,
    as_json,
    log_to,
    adopt,
    new_space,
) -> None:
    """Search SPACE (a YAML file, see search_spaces/README.md) with Optuna: every proposed
    candidate trains as proposed, packed into arrays by measured cost. Re-running resumes the study.
    A space with a pbt: block trains one population in one array instead (population-based training)."""
    import dataclasses

    import optuna

    from hfta_nas.runtime import checked_device as _checked_device
    from hfta_nas.runtime import checked_out_dir as _checked_out_dir
    from hfta_nas.runtime import set_up_command_process
    from hfta_nas.search import stop_when_orphaned

    from ._search import plan_search, run_search
    from ._space import load_space

    stop_when_orphaned()  # a worker of --workers: stops as its parent would have stopped it, should the parent die
    set_up_command_process(threads)
    if storage_patience is not None:
        from hfta_nas.search import check_patience

        check_patience(storage_patience)
    if array_size is not None and array_size != "auto":
        try:
            array_size = int(array_size)
        except ValueError:
            raise click.BadParameter(
                f"expected an integer or 'auto', got {array_size!r}", param_hint="--array-size"
            ) from None
    _checked_device(device)
    if out_dir is not None:  # before any trial is asked, not when the best trial is exported
        _checked_out_dir(out_dir, "--out")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded = load_space(space, overrides).with_overrides(sampler=sampler, pruner=pruner, seed=seed)
    if "HFTA_NAS_WORKER" not in os.environ:  # a worker's parent said it once
        _print_sweep_notes(loaded)
    if dry_run and loaded.pbt is not None:
        raise click.UsageError(
            f"--dry-run plans a search's arrays; {loaded.source} has a pbt block: its {loaded.pbt.population} members "
            "train as one array (run it without --dry-run)"
        )
    # what the plan and the search are both given, written once: a dry run plans exactly what the run would do
    common = dict(
        storage=storage,
        study_name=study_name,
        n_trials=n_trials,
        timeout=timeout,
        array_size=array_size,
        device=device,
        dtype=dtype,
        new_space=new_space,
    )
    if dry_run:
        plan = plan_search(loaded, **common)
        if as_json:
            click.echo(
                json.dumps(
                    {
                        **dataclasses.asdict(plan),
                        "mean_occupancy": plan.mean_occupancy,
                        "estimated_s": plan.estimated_s,
                    },
                    indent=2,
                    default=str,
                )
            )
        else:
            print_search_plan(plan)
        return
    from hfta_nas.tracking import SearchTracking

    tracking = SearchTracking(*log_to) if log_to else contextlib.nullcontext()  # a bad --log fails before training
    with tracking, SearchProgress(enabled=not (as_json or quiet)) as progress:
        summary = run_search(
            loaded,
            **common,
            out_dir=out_dir,
            on_event=(lambda event: (progress.event(event), tracking(event))) if log_to else progress.event,
            adopt=adopt,
            storage_patience=storage_patience,
        )
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(summary), indent=2, default=str))
        return
    if loaded.pbt is not None:
        print_pbt_summary(summary)
        return
    print_search_summary(summary)
