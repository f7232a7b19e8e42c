"""cleanrl's ``ppo_continuous_action.py``, as cleanrl 1.2.0's wheel installs it, on gymnasium 1.x.

    .venvs/cleanrl/bin/python experiments/peers/cleanrl_bridge.py --result R.json \\
        --env Hopper-v5 --seed 0 --total-env-steps 1000000 --torch-threads default

runs ``cleanrl.ppo_continuous_action`` from the installed package
(``runpy.run_module(..., run_name="__main__")``, its own argparse reading
``--env-id``, ``--seed``, ``--total-timesteps``; its other defaults are the
settings compared: 1 env x 2048 steps, 10 epochs x 32 minibatches, lr 3e-4
annealed, gamma 0.99, lambda 0.95, clip 0.2 with a clipped value loss,
observations and rewards normalized and clipped at 10, 64x64 tanh). Nothing of
cleanrl's file is copied or edited: what it needs from gymnasium 0.28/0.29 is
put in place, from outside, before it runs.

What was bridged (cleanrl 1.2.0 was written against gymnasium 0.28.1; gymnasium
1.0 has the v5 MuJoCo envs and changed these):

1. ``gymnasium.wrappers.TransformObservation(env, func)``: gymnasium 1.0 made
   the new observation space a required third argument. The bridge's subclass
   takes it as optional, ``None`` meaning the env's own space (cleanrl's
   ``np.clip(obs, -10, 10)`` keeps the shape and dtype), which is what 0.28 did.
2. ``gymnasium.vector.SyncVectorEnv``: gymnasium 1.0 resets a finished sub-env on
   the *next* ``step`` (autoreset mode ``NEXT_STEP``), where 0.28 reset it in the
   same step and returned ``infos["final_info"]``, an array holding each
   finished env's info dict (``None`` for the others), which cleanrl reads for
   ``info["episode"]["r"]``. Under ``NEXT_STEP`` cleanrl would see no finished
   episode and would train on one transition per episode across the reset (the
   terminal observation's action, reward 0). The bridge's subclass uses
   gymnasium's ``SAME_STEP`` mode (1.1+: the reset observation returned with the
   finishing step, as 0.28 did) and rewrites its ``final_info`` (one dict of
   batched arrays) and ``final_obs`` into 0.28's ``final_info`` /
   ``final_observation`` arrays of per-env entries.
3. Python: cleanrl 1.2.0 declares ``Requires-Python <3.11``; the only CPU torch
   build at hand is for 3.11, so ``make_venvs.sh`` installs the wheel with
   ``--ignore-requires-python`` and ``--no-deps``, plus what this file imports
   (gymnasium, numpy, torch, tensorboard); its pins of gym 0.23.1,
   stable-baselines3 1.2.0, pygame 2.1.0, wandb and huggingface-hub are for other
   scripts or ``--track``. ``distutils.util.strtobool`` is still in Python 3.11.

Not bridged, only watched: ``torch.utils.tensorboard.SummaryWriter`` is replaced
by a subclass whose ``add_scalar`` notes, before writing as usual, the time and
``global_step`` of each ``charts/SPS`` scalar (written once per update, after
its 10 epochs: the rate's marks) and each ``charts/episodic_return`` (the
returns). ``--torch-threads 1`` calls ``torch.set_num_threads(1)`` first.
"""

from __future__ import annotations

import os
import runpy
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import child  # noqa: E402

PACKAGES = ("cleanrl", "torch", "gymnasium", "mujoco", "numpy", "tensorboard")


def unbatch(info: dict, index: int) -> dict:
    """Env ``index``'s entries of a gymnasium 1.x batched info dict (``_key`` masks dropped)."""
    single = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        single[key] = unbatch(value, index) if isinstance(value, dict) else value[index]
    return single


def gymnasium_bridges():
    """``(TransformObservation, SyncVectorEnv)`` that behave as gymnasium 0.28's (see above)."""
    import gymnasium

    class TransformObservation(gymnasium.wrappers.TransformObservation):
        def __init__(self, env, func, observation_space=None):
            super().__init__(env, func, observation_space)

    class SyncVectorEnv(gymnasium.vector.SyncVectorEnv):
        def __init__(self, env_fns, copy=True, observation_mode="same"):
            super().__init__(env_fns, copy=copy, observation_mode=observation_mode,
                             autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)

        def step(self, actions):
            obs, rewards, terminations, truncations, infos = super().step(actions)
            if "final_info" in infos:
                done = infos.pop("_final_info")
                batched = infos.pop("final_info")
                final_info = np.full(self.num_envs, None, dtype=object)
                for index in np.flatnonzero(done):
                    final_info[index] = unbatch(batched, index)
                infos.update(final_info=final_info, _final_info=done)
            if "final_obs" in infos:
                infos["_final_observation"] = infos.pop("_final_obs")
                infos["final_observation"] = infos.pop("final_obs")
            return obs, rewards, terminations, truncations, infos

    return TransformObservation, SyncVectorEnv


def install_bridges(recorder: child.Recorder) -> None:
    """Put the gymnasium bridges, and the recording writer, where cleanrl's file looks them up."""
    import gymnasium
    import torch.utils.tensorboard

    class RecordingWriter(torch.utils.tensorboard.SummaryWriter):
        def add_scalar(self, tag, scalar_value, global_step=None, *args, **kwargs):
            if tag == "charts/SPS":
                recorder.mark(global_step)
            elif tag == "charts/episodic_return":
                recorder.episode(float(np.asarray(scalar_value).reshape(-1)[0]))
            return super().add_scalar(tag, scalar_value, global_step, *args, **kwargs)

    gymnasium.wrappers.TransformObservation, gymnasium.vector.SyncVectorEnv = gymnasium_bridges()
    torch.utils.tensorboard.SummaryWriter = RecordingWriter


def main(argv=None) -> None:
    args = child.parse_args(argv)
    recorder = child.Recorder()
    threads = child.set_torch_threads(args.torch_threads)
    install_bridges(recorder)
    sys.argv = ["ppo_continuous_action.py", "--env-id", args.env, "--seed", str(args.seed),
                "--total-timesteps", str(args.total_env_steps)]
    recorder.mark(0)
    runpy.run_module("cleanrl.ppo_continuous_action", run_name="__main__", alter_sys=True)
    child.write_result(args.result, recorder.result(
        "cleanrl", PACKAGES, torch_num_threads=threads, argv=sys.argv[1:]))


if __name__ == "__main__":
    main()
