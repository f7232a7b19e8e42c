"""Every Python and shell block of the README and the user guide runs.

The pages are read in the order a newcomer reads them (the README, then the
guide's table of contents), in one working directory, so a later page may use
what an earlier one made (``runs/cartpole-0``, ``my_run.toml``). Consecutive
Python blocks of a page run in one fresh process (one JAX start-up, one
compile); a shell block runs in ``bash -euo pipefail`` with the venv's
``ppo-async`` first on ``PATH``. The step counts are the small ones the pages
themselves show. A ``toml`` block whose first line is ``# NAME.toml`` is
written to ``NAME.toml`` for the blocks after it.

A block that cannot run here (a cluster address, a GPU, a million MuJoCo
steps, an install) is marked on the line before it with
``<!-- not-run: the reason -->``; their number is held small below.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide"
# The reading order: the README, then the guide as the site's table of contents lists it.
PAGE_ORDER = ["install", "first_run", "environments", "collection", "actors_devices", "offpolicy",
              "checkpoints", "sweeps", "pbt", "ray", "mujoco_atari", "configuration",
              "plots_and_logging", "how_it_works", "troubleshooting"]
RUN_LANGUAGES = {"python": "python", "bash": "shell", "sh": "shell", "console": "shell"}
MAX_NOT_RUN = 12
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(`{3,})([\w-]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str       # the file, relative to the repository
    line: int       # 1-based line of the opening fence
    language: str   # python | shell | toml | ...
    code: str
    not_run: str | None  # the reason, for a block marked not-run


def extract_blocks(path: pathlib.Path) -> list[Block]:
    """The fenced code blocks of a markdown page, with the not-run reason that precedes each."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    page = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.groups()
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence):
            j += 1
        previous = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marked = NOT_RUN.match(previous)
        blocks.append(Block(page, i + 1, RUN_LANGUAGES.get(info, info), "\n".join(lines[i + 1:j]) + "\n",
                            marked.group(1) if marked else None))
        i = j + 1
    return blocks


def doc_pages() -> list[pathlib.Path]:
    pages = [ROOT / "README.md"] + [GUIDE / f"{name}.md" for name in PAGE_ORDER]
    listed = set(pages)
    missing = sorted(str(p) for p in GUIDE.glob("*.md") if p not in listed)
    assert not missing, f"guide pages not in PAGE_ORDER: {missing}"
    return pages


def _shell_code(block: Block) -> str:
    if block.code.lstrip().startswith("$ "):  # a console transcript: its commands only
        return "\n".join(line[2:] for line in block.code.splitlines() if line.startswith("$ ")) + "\n"
    return block.code


def run_page(path: pathlib.Path, workdir: pathlib.Path, env: dict[str, str], timeout: float = 300):
    """Runs a page's blocks in order in ``workdir``; returns (blocks run, failure message or None)."""
    ran = 0
    group: list[Block] = []

    def flush() -> str | None:
        nonlocal ran
        if not group:
            return None
        script = "\n".join(f"# {b.page}:{b.line}\n{b.code}" for b in group)
        where = ", ".join(f"{b.page}:{b.line}" for b in group)
        done = subprocess.run([sys.executable, "-c", script], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=timeout)
        ran += len(group)
        group.clear()
        if done.returncode != 0:
            return f"python block(s) {where} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        return None

    for block in extract_blocks(path):
        if block.not_run is not None:
            continue
        if block.language == "python":
            group.append(block)
            continue
        failure = flush()
        if failure:
            return ran, failure
        if block.language == "toml":
            first = block.code.splitlines()[0] if block.code.strip() else ""
            named = re.match(r"#\s*([\w.-]+\.toml)\s*$", first)
            if named:
                (workdir / named.group(1)).write_text(block.code)
        elif block.language == "shell":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", _shell_code(block)], cwd=workdir,
                                  env=env, capture_output=True, text=True, timeout=timeout)
            ran += 1
            if done.returncode != 0:
                return ran, (f"shell block {block.page}:{block.line} exited {done.returncode}:\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    failure = flush()
    return ran, failure


def _child_env(workdir: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(workdir)])
    env["MPLBACKEND"] = "Agg"
    env["JAX_PLATFORMS"] = "cpu"
    # conftest's on-disk compile cache, which a fresh process only reads when told.
    env.setdefault("JAX_COMPILATION_CACHE_DIR", env.get(
        "PPO_ASYNC_JAX_CACHE", os.path.join(tempfile.gettempdir(), "ppo_async_jax_cache")))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    env.pop("WANDB_API_KEY", None)
    return env


