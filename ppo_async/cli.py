"""``ppo-async``: the command line. Options come from the config dataclass (tyro)."""

from __future__ import annotations

import datetime
import pathlib
import sys
from typing import Annotated

import tyro

from ppo_async.config import AsyncActorLearnerConfig, ConfigError


def train_command(
    config: Annotated[AsyncActorLearnerConfig, tyro.conf.arg(name="")],
    run_root: pathlib.Path = pathlib.Path("runs"),
    progress: bool = True,
) -> None:
    """Train with asynchronous actors; writes runs/<env>-<time>/ (config.json, metrics.jsonl, params.msgpack)."""
    from ppo_async.train import train

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = run_root / f"{config.env_id}-{stamp}"
    report = train(config, run_dir=run_dir, progress=progress).report
    print(
        f"final return {report.episode_return_mean:.1f} (mean of the last 100 episodes) | "
        f"{report.env_steps} env steps in {report.wall_time_s:.1f} s "
        f"({report.env_steps_per_s:.0f} steps/s) | policy lag mean "
        f"{report.policy_lag_mean:.2f} max {report.policy_lag_max} | learner waited "
        f"{report.learner_wait_s:.1f} s"
    )
    print(f"run directory: {run_dir}")


def main(argv: list[str] | None = None) -> None:
    try:
        tyro.extras.subcommand_cli_from_dict(
            {"train": train_command}, prog="ppo-async", args=argv
        )
    except ConfigError as error:
        print(f"ppo-async: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
