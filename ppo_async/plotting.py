"""Figures of a run directory: the learning curve and the policy-lag histogram."""

from __future__ import annotations

import io
import json
import math
import pathlib

from ppo_async.run_dir import metrics_lines, write_atomically


def read_metrics(run_dir: str | pathlib.Path) -> list[dict[str, float]]:
    """The per-update metrics of a run (``metrics.jsonl``), in order; ``null`` becomes NaN.

    Raises FileNotFoundError if there is no ``metrics.jsonl`` or it holds no
    update yet.
    """
    path = pathlib.Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics; is {run_dir} a run directory?")
    records = [{k: math.nan if v is None else v for k, v in record.items()}
               for _, record in metrics_lines(path)]
    if not records:
        raise FileNotFoundError(f"{path}: no update recorded yet; plot again once the run has made one")
    return records


def plot_run(run_dir: str | pathlib.Path, out: str | pathlib.Path | None = None) -> pathlib.Path:
    """Write ``curves.png`` (return vs env steps, and the policy-lag histogram); returns its path.

    The histogram counts chunks by policy lag from ``summary.json`` (written
    when a run finishes); for an unfinished run it falls back to each
    update's maximum lag.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError("plotting needs matplotlib: pip install 'ppo-async[plot]'") from error

    run_dir = pathlib.Path(run_dir)
    metrics = read_metrics(run_dir)
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        counts = {int(k): v for k, v in json.loads(summary_path.read_text())["policy_lag_counts"].items()}
        lag_label = "chunks"
    else:
        counts = {}
        for m in metrics:
            counts[int(m["policy_lag_max"])] = counts.get(int(m["policy_lag_max"]), 0) + 1
        lag_label = "updates (max lag of each)"

    fig, (curve, hist) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [m["env_steps"] for m in metrics]
    curve.plot(steps, [m["episode_return"] for m in metrics], label="training (last 100 episodes)")
    evals = [(m["env_steps"], m["eval_return_mean"]) for m in metrics if "eval_return_mean" in m]
    if evals:
        curve.plot(*zip(*evals), "o-", label="greedy evaluation")
    curve.set_xlabel("env steps")
    curve.set_ylabel("episode return")
    curve.set_title(run_dir.name)
    curve.legend()
    lags = sorted(counts)
    hist.bar(lags, [counts[lag] for lag in lags])
    hist.set_xticks(lags)
    hist.set_xlabel("policy lag (learner updates)")
    hist.set_ylabel(lag_label)
    hist.set_title("policy lag of consumed experience")
    fig.tight_layout()
    out = pathlib.Path(out) if out is not None else run_dir / "curves.png"
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    plt.close(fig)
    return write_atomically(out, image.getvalue())
