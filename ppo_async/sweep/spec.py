"""A sweep's spec: the sweep file (TOML or YAML) or table, its checks, and the runs' names.

`load_sweep` reads and checks a sweep; `SweepSpec.runs` builds and validates
every (grid point, seed)'s config, named by `run_name`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.errors import did_you_mean
from ppo_async.presets import apply_overrides, preset_overrides, read_table_file, toml_value

SWEEP_FILE = "sweep.toml"
SWEEP_KEYS = ("preset", "seeds", "base", "grid", "points")
NAME_CHARS = re.compile(r"[^A-Za-z0-9._+-]")
MAX_LABEL = 100  # characters of a run name before the seed; longer ones end in a hash


class SweepRun(NamedTuple):
    """One run of a sweep: a grid point and a seed."""

    name: str  # its directory's name under the sweep directory
    point: dict[str, Any]  # the fields the grid (and points) set, in file order
    seed: int
    config: AsyncActorLearnerConfig


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A sweep: a starting config (``preset``, ``base``), a grid crossed with ``points``, seeds.

    Build one with `load_sweep` (a file or a table) so that it is checked;
    `runs` builds and validates every run's config.
    """

    seeds: tuple[int, ...] = (0,)
    base: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    grid: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    points: tuple[Mapping[str, Any], ...] = ({},)
    preset: str | None = None
    source: str = "sweep"  # names the sweep in errors: "sweep file 'lr.toml'"

    @classmethod
    def from_table(cls, table: Mapping[str, Any], source: str = "sweep") -> SweepSpec:
        """The sweep a file's table (or a dict) describes; `ConfigError` naming key and fix."""
        _check_keys(table, source)
        preset = table.get("preset")
        if preset is not None and not isinstance(preset, str):
            raise ConfigError(f"{source}: preset = {preset!r}: must be a preset name (a string)")
        seeds = _checked_seeds(table.get("seeds", [0]), source)
        base = _checked_table(table.get("base", {}), source, "[base]")
        grid_table = _checked_table(table.get("grid", {}), source, "[grid]")
        grid = {field: _checked_values(field, values, source)
                for field, values in grid_table.items()}
        points = _checked_points(table.get("points", [{}]), source)
        _check_overlaps(base, grid, points, source)
        spec = cls(tuple(seeds), base, grid, points, preset, source)
        spec.base_config()  # the preset and [base] alone, so their errors name them
        return spec

    def base_config(self) -> AsyncActorLearnerConfig:
        """The dataclass defaults, the preset's fields, then ``[base]``; validated."""
        config = AsyncActorLearnerConfig()
        if self.preset is not None:
            try:
                overrides = preset_overrides(self.preset)
            except ConfigError as error:
                raise ConfigError(f"{self.source}: {error}") from None
            config = apply_overrides(config, overrides, f"preset {self.preset!r}")
        return apply_overrides(config, self.base, f"{self.source}, [base]")

    def grid_points(self) -> list[dict[str, Any]]:
        """Each ``[[points]]`` table crossed with every combination of the ``[grid]`` lists."""
        combinations = itertools.product(*self.grid.values())
        crossed = [dict(zip(self.grid, values)) for values in combinations]
        return [{**point, **combination} for point in self.points for combination in crossed]

    def fields(self) -> list[str]:
        """The fields the grid points set, in file order: the columns of the tables."""
        return list(dict.fromkeys(f for point in self.grid_points() for f in point))

    def runs(self) -> list[SweepRun]:
        """Every (grid point, seed) with its validated config; `ConfigError` names a bad point."""
        base = self.base_config()
        runs, problems = [], []
        points = self.grid_points()
        for point in points:
            label = point_label(point)
            try:
                configs = [apply_overrides(base, {**point, "seed": seed},
                                           f"{self.source}, grid point {label or '(base)'}")
                           for seed in self.seeds]
            except ConfigError as error:
                problems.append(str(error))
                continue
            runs += [SweepRun(run_name(point, seed), point, seed, config)
                     for seed, config in zip(self.seeds, configs)]
        if problems:
            more = f" ({len(problems)} of {len(points)} grid points are invalid)" if len(
                problems) > 1 else ""
            raise ConfigError(problems[0] + more)
        return _unique_names(runs)

    def to_table(self) -> dict[str, Any]:
        """The sweep as the table a file holds (`from_table` reads it back)."""
        table: dict[str, Any] = {} if self.preset is None else {"preset": self.preset}
        table["seeds"] = list(self.seeds)
        table["base"] = dict(self.base)
        table["grid"] = {field: list(values) for field, values in self.grid.items()}
        if self.points != ({},):
            table["points"] = [dict(point) for point in self.points]
        return table

    def to_toml(self) -> str:
        """The sweep as a TOML sweep file (`load_sweep` reads it back to an equal sweep)."""
        lines = [f"# The sweep as run (from {self.source}); `ppo-async sweep` reads it back."]
        if self.preset is not None:
            lines.append(f"preset = {toml_value(self.preset)}")
        lines.append(f"seeds = {toml_value(list(self.seeds))}")
        for header, table in (("[base]", self.base), ("[grid]", self.grid)):
            lines += ["", header] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
        for point in self.points if self.points != ({},) else ():
            lines += ["", "[[points]]"] + [f"{k} = {toml_value(v)}" for k, v in point.items()]
        return "\n".join(lines) + "\n"


