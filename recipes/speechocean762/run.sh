#!/usr/bin/env bash
# speechocean762 (OpenSLR 101, Apache 2.0): real read English of 250 Mandarin-speaking children
# and adults, test speakers never seen in training. Download -> manifests from the corpus's own
# Kaldi directories -> features -> units (phones by default) -> training -> greedy and beam
# decoding of dev and test -> PER (WER for word units), per speaker and by age group. Every stage
# skips itself when its outputs are complete; the download resumes where it was interrupted.
#
#   ./run.sh [--corpus-dir DIR] [--download-dir DIR] [--mirror URL] [--stage N] [--stop-stage M]
#            [--units phones|chars|sp] [--sp-size N] [--config NAME] [--exp DIR] [--beam N]
#            [--dev-speakers N] [--allow-partial] [hydra overrides...]
#
# Stages: 0 download (skipped with --corpus-dir, an unpacked copy), 1 manifests (train minus
# --dev-speakers held-out speakers, dev, test), 2 features, 3 units, 4 training, 5 decoding,
# 6 scoring.
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

log "done in $(( $(date +%s) - recipe_start )) s"
