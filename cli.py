"""The `hfta-nas` command: a thin click shell over the Python API.

Every command parses options, calls one function of `hfta_nas` (or of the
search_spaces / stability packages) and prints the result. User errors
(`HftaNasError`) print one clear line and exit with status 2, never a
traceback. SIGTERM stops a command as Ctrl-C does (one line, exit 143 instead
of 130): a scheduler's time limit loses nothing.

Start-up imports only click and yaml: each command imports what it needs when
it runs, and the stability commands load on first use (`_LAZY_COMMANDS`), so
`hfta-nas --help` and `hfta-nas search` import neither torch (for the help) nor
the statistics and plots of `stability`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click
import yaml

EXIT_USER_ERROR = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (Slurm's time limit and scancel, docker stop, systemd, kill), raised where Ctrl-C
    raises KeyboardInterrupt, so every path that stops cleanly on Ctrl-C (the arrays in flight told,
    their trials queued again) stops the same way; `signum` tells the engine which signal it was
    (a --workers parent forwards it)."""

    signum = signal.SIGTERM


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` while a command runs (main thread only; a SIGTERM handler
    someone else installed, or an inherited SIG_IGN, is left alone)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _friendly_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn user errors into `error: ...` on stderr and exit status 2; Ctrl-C and SIGTERM into one
    line and 128 + the signal's number (130, 143)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with _sigterm_as_interrupt():
                return command(*args, **kwargs)
        except KeyboardInterrupt as stop:
            signum = getattr(stop, "signum", signal.SIGINT)
            click.echo("terminated by SIGTERM" if signum == signal.SIGTERM else "interrupted", err=True)
            sys.exit(128 + signum)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            where = f" writing '{error.filename}'" if error.filename else ""
            click.echo(
                f"error: no space left on the device{where}: free space and run the command again (what was "
                "stored stays; a record cut short is mended then, and the trials left running are retried)",
                err=True,
            )
            sys.exit(EXIT_USER_ERROR)
        except Exception as error:
            if not _is_user_error(error):
                raise
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_USER_ERROR)

    return wrapper


def _is_user_error(error: BaseException) -> bool:
    """Whether `error` is an HftaNasError, found without importing hfta_nas (and torch with it) for
    a command that never did: an HftaNasError exists only once hfta_nas.errors is imported."""
    errors = sys.modules.get("hfta_nas.errors")
    return errors is not None and isinstance(error, errors.HftaNasError)


def _numbers(text: str | None, name: str) -> float | list[float] | None:
    """'0.1' -> 0.1 (all slots); '0.1,0.2,0.3' -> one value per slot."""
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(
            f"expected a number or comma-separated numbers (one per slot), got {text!r}", param_hint=name
        ) from None
    return values[0] if len(values) == 1 else values


def _seeds(text: str, name: str) -> list[int]:
    """'8' -> seeds 0..7; '3,1,4' -> exactly those seeds."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(
            f"expected a count or comma-separated integers, got {text!r}", param_hint=name
        ) from None
    if len(values) == 1 and "," not in text:
        if values[0] < 1:
            raise click.BadParameter(f"the number of slots must be >= 1, got {values[0]}", param_hint=name)
        return list(range(values[0]))
    return values


def _key_values(pairs: tuple[str, ...], name: str) -> dict[str, Any]:
    """('channels=[16,16]', 'pool=max') -> {'channels': [16, 16], 'pool': 'max'} (values read as YAML)."""
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {pair!r}", param_hint=name)
        result[key.strip()] = yaml.safe_load(value)
    return result


def _stability_command() -> click.Command:
    from hfta_nas.stability import stability_command

    return stability_command


def _report_command() -> click.Command:
    from hfta_nas.stability import report_command

    return report_command


# Commands defined outside this file, imported only when run or asked for their --help (click's
# lazy subcommands): name -> (what `hfta-nas --help` lists for it, the function that imports it).
# The listed line is the first sentence of the command's help (tests/test_startup.py checks it).
_LAZY_COMMANDS: dict[str, tuple[str, Callable[[], click.Command]]] = {
    "report": ("Regenerate a stability report from stored results, without retraining.", _report_command),
    "stability": (
        "Seed studies: one configuration across many seeds in one array, with a statistical report.",
        _stability_command,
    ),
}


class _FriendlyGroup(click.Group):
    """User errors from any subcommand (nested groups included) end as `error: ...`, exit 2.

    The commands in `_LAZY_COMMANDS` are imported the first time one is looked up to run (or
    to print its own --help); the group's --help lists them from their stored line instead."""

    _listing = False  # True while format_commands asks for every command only for its line of help

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # No shell can pass a NUL in an argument, but a program calling us can; click's path checks
        # would raise ValueError on it, so it is refused here, by name.
        for argument in args:
            if "\x00" in argument:
                raise click.UsageError(f"the argument {argument!r} holds a NUL character")
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        return _friendly_errors(super().invoke)(ctx)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _LAZY_COMMANDS and cmd_name not in self.commands:
            summary, load = _LAZY_COMMANDS[cmd_name]
            if self._listing:  # a stand-in carrying the line to list; never run
                return click.Command(cmd_name, help=summary)
            self.add_command(load(), cmd_name)
        command = super().get_command(ctx, cmd_name)
        if command is None and not self._listing:  # a typo: click's "Did you mean ...?" looks in self.commands
            for name in _LAZY_COMMANDS.keys() - self.commands.keys():
                self.add_command(_LAZY_COMMANDS[name][1](), name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False


@click.group(cls=_FriendlyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="hfta-nas")
def main() -> None:
    """hfta-nas: train many candidate models at once as one horizontally fused array.

    B models with equal shapes are fused into one array and trained together; each
    slot ends exactly where it would have ended trained alone.
    """


@main.command()
@click.option(
    "--model",
    default="cnn1d",
    show_default=True,
    help="Built-in family (mlp, cnn1d, cnn2d, bn_cnn, gru) or a user factory 'module:function'.",
)
@click.option(
    "--config",
    "model_config",
    multiple=True,
    metavar="KEY=VALUE",
    help="Model config entry (repeatable); values are YAML, e.g. channels=[16,32].",
)
@click.option(
    "--dataset", default="mnist1d", show_default=True, help="mnist1d, digits, a .npz/.csv file, or 'module:function'."
)
@click.option(
    "--seeds",
    default="8",
    show_default=True,
    help="Number of slots (seeds 0..N-1) or comma-separated init seeds, one per slot.",
)
@click.option(
    "--data-seeds", default=None, help="Comma-separated data-order seeds, one per slot [default: the init seeds]."
)
@click.option(
    "--dropout-seeds", default=None, help="Comma-separated dropout seeds, one per slot [default: the init seeds]."
)
@click.option(
    "--shared-order", is_flag=True, help="All slots see the same data order (cheaper; data seed = first data seed)."
)
@click.option(
    "--optimizer", default="adam", show_default=True, type=click.Choice(["sgd", "adam", "adamw", "rmsprop", "adagrad"])
)
@click.option(
    "--lr", default="3e-3", show_default=True, help="Learning rate: one value, or one per slot (comma-separated)."
)
@click.option(
    "--weight-decay", default=None, help="Weight decay: one value or one per slot [default: the optimizer's]."
)
@click.option("--momentum", default=None, help="Momentum (sgd, rmsprop): one value or one per slot.")
@click.option(
    "--schedule",
    default=None,
    type=click.Choice(["constant", "step", "exponential", "cosine"]),
    help="LR schedule, stepped once per epoch [default: none].",
)
@click.option(
    "--schedule-arg",
    multiple=True,
    metavar="KEY=VALUE",
    help="Schedule argument (repeatable): step_size, gamma, t_max, eta_min, warmup_steps, warmup_start_factor.",
)
@click.option("--epochs", default=5, show_default=True, type=int)
@click.option("--batch-size", default=100, show_default=True, type=int, help="Samples per step, per slot.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float64"]))
@click.option(
    "--threads", default=None, type=click.IntRange(min=1), help="torch CPU threads [default: torch's choice]."
)
@click.option(
    "--precision",
    default="float32",
    show_default=True,
    type=click.Choice(["float32", "bf16", "fp16"]),
    help="Mixed precision: bf16 or fp16 autocast (fp16 with per-slot loss scaling); float32 weights either way.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help=(
        "Set a training setting (repeatable), keys as in a config file or search space: epochs, "
        "data.batch_size, hparams.clip_norm (or training.clip_norm), model_config.width, accumulate, "
        "early_stopping.patience, augment.flip, schedule.t_max, ...; YAML values; after the options above."
    ),
)
@click.option("--json", "as_json", is_flag=True, help="Print the per-slot results as JSON (for machines).")
@_friendly_errors
def train(
    model,
    model_config,
    dataset,
    seeds,
    data_seeds,
    dropout_seeds,
    shared_order,
    optimizer,
    lr,
    weight_decay,
    momentum,
    schedule,
    schedule_arg,
    epochs,
    batch_size,
    device,
    dtype,
    threads,
    precision,
    overrides,
    as_json,
) -> None:
    """Train one array of models (one per seed) and print every slot's accuracy."""
    import torch

    import hfta_nas
    from hfta_nas.runtime import EpochProgress, set_up_command_process

    set_up_command_process(threads)
    hparams = {"lr": _numbers(lr, "--lr")}
    for name, value in (("weight_decay", weight_decay), ("momentum", momentum)):
        if value is not None:
            hparams[name] = _numbers(value, f"--{name.replace('_', '-')}")
    init_seeds = _seeds(seeds, "--seeds")
    schedule_config = {"kind": schedule, **_key_values(schedule_arg, "--schedule-arg")} if schedule else None
    settings = _with_overrides(
        {
            "model": model,
            "model_config": _key_values(model_config, "--config"),
            "dataset": dataset,
            "optimizer": optimizer,
            "hparams": hparams,
            "schedule": schedule_config,
            "epochs": epochs,
            "batch_size": batch_size,
            "accumulate": 1,
            "early_stopping": None,
            "augmentation": None,
            "loss": None,
        },
        overrides,
    )
    with EpochProgress(settings["epochs"], enabled=not as_json) as progress:
        run = hfta_nas.train(
            seeds=init_seeds,
            data_seeds=_seeds(data_seeds, "--data-seeds") if data_seeds else None,
            dropout_seeds=_seeds(dropout_seeds, "--dropout-seeds") if dropout_seeds else None,
            shared_order=shared_order,
            device=device,
            dtype=dtype,
            on_epoch=progress.update,
            precision=precision,
            **settings,
        )
    rows = [
        {
            "slot": slot,
            "init_seed": run.seeds["init"][slot],
            "data_seed": run.seeds["data"][slot],
            "dropout_seed": run.seeds["dropout"][slot],
            "status": result.status,
            "reason": result.reason,
            "epochs": result.epochs,
            **result.final,
        }
        for slot, result in run.results.items()
    ]
    summary = {
        "slots": rows,
        "seconds": run.seconds,
        "samples_per_second": run.samples_per_second,
        "threads": torch.get_num_threads(),
        "device": str(run.array.device),
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    _print_train_table(rows, summary)


def _with_overrides(settings: dict[str, Any], overrides: tuple[str, ...]) -> dict[str, Any]:
    """`hfta-nas train`'s settings with `--set key=value` applied (keys in a config file's layout;
    a search space's dotted keys are translated); an unknown key is one clear line."""
    from hfta_nas import EarlyStopping
    from hfta_nas.search_spaces import parse_config_overrides

    nested = {"hparams", "model_config", "schedule", "early_stopping", "augmentation", "loss"}
    for override in parse_config_overrides(overrides):
        loc = override.loc[1:] if override.loc[:2] == ("data", "batch_size") else override.loc
        loc = ("augmentation", *loc[1:]) if loc[:1] == ("augment",) else loc
        head = loc[0] if loc else ""
        if len(loc) == 1 and head in settings:
            settings[head] = override.value
        elif len(loc) == 2 and head in nested:
            current = settings[head]
            if isinstance(current, str) and head == "loss":  # loss=huber, then loss.delta=0.5
                current = {"name": current}
            if current is not None and not isinstance(current, dict):
                raise click.BadParameter(
                    f"{head} is {current!r}, not a mapping of settings", param_hint=f"--set {override.text}"
                )
            settings[head] = {**(current or {}), loc[1]: override.value}
        else:
            raise click.BadParameter(
                f"unknown setting {'.'.join(map(str, override.loc)) or override.text!r}; "
                "expected one of model, model_config.KEY, dataset, optimizer, hparams.NAME, "
                "schedule.KEY, epochs, batch_size, accumulate, early_stopping.KEY, augment.KEY, "
                "loss (a name) or loss.KEY",
                param_hint=f"--set {override.text}",
            )
    from hfta_nas import Objective
    from hfta_nas.data import Augmentation

    if isinstance(settings["loss"], (str, dict)):  # loss=mse, loss.label_smoothing=0.1 (cross_entropy's)
        spec = {"name": settings["loss"]} if isinstance(settings["loss"], str) else dict(settings["loss"])
        spec["loss"] = spec.pop("name", "cross_entropy")
        settings["loss"] = _built("loss", Objective, spec, "name, label_smoothing, class_weights, delta, masked")
    if settings["augmentation"] is not None:
        settings["augmentation"] = _built(
            "augment", Augmentation, settings["augmentation"], "shift, flip, noise, mixup, cutmix"
        )
    if settings["early_stopping"] is not None:
        settings["early_stopping"] = _built(
            "early_stopping", EarlyStopping, settings["early_stopping"], "metric, patience, min_delta, mode"
        )
    return settings


def _built(name: str, build: Callable[..., Any], arguments: dict[str, Any], takes: str) -> Any:
    """`build(**arguments)` for a `--set` group; an unknown key is one clear line."""
    try:
        return build(**arguments)
    except TypeError as error:
        raise click.BadParameter(f"{name} takes {takes} ({error})", param_hint="--set") from None


def _print_train_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    from rich.table import Table

    from hfta_nas.runtime import command_console

    table = Table(title="per-slot results (final epoch)")
    # the metrics the loss records: accuracy for classification, RMSE and R^2 for regression
    shown = (
        ["val_acc", "test_acc"]
        if any("val_acc" in row or "test_acc" in row for row in rows)
        else ["val_rmse", "val_r2", "test_rmse", "test_r2"]
    )
    for column in ("slot", "init/data/dropout seed", "status", "train loss", *(m.replace("_", " ") for m in shown)):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["slot"]),
            f"{row['init_seed']}/{row['data_seed']}/{row['dropout_seed']}",
            row["status"] + (f" ({row['reason']})" if row["reason"] else ""),
            f"{row.get('train_loss', float('nan')):.4f}",
            *(f"{row.get(m, float('nan')):.4f}" for m in shown),
        )
    console = command_console()
    console.print(table)
    console.print(
        f"{len(rows)} models in {summary['seconds']:.1f} s: {summary['samples_per_second']:,.0f} samples/s "
        f"summed over slots ({summary['threads']} torch threads, {summary['device']})"
    )


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
        from hfta_nas.search_spaces import load_space, storage_patience_of, study_name_of

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
    from hfta_nas.search_spaces import pbt_notes

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
    from hfta_nas.search_spaces import load_space, study_name_of

    name = study_name_of(load_space(options["space"], options.get("overrides", ())), options.get("study_name"))
    return counted_trials(options.get("storage"), name) + n_more


@main.command()
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
@_friendly_errors
@_search_workers
def search(
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
    from hfta_nas.search_spaces import load_space, plan_search, run_search

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
    if dry_run:
        plan = plan_search(
            loaded,
            storage=storage,
            study_name=study_name,
            n_trials=n_trials,
            timeout=timeout,
            array_size=array_size,
            device=device,
            dtype=dtype,
            new_space=new_space,
        )
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
            _print_search_plan(plan)
        return
    from hfta_nas.tracking import SearchTracking

    tracking = SearchTracking(*log_to) if log_to else contextlib.nullcontext()  # a bad --log fails before training
    with tracking, _SearchProgress(enabled=not (as_json or quiet)) as progress:
        summary = run_search(
            loaded,
            storage=storage,
            study_name=study_name,
            n_trials=n_trials,
            timeout=timeout,
            array_size=array_size,
            device=device,
            dtype=dtype,
            out_dir=out_dir,
            on_event=(lambda event: (progress.event(event), tracking(event))) if log_to else progress.event,
            adopt=adopt,
            storage_patience=storage_patience,
            new_space=new_space,
        )
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(summary), indent=2, default=str))
        return
    if loaded.pbt is not None:
        _print_pbt_summary(summary)
        return
    _print_search_summary(summary)


class _SearchProgress:
    """Live progress of a search on stderr: where to watch it, one line per array,
    and a bar over the study's trials whose status reads: trials done, pruned and
    failed, the best value so far (the Pareto front's size for several metrics),
    the array running and its slots, the mean occupancy and the throughput."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.text import Text

        from hfta_nas.runtime import command_console

        class StatusProgress(Progress):  # the bar, and the status on its own line below (it is long)
            status = ""

            def get_renderables(self):  # type: ignore[no-untyped-def]
                yield self.make_tasks_table(self.tasks)
                if self.status:
                    yield Text(self.status)

        self.enabled = enabled
        self.console = command_console(stderr=True)
        self.live = enabled and self.console.is_terminal  # else (a log file, a pipe): plain lines, status per array
        self.progress = StatusProgress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.live,
        )
        self.task = None
        self.counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
        self.metrics: list[str] = []
        self.directions: list[str] = []
        self.best: float | None = None
        self.best_trial: int | None = None
        self.front: list[list[float]] = []  # non-dominated values (several metrics)
        self.array: dict[str, Any] | None = None
        self.running = 0
        self.mean_occupancy: float | None = None
        self.samples_per_s: float | None = None
        self.started, self.total, self.ended_this_run = time.monotonic(), None, 0  # for the ETA
        self.structures: dict[str, int] = {}  # a layer structure's hash -> its number, in order of appearance

    def __enter__(self) -> _SearchProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def status(self) -> str:
        """The status line, from the events seen so far."""
        parts = [f"{self.counts['COMPLETE']} complete, {self.counts['PRUNED']} pruned, {self.counts['FAIL']} failed"]
        if len(self.metrics) > 1:
            parts.append(f"pareto front {len(self.front)}")
        elif self.best is not None:
            trial = f" (trial {self.best_trial})" if self.best_trial is not None else ""
            parts.append(f"best {self.metrics[0] if self.metrics else 'value'} {self.best:.4g}{trial}")
        if self.array is not None:
            parts.append(f"1 array running ({self.running}/{self.array.array_size} slots)")
        else:
            parts.append("0 arrays running")
        if self.mean_occupancy is not None:
            low = " (empty slots: pruned, or no trial left that fits; the summary says more)"
            parts.append(f"mean occupancy {self.mean_occupancy:.0%}{low if self.mean_occupancy < 0.7 else ''}")
        if self.samples_per_s is not None:
            parts.append(f"{self.samples_per_s:,.0f} samples/s")
        if self.total and self.ended_this_run:  # trials of this run at the pace so far
            left = max(self.total - self.ended_this_run, 0)
            parts.append(f"ETA {(time.monotonic() - self.started) / self.ended_this_run * left:.0f} s")
        return " | ".join(parts)

    def _better(self, value: float) -> bool:
        return self.best is None or (value > self.best if self.directions[0] == "maximize" else value < self.best)

    def _dominates(self, a: list[float], b: list[float]) -> bool:
        signs = [1 if d == "maximize" else -1 for d in self.directions]
        return all(s * x >= s * y for s, x, y in zip(signs, a, b)) and any(
            s * x > s * y for s, x, y in zip(signs, a, b)
        )

    def _add_to_front(self, values: list[float]) -> None:
        if any(self._dominates(other, values) or other == values for other in self.front):
            return
        self.front = [other for other in self.front if not self._dominates(values, other)] + [list(values)]

    def event(self, event: Any) -> None:
        """Update the counts from one search event (hfta_nas.search's event types) and say what it means."""
        handler = getattr(self, f"_on_{type(event).__name__}", None)
        line = handler(event) if handler is not None else None
        if not self.enabled:
            return
        if line:
            self.console.print(line, soft_wrap=True, highlight=False)
        self.progress.status = self.status()
        if self.live:
            self.progress.refresh()

    def _on_SearchStarted(self, event: Any) -> str:
        self.metrics, self.directions = list(event.metrics), list(event.directions)
        self.started, self.total = time.monotonic(), (event.n_trials - event.done if event.n_trials else None)
        for state in self.counts:
            self.counts[state] = event.states.get(state, 0)
        for values in event.best_values:
            if len(self.metrics) > 1:
                self._add_to_front(values)
            else:
                self.best = values[0]
        if self.enabled:
            self.task = self.progress.add_task("trials", total=event.n_trials, completed=event.done)
        done = "" if not event.done else f" ({event.done} trials already done)"
        return f"study [bold]{event.study}[/] in {event.storage}{done}\nwatch it live: [bold]{event.dashboard}[/]"

    def _on_TrialEnded(self, event: Any) -> None:
        if event.state in self.counts:
            self.counts[event.state] += 1
            self.ended_this_run += 1
        if event.state == "COMPLETE" and event.values:
            if len(self.metrics) > 1:
                self._add_to_front(list(event.values))
            elif event.feasible and self._better(event.values[0]):
                self.best, self.best_trial = event.values[0], event.trial
        if self.task is not None:
            self.progress.advance(self.task)

    def _on_ArrayStarted(self, event: Any) -> str:
        self.array, self.running = event, len(event.trials)
        return (
            f"array {event.array}: {len(event.trials)}/{event.array_size} slots, {event.architectures} "
            f"architecture(s), {event.waste:.0%} padding, trials {event.trials}"
        )

    def _on_PBTStarted(self, event: Any) -> str:
        self.metrics, self.directions = [event.metric], [event.direction]
        if self.enabled:
            self.task = self.progress.add_task("trials", total=len(event.trials))
        again = f", continued after epoch {event.resumed_from_epoch}" if event.resumed_from_epoch else ""
        return (
            f"study [bold]{event.study}[/] in {event.storage}: population-based training of {len(event.trials)} "
            f"members (trials {event.trials}), {event.epochs} epochs, exploit every {event.interval}{again}\n"
            f"watch it live: [bold]{event.dashboard}[/]"
        )

    def _on_PBTExploited(self, event: Any) -> str:
        changes = ", ".join(f"{name} {old:.3g} -> {new:.3g}" for name, (old, new) in event.changes.items())
        return f"epoch {event.epoch}: trial {event.target} copies trial {event.source}; {changes}"

    def _on_ArrayResumed(self, event: Any) -> str:
        return (
            f"array {event.array}: continues from epoch {event.epoch} (the checkpoint of a stopped run); "
            f"trials {event.trials} retry its slots' trials"
        )

    def _on_EpochEnded(self, event: Any) -> None:
        self.running, self.mean_occupancy, self.samples_per_s = event.running, event.mean_occupancy, event.samples_per_s

    def _on_ArrayEnded(self, event: Any) -> str | None:
        self.array, self.running, self.mean_occupancy = None, 0, event.mean_occupancy
        return None if self.live else self.status()

    def _on_TrialRetried(self, event: Any) -> str:
        return f"trial {event.trial} was interrupted by an earlier run: failed and retried"

    def _on_ArraySizeChosen(self, event: Any) -> str:
        number = self.structures.setdefault(event.structure, len(self.structures) + 1)
        models = "model" if event.size == 1 else "models"
        return (
            f"array size auto, layer structure {number}: {event.size} {models} per array "
            f"({_readable_reason(event.reason)})"
        )

    def _on_ArraySplit(self, event: Any) -> str:
        return (
            f"[yellow]out of memory[/] with {event.slots} models ({event.reason}): arrays of {event.half} from now on"
        )

    def _on_ArrayRefused(self, event: Any) -> str:
        apart = ", ".join(map(str, event.refused))
        return (
            f"[yellow]array {event.array} refused[/] trial(s) {apart}: they train again in arrays of their own, "
            f"{len([n for n in event.again if n not in event.refused])} others as usual ({event.reason})"
        )

    def _on_ArrayFailed(self, event: Any) -> str:
        return f"[red]array {event.array} failed[/]: {event.error}"


def _readable_reason(reason: str) -> str:
    """A packing reason as a person reads it: a measured step curve `{1: 0.0113068..., 2: ...}` (seconds
    per step by array size) becomes `11.3 ms a step with 1 model, 34.5 ms with 2`; other numbers with
    many digits are rounded."""
    import ast
    import re

    def curve(match: re.Match[str]) -> str:
        try:
            steps = list(ast.literal_eval(match.group(1)).items())
        except (ValueError, SyntaxError, AttributeError):
            return match.group(0)
        if not steps:
            return match.group(0)
        (size, step_s), rest = steps[0], steps[1:]
        first = f"{_duration(step_s)} a step with {size} model{'s' if size != 1 else ''}"
        return "step curve: " + ", ".join([first, *(f"{_duration(t)} with {n}" for n, t in rest)])

    text = re.sub(r"step curve (\{[^{}]*\})", curve, reason)
    return re.sub(r"\d+\.\d{4,}", lambda m: f"{float(m.group()):.3g}", text)


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


def _print_search_plan(plan: Any) -> None:
    """The --dry-run plan: one table row per array (slots, architectures, padding, estimated time, trials)."""
    from rich.table import Table

    from hfta_nas.runtime import command_console
    from hfta_nas.search import cost_from_dict

    console = command_console()
    done = f", {plan.done} already done" if plan.done else ""
    budget = f"{plan.n_trials} trials" if plan.n_trials is not None else "a timeout"
    if plan.array_size != "auto":
        sizes = f"arrays of up to {plan.array_size}"
    elif plan.arrays:  # measured per layer structure: the plan's arrays say what the measurement chose
        sizes = f"arrays of up to {max(a.array_size for a in plan.arrays)} (auto: measured per layer structure)"
    else:
        sizes = "array sizes measured per layer structure (auto)"
    console.print(
        f"dry run of study [bold]{plan.study_name}[/] in {plan.storage} ({budget}{done}; "
        f"{sizes}, rounds of {plan.pool_size} asks); nothing was written"
    )
    table = Table(title="packing plan (the first round is exact; later ones change as results come in)")
    for column in (
        "array",
        "slots",
        "architectures",
        "useful / executed MACs per sample",
        "padding",
        "est. s",
        "trials",
    ):
        table.add_column(column, justify="left" if column == "trials" else "right")
    for array in plan.arrays:
        table.add_row(
            str(array.array),
            f"{len(array.trials)}/{array.array_size}",
            str(array.architectures),
            f"{array.useful_macs:,} / {array.executed_macs:,}",
            f"{array.waste:.0%}",
            f"{array.estimated_s:.1f}",
            " ".join(str(t["number"]) for t in array.trials),
        )
    console.print(table)
    for key, cost in plan.step_costs.items():
        console.print(f"measured {key}: {cost_from_dict(cost).describe()}")
    console.print(
        f"{len(plan.arrays)} arrays, planned occupancy {plan.mean_occupancy:.0%}, "
        f"estimated {plan.estimated_s:.1f} s of training (before pruning and refills)"
    )
    if plan.note:
        console.print(plan.note)


def _print_search_summary(summary: Any) -> None:
    from rich.table import Table

    from hfta_nas.runtime import command_console, plural

    console = command_console()
    table = Table(title=f"study {summary.study_name}: best trial(s)")
    table.add_column("trial", justify="right")
    for metric in summary.metrics:
        table.add_column(metric, justify="right")
    table.add_column("parameters")
    for best in summary.best:
        # one parameter a line: the table stays narrow (an 80-column terminal) however many there are
        params = "\n".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["params"].items())
        table.add_row(str(best["number"]), *(f"{best['values'][m]:.4g}" for m in summary.metrics), params)
    completed = summary.trials.get("COMPLETE", 0)
    if summary.best or not completed:
        console.print(table)
    else:  # completed trials and no best: under constraints, Optuna's best is the best feasible trial
        console.print(
            f"study {summary.study_name}: no best trial: none of the {completed} completed trials met the "
            "space's constraints (each trial's system attribute 'constraints' says by how much it missed)"
        )
    states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(summary.trials.items()))
    if not summary.arrays:
        console.print(
            f"trials: {states}; nothing to train this run: n_trials is the study's total (finished trials "
            "of earlier runs count), and it is reached; --n-more N trains N more"
        )
    else:
        console.print(
            f"trials: {states}; {plural(len(summary.arrays), 'array')} this run, mean occupancy "
            f"{summary.mean_occupancy:.0%}{_occupancy_reason(summary)}, {summary.seconds:.1f} s, "
            f"{summary.samples_per_s:,.0f} samples/s summed over slots"
        )
    console.print(
        f"architectures: {summary.architectures_trained} trained of {summary.architectures_proposed} "
        f"proposed; padding {summary.waste:.0%} of executed multiply-adds"
    )
    if summary.time_account:
        console.print(f"time: {_time_shares(summary.time_account)}")
    if summary.trained_apart:
        trials = ", ".join(map(str, sorted(summary.trained_apart)))
        console.print(
            f"trained apart: trial(s) {trials}, whose array's check refused them (trial attribute trained_apart)"
        )
    for what, path in summary.exported.items():
        console.print(f"best {what}: {path}")
    if summary.unsaved_best:
        console.print(f"best weights: {summary.unsaved_best}")
    console.print(f"dashboard: {summary.dashboard}")
    for step in _next_steps(summary):
        console.print(f"next: {step}", soft_wrap=True)


def _print_pbt_summary(summary: Any) -> None:
    """The best member of a PBT run, its schedule's changes, and where its files are."""
    from hfta_nas.runtime import command_console

    console = command_console()
    best = summary.best
    if not best:
        console.print(f"study {summary.study_name}: no member completed")
        return
    console.print(
        f"study {summary.study_name}: {summary.population} members, {summary.epochs} epochs, "
        f"{summary.exploits} exploits in {summary.seconds:.1f} s; best: trial {best['number']} "
        f"{summary.metric} {best['value']:.4g}"
    )
    for name, values in best["schedule"].items():
        changes = [f"epoch {e + 1}: {v:.3g}" for e, v in enumerate(values) if e == 0 or v != values[e - 1]]
        console.print(f"  {name}: {', '.join(changes)}", soft_wrap=True)
    labels = {"plot": "population plot (pbt.png)", "schedule": "best member's schedule"}
    for what, path in summary.exported.items():
        console.print(f"{labels.get(what, f'best {what}')}: {path}")
    console.print(f"dashboard: {summary.dashboard}")
    for step in _next_steps(summary):
        console.print(f"next: {step}", soft_wrap=True)


def _next_steps(summary: Any) -> list[str]:
    """What a newcomer does after a search: how stable the best trial is over seeds, and the
    study in the dashboard."""
    import shlex

    from hfta_nas.search import DEFAULT_STORAGE

    steps = []
    if "config" in summary.exported:
        steps.append(
            f"hfta-nas stability {shlex.quote(summary.exported['config'])} --seeds 32"
            "   # how far the best trial's score moves with the seed"
        )
    storage = "" if summary.storage == DEFAULT_STORAGE else f" --storage {shlex.quote(summary.storage)}"
    steps.append(f"hfta-nas dashboard{storage}   # the study in optuna-dashboard: curves, importances, every trial")
    return steps


def _occupancy_reason(summary: Any) -> str:
    """Why the mean occupancy is low, when it is (below 70%), from the arrays this run trained."""
    if summary.mean_occupancy >= 0.7 or not summary.arrays:
        return ""
    started = sum(a["slots"] for a in summary.arrays) / sum(a["array_size"] for a in summary.arrays)
    return (
        f" (arrays started {started:.0%} full: this device's step curve keeps models of very different "
        "sizes apart, see --dry-run; slots freed by pruning stay empty when no trial that fits is left)"
    )


def _time_shares(account: dict[str, dict[str, float]]) -> str:
    """The time account's phases of at least 1%, largest first, and the overhead (all but training and evaluation)."""
    phases = sorted(
        ((name, row["share"]) for name, row in account.items() if name != "overhead" and row["share"] >= 0.01),
        key=lambda item: -item[1],
    )
    return ", ".join(f"{name} {share:.0%}" for name, share in phases) + f"; overhead {account['overhead']['share']:.0%}"


@main.command("storage-proxy")
@click.option(
    "--storage",
    required=True,
    help="The database the workers share: postgresql://..., mysql://... or sqlite:///FILE (not a journal file).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", default=13000, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--storage-patience",
    default=None,
    type=float,
    metavar="SECONDS",
    help="How long the proxy waits for an unreachable database before it stops [default: 600].",
)
@_friendly_errors
def storage_proxy(storage, host, port, storage_patience) -> None:
    """Serve a database to many workers through Optuna's gRPC storage proxy: one process holds the
    database connections and a cache, and the workers use --storage grpc://HOST:PORT."""
    from hfta_nas import DEFAULT_STORAGE_PATIENCE_S
    from hfta_nas.search import serve_proxy

    patience = DEFAULT_STORAGE_PATIENCE_S if storage_patience is None else storage_patience
    try:
        serve_proxy(
            storage,
            host,
            port,
            patience,
            ready=lambda line: click.echo(line, err=True),
            wait_at_start=storage_patience is not None,  # a patience given holds for the first connection too
        )
    except KeyboardInterrupt:
        click.echo("storage proxy stopped", err=True)


@main.command()
@click.option("--storage", default=None, help="Optuna storage URL or journal file [default: runs/hfta-nas.journal].")
@click.option(
    "--artifact-dir",
    default=None,
    type=click.Path(file_okay=False),
    help=(
        "Where stability reports are stored as artifacts [default: artifacts/ beside the journal file, else "
        "runs/artifacts]."
    ),
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port",
    default=8080,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port to serve on; when the default is taken, the next free one up to 8099 is used.",
)
@_friendly_errors
@click.pass_context
def dashboard(ctx: click.Context, storage, artifact_dir, host, port) -> None:
    """Start optuna-dashboard on a search's (or stability study's) storage."""
    from pathlib import Path

    import optuna_dashboard
    from optuna.artifacts import FileSystemArtifactStore

    from hfta_nas.errors import HftaNasError
    from hfta_nas.search import missing_storage_file, open_storage
    from hfta_nas.stability import default_artifact_dir

    missing = missing_storage_file(storage)  # opening would create an empty one (None: the default)
    if missing is not None:
        raise HftaNasError(
            f"no storage at '{missing}': nothing has been searched or studied there yet; run "
            "`hfta-nas search` or `hfta-nas stability` first, or give --storage"
        )
    default_port = ctx.get_parameter_source("port") == click.core.ParameterSource.DEFAULT
    port = _serving_port(host, port, last=8099 if default_port else port)  # before the artifact folder is made
    opened, location = open_storage(storage)
    artifacts = Path(artifact_dir) if artifact_dir else default_artifact_dir(location)
    artifacts.mkdir(parents=True, exist_ok=True)
    click.echo(f"optuna-dashboard on {location} (artifacts in {artifacts}): http://{host}:{port}/")
    try:
        optuna_dashboard.run_server(
            opened, host=host, port=port, artifact_store=FileSystemArtifactStore(str(artifacts))
        )
    except OSError as error:  # taken between the check and the start
        raise HftaNasError(
            f"cannot serve the dashboard on {host}:{port}: {error.strerror or error}; give another --port"
        ) from None


def _serving_port(host: str, first: int, last: int) -> int:
    """The first port from `first` to `last` the dashboard can listen on at `host` (saying so when it
    is not `first`); HftaNasError naming `first` when none can (taken, or not this machine's)."""
    import socket

    from hfta_nas.errors import HftaNasError

    refused = None
    for port in range(first, last + 1):
        try:
            with socket.create_server((host, port)):
                pass
        except OSError as error:
            refused = refused or error
            continue
        if port != first:
            click.echo(f"port {first} is taken; serving on {port} instead")
        return port
    raise HftaNasError(
        f"cannot serve the dashboard on {host}:{first}: {refused.strerror or refused}; give another --port (or --host)"
    )


_BENCHMARKS = {
    "throughput": "benchmarks.throughput",
    "stability": "benchmarks.stability",
    "search": "benchmarks.search",
    "augment": "benchmarks.augment",
    "dropout": "benchmarks.dropout",
}


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.argument("which", required=False, default="throughput")
@click.pass_context
def bench(ctx: click.Context, which: str) -> None:
    """Run a benchmark: `throughput` (default; serial, processes, vmap recipe, array and
    the fused limit), `stability` (a 32-seed array against 32 plain PyTorch runs) or
    `search` (anytime quality of one space and budget run several ways: plain Optuna, processes, Ray Tune, the packing)
    or `augment` (what each on-device augmentation costs an epoch, as ratios) or `dropout` (per-slot
    dropout against torch's, forward and backward, as ratios).
    Arguments after it go to the benchmark: `hfta-nas bench throughput --quick`,
    `hfta-nas bench stability --help`, `hfta-nas bench search --quick`."""
    args = list(ctx.args)
    if which not in _BENCHMARKS:
        if which.startswith("-"):  # `hfta-nas bench --quick`: options of the default benchmark
            args, which = [which, *args], "throughput"
        else:
            raise click.BadParameter(f"expected one of {', '.join(_BENCHMARKS)}, got {which!r}", param_hint="WHICH")
    sys.exit(_benchmark_module(_BENCHMARKS[which]).main(args))


def _benchmark_module(name: str):
    """The benchmark's module. The benchmarks live in the repository, not in the installed
    package: from a clone (an editable install) they are found beside this file."""
    import importlib
    from pathlib import Path

    beside = Path(__file__).resolve().parent
    if (beside / "benchmarks" / "__init__.py").is_file() and str(beside) not in sys.path:
        sys.path.insert(0, str(beside))
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name not in ("benchmarks", name):
            raise
        click.echo(
            "error: the benchmarks ship with the repository, not the installed package: "
            "run `hfta-nas bench` in a clone installed with `pip install -e .`",
            err=True,
        )
        sys.exit(EXIT_USER_ERROR)


if __name__ == "__main__":
    main()
