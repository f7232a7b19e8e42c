"""``ppo-async``: the command line. Options come from the config dataclass (tyro).

    ppo-async train [--preset NAME] [--config FILE] [--FIELD VALUE ...] [--wandb-project P]
    ppo-async train --resume RUN_DIR [--FIELD VALUE ...]
    ppo-async eval RUN_DIR [--num-episodes N]
    ppo-async enjoy RUN_DIR [--episodes 3] [--out video.gif|video.mp4]
    ppo-async plot RUN_DIR|SWEEP_DIR [...] [--x env_steps|wall_time] [--out FILE]
    ppo-async sweep SWEEP_FILE --out DIR [--workers N] [--backend local|ray] [--twin] [--dry-run]
    ppo-async pbt PBT_FILE --out DIR [--ray-address ADDR] [--cpus-per-member C]
    ppo-async --version

A train's config is built in this order, each step overriding the one
before: the dataclass defaults < ``--preset NAME`` (`ppo_async.presets`) <
``--config FILE`` (TOML, or YAML with pyyaml installed) < ``--FIELD VALUE``
flags. With ``--resume`` the run's own ``config.json`` takes the place of
preset and file. ``--env-module MODULE`` (``env_modules``) names modules that
register custom envs; the current directory is on ``sys.path`` (as with
``python -m``), and config.json records them, so ``eval``, ``enjoy`` and
``--resume`` of such a run need no flag.

Exit codes (docs/reliability.md has them in one table): 0 done; 1 the run
failed; 2 bad input or a refused command; 130 interrupted. Every error a user
can cause (a bad flag value, a misspelled flag, a missing or damaged run
directory, nothing to resume, a run directory another process is writing) is
one line on stderr with the fix, exit code 2; tyro's parse errors are
condensed to one line that keeps its suggestion (`one_line_parse_error`). A
run that fails while training (an actor raised, a stuck env, NaN, a write the
disk refused) prints one line, keeps the traceback in ``RUN_DIR/error.txt``
and exits with 1; Ctrl-C prints the update reached and the resume command and
exits with 130. Warnings (a skipped checkpoint, a damaged metrics line) are
one line each, ``ppo-async: warning: ...``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import io
import math
import os
import pathlib
import re
import sys
import traceback
import warnings
from typing import Annotated, Any, Literal

import tyro

from ppo_async._deprecated import moved_name_getattr
from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.errors import one_line
from ppo_async.presets import PRESETS, load_config_file, preset
from ppo_async.version import __version__

# load_run_config and load_run_params moved to ppo_async.resume: the old names warn for a release.
__getattr__ = moved_name_getattr("ppo_async.tools.cli", globals())

ConfigArg = Annotated[AsyncActorLearnerConfig, tyro.conf.arg(name="")]
PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
# tyro would list None among the choices of an optional Literal.
PRESET_METAVAR = "{" + ",".join(PRESETS) + "}"


@dataclasses.dataclass(frozen=True)
class _CliConfig(AsyncActorLearnerConfig):
    """The config's fields as ``train`` flags: ``env_modules`` is ``--env-module MODULE ...``."""

    env_modules: Annotated[tuple[str, ...], tyro.conf.arg(
        name="env-module", metavar="MODULE [MODULE ...]")] = ()
    """Python modules imported before the env id is looked up (they register custom envs); recorded in config.json so eval, enjoy, --resume and sweeps rebuild the env. ppo-async puts the current directory on sys.path (as python -m does), so a my_envs.py beside you imports as --env-module my_envs."""


@dataclasses.dataclass(frozen=True)
class _UnsetLeadConfig(_CliConfig):
    """The config's fields as ``train`` flags when ``max_lead_steps`` is unset.

    tyro would print "default: None"; the help says what an unset lead
    becomes (`AsyncActorLearnerConfig.lead_steps`).
    """

    max_lead_steps: Annotated[int | None, tyro.conf.arg(
        help_behavior_hint="(default: (exact_policy_lag + broadcast_every) * num_steps; "
                           "free-running: 2 * num_steps * broadcast_every)")] = None


