"""The `hfta-nas` command: a thin click shell over the Python API.

Every command parses options, calls one function of `hfta_nas` (or of the
search_spaces / stability packages) and prints the result. User errors
(`HftaNasError`) print one clear line and exit with status 2, never a
traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click
import yaml

EXIT_USER_ERROR = 2


def _friendly_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn user errors into `error: ...` on stderr and exit status 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from hfta_nas.errors import HftaNasError

        try:
            return command(*args, **kwargs)
        except HftaNasError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def _numbers(text: str | None, name: str) -> float | list[float] | None:
    """'0.1' -> 0.1 (all slots); '0.1,0.2,0.3' -> one value per slot."""
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected a number or comma-separated numbers (one per slot), got {text!r}", param_hint=name) from None
    return values[0] if len(values) == 1 else values


def _seeds(text: str, name: str) -> list[int]:
    """'8' -> seeds 0..7; '3,1,4' -> exactly those seeds."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected a count or comma-separated integers, got {text!r}", param_hint=name) from None
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


class _FriendlyGroup(click.Group):
    """User errors from any subcommand (nested groups included) end as `error: ...`, exit 2."""

    def invoke(self, ctx: click.Context) -> Any:
        return _friendly_errors(super().invoke)(ctx)


@click.group(cls=_FriendlyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="hfta-nas")
def main() -> None:
    """hfta-nas: train many candidate models at once as one horizontally fused array.

    B models with equal shapes are fused into one array and trained together; each
    slot ends exactly where it would have ended trained alone.
    """


@main.command()
@click.option("--model", default="cnn1d", show_default=True, help="Built-in family (mlp, cnn1d, cnn2d, bn_cnn, gru) or a user factory 'module:function'.")
@click.option("--config", "model_config", multiple=True, metavar="KEY=VALUE", help="Model config entry (repeatable); values are YAML, e.g. channels=[16,32].")
@click.option("--dataset", default="mnist1d", show_default=True, help="mnist1d, digits, a .npz/.csv file, or 'module:function'.")
@click.option("--seeds", default="8", show_default=True, help="Number of slots (seeds 0..N-1) or comma-separated init seeds, one per slot.")
@click.option("--data-seeds", default=None, help="Comma-separated data-order seeds, one per slot [default: the init seeds].")
@click.option("--dropout-seeds", default=None, help="Comma-separated dropout seeds, one per slot [default: the init seeds].")
@click.option("--shared-order", is_flag=True, help="All slots see the same data order (cheaper; data seed = first data seed).")
@click.option("--optimizer", default="adam", show_default=True, type=click.Choice(["sgd", "adam", "adamw", "rmsprop", "adagrad"]))
@click.option("--lr", default="3e-3", show_default=True, help="Learning rate: one value, or one per slot (comma-separated).")
@click.option("--weight-decay", default=None, help="Weight decay: one value or one per slot [default: the optimizer's].")
@click.option("--momentum", default=None, help="Momentum (sgd, rmsprop): one value or one per slot.")
@click.option("--schedule", default=None, type=click.Choice(["constant", "step", "exponential", "cosine"]), help="LR schedule, stepped once per epoch [default: none].")
@click.option("--schedule-arg", multiple=True, metavar="KEY=VALUE", help="Schedule argument (repeatable): step_size, gamma, t_max, eta_min, warmup_steps, warmup_start_factor.")
@click.option("--epochs", default=5, show_default=True, type=int)
@click.option("--batch-size", default=100, show_default=True, type=int, help="Samples per step, per slot.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float64"]))
@click.option("--threads", default=None, type=int, help="torch CPU threads [default: torch's choice].")
@click.option("--json", "as_json", is_flag=True, help="Print the per-slot results as JSON (for machines).")
@_friendly_errors
def train(model, model_config, dataset, seeds, data_seeds, dropout_seeds, shared_order, optimizer, lr, weight_decay,
          momentum, schedule, schedule_arg, epochs, batch_size, device, dtype, threads, as_json) -> None:
    """Train one array of models (one per seed) and print every slot's accuracy."""
    import torch

    import hfta_nas
    from hfta_nas._progress import EpochProgress

    if threads is not None:
        torch.set_num_threads(threads)
    hparams = {"lr": _numbers(lr, "--lr")}
    for name, value in (("weight_decay", weight_decay), ("momentum", momentum)):
        if value is not None:
            hparams[name] = _numbers(value, f"--{name.replace('_', '-')}")
    init_seeds = _seeds(seeds, "--seeds")
    schedule_config = {"kind": schedule, **_key_values(schedule_arg, "--schedule-arg")} if schedule else None
    with EpochProgress(epochs, enabled=not as_json) as progress:
        run = hfta_nas.train(
            model, model_config=_key_values(model_config, "--config"), dataset=dataset, seeds=init_seeds,
            data_seeds=_seeds(data_seeds, "--data-seeds") if data_seeds else None,
            dropout_seeds=_seeds(dropout_seeds, "--dropout-seeds") if dropout_seeds else None,
            shared_order=shared_order, optimizer=optimizer, hparams=hparams, schedule=schedule_config,
            epochs=epochs, batch_size=batch_size, device=device, dtype=dtype, on_epoch=progress.update,
        )
    rows = [
        {"slot": slot, "init_seed": run.seeds["init"][slot], "data_seed": run.seeds["data"][slot],
         "dropout_seed": run.seeds["dropout"][slot], "status": result.status, "reason": result.reason,
         "epochs": result.epochs, **result.final}
        for slot, result in run.results.items()
    ]
    summary = {"slots": rows, "seconds": run.seconds, "samples_per_second": run.samples_per_second,
               "threads": torch.get_num_threads(), "device": str(run.array.device)}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    _print_train_table(rows, summary)


