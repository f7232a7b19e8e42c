"""ppo_async: asynchronous actor-learner PPO with V-trace (IMPALA topology) in JAX.

The public API, re-exported from where each name lives (docs/design.md maps
the packages):

- train and evaluate: `train`, `AsyncActorLearnerConfig`, `preset`,
  `evaluate`, `load_run` (a run directory's config and params), `run_sweep`, `run_pbt`,
  `register_single_env` (your own ``gymnasium.Env``), `register_host_env`
  (a simulator that steps a batch itself);
- the errors a caller catches: `ConfigError`, `ActorError`,
  `LearnerTimeoutError`, `NonFiniteError`, `ShutdownTimeoutError`,
  `TrainingInterrupted`, `CheckpointError`, `PolicyLoadError`,
  `UnknownEnvError`, `BackendNotInstalledError`, `HostEnvError`,
  `SweepInterrupted`, `PBTInterrupted`;
- the math and the runtime's parts, for a loop of your own: `gae`, `vtrace`,
  `ppo_loss`, `run_actor`, `learner_loop`, the messages.

Old module paths (``ppo_async.host_envs``, ``ppo_async.learner``, ...) still
import for one release, with a DeprecationWarning naming the new path
(`ppo_async._deprecated`). ``ppo_async.evaluate`` is the function, also after
``import ppo_async.evaluate``.
"""

import sys as _sys

from ppo_async._deprecated import install as _install_old_paths
from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.core.advantages import VTraceOutput, gae, vtrace
from ppo_async.core.keys import unroll_threefry_on_cpu as _unroll_threefry_on_cpu
from ppo_async.core.losses import ppo_loss
from ppo_async.envs.host import HostEnvError, register_single_env
from ppo_async.envs.registry import BackendNotInstalledError, UnknownEnvError, register_host_env
from ppo_async.presets import preset
from ppo_async.resume import load_run
from ppo_async.runs.checkpoint import CheckpointError
from ppo_async.runtime.actor import (
    ActorError,
    ActorHandle,
    ActorStats,
    ActorThrottle,
    QueueEndpoint,
    run_actor,
    spawn_actor,
)
from ppo_async.runtime.evaluate import evaluate
from ppo_async.runtime.learner import (
    LearnerHooks,
    LearnerReport,
    LearnerTimeoutError,
    NonFiniteError,
    RolloutBuffer,
    StopTraining,
    learner_loop,
)
from ppo_async.runtime.messages import (
    Experience,
    PolicyBroadcast,
    PolicyLoadError,
    load_policy_from_broadcast,
    serialize_policy,
)
from ppo_async.pbt.population import PBTInterrupted, run_pbt
from ppo_async.sweep.execute import SweepInterrupted, run_sweep
from ppo_async.train import ShutdownTimeoutError, TrainingInterrupted, TrainResult, train
from ppo_async.version import __version__

# The names these two had in the first release: the actor loop runs in Ray
# processes as well as threads, and the queues are one kind of endpoint.
actor_thread = run_actor
ActorChannels = QueueEndpoint

__all__ = [
    "ActorChannels", "ActorError", "ActorHandle", "ActorStats", "ActorThrottle",
    "AsyncActorLearnerConfig", "BackendNotInstalledError", "CheckpointError", "ConfigError",
    "Experience", "HostEnvError", "LearnerHooks", "LearnerReport", "LearnerTimeoutError", "NonFiniteError",
    "PBTInterrupted", "PolicyBroadcast", "PolicyLoadError", "QueueEndpoint", "RolloutBuffer",
    "ShutdownTimeoutError", "StopTraining", "SweepInterrupted", "TrainResult",
    "TrainingInterrupted", "UnknownEnvError", "VTraceOutput", "__version__", "actor_thread",
    "evaluate", "gae", "learner_loop", "load_policy_from_broadcast", "load_run", "ppo_loss",
    "preset", "register_host_env", "register_single_env", "run_actor", "run_pbt", "run_sweep",
    "serialize_policy", "spawn_actor", "train", "vtrace",
]

_install_old_paths(_sys.modules[__name__])
_unroll_threefry_on_cpu()  # the same bits, compiled faster on CPU (ppo_async.core.keys)
