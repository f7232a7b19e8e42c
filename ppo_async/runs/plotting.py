"""Figures of run directories: one run's curves, or many runs overlaid with seeds grouped.

``plot_runs`` draws, against env steps or wall-clock time, the return, the
policy and value losses, the entropy, the approximate KL, the clip fraction,
the throughput and the policy lag, plus a histogram of the policy lag. Runs
whose configs differ only by seed form a group (`ppo_async.runs.analysis.group_runs`):
its mean curve and a 95% bootstrap band over seeds, each seed a thin line.

Against wall-clock time each run is counted from its own first update
(`ppo_async.runs.analysis.aligned` with ``from_start``): seeds whose clocks are
offset (a slower compile, runs started one after another) line up at 0, and
a group's mean covers the time its shortest seed ran, so it never averages a
changing set of seeds. Greedy evaluations (``eval_every_updates``) are dots
at the update they evaluated, for the runs that have them.
"""

from __future__ import annotations

import io
import pathlib
import textwrap
import warnings
from collections.abc import Sequence

import numpy as np

from ppo_async.runs.analysis import (
    Run,
    aligned,
    bootstrap_mean_band,
    group_runs,
    load_runs,
    read_metrics,
    run_x,
)
from ppo_async.runs.run_dir import write_atomically

__all__ = ["PANELS", "X_AXES", "plot_run", "plot_runs", "read_metrics"]

# (metric in metrics.jsonl, panel title); the histogram of the policy lag comes last.
PANELS = (
    ("episode_return", "return (last 100 episodes)"),
    ("policy_loss", "policy loss"),
    ("value_loss", "value loss"),
    ("entropy", "entropy"),
    ("approx_kl", "approx KL"),
    ("clip_fraction", "clip fraction"),
    ("env_steps_per_s_window", "env steps/s (over 10 updates)"),
    ("policy_lag_mean", "policy lag (mean; max dashed)"),
)
_LEGEND_CHARS = 190  # characters of legend a line across the figure holds at its font size
X_AXES = {"env_steps": "env steps",
          "wall_time_s": "wall-clock time (s) from each run's first update"}


def _figure(**kwargs):
    """A matplotlib Figure that draws without pyplot (no global backend is touched)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError("plotting needs matplotlib: pip install 'ppo-async[plot]'") from error
    return Figure(**kwargs)


def _steps_formatter():
    """Tick labels like 250k and 1.5M."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(
        lambda v, _: f"{v / 1e6:g}M" if abs(v) >= 1e6 else f"{v / 1e3:g}k" if v else "0")


def _lag_counts(run: Run) -> dict[int, float]:
    """Chunks per policy lag from ``summary.json``; before it exists, each update's max lag."""
    if run.summary is not None and "policy_lag_counts" in run.summary:
        return {int(k): float(v) for k, v in run.summary["policy_lag_counts"].items()}
    counts: dict[int, float] = {}
    for lag in run.metrics.get("policy_lag_max", np.array([])):
        if np.isfinite(lag):
            counts[int(lag)] = counts.get(int(lag), 0) + 1
    return counts