def test_the_extractor_reads_fences_and_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- not-run: needs a GPU -->\n```bash\nppo-async x\n```\n\n"
                    "````python\nprint('```')\n````\n```toml\n# a.toml\nx = 1\n```\n")
    blocks = extract_blocks(page)
    assert [(b.language, b.not_run) for b in blocks] == [
        ("shell", "needs a GPU"), ("python", None), ("toml", None)]
    assert blocks[1].code == "print('```')\n"


def test_a_broken_example_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```toml\n# made.toml\nx = 1\n```\n```bash\ntest -f made.toml\n```\n"
                    "```python\nimport tomllib\nassert tomllib.load(open('made.toml', 'rb'))['x'] == 2\n```\n")
    ran, failure = run_page(page, tmp_path, _child_env(tmp_path), timeout=60)
    assert ran == 2 and failure is not None and "AssertionError" in failure
    page.write_text("```bash\nfalse\necho never\n```\n")
    ran, failure = run_page(page, tmp_path, _child_env(tmp_path), timeout=60)
    assert failure is not None and "never" not in failure


def test_blocks_marked_not_run_are_few_and_each_says_why():
    marked = [b for page in doc_pages() for b in extract_blocks(page) if b.not_run is not None]
    assert all(len(b.not_run) >= 10 for b in marked), [(b.page, b.line, b.not_run) for b in marked]
    assert len(marked) <= MAX_NOT_RUN, [(b.page, b.line, b.not_run) for b in marked]
    unknown = [(b.page, b.line, b.language) for page in doc_pages() for b in extract_blocks(page)
               if b.language not in ("python", "shell", "toml", "text", "")]
    assert not unknown, f"blocks of a language this test neither runs nor skips: {unknown}"


def test_every_python_and_shell_block_of_the_readme_and_the_guide_runs(tmp_path):
    env = _child_env(tmp_path)
    runnable = [b for page in doc_pages() for b in extract_blocks(page)
                if b.language in ("python", "shell") and b.not_run is None]
    assert len(runnable) >= 8, runnable
    ran = 0
    for page in doc_pages():
        start = time.perf_counter()
        page_ran, failure = run_page(page, tmp_path, env)
        ran += page_ran
        print(f"{page.relative_to(ROOT)}: {page_ran} block(s) in {time.perf_counter() - start:.1f} s")
        assert failure is None, failure
    assert ran == len(runnable)


def test_the_extras_the_docs_say_make_test_installs_are_the_makefiles():
    (extras,) = re.findall(r'\.installed-dev:.*\n\t.*pip install -e "\.\[([\w,]+)\]"',
                           (ROOT / "Makefile").read_text())
    for page in (ROOT / "README.md", GUIDE / "install.md", GUIDE / "first_run.md"):
        said = re.findall(r"installs `?\.\[([\w,]+)\]", page.read_text())
        assert said and set(said) == {extras}, (page.name, said, extras)


def test_the_readme_stays_short_and_shows_an_own_env_that_runs():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    own_env = [b for b in extract_blocks(ROOT / "README.md")
               if b.language == "python" and b.not_run is None and "register_single_env(" in b.code]
    assert len(own_env) == 1 and len(own_env[0].code.splitlines()) <= 20, own_env
