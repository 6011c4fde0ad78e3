# Sourced by every recipe's run.sh (after `cd` into the recipe): puts the cbasr entry points on
# PATH (the repository's .venv when cbasr is not installed), opens a timestamped log under
# log/ and defines `log`, `stage_on N` and `decode_splits`. Expects $recipe_name, $stage and
# $stop_stage.

if ! command -v cbasr-train > /dev/null; then
  if [[ -x ../../.venv/bin/cbasr-train ]]; then
    PATH="$(cd ../.. && pwd)/.venv/bin:$PATH"
  else
    echo "run.sh: cbasr is not installed; run 'make install' from the repository root" >&2
    exit 1
  fi
fi

mkdir -p log
# the process id keeps runs started in the same second (a sweep, several seeds) apart
logfile=log/run-$(date +%Y%m%d-%H%M%S)-$$.log
exec > >(tee -a "$logfile") 2>&1
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [$recipe_name] $*"; }
stage_on() { [[ $stage -le $1 && $stop_stage -ge $1 ]]; }
recipe_start=$(date +%s)

# decode_splits SPLIT... -- ARGS...: `cbasr-decode ARGS --splits SPLIT` for every split at once,
# each process with an equal share of the cores (`--num-threads`): a search decodes one
# utterance at a time, which one thread runs about as fast as two, so side-by-side processes
# use the cores better. Waits for all; fails if any does.
decode_splits() {
  local splits=() pids=() split pid cores threads failed=0
  while [[ $# -gt 0 && $1 != -- ]]; do splits+=("$1"); shift; done
  shift
  cores=$(nproc 2> /dev/null || echo 1)
  threads=$(( cores / ${#splits[@]} ))
  (( threads >= 1 )) || threads=1
  for split in "${splits[@]}"; do
    cbasr-decode "$@" --splits "$split" --num-threads "$threads" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
  done
  return $failed
}
