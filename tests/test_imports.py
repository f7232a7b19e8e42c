"""Module layering: no import cycles inside ppo_async, and no Ray unless a run asks for it."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "ppo_async"


def _imports(path: pathlib.Path) -> set[str]:
    """ppo_async modules ``path`` imports, at the top or inside a function alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ppo_async"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ppo_async"))
    modules = {f"ppo_async.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return found & modules


def test_no_module_of_the_package_imports_itself_back():
    graph = {f"ppo_async.{p.stem}": _imports(p) for p in PACKAGE.glob("*.py")
             if p.stem != "__init__"}

    def cycle_from(start):
        stack = [(start, [start])]
        seen = set()
        while stack:
            module, path = stack.pop()
            for imported in graph.get(module, ()):
                if imported == start:
                    return path + [start]
                if imported not in seen:
                    seen.add(imported)
                    stack.append((imported, path + [imported]))
        return None

    cycles = [cycle for module in graph if (cycle := cycle_from(module))]
    assert cycles == [], " ; ".join(" -> ".join(c) for c in cycles)


def test_the_env_registry_imports_no_runtime_code():
    assert _imports(PACKAGE / "env_registry.py") <= {"ppo_async.envs"}
