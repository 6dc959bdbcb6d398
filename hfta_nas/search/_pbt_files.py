"""What a PBT run writes beside the best member's weights and config:

- `best_schedule.yaml`: the best member's hyper-parameters per epoch as its weights trained with
  them (through every exploit), its lineage, and its root (the member whose initial weights its
  weights descend from) with the root's seeds: what `hfta-nas stability --study` replays;
- `pbt.png`: the population's explored hyper-parameters over the epochs, one line per slot,
  each epoch coloured by the member whose initial weights the slot's weights descend from.

The figure is drawn on matplotlib's object API (no pyplot: no global state, no GUI backend).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml

from hfta_nas.runtime import atomic_write_bytes, atomic_write_text
from hfta_nas.search._pbt_records import Records

SCHEDULE, PLOT = "best_schedule.yaml", "pbt.png"


def write_pbt_files(out_dir: Path, best: dict[str, Any], records: Records, metric: str) -> dict[str, str]:
    """Write both files; what -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(
        {
            "trial": best["number"],
            metric: best["value"],
            "root": best["root"],  # the member whose initial weights, seeds and hyper-parameters it carries
            "seeds": best["seeds"],
            "schedule": {name: [float(v) for v in values] for name, values in best["schedule"].items()},
            "lineage": best["lineage"],
        },
        sort_keys=False,
    )
    atomic_write_text(out_dir / SCHEDULE, text)
    buffer = io.BytesIO()
    draw(records, best["number"]).savefig(buffer, format="png", dpi=120)
    atomic_write_bytes(out_dir / PLOT, buffer.getvalue())
    return {"schedule": str(out_dir / SCHEDULE), "plot": str(out_dir / PLOT)}


def draw(records: Records, best: int) -> Any:
    """One panel per explored hyper-parameter (see the module docstring); the best member's slot drawn thicker.
    A matplotlib Figure (imported here: a search that never draws one does not load matplotlib)."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    names = sorted({name for values in records.values.values() for name in values})
    figure = Figure(figsize=(7, 2.6 * max(len(names), 1)), layout="constrained")
    axes = figure.subplots(max(len(names), 1), 1, squeeze=False)[:, 0]
    colours = {root: f"C{i % 10}" for i, root in enumerate(records.members)}
    for ax, name in zip(axes, names):
        for member in records.members:
            values, roots = records.values[member].get(name, []), records.roots[member]
            # segment epoch -> epoch + 1 in the colour of the root its weights have in epoch + 1: one
            # collection per slot (a line object per segment takes seconds to draw for a large population)
            segments = [[(e, values[e - 1]), (e + 1, values[e])] for e in range(1, len(values))]
            colors = [colours[roots[e]] for e in range(1, len(values))]
            ax.add_collection(LineCollection(segments, colors=colors, linewidths=2.4 if member == best else 1.0))
            ax.plot(range(1, len(values) + 1), values, linestyle="none")  # the axes' limits (even for 1 epoch)
            exploited = [x["epoch"] for x in records.lineage[member] if x["epoch"] < len(values)]
            if exploited:  # where the slot copied another: a dot
                ax.scatter(
                    [e + 1 for e in exploited],
                    [values[e] for e in exploited],
                    s=9,
                    c=[colours[roots[e]] for e in exploited],
                )
        positive = all(v > 0 for member in records.members for v in records.values[member].get(name, []))
        if positive:
            ax.set_yscale("log")
        ax.set_ylabel(name)
    axes[-1].set_xlabel("epoch")
    handles = [axes[0].plot([], [], color=c, label=f"trial {root}")[0] for root, c in colours.items()]
    axes[0].legend(handles=handles, title="weights from", fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    axes[0].set_title(f"population over epochs (thick: the best member, trial {best}; dots: exploits)")
    return figure
