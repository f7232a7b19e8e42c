"""The package's layers, as the tree shows them, and no import cycle between modules.

Each part of ``ppo_async`` may import only the parts below it (docs/design.md):

    errors, version            ConfigError and the version; below everything
    networks                   flax modules: named arguments, never the config
    core                       pure, jittable math, and the update: named options, never the config
    config                     the config, which builds the math's options (inside its methods)
    presets                    named configs and config files: overrides on the config
    envs                       environments and the programs actors run in them
    runtime                    threads, queues, processes: actors, learner, transports
    runs                       run directories, checkpoint files, logs: disk only
    resume                     checkpoint contents, resuming, loading a run's config and params
    sync | train               the fully jitted twin (no runtime) | the asynchronous system
    sweep                      grids of runs x seeds over train or the twin
    pbt                        population-based training on Ray Tune: members are train runs
    tools                      cli, video: nothing imports them
    _deprecated                old import paths (strings) -> new modules; for __init__ and tools.cli

Imports inside functions count the same as those at the top of a file,
except that the config's imports of the math must be inside functions (or
under ``TYPE_CHECKING``): importing the config imports no jax.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ppo_async"

BELOW = {
    # The old import paths that still work for a release: it names the moved modules as
    # strings and imports one (importlib) only when its old path is imported, so it imports
    # nothing here. The package's __init__ installs it, and tools.cli takes its __getattr__
    # for the two names that left it; nothing else may import it.
    "_deprecated": set(),
    "errors": set(),
    "version": set(),
    "networks": {"errors"},
    "core": {"errors", "networks"},
    "config": {"errors", "version", "networks", "core"},
    "presets": {"errors", "config"},
    "envs": {"errors", "config", "networks", "core"},
    "runtime": {"errors", "config", "version", "networks", "core", "envs"},
    # runs/ is the disk layer: it reads and writes files and imports only the config, so
    # that analysing runs (a notebook, plot) never loads the update, envs or runtime.
    "runs": {"errors", "config", "version"},
    "resume": {"errors", "config", "version", "networks", "core", "envs", "runtime", "runs"},
    "sync": {"errors", "config", "networks", "core", "envs", "runs"},
    "train": {"errors", "config", "version", "networks", "core", "envs", "runtime", "runs",
              "resume"},
    "sweep": {"errors", "config", "version", "presets", "networks", "core", "envs", "runtime",
              "runs", "resume", "sync", "train"},
    # Population-based training reuses the sweep's spec, checks, worker sizing and tables.
    "pbt": {"errors", "config", "version", "presets", "networks", "core", "envs", "runtime",
            "runs", "resume", "sync", "train", "sweep"},
    "tools": {"errors", "config", "version", "presets", "networks", "core", "envs", "runtime",
              "runs", "resume", "sync", "train", "sweep", "pbt", "_deprecated"},
    "__init__": {"errors", "config", "version", "presets", "networks", "core", "envs", "runtime",
                 "runs", "resume", "train", "sweep", "pbt", "_deprecated"},
}
# What the config's module body (outside functions and TYPE_CHECKING) may import:
# the math it builds options for is imported when a method is called.
CONFIG_MODULE_LEVEL = {"errors", "version"}
# Validating a config asks the env registry whether an env id exists and the
# compilation cache where a directory resolves: the two imports that go up,
# both inside the validating function, so importing config imports neither.
CONFIG_LOOKUPS = {"ppo_async.envs.registry", "ppo_async.runs.compile_cache"}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _part(module: str) -> str:
    """``ppo_async.core.losses`` -> ``core``; ``ppo_async.config`` -> ``config``; ``ppo_async`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: pathlib.Path) -> set[str]:
    """The ppo_async modules ``path`` imports, at the top or inside a function alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ppo_async"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("ppo_async"))
    return found & set(MODULES)


GRAPH = {module: _imports(path) for module, path in MODULES.items()}


def _module_level_imports(path: pathlib.Path) -> set[str]:
    """The ppo_async modules ``path`` imports when it is imported: outside functions and
    ``if TYPE_CHECKING:`` blocks."""
    found = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    "ppo_async"):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names
                             if alias.name.startswith("ppo_async"))
            visit(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))

    visit(ast.parse(path.read_text()).body)
    return found & set(MODULES)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import in ``graph`` that reaches a part not below the importer's."""
    violations = []
    for module, imported in sorted(graph.items()):
        part = _part(module)
        for target in sorted(imported):
            if _part(target) in BELOW[part] | {part}:
                continue
            if part == "config" and target in CONFIG_LOOKUPS:
                continue
            violations.append(f"{module} imports {target}")
    return violations


def test_every_import_goes_down_the_layers():
    assert set(map(_part, MODULES)) == set(BELOW)
    assert layer_violations(GRAPH) == []


def test_the_math_imports_nothing_of_the_config():
    math = {module: imported for module, imported in GRAPH.items()
            if _part(module) in ("core", "networks")}
    assert {module for module in math if "ppo_async.config" in math[module]} == set()
    assert layer_violations(math) == []


def test_the_config_imports_the_math_only_when_a_method_runs():
    at_import = _module_level_imports(MODULES["ppo_async.config"])
    assert {_part(module) for module in at_import} <= CONFIG_MODULE_LEVEL, at_import


def test_the_config_check_reports_the_math_imported_at_import_time(tmp_path):
    path = tmp_path / "config.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "from ppo_async.core.update import UpdateOptions\n"
        "if TYPE_CHECKING:\n"
        "    from ppo_async.networks.actor_critic import ActorCritic\n"
        "class Config:\n"
        "    def update_options(self):\n"
        "        from ppo_async.core.normalization import NormalizationOptions\n")
    assert _module_level_imports(path) == {"ppo_async.core.update"}


def test_the_layer_check_reports_an_import_that_goes_up():
    broken = {
        "ppo_async.core.losses": {"ppo_async.runtime.actor"},
        "ppo_async.core.update": {"ppo_async.config"},
        "ppo_async.networks.actor_critic": {"ppo_async.config"},
        "ppo_async.envs.host": {"ppo_async.runtime.learner"},
        "ppo_async.runs.run_log": {"ppo_async.tools.cli"},
        "ppo_async.sync": {"ppo_async.runtime.learner"},
        "ppo_async.config": {"ppo_async.envs.host"},
        "ppo_async.presets": {"ppo_async.train"},
        "ppo_async.sweep": {"ppo_async.tools.cli"},
    }
    assert layer_violations(broken) == [
        "ppo_async.config imports ppo_async.envs.host",
        "ppo_async.core.losses imports ppo_async.runtime.actor",
        "ppo_async.core.update imports ppo_async.config",
        "ppo_async.envs.host imports ppo_async.runtime.learner",
        "ppo_async.networks.actor_critic imports ppo_async.config",
        "ppo_async.presets imports ppo_async.train",
        "ppo_async.runs.run_log imports ppo_async.tools.cli",
        "ppo_async.sweep imports ppo_async.tools.cli",
        "ppo_async.sync imports ppo_async.runtime.learner",
    ]


def test_runs_is_the_disk_layer_and_resume_sits_above_it():
    broken = {
        "ppo_async.runs.checkpoint": {"ppo_async.core.update", "ppo_async.runtime.learner"},
        "ppo_async.runs.analysis": {"ppo_async.resume"},
        "ppo_async.resume": {"ppo_async.runtime.learner", "ppo_async.train"},
    }
    assert layer_violations(broken) == [
        "ppo_async.resume imports ppo_async.train",
        "ppo_async.runs.analysis imports ppo_async.resume",
        "ppo_async.runs.checkpoint imports ppo_async.core.update",
        "ppo_async.runs.checkpoint imports ppo_async.runtime.learner",
    ]


def test_the_subpackages_init_files_only_describe_them():
    for module, path in MODULES.items():
        if path.name == "__init__.py" and module != "ppo_async":
            body = ast.parse(path.read_text()).body
            assert len(body) == 1 and isinstance(body[0].value, ast.Constant), module


def test_no_module_of_the_package_imports_itself_back():
    def cycle_from(start):
        stack = [(start, [start])]
        seen = set()
        while stack:
            module, path = stack.pop()
            for imported in GRAPH.get(module, ()):
                if imported == start:
                    return path + [start]
                if imported not in seen:
                    seen.add(imported)
                    stack.append((imported, path + [imported]))
        return None

    cycles = [cycle for module in GRAPH if (cycle := cycle_from(module))]
    assert cycles == [], " ; ".join(" -> ".join(c) for c in cycles)
