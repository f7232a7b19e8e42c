"""``ppo-async``: the command line. Options come from the config dataclass (tyro).

    ppo-async train [--FIELD VALUE ...] [--resume RUN_DIR]
    ppo-async eval RUN_DIR [--num-episodes N]
    ppo-async plot RUN_DIR

Every error a user can cause (a bad flag value, a missing or damaged run
directory, nothing to resume) is one line on stderr with the fix, exit code
2. A run that fails while training (an actor raised, a stuck env, NaN) prints
one line, keeps the traceback in ``RUN_DIR/error.txt`` and exits with 1;
Ctrl-C prints the update reached and the resume command and exits with 130.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import sys
import traceback
from typing import Annotated, Any

import tyro

from ppo_async.config import AsyncActorLearnerConfig, ConfigError

ConfigArg = Annotated[AsyncActorLearnerConfig, tyro.conf.arg(name="")]


def load_run_config(run_dir: pathlib.Path) -> AsyncActorLearnerConfig:
    """The config a run directory was trained with (its ``config.json``)."""
    path = pathlib.Path(run_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"run_dir={str(run_dir)!r}: no config.json there; is it a run directory?")
    try:
        fields = json.loads(path.read_text())
    except ValueError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: expected a JSON object of config fields")
    known = {f.name for f in dataclasses.fields(AsyncActorLearnerConfig)}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items() if k in known}
    return AsyncActorLearnerConfig(**fields)


def load_run_params(run_dir: pathlib.Path, config: AsyncActorLearnerConfig) -> Any:
    """A run's final ``params.msgpack``, or the params of its newest valid checkpoint."""
    import flax.serialization

    from ppo_async.actor import make_actor_program
    from ppo_async.resume import load_newest_checkpoint
    from ppo_async.run_dir import PARAMS_FILE, checkpoint_dir

    program = make_actor_program(config)
    final = pathlib.Path(run_dir) / PARAMS_FILE
    if final.is_file():
        return flax.serialization.from_bytes(program.params_template, final.read_bytes())
    # An unfinished run: the params of its newest valid checkpoint.
    loaded = load_newest_checkpoint(config, program, checkpoint_dir(pathlib.Path(run_dir)))
    return loaded.state["learner"].params


def _new_run_dir(run_root: pathlib.Path, env_id: str) -> pathlib.Path:
    from ppo_async.run_dir import unique_run_dir

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return unique_run_dir(run_root, f"{env_id.replace(':', '_')}-{stamp}")


def _train(config: AsyncActorLearnerConfig, run_dir: pathlib.Path, resume: pathlib.Path | None,
           progress: bool) -> None:
    from ppo_async.actor import ActorError
    from ppo_async.learner import LearnerTimeoutError, NonFiniteError
    from ppo_async.run_dir import write_atomically
    from ppo_async.train import ShutdownTimeoutError, train

    try:
        report = train(config, run_dir=run_dir, resume_from=resume, progress=progress).report
    except ConfigError:
        if resume is None and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()  # made for this run, which never started
        raise
    except (ActorError, LearnerTimeoutError, NonFiniteError, ShutdownTimeoutError) as error:
        log = write_atomically(run_dir / "error.txt", traceback.format_exc().encode())
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        resumable = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
        print(
            f"ppo-async: {type(error).__name__}: {first_line} (traceback in {log})"
            + (f"; resume with: ppo-async train --resume {run_dir}" if resumable else ""),
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    segment = (
        f" ({report.segment_env_steps} in this segment, from update {report.start_update})"
        if report.start_update else ""
    )
    print(
        f"final return {report.episode_return_mean:.1f} (mean of the last 100 episodes) | "
        f"{report.env_steps} env steps{segment}, {report.wall_time_s:.1f} s of training "
        f"({report.env_steps_per_s:.0f} steps/s) | policy lag mean "
        f"{report.policy_lag_mean:.2f} max {report.policy_lag_max} | learner waited "
        f"{report.learner_wait_s:.1f} s"
    )
    print(f"run directory: {run_dir}")


def train_command(
    config: ConfigArg,
    run_root: pathlib.Path = pathlib.Path("runs"),
    progress: bool = True,
) -> None:
    """Train with asynchronous actors; writes a new runs/<env>-<time>/ (config.json, segments.json, metrics.jsonl, checkpoints/, params.msgpack, summary.json).

    With --resume RUN_DIR the run continues from its newest checkpoint, with
    that run's config.json as the defaults (flags given here override it).
    """
    _train(config, _new_run_dir(run_root, config.env_id), None, progress)


def eval_command(
    run_dir: tyro.conf.Positional[pathlib.Path],
    num_episodes: int = 20,
    seed: int = 0,
    greedy: bool = True,
) -> None:
    """Evaluate a saved run's final params, or its newest checkpoint's (greedy actions by default)."""
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


def _take_resume(argv: list[str]) -> tuple[pathlib.Path | None, list[str]]:
    """``--resume DIR`` or ``--resume=DIR`` taken out of ``argv``: (DIR or None, the rest)."""
    resume, rest = None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--resume" or arg.startswith("--resume="):
            if resume is not None:
                raise ConfigError("--resume: given twice; name one run directory")
            if arg == "--resume":
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ConfigError(
                        "--resume needs a run directory: ppo-async train --resume runs/NAME"
                    )
                value, i = argv[i + 1], i + 2
            else:
                value, i = arg.split("=", 1)[1], i + 1
            if not value:
                raise ConfigError("--resume needs a run directory: ppo-async train --resume=runs/NAME")
            resume = pathlib.Path(value)
            continue
        rest.append(arg)
        i += 1
    return resume, rest


def _commands(argv: list[str]) -> dict[str, Any]:
    """The subcommands; for ``train --resume DIR`` a train whose defaults are that run's config."""
    commands = {"train": train_command, "eval": eval_command, "plot": plot_command}
    if argv[:1] == ["train"]:
        resume, argv[:] = _take_resume(argv)
        if resume is not None:
            base = load_run_config(resume)

            def resume_command(config: ConfigArg = base, progress: bool = True) -> None:
                _train(config, resume, resume, progress)

            resume_command.__doc__ = train_command.__doc__
            commands["train"] = resume_command
    return commands


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    from ppo_async.checkpoint import CheckpointError
    from ppo_async.envs import UnknownEnvError
    from ppo_async.host_envs import BackendNotInstalledError, HostEnvError
    from ppo_async.policy_io import PolicyLoadError

    try:
        commands = _commands(argv)
        tyro.extras.subcommand_cli_from_dict(commands, prog="ppo-async", args=argv)
    except KeyboardInterrupt as interrupt:
        # train() raises TrainingInterrupted, whose message names the update and the resume command.
        print(f"\nppo-async: {interrupt or 'interrupted'}", file=sys.stderr)
        raise SystemExit(130) from None
    except ConfigError as error:
        print(f"ppo-async: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except (CheckpointError, PolicyLoadError, FileNotFoundError, UnknownEnvError,
            HostEnvError, BackendNotInstalledError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"ppo-async: {message}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
