"""`hfta-nas stability [run|compare]` and `hfta-nas report`: the click commands.

They parse options, call `run_stability`, `analyse` and `write_report`, and
print a short summary. User errors raise HftaNasError; the top-level group in
cli.py turns them into one `error: ...` line and exit status 2.

Importing this module is light (click and the standard library): `hfta-nas
stability --help` and `hfta-nas report --help` need these click objects, so
everything else (the engine, torch, Optuna, pandas, the plots) is imported
inside the commands, when they run.
"""

from __future__ import annotations

import functools
import json
import math
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from ._formats import FAIL_MARGIN, FORMATS, MAX_SEEDS_UNTIL, PLOT_FORMATS


def _split(text: str, allowed: Sequence[str], name: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in items if t not in allowed]
    if unknown or not items:
        raise click.BadParameter(
            f"expected a comma-separated subset of {', '.join(allowed)}, got {text!r}", param_hint=name
        )
    return items


_SET_HELP = (
    "Set a setting of CONFIG (repeatable): a dotted key of the config file or of a search space "
    "(epochs=2 and training.epochs=2 are the same), a YAML value, validated with the file."
)


_FAIL_BELOW = click.option(
    "--fail-below",
    type=float,
    default=None,
    help="A seed whose --metric is below this value counts as gone wrong in the failure rate "
    "(accuracies are fractions: 0.6), instead of --fail-margin. Failed seeds always count.",
)
_FAIL_MARGIN = click.option(
    "--fail-margin",
    type=click.FloatRange(min=0.0),
    default=FAIL_MARGIN,
    show_default=True,
    help="Without --fail-below: a seed worse than its study's median by more than this share of the median "
    "counts as gone wrong (0.1: an accuracy under 0.9 x the median, a loss over 1.1 x); no mode is sought.",
)


_MAX_SEEDS = click.option(
    "--max-seeds",
    default=MAX_SEEDS_UNTIL,
    show_default=True,
    type=int,
    help="With --until or --until-decided: stop here if the question is still open.",
)


