#!/usr/bin/env bash
# LibriSpeech (free, CC BY 4.0, from OpenSLR): download -> manifests -> features -> units
# (sentencepiece or characters) -> training -> greedy and beam decoding -> WER, and with
# --stop-stage 7 beam decoding fused with an official LibriSpeech word n-gram. Every stage skips
# itself when its outputs are complete; the download resumes where it was interrupted.
#
#   ./run.sh [--train-set mini|100|460|960] [--stage N] [--stop-stage M] [--corpus-dir DIR]
#            [--download-dir DIR] [--mirror URL] [--sums FILE] [--units sp|chars] [--sp-size N]
#            [--config NAME] [--exp DIR] [--beam N] [--allow-partial] [--word-lm NAME]
#            [--lm-weight W] [hydra overrides...]
#
# --train-set mini (the default) is Mini LibriSpeech: train-clean-5 (about 5 h) and dev-clean-2,
# 460 MB to download; 100 is train-clean-100 (6.3 GB), 460 adds train-clean-360 and 960
# train-other-500, each with dev-clean, dev-other, test-clean and test-other.
#
# Stages: 0 download (skipped with --corpus-dir, a copy already unpacked), 1 manifests,
# 2 features, 3 units, 4 training, 5 decoding, 6 scoring; 7 the word n-gram --word-lm
# (3-gram.pruned.1e-7 by default) downloaded, each evaluation set decoded at --beam fused with it
# (--lm-weight) and scored.
set -euo pipefail
cd "$(dirname "$0")"
all_args="$*"

recipe_name=librispeech
stage=0
stop_stage=6
train_set=mini
corpus_dir=""
download_dir=downloads
mirror=""
sums=""
units=sp
sp_size=500
config=conformer_ctc
exp=""
beam=8
workers=2
allow_partial=false
word_lm=3-gram.pruned.1e-7
lm_weight=0.5
source ../shared/parse_options.sh "$@"

case "$train_set" in
  mini) train_parts=(train-clean-5); train_split=train-clean-5; valid_split=dev-clean-2
        eval_sets=(dev-clean-2) ;;
  100) train_parts=(train-clean-100); train_split=train-clean-100 ;;
  460) train_parts=(train-clean-100 train-clean-360); train_split=train-460 ;;
  960) train_parts=(train-clean-100 train-clean-360 train-other-500); train_split=train-960 ;;
  *) echo "run.sh: --train-set must be mini, 100, 460 or 960" >&2; exit 2 ;;
esac
if [[ $train_set != mini ]]; then
  valid_split=dev-clean
  eval_sets=(dev-clean dev-other test-clean test-other)
fi
case "$units" in
  chars) unit_name=chars; data_units=chars ;;
  sp) unit_name=sp${sp_size}; data_units=sp:data/lang/${unit_name}.model ;;
  *) echo "run.sh: --units must be sp or chars" >&2; exit 2 ;;
esac
exp=${exp:-exp/${config}_${train_set}_${unit_name}}
source ../shared/common.sh
log "run.sh $all_args (log: $PWD/$logfile)"
mirror_args=()
[[ -z $mirror ]] || mirror_args+=(--mirror "$mirror")
[[ -z $sums ]] || mirror_args+=(--sums "$sums")

if stage_on 0; then
  if [[ -n $corpus_dir ]]; then
    log "stage 0: --corpus-dir $corpus_dir given: nothing to download"
  else
    log "stage 0: downloading ${train_parts[*]} ${eval_sets[*]} -> $download_dir"
    cbasr-download librispeech --out "$download_dir" --subsets "${train_parts[@]}" "${eval_sets[@]}" \
      ${mirror_args[@]+"${mirror_args[@]}"}
  fi
fi
corpus_dir=${corpus_dir:-$download_dir}

if stage_on 1; then
  log "stage 1: manifests of ${train_parts[*]} ${eval_sets[*]} from $corpus_dir -> data/librispeech"
  cbasr-prepare librispeech --corpus-dir "$corpus_dir" --out data/librispeech \
    --subsets "${train_parts[@]}" "${eval_sets[@]}" $([[ $allow_partial == true ]] && echo --allow-partial)
fi

if stage_on 2; then
  log "stage 2: 80-dim log-mel filterbanks of $train_split ${eval_sets[*]} -> data/fbank"
  cbasr-features --manifest-dir data/librispeech --out data/fbank --splits "$train_split" "${eval_sets[@]}" \
    --workers "$workers"
fi

if stage_on 3; then
  log "stage 3: $unit_name units from $train_split -> data/lang/$unit_name.txt"
  if [[ $units == sp ]]; then
    cbasr-vocab --manifest "data/librispeech/$train_split.jsonl" --units sp --sp-size "$sp_size" \
      --out "data/lang/$unit_name.txt"
  else
    checks=()
    for set in "${eval_sets[@]}"; do checks+=("data/librispeech/$set.jsonl"); done
    cbasr-vocab --manifest "data/librispeech/$train_split.jsonl" --units chars --out data/lang/chars.txt \
      --check "${checks[@]}"
  fi
fi

if stage_on 4; then
  log "stage 4: training $exp on $train_split (on a GPU when one is visible; resumes if interrupted)"
  cbasr-train --config-dir conf --config-name "$config" exp_dir="$exp" data.train_split="$train_split" \
    data.valid_split="$valid_split" data.units="$data_units" data.vocab="data/lang/$unit_name.txt" \
    ${overrides[@]+"${overrides[@]}"}
fi

if stage_on 5; then
  log "stage 5: greedy and beam-$beam decoding of ${eval_sets[*]}"
  for search in 0 "$beam"; do
    decode_splits "${eval_sets[@]}" -- --exp-dir "$exp" --manifest-dir data/librispeech \
      --feature-dir data/fbank --beam "$search"
  done
fi

if stage_on 6; then
  log "stage 6: scoring (WER; pieces or characters joined into words)"
  cbasr-score --exp-dir "$exp" --splits "${eval_sets[@]}"
  cbasr-score --exp-dir "$exp" --splits "${eval_sets[@]}" --tag "beam$beam"
  echo
  cbasr-results "$exp"
  echo
fi

if stage_on 7; then
  [[ $lm_weight != *,* ]] || { echo "run.sh: --lm-weight takes one number here (grids: cbasr-decode)" >&2; exit 2; }
  weight=$(printf '%g' "$lm_weight")  # as cbasr-decode writes it in the directory name
  arpa="$download_dir/lm/$word_lm.arpa.gz"
  log "stage 7: the word n-gram $word_lm -> $arpa; beam-$beam decoding of ${eval_sets[*]} fused with it"
  cbasr-download librispeech --out "$download_dir" --lm-files "$word_lm.arpa.gz" ${mirror_args[@]+"${mirror_args[@]}"}
  decode_splits "${eval_sets[@]}" -- --exp-dir "$exp" --manifest-dir data/librispeech \
    --feature-dir data/fbank --beam "$beam" --lm "$arpa" --lm-words --lm-weight "$weight"
  cbasr-score --exp-dir "$exp" --splits "${eval_sets[@]}" --tag "beam${beam}_lm${weight}-${word_lm}-words"
  echo
  cbasr-results "$exp"
  echo
fi

log "done in $(( $(date +%s) - recipe_start )) s"
