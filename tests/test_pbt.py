"""Population-based training (`ppo_async.pbt`) on Ray Tune, with a private local Ray instance.

Two populations of two tiny CartPole members (32 env steps an update,
perturbed every 2 updates, thread actors), seconds each, are trained once for
the whole module and read by the tests. The synchronous one (``synch``: at
every interval the worse member copies the better; 4 updates, so one
interval) shows exploit and explore; the default, asynchronous one (6
updates) is met the way a user meets it: Ctrl-C after the first interval, the
same call again, and a member failing once in that second call.
The Ray instance is the module's, shut down at the end with nothing of it left
running.
"""

import csv
import json
import logging
import os
import pathlib
import signal
import threading
import time

import numpy as np
import pytest

from ppo_async.config import ConfigError
from ppo_async import PBTInterrupted, run_pbt
from ppo_async.pbt.population import PBTWarning
from ppo_async.pbt.spec import load_pbt
from ppo_async.pbt.member import read_schedule
from ppo_async.pbt.population import check_fits
from ppo_async.runs.checkpoint import _decode

ray = pytest.importorskip("ray")
pytest.importorskip("ray.tune")

LEARNING_RATES = [1e-4, 3e-4, 1e-3]
CLIP = (0.1, 0.3)
SPEC = {
    "base": dict(env_id="CartPole-v1", num_actors=1, envs_per_actor=2, num_steps=16,
                 num_epochs=1, num_minibatches=1, total_env_steps=192, keep_checkpoints=10),
    "grid": {"learning_rate": LEARNING_RATES},
    "pbt": {"population": 2, "interval_updates": 2, "ranges": {"clip_eps": list(CLIP)}},
}
MEMBERS = ["member_0", "member_1"]


def ray_processes() -> list:
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE and any(
                    "ray" in part for part in process.cmdline()):
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(scope="module")
def local_ray():
    from ppo_async.runtime.process_transport import inherited_cache_env

    assert not ray.is_initialized()
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # Two members of two threads each on this small machine: 4 logical CPUs.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": inherited_cache_env()})
    yield
    ray.shutdown()
    deadline = time.monotonic() + 20
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_processes() == [], "Ray processes left running"


def interrupt_after_first_interval(out: pathlib.Path, stop: threading.Event) -> None:
    """Ctrl-C once Tune holds every member's first checkpoint."""
    while not stop.is_set():
        if all((out / "tune" / m / "checkpoint_000000").is_dir() for m in MEMBERS):
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.1)


@pytest.fixture(scope="module")
def synchronous(local_ray, tmp_path_factory):
    out = tmp_path_factory.mktemp("pbt_synch")
    spec = json.loads(json.dumps(SPEC))
    spec["pbt"]["synch"] = True
    # 4 updates: one interval, so one exploit (each interval restarts every member).
    spec["base"]["total_env_steps"] = 128
    sigint_before = signal.getsignal(signal.SIGINT)
    return dict(out=out, rows=run_pbt(spec, out, progress=False), sigint_before=sigint_before)


@pytest.fixture(scope="module")
def population(local_ray, tmp_path_factory):
    out = tmp_path_factory.mktemp("pbt")
    marker = out / "failed_once"

    def fail_once(name: str, update: int) -> None:  # runs in the member's Ray worker
        import time

        import ppo_async

        (out / f"{name}.package").write_text(ppo_async.__file__)
        if not (out / "continuing").exists():
            # The first call: past its first interval a member waits, so that the Ctrl-C
            # finds both part-way (six tiny updates can otherwise end within the watcher's
            # delay) and no failure races with it.
            if update >= 2:
                time.sleep(3)
            return
        if name == "member_1" and update == 4 and not marker.exists():
            marker.touch()
            raise RuntimeError("injected failure")

    stop = threading.Event()
    watcher = threading.Thread(target=interrupt_after_first_interval, args=(out, stop))
    watcher.start()
    started = time.monotonic()
    try:
        with pytest.raises(PBTInterrupted) as interrupted:
            run_pbt(SPEC, out, progress=False, hook=fail_once)
    finally:
        stop.set()
        watcher.join()
    first = [read_schedule(out / m) for m in MEMBERS]
    (out / "continuing").touch()
    rows = run_pbt(SPEC, out, progress=False, hook=fail_once)  # the same call continues
    return dict(out=out, rows=rows, interrupted=interrupted.value, first=first,
                marker=marker, seconds=time.monotonic() - started)


def ckpt_params(path: pathlib.Path) -> list[np.ndarray]:
    import jax

    _, _, _, state = _decode(path.read_bytes())
    return [np.asarray(leaf) for leaf in jax.tree.leaves(state["learner"]["params"])]


