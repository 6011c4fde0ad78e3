# Sourced by every recipe's run.sh (after `cd` into the recipe): puts the cbasr entry points on
# PATH (the repository's .venv when cbasr is not installed), opens a timestamped log under
# log/ and defines `log` and `stage_on N`. Expects $recipe_name, $stage and $stop_stage.

if ! command -v cbasr-train > /dev/null; then
  if [[ -x ../../.venv/bin/cbasr-train ]]; then
    PATH="$(cd ../.. && pwd)/.venv/bin:$PATH"
  else
    echo "run.sh: cbasr is not installed; run 'make install' from the repository root" >&2
    exit 1
  fi
fi

mkdir -p log
logfile=log/run-$(date +%Y%m%d-%H%M%S).log
exec > >(tee -a "$logfile") 2>&1
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [$recipe_name] $*"; }
stage_on() { [[ $stage -le $1 && $stop_stage -ge $1 ]]; }
recipe_start=$(date +%s)