def _print_train_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="per-slot results (final epoch)")
    for column in ("slot", "init/data/dropout seed", "status", "train loss", "val acc", "test acc"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["slot"]), f"{row['init_seed']}/{row['data_seed']}/{row['dropout_seed']}",
            row["status"] + (f" ({row['reason']})" if row["reason"] else ""),
            f"{row.get('train_loss', float('nan')):.4f}", f"{row.get('val_acc', float('nan')):.4f}",
            f"{row.get('test_acc', float('nan')):.4f}",
        )
    console = Console()
    console.print(table)
    console.print(f"{len(rows)} models in {summary['seconds']:.1f} s: {summary['samples_per_second']:,.0f} samples/s "
                  f"summed over slots ({summary['threads']} torch threads, {summary['device']})")


@main.command()
@click.argument("space", type=click.Path(dir_okay=False))
@click.option("--n-trials", type=int, default=None, help="Trials in the study when done [default: the space's budget.n_trials]; finished trials of an earlier run count.")
@click.option("--timeout", type=float, default=None, help="Stop starting new arrays after this many seconds [default: the space's budget.timeout].")
@click.option("--array-size", default=None, help="Slots per array: an integer or 'auto' [default: the space's array.size].")
@click.option("--storage", default=None, help="Optuna storage URL (sqlite:///f.db, postgresql://...) or a journal file path [default: runs/hfta-nas.journal].")
@click.option("--study-name", default=None, help="[default: the space's study.name, else the file name].")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), help="Where the best config and weights go [default: runs/<study>].")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float64"]))
@click.option("--threads", default=None, type=int, help="torch CPU threads [default: torch's choice].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (for machines).")
@_friendly_errors
def search(space, n_trials, timeout, array_size, storage, study_name, out_dir, device, dtype, threads, as_json) -> None:
    """Search SPACE (a YAML file, see search_spaces/README.md) with Optuna, training
    candidates of equal shape together as arrays. Re-running resumes the study."""
    import dataclasses

    import optuna
    import torch

    from hfta_nas._run import _checked_device
    from hfta_nas.search import run_search
    from search_spaces import load_space

    if threads is not None:
        torch.set_num_threads(threads)
    if array_size is not None and array_size != "auto":
        try:
            array_size = int(array_size)
        except ValueError:
            raise click.BadParameter(f"expected an integer or 'auto', got {array_size!r}", param_hint="--array-size") from None
    _checked_device(device)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded = load_space(space)
    with _SearchProgress(enabled=not as_json) as progress:
        summary = run_search(loaded, storage=storage, study_name=study_name, n_trials=n_trials, timeout=timeout,
                             array_size=array_size, device=device, dtype=dtype, out_dir=out_dir, on_event=progress.event)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(summary), indent=2, default=str))
        return
    _print_search_summary(summary)


