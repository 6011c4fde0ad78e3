#!/usr/bin/env bash
# The toy study of the CB paper, section 5.1: train a learner Q on sequences from a population P
# with every estimator and with the exact marginal, sweeping T, N, M and sigma over seeds; then
# compare the estimators' gradient variance and bias at shared parameters; then write the table
# and plots. Every stage skips the work whose outputs exist; deleting exp/ reruns everything.
#
#   ./run.sh [--stage N] [--stop-stage M] [--conf conf/sweep.json] [--exp DIR] [--workers K]
#
# Stages: 0 training runs, 1 shared-parameter comparison, 2 table (exp/.../results.md) and plots.
set -euo pipefail
cd "$(dirname "$0")"

stage=0
stop_stage=2
conf=conf/sweep.json
exp=""
workers=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stage) stage=$2; shift 2 ;;
    --stop-stage) stop_stage=$2; shift 2 ;;
    --conf) conf=$2; shift 2 ;;
    --exp) exp=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
exp=${exp:-exp/$(basename "$conf" .json)}

python=python
if [[ -x ../../.venv/bin/python ]] && ! python -c "import cbasr" 2> /dev/null; then
  python=../../.venv/bin/python
fi
if ! "$python" -c "import cbasr" 2> /dev/null; then
  echo "run.sh: cbasr is not installed; run 'make install' from the repository root" >&2
  exit 1
fi
toy=("$python" -m cbasr.toy)
extra=()
[[ -n $workers ]] && extra=(--workers "$workers")

mkdir -p log
# the process id keeps runs started in the same second (a sweep, several seeds) apart
logfile=log/run-$(date +%Y%m%d-%H%M%S)-$$.log
exec > >(tee -a "$logfile") 2>&1
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [toy] $*"; }
start=$(date +%s)
log "run.sh $* (log: $PWD/$logfile)"

if [[ $stage -le 0 && $stop_stage -ge 0 ]]; then
  log "stage 0: training runs ($conf) -> $exp/runs"
  "${toy[@]}" train --conf "$conf" --out "$exp" ${extra[@]+"${extra[@]}"}
fi

if [[ $stage -le 1 && $stop_stage -ge 1 ]]; then
  log "stage 1: gradient variance and bias at shared parameters -> $exp/compare"
  "${toy[@]}" compare --conf "$conf" --out "$exp" ${extra[@]+"${extra[@]}"}
fi

if [[ $stage -le 2 && $stop_stage -ge 2 ]]; then
  log "stage 2: table and plots -> $exp/results.md, $exp/plots"
  "${toy[@]}" report --conf "$conf" --out "$exp" --command-line "recipes/toy/run.sh --conf $conf"
fi

log "done in $(( $(date +%s) - start )) s"
