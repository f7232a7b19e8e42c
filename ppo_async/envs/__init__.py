"""Environments and the programs actors run in them.

- `registry`: env ids (``gymnax:``, ``gymnasium:``, ``envpool:``) and their checks.
- `backends`: the `ActorProgram` of a config's env backend, picked from its env id.
- `program`: `ActorProgram`, the jitted reset/rollout pair an actor loop runs.
- `gymnax_env`: batched gymnax envs, the on-device rollout, its actor program.
- `host`: gymnasium and envpool vector envs behind one host-env interface.
- `host_rollout`: the actor program that steps host envs with jitted inference.
"""