def _as_config(config: AsyncActorLearnerConfig,
               config_type: type = AsyncActorLearnerConfig) -> AsyncActorLearnerConfig:
    """``config``'s values as a ``config_type``."""
    return config_type(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})


def _new_run_dir(run_root: pathlib.Path, env_id: str) -> pathlib.Path:
    from ppo_async.runs.run_dir import unique_run_dir

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return unique_run_dir(run_root, f"{env_id.replace(':', '_')}-{stamp}")


ROUNDING_NOTE_FRACTION = 0.01  # a budget rounded down by this share or more is noted


def _rounding_note(config: AsyncActorLearnerConfig) -> str | None:
    """What the run leaves out of ``total_env_steps`` by training whole batches, where it
    is at least `ROUNDING_NOTE_FRACTION` of the budget (the default's 288 of 500,000 is
    not worth a line: the report gives the count); None otherwise."""
    trained = config.num_updates * config.batch_size
    if config.total_env_steps - trained < ROUNDING_NOTE_FRACTION * config.total_env_steps:
        return None
    return (f"ppo-async: note: total_env_steps={config.total_env_steps} is not a whole number "
            f"of batches of {config.batch_size} env steps (num_actors * envs_per_actor * "
            f"num_steps): the run trains {config.num_updates} updates, {trained} env steps")