def tune_checkpoint(out: pathlib.Path, member: str, update: int) -> pathlib.Path:
    (path,) = (out / "tune" / member).glob(f"checkpoint_*/ckpt_{update:09d}.msgpack")
    return path


# --- the population ----------------------------------------------------------------------


def test_ctrl_c_stops_the_population_and_the_same_call_continues_it(population):
    out = population["out"]
    assert "ppo-async pbt" in population["interrupted"].command
    # The rerun went on from the checkpoints: each member started from scratch once.
    for member, before in zip(MEMBERS, population["first"]):
        schedule = read_schedule(out / member)
        assert [s["source"] for s in schedule].count("start") == 1
        assert schedule[:len(before)] == before
        assert schedule[-1]["end_update"] == 6
    assert [r["status"] for r in population["rows"]] == ["done", "done"]
    assert load_pbt(out / "pbt.toml").to_table() == load_pbt(SPEC).to_table()
    print(f"population trained in {population['seconds']:.0f} s")


def test_every_member_is_a_normal_run_trained_by_this_package(population):
    from ppo_async.resume import load_run
    from ppo_async.runs.analysis import load_run as load_metrics

    out = population["out"]
    for member in MEMBERS:
        package = pathlib.Path((out / f"{member}.package").read_text())
        assert package.parent == pathlib.Path(__file__).resolve().parents[1] / "ppo_async"
        config, params = load_run(out / member)  # what ppo-async eval reads
        assert config.num_updates == 6 and params is not None
        metrics = load_metrics(out / member).metrics
        assert metrics["update"].tolist() == [1, 2, 3, 4, 5, 6]  # cut back at each restart
        summary = json.loads((out / member / "summary.json").read_text())
        assert summary["updates"] == 6 and summary["env_steps"] == 192


def test_exploit_copies_the_donors_checkpoint_into_the_member(synchronous):
    out = synchronous["out"]
    copies, changed = 0, 0
    for member in MEMBERS:
        exploits = [s for s in read_schedule(out / member) if s["source"] == "exploit"]
        for exploit in exploits:  # a copy that changed what the member held
            update, donor = exploit["update"], exploit["donor"]
            own_before = ckpt_params(tune_checkpoint(out, member, update))
            donors = ckpt_params(tune_checkpoint(out, donor, update))
            changed += not all(np.array_equal(a, b) for a, b in zip(own_before, donors))
        if not exploits:
            continue
        last = exploits[-1]  # earlier copies were replaced by this one
        update, donor = last["update"], last["donor"]
        mine = ckpt_params(out / member / "checkpoints" / f"ckpt_{update:09d}.msgpack")
        donors = ckpt_params(tune_checkpoint(out, donor, update))
        assert all(np.array_equal(a, b) for a, b in zip(mine, donors))
        copies += 1
    assert copies >= 1  # synchronous, two members: the worse copies the better at each interval
    # The first exploit meets members trained from different seeds; a later one may meet
    # a member that trained as its donor since the last copy (same rate, the clip unused).
    assert changed >= 1


def test_ctrl_c_is_the_callers_again_after_a_population(synchronous):
    # Tune sets its own handlers while it runs; a later Ctrl-C (a sweep, a notebook
    # cell) must raise KeyboardInterrupt as before.
    assert signal.getsignal(signal.SIGINT) is synchronous["sigint_before"]


def test_explore_keeps_every_field_in_its_range_and_changes_the_copied_one(synchronous):
    out = synchronous["out"]
    schedules = {m: read_schedule(out / m) for m in MEMBERS}
    changed = 0
    for member, schedule in schedules.items():
        for segment in schedule:
            assert segment["fields"]["learning_rate"] in LEARNING_RATES
            assert CLIP[0] <= segment["fields"]["clip_eps"] <= CLIP[1]
            if segment["source"] == "exploit":
                donor = [s for s in schedules[segment["donor"]]
                         if s["end_update"] == segment["update"]][-1]
                changed += segment["fields"] != donor["fields"]
    assert changed >= 1


def test_a_failing_member_is_restarted_from_its_last_checkpoint(population):
    out = population["out"]
    assert population["marker"].exists()  # member_1 raised once, at update 4
    schedule = read_schedule(out / "member_1")
    assert schedule[-1]["update"] == 4 and schedule[-1]["source"] in ("resume", "exploit")
    assert [s["source"] for s in schedule].count("start") == 1