class _SearchProgress:
    """Prints where to watch, then one progress bar over the study's trials."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = enabled
        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[status]}"), console=self.console, disable=not enabled)
        self.task = None
        self.best: float | None = None

    def __enter__(self) -> "_SearchProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def event(self, kind: str, info: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if kind == "start":
            self.console.print(f"study [bold]{info['study']}[/] in {info['storage']} ({info['done']} trials already done)")
            self.console.print(f"watch it live: [bold]{info['dashboard']}[/]")
            self.task = self.progress.add_task("trials", total=info["n_trials"], completed=info["done"], status="")
        elif kind == "trial" and self.task is not None:
            status = info["state"].lower()
            self.progress.advance(self.task)
            self.progress.update(self.task, status=f"last: trial {info['trial']} {status}")
        elif kind == "array":
            self.progress.console.print(f"array {info['array']}: {info['size']} slots, trials {info['trials']}")


def _print_search_summary(summary: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"study {summary.study_name}: best trial(s)")
    table.add_column("trial", justify="right")
    for metric in summary.metrics:
        table.add_column(metric, justify="right")
    table.add_column("parameters")
    for best in summary.best:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["params"].items())
        table.add_row(str(best["number"]), *(f"{best['values'][m]:.4g}" for m in summary.metrics), params)
    console.print(table)
    states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(summary.trials.items()))
    console.print(f"trials: {states}; {summary.arrays} arrays this run, mean occupancy {summary.mean_occupancy:.0%}, "
                  f"{summary.seconds:.1f} s")
    for what, path in summary.exported.items():
        console.print(f"best {what}: {path}")
    console.print(f"dashboard: {summary.dashboard}")


@main.command()
@click.option("--storage", default=None, help="Optuna storage URL or journal file [default: runs/hfta-nas.journal].")
@click.option("--artifact-dir", default=None, type=click.Path(file_okay=False), help="Where stability reports are stored as artifacts [default: artifacts/ beside the journal file, else runs/artifacts].")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@_friendly_errors
def dashboard(storage, artifact_dir, host, port) -> None:
    """Start optuna-dashboard on a search's (or stability study's) storage."""
    from pathlib import Path

    import optuna_dashboard
    from optuna.artifacts import FileSystemArtifactStore

    from hfta_nas.search import open_storage
    from stability._study import default_artifact_dir

    opened, location = open_storage(storage)
    artifacts = Path(artifact_dir) if artifact_dir else default_artifact_dir(location)
    artifacts.mkdir(parents=True, exist_ok=True)
    click.echo(f"optuna-dashboard on {location} (artifacts in {artifacts}): http://{host}:{port}/")
    optuna_dashboard.run_server(opened, host=host, port=port, artifact_store=FileSystemArtifactStore(str(artifacts)))


_BENCHMARKS = {"throughput": "benchmarks.throughput", "stability": "benchmarks.stability"}


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.argument("which", required=False, default="throughput")
@click.pass_context
def bench(ctx: click.Context, which: str) -> None:
    """Run a benchmark: `throughput` (default; serial, processes, vmap recipe, array and
    the fused limit) or `stability` (a 32-seed array against 32 plain PyTorch runs).
    Arguments after it go to the benchmark: `hfta-nas bench throughput --quick`,
    `hfta-nas bench stability --help`."""
    import importlib

    args = list(ctx.args)
    if which not in _BENCHMARKS:
        if which.startswith("-"):  # `hfta-nas bench --quick`: options of the default benchmark
            args, which = [which, *args], "throughput"
        else:
            raise click.BadParameter(f"expected one of {', '.join(_BENCHMARKS)}, got {which!r}", param_hint="WHICH")
    sys.exit(importlib.import_module(_BENCHMARKS[which]).main(args))


def _add_stability_commands() -> None:
    from stability._cli import report, stability

    main.add_command(stability)
    main.add_command(report)


_add_stability_commands()

if __name__ == "__main__":
    main()
