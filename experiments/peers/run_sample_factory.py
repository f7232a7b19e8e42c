"""Run sample-factory's APPO with cleanrl's MuJoCo settings (in the sample_factory venv).

    .venvs/sample_factory/bin/python experiments/peers/run_sample_factory.py --result R.json \\
        --env Hopper-v5 --seed 0 --total-env-steps 1000000 --torch-threads default

sample-factory's parallel runner as its ``train.py`` runs it (``make_runner``,
``init``, ``run``): a learner process, an inference worker and rollout worker
processes, ``async_rl=True`` (APPO: the workers go on collecting with the
current policy while the learner trains). The env is gymnasium's own
(``gym.make(NAME)``, registered under ``--env`` as sample-factory's examples
register theirs; its ``sf_examples.mujoco`` list stops at v4). The layout is
the runtime's hopper preset's, 2 rollout workers x 4 envs (2 splits, double
buffered), with sample-factory's MuJoCo example's ``rollout=64`` (trajectories
of 64 steps: at the preset's 256, sample-factory's sync mode refuses the layout
at start, an assertion in its rollout worker, and in a smoke run its async mode
marked every batch invalid and trained on none), 2048 env steps per training
iteration; sample-factory's ``batch_size`` is the minibatch: 64 x 32 minibatches
(``num_batches_per_epoch``), ``num_epochs=10`` (shuffled), lr 3e-4 decayed
linearly to 0 (``lr_schedule=linear_decay``), Adam eps 1e-5, gamma 0.99, GAE
lambda 0.95, ``ppo_clip_ratio=0.2``, ``ppo_clip_value=0.2``, no entropy bonus,
``value_loss_coeff=0.5``, ``max_grad_norm=0.5``, observations normalized
(``normalize_input``) and returns normalized (``normalize_returns``,
sample-factory's way of scaling rewards), separate 64x64 tanh actor and critic
(``actor_critic_share_weights=False``), a state-independent log-std starting at
std 1 (``adaptive_stddev=False``), no V-trace, no KL loss, on the CPU. Every
other option is sample-factory's default.

Threads: sample-factory sets torch to one thread in its learner and inference
processes (``init_torch_runtime``) and in its rollout workers, whatever
``--torch-threads`` says; ``1`` adds ``OMP_NUM_THREADS=1`` (set by
run_peers.py for every library) and ``torch.set_num_threads(1)`` here.

Marks: each ``learner_env_steps`` report the runner receives (the learner
sends one after every training iteration, with the env steps it has trained
on). The return: the mean of the last 100 episodes' ``reward`` (raw,
unnormalized returns) as the runner receives them; the runner's own mean of
its last ``stats_avg`` (100) is recorded beside it as a check.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import child  # noqa: E402

PACKAGES = ("sample-factory", "torch", "gymnasium", "mujoco", "numpy")


def make_env(env_id, full_env_name, cfg=None, env_config=None, render_mode=None):
    import gymnasium

    return gymnasium.make(env_id, render_mode=render_mode)


# Set as defaults on sample-factory's parser, as its sf_examples/mujoco does (its
# lr_schedule "linear_decay" is not among the command line's choices).
SETTINGS = dict(
    device="cpu", async_rl=True, serial_mode=False, batched_sampling=False,
    num_workers=2, num_envs_per_worker=4, worker_num_splits=2, rollout=64,
    batch_size=64, num_batches_per_epoch=32, num_epochs=10, shuffle_minibatches=True,
    learning_rate=3e-4, lr_schedule="linear_decay", adam_eps=1e-5, gamma=0.99, gae_lambda=0.95,
    ppo_clip_ratio=0.2, ppo_clip_value=0.2, exploration_loss_coeff=0.0, value_loss_coeff=0.5,
    max_grad_norm=0.5, kl_loss_coeff=0.0, with_vtrace=False, normalize_input=True,
    normalize_returns=True, nonlinearity="tanh", encoder_mlp_layers=[64, 64],
    actor_critic_share_weights=False, adaptive_stddev=False, initial_stddev=1.0, use_rnn=False,
    reward_scale=1.0, env_frameskip=1, with_wandb=False,
)


def main(argv=None) -> None:
    args = child.parse_args(argv)
    recorder = child.Recorder()
    threads = child.set_torch_threads(args.torch_threads)

    from sample_factory.algo.utils.misc import EPISODIC, LEARNER_ENV_STEPS, ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner

    env_name = f"gymnasium_{args.env}"
    register_env(env_name, functools.partial(make_env, args.env))
    with tempfile.TemporaryDirectory(prefix="sf_train_") as train_dir:
        sf_args = [f"--env={env_name}", "--experiment=peers", f"--train_dir={train_dir}",
                   f"--seed={args.seed}", f"--train_for_env_steps={args.total_env_steps}"]
        parser, _ = parse_sf_args(argv=sf_args)
        parser.set_defaults(**SETTINGS)
        cfg = parse_full_cfg(parser, sf_args)
        cfg, runner = make_runner(cfg)

        def on_learner_steps(runner, msg, policy_id):
            recorder.mark(msg[LEARNER_ENV_STEPS])

        def on_episode(runner, msg, policy_id):
            reward = msg[EPISODIC].get("reward")
            if reward is not None:
                recorder.episode(reward)

        # Appended beside the runner's own handlers, as register_episodic_stats_handler
        # does: 2.1.1's register_policy_msg_handler puts the function where the list of
        # handlers was (the runner's own then no longer run, and it fails on the next message).
        runner.policy_msg_handlers[LEARNER_ENV_STEPS].append(on_learner_steps)
        runner.register_episodic_stats_handler(on_episode)
        status = runner.init()
        if status == ExperimentStatus.SUCCESS:
            status = runner.run()
        if status != ExperimentStatus.SUCCESS:
            # Its worker processes may still be up and would keep this one alive.
            print(f"sample-factory ended with status {status}", file=sys.stderr, flush=True)
            os._exit(1)
        stats_avg = [float(r) for r in runner.policy_avg_stats.get("reward", [[]])[0]]
    child.write_result(args.result, recorder.result(
        "sample_factory", PACKAGES, torch_num_threads=threads, sf_argv=sf_args,
        sf_settings=SETTINGS,
        stats_avg_return=child.mean_of_last(stats_avg)))


if __name__ == "__main__":
    main()
