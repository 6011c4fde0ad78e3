#!/usr/bin/env bash
# WSJ: manifests from the corpus's indices -> features (Shorten audio through ffmpeg) -> units
# (characters or sentencepiece) -> training on si284 (or si84) -> greedy and beam decoding of
# dev93 and eval92 -> WER. Every stage skips itself when its outputs are complete.
#
#   ./run.sh --corpus-dir DIR [--stage N] [--stop-stage M] [--train-set si284|si84] [--units chars|sp]
#            [--sp-size N] [--config NAME] [--exp DIR] [--beam N] [--allow-partial] [hydra overrides...]
#            [--lm-hidden N] [--lm-layers N] [--lm-epochs N] [--lm-valid FILE] [--lm-weight W]
#            [--word-lm NAME]
#
# Stages: 0 manifests, 1 features, 2 units, 3 training, 4 decoding, 5 scoring; with
# --stop-stage 8 also the language models: 6 LM data (the LM disc's text and base ARPA n-grams),
# 7 an LSTM LM of the acoustic model's units on that text, 8 beam decoding with each LM fused
# (the unit LM, and the word ARPA NAME scored at word ends) and scoring.
set -euo pipefail
cd "$(dirname "$0")"
all_args="$*"

recipe_name=wsj
stage=0
stop_stage=5
corpus_dir=""
train_set=si284
units=chars
sp_size=500
config=blstm_ctc
exp=""
beam=8
workers=2
allow_partial=false
lm_hidden=512
lm_layers=2
lm_epochs=10
lm_valid=data/wsj/dev93.jsonl  # the LM's validation text: dev93's transcripts
lm_weight=0.5
word_lm=tcb20onp  # base_lm/tcb20onp.z: the 20k closed-vocabulary trigram Kaldi decodes with
source ../shared/parse_options.sh "$@"
exp=${exp:-exp/${config}_${units}}
case "$units" in
  chars) unit_name=chars; data_units=chars ;;
  sp) unit_name=sp${sp_size}; data_units=sp:data/lang/${unit_name}.model ;;
  *) echo "run.sh: --units must be chars or sp" >&2; exit 2 ;;
esac
source ../shared/common.sh
log "run.sh $all_args (log: $PWD/$logfile)"

if stage_on 0; then
  [[ -n $corpus_dir ]] || { echo "run.sh: stage 0 needs --corpus-dir (the WSJ copy)" >&2; exit 2; }
  log "stage 0: WSJ manifests from $corpus_dir -> data/wsj"
  cbasr-prepare wsj --corpus-dir "$corpus_dir" --out data/wsj $([[ $allow_partial == true ]] && echo --allow-partial)
fi

if stage_on 1; then
  log "stage 1: 80-dim log-mel filterbanks of $train_set, dev93 and eval92 -> data/fbank"
  cbasr-features --manifest-dir data/wsj --out data/fbank --splits "$train_set" dev93 eval92 --workers "$workers"
fi

if stage_on 2; then
  log "stage 2: $unit_name units -> data/lang/$unit_name.txt"
  if [[ $units == sp ]]; then
    cbasr-vocab --manifest "data/wsj/$train_set.jsonl" --units sp --sp-size "$sp_size" --out "data/lang/$unit_name.txt"
  else
    cbasr-vocab --manifest "data/wsj/$train_set.jsonl" --units chars --out data/lang/chars.txt \
      --check data/wsj/dev93.jsonl data/wsj/eval92.jsonl
  fi
fi

if stage_on 3; then
  log "stage 3: training $exp on $train_set (on a GPU when one is visible; resumes if interrupted)"
  cbasr-train --config-dir conf --config-name "$config" exp_dir="$exp" data.train_split="$train_set" \
    data.units="$data_units" data.vocab="data/lang/$unit_name.txt" ${overrides[@]+"${overrides[@]}"}
fi

if stage_on 4; then
  log "stage 4: greedy and beam-$beam decoding of dev93 and eval92"
  for search in 0 "$beam"; do
    decode_splits dev93 eval92 -- --exp-dir "$exp" --manifest-dir data/wsj --feature-dir data/fbank --beam "$search"
  done
fi

if stage_on 5; then
  log "stage 5: scoring (character or piece error rate, and the WER in score.json)"
  cbasr-score --exp-dir "$exp" --splits dev93 eval92
  cbasr-score --exp-dir "$exp" --splits dev93 eval92 --tag "beam$beam"
  echo
  cbasr-results "$exp"
  echo
fi

lm_exp=exp/lm_${unit_name}
if stage_on 6; then
  [[ -n $corpus_dir ]] || { echo "run.sh: stage 6 needs --corpus-dir (the WSJ copy)" >&2; exit 2; }
  log "stage 6: LM text and base ARPA n-grams from $corpus_dir -> data/wsj_lm"
  cbasr-prepare wsj-lm --corpus-dir "$corpus_dir" --out data/wsj_lm $([[ $allow_partial == true ]] && echo --allow-partial)
fi

if stage_on 7; then
  log "stage 7: LSTM LM of $unit_name units on the LM text -> $lm_exp"
  cbasr-train-lm exp_dir="$lm_exp" data.train=data/wsj_lm/lm_train.txt data.valid="$lm_valid" \
    data.vocab="data/lang/$unit_name.txt" data.units="$data_units" lm.hidden="$lm_hidden" \
    lm.num_layers="$lm_layers" trainer.max_epochs="$lm_epochs"
fi

if stage_on 8; then
  [[ $lm_weight != *,* ]] || { echo "run.sh: --lm-weight takes one number here (grids: cbasr-decode)" >&2; exit 2; }
  word_lm=${word_lm,,}  # stage 6 writes the ARPA names in lower case
  weight=$(printf '%g' "$lm_weight")  # as cbasr-decode writes it in the directory name
  log "stage 8: beam-$beam decoding of dev93 and eval92 with the $unit_name LM and with the word LM $word_lm"
  common=(--exp-dir "$exp" --manifest-dir data/wsj --feature-dir data/fbank --splits dev93 eval92 --beam "$beam" --lm-weight "$weight")
  cbasr-decode "${common[@]}" --lm "$lm_exp"
  cbasr-decode "${common[@]}" --lm "data/wsj_lm/$word_lm.arpa.gz" --lm-words
  for tag in "beam${beam}_lm${weight}-lm_${unit_name}" "beam${beam}_lm${weight}-${word_lm}-words"; do
    cbasr-score --exp-dir "$exp" --splits dev93 eval92 --tag "$tag"
  done
  echo
  cbasr-results "$exp"
  echo
fi

log "done in $(( $(date +%s) - recipe_start )) s"