def test_the_summary_names_the_best_member_and_holds_the_schedules(synchronous):
    out = synchronous["out"]
    with open(out / "summary.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [r["member"] for r in rows] == MEMBERS
    assert sum(r["best"] == "true" for r in rows) == 1
    assert "best member: member_" in (out / "summary.md").read_text()
    with open(out / "schedules.csv", newline="") as file:
        schedules = list(csv.DictReader(file))
    assert {"member", "update", "env_steps", "source", "learning_rate", "clip_eps"} <= set(
        schedules[0])
    assert len(schedules) == sum(len(read_schedule(out / m)) for m in MEMBERS)
    assert (out / "pbt.png").stat().st_size > 0
    assert load_pbt(out / "pbt.toml").synch


# --- checks before anything runs ---------------------------------------------------------


def with_pbt(**changes):
    spec = json.loads(json.dumps(SPEC))
    for key, value in changes.items():
        section, field = key.split("__")
        if value is None:
            spec[section].pop(field, None)
        else:
            spec[section][field] = value
    return spec


@pytest.mark.parametrize("spec, message", [
    (with_pbt(grid__normalize_observations=[False, True]),
     "cannot change normalize_observations"),
    (with_pbt(grid__learning_rate=None, pbt__ranges={}), "nothing to explore"),
    (with_pbt(pbt__interval_updates=6), "lower interval_updates"),
    (with_pbt(pbt__ranges={"clip_eps": [0.3, 0.1]}), "low < high"),
    (with_pbt(pbt__population=1), "population = 1"),
    (with_pbt(pbt__ranges={"clip_eps": [0.1, 2.0], "learning_rate": [1e-4, 1e-3]}),
     "in [grid] and in [pbt.ranges]"),
])
def test_a_bad_population_is_refused_before_anything_runs(spec, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_pbt(spec)


def test_a_member_too_big_for_the_cluster_is_refused_saying_what_to_lower():
    pbt = load_pbt(with_pbt(base__num_actors=4, base__total_env_steps=1280))
    with pytest.raises(ConfigError, match="needs 5 CPUs.*lower num_actors.*--cpus-per-member"):
        check_fits(pbt, {"CPU": 2.0}, None)
    with pytest.warns(PBTWarning, match="1 of 2 members fit at once"):
        check_fits(pbt, {"CPU": 2.0}, 1.5)


def test_importing_the_package_and_pbt_imports_no_ray():
    import subprocess
    import sys

    code = ("import sys, ppo_async, ppo_async.pbt.population; "
            "assert 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_pbt_command_refuses_a_bad_file_in_one_line(tmp_path, capsys):
    from ppo_async.tools import cli

    path = tmp_path / "pbt.toml"
    path.write_text('[base]\nenv_id = "CartPole-v1"\n[grid]\nnum_actors = [1, 2]\n')
    with pytest.raises(SystemExit) as exit_:
        cli.main(["pbt", str(path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "a member cannot change num_actors" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_after_a_ctrl_c_only_the_continue_line_is_said_not_tunes_restore(tmp_path,
                                                                         monkeypatch):
    # Tune logged "Resume experiment with: Tuner.restore(...)" beside the continue line.
    from ppo_async.pbt import population
    from ppo_async.runtime import ray_transport

    said = []
    tune_log = logging.getLogger("ray.tune.tune")

    class Said(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    class InterruptedTuner:
        def fit(self):  # what Tune logs as a Ctrl-C ends its run, then the Ctrl-C
            tune_log.error("Trials did not complete: %s", ["member_0"])
            tune_log.warning("Experiment has been interrupted, but the most recent state was "
                             "saved.\nResume experiment with: Tuner.restore(path=\"x\", ...)")
            tune_log.warning("another line of Tune's")
            raise KeyboardInterrupt

    monkeypatch.setattr(ray_transport, "connect", lambda *args, **kwargs: False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(population, "_tuner", lambda *args: InterruptedTuner())
    handler = Said(logging.DEBUG)
    tune_log.addHandler(handler)
    try:
        with pytest.raises(PBTInterrupted, match="continue with: ppo-async pbt"):
            run_pbt(SPEC, tmp_path, progress=False)
        tune_log.warning("Resume experiment with: Tuner.restore(...)")  # after: Tune's again
    finally:
        tune_log.removeHandler(handler)
    assert said == ["another line of Tune's", "Resume experiment with: Tuner.restore(...)"]


def test_tunes_table_shows_each_explored_field_once(tmp_path):
    # A member reported its fields as metrics too, and Tune's table added them as metric
    # columns beside the config's: learning_rate twice.
    from types import SimpleNamespace

    from ppo_async.pbt.member import _report

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt_000000002.msgpack").write_bytes(b"state")
    reported = []
    tune = SimpleNamespace(report=lambda metrics, checkpoint: reported.append(metrics),
                           Checkpoint=SimpleNamespace(from_directory=str))
    result = SimpleNamespace(report=SimpleNamespace(updates=2, env_steps=64,
                                                    episode_return_mean=21.5))
    _report(tune, tmp_path, "member_0", result, {"learning_rate": 3e-4, "clip_eps": 0.2})
    assert reported == [{"episode_return": 21.5, "env_steps": 64, "updates": 2}]
