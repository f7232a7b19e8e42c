"""A population's spec: a sweep file (preset, ``[base]``, ``[grid]``) plus a ``[pbt]`` table.

The explored fields are the sweep's: each ``[grid]`` list is the values a
field may take (Tune moves a member to a neighbouring value, or resamples
one), and ``[pbt.ranges]`` adds continuous fields, ``field = [low, high]``
(sampled log-uniformly when ``0 < low``, perturbed by x0.8 or x1.2 and
clipped to the range). Everything the sweep checks (`ppo_async.sweep.spec`)
is checked the same way; every grid value and range end is validated as a
member's config before anything runs.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.presets import apply_overrides, read_table_file, toml_value
from ppo_async.runs.checkpoint import RESUME_LOCKED_FIELDS
from ppo_async.sweep.spec import SweepSpec

PBT_FILE = "pbt.toml"
PBT_KEYS = ("population", "interval_updates", "quantile_fraction", "resample_probability",
            "synch", "max_failures", "ranges")
# Fields a member cannot change between segments: the checkpoint's structure, the budget
# every member shares, and the seed that names it.
NOT_EXPLORED = (*RESUME_LOCKED_FIELDS, "seed", "total_env_steps", "num_actors",
                "envs_per_actor", "actor_backend")


@dataclasses.dataclass(frozen=True)
class PBTSpec:
    """A population: the sweep part (preset, ``[base]``, ``[grid]``: the explored lists) and
    the ``[pbt]`` settings. Build one with `load_pbt`, which checks it."""

    sweep: SweepSpec
    population: int = 4
    interval_updates: int = 10  # learner updates between perturbations (Tune's time attribute)
    ranges: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    quantile_fraction: float = 0.25  # the bottom fraction copies the top fraction
    resample_probability: float = 0.25  # explore: resample a field instead of perturbing it
    # True: every member reaches the interval before any is perturbed (Tune cannot continue
    # such a population after Ctrl-C: it waits forever on Ray 2.60); False: Tune's default.
    synch: bool = False
    max_failures: int = 3  # restarts of a failing member (from its last checkpoint) before it stops

    @property
    def source(self) -> str:
        return self.sweep.source

    @property
    def seed(self) -> int:
        return self.sweep.seeds[0]

    def explored(self) -> list[str]:
        """The fields the population explores, in file order: the grid's, then the ranges'."""
        return [*self.sweep.grid, *self.ranges]

    def base_config(self) -> AsyncActorLearnerConfig:
        return self.sweep.base_config()

    def member_seed(self, member: int) -> int:
        """Member ``i`` of the population with seed ``s`` trains with seed ``1000 s + i``."""
        return 1000 * self.seed + member

    def member_config(self, member: int, fields: Mapping[str, Any]) -> AsyncActorLearnerConfig:
        """Member ``member``'s config with the explored ``fields`` it holds now; validated."""
        return apply_overrides(self.base_config(), {**fields, "seed": self.member_seed(member)},
                               f"{self.source}, member {member}")

    def to_table(self) -> dict[str, Any]:
        table = self.sweep.to_table()
        table["pbt"] = {"population": self.population, "interval_updates": self.interval_updates,
                        "quantile_fraction": self.quantile_fraction,
                        "resample_probability": self.resample_probability, "synch": self.synch,
                        "max_failures": self.max_failures,
                        "ranges": {k: list(v) for k, v in self.ranges.items()}}
        return table

    def to_toml(self) -> str:
        """The population as a TOML file (`load_pbt` reads it back to an equal spec)."""
        sweep = self.sweep.to_toml().rstrip("\n").split("\n")[1:]
        lines = [f"# The population as run (from {self.source}); `ppo-async pbt` reads it back.",
                 *sweep, "", "[pbt]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in self.to_table()["pbt"].items()
                  if k != "ranges"]
        lines += ["", "[pbt.ranges]"] + [f"{k} = {toml_value(list(v))}"
                                          for k, v in self.ranges.items()]
        return "\n".join(lines) + "\n"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked_pbt(table: Any, source: str) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: [pbt] must be a table (population, interval_updates, ...)")
    for key in table:
        if key not in PBT_KEYS:
            raise ConfigError(f"{source}: [pbt] {key!r} is not a PBT setting; [pbt] holds "
                              f"{', '.join(PBT_KEYS)}")
    checked = dict(table)
    for key, low in (("population", 2), ("interval_updates", 1), ("max_failures", 0)):
        value = checked.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                      and value >= low):
            raise ConfigError(f"{source}: [pbt] {key} = {value!r}: must be an integer >= {low}")
    for key, high in (("quantile_fraction", 0.5), ("resample_probability", 1.0)):
        value = checked.get(key)
        if value is not None and not (_number(value) and 0 <= value <= high):
            raise ConfigError(f"{source}: [pbt] {key} = {value!r}: must be a number in "
                              f"[0, {high}]")
    if "synch" in checked and not isinstance(checked["synch"], bool):
        raise ConfigError(f"{source}: [pbt] synch = {checked['synch']!r}: must be true or false")
    ranges = checked.pop("ranges", {})
    if not isinstance(ranges, Mapping):
        raise ConfigError(f"{source}: [pbt.ranges] must be a table of field = [low, high]")
    checked["ranges"] = {}
    for field, bounds in ranges.items():
        if not (isinstance(bounds, (list, tuple)) and len(bounds) == 2
                and all(_number(b) for b in bounds) and bounds[0] < bounds[1]):
            raise ConfigError(f"{source}: [pbt.ranges] {field} = {bounds!r}: must be "
                              f"[low, high] with low < high, e.g. {field} = [0.1, 0.3]")
        checked["ranges"][field] = (bounds[0], bounds[1])
    return checked


