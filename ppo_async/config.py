"""`AsyncActorLearnerConfig`: every knob of a run, validated on construction.

One frozen dataclass. Each field's docstring is its ``--help`` line in the CLI
(tyro reads them). Derived quantities are properties, never fields written
after parsing. Sweeps use ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

from ppo_async.errors import ConfigError, did_you_mean

if TYPE_CHECKING:  # annotations only: the config imports the math inside its methods
    from jax.sharding import Mesh

    from ppo_async.core.devices import LearnerPlacement
    from ppo_async.core.normalization import NormalizationOptions
    from ppo_async.core.update import UpdateOptions
    from ppo_async.networks.actor_critic import ActorCritic, RecurrentActorCritic

# Literal types, so that the CLI's --help lists the choices; the tuples are what validation reads.
NetworkName = Literal["mlp", "lstm", "gru"]
NETWORKS = get_args(NetworkName)  # the values of AsyncActorLearnerConfig.network
RECURRENT_NETWORKS = ("lstm", "gru")
PPO_RATIO_ANCHORS = ("behaviour", "learner", "ewma")  # AsyncActorLearnerConfig.ppo_ratio_anchor
# The values of AsyncActorLearnerConfig.torso: "auto" and ppo_async.networks.actor_critic.TORSOS.
TorsoName = Literal["auto", "none", "minatar", "nature"]
TORSOS = get_args(TorsoName)
SamplerName = Literal["auto", "actors", "shared", "learner"]
SAMPLERS = get_args(SamplerName)  # the values of AsyncActorLearnerConfig.sampler


DEFAULT_EXACT_LAG = 1  # what exact_policy_lag="auto" is without a max_lead_steps


def _suggest_field_names(cls: type) -> type:
    """Wrap a dataclass's ``__init__`` so that an unknown keyword names the closest field.

    Python's TypeError names only the keyword; the CLI already suggests one.
    ``dataclasses.replace`` calls this too; unpickling does not call ``__init__``.
    """
    generated = cls.__init__
    names = frozenset(field.name for field in dataclasses.fields(cls) if field.init)

    @functools.wraps(generated)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for key in kwargs:
            if key not in names:
                raise TypeError(f"{cls.__name__}() got an unexpected keyword argument "
                                f"{key!r}{did_you_mean(key, names)}")
        generated(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


@_suggest_field_names
@dataclasses.dataclass(frozen=True)
class AsyncActorLearnerConfig:
    """Configuration of one asynchronous actor-learner PPO run."""

    # --- run ---
    env_id: str = "CartPole-v1"
    """Environment id; its prefix picks the backend. gymnax ids need none (CartPole-v1, Breakout-MinAtar); host envs are gymnasium:ID, envpool:ID or host:NAME, your own, registered by a module of env_modules (docs/guide/environments.md)."""
    env_modules: tuple[str, ...] = ()
    """Python modules imported before the env id is looked up (they register custom envs); recorded in config.json so eval, enjoy, --resume and sweeps rebuild the env."""
    envpool_kwargs: tuple[tuple[str, bool | int | float], ...] = ()
    """Extra envpool.make() settings for envpool ids as (name, value) pairs, e.g. --envpool-kwargs episodic_life False.
    They apply over the standard Atari settings, in training and evaluation alike (docs/guide/mujoco_atari.md)."""
    gymnasium_kwargs: tuple[tuple[str, bool | int | float], ...] = ()
    """Keyword arguments of a gymnasium env's constructor as (name, value) pairs, for training and evaluation alike, e.g. --gymnasium-kwargs max_episode_steps 500 (gymnasium.make's time limit; docs/guide/environments.md)."""
    total_env_steps: int = 500_000
    """Environment steps the learner consumes before the run ends."""
    seed: int = 0
    """Seed of every random key in the run (actor i uses fold_in(key, i))."""

    # --- topology ---
    num_actors: int = 2
    """Actors, each with its own batch of environments (where they run: actor_backend)."""
    envs_per_actor: int = 4
    """Environments stepped together by one actor."""
    num_steps: int = 64
    """Rows (env steps per env) in one actor chunk and in one column of the learner's batch."""
    broadcast_every: int = 1
    """The learner sends new weights to the actors every this many updates."""
    exact_policy_lag: int | Literal["auto"] | None = "auto"
    """Each chunk feeding update u is collected with exactly the params of update u - 1 - exact_policy_lag (0: lock-step), so a run is fixed by its seed. None: free-running actors, held by max_lead_steps. 'auto': 1, or None when max_lead_steps is given."""
    max_lead_steps: int | None = None
    """Free-running actors: steps per env an actor may run ahead of what the learner consumed from it. None: two chunks (with an exact lag, the lead it implies). Given alone, it chooses free-running actors."""
    learner_timeout_s: float = 60.0
    """The run fails, naming the actor, if an actor the learner waits on sends nothing for this long."""
    shutdown_timeout_s: float = 30.0
    """How long the end of a run waits for each thread (actors, evaluator, compile) to stop before reporting it as stuck."""
    freeze_watchdog: bool = True
    """With thread actors, a learner that cannot run for 2 x learner_timeout_s (a thread holds the GIL) ends the process with every thread's stack on stderr and in RUN_DIR/error.txt. False leaves faulthandler's one timer to your own use."""

    # --- transport ---
    actor_backend: Literal["auto", "threads", "processes", "ray"] = "auto"
    """Where actors run: 'threads' of the learner's process, 'processes' of this machine, or 'ray'. 'auto': processes for a host env whose factory can be sent, else threads (never Ray unless ray_address is set); docs/guide/collection.md has the table."""
    actors_per_process: int | None = None
    """Actors each actor process runs, as threads sharing its JAX (setting it chooses processes). None: one process per core, ceil(num_actors / cores); set it to fix a run's bits across machines."""
    pin_actor_processes: bool = True
    """Each actor process (and each Ray actor of a private local instance) runs on a core of its own, where there are no more processes than cores. Set False for an env that starts processes of its own."""
    batch_inference: bool | None = None
    """Thread actors of one process share their jitted calls (host envs each step's policy call, gymnax one rollout program), with other bits than calling alone. None: from 8 actors (gymnax) or 16 (host envs) a process; False: never."""
    sampler: SamplerName = "auto"
    """Who steps the actors' envs: 'actors' (each its own), 'shared' (one thread per process for all its actors) or 'learner' (gymnax, in the learner's program). 'auto': 'learner' where it can, else 'shared' from 16 host actors a process (docs/guide/collection.md)."""
    env_workers: int = 0
    """gymnasium: and host: envs of each actor step in this many worker processes (no JAX there), observations in shared memory. 0: the actor's thread steps them."""
    env_groups: int | None = None
    """With env workers: each actor's envs in this many groups, one stepping while the policy acts for another. Must divide envs_per_actor. None: 2 with env workers where envs_per_actor is even, else 1."""
    ray_address: str | None = None
    """With actor_backend='ray': None starts a private local Ray instance sized to this machine and shuts it down when the run ends; 'auto' or 'host:port' joins a running cluster (ray start) and leaves it running."""
    ray_num_cpus_per_actor: float = 1.0
    """With actor_backend='ray': CPUs Ray reserves for each actor process (its JAX runs one intra-op thread)."""
    ray_start_timeout_s: float = 120.0
    """With actor_backend='ray': how long the run waits for actor processes to start (a process, JAX's import, the envs) before the learner's hang clock starts; an actor not up by then is named in LearnerTimeoutError."""
    ray_actor_resources: tuple[tuple[str, float], ...] = ()
    """With actor_backend='ray', custom Ray resources each actor requests as (name, amount) pairs, e.g. to place actors on the nodes started with ray start --resources (docs/guide/ray.md)."""

    # --- off-policy correction ---
    use_vtrace: bool = False
    """Advantages and value targets by V-trace under the learner's current critic (True), or GAE on the behaviour values (False)."""
    ppo_ratio_anchor: Literal["behaviour", "learner", "ewma"] = "behaviour"
    """The policy the clipped ratio is centred on: 'behaviour' (the one that collected the data, standard PPO), 'learner' (the learner's params at the update's start) or 'ewma' (their moving average); see docs/guide/offpolicy.md."""
    proximal_ewma_decay: float = 0.9
    """With ppo_ratio_anchor='ewma': decay of the params' moving average per optimizer step (bias-corrected)."""
    is_weight_max: float = 100.0
    """With ppo_ratio_anchor 'learner' or 'ewma': cap on the importance weight pi_prox / mu of each sample."""
    max_policy_lag: int | None = None
    """Samples collected more than this many learner updates ago are left out of the loss (counted as dropped_fraction). None: keep every sample."""
    vtrace_rho_bar: float = 1.0
    """V-trace clip on the importance weight in the TD errors."""
    vtrace_c_bar: float = 1.0
    """V-trace clip on the trace-cutting coefficients."""
    vtrace_pg_rho_bar: float | None = None
    """V-trace's policy-gradient advantage. None: unweighted, q_s - V(x_s), as the PPO ratio already weights each sample by pi / mu; a number: IMPALA's min(vtrace_pg_rho_bar, rho_s) * (q_s - V(x_s)), as sample-factory's APPO."""
    vtrace_lambda: float = 1.0
    """V-trace lambda (1: the paper's V-trace; on-policy V-trace equals GAE with the same lambda)."""

    # --- normalization (ppo_async.core.normalization) ---
    normalize_observations: bool = False
    """Normalize observations by running statistics, clip((obs - mean) / sqrt(var + 1e-8), -obs_clip, obs_clip), which the learner updates and broadcasts with the params (docs/guide/configuration.md)."""
    normalize_rewards: bool = False
    """Scale rewards by the spread of a running discounted return, as cleanrl's NormalizeReward, clipped to [-reward_clip, reward_clip] (docs/guide/configuration.md)."""
    obs_clip: float = 10.0
    """With normalize_observations: normalized observations are clipped to [-obs_clip, obs_clip]."""
    reward_clip: float = 10.0
    """With normalize_rewards: scaled rewards are clipped to [-reward_clip, reward_clip]."""

    # --- PPO ---
    learning_rate: float = 5e-4
    """Adam learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    num_epochs: int = 4
    """Passes over each batch per update."""
    num_minibatches: int = 4
    """Minibatches per epoch; must divide the batch (num_actors * envs_per_actor * num_steps)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (without V-trace)."""
    clip_eps: float = 0.2
    """PPO surrogate clip epsilon."""
    value_clip_eps: float | None = None
    """Clip of the value update: the value loss takes the larger error of V and of V clipped to old_value +- value_clip_eps (cleanrl's clip_vloss). None: no value clipping."""
    normalize_advantages: bool = True
    """Standardise the advantages of each minibatch (mean 0, std 1) before the surrogate."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""

    # --- network ---
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the actor and critic MLPs."""
    network: NetworkName = "mlp"
    """Policy network: mlp (feed-forward), or lstm / gru (a recurrent cell whose state the actors carry across chunks and the learner re-unrolls from; needs num_minibatches to divide the envs)."""
    rnn_hidden_size: int = 128
    """Features of the LSTM / GRU cell (ignored by mlp)."""
    init_log_std: float = 0.0
    """Continuous actions, the initial log-std of the Gaussian policy (a learned vector, independent of the state); 0 is a std of 1, as in cleanrl's PPO."""
    torso: TorsoName = "auto"
    """What reads the observation before the MLPs: 'none' (the observation flattened, an image too), 'minatar' (one 3x3 conv), 'nature' (the Nature-DQN CNN) or 'auto' (nature for envpool Atari ids, minatar for other images, else none); see docs/guide/mujoco_atari.md."""

    # --- reliability ---
    max_actor_restarts: int = 0
    """Restarts allowed per actor after it raises (0: an actor's exception ends the run)."""
    checkpoint_every_updates: int = 0
    """Also write a checkpoint every this many updates (0: by wall time only). Checkpoints need a run directory."""
    checkpoint_every_s: float = 300.0
    """Write a checkpoint when this many seconds have passed since the last one (0: by update count only). Runs with a run directory also save at the end and on Ctrl-C."""
    keep_checkpoints: int = 3
    """Newest checkpoints kept on disk."""
    eval_every_updates: int = 0
    """Evaluate the greedy policy every this many updates (0: never), whole episodes of the env's own reward, on an evaluator thread with its own envs that the learner never waits for (docs/guide/first_run.md)."""
    eval_episodes: int = 10
    """Episodes per periodic evaluation."""

    # --- devices ---
    learner_device: str | None = None
    """Device(s) of the learner's params and update: 'cpu', 'gpu:0', a list such as 'gpu:0,gpu:1', or 'gpu:all'. Several: the update is data-parallel, the batch split along its envs. None: JAX's default device (docs/guide/actors_devices.md)."""
    actor_device: str = "cpu"
    """Device the actors run inference on, as 'platform' or 'platform:index'."""

    # --- startup ---
    compilation_cache_dir: str | None = None
    """Persistent compilation cache: a later run of the same config loads its compiled programs from this directory instead of compiling them. 'default': ~/.cache/ppo_async/jax (under $XDG_CACHE_HOME if set). None: off."""

    def __post_init__(self) -> None:
        if self.sampler is None:  # config.json files written before 'auto' hold None
            object.__setattr__(self, "sampler", "auto")
        if isinstance(self.env_modules, list):  # as config.json and TOML files hold it
            object.__setattr__(self, "env_modules", tuple(self.env_modules))
        for name in ("ray_actor_resources", "envpool_kwargs", "gymnasium_kwargs"):
            pairs = getattr(self, name)
            if isinstance(pairs, (list, tuple)) and all(
                isinstance(pair, (list, tuple)) for pair in pairs
            ):
                # Pairs given as lists (config.json stores them so): a tuple of tuples.
                object.__setattr__(self, name, _as_tuples(pairs))
        _validate(self)
        if self.max_lead_steps is not None and self.exact_lag is not None:
            # Only an exact lag given on purpose meets a lead here ("auto" beside one is None).
            exact_lead = (self.exact_lag + self.broadcast_every) * self.num_steps
            if self.max_lead_steps != exact_lead:
                raise ConfigError(
                    f"max_lead_steps={self.max_lead_steps} with exact_policy_lag="
                    f"{self.exact_policy_lag}: the exact lag fixes the lead at (exact_policy_lag "
                    f"+ broadcast_every) * num_steps = {exact_lead}; leave max_lead_steps unset, "
                    "or set exact_policy_lag=None for free-running actors with this lead"
                )
        if self.lead_steps < self.num_steps * self.broadcast_every:
            raise ConfigError(
                f"max_lead_steps={self.lead_steps} is below num_steps * "
                f"broadcast_every = {self.num_steps * self.broadcast_every}: actors "
                "would wait for a broadcast the learner can never send. Set it to at "
                "least that (num_steps alone with broadcast_every=1 is lock-step)."
            )

    # --- derived ---
    @property
    def num_envs(self) -> int:
        """Environments over all actors."""
        return self.num_actors * self.envs_per_actor

    @property
    def batch_size(self) -> int:
        """Env steps in one learner update."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        """Learner updates in the run."""
        return self.total_env_steps // self.batch_size

    @property
    def exact_lag(self) -> int | None:
        """The exact policy lag in force; None: free-running actors.

        ``exact_policy_lag`` with "auto" resolved (`resolve_exact_lag`): 1, or
        None beside a ``max_lead_steps``.
        """
        return resolve_exact_lag(self.exact_policy_lag, self.max_lead_steps)

    @property
    def lead_steps(self) -> int:
        """The valve's lead in force, in steps per env: ``max_lead_steps``, or one derived.

        Unset, it is derived from the sizes on every read (so
        ``dataclasses.replace(cfg, num_steps=...)`` derives it again): with an
        exact lag the ``(exact_lag + broadcast_every)`` chunks it implies,
        free-running two chunks of the broadcast period.
        """
        if self.max_lead_steps is not None:
            return self.max_lead_steps
        if self.exact_lag is not None:
            return (self.exact_lag + self.broadcast_every) * self.num_steps
        return 2 * self.num_steps * self.broadcast_every

    @property
    def max_lead_chunks(self) -> int:
        """The valve's lead in whole chunks; the policy lag is at most this minus one."""
        return self.lead_steps // self.num_steps

    @property
    def recurrent(self) -> bool:
        """The policy carries a hidden state (network is lstm or gru)."""
        return self.network in RECURRENT_NETWORKS

    @property
    def learner_bootstraps_truncation(self) -> bool:
        """Truncated episodes are bootstrapped by the learner's current critic (V-trace, feed-forward).

        Then the actors send each truncated step's final observation instead of
        folding ``gamma * V_mu(final_obs)`` into its reward; a recurrent
        policy's final value needs the state the actor had, so it keeps the fold.
        """
        return self.use_vtrace and not self.recurrent

    @property
    def network_torso(self) -> str:
        """The ``torso`` given to `ppo_async.networks.actor_critic.make_network`: "auto" becomes "nature" for envpool: Atari ids; any other "auto" make_network resolves from the observation's rank."""
        from ppo_async.envs.registry import is_envpool_atari

        if self.torso == "auto" and is_envpool_atari(self.env_id):
            return "nature"
        return self.torso

    @property
    def lock_step(self) -> bool:
        """Actors never run ahead: every chunk is collected under the newest params."""
        return self.lead_steps == self.num_steps and self.broadcast_every == 1

    # --- the math's options: built here, the one place fields become them ---
    # Each imports its module when called, so importing the config imports no jax.

    def update_options(self) -> UpdateOptions:
        """`ppo_async.core.update.UpdateOptions`, the update's hyperparameters, from the fields."""
        from ppo_async.core.update import UpdateOptions

        return UpdateOptions(
            num_updates=self.num_updates, learning_rate=self.learning_rate,
            anneal_lr=self.anneal_lr, max_grad_norm=self.max_grad_norm,
            num_epochs=self.num_epochs, num_minibatches=self.num_minibatches,
            gamma=self.gamma, gae_lambda=self.gae_lambda, use_vtrace=self.use_vtrace,
            vtrace_lambda=self.vtrace_lambda, vtrace_rho_bar=self.vtrace_rho_bar,
            vtrace_c_bar=self.vtrace_c_bar, vtrace_pg_rho_bar=self.vtrace_pg_rho_bar,
            max_policy_lag=self.max_policy_lag, ppo_ratio_anchor=self.ppo_ratio_anchor,
            proximal_ewma_decay=self.proximal_ewma_decay, is_weight_max=self.is_weight_max,
            clip_eps=self.clip_eps, value_clip_eps=self.value_clip_eps,
            normalize_advantages=self.normalize_advantages, vf_coef=self.vf_coef,
            ent_coef=self.ent_coef,
        )

    def normalization_options(self) -> NormalizationOptions:
        """`ppo_async.core.normalization.NormalizationOptions` from ``normalize_*``, ``*_clip``."""
        from ppo_async.core.normalization import NormalizationOptions

        return NormalizationOptions(bool(self.normalize_observations), bool(self.normalize_rewards),
                                    float(self.obs_clip), float(self.reward_clip))

    def env_make_kwargs(self) -> dict[str, Any]:
        """The keyword arguments `ppo_async.envs.host.make_host_env` gets for this run's envs."""
        return {"envpool_kwargs": self.envpool_kwargs, "gymnasium_kwargs": self.gymnasium_kwargs}

    def make_network(self, observation_shape: Sequence[int],
                     action_space: Any) -> ActorCritic | RecurrentActorCritic:
        """`ppo_async.networks.actor_critic.make_network` with this config's network fields.

        The one place actors, learner, evaluation and the twin build their
        network, so all of them get the same one. A torso that cannot read the
        env's observations, or an action space no head acts in (known only
        once the env exists), is a `ConfigError` naming the field.
        """
        from ppo_async.networks.actor_critic import make_network

        try:
            return make_network(observation_shape, action_space, hidden_sizes=self.hidden_sizes,
                                network=self.network, rnn_hidden_size=self.rnn_hidden_size,
                                torso=self.network_torso, init_log_std=self.init_log_std)
        except ValueError as error:
            if "action space" in str(error):
                raise ConfigError(f"env_id={self.env_id!r}: {error}") from None
            if "torso" not in str(error):
                raise
            raise ConfigError(
                f"torso={self.torso!r} with env_id={self.env_id!r}: {error}") from None

    def learner_placement(self) -> LearnerPlacement:
        """The devices ``learner_device`` names, looked up.

        Raises `ConfigError` if the batch does not split over them.
        """
        from ppo_async.core.devices import LearnerPlacement, resolve_devices

        devices = resolve_devices(self.learner_device)
        check_learner_devices(self, len(devices))
        return LearnerPlacement(devices)

    def learner_mesh(self) -> Mesh | None:
        """The mesh of a ``learner_device`` of several devices; None for one (not looked up).

        Raises `ConfigError` if the batch does not split over them.
        """
        from ppo_async.core.devices import learner_mesh

        mesh = learner_mesh(self.learner_device)
        if mesh is not None:
            check_learner_devices(self, mesh.devices.size)
        return mesh

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields as given (tuples become lists; "auto" and None stay, never resolved)."""
        return {
            f.name: list(v) if isinstance(v, tuple) else v
            for f in dataclasses.fields(self)
            for v in [getattr(self, f.name)]
        }


def resolve_exact_lag(exact_policy_lag: int | str | None,
                      max_lead_steps: int | None) -> int | None:
    """The exact policy lag a config's two fields put in force; None: free-running actors.  "auto" is `DEFAULT_EXACT_LAG`, or free-running when a ``max_lead_steps`` is given (a lead alone chooses free-running actors); anything else is itself. Takes the fields, so that a saved config's dict resolves the same. """
    if exact_policy_lag == "auto":
        return None if max_lead_steps is not None else DEFAULT_EXACT_LAG
    return exact_policy_lag


def _as_tuples(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(item) for item in value)
    return value


def fields_from_json(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Config fields read from JSON or TOML, every array made the tuple a field holds."""
    return {name: _as_tuples(value) for name, value in fields.items()}


def _require(condition: bool, field: str, value: Any, fix: str) -> None:
    if not condition:
        raise ConfigError(f"{field}={value!r}: {fix}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _validate(cfg: AsyncActorLearnerConfig) -> None:
    # Imported here so that a bad env id is reported as a config error without
    # making the config module depend on gymnax (or any env backend) at import time.
    from ppo_async.envs.registry import EnvModuleError, env_id_problem, import_env_modules

    _require(isinstance(cfg.env_modules, tuple)
             and all(isinstance(m, str) and m.strip() for m in cfg.env_modules),
             "env_modules", cfg.env_modules,
             "must be a tuple (or list) of module names, e.g. ('my_pkg.envs',); in a TOML "
             "file env_modules = [\"my_pkg.envs\"]")
    try:  # before the env id: the modules register it
        import_env_modules(cfg.env_modules)
    except EnvModuleError as error:
        _require(False, "env_modules", cfg.env_modules, str(error))
    env_problem = env_id_problem(cfg.env_id)
    _require(env_problem is None, "env_id", cfg.env_id, env_problem)
    _validate_make_kwargs(cfg)
    for name in ("num_actors", "envs_per_actor", "num_steps", "broadcast_every",
                 "num_epochs", "num_minibatches", "total_env_steps"):
        value = getattr(cfg, name)
        _require(_is_int(value) and value >= 1, name, value, "must be an integer >= 1")
    for name in ("seed", "max_actor_restarts", "checkpoint_every_updates",
                 "eval_every_updates"):
        value = getattr(cfg, name)
        _require(_is_int(value) and value >= 0, name, value, "must be an integer >= 0")
    for name in ("keep_checkpoints", "eval_episodes"):
        value = getattr(cfg, name)
        _require(_is_int(value) and value >= 1, name, value, "must be an integer >= 1")
    _require(cfg.exact_policy_lag is None or cfg.exact_policy_lag == "auto"
             or (_is_int(cfg.exact_policy_lag) and cfg.exact_policy_lag >= 0),
             "exact_policy_lag", cfg.exact_policy_lag,
             "must be 'auto', None (free-running actors; a TOML file, which has no null, "
             "leaves it out and sets max_lead_steps) or an integer >= 0")
    if cfg.max_lead_steps is not None:
        _require(_is_int(cfg.max_lead_steps) and cfg.max_lead_steps >= 1,
                 "max_lead_steps", cfg.max_lead_steps,
                 "must be an integer >= 1, or None for two chunks")
    for name in ("learner_timeout_s", "shutdown_timeout_s"):
        value = getattr(cfg, name)
        _require(_is_number(value) and value > 0, name, value, "must be a number > 0")
    _require(_is_number(cfg.init_log_std) and -10 <= cfg.init_log_std <= 5, "init_log_std",
             cfg.init_log_std, "must be a number in [-10, 5] (the initial std is its exp)")
    _require(_is_number(cfg.checkpoint_every_s) and cfg.checkpoint_every_s >= 0,
             "checkpoint_every_s", cfg.checkpoint_every_s, "must be a number >= 0 (0: off)")
    for name in ("use_vtrace", "anneal_lr", "normalize_observations", "normalize_rewards",
                 "freeze_watchdog", "normalize_advantages"):
        _require(isinstance(getattr(cfg, name), bool), name, getattr(cfg, name),
                 "must be True or False")
    _validate_env_layout(cfg)
    _validate_ppo(cfg)
    _require(
        isinstance(cfg.hidden_sizes, tuple) and len(cfg.hidden_sizes) >= 1
        and all(_is_int(h) and h >= 1 for h in cfg.hidden_sizes),
        "hidden_sizes", cfg.hidden_sizes, "must be a non-empty tuple of integers >= 1",
    )
    _validate_network(cfg)
    batch_size = cfg.num_actors * cfg.envs_per_actor * cfg.num_steps
    _require(
        batch_size % cfg.num_minibatches == 0, "num_minibatches", cfg.num_minibatches,
        f"must divide the batch num_actors * envs_per_actor * num_steps = {batch_size}",
    )
    _require(
        cfg.total_env_steps >= batch_size, "total_env_steps", cfg.total_env_steps,
        f"must be at least one batch (num_actors * envs_per_actor * num_steps = {batch_size})",
    )
    if cfg.anneal_lr:
        schedule_steps = (cfg.total_env_steps // batch_size) * cfg.num_epochs * cfg.num_minibatches
        _require(
            schedule_steps < 2**31, "total_env_steps", cfg.total_env_steps,
            f"with anneal_lr the learning-rate schedule counts {schedule_steps} optimizer "
            "steps, past the int32 step counter; lower it or set anneal_lr=False",
        )
    if cfg.compilation_cache_dir is not None:
        from ppo_async.runs.compile_cache import resolve_cache_dir

        _require(isinstance(cfg.compilation_cache_dir, str) and cfg.compilation_cache_dir.strip(),
                 "compilation_cache_dir", cfg.compilation_cache_dir,
                 "must be a directory path, 'default' (~/.cache/ppo_async/jax) or None")
        _require(not resolve_cache_dir(cfg.compilation_cache_dir).is_file(),
                 "compilation_cache_dir", cfg.compilation_cache_dir,
                 "is a file; name a directory (it is created if missing)")
    _validate_transport(cfg)
    from ppo_async.core.devices import parse_device_list, parse_device_spec

    _require(isinstance(cfg.actor_device, str) and parse_device_spec(cfg.actor_device) is not None,
             "actor_device", cfg.actor_device, "must look like 'cpu', 'gpu:0' or 'cpu:1'")
    if cfg.learner_device is not None:
        parsed = parse_device_list(cfg.learner_device) if isinstance(
            cfg.learner_device, str) else None
        _require(parsed is not None, "learner_device", cfg.learner_device,
                 "must look like 'cpu', 'gpu:0', a list of one platform's devices "
                 "('gpu:0,gpu:1', no repeats) or 'gpu:all'")
        if parsed[1] is not None:  # the count is known before any device is looked up
            check_learner_devices(cfg, len(parsed[1]))


def _validate_env_layout(cfg: AsyncActorLearnerConfig) -> None:
    from ppo_async.envs.registry import GYMNASIUM, GYMNAX, HOST, split_env_id

    _require(cfg.sampler != "learner" or split_env_id(cfg.env_id)[0] == GYMNAX, "sampler",
             cfg.sampler, f"runs jitted envs only, inside the learner's program; "
             f"{cfg.env_id} steps on the host: use sampler='auto'")
    _require(cfg.sampler != "shared" or split_env_id(cfg.env_id)[0] != GYMNAX
             or cfg.actor_backend in ("auto", "threads"), "sampler", cfg.sampler,
             f"for a gymnax env ({cfg.env_id}) applies to thread actors only (actor_backend="
             "'threads'): an actor process calls its actors' chunks from their own threads; "
             "leave it 'auto'")

    _require(_is_int(cfg.env_workers) and cfg.env_workers >= 0,
             "env_workers", cfg.env_workers, "must be an integer >= 0 (0: the actor's thread)")
    _require(cfg.env_groups is None or (_is_int(cfg.env_groups) and cfg.env_groups >= 1),
             "env_groups", cfg.env_groups, "must be None (auto) or an integer >= 1")
    if split_env_id(cfg.env_id)[0] not in (GYMNASIUM, HOST):
        for name, neutral in (("env_workers", 0), ("env_groups", 1)):
            _require(getattr(cfg, name) in (None, neutral), name, getattr(cfg, name),
                     f"applies to gymnasium: and host: envs only ({cfg.env_id} steps its "
                     "envs its own way: gymnax inside the jitted rollout, envpool in its "
                     "threads); leave it None")
        return
    if cfg.env_groups is not None:  # None is decided with the layout (ppo_async.runtime.layout)
        groups, workers = cfg.env_groups, cfg.env_workers
        _require(cfg.envs_per_actor % groups == 0 and cfg.envs_per_actor // groups >= workers,
                 "env_groups", groups,
                 f"{groups} groups of {workers} env workers need envs_per_actor "
                 f"({cfg.envs_per_actor}) divisible by {groups} with at least {workers} envs "
                 "per group (one per worker)" if workers else
                 f"{groups} groups need envs_per_actor ({cfg.envs_per_actor}) divisible by {groups}")


def _validate_ppo(cfg: AsyncActorLearnerConfig) -> None:
    """The loss, the off-policy correction and their coefficients."""
    _require(cfg.ppo_ratio_anchor in PPO_RATIO_ANCHORS, "ppo_ratio_anchor",
             cfg.ppo_ratio_anchor, f"must be one of {', '.join(PPO_RATIO_ANCHORS)}")
    _require(_is_number(cfg.proximal_ewma_decay) and 0 <= cfg.proximal_ewma_decay < 1,
             "proximal_ewma_decay", cfg.proximal_ewma_decay, "must be a number in [0, 1)")
    _require(_is_number(cfg.is_weight_max) and cfg.is_weight_max >= 1, "is_weight_max",
             cfg.is_weight_max, "must be a number >= 1")
    _require(cfg.max_policy_lag is None or (_is_int(cfg.max_policy_lag) and cfg.max_policy_lag >= 0),
             "max_policy_lag", cfg.max_policy_lag, "must be None or an integer >= 0")
    _require(cfg.value_clip_eps is None
             or (_is_number(cfg.value_clip_eps) and cfg.value_clip_eps > 0),
             "value_clip_eps", cfg.value_clip_eps, "must be None or a number > 0")
    _require(cfg.vtrace_pg_rho_bar is None
             or (_is_number(cfg.vtrace_pg_rho_bar) and cfg.vtrace_pg_rho_bar > 0),
             "vtrace_pg_rho_bar", cfg.vtrace_pg_rho_bar, "must be None or a number > 0")
    for name in ("vtrace_rho_bar", "vtrace_c_bar", "learning_rate", "clip_eps",
                 "max_grad_norm", "obs_clip", "reward_clip"):
        value = getattr(cfg, name)
        _require(_is_number(value) and value > 0, name, value, "must be a number > 0")
    for name in ("vf_coef", "ent_coef"):
        value = getattr(cfg, name)
        _require(_is_number(value) and value >= 0, name, value, "must be a number >= 0")
    for name in ("gamma", "gae_lambda", "vtrace_lambda"):
        value = getattr(cfg, name)
        _require(_is_number(value) and 0 <= value <= 1, name, value,
                 "must be a number in [0, 1]")


def _validate_make_kwargs(cfg: AsyncActorLearnerConfig) -> None:
    """``envpool_kwargs`` and ``gymnasium_kwargs``: pairs of settings the env's backend takes."""
    from ppo_async.envs.registry import envpool_kwargs_problem, gymnasium_kwargs_problem

    for field, example, problem_of in (
        ("envpool_kwargs", "(('episodic_life', False),)", envpool_kwargs_problem),
        ("gymnasium_kwargs", "(('include_cfrc_ext_in_observation', False),)",
         gymnasium_kwargs_problem),
    ):
        pairs = getattr(cfg, field)
        _require(
            isinstance(pairs, tuple) and all(
                isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and isinstance(pair[1], (bool, int, float)) for pair in pairs
            ),
            field, pairs, f"must be (name, value) pairs with a bool, int or float value, e.g. "
            f"{example}",
        )
        names = [name for name, _ in pairs]
        _require(len(set(names)) == len(names), field, pairs, "names a setting twice")
        problem = problem_of(cfg.env_id, pairs)
        _require(problem is None, field, pairs, problem)


def _validate_network(cfg: AsyncActorLearnerConfig) -> None:
    _require(cfg.network in NETWORKS, "network", cfg.network,
             "must be one of " + ", ".join(NETWORKS))
    _require(cfg.torso in TORSOS, "torso", cfg.torso, "must be one of " + ", ".join(TORSOS))
    _require(_is_int(cfg.rnn_hidden_size) and cfg.rnn_hidden_size >= 1, "rnn_hidden_size",
             cfg.rnn_hidden_size, "must be an integer >= 1")
    if cfg.network not in RECURRENT_NETWORKS:
        return
    num_envs = cfg.num_actors * cfg.envs_per_actor
    # The learner re-unrolls whole sequences, so minibatches split the envs,
    # never the time axis.
    _require(num_envs % cfg.num_minibatches == 0, "num_minibatches", cfg.num_minibatches,
             f"with network={cfg.network!r} minibatches are whole env sequences, so it "
             f"must divide num_actors * envs_per_actor = {num_envs}")


def _validate_transport(cfg: AsyncActorLearnerConfig) -> None:
    _require(cfg.actor_backend in ("auto", "threads", "processes", "ray"), "actor_backend",
             cfg.actor_backend, "must be 'auto', 'threads', 'processes' or 'ray'")
    _require(cfg.ray_address is None or (isinstance(cfg.ray_address, str) and cfg.ray_address),
             "ray_address", cfg.ray_address,
             "must be None (a private local Ray instance), 'auto' or 'host:port' of a cluster")
    _require(_is_number(cfg.ray_start_timeout_s) and cfg.ray_start_timeout_s > 0,
             "ray_start_timeout_s", cfg.ray_start_timeout_s, "must be a number > 0")
    _require(_is_number(cfg.ray_num_cpus_per_actor) and cfg.ray_num_cpus_per_actor >= 0,
             "ray_num_cpus_per_actor", cfg.ray_num_cpus_per_actor, "must be a number >= 0")
    _require(
        isinstance(cfg.ray_actor_resources, tuple) and all(
            isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and pair[0]
            and _is_number(pair[1]) and pair[1] > 0
            for pair in cfg.ray_actor_resources
        ),
        "ray_actor_resources", cfg.ray_actor_resources,
        "must be (name, amount) pairs with a non-empty name and an amount > 0, "
        "e.g. (('actor_node', 1),)",
    )
    _require(cfg.actors_per_process is None or (
        _is_int(cfg.actors_per_process) and cfg.actors_per_process >= 1),
        "actors_per_process", cfg.actors_per_process, "must be None (a process per core) or an "
        "integer >= 1")
    _require(cfg.sampler in SAMPLERS, "sampler", cfg.sampler, f"must be one of {SAMPLERS}")
    _require(cfg.sampler != "learner" or cfg.actor_backend in ("auto", "threads"), "sampler",
             cfg.sampler,
             f"the learner's program collects the chunks in the learner's process: it "
             f"cannot with actor_backend={cfg.actor_backend!r}; use actor_backend='threads'")
    _require(cfg.sampler != "learner" or cfg.exact_lag is not None, "sampler", cfg.sampler,
             "collects every chunk with the params its exact lag names: free-running actors "
             "(exact_policy_lag=None, or a max_lead_steps alone) cannot; set exact_policy_lag")
    _require(cfg.sampler != "learner" or cfg.broadcast_every == 1, "sampler", cfg.sampler,
             f"reads the learner's params after every update: broadcast_every="
             f"{cfg.broadcast_every} has no meaning there; leave it 1")
    _require(cfg.sampler != "shared" or cfg.actor_backend != "ray", "sampler", cfg.sampler,
             "'shared' needs several actors in a process: actor_backend 'threads' or "
             "'processes' (a Ray actor process runs one actor)")
    _require(cfg.actors_per_process is None or cfg.actor_backend in ("auto", "processes"),
             "actors_per_process", cfg.actors_per_process,
             f"applies to actor_backend='processes' only (this run's is {cfg.actor_backend!r})")
    if cfg.actor_backend in ("auto", "threads") and cfg.actors_per_process is None:
        return
    from ppo_async.core.devices import parse_device_spec

    if cfg.actor_backend == "ray":
        _require(importlib.util.find_spec("ray") is not None, "actor_backend", cfg.actor_backend,
                 "Ray is not installed; pip install 'ppo-async[ray]' (or use "
                 "actor_backend='processes' on one machine)")
    _require(parse_device_spec(cfg.actor_device) in (("cpu", 0),), "actor_device",
             cfg.actor_device,
             f"with actor_backend={cfg.actor_backend!r} each actor process has one CPU device; "
             "use 'cpu'")


def check_learner_devices(cfg: AsyncActorLearnerConfig, num_devices: int) -> None:
    """Raises `ConfigError` unless the batch and every minibatch split evenly over ``num_devices``.  The learner shards whole env sequences, so the envs must divide; a feed-forward minibatch is split sample-wise across the devices, a recurrent one env-wise (its sequences are never cut in time). """
    if num_devices == 1:
        return
    where = f"learner_device={cfg.learner_device!r} shards the update over {num_devices} devices"
    _require(cfg.num_envs % num_devices == 0, "num_actors * envs_per_actor", cfg.num_envs,
             f"{where}, each taking whole envs; make the env count a multiple of {num_devices}")
    if cfg.recurrent:
        per_minibatch = cfg.num_envs // cfg.num_minibatches
        _require(per_minibatch % num_devices == 0, "num_minibatches", cfg.num_minibatches,
                 f"{where}, and a recurrent minibatch's {per_minibatch} env sequences "
                 f"(num_actors * envs_per_actor / num_minibatches) must split over them; "
                 f"lower num_minibatches or use more envs")
    else:
        _require(cfg.minibatch_size % num_devices == 0, "num_minibatches", cfg.num_minibatches,
                 f"{where}, and a minibatch's {cfg.minibatch_size} samples (num_actors * "
                 f"envs_per_actor * num_steps / num_minibatches) must split over them; "
                 f"pick num_minibatches or num_steps so that it divides")
