"""ppo_async: asynchronous actor-learner PPO with V-trace (IMPALA topology) in JAX."""

from ppo_async.version import __version__
from ppo_async.runtime.actor import (
    ActorChannels,
    ActorError,
    ActorHandle,
    ActorStats,
    ActorThrottle,
    Experience,
    actor_thread,
    spawn_actor,
)
from ppo_async.core.advantages import VTraceOutput, gae, vtrace
from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.runtime.learner import (
    LearnerReport,
    LearnerTimeoutError,
    NonFiniteError,
    RolloutBuffer,
    StopTraining,
    learner_loop,
)
from ppo_async.core.losses import ppo_loss
from ppo_async.runtime.messages import (
    PolicyBroadcast,
    PolicyLoadError,
    load_policy_from_broadcast,
    serialize_policy,
)
from ppo_async.train import ShutdownTimeoutError, TrainingInterrupted, TrainResult, train

__all__ = [
    "ActorChannels", "ActorError", "ActorHandle", "ActorStats", "ActorThrottle",
    "AsyncActorLearnerConfig", "ConfigError", "Experience", "LearnerReport",
    "LearnerTimeoutError", "NonFiniteError", "PolicyBroadcast", "PolicyLoadError", "RolloutBuffer", "StopTraining",
    "ShutdownTimeoutError", "TrainResult", "TrainingInterrupted", "VTraceOutput", "actor_thread", "gae", "learner_loop",
    "load_policy_from_broadcast", "ppo_loss", "serialize_policy", "spawn_actor",
    "train", "vtrace",
]