def _study_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options shared by `stability run` and `stability compare`."""
    options = [
        click.option(
            "--seeds",
            "n_seeds",
            default=32,
            show_default=True,
            type=int,
            help="Seeds per configuration (slots of the array); with --until, the seeds of each round.",
        ),
        click.option(
            "--seed",
            "base_seed",
            default=0,
            show_default=True,
            type=click.IntRange(min=0),
            help="Base seed of the per-source seed streams.",
        ),
        click.option(
            "--vary",
            default="init,data,dropout",
            show_default=True,
            help="Sources that change across seeds: init, data (order), dropout, split (the train/validation "
            "partition, re-drawn per seed); 'all' is init,data,dropout (name split to add it); the others stay fixed.",
        ),
        click.option(
            "--decompose",
            is_flag=False,
            flag_value="sources",
            default=None,
            type=click.Choice(["sources", "grid"]),
            help="Also attribute the variance to its sources: `--decompose` (or `sources`) runs one design per varied "
            "source (only it changes); `--decompose grid` crosses init seeds with data seeds (a two-way ANOVA). "
            "It takes an optional value: put it after CONFIG.",
        ),
        click.option(
            "--array-size",
            type=int,
            default=None,
            help="At most this many seeds per array [default: all seeds of a configuration in one array].",
        ),
        click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N."),
        click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float64"])),
        click.option(
            "--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads [default: torch's choice]."
        ),
        click.option(
            "--storage",
            default=None,
            help="Optuna storage URL or journal file where each seed is stored [default: runs/hfta-nas.journal].",
        ),
        click.option(
            "--artifact-dir",
            default=None,
            type=click.Path(file_okay=False),
            help="Where the report is stored as an Optuna artifact "
            "[default: artifacts/ beside the journal or SQLite file, else runs/artifacts].",
        ),
        click.option(
            "--out",
            "out_dir",
            default=None,
            type=click.Path(file_okay=False),
            help="Report folder [default: runs/stability/<config>].",
        ),
        click.option(
            "--format",
            "formats",
            default=",".join(FORMATS),
            show_default=True,
            help="Report formats: html, md, csv, json, tex.",
        ),
        click.option(
            "--plot-format",
            "plot_formats",
            default=",".join(PLOT_FORMATS),
            show_default=True,
            help="Plot files: png, svg.",
        ),
        click.option(
            "--metric",
            default="test_acc",
            show_default=True,
            help="Metric of the plots and the printed summary (test_rmse when the configs are regressions).",
        ),
        click.option(
            "--bootstrap-seed",
            default=0,
            show_default=True,
            type=int,
            help="Seed of the bootstrap resamples (recorded in the report).",
        ),
        _FAIL_BELOW,
        _FAIL_MARGIN,
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (for machines)."),
        click.option("--quiet", is_flag=True, help="No progress display."),
        click.option(
            "--log",
            "log_to",
            multiple=True,
            metavar="BACKEND[:WHERE]",
            help="Log a run per seed, grouped by the configuration's study, to mlflow[:URI], tensorboard[:DIR] "
            "(default runs/tensorboard) or wandb[:PROJECT] (default hfta-nas; WANDB_MODE=offline logs without a "
            "network); repeatable. Each needs its extra: pip install 'hfta-nas[mlflow]'.",
        ),
    ]
    return functools.reduce(lambda cmd, option: option(cmd), reversed(options), command)


class _RunByDefault(click.Group):
    """`hfta-nas stability --seeds 32` means `hfta-nas stability run --seeds 32`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["run", *args]
        return super().parse_args(ctx, args)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The group's help, then the default command's options: they are what `--seeds 32` takes."""
        super().format_help(ctx, formatter)
        run = self.commands["run"]
        with click.Context(run, info_name="run", parent=ctx) as sub:
            formatter.write_paragraph()
            formatter.write_text("`run` is the default command (hfta-nas stability [CONFIG] [OPTIONS]); its arguments:")
            run.format_options(sub, formatter)


@click.group(cls=_RunByDefault)
def stability() -> None:
    """Seed studies: one configuration across many seeds in one array, with a statistical report.

    `hfta-nas stability [CONFIG] --seeds 32` runs `stability run` (the default);
    `hfta-nas stability compare A B ...` compares configurations.
    """


@stability.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--params",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="Fix a searched parameter when CONFIG is a search space (repeatable).",
)
@click.option(
    "--study",
    "study_name",
    default=None,
    help="Re-run the best trials of this search study (with --top-k and --storage).",
)
@click.option(
    "--top-k",
    default=3,
    show_default=True,
    type=int,
    help="With --study: how many of its best trials to re-run and re-rank.",
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=_SET_HELP)
@click.option(
    "--until",
    default=None,
    metavar="QUESTION",
    help="Run rounds of --seeds seeds until QUESTION is answered at 95% (anytime-valid confidence sequences) "
    "or --max-seeds: 'median±0.5%' or 'median±0.005' (the median known to ± half a point), 'mean±1%' (the "
    "mean: needs hundreds of seeds, any seed may be 0), 'fail<0.1' (failure rate bounded below 10%). "
    "ASCII: median+-0.5%.",
)
@_MAX_SEEDS
@_study_options
def run(
    config: str | None,
    params: tuple[str, ...],
    study_name: str | None,
    top_k: int,
    overrides: tuple[str, ...],
    until: str | None,
    max_seeds: int,
    **options: Any,
) -> None:
    """Train CONFIG across --seeds seeds in one array and report the distribution.

    CONFIG is a config file exported by `hfta-nas search` (runs/<study>/best_config.yaml),
    or a search space file with --params fixing its searched parameters
    [default: stability/configs/mnist1d_cnn.yaml]. With --study, the K best trials of
    a search are re-run across seeds and re-ranked with intervals.
    """
    from hfta_nas.errors import HftaNasError

    from ._configs import (
        DEFAULT_CONFIG,
        LabelledConfig,
        label_for,
        load_config,
        parse_params,
        top_k_configs,
    )

    if study_name is not None:
        if config is not None or overrides:
            raise HftaNasError("give either CONFIG (with --set) or --study, not both.")
        storage, _ = _open(options["storage"])
        configs = top_k_configs(storage, study_name, top_k)
    else:
        path = Path(config) if config is not None else DEFAULT_CONFIG
        configs = [LabelledConfig(label_for(path), load_config(path, parse_params(params), overrides))]
    _execute(configs, [], until=until, max_seeds=max_seeds, **options)


@stability.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help=_SET_HELP + " Applies to every config file."
)
@click.option(
    "--until-decided",
    is_flag=False,
    flag_value="mean",
    default=None,
    type=click.Choice(["mean", "median"]),
    help="Run rounds of --seeds seeds (the same seeds for every config) until each pair's paired difference "
    "has its mean (or median: A better on most seeds, far fewer seeds) excluding 0 at 95% (anytime-valid, "
    "Bonferroni over pairs) or --max-seeds. It takes an optional value: put it after the INPUTS.",
)
@_MAX_SEEDS
@_study_options
def compare(
    inputs: tuple[str, ...], overrides: tuple[str, ...], until_decided: str | None, max_seeds: int, **options: Any
) -> None:
    """Compare configurations: each INPUT is a config file (trained across the seeds)
    or the folder of an earlier stability report (reused without retraining)."""
    from hfta_nas.errors import HftaNasError

    from ._configs import LabelledConfig, label_for, load_config

    if len(inputs) < 2:
        raise HftaNasError("compare needs at least two configurations (config files or report folders).")
    configs, earlier, labels = [], [], []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            earlier.append(_load_result(path))
        else:
            label = label_for(path, labels)
            labels.append(label)
            configs.append(LabelledConfig(label, load_config(path, overrides=overrides)))
    if until_decided and earlier:
        raise HftaNasError("--until-decided trains rounds of seeds; give config files, not report folders.")
    from ._rounds import decided

    until = decided(until_decided) if until_decided else None
    _execute(configs, earlier, until=until, max_seeds=max_seeds, **options)


@click.command()
@click.argument("folder", required=False, type=click.Path(file_okay=False))
@click.option(
    "--study", "studies", multiple=True, help="A stability study in --storage (repeatable) instead of FOLDER."
)
@click.option("--storage", default=None, help="Optuna storage URL or journal file [default: runs/hfta-nas.journal].")
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Report folder [default: FOLDER, or runs/stability/report].",
)
@click.option(
    "--format",
    "formats",
    default=",".join(FORMATS),
    show_default=True,
    help="Report formats: html, md, csv, json, tex.",
)
@click.option(
    "--plot-format", "plot_formats", default=",".join(PLOT_FORMATS), show_default=True, help="Plot files: png, svg."
)
@click.option("--metric", default="test_acc", show_default=True, help="Metric of the plots and the printed summary.")
@click.option(
    "--bootstrap-seed",
    default=None,
    type=int,
    help="Seed of the bootstrap resamples [default: the one the study recorded].",
)
@_FAIL_BELOW
@_FAIL_MARGIN
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (for machines).")
def report(
    folder: str | None,
    studies: tuple[str, ...],
    storage: str | None,
    out_dir: str | None,
    formats: str,
    plot_formats: str,
    metric: str,
    bootstrap_seed: int | None,
    fail_below: float | None,
    fail_margin: float,
    as_json: bool,
) -> None:
    """Regenerate a stability report from stored results, without retraining.

    FOLDER is an earlier report folder (it keeps the raw results in result/);
    or name the studies with --study (`hfta-nas stability` prints their names).
    """
    from hfta_nas.errors import HftaNasError

    from ._result import StabilityResult
    from ._store import load_stability_study, result_of
    from ._study import report as rebuild

    if (folder is None) == (not studies):
        raise HftaNasError("give a report FOLDER or at least one --study NAME (not both).")
    if folder is not None:
        result = _load_result(Path(folder))
        out = Path(out_dir or folder)
    else:
        opened, _ = _open(storage)
        result = StabilityResult.combine([result_of(load_stability_study(opened, name)) for name in studies])
        out = Path(out_dir or Path("runs") / "stability" / "report")
    done = rebuild(
        result,
        out,
        formats=_split(formats, FORMATS, "--format"),
        plot_formats=_split(plot_formats, PLOT_FORMATS, "--plot-format"),
        metric=metric,
        bootstrap_seed=bootstrap_seed,
        fail_below=fail_below,
        fail_margin=fail_margin,
    )
    _print(done, metric, as_json)


# ----------------------------------------------------------------- the work
def _execute(
    configs: list,
    earlier: list,
    *,
    n_seeds: int,
    base_seed: int,
    vary: str,
    decompose: str | None,
    array_size: int | None,
    device: str,
    dtype: str,
    threads: int | None,
    storage: str | None,
    artifact_dir: str | None,
    out_dir: str | None,
    formats: str,
    plot_formats: str,
    metric: str,
    bootstrap_seed: int,
    fail_below: float | None,
    fail_margin: float,
    as_json: bool,
    quiet: bool,
    log_to: tuple[str, ...] = (),
    until: Any = None,
    max_seeds: int = MAX_SEEDS_UNTIL,
) -> None:
    import contextlib

    import optuna

    from ._study import check_fail_below, metric_for, run_study

    formats_ = _split(formats, FORMATS, "--format")
    plot_formats_ = _split(plot_formats, PLOT_FORMATS, "--plot-format")
    from hfta_nas.runtime import checked_out_dir as _checked_out_dir
    from hfta_nas.runtime import set_up_command_process

    for option, folder in (("--out", out_dir), ("--artifact-dir", artifact_dir)):
        if folder is not None:  # before training, not when the first file is written
            _checked_out_dir(folder, option)
    set_up_command_process(threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metric = metric_for(configs, metric)
    check_fail_below(fail_below, metric)  # before training, not after
    from ._tracking import StabilityTracking

    tracking = StabilityTracking(*log_to) if log_to else contextlib.nullcontext()  # a bad --log fails before training
    with tracking, _Progress(enabled=not (quiet or as_json)) as progress:
        on_event = (lambda kind, info: (progress.event(kind, info), tracking(kind, info))) if log_to else progress.event
        done = run_study(
            configs,
            seeds=n_seeds,
            vary=vary,
            decompose=decompose,
            base_seed=base_seed,
            device=device,
            dtype=dtype,
            array_size=array_size,
            storage=storage,
            out_dir=out_dir,
            formats=formats_,
            plot_formats=plot_formats_,
            metric=metric,
            bootstrap_seed=bootstrap_seed,
            artifact_dir=artifact_dir,
            earlier=earlier,
            on_event=on_event,
            fail_below=fail_below,
            fail_margin=fail_margin,
            until=until,
            max_seeds=max_seeds,
        )
    _print(done, metric, as_json)


def _print(done: Any, metric: str, as_json: bool) -> None:
    summary = _summary(done, metric)
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=_json_default))
    else:
        _print_summary(summary, metric)


def _summary(done: Any, metric: str) -> dict[str, Any]:
    analysis, metadata = done.analysis, done.result.metadata
    rows = analysis.summary[(analysis.summary["metric"] == metric) & (analysis.summary["design"] == "all")]
    dashboard = None
    if done.artifacts and metadata.get("storage"):
        dashboard = shlex.join(["optuna-dashboard", str(metadata["storage"]), "--artifact-dir", str(done.artifact_dir)])
    return {
        "metric": metric,
        "configs": [_clean(row) for row in rows.to_dict("records")],
        "comparisons": [
            _clean(r) for r in analysis.comparisons[analysis.comparisons["metric"] == metric].to_dict("records")
        ],
        "decomposition": [
            _clean(r) for r in analysis.decomposition[analysis.decomposition["metric"] == metric].to_dict("records")
        ],
        "mode_sources": list(  # one verdict per configuration and method, in order
            dict.fromkeys(
                f"{r['config']}: {r['verdict']}"
                for r in analysis.mode_sources.to_dict("records")
                if r["metric"] == metric
            )
        ),
        "seconds": metadata.get("seconds"),
        "arrays": metadata.get("arrays", []),
        "reused_seeds": metadata.get("reused_seeds", 0),
        "studies": done.studies,
        "report": str(done.out_dir),
        "files": {fmt: [str(p) for p in paths] for fmt, paths in done.files.items()},
        "dashboard": dashboard,
        "sequential": metadata.get("sequential"),
    }


def _print_summary(summary: dict[str, Any], metric: str) -> None:
    from rich.table import Table

    from hfta_nas.runtime import command_console, plural

    console = command_console()
    scale, unit = (100.0, "%") if metric.endswith("_acc") else (1.0, "")
    table = Table(title=f"{metric}: distribution over seeds")
    from ._export import gone_wrong

    columns = ("config", "n", "failed", "headline", "IQM [95% bootstrap CI]", "gone wrong [95% exact CI]", "min–max")
    for column in columns:
        table.add_column(column, justify="right")
    for row in summary["configs"]:
        f = lambda v: "n/a" if v is None else f"{scale * v:.2f}{unit}"
        table.add_row(
            str(row["config"]),
            str(row["n"]),
            str(row["n_failed"]),
            str(row["headline"]),
            f"{f(row['iqm'])} [{f(row['iqm_low'])}, {f(row['iqm_high'])}]",
            gone_wrong(row),
            f"{f(row['min'])}–{f(row['max'])}",
        )
    console.print(table)
    for c in summary["comparisons"]:
        console.print(_comparison_line(c, scale, unit))
    for d in summary["decomposition"]:
        share = "" if d.get("share") is None else f" ({d['share']:.0%} of the sum of sources)"
        console.print(f"variance from {d['source']}: {d['variance']:.3g}{share}")
    for verdict in summary["mode_sources"]:
        console.print(verdict)
    if summary["sequential"]:
        from ._export import stopping_text

        console.print(stopping_text(summary["sequential"]))
    arrays = summary["arrays"]
    if arrays:
        sizes = ", ".join(str(a["size"]) for a in arrays)
        console.print(
            f"{plural(len(arrays), 'array')} of {sizes} slots in {summary['seconds']:.1f} s"
            + (
                f"; {plural(summary['reused_seeds'], 'seed')} reused from the storage"
                if summary["reused_seeds"]
                else ""
            )
        )
    elif summary["reused_seeds"]:
        console.print(f"{plural(summary['reused_seeds'], 'seed')} reused from the storage: nothing to retrain")
    console.print(f"report: {summary['report']}")
    for name in summary["studies"].values():
        console.print(f"study: {name}")
    if summary["dashboard"]:
        console.print(f"dashboard: {summary['dashboard']}")


def _comparison_line(c: dict[str, Any], scale: float, unit: str) -> str:
    """One comparison in the words of its design: paired tests when the seeds are shared."""
    from ._export import pairs_text

    g = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731 (local helper)
    if c["paired"]:
        tests = (
            f"paired t p={g(c['paired_t_p'], '.3g')} (Holm {g(c['paired_t_p_holm'], '.3g')}), "
            f"Wilcoxon p={g(c['wilcoxon_p'], '.3g')}, P(A better over {c['n_pairs']} pairs)="
            f"{g(c['p_a_better_pairs'], '.2f')} [{g(c['p_a_better_pairs_low'], '.2f')}, "
            f"{g(c['p_a_better_pairs_high'], '.2f')}]"
        )
    else:
        tests = (
            f"Welch p={g(c['welch_p'], '.3g')} (Holm {g(c['welch_p_holm'], '.3g')}), P(A better)="
            f"{g(c['p_a_better'], '.2f')} [{g(c['p_a_better_low'], '.2f')}, {g(c['p_a_better_high'], '.2f')}]"
        )
    # the point and its interval come from the same seeds: the pairs when paired, else every completed seed
    point = c["paired_mean_diff"] if c["paired"] else c["mean_diff"]
    low, high = (
        (c["paired_diff_low"], c["paired_diff_high"]) if c["paired"] else (c["mean_diff_low"], c["mean_diff_high"])
    )
    signed = lambda v: "n/a" if v is None else f"{scale * v:+.2f}{unit}"  # noqa: E731 (local helper)
    diff = f"{signed(point)} [{signed(low)}, {signed(high)}]"
    seeds = f"same seeds, {pairs_text(c['n_pairs'], c['unpaired_slots'])}" if c["paired"] else "independent seeds"
    return (
        f"{c['a']} vs {c['b']} ({seeds}): diff {diff}, {tests}; "
        f"gone wrong {c['a_bad_n']} of {c['a_bad_of']} vs {c['b_bad_n']} of {c['b_bad_of']} "
        f"({'McNemar' if c['paired'] else 'Fisher'} p={g(c['bad_rate_p'], '.3g')})"
    )


class _Progress:
    """One rich progress bar over the epochs of the array being trained."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from hfta_nas.runtime import command_console

        self.console = command_console(stderr=True)
        self.live = enabled and self.console.is_terminal  # else (a pipe, a log): plain lines with an ETA
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.live,
        )
        self.enabled = enabled
        self.task = None
        # When the array began (its "started" event) and the first epoch it trains in this run (a
        # checkpoint may have restored the ones before): elapsed time and ETA count from them.
        self.array_started: float | None = None
        self.first_epoch: int | None = None

    def __enter__(self) -> _Progress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def event(self, kind: str, info: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if kind == "config":
            reused = f", {info['reused']} reused from the storage" if info["reused"] else ""
            self.progress.console.print(f"{info['label']}: {info['todo']} seeds to train{reused}")
        elif kind == "split":
            self.progress.console.print(
                f"{info['label']}: an array of {info['size']} seeds ran out of memory "
                f"({info['reason']}); retrying as {info['half']} + {info['size'] - info['half']}"
            )
        elif kind == "continued":
            self.progress.console.print(
                f"{info['label']} ({info['size']} slots): continuing from epoch {info['epoch']}/{info['epochs']}, "
                "from the checkpoint an interrupted run left"
            )
        elif kind == "round":
            for answer in info["answers"]:
                self.progress.console.print(f"round {info['round']}, {info['seeds']} seeds: {answer.text}")
        elif kind == "started":
            self._new_array(info)
        elif kind == "epoch":
            if self.task is None:  # no "started" heard: elapsed counts from here, no ETA until an epoch is timed
                self._new_array(info)
                self.first_epoch = info["epoch"] + 1
            elif self.first_epoch is None:
                self.first_epoch = info["epoch"]
            self.progress.update(self.task, completed=info["epoch"])
            if not self.live:
                self._plain_line(info)

    def _new_array(self, info: dict[str, Any]) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{info['label']} ({info['size']} slots) epochs", total=info["epochs"])
        self.array_started, self.first_epoch = time.monotonic(), None

    def _plain_line(self, info: dict[str, Any]) -> None:
        """About ten lines per array where no live bar can be drawn: epoch, the time since the array
        started, and an ETA at the mean time per epoch trained so far (none before an epoch is timed)."""
        epoch, epochs = info["epoch"], info["epochs"]
        if epoch % max(1, epochs // 10) and epoch != epochs:
            return
        elapsed = time.monotonic() - self.array_started
        timed = epoch - self.first_epoch + 1  # epochs trained in this run since the array started
        eta = f", ETA {elapsed / timed * (epochs - epoch):.0f} s" if timed > 0 and epoch < epochs else ""
        self.console.print(f"{info['label']} ({info['size']} slots): epoch {epoch}/{epochs}, {elapsed:.1f} s{eta}")


def _open(storage: str | None) -> tuple[Any, str]:
    from hfta_nas.search import open_storage

    return open_storage(storage)


def _load_result(folder: Path) -> Any:
    from hfta_nas.errors import HftaNasError

    from ._result import StabilityResult

    for candidate in (folder / "result", folder):
        if (candidate / "seeds.csv").exists():
            try:
                return StabilityResult.load(candidate)
            except (OSError, ValueError, KeyError) as error:
                raise HftaNasError(f"cannot read the stability results in '{candidate}': {error}") from None
    raise HftaNasError(
        f"'{folder}' holds no stability results (expected result/seeds.csv, written by `hfta-nas stability --out`)."
    )


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)
