"""Run stable-baselines3's PPO with cleanrl's MuJoCo settings (in the sb3 venv).

    .venvs/sb3/bin/python experiments/peers/run_sb3.py --result R.json \\
        --env Hopper-v5 --seed 0 --total-env-steps 1000000 --torch-threads default

One env (``make_vec_env``: a ``Monitor`` for the raw returns, in a
``DummyVecEnv``) under ``VecNormalize`` (observations and rewards, clipped at
10, gamma 0.99); ``PPO("MlpPolicy")`` with ``n_steps=2048``, ``batch_size=64``
(32 minibatches), ``n_epochs=10``, lr 3e-4 annealed linearly to 0, gamma 0.99,
GAE lambda 0.95, ``clip_range=0.2`` and ``clip_range_vf=0.2`` (cleanrl's
clipped value loss), no entropy bonus, ``vf_coef=0.5``, ``max_grad_norm=0.5``,
separate 64x64 tanh actor and critic (sb3's defaults for PPO, written out).
Marks: a callback at each rollout's start (after the previous update's
epochs) and at the end of training. The return: the mean of the last 100
episodes' ``Monitor`` returns, read from the callback's ``infos`` (sb3's own
``ep_info_buffer`` holds the same 100, recorded beside it as a check).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import child  # noqa: E402

PACKAGES = ("stable-baselines3", "torch", "gymnasium", "mujoco", "numpy")


def main(argv=None) -> None:
    args = child.parse_args(argv)
    recorder = child.Recorder()
    threads = child.set_torch_threads(args.torch_threads)

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    class Marks(BaseCallback):
        def _on_rollout_start(self) -> None:
            recorder.mark(self.num_timesteps)

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    recorder.episode(info["episode"]["r"])
            return True

        def _on_training_end(self) -> None:
            recorder.mark(self.num_timesteps)

    env = VecNormalize(make_vec_env(args.env, n_envs=1, seed=args.seed), norm_obs=True,
                       norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=0.99)
    model = PPO(
        "MlpPolicy", env, n_steps=2048, batch_size=64, n_epochs=10,
        learning_rate=lambda progress_remaining: 3e-4 * progress_remaining,
        gamma=0.99, gae_lambda=0.95, clip_range=0.2, clip_range_vf=0.2, ent_coef=0.0,
        vf_coef=0.5, max_grad_norm=0.5, seed=args.seed, device="cpu", verbose=0,
        policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh),
    )
    model.learn(total_timesteps=args.total_env_steps, callback=Marks())
    child.write_result(args.result, recorder.result(
        "sb3", PACKAGES, torch_num_threads=threads,
        ep_info_buffer_return=child.mean_of_last(info["r"] for info in model.ep_info_buffer)))


if __name__ == "__main__":
    main()
