"""What one run records, in the process `run_peers.py` starts for it (any library's venv).

Standard library only, so that it imports in every peer's venv (torch is imported
where it is used). A run's child marks ``(seconds since it started, env steps)``
once per update, after the update's env steps were trained on (`Recorder.mark`),
and ends by writing `Recorder.result` as JSON to the path ``--result`` names;
`run_peers.py` turns the marks into a steady rate.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

# The figure cleanrl reports: the mean undiscounted return of the last 100 training episodes.
LAST_EPISODES = 100


def parse_args(argv: Sequence[str] | None = None, **extra: Any) -> argparse.Namespace:
    """The arguments every child takes; ``extra`` adds more (name=default)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--result", required=True, help="where the run's JSON result goes")
    parser.add_argument("--env", required=True, help="gymnasium id, e.g. Hopper-v5")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--total-env-steps", type=int, required=True)
    parser.add_argument("--torch-threads", choices=("1", "default"), required=True)
    for name, default in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", default=default)
    return parser.parse_args(argv)


def set_torch_threads(setting: str) -> int:
    """``"1"``: torch's intra-op pool at one thread; ``"default"``: as torch starts. The count."""
    import torch

    if setting == "1":
        torch.set_num_threads(1)
    return torch.get_num_threads()


def mean_of_last(returns: Iterable[float], count: int = LAST_EPISODES) -> float:
    """The mean of the last ``count`` finite returns (NaN if none)."""
    last = [float(r) for r in returns][-count:]
    return sum(last) / len(last) if last else math.nan


def versions(packages: Sequence[str]) -> dict[str, str]:
    """The installed version of each package (``"not installed"`` if it is not)."""
    found = {}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


class Recorder:
    """Marks ``(seconds since this Recorder was made, env steps)`` and episodes' returns."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.marks: list[tuple[float, int]] = []
        self.returns: list[float] = []

    def mark(self, env_steps: int) -> None:
        self.marks.append((time.perf_counter() - self.start, int(env_steps)))

    def episode(self, episode_return: float) -> None:
        self.returns.append(float(episode_return))

    def result(self, library: str, packages: Sequence[str], final_return: float | None = None,
               **extra: Any) -> dict[str, Any]:
        """The JSON result; ``final_return`` defaults to the mean of the last 100 returns seen."""
        return {
            "library": library,
            "marks": self.marks,
            "env_steps": self.marks[-1][1] if self.marks else 0,
            "episodes": len(self.returns),
            "final_return": mean_of_last(self.returns) if final_return is None else final_return,
            "wall_time_s": time.perf_counter() - self.start,
            "versions": versions(packages),
            "pid": os.getpid(),
            **extra,
        }


def write_result(path: str, result: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(result, f)