def _check_explored(spec: PBTSpec) -> None:
    source = spec.source
    if spec.sweep.points != ({},):
        raise ConfigError(f"{source}: [[points]] has no meaning in a population; explore "
                          "fields with [grid] lists or [pbt.ranges]")
    if len(spec.sweep.seeds) != 1:
        raise ConfigError(f"{source}: seeds = {list(spec.sweep.seeds)}: a population has one "
                          "seed (member i trains with 1000 * seed + i); run the population "
                          "again with another seed to repeat it")
    explored = spec.explored()
    if not explored:
        raise ConfigError(f"{source}: nothing to explore: list values under [grid] "
                          "(learning_rate = [1e-4, 3e-4, 1e-3]) or ranges under [pbt.ranges]")
    for field in explored:
        where = "[grid]" if field in spec.sweep.grid else "[pbt.ranges]"
        if field in NOT_EXPLORED:
            raise ConfigError(f"{source}: {where} {field}: a member cannot change {field} "
                              "between segments (the checkpoint, budget or seed depend on it); "
                              "put it under [base]")
        if field in spec.sweep.grid and field in spec.ranges:
            raise ConfigError(f"{source}: {field} is in [grid] and in [pbt.ranges]; set it in "
                              "one of them")
        if field in spec.sweep.base:
            raise ConfigError(f"{source}: {field} is in [base] and explored; set it in one place")
    spec.sweep.runs()  # every combination of the grid's values is a valid config
    for field, (low, high) in spec.ranges.items():
        for end in (low, high):
            spec.member_config(0, {field: end})
    base = spec.base_config()
    if spec.interval_updates >= base.num_updates:
        raise ConfigError(
            f"{source}: [pbt] interval_updates = {spec.interval_updates}: the budget is "
            f"{base.num_updates} updates (total_env_steps={base.total_env_steps} / batch "
            f"{base.batch_size}), so no member would ever be perturbed; lower interval_updates "
            "or raise total_env_steps")


def load_pbt(spec: str | os.PathLike | Mapping[str, Any] | PBTSpec) -> PBTSpec:
    """A checked `PBTSpec` from a file (TOML or YAML), a table (dict), or a spec."""
    if isinstance(spec, PBTSpec):
        table, source = spec.to_table(), spec.source
    elif isinstance(spec, Mapping):
        table, source = dict(spec), "population"
    else:
        path = pathlib.Path(spec)
        table, source = read_table_file(path, "PBT file"), f"PBT file {str(path)!r}"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: expected a table with [base], [grid] and [pbt]")
    table = dict(table)
    settings = _checked_pbt(table.pop("pbt", {}), source)
    pbt = PBTSpec(SweepSpec.from_table(table, source), **settings)
    _check_explored(pbt)
    return pbt
