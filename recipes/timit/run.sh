#!/usr/bin/env bash
# TIMIT phone recognition: manifests -> features -> phone list -> training -> greedy and beam
# decoding of dev and core test -> PER on 39 phones -> alignment error against the .PHN
# boundaries. Every stage skips itself when its outputs are complete.
#
#   ./run.sh --corpus-dir DIR [--stage N] [--stop-stage M] [--phone-set 48|61] [--num-mel-bins 40|80]
#            [--deltas 0|1|2] [--config NAME] [--exp DIR] [--beam N] [--allow-partial] [hydra overrides...]
#
# Stages: 0 manifests, 1 features, 2 phone list, 3 training, 4 decoding, 5 scoring, 6 alignment.
set -euo pipefail
cd "$(dirname "$0")"
all_args="$*"

recipe_name=timit
stage=0
stop_stage=6
corpus_dir=""
phone_set=48
num_mel_bins=80
deltas=0
config=blstm_ctc
exp=""
beam=8
workers=2
allow_partial=false
source ../shared/parse_options.sh "$@"
exp=${exp:-exp/${config}}
source ../shared/common.sh
log "run.sh $all_args (log: $PWD/$logfile)"

if stage_on 0; then
  [[ -n $corpus_dir ]] || { echo "run.sh: stage 0 needs --corpus-dir (the TIMIT copy)" >&2; exit 2; }
  log "stage 0: TIMIT manifests ($phone_set phones) from $corpus_dir -> data/timit"
  cbasr-prepare timit --corpus-dir "$corpus_dir" --out data/timit --phone-set "$phone_set" $([[ $allow_partial == true ]] && echo --allow-partial)
fi

if stage_on 1; then
  log "stage 1: $num_mel_bins-dim log-mel filterbanks (deltas: $deltas) -> data/fbank"
  cbasr-features --manifest-dir data/timit --out data/fbank --splits train dev test \
    --num-mel-bins "$num_mel_bins" --deltas "$deltas" --workers "$workers"
fi

if stage_on 2; then
  log "stage 2: phone list -> data/lang/phones.txt"
  cbasr-vocab --manifest data/timit/train.jsonl --units phones --inventory data/timit/phones.txt \
    --out data/lang/phones.txt --check data/timit/dev.jsonl data/timit/test.jsonl
fi

if stage_on 3; then
  log "stage 3: training $exp (on a GPU when one is visible; resumes if interrupted)"
  cbasr-train --config-dir conf --config-name "$config" exp_dir="$exp" ${overrides[@]+"${overrides[@]}"}
fi

if stage_on 4; then
  log "stage 4: greedy and beam-$beam decoding of dev and test"
  for search in 0 "$beam"; do
    decode_splits dev test -- --exp-dir "$exp" --manifest-dir data/timit --feature-dir data/fbank --beam "$search"
  done
fi

if stage_on 5; then
  log "stage 5: PER on the 39-phone map (q deleted)"
  cbasr-score --exp-dir "$exp" --splits dev test --token-map data/timit/map_39.txt
  cbasr-score --exp-dir "$exp" --splits dev test --tag "beam$beam" --token-map data/timit/map_39.txt
  echo
  cbasr-results "$exp"
  echo
fi

if stage_on 6; then
  log "stage 6: alignment error of the forced alignment against the .PHN boundaries (dev)"
  cbasr-align --exp-dir "$exp" --manifest-dir data/timit --feature-dir data/fbank --splits dev
fi

log "done in $(( $(date +%s) - recipe_start )) s"
