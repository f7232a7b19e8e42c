"""The README's ``make train`` figure: the command it runs, in fresh processes, several times.

Runs ``ppo-async train --env-id CartPole-v1 --no-progress`` (what ``make
train`` runs, less the progress bar) ``--repeats`` times, each in a fresh
process so each includes its compiles, and reports the range of the final
return, the training wall time, the env steps/s and the policy lag, with
the load average before each run. Writes ``results.json`` under
``experiments/out/make_train_figure/``.

    python experiments/make_train_figure.py --repeats 5
    python experiments/make_train_figure.py --repeats 5 --busy-cores 1   # another job on one core

``--busy-cores N`` keeps N processes spinning beside each run, as other work
on a shared machine does, to show what the figure becomes under load.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from common import save_result  # noqa: E402

SUMMARY = re.compile(
    r"final return (?P<final_return>[-\d.]+) .*? (?P<env_steps>\d+) env steps, "
    r"(?P<wall_s>[\d.]+) s of training \((?P<steps_per_s>\d+) steps/s\) \| policy lag mean "
    r"(?P<lag_mean>[\d.]+) max (?P<lag_max>\d+)"
)


def one_run(run_root: str) -> dict:
    load = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, "-m", "ppo_async.tools.cli", "train", "--env-id", "CartPole-v1",
         "--no-progress", "--run-root", run_root],
        capture_output=True, text=True, timeout=600, check=True,
    )
    match = SUMMARY.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no summary line in the output:\n{done.stdout}\n{done.stderr}")
    figures = {k: float(v) for k, v in match.groupdict().items()}
    return {**figures, "load_average_1min_before": load}


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_cores(count: int):
    """``count`` processes spinning on a core each, ended on the way out."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join(10)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy-cores", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.busy_cores < 0:
        parser.error("--repeats must be >= 1 and --busy-cores >= 0")
    runs = []
    with tempfile.TemporaryDirectory() as run_root, busy_cores(args.busy_cores):
        for repeat in range(args.repeats):
            runs.append(one_run(run_root))
            print(f"run {repeat}: {runs[-1]}", flush=True)
    ranges = {key: [min(r[key] for r in runs), max(r[key] for r in runs)]
              for key in ("final_return", "wall_s", "steps_per_s", "lag_mean", "lag_max",
                          "load_average_1min_before")}
    for key, (low, high) in ranges.items():
        print(f"{key:26s} {low:10.2f} .. {high:10.2f}")
    save_result("make_train_figure", args.out, __file__, sys.argv[1:] if argv is None else argv,
                {"busy_cores": args.busy_cores, "runs": runs, "ranges": ranges})
    return ranges


if __name__ == "__main__":
    main()
