#!/usr/bin/env bash
# Gigaword headline generation: manifests -> a sentencepiece model for both sides -> source ids
# -> training (token-embedding encoder, CB pointwise by default) -> greedy and beam decoding of
# test -> ROUGE-1/2/L. Every stage skips itself when its outputs are complete.
#
#   ./run.sh --corpus-dir DIR [--stage N] [--stop-stage M] [--sp-size N] [--config NAME] [--exp DIR]
#            [--beam N] [--allow-partial] [hydra overrides...]
#
# Stages: 0 manifests, 1 sentencepiece model and target units, 2 source ids, 3 training,
# 4 decoding, 5 scoring.
set -euo pipefail
cd "$(dirname "$0")"
all_args="$*"

recipe_name=gigaword
stage=0
stop_stage=5
corpus_dir=""
sp_size=8000
config=cb_pointwise
exp=""
beam=8
allow_partial=false
source ../shared/parse_options.sh "$@"
exp=${exp:-exp/${config}}
units=sp:data/lang/sp${sp_size}.model
source ../shared/common.sh
log "run.sh $all_args (log: $PWD/$logfile)"

if stage_on 0; then
  [[ -n $corpus_dir ]] || { echo "run.sh: stage 0 needs --corpus-dir (the Gigaword pairs)" >&2; exit 2; }
  log "stage 0: Gigaword manifests from $corpus_dir -> data/gigaword"
  cbasr-prepare gigaword --corpus-dir "$corpus_dir" --out data/gigaword $([[ $allow_partial == true ]] && echo --allow-partial)
fi

if stage_on 1; then
  log "stage 1: sentencepiece model ($sp_size pieces) on the training headlines -> data/lang/sp$sp_size.{model,txt}"
  cbasr-vocab --manifest data/gigaword/train.jsonl --units sp --sp-size "$sp_size" --out "data/lang/sp$sp_size.txt"
fi

if stage_on 2; then
  log "stage 2: source ids (the same pieces) -> data/src"
  cbasr-features --manifest-dir data/gigaword --out data/src --splits train dev test --source-units "$units"
fi

if stage_on 3; then
  log "stage 3: training $exp (on a GPU when one is visible; resumes if interrupted)"
  cbasr-train --config-dir conf --config-name "$config" exp_dir="$exp" data.units="$units" \
    data.vocab="data/lang/sp$sp_size.txt" ${overrides[@]+"${overrides[@]}"}
fi

if stage_on 4; then
  log "stage 4: greedy and beam-$beam decoding of test"
  for search in 0 "$beam"; do
    decode_splits test -- --exp-dir "$exp" --manifest-dir data/gigaword --feature-dir data/src --beam "$search"
  done
fi

if stage_on 5; then
  log "stage 5: ROUGE-1/2/L F1 on test"
  cbasr-score --exp-dir "$exp" --splits test --rouge
  cbasr-score --exp-dir "$exp" --splits test --tag "beam$beam" --rouge
fi

log "done in $(( $(date +%s) - recipe_start )) s"
