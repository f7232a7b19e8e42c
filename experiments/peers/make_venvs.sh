#!/usr/bin/env bash
# One virtual environment per peer library, for experiments/peers/run_peers.py:
#
#   experiments/peers/.venvs/cleanrl/         cleanrl 1.2.0 (its ppo_continuous_action.py)
#   experiments/peers/.venvs/sb3/             stable-baselines3 (PPO)
#   experiments/peers/.venvs/sample_factory/  sample-factory 2.1.1 (APPO)
#
# None of them is a dependency of ppo_async: each lives in its own venv, gitignored.
# Every venv gets the CPU build of torch 2.13.0 first (pip takes it from this machine's
# disk; any other torch spec downloads a CUDA build of several GB), then gymnasium and
# mujoco at the versions the project's own venv runs (the same simulator for every
# library), then the peer, with a constraints file holding torch, gymnasium and mujoco
# where they are, so that pip never swaps them.
#
# Two peers cannot be installed as their metadata says, and are installed without
# their declared dependencies (--no-deps) plus a list written here:
# - cleanrl 1.2.0 (the newest on PyPI) declares Requires-Python <3.11, and pins gym
#   0.23.1, stable-baselines3 1.2.0, pygame 2.1.0, wandb <0.14, huggingface-hub <0.12.
#   The torch file on disk is for Python 3.11 only, so the wheel goes in with
#   --ignore-requires-python; ppo_continuous_action.py imports gymnasium, numpy, torch
#   and torch.utils.tensorboard (wandb only under --track, which run_peers never passes),
#   so those, and tensorboard, are what it gets.
# - sample-factory 2.1.1 (the newest on PyPI) declares gymnasium <1.0, which has no
#   Hopper-v5 or Walker2d-v5 (the v5 MuJoCo envs came with gymnasium 1.0). It gets
#   every other dependency it declares, and gymnasium 1.x.
#
# Idempotent: a venv whose stamp (.complete, holding its `pip freeze`) exists is left
# as it is; delete the folder to rebuild it. Usage, from anywhere:
#
#   bash experiments/peers/make_venvs.sh                  # all three
#   bash experiments/peers/make_venvs.sh sb3 cleanrl      # some
#
# PYTHON (default python3) must be Python 3.11, the torch file's.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$HERE/.venvs"
PYTHON="${PYTHON:-python3}"

TORCH="torch==2.13.0"
GYMNASIUM="gymnasium[mujoco]==1.3.0"
MUJOCO="mujoco==4.0.1"
CLEANRL="cleanrl==1.2.0"
SB3="stable-baselines3==2.9.2"
SAMPLE_FACTORY="sample-factory==2.1.1"
# sample-factory 2.1.1's declared dependencies, less its gymnasium <1.0.
SAMPLE_FACTORY_DEPS=("numpy>=1.18.1,<2.0" "pyglet" "tensorboard>=1.15.0" "tensorboardx>=2.0"
                     "psutil>=5.7.0" "threadpoolctl>=2.0.0" "colorlog" "signal-slot-mp>=1.0.3,<2.0"
                     "filelock" "opencv-python" "wandb>=0.12.9" "huggingface-hub>=0.10.0,<1.0")

version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$version" != "3.11" ]]; then
    echo "make_venvs.sh: $PYTHON is Python $version; the CPU torch 2.13.0 on disk is for 3.11" >&2
    exit 1
fi

pip_in() {  # pip_in NAME ARGS...: pip of venv NAME, quiet, less this machine's index-location warnings
    local name="$1"; shift
    "$VENVS/$name/bin/python" -m pip install --quiet "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

make_venv() {  # make_venv NAME: a fresh venv with torch, gymnasium and mujoco
    local venv="$VENVS/$1"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    pip_in "$1" "$TORCH"
    pip_in "$1" "$GYMNASIUM" "$MUJOCO" -c "$VENVS/constraints.txt"
}

install_peer() {
    local name="$1"
    case "$name" in
        cleanrl)
            pip_in "$name" --no-deps --ignore-requires-python "$CLEANRL"
            pip_in "$name" tensorboard -c "$VENVS/constraints.txt" ;;
        sb3)
            pip_in "$name" "$SB3" -c "$VENVS/constraints.txt" ;;
        sample_factory)
            pip_in "$name" --no-deps "$SAMPLE_FACTORY"
            pip_in "$name" "${SAMPLE_FACTORY_DEPS[@]}" -c "$VENVS/constraints.txt" ;;
        *)
            echo "make_venvs.sh: unknown peer $name (cleanrl, sb3, sample_factory)" >&2
            exit 2 ;;
    esac
}

mkdir -p "$VENVS"
printf '%s\n' "torch==2.13.0" "gymnasium==1.3.0" "$MUJOCO" > "$VENVS/constraints.txt"
peers=("$@")
[[ ${#peers[@]} -gt 0 ]] || peers=(cleanrl sb3 sample_factory)
for name in "${peers[@]}"; do
    stamp="$VENVS/$name/.complete"
    if [[ -f "$stamp" ]]; then
        echo "$name: complete ($VENVS/$name), skipped"
        continue
    fi
    echo "$name: building $VENVS/$name"
    make_venv "$name"
    install_peer "$name"
    "$VENVS/$name/bin/python" -m pip check || true  # cleanrl and sample-factory: see above
    "$VENVS/$name/bin/python" -m pip freeze > "$stamp.tmp"
    mv "$stamp.tmp" "$stamp"
    grep -i -E '^(torch|gymnasium|mujoco|numpy|cleanrl|stable.baselines3|sample.factory)==' "$stamp"
done
