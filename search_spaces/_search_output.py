"""What `hfta-nas search` prints: its live progress, a --dry-run's plan, and the summary at the end.

The rich imports wait until something is printed, so loading the command for its --help stays light.
"""

from __future__ import annotations

import time
from typing import Any


class SearchProgress:
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

    def __enter__(self) -> SearchProgress:
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


def print_search_plan(plan: Any) -> None:
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


def print_search_summary(summary: Any) -> None:
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
            f"{summary.mean_occupancy:.0%}{occupancy_reason(summary)}, {summary.seconds:.1f} s, "
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


def print_pbt_summary(summary: Any) -> None:
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


def occupancy_reason(summary: Any) -> str:
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
