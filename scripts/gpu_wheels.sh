#!/usr/bin/env bash
# The wheels a bare GPU machine lacks for scripts/gpu_check.sh, into .whl/ (git-ignored):
# Python 3.12, x86-64 Linux. The GPU image has torch, torchaudio, triton, numba, numpy,
# sentencepiece, tensorboard, tqdm and matplotlib; the check also imports hydra-core, omegaconf
# (with antlr4, whose 4.9.3 is published as a source archive only: built here, pure Python),
# jiwer (rapidfuzz, click) and soundfile (cffi). Run here, where PyPI can be reached:
#
#   scripts/gpu_wheels.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl
pin() {  # NAME -> NAME==VERSION as requirements.lock pins it
  grep -i "^$1==" requirements.lock || { echo "gpu_wheels.sh: $1 is not in requirements.lock" >&2; exit 1; }
}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl \
  "$(pin hydra-core)" "$(pin omegaconf)" "$(pin jiwer)" "$(pin rapidfuzz)" \
  "$(pin soundfile)" "$(pin cffi)" "$(pin pycparser)"
"$py" -m pip wheel --quiet --no-deps -w .whl "$(pin antlr4-python3-runtime)"
ls -l .whl
du -sh .whl
