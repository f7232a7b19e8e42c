"""Weights & Biases logging, offline: the config, every update's metrics at step env_steps,
the figure at the end; wandb imported only when asked for; the notebook progress bar."""

import json
import pathlib
import subprocess
import sys
import types

import pytest

from ppo_async.runs import run_log

CLI_TINY = ["--num-actors", "2", "--envs-per-actor", "2", "--num-steps", "8",
            "--num-epochs", "1", "--num-minibatches", "2", "--no-progress"]


def read_wandb_records(path: pathlib.Path) -> list:
    """The protobuf records of an offline run's ``run-*.wandb`` file.

    wandb >= 0.2x has no Python reader for its own files (its Go core writes
    them), so this reads the format directly: a 7-byte header (``:W&B``, a
    2-byte magic, a version byte), then LevelDB log blocks of 32 KiB whose
    records carry a 7-byte header (CRC32, little-endian length, type:
    1 full, 2 first, 3 middle, 4 last), each payload a ``wandb_internal_pb2.Record``.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    block, position, pending, records = 32 * 1024, 7, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        length = int.from_bytes(data[position + 4:position + 6], "little")
        kind = data[position + 6]
        if kind == 0:  # zero padding to the end of the block
            position += left
            continue
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_a_run_logs_config_metrics_and_figure_to_wandb_offline(tmp_path, capsys, wandb_offline):
    from ppo_async.tools.cli import main

    main(["train", *CLI_TINY, "--total-env-steps", "128", "--run-root", str(tmp_path / "runs"),
          "--wandb-project", "ppo-async-test", "--wandb-group", "tiny",
          "--wandb-tags", "offline", "test"])
    (run_dir,) = (tmp_path / "runs").iterdir()
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    (log_file,) = offline.glob("run-*.wandb")
    records = read_wandb_records(log_file)

    (run,) = [r.run for r in records if r.HasField("run")]
    assert (run.project, run.run_group, list(run.tags)) == ("ppo-async-test", "tiny", ["offline", "test"])
    assert run.display_name == run_dir.name
    logged_config = {item.key: json.loads(item.value_json) for item in run.config.update}
    config = json.loads((run_dir / "config.json").read_text())
    assert {k: logged_config[k]["value"] if isinstance(logged_config[k], dict) and "value"
            in logged_config[k] else logged_config[k] for k in config} == config

    history = [r.history for r in records if r.HasField("history")]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == len(metrics) == 4
    for row, line in zip(history, metrics):
        values = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                  for item in row.item}
        assert row.step.num == line["env_steps"] == values["_step"]
        # The same scalars under the same names as metrics.jsonl (a null is not logged).
        logged = {k: v for k, v in values.items() if not k.startswith(("_", "curves"))}
        assert logged == pytest.approx({k: v for k, v in line.items() if v is not None})
    last = {item.key or "/".join(item.nested_key) for item in history[-1].item}
    assert {"curves/_type", "curves/path"} <= last  # the run's figure, at the last step
    assert (offline / "files" / "curves.png").stat().st_size > 20_000
    (exit_record,) = [r.exit for r in records if r.HasField("exit")]
    assert exit_record.exit_code == 0
    assert "run directory" in capsys.readouterr().out


def test_an_interrupted_run_is_marked_failed_in_wandb(tmp_path, wandb_offline):
    from ppo_async import AsyncActorLearnerConfig, train
    from ppo_async.train import TrainingInterrupted
    from ppo_async.runs.wandb_log import WandbSettings

    def interrupt(metrics):
        if metrics["update"] == 2:
            raise KeyboardInterrupt

    config = AsyncActorLearnerConfig(num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1,
                                     num_minibatches=2, total_env_steps=32 * 6)
    with pytest.raises(TrainingInterrupted):
        train(config, run_dir=tmp_path / "run", progress=False, on_update=interrupt,
              wandb=WandbSettings(project="ppo-async-test", name="interrupted"))
    (log_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    records = read_wandb_records(log_file)
    (run,) = [r.run for r in records if r.HasField("run")]
    (exit_record,) = [r.exit for r in records if r.HasField("exit")]
    assert run.display_name == "interrupted" and exit_record.exit_code == 1
    assert len([r for r in records if r.HasField("history")]) == 2


def test_wandb_is_imported_only_when_asked_for():
    code = ("import sys, ppo_async, ppo_async.tools.cli, ppo_async.runs.run_log, ppo_async.train, "
            "ppo_async.runs.plotting, ppo_async.runs.analysis; print('wandb' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


def test_without_wandb_installed_the_cli_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    from ppo_async.tools.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(SystemExit) as info:
        main(["train", *CLI_TINY, "--total-env-steps", "64", "--run-root", str(tmp_path),
              "--wandb-project", "p"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'ppo-async[wandb]'" in err


# --- the progress bar ----------------------------------------------------------------


def test_progress_bar_in_a_notebook_without_ipywidgets_is_slow_plain_text(monkeypatch):
    from tqdm.notebook import tqdm_notebook
    from tqdm.std import tqdm as text_tqdm

    monkeypatch.setattr(run_log, "_in_notebook", lambda: True)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    bar = run_log.progress_bar(10, 0, "CartPole-v1")
    try:
        assert type(bar) is text_tqdm and not isinstance(bar, tqdm_notebook)
        assert bar.mininterval == run_log.NOTEBOOK_TEXT_REFRESH_S >= 5
    finally:
        bar.close()


def test_progress_bar_on_a_terminal_is_a_terminal_bar(monkeypatch):
    from tqdm.std import tqdm as text_tqdm

    monkeypatch.setattr(run_log, "_in_notebook", lambda: False)
    monkeypatch.setattr(run_log, "_is_terminal", lambda stream: True)
    bar = run_log.progress_bar(10, 3, "CartPole-v1")
    try:
        assert type(bar) is text_tqdm and bar.n == 3 and bar.mininterval < 1
    finally:
        bar.close()


def test_an_evaluation_is_logged_at_the_newest_step_naming_the_update_it_evaluated():
    from ppo_async.runs.wandb_log import WandbRun

    logged = []
    run = WandbRun.__new__(WandbRun)  # no wandb: only the step bookkeeping is under test
    run.run = types.SimpleNamespace(log=lambda values, step: logged.append((values, step)))
    run.step = 0
    run.log({"update": 5, "env_steps": 320, "policy_loss": 0.5})
    # Update 2's evaluation finished after update 5: W&B drops a point below the last step.
    run.log_evaluation({"update": 2, "env_steps": 128, "eval_return_mean": 9.0,
                        "eval_return_std": 1.0, "eval_policy_version": 2})
    assert logged[-1] == ({"eval_return_mean": 9.0, "eval_return_std": 1.0,
                           "eval_policy_version": 2.0}, 320)


def test_progress_to_a_file_is_a_plain_line_every_interval_and_at_the_end():
    import io

    now = [0.0]
    log = io.StringIO()
    lines = run_log.ProgressLines(1000, 0, "CartPole-v1", file=log, clock=lambda: now[0])
    for update in range(1000):  # 100 s of updates, 0.1 s each
        now[0] = (update + 1) / 10
        lines.update(1)
        lines.set_postfix(sps="5000", ret=f"{update / 10:.1f}", lag="1", refresh=False)
    lines.close()
    written = log.getvalue()
    assert "\r" not in written and len(written) < 1000
    assert [line.split(" (")[0] for line in written.splitlines()] == [
        "CartPole-v1: update 300/1000", "CartPole-v1: update 600/1000",
        "CartPole-v1: update 900/1000", "CartPole-v1: update 1000/1000"]
    assert written.splitlines()[0].endswith("(30%) after 30 s, about 70 s left, "
                                            "sps=5000, ret=29.8, lag=1")
    assert written.splitlines()[-1] == (
        "CartPole-v1: update 1000/1000 (100%) after 100 s, sps=5000, ret=99.9, lag=1")


def test_a_run_with_progress_into_a_file_writes_no_carriage_returns(capsys):
    from ppo_async import AsyncActorLearnerConfig, train

    config = AsyncActorLearnerConfig(num_actors=2, envs_per_actor=2, num_steps=8, num_epochs=1,
                                     num_minibatches=2, total_env_steps=2 * 2 * 8 * 6)
    train(config, progress=True)  # capsys's stderr is not a terminal, as a log file is not
    err = capsys.readouterr().err
    assert "\r" not in err and len(err) < 300, err
    assert err.splitlines()[-1].startswith("CartPole-v1: update 6/6 (100%) after"), err
