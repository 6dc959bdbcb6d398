"""Ratios from the measured cells, and the rich tables printed from the JSON result."""

from __future__ import annotations

import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

METHODS = ("serial", "processes", "vmap", "array", "limit")

# name -> (numerator method, denominator method, what it says)
RATIOS: dict[str, tuple[str, str, str]] = {
    "array/serial": ("array", "serial", "speed-up of the array over training the models one after another"),
    "array/vmap": ("array", "vmap", "speed-up of the array over the torch.func ensembling recipe"),
    "processes/serial": ("processes", "serial", "speed-up of co-located processes over one after another"),
    "fusion_efficiency": (
        "array",
        "limit",
        "T_limit / T_array = array samples/s over one model's samples/s on B x N samples (1.0 = perfect fusion)",
    ),
}


def ratios(methods: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Each ratio of the cells' `samples_per_s` (None where a cell is missing or unsupported)."""
    out: dict[str, float | None] = {}
    for name, (top, bottom, _) in RATIOS.items():
        a = methods.get(top, {}).get("samples_per_s")
        b = methods.get(bottom, {}).get("samples_per_s")
        out[name] = a / b if a and b else None
    return out


def _rate(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return ""
    if cell.get("samples_per_s") is None:
        return "[dim]n/a[/dim]"
    text = f"{cell['samples_per_s']:,.0f}"
    return text + (" [red]![/red]" if cell.get("flag") else "")


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _memory(cell: dict[str, Any] | None) -> str:
    if cell is None or cell.get("samples_per_s") is None:
        return ""
    mb = cell.get("peak_memory_mb")
    return "" if mb is None else f"{mb:,.1f}"


def make_console(file=None) -> Console:
    file = file or sys.stdout
    console = Console(file=file)
    if not console.is_terminal:
        # Logs and pipes: plain ASCII, wide enough that the table never wraps.
        console = Console(file=file, width=max(console.width, 160), no_color=True, emoji=False)
    return console


def print_report(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or make_console()
    plain = not console.is_terminal
    style = box.ASCII if plain else box.SIMPLE_HEAVY
    methods = [m for m in METHODS if m in result["settings"]["methods"]]
    machine = result["machine"]

    table = Table(
        title=f"Training throughput, samples/s summed over all models (batch {result['settings']['batch_size']} "
        f"per model, Adam, {machine['device_name']}, {machine['threads']} thread(s))",
        box=style,
    )
    table.add_column("workload")
    table.add_column("B", justify="right")
    for method in methods:
        table.add_column(method, justify="right")
    shown_ratios = [name for name, (a, b, _) in RATIOS.items() if a in methods and b in methods]
    for name in shown_ratios:
        table.add_column("T_limit/T_array" if name == "fusion_efficiency" else name, justify="right")
    memory = Table(title="Peak memory growth per method, MB", box=style)
    memory.add_column("workload")
    memory.add_column("B", justify="right")
    for method in methods:
        memory.add_column(method, justify="right")

    notes: dict[str, list[str]] = {}
    for workload, by_batch in result["results"].items():
        for batch, entry in by_batch.items():
            cells = entry["methods"]
            table.add_row(
                workload,
                batch,
                *[_rate(cells.get(m)) for m in methods],
                *[_ratio(entry["ratios"][r]) for r in shown_ratios],
            )
            memory.add_row(workload, batch, *[_memory(cells.get(m)) for m in methods])
            for method in methods:
                reason = cells.get(method, {}).get("unsupported")
                if reason:
                    notes.setdefault(f"{method}: {reason}", []).append(f"{workload} B={batch}")
        table.add_section()
        memory.add_section()
    console.print(table)
    if any(v.get("peak_memory_mb") is not None for e in _entries(result) for v in e["methods"].values()):
        console.print(memory)
        console.print(f"memory: {result['settings']['memory_method']}", highlight=False, markup=False)
    for note, where in notes.items():
        console.print(f"n/a  {', '.join(where)}: {note}", highlight=False, markup=False)
    for flag in result["flags"]:
        console.print(f"!    {flag}", highlight=False, markup=False)
    console.print(
        f"torch {machine['torch']}, {machine['threads']} torch thread(s), {machine['usable_cpus']} usable CPU(s), "
        f"device {machine['device_name']}; {result['duration_s']:.0f} s; JSON: {result.get('out') or '(not written)'}",
        highlight=False,
        markup=False,
    )


def _entries(result: dict[str, Any]):
    for by_batch in result["results"].values():
        yield from by_batch.values()
