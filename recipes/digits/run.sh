#!/usr/bin/env bash
# The synthetic connected-digits recipe: corpus (2-7 digit words per utterance in noise and
# reverberation) -> features -> word vocabulary -> training (BLSTM-CTC by default, any pinned
# system with --config) -> greedy and beam decoding of dev, test and the repeated-digit stress
# split `repeats` -> scoring (word error rate) and results table. Every stage skips itself
# when its outputs are complete; deleting data/ or exp/ and rerunning regenerates them.
#
#   ./run.sh [--stage N] [--stop-stage M] [--size default|tiny] [--train-repeats none|natural]
#            [--config NAME] [--exp DIR] [--beam N] [hydra overrides...]
#
# The train split's transcripts never repeat a word (--train-repeats none, the default): the
# corpus that reproduces real recordings' deleted repeats (README.md); `natural` draws every
# digit independently, as dev, test and repeats always are.
#
# Stages: 0 corpus, 1 features, 2 vocabulary, 3 training, 4 decoding, 5 scoring.
# Overrides go to cbasr-train, e.g. ./run.sh --stage 3 encoder.hidden=192 trainer.max_epochs=12
set -euo pipefail
cd "$(dirname "$0")"
all_args="$*"

recipe_name=digits

stage=0
stop_stage=5
beam=8
size=default
train_repeats=none
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
    --train-repeats) train_repeats=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --exp) exp=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --beam) beam=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) overrides+=("$1"); shift ;;
  esac
done
exp=${exp:-exp/${config}}

source ../shared/common.sh
log "run.sh $all_args (log: $PWD/$logfile)"

if stage_on 0; then
  log "stage 0: synthetic connected-digits corpus ($size, train repeats: $train_repeats) -> data/digits"
  cbasr-synth --profile digits --out data/digits --size "$size" --seed "$seed" --workers "$workers" \
    --train-repeats "$train_repeats"
fi

if stage_on 1; then
  log "stage 1: 80-dim log-mel filterbanks -> data/fbank"
  cbasr-features --manifest-dir data/digits --out data/fbank --splits train dev test repeats \
    --num-mel-bins 80 --workers "$workers"
fi

if stage_on 2; then
  log "stage 2: word vocabulary -> data/lang/words.txt"
  cbasr-vocab --manifest data/digits/train.jsonl --units words --inventory data/digits/words.txt \
    --out data/lang/words.txt --check data/digits/dev.jsonl data/digits/test.jsonl \
    data/digits/repeats.jsonl
fi

if stage_on 3; then
  log "stage 3: training $exp (resumes if interrupted)"
  cbasr-train --config-dir conf --config-name "$config" exp_dir="$exp" ${overrides[@]+"${overrides[@]}"}
fi

if stage_on 4; then
  log "stage 4: greedy and beam-$beam decoding of dev, test and repeats with $exp/checkpoints/best.pt"
  for search in 0 "$beam"; do
    decode_splits dev test repeats -- --exp-dir "$exp" --manifest-dir data/digits --feature-dir data/fbank \
      --beam "$search"
  done
fi

if stage_on 5; then
  log "stage 5: scoring"
  cbasr-score --exp-dir "$exp" --splits dev test repeats
  cbasr-score --exp-dir "$exp" --splits dev test repeats --tag "beam$beam"
  echo
  cbasr-results "$exp"
  echo
fi

log "done in $(( $(date +%s) - recipe_start )) s"
