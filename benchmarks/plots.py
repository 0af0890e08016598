"""The history of the main benchmarks as a few PNG files, from their raw results.

    .venv/bin/python benchmarks/plots.py [--results DIR] [--out DIR]

Reads `benchmarks/results/<name>.jsonl` (one JSON line per run) and writes `benchmarks/plots/*.png`.
A plot keeps the full-size runs that carry their date (`at`): lines with `"quick": true`, lines of
another size and older lines without `at` are left out. Runs are drawn in the order of `at`, one point
each, and dated (UTC) on the x axis; a dashed line of a series' colour is its target. The machine and
its load differ from run to run (each line holds its `load_avg_before`), so compare the ratios measured
within one run rather than absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent
Row = dict[str, Any]
DPI = 100


def number(row: Row, *path: str) -> float | None:
    """The number at `path` in a JSON line (a ratio given as `{"ratio": x, ...}` counts as x), or None."""
    value: Any = row
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if isinstance(value, dict):
        value = value.get("ratio")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass(frozen=True)
class Series:
    label: str
    path: tuple[str, ...]
    target: float | None = None
    scale: float = 1.0

    def value(self, row: Row) -> float | None:
        found = number(row, *self.path)
        return None if found is None else found * self.scale


@dataclass(frozen=True)
class Panel:
    ylabel: str
    series: tuple[Series, ...]
    extra_targets: tuple[tuple[str, float], ...] = ()
    from_zero: bool = True


@dataclass(frozen=True)
class Plot:
    out: str
    benchmark: str
    title: str
    keep: Callable[[Row], bool]
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def sized(key: str, size: int) -> Callable[[Row], bool]:
    return lambda row: row.get(key) == size


PLOTS = (
    Plot("cycle_throughput_ratios", "cycle_throughput",
         "cycle_throughput: the 1,000,000-message cycle (1% poison) against its baselines",
         sized("messages", 1_000_000),
         (Panel("ratio (wall time, same run)", (
             Series("cycle / plain Spark pass", ("cycle_over_plain",), target=1.2),
             Series("cycle / plain-Python limit", ("cycle_over_limit",), target=3.0),
             Series("cycle with 1% poison / clean cycle", ("poison_over_clean",), target=1.1),
         )),)),
    Plot("cycle_throughput_seconds", "cycle_throughput",
         "cycle_throughput: seconds for 1,000,000 messages, 2 cores",
         sized("messages", 1_000_000),
         (Panel("seconds (wall)", (
             Series("cycle, 1% poison", ("cycle_seconds",)),
             Series("clean cycle", ("clean_cycle_seconds",)),
             Series("plain Spark pass", ("plain_seconds",)),
             Series("plain-Python limit", ("limit_seconds",)),
         )),)),
    Plot("engine_python", "engine_python",
         "engine_python: the executor's Python per message (200,000 messages, one process)",
         sized("messages", 200_000),
         (Panel("µs per message (gc on)", (
             Series("engine (Processor)", ("engine_us_per_msg_gc_on",)),
             Series("floor (plain pass)", ("floor_us_per_msg_gc_on",)),
         )),)),
    Plot("enqueue_throughput", "enqueue_throughput",
         "enqueue_throughput: 1,000,000 envelopes from JSON Lines",
         sized("messages", 1_000_000),
         (Panel("thousand messages per second", (
             Series("floor (pyarrow + one Delta write)", ("msg_per_s", "floor"), scale=1e-3),
             Series("Python API, file", ("msg_per_s", "python_file"), scale=1e-3),
             Series("CLI", ("msg_per_s", "cli"), scale=1e-3),
             Series("Python API, texts", ("msg_per_s", "python"), scale=1e-3),
             Series("Python API, texts in calls of 100,000", ("msg_per_s", "python_chunks"), scale=1e-3),
             Series("Python API, dicts", ("msg_per_s", "python_dicts"), scale=1e-3),
         ), extra_targets=(("target 200k msg/s", 200.0),)),)),
    Plot("broker_drain", "broker_drain",
         "broker_drain: 1,000,000 messages (1% poison) drained, against RabbitMQ",
         sized("messages", 1_000_000),
         (Panel("messages per second", (
             Series("ours: enqueue + inbound cycle + poison cycle", ("ours", "drain_msgs_per_s")),
             Series("RabbitMQ: publish until every message settled", ("rabbitmq", "drain_msgs_per_s")),
         )),
          Panel("drain ratio, ours / RabbitMQ", (
              Series("drain ratio", ("drain_ratio",), target=5.0),
          )))),
)


def read_runs(path: Path, keep: Callable[[Row], bool]) -> list[tuple[datetime, Row]]:
    """The full-size, dated lines of one results file, oldest first."""
    runs = []
    for text in path.read_text().splitlines():
        if not text.strip():
            continue
        row = json.loads(text)
        if row.get("quick") or "at" not in row or not keep(row):
            continue
        runs.append((datetime.fromisoformat(row["at"]), row))
    runs.sort(key=lambda run: run[0])
    return runs


def draw_panel(axes: Axes, panel: Panel, rows: Sequence[Row]) -> None:
    colours = [f"C{i}" for i in range(10)]
    for colour, series in zip(colours, panel.series, strict=False):
        points = [(i, v) for i, row in enumerate(rows) if (v := series.value(row)) is not None]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        axes.plot(xs, ys, marker="o", markersize=3.5, linewidth=1.2, color=colour, label=series.label)
        if len(panel.series) <= 4:  # the last value, where the labels of a few series do not overlap
            last = f"{ys[-1]:,.0f}" if abs(ys[-1]) >= 1000 else f"{ys[-1]:.3g}"
            axes.annotate(last, (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 3), fontsize=7,
                          color=colour)
        if series.target is not None:
            axes.axhline(series.target, color=colour, linestyle="--", linewidth=0.9,
                         label=f"target {series.target:g}")
    for label, value in panel.extra_targets:
        axes.axhline(value, color="0.35", linestyle=":", linewidth=1.0, label=label)
    if panel.from_zero:
        axes.set_ylim(bottom=0)
    axes.set_ylabel(panel.ylabel)
    axes.grid(True, linewidth=0.4, alpha=0.5)
    axes.legend(fontsize=7, loc="best", framealpha=0.8)


def draw(plot: Plot, runs: Sequence[tuple[datetime, Row]], out: Path) -> Path:
    rows = [row for _, row in runs]
    figure = Figure(figsize=(9.0, 3.6 * len(plot.panels) + 0.8), dpi=DPI)
    FigureCanvasAgg(figure)
    panels = figure.subplots(len(plot.panels), 1, sharex=True, squeeze=False)[:, 0]
    for axes, panel in zip(panels, plot.panels, strict=True):
        draw_panel(axes, panel, rows)
    step = max(1, -(-len(runs) // 14))
    # Every step-th run is dated, and the last one always (in place of a neighbour it would overlap).
    ticks = [i for i in range(0, len(runs), step) if i <= len(runs) - 1 - step] + [len(runs) - 1]
    bottom = panels[-1]
    bottom.set_xticks(ticks, [runs[i][0].strftime("%Y-%m-%d %H:%M") for i in ticks], rotation=35,
                      ha="right", fontsize=7)
    bottom.set_xlabel(f"full-size runs in the order of `at` (UTC), {len(runs)} in all")
    bottom.set_xlim(-0.5, len(runs) - 0.5)
    figure.suptitle(plot.title, fontsize=10)
    figure.tight_layout()
    path = out / f"{plot.out}.png"
    figure.savefig(path, dpi=DPI)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=HERE / "results", help="the folder of <name>.jsonl")
    parser.add_argument("--out", type=Path, default=HERE / "plots", help="where the PNG files go")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for plot in PLOTS:
        runs = read_runs(args.results / f"{plot.benchmark}.jsonl", plot.keep)
        if not runs:
            print(f"{plot.out}: no full-size dated line in {plot.benchmark}.jsonl, nothing drawn")
            continue
        path = draw(plot, runs, args.out)
        print(f"{path} ({len(runs)} runs, the last at {runs[-1][0].isoformat()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
