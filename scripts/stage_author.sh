#!/usr/bin/env bash
# Stage the CB paper author's code (Apache 2.0; a baseline to measure against, not part of
# cbasr) into .author/ (git-ignored) for scripts/bench_distributions.py --author-src and for
# scripts/gpu_check.sh, which uses it when present (carry .author to a GPU machine):
#
#   scripts/stage_author.sh CB_GIT PYDROBERT_GIT
#
# CB_GIT: a git directory of sdrobert/conditional-bernoulli (its distributions.py and
# forward_backward.py go to .author/src); PYDROBERT_GIT: one of sdrobert/pydrobert-pytorch, of
# which the commit that the author's environment.yml pins goes to .author/site.
set -euo pipefail
cd "$(dirname "$0")/.."
cb=${1:?usage: scripts/stage_author.sh CB_GIT PYDROBERT_GIT}
pydrobert=${2:?usage: scripts/stage_author.sh CB_GIT PYDROBERT_GIT}
pin=$(git --git-dir "$cb" show HEAD:environment.yml | { grep -o 'pydrobert-pytorch.git@[0-9a-f]*' || true; } | head -1 | cut -d@ -f2)
[[ -n $pin ]] || { echo "stage_author.sh: no pydrobert-pytorch commit in environment.yml" >&2; exit 1; }
rm -rf .author && mkdir -p .author/src .author/site
git --git-dir "$cb" archive HEAD distributions.py forward_backward.py | tar -x -C .author/src
git --git-dir "$pydrobert" archive "$pin" src/pydrobert | tar -x -C .author/site --strip-components=1
echo "version = \"0+g${pin:0:7}\"" >.author/site/pydrobert/torch/_version.py
echo "$(git --git-dir "$cb" rev-parse HEAD) conditional-bernoulli; $pin pydrobert-pytorch" >.author/COMMITS
cat .author/COMMITS
