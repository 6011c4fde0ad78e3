#!/usr/bin/env bash
# The synthetic eSpeak recipe: corpus -> features -> phone vocabulary -> training (BLSTM-CTC by
# default, any pinned system with --config) -> greedy and beam decoding of dev and test ->
# scoring -> results table -> forced alignment against the gold phone starts. Every stage skips
# itself when its outputs are complete; deleting data/ or exp/ and rerunning regenerates them.
#
#   ./run.sh [--stage N] [--stop-stage M] [--size default|tiny] [--config NAME] [--exp DIR] [--beam N] [hydra overrides...]
#
# Stages: 0 corpus, 1 features, 2 vocabulary, 3 training, 4 decoding, 5 scoring, 6 alignment.
# Overrides go to cbasr-train, e.g. ./run.sh --stage 3 encoder.hidden=192 trainer.max_epochs=12
set -euo pipefail
cd "$(dirname "$0")"
all_args="$*"

recipe_name=synth

stage=0
stop_stage=6
beam=8
size=default
config=blstm_ctc
exp=""
workers=2
seed=1
overrides=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stage) stage=$2; shift 2 ;;
    --stop-stage) stop_stage=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --exp) exp=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --beam) beam=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) overrides+=("$1"); shift ;;
  esac
done
exp=${exp:-exp/${config}}

source ../shared/common.sh
log "run.sh $all_args (log: $PWD/$logfile)"

if stage_on 0; then
  log "stage 0: synthetic corpus ($size) -> data/synth"
  cbasr-synth --out data/synth --size "$size" --seed "$seed" --workers "$workers"
fi

if stage_on 1; then
  log "stage 1: 80-dim log-mel filterbanks -> data/fbank"
  cbasr-features --manifest-dir data/synth --out data/fbank --splits train dev test \
    --num-mel-bins 80 --workers "$workers"
fi

if stage_on 2; then
  log "stage 2: phone vocabulary -> data/lang/phones.txt"
  cbasr-vocab --manifest data/synth/train.jsonl --units phones --inventory data/synth/phones.txt \
    --out data/lang/phones.txt --check data/synth/dev.jsonl data/synth/test.jsonl
fi

if stage_on 3; then
  log "stage 3: training $exp (resumes if interrupted)"
  cbasr-train --config-dir conf --config-name "$config" exp_dir="$exp" ${overrides[@]+"${overrides[@]}"}
fi

if stage_on 4; then
  log "stage 4: greedy and beam-$beam decoding of dev and test with $exp/checkpoints/best.pt"
  for search in 0 "$beam"; do
    decode_splits dev test -- --exp-dir "$exp" --manifest-dir data/synth --feature-dir data/fbank \
      --beam "$search"
  done
fi

if stage_on 5; then
  log "stage 5: scoring"
  cbasr-score --exp-dir "$exp" --splits dev test
  cbasr-score --exp-dir "$exp" --splits dev test --tag "beam$beam"
  echo
  cbasr-results "$exp"
  echo
fi

if stage_on 6; then
  decoder=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["decoder"]["name"])' "$exp/config.json")
  if [ "$decoder" = autoregressive ]; then
    # its labels read every earlier emission time: no Viterbi alignment (cbasr-align refuses it)
    log "stage 6: skipped: no forced alignment for an autoregressive decoder"
  else
    log "stage 6: forced alignment of dev against the gold phone starts"
    cbasr-align --exp-dir "$exp" --manifest-dir data/synth --feature-dir data/fbank --splits dev
  fi
fi

log "done in $(( $(date +%s) - recipe_start )) s"