def plot_runs(run_dirs: Sequence[str | pathlib.Path] | Sequence[Run], out: str | pathlib.Path,
              *, x: str = "env_steps", title: str | None = None) -> pathlib.Path:
    """Write a figure of ``run_dirs`` (directories or loaded `Run`s) to ``out`` (PNG); returns its path.

    ``x`` is ``env_steps`` or ``wall_time_s`` (or ``wall_time``). Raises FileNotFoundError for
    a run without metrics, `ConfigError` for a damaged ``config.json`` and ValueError for an
    unknown ``x``.
    """
    x = {"wall_time": "wall_time_s"}.get(x, x)  # the CLI's name for it
    if x not in X_AXES:
        raise ValueError(f"x={x!r}: choose one of {', '.join(X_AXES)}")
    runs = [r if isinstance(r, Run) else None for r in run_dirs]
    if any(r is None for r in runs):
        runs = load_runs(run_dirs)  # type: ignore[arg-type]
    if not runs:
        raise ValueError("no runs to plot")
    groups = group_runs(runs)
    import matplotlib
    from matplotlib.lines import Line2D

    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    # The legend goes under the panels, in as many columns as its labels allow: a
    # sweep's labels name every field that differs and can be long.
    labels = [label + (f" ({len(group)} seeds)" if len(group) > 1 else "")
              for label, group in groups.items()]
    longest = max(len(label) for label in labels)
    columns = 1 if longest > _LEGEND_CHARS // 2 else 2 if longest > _LEGEND_CHARS // 3 else 3
    labels = [textwrap.fill(label, _LEGEND_CHARS // columns) for label in labels]
    per_column = -(-len(labels) // columns)  # matplotlib fills the columns one after another
    lines = max(sum(label.count("\n") + 1 for label in labels[i:i + per_column])
                for i in range(0, len(labels), per_column))
    legend_in = 0.3 + 0.16 * lines
    fig = _figure(figsize=(15, 10.5 + legend_in))
    axes = fig.subplots(3, 3).ravel()
    from_start = x == "wall_time_s"
    for (metric, panel_title), ax in zip(PANELS, axes):
        drawn = False
        for g, (label, group) in enumerate(groups.items()):
            if not any(metric in run.metrics for run in group):
                continue
            color = colors[g % len(colors)]
            grid, values = aligned(group, metric, x, from_start=from_start)
            mean, low, high = bootstrap_mean_band(values, seed=g)
            if len(group) > 1:
                for run in group:  # each seed over its own range
                    _draw_points(ax, run, metric, x, from_start, color=color, alpha=0.25,
                                 linewidth=0.7)
                ax.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
            ax.plot(grid, mean, color=color, linewidth=1.8)
            if metric == "policy_lag_mean":
                _, lag_max = aligned(group, "policy_lag_max", x, from_start=from_start)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # points no seed covers
                    lag_max = np.nanmax(lag_max, axis=0)
                ax.plot(grid, lag_max, color=color, linestyle="--", linewidth=1)
            if metric == "episode_return":
                for run in group:
                    _draw_points(ax, run, "eval_return_mean", x, from_start, fmt="o",
                                 color=color, markersize=3)
            drawn = True
        ax.set_title(panel_title + (" and greedy evaluation (dots)" if metric == "episode_return"
                                    and any("eval_return_mean" in r.metrics for r in runs) else ""),
                     fontsize=10)
        if not drawn:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(X_AXES[x])
        ax.ticklabel_format(axis="y", useOffset=False)  # a flat curve reads 1000, not 1e-9+1e3
        if x == "env_steps":
            ax.xaxis.set_major_formatter(_steps_formatter())
        ax.grid(alpha=0.3)
    _lag_histogram(axes[-1], groups, colors)
    fig.suptitle(title or (runs[0].name if len(runs) == 1 else f"{len(runs)} runs, {len(groups)} groups"))
    handles = [Line2D([], [], color=colors[g % len(colors)], linewidth=1.8)
               for g in range(len(groups))]
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=90)
    return write_atomically(out, image.getvalue())


def _draw_points(ax, run: Run, metric: str, x: str, from_start: bool, fmt: str = "-",
                 **style) -> None:
    """``run``'s ``metric`` against ``x`` (a NaN leaves a gap; nothing if the run lacks it)."""
    values = run.metrics.get(metric)
    if values is not None:
        ax.plot(run_x(run, x, from_start), values, fmt, **style)


def _lag_histogram(ax, groups: dict[str, list[Run]], colors: list[str]) -> None:
    """Bars of the share of consumed chunks per policy lag, one bar per group side by side."""
    from matplotlib.ticker import MaxNLocator

    width = 0.8 / max(len(groups), 1)
    finished = all(run.summary is not None for group in groups.values() for run in group)
    for g, (label, group) in enumerate(groups.items()):
        counts: dict[int, float] = {}
        for run in group:
            for lag, count in _lag_counts(run).items():
                counts[lag] = counts.get(lag, 0) + count
        total = sum(counts.values()) or 1.0
        lags = np.array(sorted(counts))
        ax.bar(lags + (g - (len(groups) - 1) / 2) * width, [counts[lag] / total for lag in lags],
               width=width, color=colors[g % len(colors)], label=label)
    # Integer ticks, at most about ten of them: a label per lag collides once lags run into dozens.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
    ax.set_xlabel("policy lag (learner updates)")
    ax.set_ylabel("share of chunks" if finished else "share of updates (max lag of each)")
    ax.set_title("policy lag of consumed experience", fontsize=10)
    ax.grid(alpha=0.3, axis="y")


def plot_run(run_dir: str | pathlib.Path, out: str | pathlib.Path | None = None, *,
             x: str = "env_steps") -> pathlib.Path:
    """Write ``curves.png`` in ``run_dir`` (or ``out``): `plot_runs` of this one run; returns its path.

    The lag histogram counts chunks by policy lag from ``summary.json``
    (written when a run finishes); for an unfinished run it falls back to
    each update's maximum lag.
    """
    run_dir = pathlib.Path(run_dir)
    return plot_runs([run_dir], run_dir / "curves.png" if out is None else out, x=x)
