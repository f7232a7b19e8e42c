"""ppo_async: asynchronous actor-learner PPO with V-trace (IMPALA topology) in JAX.

The public API, re-exported from where each name lives (docs/design.md maps
the packages).
"""

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.core.advantages import VTraceOutput, gae, vtrace
from ppo_async.core.losses import ppo_loss
from ppo_async.runtime.actor import (
    ActorError,
    ActorHandle,
    ActorStats,
    ActorThrottle,
    QueueEndpoint,
    run_actor,
    spawn_actor,
)
from ppo_async.runtime.learner import (
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
from ppo_async.train import ShutdownTimeoutError, TrainingInterrupted, TrainResult, train
from ppo_async.version import __version__

# The names these two had in the first release: the actor loop runs in Ray
# processes as well as threads, and the queues are one kind of endpoint.
actor_thread = run_actor
ActorChannels = QueueEndpoint

__all__ = [
    "ActorChannels", "ActorError", "ActorHandle", "ActorStats", "ActorThrottle",
    "AsyncActorLearnerConfig", "ConfigError", "Experience", "LearnerReport",
    "LearnerTimeoutError", "NonFiniteError", "PolicyBroadcast", "PolicyLoadError",
    "QueueEndpoint", "RolloutBuffer", "ShutdownTimeoutError", "StopTraining", "TrainResult",
    "TrainingInterrupted", "VTraceOutput", "__version__", "actor_thread", "gae",
    "learner_loop", "load_policy_from_broadcast", "ppo_loss", "run_actor", "serialize_policy",
    "spawn_actor", "train", "vtrace",
]