def _train(config: AsyncActorLearnerConfig, run_dir: pathlib.Path, resume: pathlib.Path | None,
           progress: bool, wandb: Any = None) -> None:
    from ppo_async.runs.checkpoint import list_checkpoints
    from ppo_async.runs.run_dir import ERROR_FILE, RunFileError, checkpoint_dir, write_atomically
    from ppo_async.runtime.actor import ActorError
    from ppo_async.runtime.learner import LearnerTimeoutError, NonFiniteError
    from ppo_async.train import ShutdownTimeoutError, train

    note = _rounding_note(config)
    if resume is None and note is not None:
        print(note, file=sys.stderr)
    try:
        report = train(config, run_dir=run_dir, resume_from=resume, progress=progress,
                       wandb=wandb).report
    except (ActorError, LearnerTimeoutError, NonFiniteError, ShutdownTimeoutError,
            OSError) as error:  # OSError: a full disk, say (a RunFileError names the file)
        try:
            log = write_atomically(run_dir / ERROR_FILE, traceback.format_exc().encode())
            kept = f"traceback in {log}"
        except OSError as unwritable:  # the disk that failed the run may refuse this too
            kept = f"no traceback kept: {unwritable}"
        said = one_line(error) or type(error).__name__
        if not isinstance(error, RunFileError):  # its message says what it is
            said = f"{type(error).__name__}: {said}"
        resumable = bool(list_checkpoints(checkpoint_dir(run_dir)))
        print(
            f"ppo-async: {said} ({kept})"
            + (f"; resume with: ppo-async train --resume {run_dir}" if resumable else ""),
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    finally:
        # train() writes nothing before every check has passed: an empty directory was
        # made for a run that was refused (or stopped before it began).
        if resume is None and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()
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


def _wandb_settings(project: str | None, entity: str | None, group: str | None,
                    tags: tuple[str, ...]):
    """`WandbSettings` from the train flags; None without ``--wandb-project``."""
    from ppo_async.runs.wandb_log import WandbSettings, import_wandb

    if project is None:
        given = [flag for flag, value in (("--wandb-entity", entity), ("--wandb-group", group),
                                          ("--wandb-tags", tags)) if value]
        if given:
            raise ConfigError(f"{given[0]} needs --wandb-project NAME (W&B logs only with a project)")
        return None
    import_wandb()  # before a run directory is made: a missing wandb is a one-line error
    return WandbSettings(project=project, entity=entity, group=group, tags=tuple(tags))


def _make_train_command(base: AsyncActorLearnerConfig, resume: pathlib.Path | None):
    """The ``train`` subcommand, its config defaults ``base`` (flags given override them)."""
    # A lead given (a resumed run's own, say) is a number, and --help shows it.
    config_type = _UnsetLeadConfig if base.max_lead_steps is None else _CliConfig

    def train_command(
        config: ConfigArg = _as_config(base, config_type),
        run_root: pathlib.Path = pathlib.Path("runs"),
        progress: bool = True,
        preset: Annotated[PresetName | None, tyro.conf.arg(metavar=PRESET_METAVAR)] = None,
        config_file: Annotated[pathlib.Path | None,
                               tyro.conf.arg(name="config", metavar="FILE")] = None,
        resume_dir: Annotated[pathlib.Path | None,
                              tyro.conf.arg(name="resume", metavar="RUN_DIR")] = None,
        wandb_project: Annotated[str | None, tyro.conf.arg(metavar="NAME")] = None,
        wandb_entity: Annotated[str | None, tyro.conf.arg(metavar="ENTITY")] = None,
        wandb_group: Annotated[str | None, tyro.conf.arg(metavar="GROUP")] = None,
        wandb_tags: tuple[str, ...] = (),
        dry_run: bool = False,
    ) -> None:
        """Train with asynchronous actors; writes a new runs/<env>-<time>/ (config.json, segments.json, metrics.jsonl, checkpoints/, params.msgpack, summary.json).

        Config precedence: defaults < --preset NAME < --config FILE < --FIELD flags.
        With --resume RUN_DIR the run continues from its newest checkpoint, with
        that run's config.json as the defaults (flags given here override it).

        Args:
            config: Every field of the run's config.
            run_root: A new run directory is made under it (not with --resume).
            progress: Show a progress bar (on a terminal; a plain line every 30 s and one at the end when stderr is a file or a pipe).
            preset: A named config (ppo_async.presets), e.g. the README's learning-results runs.
            config_file: A TOML file (or YAML, with pyyaml installed) of config field = value lines, applied over the preset.
            resume_dir: Continue this run directory from its newest checkpoint, with its config.json as the defaults (no --preset or --config with it).
            wandb_project: Also log to this Weights & Biases project (pip install 'ppo-async[wandb]'; WANDB_MODE=offline works without an account).
            wandb_entity: The W&B entity (team or user); default: yours.
            wandb_group: The W&B group, e.g. one experiment's seeds.
            wandb_tags: W&B tags of the run.
            dry_run: Print the layout the run would collect experience with (measuring the env where 'auto' needs it) and exit: no training, no run directory.
        """
        del preset, config_file, resume_dir  # applied to ``base`` before parsing (see _commands)
        config = _as_config(config)
        if dry_run:
            from ppo_async.runtime.layout import resolve_layout

            print(f"layout: {resolve_layout(config).describe()}")
            return
        wandb = _wandb_settings(wandb_project, wandb_entity, wandb_group, wandb_tags)
        if resume is not None:
            _train(config, resume, resume, progress, wandb)
        else:
            _train(config, _new_run_dir(run_root, config.env_id), None, progress, wandb)

    train_command.__annotations__["config"] = Annotated[config_type, tyro.conf.arg(name="")]
    return train_command


def _check_count(flag: str, value: int) -> None:
    if isinstance(value, bool) or value < 1:
        raise ConfigError(f"{flag} {value}: must be an integer >= 1")


def _check_seed(seed: int) -> None:
    if seed < 0:  # the config's seed is >= 0 too; host envs' numpy seeding refuses one below
        raise ConfigError(f"--seed {seed}: must be an integer >= 0")


def eval_command(
    run_dir: tyro.conf.Positional[pathlib.Path],
    num_episodes: Annotated[int, tyro.conf.arg(aliases=("--episodes",))] = 20,
    seed: int = 0,
    greedy: bool = True,
) -> None:
    """Evaluate a saved run's final params, or its newest checkpoint's (greedy actions by default).

    Prints the mean and spread of the episode returns.

    Args:
        run_dir: The run directory (ppo-async train wrote it).
        num_episodes: Whole episodes to play and average over.
        seed: Seeds the env resets (and the actions, with --no-greedy).
        greedy: Take the most likely action (the mode of the policy); --no-greedy samples.
    """
    from ppo_async.resume import load_run_config, load_run_params
    from ppo_async.runtime.evaluate import evaluate

    _check_count("--num-episodes", num_episodes)
    _check_seed(seed)
    config = load_run_config(run_dir)
    params = load_run_params(run_dir, config)
    result = evaluate(config, params, num_episodes=num_episodes, seed=seed, greedy=greedy)
    print(
        f"{config.env_id}: return {result.mean_return:.1f} +- {result.std_return:.1f} over "
        f"{num_episodes} episodes ({'greedy' if greedy else 'sampled'} actions, seed {seed})"
    )


def enjoy_command(
    run_dir: tyro.conf.Positional[pathlib.Path],
    episodes: Annotated[int, tyro.conf.arg(aliases=("--num-episodes",))] = 3,
    out: pathlib.Path = pathlib.Path("video.gif"),
    seed: int = 0,
    fps: float = 30.0,
    progress: bool = True,
) -> None:
    """Watch a saved run: play greedy episodes with its final params (or newest checkpoint's) and write them as a video.

    Renders gymnax envs that gymnax can draw (classic control such as
    CartPole-v1, the MinAtar games, Catch), gymnasium: and envpool: envs
    made with render_mode="rgb_array" (envpool Atari games with the evaluation
    settings: whole games, sticky actions), and host: envs whose batch has
    render(). Any other env, another file type, or a renderer that fails is
    refused with a one-line error. Without a display, headless backends are
    used (SDL_VIDEODRIVER=dummy; MUJOCO_GL=egl, else osmesa) unless set.
    Needs pip install 'ppo-async[video]' (imageio; pygame for classic
    control; imageio-ffmpeg for .mp4).

    Args:
        run_dir: The run directory (ppo-async train wrote it).
        episodes: Episodes to play, one after another in the video.
        out: The video to write: .gif or .mp4.
        seed: Seeds the env resets.
        fps: Frames per second of the video.
        progress: Show progress bars of the frames played, drawn and written (on a terminal).
    """
    from ppo_async.resume import load_run_config, load_run_params
    from ppo_async.tools.video import (
        check_video_path,
        record_episodes,
        use_headless_backends,
        write_video,
    )

    use_headless_backends()  # before loading the run can import pygame or MuJoCo
    _check_count("--episodes", episodes)
    _check_seed(seed)
    if not (math.isfinite(fps) and fps > 0):
        raise ConfigError(f"--fps {fps}: must be a finite number > 0")
    check_video_path(out)  # before any loading: a wrong suffix fails at once
    config = load_run_config(run_dir)
    params = load_run_params(run_dir, config)
    recording = record_episodes(config, params, num_episodes=episodes, seed=seed,
                                progress=progress)
    write_video(recording.frames, out, fps=fps, progress=progress)
    returns = ", ".join(f"{r:.1f}" for r in recording.episode_returns)
    print(f"wrote {out}: {episodes} greedy episode(s) of {config.env_id}, returns {returns}, "
          f"{len(recording.frames)} frames")


def plot_command(
    run_dirs: tyro.conf.Positional[tuple[pathlib.Path, ...]],
    x: Literal["env_steps", "wall_time"] = "env_steps",
    out: pathlib.Path | None = None,
) -> None:
    """Draw runs' curves (return, losses, entropy, KL, clip fraction, steps/s, policy lag) and a lag histogram.

    Runs whose configs differ only by seed are drawn as one group: the mean
    over seeds with a 95% bootstrap band. A sweep directory (ppo-async
    sweep) stands for its run directories: its grid points overlaid, seeds
    grouped. One run or one sweep: RUN_DIR/curves.png by default; several:
    --out FILE (default runs_overview.png here). Of several, a run with no
    update recorded yet is skipped with a note.

    Args:
        run_dirs: Run directories (or sweep directories) to overlay.
        x: Horizontal axis: env steps, or wall-clock seconds of training.
        out: The PNG to write.
    """
    from ppo_async.runs.analysis import expand_sweep_dirs
    from ppo_async.runs.plotting import plot_runs

    if not run_dirs:
        raise ConfigError("plot needs at least one run directory: ppo-async plot runs/NAME")
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            what = "is not a directory" if run_dir.exists() else "no such directory"
            raise ConfigError(f"run_dir={str(run_dir)!r}: {what}; give a run directory that "
                              "ppo-async train wrote (runs/<env>-<time>) or a sweep's directory")
    if out is None:
        out = run_dirs[0] / "curves.png" if len(run_dirs) == 1 else pathlib.Path("runs_overview.png")
    run_dirs = tuple(expand_sweep_dirs(run_dirs))
    runs = _runs_with_data(run_dirs)  # a damaged metrics.jsonl line: a warning (main's one line)
    print(f"wrote {plot_runs(runs, out, x=x)}")


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` inside `main`: one line, without Python's source line."""
    print(f"ppo-async: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _runs_with_data(run_dirs: tuple[pathlib.Path, ...]) -> list:
    """The `ppo_async.runs.analysis.Run` of each directory that has an update recorded.

    The others (a run refused before its first update, a stray directory)
    are skipped with a one-line note; FileNotFoundError if none is left.
    """
    from ppo_async.runs.analysis import load_run

    runs = []
    for run_dir in run_dirs:
        try:
            runs.append(load_run(run_dir))
        except FileNotFoundError as error:
            if len(run_dirs) == 1:
                raise
            print(f"ppo-async: plot: skipping {run_dir}: {error}", file=sys.stderr)
    if not runs:
        raise FileNotFoundError(f"none of the {len(run_dirs)} run directories has an update "
                                "recorded; nothing to plot")
    return runs


def sweep_command(
    sweep_file: tyro.conf.Positional[pathlib.Path],
    out: pathlib.Path,
    workers: int | None = None,
    backend: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    twin: bool = False,
    dry_run: bool = False,
    progress: bool = True,
) -> None:
    """Run a sweep: every combination of a grid of config fields, once per seed, in parallel; resumable.

    SWEEP_FILE (TOML, or YAML with pyyaml) holds an optional preset = NAME,
    seeds = [...], [base] fields for every run and [grid] lists whose
    combinations are the grid points (docs/guide/sweeps.md). Under --out DIR: a run
    directory per (grid point, seed), sweep.toml, runs.csv, summary.csv and
    summary.md (IQM of the final return over seeds, 95% stratified-bootstrap
    interval). The same command again skips finished runs and resumes
    interrupted ones from their checkpoints; Ctrl-C stops every worker and
    prints the command that continues. Exits with 1 if a run failed (its
    error is in runs.csv).

    Args:
        sweep_file: The sweep file.
        out: The sweep directory (made if missing).
        workers: Runs at once (local: by default as many as the cores hold, counting each run's actor threads and learner; ray: by default every run, placed by its CPUs).
        backend: local: a process per run; ray: a Ray task per run (a private local instance, or --ray-address).
        ray_address: The Ray cluster to run on (its nodes must all see --out).
        twin: Train all seeds of a grid point in one vmapped synchronous twin (gymnax envs; the fast path for hyperparameter search).
        dry_run: Check the sweep and list its runs and what is done; train nothing.
        progress: Show a progress bar of the sweep (runs done, running, failed, time left).
    """
    from ppo_async.sweep.execute import SweepWarning, execute_sweep, plan_sweep
    from ppo_async.sweep.table import summary_markdown

    if dry_run:
        plan = plan_sweep(sweep_file, out, twin=twin)
        for run in plan.runs:
            print(f"{plan.states[run.name]:8s} {out / run.name}")
        counts = {state: list(plan.states.values()).count(state)
                  for state in ("done", "resume", "restart", "fresh")}
        print(f"{len(plan.runs)} runs ({len(plan.spec.grid_points())} grid points x "
              f"{len(plan.spec.seeds)} seeds): {counts['done']} done, {counts['resume']} to "
              f"resume, {counts['fresh'] + counts['restart']} to start")
        return
    with warnings.catch_warnings():
        warnings.simplefilter("always", SweepWarning)
        summary = execute_sweep(sweep_file, out, workers=workers, backend=backend,
                                ray_address=ray_address, twin=twin, progress=progress)
    print(summary_markdown(summary))
    print(f"sweep directory: {out} (runs.csv, summary.csv, summary.md; ppo-async plot {out})")
    failed = sum(row["failed"] for row in summary)
    if failed:
        total = sum(row["seeds"] for row in summary)
        print(f"ppo-async: sweep: {failed} of {total} runs failed (their errors are in "
              f"{out / 'runs.csv'}); the same command tries them again", file=sys.stderr)
        raise SystemExit(1)


def pbt_command(
    pbt_file: tyro.conf.Positional[pathlib.Path],
    out: pathlib.Path,
    ray_address: str | None = None,
    cpus_per_member: float | None = None,
    progress: bool = True,
) -> None:
    """Population-based training on Ray Tune: members that copy better members and perturb fields.

    PBT_FILE is a sweep file whose [grid] lists are the values each explored
    field may take, plus [pbt] population = N, interval_updates = K and
    [pbt.ranges] field = [low, high] for continuous fields (docs/guide/pbt.md).
    Under --out DIR: a run directory per member (member_<i>, with
    pbt_schedule.jsonl: the fields it trained with over time), summary.csv and
    summary.md (the best member marked), schedules.csv, pbt.png and Tune's
    state (tune/). The same command again continues the population; Ctrl-C
    stops it and prints the command that continues. Exits with 1 if a member
    failed past its restarts.

    Args:
        pbt_file: The PBT file.
        out: The population directory (made if missing).
        ray_address: The Ray cluster to join (its nodes must all see --out); default: a private local instance.
        cpus_per_member: CPUs each member asks Ray for (default: its learner and actor threads); lower it to run more members at once on few cores.
        progress: Show Tune's progress table.
    """
    from ppo_async.pbt.population import PBTWarning, run_pbt
    from ppo_async.pbt.report import summary_markdown
    from ppo_async.pbt.spec import load_pbt

    with warnings.catch_warnings():
        warnings.simplefilter("always", PBTWarning)
        warnings.showwarning = _one_line_warning
        rows = run_pbt(pbt_file, out, ray_address=ray_address, cpus_per_member=cpus_per_member,
                       progress=progress)
    print(summary_markdown(rows, load_pbt(pbt_file).explored()))
    print(f"population directory: {out} (summary.csv, schedules.csv, pbt.png; "
          f"ppo-async plot {out}/member_*)")
    failed = [r["member"] for r in rows if r["status"] == "failed"]
    if failed:
        print(f"ppo-async: pbt: {', '.join(failed)} failed past their restarts (errors in "
              f"{out / 'summary.csv'}); the same command tries them again", file=sys.stderr)
        raise SystemExit(1)


def _take_option(argv: list[str], flag: str, example: str,
                 what: str = "a value") -> tuple[str | None, list[str]]:
    """``FLAG VALUE`` or ``FLAG=VALUE`` taken out of ``argv``: (VALUE or None, the rest)."""
    value, rest = None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == flag or arg.startswith(flag + "="):
            if value is not None:
                raise ConfigError(f"{flag}: given twice; give {what} once")
            if arg == flag:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ConfigError(f"{flag} needs {what}: ppo-async train {flag} {example}")
                value, i = argv[i + 1], i + 2
            else:
                value, i = arg.split("=", 1)[1], i + 1
            if not value:
                raise ConfigError(f"{flag} needs {what}: ppo-async train {flag}={example}")
            continue
        rest.append(arg)
        i += 1
    return value, rest


def _take_resume(argv: list[str]) -> tuple[pathlib.Path | None, list[str]]:
    """``--resume DIR`` or ``--resume=DIR`` taken out of ``argv``: (DIR or None, the rest)."""
    value, rest = _take_option(argv, "--resume", "runs/NAME", "a run directory")
    return (pathlib.Path(value) if value is not None else None), rest


def _commands(argv: list[str]) -> dict[str, Any]:
    """The subcommands; ``train``'s config defaults come from --preset and --config, or --resume's run."""
    commands = {"train": _make_train_command(AsyncActorLearnerConfig(), None),
                "eval": eval_command, "enjoy": enjoy_command, "plot": plot_command,
                "sweep": sweep_command, "pbt": pbt_command}
    if argv[:1] == ["train"]:
        resume, argv[:] = _take_resume(argv)
        preset_name, argv[:] = _take_option(argv, "--preset", "cartpole", "a preset name")
        config_path, argv[:] = _take_option(argv, "--config", "my_run.toml", "a config file")
        if resume is not None:
            run_root, argv[:] = _take_option(argv, "--run-root", "runs", "a directory")
            if preset_name is not None or config_path is not None:
                raise ConfigError(
                    f"--{'preset' if preset_name is not None else 'config'} with --resume: a "
                    "resumed run keeps its own config.json; change single fields with flags"
                )
            if run_root is not None:
                raise ConfigError(
                    f"--run-root with --resume: a resumed run continues in its own directory "
                    f"({resume}); --run-root only places new runs"
                )
            from ppo_async.resume import load_run_config

            commands["train"] = _make_train_command(load_run_config(resume), resume)
        else:
            base = preset(preset_name) if preset_name is not None else AsyncActorLearnerConfig()
            if config_path is not None:
                base = load_config_file(config_path, base)
            commands["train"] = _make_train_command(base, None)
    return commands


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Sections of tyro's error box that list flags under a header; only the flags are kept.
_FLAG_SECTIONS = {"Perhaps you meant:": "perhaps you meant", "Argument helptext:": "usage"}


def _is_rule(line: str) -> bool:
    return len(line) >= 10 and set(line) <= {"─", "-"}


def _error_box(text: str) -> tuple[str, list[list[str]]]:
    """tyro's error box: its title and the lines of each section between its rules.

    tyro draws it with box characters when stdout's encoding is UTF-8, else
    as a title line over a rule of dashes.
    """
    lines = [line.strip().strip("│").strip() for line in _ANSI_ESCAPE.sub("", text).splitlines()]
    lines = [line for line in lines if line and not line.startswith("╰")]
    title = ""
    if lines and lines[0].startswith("╭"):
        title, lines = lines[0].strip("╭╮─ "), lines[1:]
    elif len(lines) > 1 and _is_rule(lines[1]):
        title, lines = lines[0], lines[2:]
    sections: list[list[str]] = [[]]
    for line in lines:
        if _is_rule(line):
            sections.append([])
        else:
            sections[-1].append(line)
    return title, [section for section in sections if section]


def one_line_parse_error(text: str, help_command: str) -> str:
    """tyro's parse-error box (5-15 lines on stderr) as one line, its suggestions kept.

    The box's footer (where the full help is) becomes ``help_command``; a
    "Perhaps you meant:" or "Argument helptext:" section keeps only its flags
    (``--num-actors INT``), not their help text. Text that is not a box is
    joined as it is.
    """
    title, sections = _error_box(text)
    parts = []
    for head, *rest in sections:
        if head.startswith("For full helptext"):
            continue
        # A flag and its alias may be listed once per subcommand, in either order.
        flags = list(dict.fromkeys(_flag_names(line) for line in rest if line.startswith("-")))
        if head in _FLAG_SECTIONS and flags:
            parts.append(f"{_FLAG_SECTIONS[head]}: {', '.join(flags)}")
        else:
            parts.append(" ".join([head, *rest]).rstrip("."))
    message = "; ".join(parts) or "the command line could not be parsed"
    if title and not message.lower().startswith(title.lower()):
        message = f"{title}: {message}"
    return f"{message}; see {help_command}"


def _flag_names(line: str) -> str:
    """A flag line of tyro's (``--num-episodes, --episodes INT``) with its names sorted."""
    names, _, metavar = line.rpartition(" ")
    if not names or metavar.startswith("-"):  # no metavar: --greedy, --no-greedy
        names, metavar = line, ""
    return " ".join([", ".join(sorted(n.strip() for n in names.split(","))), metavar]).strip()


@contextlib.contextmanager
def _parse_errors_on_one_line(help_command: str):
    """Inside: tyro's parse errors become one line on stderr (exit code 2, as tyro's).

    tyro prints an error box to stderr, then raises SystemExit(2); stderr is
    held while it parses and let through as it was for anything else (help is
    on stdout; a warning it printed is passed on).
    """
    real_stderr, held = sys.stderr, io.StringIO()
    sys.stderr = held
    try:
        yield
    except SystemExit as stop:
        sys.stderr = real_stderr
        if stop.code != 2 or not held.getvalue().strip():
            real_stderr.write(held.getvalue())
            raise
        print(f"ppo-async: {one_line_parse_error(held.getvalue(), help_command)}",
              file=real_stderr)
        raise SystemExit(2) from None
    finally:
        if sys.stderr is held:  # parsed, or a ConfigError from the config tyro built
            sys.stderr = real_stderr
            real_stderr.write(held.getvalue())


def _deferred(command):
    """``command`` as tyro's target: parsing returns the call to make, made once stderr is back."""

    @functools.wraps(command)
    def parsed(*args: Any, **kwargs: Any):
        return functools.partial(command, *args, **kwargs)

    return parsed


def _parse(commands: dict[str, Any], argv: list[str]):
    """The chosen subcommand with its parsed arguments, ready to call."""
    known = argv[:1] and argv[0] in commands
    help_command = f"ppo-async {argv[0]} --help" if known else "ppo-async --help"
    with _parse_errors_on_one_line(help_command):
        return tyro.extras.subcommand_cli_from_dict(
            {name: _deferred(command) for name, command in commands.items()},
            prog="ppo-async", args=argv,
            description=f"ppo-async {__version__}: asynchronous actor-learner PPO with V-trace. "
                        "ppo-async --version prints the version.",
        )


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"ppo-async {__version__}")
        return
    from ppo_async.envs.host import HostEnvError
    from ppo_async.envs.registry import BackendNotInstalledError, UnknownEnvError
    from ppo_async.runs.checkpoint import CheckpointError
    from ppo_async.runs.run_lock import RunDirectoryBusy
    from ppo_async.runtime.messages import PolicyLoadError
    from ppo_async.tools.video import RenderError

    # As python -m does: a module beside the user (--env-module my_envs) imports.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning  # a skipped checkpoint, a damaged line
            _parse(_commands(argv), argv)()
    except KeyboardInterrupt as interrupt:
        # train() raises TrainingInterrupted, whose message names the update and the resume command.
        print(f"\nppo-async: {str(interrupt) or 'interrupted'}", file=sys.stderr)
        raise SystemExit(130) from None
    except RunDirectoryBusy as error:  # a refused command, not a bad value
        print(f"ppo-async: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except ConfigError as error:
        print(f"ppo-async: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except (CheckpointError, PolicyLoadError, FileNotFoundError, UnknownEnvError,
            HostEnvError, BackendNotInstalledError, RenderError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"ppo-async: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as error:  # writing a video or a figure failed (a full disk, a read-only one)
        print(f"ppo-async: {' '.join(str(error).split())}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
