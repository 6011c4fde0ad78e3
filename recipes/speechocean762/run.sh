#!/usr/bin/env bash
# speechocean762 (OpenSLR 101, Apache 2.0): real read English of 250 Mandarin-speaking children
# and adults, test speakers never seen in training. Download -> manifests from the corpus's own
# Kaldi directories -> features -> units (phones by default) -> training -> greedy and beam
# decoding of dev and test -> PER (WER for word units), per speaker and by age group; then an
# LSTM LM of the units on train's transcripts and beam decoding with it. Every stage skips
# itself when its outputs are complete; the download resumes where it was interrupted.
#
#   ./run.sh [--corpus-dir DIR] [--download-dir DIR] [--mirror URL] [--stage N] [--stop-stage M]
#            [--units phones|chars|sp] [--sp-size N] [--config NAME] [--exp DIR] [--beam N]
#            [--dev-speakers N] [--lm-weight W] [--label-bonus B] [--allow-partial]
#            [hydra overrides...]
#
# Stages: 0 download (skipped with --corpus-dir, an unpacked copy), 1 manifests (train minus
# --dev-speakers held-out speakers, dev, test), 2 features, 3 units, 4 training, 5 decoding,
# 6 scoring (the default stops here), 7 the LM, 8 beam decoding with it (weights chosen on dev:
# cbasr-decode --splits dev --lm-weight W1,W2 --label-bonus B1,B2 prints the grid).
set -euo pipefail
cd "$(dirname "$0")"
all_args="$*"

recipe_name=speechocean762
stage=0
stop_stage=6
corpus_dir=""
download_dir=downloads
mirror=""
units=phones
sp_size=300
config=blstm_ctc
exp=""
beam=8
workers=2
dev_speakers=12
lm_epochs=40
lm_dropout=0.3
lm_weight=0.3
label_bonus=1
allow_partial=false
source ../shared/parse_options.sh "$@"

case "$units" in
  phones) unit_name=phones; data_units=phones ;;
  chars) unit_name=chars; data_units=chars ;;
  sp) unit_name=sp${sp_size}; data_units=sp:data/lang/${unit_name}.model ;;
  *) echo "run.sh: --units must be phones, chars or sp" >&2; exit 2 ;;
esac
suffix=""
[[ $units == phones ]] || suffix=_${unit_name}
exp=${exp:-exp/${config}${suffix}}
source ../shared/common.sh
log "run.sh $all_args (log: $PWD/$logfile)"

if stage_on 0; then
  if [[ -n $corpus_dir ]]; then
    log "stage 0: --corpus-dir $corpus_dir given: nothing to download"
  else
    log "stage 0: downloading speechocean762 -> $download_dir"
    cbasr-download speechocean762 --out "$download_dir" ${mirror:+--mirror "$mirror"}
  fi
fi
corpus_dir=${corpus_dir:-$download_dir/speechocean762}

if stage_on 1; then
  log "stage 1: manifests from the Kaldi directories of $corpus_dir -> data/so762"
  cbasr-prepare speechocean762 --corpus-dir "$corpus_dir" --out data/so762 \
    --dev-speakers "$dev_speakers" $([[ $allow_partial == true ]] && echo --allow-partial)
fi

if stage_on 2; then
  log "stage 2: 80-dim log-mel filterbanks -> data/fbank"
  cbasr-features --manifest-dir data/so762 --out data/fbank --splits train dev test \
    --num-mel-bins 80 --workers "$workers"
fi

if stage_on 3; then
  log "stage 3: $unit_name units from train -> data/lang/$unit_name.txt"
  checks=(--check data/so762/dev.jsonl data/so762/test.jsonl)
  case "$units" in
    phones) cbasr-vocab --manifest data/so762/train.jsonl --units phones \
              --inventory data/so762/phones.txt --out data/lang/phones.txt "${checks[@]}" ;;
    chars) cbasr-vocab --manifest data/so762/train.jsonl --units chars --out data/lang/chars.txt \
             "${checks[@]}" ;;
    sp) cbasr-vocab --manifest data/so762/train.jsonl --units sp --sp-size "$sp_size" \
          --out "data/lang/$unit_name.txt" ;;
  esac
fi

if stage_on 4; then
  log "stage 4: training $exp (resumes if interrupted)"
  cbasr-train --config-dir conf --config-name "$config" exp_dir="$exp" data.units="$data_units" \
    data.vocab="data/lang/$unit_name.txt" ${overrides[@]+"${overrides[@]}"}
fi

if stage_on 5; then
  log "stage 5: greedy and beam-$beam decoding of dev and test with $exp/checkpoints/best.pt"
  for search in 0 "$beam"; do
    decode_splits dev test -- --exp-dir "$exp" --manifest-dir data/so762 --feature-dir data/fbank \
      --beam "$search"
  done
fi

if stage_on 6; then
  log "stage 6: scoring, per speaker and by age group"
  for tag in "" "beam$beam"; do
    cbasr-score --exp-dir "$exp" --splits dev test ${tag:+--tag "$tag"} --group-by age_group \
      --manifest-dir data/so762
  done
  echo
  cbasr-results "$exp"
  echo
fi

lm_exp=exp/lm_${unit_name}
if stage_on 7; then
  log "stage 7: LSTM LM of $unit_name units on train's transcripts -> $lm_exp"
  cbasr-train-lm exp_dir="$lm_exp" data.train=data/so762/train.jsonl data.valid=data/so762/dev.jsonl \
    data.vocab="data/lang/$unit_name.txt" data.units="$data_units" lm.dropout="$lm_dropout" \
    trainer.max_epochs="$lm_epochs" trainer.num_threads=1
fi

if stage_on 8; then
  [[ $lm_weight$label_bonus != *,* ]] || { echo "run.sh: --lm-weight and --label-bonus take one number here (grids: cbasr-decode)" >&2; exit 2; }
  weight=$(printf '%g' "$lm_weight") bonus=$(printf '%g' "$label_bonus")  # as cbasr-decode names it
  tag="beam${beam}_lm${weight}-lm_${unit_name}"
  [[ $bonus == 0 ]] || tag+="_bonus${bonus}"
  log "stage 8: beam-$beam decoding of dev and test with $exp/checkpoints/best.pt and the LM $lm_exp"
  decode_splits dev test -- --exp-dir "$exp" --manifest-dir data/so762 --feature-dir data/fbank \
    --beam "$beam" --lm "$lm_exp" --lm-weight "$weight" --label-bonus "$bonus"
  cbasr-score --exp-dir "$exp" --splits dev test --tag "$tag" --group-by age_group \
    --manifest-dir data/so762
  echo
  cbasr-results "$exp"
  echo
fi

log "done in $(( $(date +%s) - recipe_start )) s"
