"""``ppo-async``: the command line. Options come from the config dataclass (tyro).

    ppo-async train [--FIELD VALUE ...] [--resume RUN_DIR]
    ppo-async eval RUN_DIR [--num-episodes N]
    ppo-async plot RUN_DIR
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import sys
from typing import Annotated, Any

import tyro

from ppo_async.config import AsyncActorLearnerConfig, ConfigError

ConfigArg = Annotated[AsyncActorLearnerConfig, tyro.conf.arg(name="")]


def load_run_config(run_dir: pathlib.Path) -> AsyncActorLearnerConfig:
    """The config a run directory was trained with (its ``config.json``)."""
    path = pathlib.Path(run_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"run_dir={str(run_dir)!r}: no config.json there; is it a run directory?")
    fields = json.loads(path.read_text())
    known = {f.name for f in dataclasses.fields(AsyncActorLearnerConfig)}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items() if k in known}
    return AsyncActorLearnerConfig(**fields)


def load_run_params(run_dir: pathlib.Path, config: AsyncActorLearnerConfig) -> Any:
    """A run's final ``params.msgpack``, or the params of its newest checkpoint."""
    import flax.serialization
    import jax

    from ppo_async.actor import make_actor_program
    from ppo_async.learner import init_learner_state
    from ppo_async.train import load_resume_point

    program = make_actor_program(config)
    final = pathlib.Path(run_dir) / "params.msgpack"
    if final.is_file():
        return flax.serialization.from_bytes(program.params_template, final.read_bytes())
    # An unfinished run: the params of its newest valid checkpoint.
    template = init_learner_state(config, program.params_template, jax.random.key(0))
    return load_resume_point(config, program, pathlib.Path(run_dir), template).state.params


def train_command(
    config: ConfigArg,
    resume: pathlib.Path | None = None,
    run_root: pathlib.Path = pathlib.Path("runs"),
    progress: bool = True,
) -> None:
    """Train with asynchronous actors; writes runs/<env>-<time>/ (config.json, metrics.jsonl, params.msgpack, checkpoints/).

    With --resume RUN_DIR the run continues from its newest checkpoint, with
    that run's config.json as the defaults (flags given here override it).
    """
    from ppo_async.train import train

    if resume is not None:
        run_dir = resume
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = run_root / f"{config.env_id.replace(':', '_')}-{stamp}"
    report = train(config, run_dir=run_dir, resume_from=resume, progress=progress).report
    print(
        f"final return {report.episode_return_mean:.1f} (mean of the last 100 episodes) | "
        f"{report.env_steps} env steps in {report.wall_time_s:.1f} s "
        f"({report.env_steps_per_s:.0f} steps/s) | policy lag mean "
        f"{report.policy_lag_mean:.2f} max {report.policy_lag_max} | learner waited "
        f"{report.learner_wait_s:.1f} s"
    )
    print(f"run directory: {run_dir}")


def eval_command(
    run_dir: tyro.conf.Positional[pathlib.Path],
    num_episodes: int = 20,
    seed: int = 0,
    greedy: bool = True,
) -> None:
    """Evaluate a saved run's final params (greedy actions by default)."""
    from ppo_async.evaluate import evaluate

    config = load_run_config(run_dir)
    params = load_run_params(run_dir, config)
    result = evaluate(config, params, num_episodes=num_episodes, seed=seed, greedy=greedy)
    print(
        f"{config.env_id}: return {result.mean_return:.1f} +- {result.std_return:.1f} over "
        f"{num_episodes} episodes ({'greedy' if greedy else 'sampled'} actions, seed {seed})"
    )


def plot_command(run_dir: tyro.conf.Positional[pathlib.Path]) -> None:
    """Draw a run's learning curve and policy-lag histogram to RUN_DIR/curves.png."""
    from ppo_async.plotting import plot_run

    print(f"wrote {plot_run(run_dir)}")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        commands = {"train": train_command, "eval": eval_command, "plot": plot_command}
        if argv[:1] == ["train"] and "--resume" in argv:
            # Resuming: the run's own config.json supplies the defaults.
            base = load_run_config(pathlib.Path(argv[argv.index("--resume") + 1]))

            def resume_command(
                config: ConfigArg = base,
                resume: pathlib.Path | None = None,
                run_root: pathlib.Path = pathlib.Path("runs"),
                progress: bool = True,
            ) -> None:
                train_command(config, resume, run_root, progress)

            resume_command.__doc__ = train_command.__doc__
            commands["train"] = resume_command
        tyro.extras.subcommand_cli_from_dict(commands, prog="ppo-async", args=argv)
    except ConfigError as error:
        print(f"ppo-async: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
