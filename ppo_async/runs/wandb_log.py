"""Weights & Biases logging of a run: its config, each update's metrics, its figures.

Optional (``pip install 'ppo-async[wandb]'``): wandb is imported only when a
run asks for it, with ``train(cfg, wandb=WandbSettings(project="..."))`` or
``ppo-async train --wandb-project NAME``. Logging options are not algorithm
config, so they are an argument of `train`, not fields of
`AsyncActorLearnerConfig`.

What is logged, by `ppo_async.runs.run_log.RunLog`:

- at the start, the config (``config.to_dict()``) as the W&B run's config;
- every update, the same scalars under the same names as ``metrics.jsonl``,
  at W&B step ``env_steps``; each periodic evaluation's ``eval_*`` values at
  the step of the update logged last (``eval_policy_version`` names the update
  evaluated);
- at the end, with a run directory, the run's figure (``curves.png``, from
  `ppo_async.runs.plotting`) as the image ``curves``.

Without an account or a network, ``WANDB_MODE=offline`` (or
``WandbSettings(mode="offline")``) writes the run under
``RUN_DIR/wandb/offline-run-*`` for a later ``wandb sync``. A resumed run
(``--resume``) logs as a new W&B run named after its run directory and the
update it starts from.
"""

from __future__ import annotations

import logging
import math
import pathlib
from typing import Any, NamedTuple

from ppo_async.config import ConfigError
from ppo_async.runs.run_dir import METRICS_FILE

logger = logging.getLogger(__name__)


class WandbSettings(NamedTuple):
    """Where and how a run logs to Weights & Biases (arguments of ``wandb.init``)."""

    project: str  # the W&B project
    entity: str | None = None  # team or user; None: the logged-in user's default
    group: str | None = None  # e.g. the seeds of one experiment
    tags: tuple[str, ...] = ()
    name: str | None = None  # the W&B run name; None: the run directory's name
    mode: str | None = None  # "online", "offline" or "disabled"; None: WANDB_MODE, else online
    dir: str | None = None  # where wandb writes its files; None: the run directory (else wandb's default)


def import_wandb():
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "wandb: not installed; logging to Weights & Biases needs pip install 'ppo-async[wandb]'"
        ) from None
    return wandb


class WandbRun:
    """One W&B run fed by `RunLog`: ``log(metrics)`` per update, ``finish()`` at the end."""

    def __init__(self, settings: WandbSettings, config_fields: dict[str, Any],
                 run_dir: pathlib.Path | None, start_update: int = 0):
        self.wandb = import_wandb()
        self.run_dir = run_dir
        self.step = 0
        name = settings.name
        if name is None and run_dir is not None:
            name = run_dir.name if start_update == 0 else f"{run_dir.name}-from-{start_update}"
        directory = settings.dir or (str(run_dir) if run_dir is not None else None)
        try:
            self.run = self.wandb.init(
                project=settings.project, entity=settings.entity, group=settings.group,
                tags=list(settings.tags) or None, name=name, mode=settings.mode, dir=directory,
                config=config_fields,
            )
        except self.wandb.Error as error:  # e.g. no API key, online
            message = " ".join(str(error).split())
            raise ConfigError(
                f"wandb: {message}; log in with `wandb login`, or set WANDB_MODE=offline"
            ) from None

    def log(self, metrics: dict[str, Any]) -> None:
        self.step = int(metrics["env_steps"])
        # NaN (e.g. the return before the first episode ends) is dropped, as
        # metrics.jsonl writes it as null: a missing point, not a zero.
        self.run.log({k: float(v) for k, v in metrics.items()
                      if not (isinstance(v, float) and math.isnan(v))}, step=self.step)

    def log_evaluation(self, metrics: dict[str, Any]) -> None:
        """The ``eval_*`` values of one periodic evaluation, at the newest update's step.

        W&B drops a point logged at a step below the last one, and an
        evaluation arrives updates after the one it evaluated; its
        ``eval_policy_version`` names that update.
        """
        self.run.log({k: float(v) for k, v in metrics.items() if k.startswith("eval_")},
                     step=max(self.step, int(metrics["env_steps"])))

    def finish(self, exit_code: int = 0) -> None:
        """Log the run's figure (with a run directory that holds metrics) and close the W&B run.

        A nonzero ``exit_code`` (the run raised, or was interrupted) marks the W&B run failed.
        """
        try:
            if self.run_dir is not None and (self.run_dir / METRICS_FILE).is_file():
                from ppo_async.runs.plotting import plot_run

                # Into the W&B run's own files (uploaded with it); not into the run directory.
                figure = plot_run(self.run_dir, out=pathlib.Path(self.run.dir) / "curves.png")
                self.run.log({"curves": self.wandb.Image(str(figure))}, step=self.step)
        except Exception:  # noqa: BLE001 - a figure must not fail a finished run
            logger.warning("could not log the run's figure to W&B", exc_info=True)
        finally:
            self.run.finish(exit_code=exit_code)