def _check_keys(table: Mapping[str, Any], source: str) -> None:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: expected a table with seeds, [base] and [grid]")
    for key in table:
        if key not in SWEEP_KEYS:
            fields = {f.name for f in dataclasses.fields(AsyncActorLearnerConfig)}
            hint = (" (a config field: put it under [base], or under [grid] as a list)"
                    if key in fields else "")
            hint = hint or did_you_mean(key, SWEEP_KEYS)
            raise ConfigError(f"{source}: {key!r} is not a sweep key{hint}; a sweep file holds "
                              "preset, seeds, [base], [grid] and [[points]]")


def _checked_seeds(seeds: Any, source: str) -> list[int]:
    good = isinstance(seeds, list) and seeds and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    if not good:
        raise ConfigError(f"{source}: seeds = {seeds!r}: must be a non-empty list of integers "
                          ">= 0, e.g. seeds = [0, 1, 2]")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{source}: seeds = {seeds!r}: lists a seed twice")
    return list(seeds)


def _checked_table(table: Any, source: str, where: str) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: {where} must be a table of config field = value, "
                          f"found {table!r}")
    for field, value in table.items():
        if field == "seed":
            raise ConfigError(f"{source}: seed in {where}: list the seeds at the top instead, "
                              "seeds = [0, 1, 2]")
        _check_toml_value(value, source, f"{where} {field}")
    return dict(table)


def _check_toml_value(value: Any, source: str, where: str) -> None:
    """Every value must have a TOML form: ``sweep.toml`` records the sweep as run."""
    try:
        toml_value(value)
    except ValueError:
        raise ConfigError(
            f"{source}: {where} = {value!r}: has no TOML form (TOML has no null: leave the "
            "field out to keep its default)") from None


def _checked_values(field: str, values: Any, source: str) -> tuple[Any, ...]:
    if not isinstance(values, (list, tuple)) or not values:
        example = toml_value(values) if _has_toml(values) else "..."
        raise ConfigError(f"{source}: [grid] {field} = {values!r}: must be a non-empty list of "
                          f"values, e.g. {field} = [{example}]")
    seen = set()
    for value in values:
        key = json.dumps(value, sort_keys=True)
        if key in seen:
            raise ConfigError(f"{source}: [grid] {field} lists {value!r} twice")
        seen.add(key)
    return tuple(values)


def _has_toml(value: Any) -> bool:
    try:
        toml_value(value)
    except ValueError:
        return False
    return True


def _checked_points(points: Any, source: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(points, list) or not points or not all(
            isinstance(p, Mapping) for p in points):
        raise ConfigError(f"{source}: points must be a non-empty list of tables "
                          "([[points]] in TOML), each of config field = value")
    checked = [_checked_table(point, source, f"[[points]] #{i + 1}") for i, point in
               enumerate(points)]
    labels = [json.dumps(p, sort_keys=True) for p in checked]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{source}: [[points]] lists the same point twice")
    return tuple(checked)


def _check_overlaps(base: Mapping[str, Any], grid: Mapping[str, Any],
                    points: Sequence[Mapping[str, Any]], source: str) -> None:
    """A field is set in one place only: [base], [grid] or [[points]]."""
    point_fields = {f for point in points for f in point}
    for field, (here, there) in {
        **{f: ("[base]", "[grid]") for f in set(base) & set(grid)},
        **{f: ("[base]", "[[points]]") for f in set(base) & point_fields},
        **{f: ("[grid]", "[[points]]") for f in set(grid) & point_fields},
    }.items():
        raise ConfigError(f"{source}: {field} is in {here} and in {there}; set it in one of them")


def load_sweep(sweep: str | os.PathLike | Mapping[str, Any] | SweepSpec) -> SweepSpec:
    """A checked `SweepSpec` from a sweep file (TOML or YAML), a table (dict), or a spec."""
    if isinstance(sweep, SweepSpec):
        return SweepSpec.from_table(sweep.to_table(), sweep.source)
    if isinstance(sweep, Mapping):
        return SweepSpec.from_table(sweep, "sweep")
    path = pathlib.Path(sweep)
    return SweepSpec.from_table(read_table_file(path, "sweep file"), f"sweep file {str(path)!r}")


# --- names --------------------------------------------------------------------------------


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "-".join(_value_text(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def point_label(point: Mapping[str, Any]) -> str:
    """``field=value,field=value`` of a grid point, as its runs' names and the tables show it."""
    return ",".join(f"{field}={_value_text(value)}" for field, value in point.items())


def _short_hash(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:8]


def run_name(point: Mapping[str, Any], seed: int) -> str:
    """The directory name of a run: its grid values and seed, ``lr=0.001,use_vtrace=true,seed=0``.

    Characters other than letters, digits and ``._+-`` in a value become
    ``_`` (``gymnasium:CartPole-v1`` -> ``gymnasium_CartPole-v1``); a label
    longer than 100 characters is cut and ends in a hash of the point.
    """
    parts = [f"{field}={NAME_CHARS.sub('_', _value_text(value))}"
             for field, value in point.items()]
    label = ",".join(parts)
    if len(label) > MAX_LABEL:
        label = f"{label[:MAX_LABEL - 9]}-{_short_hash(point)}"
    return f"{label},seed={seed}" if label else f"seed={seed}"


def _unique_names(runs: list[SweepRun]) -> list[SweepRun]:
    """Runs whose names collide (values that differ only in replaced characters) get a hash."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.name] = counts.get(run.name, 0) + 1
    return [run._replace(name=f"{run.name}-{_short_hash(run.point)}")
            if counts[run.name] > 1 else run for run in runs]
