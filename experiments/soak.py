"""Soak test: a long CartPole run with actor failures injected, watched for leaks.

Runs `ppo_async.train` for ``--minutes`` with 4 actors and supervised restarts,
makes one actor raise every ``--fail-every-s`` seconds, and samples, every
``--sample-every-s`` seconds, the process's resident memory (RSS), its thread
count and the experience queue depth. It fails (exit 1) if

- RSS grows by more than 10% from the end of the warm-up to any later sample,
- the thread count after the warm-up ever exceeds its warm-up value (a
  restarted actor must replace its predecessor, not add to it), or threads of
  the run are still alive after `train` returns,
- the queue depth ever exceeds the staleness valve's bound: each actor can be
  at most ``max_lead_steps // num_steps`` chunks ahead of the learner, so at
  most ``num_actors * max_lead_chunks`` chunks are ever waiting,
- or the run did not survive every injected failure.

Writes ``samples.csv``, ``summary.json`` and ``soak.png`` (RSS, threads and
queue depth over time) and prints the command that reproduces them.

    python experiments/soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import importlib
import sys
import threading
import time

import common


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class _Injector:
    """Makes the next rollout of actor ``target`` raise once armed."""

    def __init__(self, actor_ids: int):
        self.armed = threading.Event()
        self.actor_ids = actor_ids
        self.injected = 0

    def wrap(self, rollout):
        def maybe_fail(params, carry):
            from ppo_async.runtime.actor import current_actor

            target = self.injected % self.actor_ids
            if self.armed.is_set() and current_actor() == target:
                self.armed.clear()
                self.injected += 1
                raise RuntimeError(f"soak: injected failure #{self.injected} in actor {target}")
            return rollout(params, carry)
        return maybe_fail


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fail-every-s", type=float, default=120.0)
    parser.add_argument("--sample-every-s", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from ppo_async import AsyncActorLearnerConfig, StopTraining, train

    config = AsyncActorLearnerConfig(
        # The budget is never reached (the clock ends the run); a constant
        # learning rate keeps late updates comparable to early ones.
        num_actors=4, envs_per_actor=2, total_env_steps=10**9, anneal_lr=False,
        max_actor_restarts=10**6,
        learner_timeout_s=60.0,
    )
    queue_bound = config.num_actors * config.max_lead_chunks
    injector = _Injector(config.num_actors)
    train_module = importlib.import_module("ppo_async.train")
    original_make = train_module.make_actor_program
    train_module.make_actor_program = lambda cfg: (
        lambda program: program._replace(rollout=injector.wrap(program.rollout))
    )(original_make(cfg))

    latest = {"queue_depth": 0, "update": 0, "episode_return": float("nan")}
    samples: list[dict] = []
    start = time.monotonic()
    deadline = start + 60 * args.minutes
    stop_sampling = threading.Event()

    def on_update(metrics):
        latest.update(metrics)
        if time.monotonic() >= deadline:
            raise StopTraining

    def sample_loop() -> None:
        next_failure = start + args.fail_every_s
        while not stop_sampling.wait(args.sample_every_s):
            now = time.monotonic()
            if now >= next_failure:
                injector.armed.set()
                next_failure += args.fail_every_s
            samples.append({
                "t_s": round(now - start, 2), "rss_mib": round(_rss_mib(), 1),
                "threads": threading.active_count(),
                "queue_depth": int(latest["queue_depth"]), "update": int(latest["update"]),
                "episode_return": latest["episode_return"], "failures": injector.injected,
            })
            print(f"t={samples[-1]['t_s']:7.1f}s rss={samples[-1]['rss_mib']:7.1f} MiB "
                  f"threads={samples[-1]['threads']} queue={samples[-1]['queue_depth']} "
                  f"update={samples[-1]['update']} failures={injector.injected}", flush=True)

    sampler = threading.Thread(target=sample_loop, name="soak-sampler", daemon=True)
    sampler.start()
    try:
        report = train(config, progress=False, on_update=on_update).report
    finally:
        stop_sampling.set()
        sampler.join(timeout=30)
        train_module.make_actor_program = original_make
    left_alive = [t.name for t in threading.enumerate() if t.name.startswith("ppo-")]

    warm = [s for s in samples if s["t_s"] >= args.warmup_s]
    problems = []
    if not warm:
        problems.append("no samples after the warm-up; run longer")
    else:
        rss_base, threads_base = warm[0]["rss_mib"], warm[0]["threads"]
        rss_growth = max(s["rss_mib"] for s in warm) / rss_base - 1
        if rss_growth > 0.10:
            problems.append(f"RSS grew {rss_growth:.1%} after the warm-up (limit 10%)")
        if max(s["threads"] for s in warm) > threads_base:
            problems.append(f"thread count rose above {threads_base} after the warm-up")
    max_queue = max((s["queue_depth"] for s in samples), default=0)
    if max_queue > queue_bound:
        problems.append(f"queue depth {max_queue} exceeded the valve's bound {queue_bound}")
    if left_alive:
        problems.append(f"threads still alive after train returned: {left_alive}")
    if report.actor_restarts != injector.injected:
        problems.append(f"{injector.injected} failures injected but "
                        f"{report.actor_restarts} restarts counted")

    summary = {
        "minutes": args.minutes, "updates": report.updates, "env_steps": report.env_steps,
        "env_steps_per_s": report.env_steps_per_s, "final_return": report.episode_return_mean,
        "failures_injected": injector.injected, "actor_restarts": report.actor_restarts,
        "rss_mib_after_warmup": warm[0]["rss_mib"] if warm else None,
        "rss_mib_max": max((s["rss_mib"] for s in warm), default=None),
        "threads_after_warmup": warm[0]["threads"] if warm else None,
        "threads_max": max((s["threads"] for s in samples), default=None),
        "queue_depth_max": max_queue, "queue_bound": queue_bound,
        "passed": not problems, "problems": problems,
    }
    out = common.out_dir("soak", args.out)
    common.write_csv(out / "samples.csv", samples, list(samples[0]) if samples else ["t_s"])
    _plot(samples, args.warmup_s, queue_bound, out / "soak.png")
    common.save_result("soak", args.out, __file__, argv, summary, "summary.json")
    print(f"\n{report.updates} updates, {report.env_steps} env steps, "
          f"{injector.injected} failures injected, {report.actor_restarts} restarts; "
          f"RSS {summary['rss_mib_after_warmup']} -> max {summary['rss_mib_max']} MiB; "
          f"threads max {summary['threads_max']}; queue max {max_queue} (bound {queue_bound})")
    print("PASSED" if not problems else "FAILED: " + "; ".join(problems))
    return 0 if not problems else 1


def _plot(samples, warmup_s, queue_bound, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    for ax, key, label in zip(axes, ["rss_mib", "threads", "queue_depth"],
                              ["RSS (MiB)", "threads", "queue depth (chunks)"]):
        ax.plot(t, [s[key] for s in samples])
        ax.axvline(warmup_s, color="grey", linestyle=":")
        ax.set_ylabel(label)
    axes[2].axhline(queue_bound, color="red", linestyle="--", label="valve bound")
    axes[2].legend()
    axes[2].set_xlabel("seconds")
    for before, after in zip(samples, samples[1:]):
        if after["failures"] > before["failures"]:  # an injected failure
            for ax in axes:
                ax.axvline(after["t_s"], color="orange", alpha=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
