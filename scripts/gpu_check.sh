#!/usr/bin/env bash
# The GPU check: on a fresh GPU machine (its steps' limits: 1095 s in all, more than one device call;
# GPU_STEPS="tests bench_greedy ..." runs the steps named, in this file's order), the benchmarks
# whose figures go to benchmarks/gpu/ (docs/performance.md) and the CUDA tests.
#
#   scripts/gpu_wheels.sh                      # first, here, where PyPI can be reached: .whl/
#   scripts/stage_author.sh CB_GIT PYDROBERT_GIT  # optional: the CB author's code, .author/
#   CBASR_COMMIT=<sha> scripts/gpu_check.sh OUT  # there, in the repository's root
#
# Steps, each under its own time limit, each writing into OUT (created; 8 files, as many as a
# device machine sends back):
#   summary.txt          nvidia-smi's name of the GPU, torch's and triton's versions, the commit,
#                        then each step's exit status and time
#   tests.log            (step tests) pytest --device cuda on the Triton-marked and gpu-marked
#                        tests: the kernels, the CUDA graphs of greedy decoding, the trainer
#   bench_losses.jsonl   scripts/bench_losses.py --device cuda --json (LOSSES=a,b: those)
#   bench_distributions.jsonl  scripts/bench_distributions.py --device cuda --json (with the CB
#                        author's code when AUTHOR_SRC=SRC:SITE names it, see that script, or
#                        when scripts/stage_author.sh has staged it in .author/: carry it too)
#   bench_train.jsonl    (bench_greedy) scripts/bench_greedy.py --device cuda --json: label-looping
#                        greedy decoding, eager and from CUDA graphs, against frame-looping
#                        (lines with "greedy"); (bench_beams) --beams 4 --beams-only: beam 4 with
#                        its prefixes merged on the host, on the device, from CUDA graphs
#                        (lines with "beam_search"); (bench_train) scripts/bench_train.py --synthetic
#                        --device cuda --json --warm-pass --gpu-time on the synth presets, eager
#                        and (bench_graphs) with trainer.cuda_graphs=true; (conformer) the
#                        LibriSpeech Conformers against scripts/conformer_floor.py (--floor)
#   profile.txt          (sync_sites) each synchronising operation of a step, by where it is
#                        called (bench_train.py --sync-sites); (profile) the same presets under
#                        torch.profiler: each operator's host and device time, and their totals,
#                        which say whether a step waits on the host or on the device
# Every JSON line gains the device's name, the commit (CBASR_COMMIT, else git's HEAD) and the
# command that wrote it; `scripts/perf_table.py OUT` then prints the targets' table (the one
# docs/performance.md shows, also written to OUT/table.md), and the folder is committed as benchmarks/gpu/.
# A step that fails is recorded in OUT/summary.txt (its error output in OUT/stderr.log) and the
# rest still run; the exit status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_check.sh OUT}
mkdir -p "$out"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/cbasr-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/cbasr-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled kernels, not the interpreter
commit=${CBASR_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if [[ -z ${AUTHOR_SRC:-} && -d .author/src ]]; then
  AUTHOR_SRC=$PWD/.author/src:$PWD/.author/site
fi
failed=0
summary="$out/summary.txt"

steps=${GPU_STEPS:-tests bench_greedy bench_beams bench_losses bench_distributions bench_train bench_graphs conformer sync_sites table}

step() {  # NAME LIMIT_S OUTFILE COMMAND...: run COMMAND, stdout to OUTFILE, note the outcome
  local name=$1 limit=$2 file=$3
  shift 3
  [[ " $steps " == *" $name "* ]] || return 0
  local start=$SECONDS
  timeout "$limit" "$@" >"$file" 2>>"$out/stderr.log"
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s: $*" | tee -a "$summary"
  [[ $rc -eq 0 ]] || failed=$((failed + 1))
}

annotate() {  # FILE COMMAND: add device name, commit and command to each JSON line of FILE (if any)
  [[ -f $1 ]] || return 0
  "$py" scripts/perf_table.py --annotate "$1" "$commit" "$2"
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit $commit"
} >"$summary" 2>&1

# the CUDA tests first: a path that fails them has no figure worth taking
step tests 120 "$out/tests.log" "$py" -m pytest -q -p no:cacheprovider --device cuda \
  -m "triton or gpu" tests/losses tests/distributions tests/models tests/training tests/search

cmd="scripts/bench_greedy.py --device cuda --json --batches 16 64"
step bench_greedy 60 "$out/greedy.tmp" "$py" $cmd
annotate "$out/greedy.tmp" "$cmd"
[[ -f $out/greedy.tmp ]] && cat "$out/greedy.tmp" >>"$out/bench_train.jsonl" && rm -f "$out/greedy.tmp"

# the transducer beam search, its prefixes merged on the host, on the device, from CUDA graphs
cmd="scripts/bench_greedy.py --device cuda --json --batches 16 --beams 4 --beams-only"
step bench_beams 120 "$out/beams.tmp" "$py" $cmd
annotate "$out/beams.tmp" "$cmd"
[[ -f $out/beams.tmp ]] && cat "$out/beams.tmp" >>"$out/bench_train.jsonl" && rm -f "$out/beams.tmp"

# the LibriSpeech Conformers (bf16, 60000 frames per batch) against the minimal loop
cmd="scripts/bench_train.py --synthetic --device cuda --json --warm-pass --precision bf16 --max-frames 60000 --num-workers 4 --steps 8 --warmup 3 --floor --presets ls_conformer_ctc ls_conformer_cb ls_conformer_hat"
step conformer 150 "$out/conformer.tmp" "$py" $cmd
annotate "$out/conformer.tmp" "$cmd"
[[ -f $out/conformer.tmp ]] && cat "$out/conformer.tmp" >>"$out/bench_train.jsonl" && rm -f "$out/conformer.tmp"

# (cb_monotonic and cb_monotonic_variable: the second-order CB's frames/s over the first's;
# forced_suffix and cb_reinforce_idb: the sampled CB systems, their tables in Triton kernels)
cmd="scripts/bench_train.py --synthetic --device cuda --json --warm-pass --gpu-time --presets blstm_ctc cb_pointwise demo_hat cb_monotonic cb_monotonic_variable forced_suffix cb_reinforce_idb"
step bench_train 150 "$out/train.tmp" "$py" $cmd
annotate "$out/train.tmp" "$cmd"
[[ -f $out/train.tmp ]] && cat "$out/train.tmp" >>"$out/bench_train.jsonl" && rm -f "$out/train.tmp"

# the same steps replayed from CUDA graphs (trainer.cuda_graphs): wall time over kernel time
cmd="scripts/bench_train.py --synthetic --device cuda --json --warm-pass --gpu-time --presets blstm_ctc cb_pointwise demo_hat --set trainer.cuda_graphs=true"
step bench_graphs 120 "$out/graphs.tmp" "$py" $cmd
annotate "$out/graphs.tmp" "$cmd"
[[ -f $out/graphs.tmp ]] && cat "$out/graphs.tmp" >>"$out/bench_train.jsonl" && rm -f "$out/graphs.tmp"

# where a step waits on the host (what a CUDA graph of it cannot hold)
step sync_sites 60 "$out/profile.txt" bash -c '"$@" 2>&1 >/dev/null' - "$py" scripts/bench_train.py \
  --synthetic --device cuda --steps 3 --warmup 2 --sync-sites \
  --presets blstm_ctc cb_pointwise demo_hat

# the losses, the distributions and the profiles (figures measured before come last)
cmd="scripts/bench_losses.py --device cuda --json --losses ${LOSSES:-ctc,cb,cb_pytorch,rnnt,hat_fused,hat_pruned}"
step bench_losses 145 "$out/bench_losses.jsonl" "$py" $cmd
annotate "$out/bench_losses.jsonl" "$cmd"

cmd=(scripts/bench_distributions.py --device cuda --json)
[[ -z ${AUTHOR_SRC:-} ]] || cmd+=(--author-src "$AUTHOR_SRC")  # (a path may hold spaces)
step bench_distributions 90 "$out/bench_distributions.jsonl" "$py" "${cmd[@]}"
annotate "$out/bench_distributions.jsonl" "${cmd[*]}"

step profile 70 "$out/profile.tmp" bash -c '"$@" 2>&1 >/dev/null' - "$py" scripts/bench_train.py \
  --synthetic --device cuda --warm-pass --steps 5 --warmup 2 --profile 30 \
  --presets blstm_ctc cb_pointwise demo_hat
[[ -f $out/profile.tmp ]] && cat "$out/profile.tmp" >>"$out/profile.txt" && rm -f "$out/profile.tmp"

step table 10 "$out/table.md" "$py" scripts/perf_table.py "$out"
echo "failed steps: $failed" | tee -a "$summary"
exit "$failed"
