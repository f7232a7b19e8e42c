"""Whether a config gives the same params bytes here as at an earlier commit.

Four configs at an exact lag whose layouts resolve the same before and after
`ppo_async.runtime.layout`: gymnax CartPole with every layout field left to
its default (the learner's program), 2 x 4 and 8 x 1 (one rollout program for
all actors); gymnasium CartPole in thread actors (``actor_backend='threads'``,
the rest left to their defaults), 2 actors calling alone, and 16 actors
behind the shared sampler.
Each trains in a fresh process with ``--ref``'s checkout first on the path,
then with this one's, and the script prints the sha256 of each run's final
params and whether they match.

    python experiments/layout_bytes.py [--ref a348c30]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import common

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = {  # name -> fields (those of the layout left to their defaults)
    "gymnax-2x4-learner": dict(env_id="CartPole-v1", num_actors=2, envs_per_actor=4,
                               num_steps=16, total_env_steps=2 * 4 * 16 * 6),
    "gymnax-8x1-learner": dict(env_id="CartPole-v1", num_actors=8, envs_per_actor=1,
                               num_steps=16, total_env_steps=8 * 16 * 6),
    "gymnasium-2x2-threads": dict(env_id="gymnasium:CartPole-v1", num_actors=2,
                                  envs_per_actor=2, num_steps=16, total_env_steps=2 * 2 * 16 * 6,
                                  actor_backend="threads"),
    "gymnasium-16x1-shared": dict(env_id="gymnasium:CartPole-v1", num_actors=16,
                                  envs_per_actor=1, num_steps=16, total_env_steps=16 * 16 * 6,
                                  actor_backend="threads"),
}


def child(name: str) -> None:
    import hashlib

    import flax.serialization
    import jax

    import ppo_async
    from ppo_async import AsyncActorLearnerConfig, train

    config = AsyncActorLearnerConfig(**CONFIGS[name], num_epochs=1, num_minibatches=2, seed=3)
    result = train(config, progress=False)
    data = flax.serialization.to_bytes(jax.device_get(result.params))
    print(json.dumps({"name": name, "sha256": hashlib.sha256(data).hexdigest(),
                      "package": ppo_async.__file__}))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="a348c30", help="the commit to compare with")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ref = pathlib.Path(tmp) / "ref"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref),
                        args.ref], check=True, capture_output=True)
        try:
            for name in CONFIGS:
                shas = {}
                for label, checkout in (("ref", ref), ("here", ROOT)):
                    env = {**os.environ, "PYTHONPATH": str(checkout)}
                    row = common.run_child([__file__, "--child", name], f"{name} at {label}",
                                           env=env)
                    if not row["package"].startswith(str(checkout)):
                        raise RuntimeError(f"{label} ran {row['package']}, not {checkout}'s")
                    shas[label] = row["sha256"]
                rows.append({"config": name, "ref": shas["ref"], "here": shas["here"],
                             "same": shas["ref"] == shas["here"]})
                print(f"{name:24s} {'same' if rows[-1]['same'] else 'DIFFERENT'} "
                      f"({shas['ref'][:12]} / {shas['here'][:12]})", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref)],
                           check=False, capture_output=True)
    common.save_result("layout_bytes", args.out, __file__, argv,
                       {"ref": args.ref, "rows": rows})


if __name__ == "__main__":
    main(sys.argv[1:])
