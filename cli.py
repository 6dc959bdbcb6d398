"""The `hfta-nas` command: a thin click shell over the Python API.

Every command parses options, calls one function of `hfta_nas` (or of the
search_spaces / stability packages) and prints the result. User errors
(`HftaNasError`) print one clear line and exit with status 2, never a
traceback. SIGTERM stops a command as Ctrl-C does (one line, exit 143 instead
of 130): a scheduler's time limit loses nothing.

Start-up imports only click and yaml: each command imports what it needs when
it runs. The larger commands live beside the API they call (`search` in
search_spaces/_cli.py, `stability` and `report` in stability/_cli.py) and load on
first use (`_LAZY_COMMANDS`), so `hfta-nas --help` and `hfta-nas search --help`
import no torch, and `hfta-nas search` none of the statistics and plots of
`stability`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
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


def _search_command() -> click.Command:
    from hfta_nas.search_spaces import search_command

    return search_command


# Commands defined outside this file, imported only when run or asked for their --help (click's
# lazy subcommands): name -> (what `hfta-nas --help` lists for it, the function that imports it).
# The listed line is the first sentence of the command's help (tests/test_startup.py checks it).
_LAZY_COMMANDS: dict[str, tuple[str, Callable[[], click.Command]]] = {
    "report": ("Regenerate a stability report from stored results, without retraining.", _report_command),
    "search": (
        "Search SPACE (a YAML file, see search_spaces/README.md) with Optuna: every proposed candidate trains as "
        "proposed, packed into arrays by measured cost.",
        _search_command,
    ),
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
