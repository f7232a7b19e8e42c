"""Environments: one backend per env-id prefix, and the programs actors run in them.

- `registry`: env ids (``gymnax:``, ``gymnasium:``, ``envpool:``, ``host:``, and
  prefixes added with `register_env_backend`), the backend each names, host-env names.
- `backends`: the `EnvBackend` interface (ids, actor program, evaluation, video, twin).
- `gymnax_backend`, `host_backend`: the built-in backends.
- `program`: `ActorProgram`, the reset/rollout pair an actor loop runs.
- `episodes`: whole episodes under a fixed policy (evaluation and videos, any backend).
- `gymnax_env`: batched gymnax envs, the on-device rollout, its actor program.
- `host`: gymnasium and envpool vector envs behind one host-env interface.
- `host_rollout`: the actor program that steps host envs with jitted inference.
"""
