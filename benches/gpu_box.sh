#!/usr/bin/env bash
# The checks and measurements run on the GPU box (see docs/development.md). Usage there,
# from the repo root, with the wheel and the io_bench binary carried in .device/:
#   bash benches/gpu_box.sh [install|format|io|tests|all|gpu6|stream]
# Logs go to $OUT (or /tmp/flint-out).
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
what=${1:-all}
DATA=${FLINT_BENCH_DIR:-/tmp/flint-bench}
mkdir -p "$DATA"

install() {
  python3 -m pip install --no-deps --force-reinstall -q .device/flint-*.whl 2>&1 | tail -2
  python3 -c "import flint._core as c, flint; print('flint._core', c.__version__, 'from', c.__file__)"
  flint --version
  nproc; free -g | head -2; df -h "$DATA" | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
}

format() {
  /usr/bin/time -v flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" 2>&1 \
    | grep -E "wrote|Elapsed|Maximum resident"
  /usr/bin/time -v flint verify "$DATA/q30.ftw" 2>&1 | grep -E "ok|Elapsed|Maximum resident"
  flint synth --geometry qwen3-30b-a3b --quant int4 --layers 2 -o "$DATA/q30-2l.ftw" | tail -1
  python3 benches/open_load.py .device/tiny-code-moe-int4.ftw "$DATA/q30-2l.ftw" "$DATA/q30.ftw" --reps 5
}

io() {
  .device/io_bench "$DATA/q30.ftw" --reps 3 --threads 1,4,8,16
}

tests() {
  python3 -m pytest tests/format tests/io tests/test_cli.py -q -p no:cacheprovider 2>&1 | tail -5
}


# Issue 6 on the GPU: CUDA tests and resident decode of tiny-code-moe. Needs the
# checkpoint carried in .device/shared (the tests look for ../shared).
gpu6() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  python3 -m pytest tests/models/test_gpu.py tests/io -q -p no:cacheprovider -rs 2>&1 | tail -8
  for q in none int8 int4; do
    flint convert ../shared/models/tiny-code-moe -o "$DATA/tcm-$q.ftw" --quant $q | tail -1
  done
  python3 benches/resident_decode.py "$DATA/tcm-none.ftw" "$DATA/tcm-int8.ftw" "$DATA/tcm-int4.ftw" --device cuda --reps 5
  python3 benches/convert_throughput.py --gib 4 --reps 3 --dir "$DATA/convert"
}

# Issue 7 on the GPU box: streaming tests (CPU and CUDA), the streaming benchmark, the
# demo, and the convert benchmark again (the reader became zero-copy).
stream() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  python3 -m pytest tests/models/test_streaming.py tests/io -q -p no:cacheprovider -rs 2>&1 | tail -6
  flint convert ../shared/models/tiny-code-moe -o "$DATA/tcm-none.ftw" | tail -1
  python3 benches/stream_bench.py "$DATA/tcm-none.ftw" --reps 3 --tokens 64
  XDG_CACHE_HOME="$DATA/cache" /usr/bin/time -f "flint demo: %e s wall, peak RSS %M KB" flint demo -n 32 2>&1 | tail -16
}

# Issue 7's VRAM expert cache: its CUDA tests, then V1/S1-style budgets on the 30B-A3B
# geometry (random weights: near-uniform routing, the pessimistic case for caches).
vram() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  python3 -m pytest tests/models/test_vram_cache.py tests/models/test_streaming.py \
    tests/models/test_gpu.py -q -p no:cacheprovider -rs -m gpu 2>&1 | tail -8
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  P="def fibonacci(n):"
  for args in "--no-stream" "--ram-budget 20 --vram-budget 4" \
      "--ram-budget 20 --vram-budget 4 --deterministic" "--ram-budget 6 --vram-budget 4" \
      "--ram-budget 20 --vram-budget 0"; do
    echo "== flint run q30 int4 $args"
    XDG_CACHE_HOME="$DATA/cache" flint run "$DATA/q30.ftw" -p "$P" -n 48 --ignore-eos --stats $args 2>&1 | tail -14
  done
}

# After issues 7, 8, 9, 15 landed: every gpu-marked test and the CPU kernels' tests
# (AVX-512 there), then V1 and S1 with flint bench (random ids fed to tg: a random
# model's greedy text repeats, which would make any cache look perfect).
gpu7a() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  python3 -m pytest tests/models/test_vram_cache.py tests/models/test_streaming.py \
    tests/models/test_gpu.py tests/bench/test_tune.py tests/models/test_cpu_kernels.py \
    -q -p no:cacheprovider --tb=line -rf 2>&1 | tail -15
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  B="flint bench $DATA/q30.ftw -n 32 --tg-random -t 16"
  echo "== V1: VRAM 4 GiB, all experts in RAM"
  $B -p 512 -r 2 --mode resident,full --ram-budget 20 --vram-budget 4 || true
  echo "== S1: VRAM 4 GiB, RAM 6 GiB"; $B -p 0 -r 2 --mode full,naive --ram-budget 6 --vram-budget 4 || true
  echo "== V1 deterministic"; $B -p 0 -r 1 --mode full --ram-budget 20 --vram-budget 4 --deterministic || true
  python3 benches/cpu_kernels.py --threads 1,16 --calls 10
}

# P8 (8k-token prompt at V1 budgets), CPU kernel bandwidth on the AVX-512 box, tune.
gpu7b() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== P8"; flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 1 --mode full --ram-budget 20 --vram-budget 4 -t 16 || true
  echo "== P8 deterministic"; flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 1 --mode full --ram-budget 20 --vram-budget 4 --deterministic -t 16 || true
  python3 benches/cpu_kernels.py --threads 1,8,16 --calls 20
  XDG_CACHE_HOME="$DATA/cache" flint tune "$DATA/q30.ftw" --ram-budget 20 2>&1 | tail -20
}

# Every gpu-marked test (all families: the family lists parametrise them), first thing
# in a session with device time: the last changes of 2026-11-29 never ran on CUDA.
gputests() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  python3 -m pytest tests/models/test_vram_cache.py tests/models/test_streaming.py \
    tests/models/test_gpu.py tests/bench/test_tune.py \
    -q -p no:cacheprovider --tb=line -rf -m gpu 2>&1 | tail -20
}

# Issue 14 on a 2-GPU box: the 2-GPU tests (and every gpu-marked test, now split over
# both GPUs by default), V1 and S1 on one GPU against two with the same total VRAM
# budget, and the boundary hop.
gpu14() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  nvidia-smi --query-gpu=name,memory.free --format=csv
  python3 -m pytest tests/models/test_split.py tests/models/test_vram_cache.py \
    tests/models/test_streaming.py tests/models/test_gpu.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -40
  if [ "${ONE_GPU:-1}" = 1 ]; then
    echo "== the same on one GPU"
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest tests/models/test_vram_cache.py \
      tests/models/test_streaming.py tests/models/test_gpu.py \
      -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -25
  fi
  python3 benches/split_hop.py --hidden 2048 --tokens 1,512 --reps 1000
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  B="flint bench $DATA/q30.ftw -p 0 -n 32 --tg-random -t 16 -r 2 --mode full"
  for dev in cuda:0 cuda:0,cuda:1; do
    echo "== V1 $dev: VRAM 4 GiB total, all experts in RAM"; $B --ram-budget 20 --vram-budget 4 --device $dev || true
    echo "== S1 $dev: VRAM 4 GiB total, RAM 6 GiB"; $B --ram-budget 6 --vram-budget 4 --device $dev || true
  done
}

# Issues 8, 9 and 15 on one H200: GPU-wave, elastic-VRAM and page-locked-arena tests,
# P8 with and without GPU waves (and the pinned bandwidth its PCIe bound needs), V1
# decode with each --host-split, flint tune's GPU path, the CPU kernels after the
# AVX-512 BF16 work. Most important first: a timeout cuts the tail.
gpu9() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  python3 -m pytest tests/models/test_gpu_waves.py tests/models/test_vram_cache.py \
    ${GPU9_TESTS:-} -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -20
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  python3 -c "from flint.tune.measure import pinned_h2d_gb_s as f; print(f'pinned h2d {f():.2f} GB/s')"
  P="flint bench $DATA/q30.ftw -p 8192 -n 0 -r 1 --mode full --ram-budget 20 --vram-budget 4 -t 16"
  echo "== P8 GPU waves"; $P || true
  echo "== P8 per-projection copies"; $P --no-gpu-waves || true
  B="flint bench $DATA/q30.ftw -p 0 -n 32 --tg-random -t 16 -r 1 --mode full --ram-budget 20 --vram-budget 4"
  for hs in cpu fill q; do echo "== V1 --host-split $hs"; $B --host-split $hs || true; done
  [ -n "${GPU9_BENCH:-}" ] && python3 $GPU9_BENCH
  XDG_CACHE_HOME="$DATA/cache" flint tune "$DATA/q30.ftw" --ram-budget 20 2>&1 | tail -12
  python3 benches/cpu_kernels.py --threads 1,16 --calls 10
}

# Issue 10 on one H200: the graph step's tests (captured == eager launches bit for bit,
# every covered family, int8/int4 slabs), the GPU suites it touches, then R0 at int4:
# CUDA graphs against eager launches and the general eager path, with the roofline.
gpu10() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  [ -z "${GPU10_NO_TESTS:-}" ] && python3 -m pytest tests/models/test_graphs.py \
    tests/models/test_gpu.py ${GPU10_TESTS:-} -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -25
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout ${GPU10_BENCH_S:-240} python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 ${GPU10_MODES:-} || true
  [ -n "${GPU10_R0:-}" ] && timeout 150 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 2 --mode resident || true
}

# Issue 10, kernel tuning: block shapes of the expert kernels, and the decode step's
# kernels by time on a 12-layer model of the 30B-A3B geometry (quick to make).
gpu10k() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  [ -n "${GPU10_TESTS:-}" ] && timeout ${GPU10_TESTS_S:-300} python3 -m pytest $GPU10_TESTS \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -30
  [ -n "${GPU10_TUNE:-}" ] && python3 benches/moe_kernel_tune.py --scheme int4 2>&1 | tail -70
  flint synth --geometry qwen3-30b-a3b --quant int4 --layers 12 -o "$DATA/q12.ftw" | tail -1
  python3 benches/graph_decode.py "$DATA/q12.ftw" --tokens 64 --reps 1 --modes on --profile
}

# Issue 10, last check of a session: the graph tests, then R0's pp512/tg128 rows on a
# 12-layer model of the 30B-A3B geometry, graphs against the general eager path.
gpu10r() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -8
  flint synth --geometry qwen3-30b-a3b --quant int4 --layers 12 -o "$DATA/q12.ftw" | tail -1
  for g in auto off; do
    timeout 60 flint bench "$DATA/q12.ftw" -p 512 -n 128 -r 2 --mode resident --graphs $g 2>&1 | tail -3
  done
}

# Next session's first GPU run (what 2026-11-29's last changes could not run on a GPU):
# the graph tests (GPT-OSS and DeepSeek now covered; the cuda:1 test on 2 GPUs), the
# suites whose resident sides use --graphs off, R0 after the review fixes, R0's
# pp512/ttft after the chunked prompt dequantization, and the prompt-expert paths (the
# lead for P8: a streamed prompt packs each expert for tinygemm on every use).
gpu11() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 300 python3 -m pytest tests/models/test_graphs.py tests/models/test_gpu.py \
    tests/models/test_vram_cache.py tests/models/test_streaming.py tests/models/test_gpu_waves.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -30
  python3 benches/prompt_expert_paths.py --scheme int4
  python3 benches/prompt_expert_paths.py --scheme int8
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 200 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on,off || true
  for g in auto off; do
    timeout 120 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 2 --mode resident --graphs $g 2>&1 | tail -6
  done
}

# 2026-11-29 (fifth session), first GPU run: the last session's unrun GPU work (graph
# tests incl. GPT-OSS/DeepSeek, the suites), the prompt-expert paths (P8's lead), the
# CPU kernels after the AVX-512 BF16/int4 work, where V1's decode time goes (cProfile
# of the Python side, kept in $OUT), and R0's rows with graphs.
gpu12() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout ${GPU12_TESTS_S:-240} python3 -m pytest tests/models/test_graphs.py tests/models/test_gpu.py \
    tests/models/test_vram_cache.py tests/models/test_gpu_waves.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -30
  timeout 60 python3 benches/prompt_expert_paths.py --scheme int4
  timeout 60 python3 benches/cpu_kernels.py --threads 1,16 --calls 10 --x-bf16
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== V1 profile"
  timeout 150 python3 -m cProfile -o "$OUT/v1.prof" -m flint bench "$DATA/q30.ftw" -p 0 -n 16 \
    --tg-random -t 16 -r 1 --mode full --ram-budget 20 --vram-budget 4 2>&1 | tail -6
  timeout 100 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 2 --mode resident --graphs auto 2>&1 | tail -4
}

# V1 by kernel thread count (the fused host kernels share 16 cores with the main thread,
# the readers and CUDA's), full against naive (issue 9's V1 target), host experts
# through torch (--expert-kernels dequant) against the fused kernels (issue 15's V1
# before/after), the host split repeated, the arena's copy rate, tune's GPU path, C1.
gpu13() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  B="flint bench $DATA/q30.ftw -p 0 -n 16 --tg-random --ram-budget 20 --vram-budget 4"
  for t in ${GPU13_THREADS:-6 10 14 16}; do
    echo "== V1 full -t $t"; timeout 60 $B -r 1 --mode full -t $t 2>&1 | grep "q30.ftw"
  done
  T=${GPU13_T:-10}
  echo "== V1 full,naive -t $T"; timeout 120 $B -r 2 --mode full,naive -t $T 2>&1 | grep "q30.ftw"
  echo "== V1 dequant -t $T"; timeout 60 $B -r 1 --mode full -t $T --expert-kernels dequant 2>&1 | grep "q30.ftw"
  for hs in fill q; do
    echo "== V1 --host-split $hs -t $T"; timeout 60 $B -r 1 --mode full -t $T --host-split $hs 2>&1 | grep "q30.ftw"
  done
  timeout 40 python3 benches/pinned_copy.py 2>&1 | tail -6
  echo "== C1 on this box's CPU"
  timeout 100 flint bench "$DATA/q30.ftw" --device cpu -p 0 -n 8 --tg-random -r 1 --mode full,naive \
    --ram-budget 8.5 -t 15 2>&1 | grep "q30.ftw"
  XDG_CACHE_HOME="$DATA/cache" timeout 100 flint tune "$DATA/q30.ftw" --ram-budget 20 2>&1 | tail -14
}

# Fifth session's last GPU run: the streamed decode step (tests, V1 through it against
# the layer loop), the faster int4 pack (tests, prompt-expert paths), P8 warm (experts
# in RAM: the PCIe bound's premise), R0 with the Triton-dequantized prompt path, then
# V1 and S1 at other budgets through the step.
gpu15() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout ${GPU15_TESTS_S:-240} python3 -m pytest tests/models/test_streamed_step.py \
    tests/models/test_quant_pack.py tests/models/test_graphs.py tests/models/test_gpu_waves.py \
    tests/models/test_vram_cache.py tests/models/test_gpu.py tests/bench/test_tune.py \
    tests/models/test_elastic_vram.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -30
  timeout 40 python3 benches/prompt_expert_paths.py --scheme int4 --tokens 1,512
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  B="flint bench $DATA/q30.ftw -p 0 -n 64 --tg-random -r 1 --mode full --ram-budget 20 --vram-budget 4"
  for g in auto off; do
    echo "== V1 --graphs $g"; timeout 90 $B --graphs $g 2>&1 | grep -E "q30.ftw|decode|graph"
  done
  echo "== P8 warm"
  timeout 120 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 1 --mode full --warm --ram-budget 20 \
    --vram-budget 4 2>&1 | grep -E "q30.ftw|decode"
  echo "== R0"; timeout 100 flint bench "$DATA/q30.ftw" -p 512 -n 64 -r 1 --mode resident 2>&1 | grep -E "q30.ftw|decode"
  S="flint bench $DATA/q30.ftw -p 0 -n 32 --tg-random -r 1 --mode full"
  for b in "--ram-budget 20 --vram-budget 2" "--ram-budget 20 --vram-budget 8" \
      "--ram-budget 6 --vram-budget 4" "--ram-budget 10 --vram-budget 4"; do
    echo "== $b"; timeout 60 $S $b 2>&1 | grep "q30.ftw"
  done
}

# Where V1's decode time goes through the streamed step: cProfile of the main thread
# (kept in $OUT as v1-step.prof), its top entries printed.
gpu16() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 120 python3 -m cProfile -o "$OUT/v1-step.prof" -m flint bench "$DATA/q30.ftw" -p 0 -n 32 \
    --tg-random -r 1 --mode full --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw|decode"
  python3 -c "import pstats; p = pstats.Stats('$OUT/v1-step.prof'); p.sort_stats('tottime').print_stats(25)" \
    2>&1 | tail -32 | cut -c1-160
}

# V1 and S1 after the background fill became its own read class (it was demand reads
# that every layer start cancelled): full against naive with every expert in RAM (the
# bench waits for the load's fill), a profile of V1, S1 against naive, the int4 host
# kernels at the streaming pool size, and the streaming GPU tests.
gpu17() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_streaming.py tests/models/test_streamed_step.py \
    tests/models/test_vram_cache.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -8
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  B="flint bench $DATA/q30.ftw -p 0 -n 64 --tg-random"
  echo "== V1 full,naive"
  timeout 200 $B -r 2 --mode full,naive --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw|waited|decode"
  echo "== V1 profile"
  timeout 90 python3 -m cProfile -o "$OUT/v1-filled.prof" -m flint bench "$DATA/q30.ftw" -p 0 -n 64 \
    --tg-random -r 1 --mode full --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw|waited"
  python3 -c "import pstats; p = pstats.Stats('$OUT/v1-filled.prof'); p.sort_stats('tottime').print_stats(28)" \
    2>&1 | tail -34 | cut -c1-150
  echo "== S1 full,naive"
  timeout 150 $B -r 1 --mode full,naive --ram-budget 6 --vram-budget 4 2>&1 | grep -E "q30.ftw"
  timeout 40 python3 benches/cpu_kernels.py --threads 14,16 --calls 10 --schemes int4 --x-bf16
}

# Why V1's fused host call is slower than the isolated one: the isolated call with gaps
# between calls (the pool parks in between) and from page-locked memory, then V1 with
# the arena unpinned and at fewer threads (the bench's "CPU ms/tok" column).
gpu18() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  K="python3 benches/cpu_kernels.py --threads 14 --calls 24 --schemes int4 --x-bf16"
  timeout 60 $K --gap-ms 0,0.5,2,5
  timeout 60 $K --gap-ms 0,2 --pin
  B="flint bench $DATA/q30.ftw -p 0 -n 32 --tg-random -r 1 --mode full --ram-budget 20 --vram-budget 4"
  for pin in 1 0; do
    echo "== FLINT_PIN_RAM=$pin"; FLINT_PIN_RAM=$pin timeout 80 $B 2>&1 | grep -E "q30.ftw|CPU ms"
  done
  for t in 4 8; do echo "== -t $t"; timeout 80 $B -t $t 2>&1 | grep -E "q30.ftw"; done
}

# The fused host call in V1's decode against the same calls replayed (benches/v1_host_call.py).
gpu19() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  H="python3 benches/v1_host_call.py $DATA/q30.ftw --tokens 16"
  echo "== default"; timeout 150 $H 2>&1 | tail -4
  echo "== torch threads 1"; timeout 150 $H --torch-threads 1 2>&1 | tail -3
  echo "== FLINT_PIN_RAM=0"; FLINT_PIN_RAM=0 timeout 150 $H 2>&1 | tail -3
}

# After the arena became its own huge-page mapping: the host call in and out of V1's
# decode, then V1 full,naive and S1 full with the CPU ms/tok column.
gpu20() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 150 python3 benches/v1_host_call.py $DATA/q30.ftw --tokens 16 2>&1 | tail -6
  B="flint bench $DATA/q30.ftw -p 0 -n 64 --tg-random -r 1"
  echo "== V1"; timeout 170 $B --mode full,naive --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw|waited|CPU ms|Error"
  echo "== S1"; timeout 100 $B --mode full --ram-budget 6 --vram-budget 4 2>&1 | grep -E "q30.ftw|Error"
}

# With torch's OpenMP threads waiting passively (flint's default from now on): the host
# call in V1's decode, then V1 full,naive and S1 full.
gpu21() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  OMP_WAIT_POLICY=PASSIVE timeout 100 python3 benches/v1_host_call.py $DATA/q30.ftw --tokens 16 2>&1 \
    | grep -E "in decode|flushed before"
  B="flint bench $DATA/q30.ftw -p 0 -n 64 --tg-random -r 1"
  echo "== V1"; timeout 150 $B --mode full,naive --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw|Error"
  echo "== S1"; timeout 90 $B --mode full --ram-budget 6 --vram-budget 4 2>&1 | grep -E "q30.ftw \||Error"
}

# V1 once lookahead stops predicting when every expert is in RAM.
gpu22() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 130 flint bench $DATA/q30.ftw -p 0 -n 64 --tg-random -r 1 --mode full,naive --ram-budget 20 \
    --vram-budget 4 2>&1 | grep -E "q30.ftw \||Error"
}

# Next session's first run (prepared, not run yet): S1 full,naive over 128 tokens against
# the Belady bound (issue 9's S1 target), V1 with GOMP_SPINCOUNT=1000 against the PASSIVE
# default, V1 and S1 with --graphs off (issue 10's gain over eager), and flint tune's GPU
# path with a longer limit (split it over two calls if the 600 s limit bites).
gpu23() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  B="flint bench $DATA/q30.ftw -p 0 -n 128 --tg-random -r 1"
  echo "== S1"; timeout 200 $B --mode full,naive --ram-budget 6 --vram-budget 4 2>&1 | grep -E "model \||q30.ftw \||disk|Error"
  echo "== tune"; timeout 150 flint tune $DATA/q30.ftw --ram-budget 20 2>&1 | tail -12
  for env in "OMP_WAIT_POLICY=PASSIVE" "GOMP_SPINCOUNT=1000"; do
    echo "== V1 $env"; env $env timeout 80 flint bench $DATA/q30.ftw -p 0 -n 64 --tg-random -r 1 \
      --mode full --ram-budget 20 --vram-budget 4 2>&1 | grep -E "model \||q30.ftw \||Error"
  done
  for b in "--ram-budget 20" "--ram-budget 6"; do  # issue 10: V1/S1 gains over the eager path
    echo "== $b --graphs off"; timeout 80 flint bench $DATA/q30.ftw -p 0 -n 64 --tg-random -r 1 \
      --mode full $b --vram-budget 4 --graphs off 2>&1 | grep -E "model \||q30.ftw \||Error"
  done
}

# Seventh session: the grouped slab kernels for prompts (GPU tests; R0 pp512; P8 with
# slab kernels (graphs auto) against the per-expert path (graphs off); V1 decode).
gpu24() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 170 python3 -m pytest tests/models/test_grouped.py tests/models/test_gpu_waves.py \
    tests/models/test_graphs.py tests/models/test_vram_cache.py tests/models/test_streamed_step.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -25
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== R0"; timeout 80 flint bench "$DATA/q30.ftw" -p 512 -n 32 -r 2 --mode resident 2>&1 | grep -E "model \||q30.ftw \||Error"
  for g in auto off; do
    echo "== P8 --graphs $g"; timeout 110 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 1 --mode full --warm \
      --ram-budget 20 --vram-budget 4 --graphs $g 2>&1 | grep -E "model \||q30.ftw \||Error|Traceback|rror:"
  done
  echo "== V1"; timeout 70 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 1 --mode full \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "model \||q30.ftw \||Error"
}

# Seventh session, second run: the grouped kernels by tile shape, R0's prompt, P8 and V1
# after the per-layer pair plan and the slot kernels for decode.
gpu25() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 60 python3 benches/grouped_kernel.py --tokens 512,8192
  timeout 130 python3 -m pytest tests/models/test_grouped.py tests/models/test_gpu_waves.py \
    tests/models/test_vram_cache.py tests/models/test_streamed_step.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -15
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== R0"; timeout 150 flint bench "$DATA/q30.ftw" -p 512 -n 0 -r 2 --mode resident 2>&1 | tail -4
  echo "== P8 --graphs auto"; timeout 110 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 1 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "model \||q30.ftw \||Error|Traceback|rror:"
  echo "== V1"; timeout 70 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 1 --mode full \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "model \||q30.ftw \||Error"
}

# Seventh session, third run: V1 and P8 with the slab kernels against torch's per-expert
# kernels (FLINT_SLAB_KERNELS=0) in one run; R0's prompt warm.
gpu26() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for sk in 1 0 1; do
    echo "== V1 FLINT_SLAB_KERNELS=$sk"; FLINT_SLAB_KERNELS=$sk timeout 60 flint bench "$DATA/q30.ftw" -p 0 -n 64 \
      --tg-random -r 1 --mode full --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||Error"
  done
  echo "== P8 FLINT_SLAB_KERNELS=0"; FLINT_SLAB_KERNELS=0 timeout 100 flint bench "$DATA/q30.ftw" -p 8192 -n 0 \
    -r 1 --mode full --warm --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||Error|rror:"
  echo "== R0"; timeout 120 flint bench "$DATA/q30.ftw" -p 512 -n 0 -r 3 --warm --mode resident 2>&1 | grep -E "q30.ftw \||Error"
}

# Seventh session, fourth run: where P8's prompt time goes (cProfile of the main thread).
gpu27() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 150 python3 -m cProfile -o "$OUT/p8.prof" "$(command -v flint)" bench "$DATA/q30.ftw" -p 8192 -n 0 \
    -r 1 --mode full --warm --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||Error|rror:"
  python3 -c "import pstats; s = pstats.Stats('$OUT/p8.prof'); s.sort_stats('tottime').print_stats(28); s.sort_stats('cumulative').print_stats(40)" \
    2>&1 | grep -E "^ +[0-9]" | cut -c1-150 | head -70
}

# Seventh session, last run: P8 and V1 with the slab kernels really on (flint bench's
# streamed modes had built their backend without them until the fix before this run).
gpu28() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== P8 slab"; timeout 60 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 1 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||Error|rror:"
  echo "== V1 slab"; timeout 55 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 1 --mode full \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||Error"
}

# Prepared for the next session (not run yet): the review fixes' CUDA paths under the GPU
# tests, V1 with the slab kernels against torch's interleaved (after the alignment fix),
# S1's stall with the wall-time count against its Belady bound, and where P8's 1.4 s go
# now (cProfile of the main thread with the slab kernels).
gpu29() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_grouped.py tests/models/test_gpu_waves.py \
    tests/models/test_vram_cache.py tests/models/test_elastic_vram.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -15
  echo "== attention"; timeout 60 python3 benches/attention_mask.py --device cuda --heads 32 \
    --kv-heads 4 --dim 128 --shapes 512x512,2048x2048,2048x8192,8192x8192 2>&1 | tail -6
  echo "== cpu int4"; timeout 60 python3 benches/cpu_kernels.py --threads 1,4,8,16 --calls 10 \
    --schemes int4 --x-bf16 2>&1 | grep -E "^\|" | tail -6
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for sk in 1 0; do
    echo "== V1 FLINT_SLAB_KERNELS=$sk"; FLINT_SLAB_KERNELS=$sk timeout 60 flint bench "$DATA/q30.ftw" -p 0 -n 64 \
      --tg-random -r 1 --mode full --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||GPU experts|Error"
  done
  echo "== S1"; timeout 120 flint bench "$DATA/q30.ftw" -p 0 -n 128 --tg-random -r 1 --mode full,naive \
    --ram-budget 6 --vram-budget 4 2>&1 | grep -E "q30.ftw \||disk|Belady|Error"
  timeout 90 python3 -m cProfile -o "$OUT/p8.prof" "$(command -v flint)" bench "$DATA/q30.ftw" -p 8192 -n 0 \
    -r 1 --mode full --warm --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||GPU experts|Error|rror:"
  python3 -c "import pstats; s = pstats.Stats('$OUT/p8.prof'); s.sort_stats('tottime').print_stats(25)" \
    2>&1 | grep -E "^ +[0-9]" | cut -c1-150 | head -30
}

gpu30() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 200 python3 -m pytest tests/models/test_gpu.py tests/models/test_gpu_waves.py \
    tests/models/test_streamed_step.py tests/models/test_attention_mask.py \
    -q -p no:cacheprovider --tb=short -rf -m "gpu or not gpu" 2>&1 | tail -8
  echo "== attention"; timeout 60 python3 benches/attention_mask.py --device cuda --heads 32 \
    --kv-heads 4 --dim 128 --shapes 512x1024,512x4096,512x8192 2>&1 | tail -4
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== P8"; timeout 80 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 1 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||Error|rror:"
  for hs in fill cpu q fill; do
    echo "== V1 --host-split $hs"; timeout 60 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 1 \
      --mode full --ram-budget 20 --vram-budget 4 --host-split $hs 2>&1 | grep -E "q30.ftw \||Error|rror:"
  done
  echo "== S1 fill"; timeout 100 flint bench "$DATA/q30.ftw" -p 0 -n 128 --tg-random -r 1 --mode full,naive \
    --ram-budget 6 --vram-budget 4 --host-split fill 2>&1 | grep -E "q30.ftw \||Error|rror:"
}

gpu31() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 60 python3 -m pytest tests/models/test_streamed_step.py -q -p no:cacheprovider --tb=line \
    -k "general_path and mixtral or where_asked" 2>&1 | grep -E "Error|assert|passed|failed" | cut -c1-300 | head -12
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 100 python3 -m cProfile -o "$OUT/v1.prof" "$(command -v flint)" bench "$DATA/q30.ftw" -p 0 -n 64 \
    --tg-random -r 1 --mode full --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  python3 -c "import pstats; s = pstats.Stats('$OUT/v1.prof'); s.sort_stats('tottime').print_stats(45)" \
    2>&1 | grep -E "^ +[0-9]" | cut -c1-160 | head -50
}

# A/B on one box: the wheel in .device/before against the one in .device, interleaved.
gpu32() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_gpu_waves.py tests/models/test_grouped.py \
    tests/models/test_streamed_step.py tests/models/test_vram_cache.py -q -p no:cacheprovider \
    --tb=short -rf -m "gpu or not gpu" 2>&1 | tail -6
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  v1() {
    timeout 60 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 1 --mode full --ram-budget 20 \
      --vram-budget 4 "$@" 2>&1 | grep -E "q30.ftw \||rror"
  }
  for w in before after before after; do
    if [ $w = before ]; then whl=.device/before/flint-*.whl; else whl=.device/flint-*.whl; fi
    python3 -m pip install --no-deps --force-reinstall -q $whl 2>&1 | grep -v WARNING | tail -1
    echo "== V1 $w"; v1
  done
  echo "== V1 after, fill"; v1 --host-split fill
  echo "== S1 after"; timeout 100 flint bench "$DATA/q30.ftw" -p 0 -n 128 --tg-random -r 1 \
    --mode full,naive --ram-budget 6 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  echo "== P8 after"; timeout 70 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 1 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
}

gpu33() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 200 python3 -m pytest tests/models/test_gpu_waves.py tests/models/test_grouped.py \
    tests/models/test_streamed_step.py tests/models/test_vram_cache.py -q -p no:cacheprovider \
    --tb=short -rf -m "gpu or not gpu" 2>&1 | grep -E "^E |Error|passed|failed" | cut -c1-250 | tail -14
}

# Prepared for the next session's first call (not run yet; ~9.5 minutes): the GPU tests
# of the changes made after gpu33, the fused int4 kernels with and without bf16 hidden
# rows, V1 and P8 with the wheel in .device/before (06bf4e1) and then the one in
# .device on the same box (the new one also runs --host-split cpu and fill interleaved),
# and where an 8k prompt's time goes.
gpu34() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_gpu_waves.py tests/models/test_grouped.py \
    tests/models/test_streamed_step.py tests/models/test_vram_cache.py -q -p no:cacheprovider \
    --tb=short -rf -m gpu 2>&1 | tail -6
  echo "== cpu int4"; timeout 60 python3 benches/cpu_kernels.py --threads 1,16 --calls 10 \
    --schemes int4 --x-bf16 --round-hidden off,on 2>&1 | tail -4
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  v1="-p 0 -n 64 --tg-random --ram-budget 20 --vram-budget 4"
  p8="-p 8192 -n 0 -r 1 --mode full --warm --ram-budget 20 --vram-budget 4"
  python3 -m pip install --no-deps --force-reinstall -q .device/before/flint-*.whl 2>&1 | grep -v WARNING | tail -1
  echo "== V1 before"; timeout 60 flint bench "$DATA/q30.ftw" $v1 -r 1 --mode full 2>&1 | grep -E "q30.ftw \||rror"
  echo "== P8 before"; timeout 70 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  python3 -m pip install --no-deps --force-reinstall -q .device/flint-*.whl 2>&1 | grep -v WARNING | tail -1
  echo "== V1 after, cpu and fill interleaved"; timeout 170 flint bench "$DATA/q30.ftw" $v1 -r 2 \
    --mode full:cpu,full:fill 2>&1 | grep -E "q30.ftw \||rror"
  echo "== P8 after"; timeout 70 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  echo "== P8 profile"; timeout 110 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -v "^USDT\|^ERROR" | tail -32
}

# Ninth session: the prompt's wave plan from host ids (P8, a wheel either side on one
# box), where P8's host time goes (cProfile), V1 with --host-split auto beside cpu, and
# S1 with cpu against fill interleaved.
gpu35() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 120 python3 -m pytest tests/models/test_gpu_waves.py tests/models/test_streamed_step.py \
    tests/models/test_qsplit.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -8
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  p8="-p 8192 -n 0 -r 2 --mode full --warm --ram-budget 20 --vram-budget 4"
  python3 -m pip install --no-deps --force-reinstall -q .device/before/flint-*.whl 2>&1 | grep -v WARNING | tail -1
  echo "== P8 before"; timeout 80 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  python3 -m pip install --no-deps --force-reinstall -q .device/flint-*.whl 2>&1 | grep -v WARNING | tail -1
  echo "== P8 after"; timeout 80 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  echo "== P8 cProfile"; timeout 100 python3 -m cProfile -s tottime -m flint bench "$DATA/q30.ftw" \
    -p 8192 -n 0 -r 1 --mode full --warm --ram-budget 20 --vram-budget 4 2>&1 \
    | grep -E "q30.ftw \||ncalls|^ +[0-9]" | head -36
  echo "== P8 profile"; timeout 110 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -v "^USDT\|^ERROR\|warn" | tail -24
  echo "== V1 auto, cpu"; timeout 150 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 2 \
    --mode full,full:cpu --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror|outside VRAM"
  echo "== S1 cpu, fill"; timeout 120 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 1 \
    --mode full:cpu,full:fill --ram-budget 6 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
}

# Ninth session, last call: the GPU tests, P8 with the next layer copied ahead against
# FLINT_PROMPT_AHEAD=0 (off, on, off on one box), its profile, and V1/S1 at other
# budgets for the budgets plot (benches/plot_budgets.py).
gpu36() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_gpu_waves.py tests/models/test_grouped.py \
    tests/models/test_streamed_step.py tests/models/test_vram_cache.py tests/models/test_qsplit.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -12
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  p8="-p 8192 -n 0 -r 2 --mode full --warm --ram-budget 20 --vram-budget 4"
  for a in 0 1 0 1; do
    echo "== P8 FLINT_PROMPT_AHEAD=$a"
    FLINT_PROMPT_AHEAD=$a timeout 80 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  done
  echo "== P8 profile"; timeout 100 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "^\||profiled|aten::(min|max|copy_)|Synchronize"
  for rv in "20 2" "20 8" "10 4"; do
    set -- $rv
    echo "== budgets RAM $1 VRAM $2"
    timeout 70 flint bench "$DATA/q30.ftw" -p 0 -n 32 --tg-random -r 1 --mode full \
      --ram-budget "$1" --vram-budget "$2" 2>&1 | grep -E "q30.ftw \||rror"
  done
}

# Ninth session, last call: a prompt's attention in one call (FLINT_WHOLE_ATTENTION=0
# against 1, alternating on one box) and the P8 profile with it.
gpu37() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 100 python3 -m pytest tests/models/test_gpu.py tests/models/test_gpu_waves.py -k "whole or ahead or synchronises" \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -12
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  p8="-p 8192 -n 0 -r 2 --mode full --warm --ram-budget 20 --vram-budget 4"
  for w in 0 1 0 1; do
    echo "== P8 FLINT_WHOLE_ATTENTION=$w"
    FLINT_WHOLE_ATTENTION=$w timeout 75 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  done
  echo "== P8 profile"; timeout 90 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -v "^USDT\|^ERROR\|warn" | tail -24
}

# Ninth session, after the review: the changed GPU tests, then one P8 run.
gpu38() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 120 python3 -m pytest tests/models/test_gpu.py tests/models/test_gpu_waves.py \
    tests/models/test_streamed_step.py -k "whole or ahead or synchronises or filled or v1_like" \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -12
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== P8"; timeout 60 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 2 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
}

# Prepared for the tenth session's first call: every GPU test (the ninth session's last
# assertion change was not re-run), then P8 and V1 as baselines.
gpu39() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 300 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 \
    | grep -E "passed|failed|FAILED|Error" | head -20
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== P8"; timeout 80 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 2 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  echo "== V1"; timeout 120 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 2 --mode full \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror|outside VRAM"
}

# Tenth session: the grouped kernels' program shapes and int4 variants (nibble halves,
# native rounding; bf16 weights dequantized once), then where P8's GPU time goes by kernel.
# (The nibble halves, flag s, measured slower and were removed after this run: the
# bench now reads :sn as :n.)
gpu40() {
  local b8="0:64:64:4:3,0:64:64:4:3:n,0:64:64:4:3:s,0:64:64:4:3:sn,128:64:64:4:3:sn"
  b8="$b8,128:64:64:8:3:sn,128:128:64:8:3:sn,128:64:128:8:3:sn,64:128:64:4:3:sn"
  b8="$b8,128:128:64:8:4:sn,64:64:128:4:3:sn,128:128:128:8:3:sn,128:64:64:8:3:n,128:128:64:8:3:n"
  echo "== grouped 8192 + dequant"; timeout 240 python3 benches/grouped_kernel.py --tokens 8192 \
    --blocks "$b8" --dequant 2>&1 | grep -E "^\||rror" | head -40
  echo "== grouped 2048"; timeout 100 python3 benches/grouped_kernel.py --tokens 2048 \
    --blocks "0:64:64:4:3,0:64:64:4:3:sn,128:64:64:8:3:sn,64:128:64:4:3:sn,0:128:64:8:3:sn" \
    2>&1 | grep -E "^\||rror" | head -12
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== profile"; timeout 150 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 --top 30 2>&1 | grep -vE "^-|^\s*$" | head -75
}

# Tenth session: P8 with the previous wheel (before) and this one (after) in turn on one
# box (after: 128-pair programs with the GPU's rounding, one-launch rank sums, numpy
# host plans, one copy per run of adjacent RAM slots), then the profile of after.
gpu41() {
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  local p8="-p 8192 -n 0 -r 2 --mode full --warm --ram-budget 20 --vram-budget 4"
  for w in before after before after; do
    local whl=.device/flint-*.whl; [ $w = before ] && whl=.device/before/flint-*.whl
    python3 -m pip install --no-deps --force-reinstall -q $whl 2>&1 | grep -v WARNING | tail -1
    echo "== P8 $w"; timeout 75 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  done
  echo "== profile"; timeout 100 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 --top 16 2>&1 | grep -vE "^-|^\s*$|USDT|warn" | head -60
}

# Tenth session: does an asynchronous copy from the page-locked arena return at once
# (gpu41's profile: 125 us of host time per cudaMemcpyAsync)? Then every GPU test and V1.
gpu42() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== pinned copies"; timeout 60 python3 benches/pinned_copy.py --slab-mib 2.53125 --slots 128 \
    --rounds 1 2>&1 | tail -6
  echo "== GPU tests"; timeout 300 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf -m gpu \
    --ignore=tests/server --ignore=tests/chat 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== V1"; timeout 110 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 2 --mode full \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror|outside VRAM"
}

# Tenth session, last call: every GPU test (fused prompt norms on), then P8 with
# FLINT_FUSED_NORM=0/1 alternating, the profile with them, and a 2k-token prompt.
gpu43() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 200 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf -m gpu \
    --ignore=tests/server --ignore=tests/chat 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  local p8="-p 8192 -n 0 -r 2 --mode full --warm --ram-budget 20 --vram-budget 4"
  for n in 0 1 0 1; do
    echo "== P8 FLINT_FUSED_NORM=$n"
    FLINT_FUSED_NORM=$n timeout 75 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  done
  echo "== P2k"; timeout 75 flint bench "$DATA/q30.ftw" -p 2048 -n 0 -r 3 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  echo "== profile"; timeout 100 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 --top 16 2>&1 | grep -vE "^-|^\s*$|USDT|warn" | head -44
}

# Tenth session: do back-to-back asynchronous copies from the page-locked arena block
# the host once a layer's worth is queued behind other work?
gpu44() {
  timeout 90 python3 benches/pinned_copy.py --slab-mib 2.53125 --slots 128 --rounds 1 2>&1 | tail -7
}

# Tenth session, after the review: every GPU test (norms fused for every CUDA call,
# the native rounding test), then one P8 run.
gpu45() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 120 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf -m gpu \
    --ignore=tests/server --ignore=tests/chat 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  echo "== P8"; timeout 60 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 2 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
}

# Prepared for the eleventh session's first call: every GPU test, the grouped kernels
# with the layer dequantized first by _tile (FLINT_PROMPT_DEQUANT=1) against in place,
# the down kernel's own shapes, then P8 with the route off and on alternating.
gpu46() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 150 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf -m gpu \
    --ignore=tests/server --ignore=tests/chat 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
  echo "== grouped 8192"; timeout 150 python3 benches/grouped_kernel.py --tokens 8192 --dequant \
    --blocks "0:64:64:4:3:n,128:64:64:8:3:n,128:128:64:8:3:n,128:128:64:8:4:n" 2>&1 \
    | grep -E "^\||rror" | head -24
  local d8="128:64:64:8:3:n,128:64:64:8:3:n/128:64:8:3,128:64:64:8:3:n/64:128:4:3"
  d8="$d8,128:64:64:8:3:n/128:128:8:3,128:64:64:8:3:n/256:64:8:3,128:64:64:8:3:n/64:64:4:4"
  echo "== down shapes 8192"; timeout 100 python3 benches/grouped_kernel.py --tokens 8192 \
    --blocks "$d8" 2>&1 | grep -E "^\||rror" | head -10
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  local p8="-p 8192 -n 0 -r 2 --mode full --warm --ram-budget 20 --vram-budget 4"
  for d in 0 1 0 1; do
    echo "== P8 FLINT_PROMPT_DEQUANT=$d"
    FLINT_PROMPT_DEQUANT=$d timeout 75 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  done
}

# Eleventh session, first call after gpu46: the dequantize-first route's threshold (2k,
# 4k, 6k tokens), attention by SDPA backend, P8 with the route at its new default
# (from 4,096 tokens, bf16 tiles of 128 x 128) against off, P8 resident (no copies:
# the compute's own floor), and the host's time under cProfile (file in $OUT).
gpu47() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 150 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf -m gpu \
    --ignore=tests/server --ignore=tests/chat 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
  echo "== grouped 2048,4096,6144"; timeout 150 python3 benches/grouped_kernel.py --tokens 2048,4096,6144 \
    --dequant --blocks "0:64:64:4:3:n,128:64:64:8:3:n,128:128:64:8:3:n" 2>&1 \
    | grep -E "^\||rror" | grep -v "cuBLAS\|3 launches" | head -40
  echo "== attention"; timeout 60 python3 benches/attention_backends.py --tokens 2048,8192 2>&1 | head -20
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  local p8="-p 8192 -n 0 -r 2 --mode full --warm --ram-budget 20 --vram-budget 4"
  for d in 0 auto 0 auto; do
    echo "== P8 FLINT_PROMPT_DEQUANT=$d"
    FLINT_PROMPT_DEQUANT=$d timeout 75 flint bench "$DATA/q30.ftw" $p8 2>&1 | grep -E "q30.ftw \||rror"
  done
  echo "== P8 resident"; timeout 90 flint bench "$DATA/q30.ftw" -p 8192 -n 0 -r 2 --mode resident --warm \
    2>&1 | grep -E "q30.ftw \||rror"
  echo "== P8 cProfile"; timeout 90 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 --top 45 --python > "$OUT/p8_cprofile.txt" 2>&1
  grep -E "prefill" "$OUT/p8_cprofile.txt"
  grep -A30 "Ordered by: internal" "$OUT/p8_cprofile.txt" | cut -c1-150
}

# Shared by the eleventh session's calls: every GPU test (the box lacks the server's and
# chat's dependencies); P8 with the wheel in .device/before and the one in .device in turn
# (two pairs; the one in .device stays installed); P8's host under cProfile (top N rows).
gpu_tests() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 170 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf -m gpu \
    --ignore=tests/server --ignore=tests/chat 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
}

# The 30B-A3B geometry at int4 synthesised as $DATA/NAME.ftw (more synth flags after
# NAME, e.g. --dense-quant int8 for q30d8).
synth30() {
  local name=$1
  shift
  flint synth --geometry qwen3-30b-a3b --quant int4 "$@" -o "$DATA/$name.ftw" | tail -1
}

# R0 on $DATA/NAME.ftw: graph_decode's lines the docs keep.
r0() {
  timeout 100 python3 benches/graph_decode.py "$DATA/$1.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -E "tg_tok|_sd|roofline|bytes_per|copy_gb|replay_us|greedy_us|Error"
}

P8_FLAGS="-p 8192 -n 0 -r 2 --mode full --warm --ram-budget 20 --vram-budget 4"
p8_ab() {
  q30
  for w in before after before after; do
    use_wheel $w
    echo "== P8 $w"; timeout 75 flint bench "$DATA/q30.ftw" $P8_FLAGS 2>&1 | grep -E "q30.ftw \||rror"
  done
}

p8_cprofile() {
  echo "== P8 cProfile"; timeout 90 python3 benches/prompt_profile.py "$DATA/q30.ftw" --tokens 8192 \
    --ram-budget 20 --vram-budget 4 --top 45 --python > "$OUT/p8_cprofile.txt" 2>&1
  grep -E "prefill" "$OUT/p8_cprofile.txt"
  grep -A"$1" "Ordered by: internal" "$OUT/p8_cprofile.txt" | cut -c1-150
}

# Eleventh session, second call: a long prompt's early launches (its VRAM and copied-ahead
# experts queued before the wave plan, the next layer's copies right after) and cuDNN's
# attention first: P8 with the gpu47 wheel (.device/before) and this one in turn, then
# this one without cuDNN's attention; attention by backend at 8k; cProfile again.
gpu48() {
  gpu_tests
  echo "== attention"; timeout 60 python3 benches/attention_backends.py --tokens 8192 2>&1 | grep "^|"
  p8_ab
  echo "== P8 after, FLINT_CUDNN_ATTENTION=0"
  FLINT_CUDNN_ATTENTION=0 timeout 75 flint bench "$DATA/q30.ftw" $P8_FLAGS 2>&1 | grep -E "q30.ftw \||rror"
  p8_cprofile 25
}

# Eleventh session, last call: a prompt's counts, first and last selections made on the
# GPU and read back with its ids (routing_summary), its VRAM and copied-ahead experts in
# one dequantized launch (grouped_over). P8 with the gpu48 wheel (.device/before) and
# this one in turn; a 2k prompt, V1 and the host under cProfile with this one.
gpu49() {
  gpu_tests
  p8_ab
  echo "== P2k"; timeout 75 flint bench "$DATA/q30.ftw" -p 2048 -n 0 -r 3 --mode full --warm \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  echo "== V1"; timeout 90 flint bench "$DATA/q30.ftw" -p 0 -n 64 --tg-random -r 2 --mode full \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  p8_cprofile 16
}

# Eleventh session, V1 against the tenth session's code: no Rust changed this session, so
# the tenth session's Python package (commit ffbddf9, `git archive ffbddf9 python/flint`
# unpacked in .device/old) over the installed wheel's gives that version. Alternating.
gpu50() {
  local site; site=$(python3 -c "import flint, os; print(os.path.dirname(flint.__file__))")
  cp -r "$site" /tmp/flint-new
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for w in before after before after; do
    if [ $w = before ]; then cp -r .device/old/python/flint/. "$site"/; else cp -r /tmp/flint-new/. "$site"/; fi
    echo "== V1 $w"; timeout 45 flint bench "$DATA/q30.ftw" -p 0 -n 32 --tg-random -r 1 --mode full \
      --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  done
}

# Prepared for the next session's first call: every GPU test on the review's mends
# (cf9e6a4, not yet run on a GPU), P8 with the gpu49 wheel (8ddd7bf, .device/before)
# and this one in turn, and issue 15's int4 fused call by thread count: the int4
# kernel's software prefetch off (FLINT_CPU_PREFETCH=0) and at its default (4 KiB
# ahead) alternating, then top-k 32 (four times the bytes per call: if the 16-thread
# ratio rises with it, fixed per-call costs, not the kernels, hold it at 0.33-0.41).
gpu51() {
  gpu_tests
  p8_ab
  for run in 0:8 4096:8 0:8 4096:8 4096:32; do
    echo "== cpu int4, FLINT_CPU_PREFETCH=${run%:*}, top-k ${run#*:}"
    FLINT_CPU_PREFETCH=${run%:*} timeout 90 python3 benches/cpu_kernels.py --threads 1,4,8,16 \
      --calls 20 --schemes int4 --x-bf16 --top-k ${run#*:} 2>&1 | grep -E '"scheme"|rror' \
      | cut -d, -f3,8,10,11
  done
}

# Twelfth session. The CPU kernels' own worker threads (crew.rs, in place of rayon's scope
# that waited for every worker's wake-up on each call): the machine's CPU; every GPU
# test (the eleventh session's mends have not run on a GPU); issue 15's fused call with
# the wheel in .device/before (1d4f3a0, rayon) and this one in turn, int4 at 1, 8 and 16
# threads back to back and with 2 ms between calls (as a decode step's layers), two
# rounds; then bf16 and int8 with this one.
use_wheel() {
  local whl=.device/flint-*.whl; [ "$1" = before ] && whl=.device/before/flint-*.whl
  python3 -m pip install --no-deps --force-reinstall -q $whl 2>&1 | grep -v WARNING | tail -1
}

q30() {  # the 30B-A3B geometry at int4, synthesised once per box
  [ -f "$DATA/q30.ftw" ] || flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
}

# V1 with the wheel in .device/before and the one in .device in turn, $1 pairs (the one
# in .device stays installed).
V1_FLAGS="-p 0 -n 32 --tg-random -r 2 --mode full --ram-budget 20 --vram-budget 4"
v1_ab() {
  q30
  for _ in $(seq "$1"); do
    for w in before after; do
      use_wheel $w
      echo "== V1 $w"; timeout 100 flint bench "$DATA/q30.ftw" $V1_FLAGS 2>&1 | grep -E "q30.ftw \||rror"
    done
  done
}

cpu_fused() {  # label, then cpu_kernels.py's flags
  local label=$1; shift
  echo "== cpu $label $*"
  timeout 120 python3 benches/cpu_kernels.py --x-bf16 "$@" 2>&1 | grep -E '"scheme"|rror' \
    | sed -E 's/"(isa|x_bf16|round_hidden|pinned|date)": [^,}]*,? ?//g; s/, \}/}/'
}

gpu52() {
  lscpu | grep -E "Model name|Thread\(s\)|Core\(s\)|Socket|NUMA node|L3|MHz"
  gpu_tests
  for w in before after before after; do
    use_wheel $w
    cpu_fused $w --threads 1,8,16 --calls 30 --schemes int4 --gap-ms 0,2
  done
  cpu_fused after --threads 16 --calls 30 --schemes bf16,int8 --gap-ms 0,2
}

# Twelfth session, second call: the fused call's timeline at 16 threads (when each thread
# starts its first task, when down starts; examples/call_timeline.rs, carried built), int4
# down's input in f32 and in bf16 (round_hidden, as a bf16 model's CPU side on CUDA),
# back to back and 2 ms apart, and at top-k 32; the bench with round_hidden on for each
# scheme; V1 with the wheel in .device/before (rayon) and this one in turn.
gpu53() {
  for args in "16 int4 8 0,2000 200 off" "16 int4 8 0,2000 200 on" "16 int4 32 0 100 on" \
      "8 int4 8 0 200 on" "16 bf16,int8 8 0,2000 200 on"; do
    timeout 60 .device/call_timeline $args
  done
  cpu_fused after --threads 1,16 --calls 30 --schemes int4,int8,bf16 --round-hidden on
  v1_ab 2
}

# Twelfth session, third call: every GPU test with this wheel (the CPU kernels' crew and
# rows kernels); the call's timeline at 16 threads with the rayon build of ab43e3a
# (.device/before/call_timeline) and this one in turn; issue 15's figure through Python
# (round_hidden on, as the CPU side of a bf16 model on CUDA) with both wheels; V1 with
# both wheels.
timeline() {  # binary, then call_timeline's arguments
  local bin=$1; shift
  timeout 60 "$bin" "$@" | sed -E 's/ \(.*first task/, first task/; s/, 2nd thread [0-9]+//'
}

gpu54() {
  gpu_tests
  for w in before after before after; do
    local bin=.device/call_timeline; [ $w = before ] && bin=.device/before/call_timeline
    echo "== timeline $w"
    timeline $bin 16 int4 8 0,2000 200 on
    timeline $bin 16 bf16,int8 8 0 200 on
  done
  timeline .device/call_timeline 16 int4 8 0 200 off
  timeline .device/call_timeline 16 int4 32 0 100 on
  for w in before after; do
    use_wheel $w
    cpu_fused $w --threads 1,16 --calls 30 --schemes int4,int8,bf16 --round-hidden on
  done
  v1_ab 2
}

# Twelfth session, last call: the int4 call's tasks per thread (FLINT_CPU_TASKS, default
# 8) and the crew's spin window (FLINT_CPU_SPIN_US=0: park at once) at 16 threads, two
# rounds each; V1 with the rayon wheel (.device/before) and this one in turn, twice.
gpu55() {
  for round in 1 2; do
    for t in 2 4 8 16; do
      echo "== tasks $t"; FLINT_CPU_TASKS=$t timeline .device/call_timeline 16 int4,int8 8 0 200 on
    done
    for s in 0 2000; do
      echo "== spin $s us"; FLINT_CPU_SPIN_US=$s timeline .device/call_timeline 16 int4 8 0,2000 200 on
    done
  done
  v1_ab 2
}

# Twelfth session, after the review: every GPU test with the final wheel (a worker's
# panic raised again in the caller).
gpu56() {
  gpu_tests
}

# Prepared for the next session's first call: P8 with this wheel (the eleventh session's
# mends have not been timed on P8: gpu51's P8 did not run), V1 with the rayon wheel of
# 1d4f3a0 (.device/before) and this one in turn, three pairs, and issue 15's figure with
# this one (round_hidden on, bf16 hidden states, 1 and 16 threads).
gpu57() {  # the thirteenth session: down opened expert by expert (before = edeb371)
  for w in before after before after; do
    local bin=.device/call_timeline; [ $w = before ] && bin=.device/before/call_timeline
    echo "== timeline $w"; timeline $bin 16 int4,int8,bf16 8 0 200 on
  done
  for w in before after; do
    use_wheel $w
    cpu_fused $w --threads 16 --calls 30 --schemes int4,int8,bf16 --round-hidden on
    cpu_fused $w-core --core --threads 16 --calls 30 --schemes int4,int8,bf16 --round-hidden on
  done
  gpu_tests
  v1_ab 1
}

gpu58() {  # the thirteenth session: issue 15's figure, tasks per thread and prefetch swept
  cpu_fused after --threads 1,16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  cpu_fused after-core --core --threads 16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  for n in 2 4 8 16; do
    echo "== tasks per thread $n"
    FLINT_CPU_TASKS=$n timeline .device/call_timeline 16 int4,int8,bf16 8 0 200 on
  done
  for d in 0 4096 8192; do
    echo "== int4 prefetch $d"; FLINT_CPU_PREFETCH=$d timeline .device/call_timeline 16 int4 8 0 200 on
  done
  echo "== gap 2 ms"; timeline .device/call_timeline 16 int4,int8,bf16 8 2000 200 on
  v1_ab 2
  echo "== P8"; timeout 75 flint bench "$DATA/q30.ftw" $P8_FLAGS 2>&1 | grep -E "q30.ftw \||rror"
}

gpu59() {  # the thirteenth session: prefetch in the whole-row kernels (int8, bf16)
  for d in 0 1024 2048 4096 8192; do
    echo "== row prefetch $d"; FLINT_CPU_ROW_PREFETCH=$d timeline .device/call_timeline 16 int8,bf16 8 0 200 on
  done
  for d in 0 2048 4096; do
    echo "== row prefetch $d, 1 thread"; FLINT_CPU_ROW_PREFETCH=$d timeline .device/call_timeline 1 int8,bf16 8 0 50 on
  done
  for d in 0 4096 0 4096; do
    FLINT_CPU_ROW_PREFETCH=$d cpu_fused "row-prefetch-$d" --threads 16 --calls 40 --schemes int8,bf16 --round-hidden on
  done
}

gpu60() {  # the thirteenth session: prefetch in the int8 rows kernel
  for r in 1 2; do
    for d in 0 1024 2048 4096 8192; do
      echo "== int8 prefetch $d"; FLINT_CPU_I8_PREFETCH=$d timeline .device/call_timeline 16 int8 8 0 200 on
    done
  done
  for d in 0 2048 4096; do
    echo "== int8 prefetch $d, 1 thread"; FLINT_CPU_I8_PREFETCH=$d timeline .device/call_timeline 1 int8 8 0 50 on
  done
  for d in 0 4096 0 4096; do
    FLINT_CPU_I8_PREFETCH=$d cpu_fused "i8-prefetch-$d" --threads 16 --calls 40 --schemes int8 --round-hidden on
  done
}

gpu61() {  # the thirteenth session's last call: GPU tests, issue 15's figure, V1, V1's profile
  gpu_tests
  cpu_fused final --threads 1,16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  cpu_fused final-core --core --threads 16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  echo "== timeline"; timeline .device/call_timeline 16 int4,int8,bf16 8 0,2000 200 on
  v1_ab 1
  echo "== V1 cProfile"
  timeout 100 python3 -m cProfile -o "$OUT/v1.prof" "$(command -v flint)" bench "$DATA/q30.ftw" -p 0 -n 32 \
    --tg-random -r 1 --mode full --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  python3 -c "import pstats; s = pstats.Stats('$OUT/v1.prof'); s.sort_stats('tottime').print_stats(40)" \
    2>&1 | grep -E "^ +[0-9]" | cut -c1-160 | head -42 > "$OUT/v1_prof.txt"
  python3 -c "import pstats; s = pstats.Stats('$OUT/v1.prof'); s.sort_stats('cumtime').print_stats(40)" \
    2>&1 | grep -E "^ +[0-9]" | cut -c1-160 | head -42 >> "$OUT/v1_prof.txt"
}

gpu62() {  # the thirteenth session: issue 15's figure against the kernels' own plain read
  cpu_fused final --threads 1,16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  cpu_fused final-core --core --threads 16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  cpu_fused final-2 --threads 16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
}

gpu63() {  # the thirteenth session's review mends: GPU tests, the call once more
  gpu_tests
  echo "== timeline"; timeline .device/call_timeline 16 int4,int8,bf16 8 0 200 on
}

gpu64() {  # prepared for the next session: issue 15's figure three times, tasks per thread
  # twice, V1 twice (carry .device/flint-*.whl and .device/call_timeline of one commit)
  for r in 1 2 3; do
    cpu_fused "round-$r" --threads 1,16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  done
  for r in 1 2; do
    for n in 2 4 8; do
      echo "== tasks per thread $n, round $r"
      FLINT_CPU_TASKS=$n timeline .device/call_timeline 16 int4,int8,bf16 8 0 200 on
    done
  done
  q30
  for r in 1 2; do
    echo "== V1"; timeout 100 flint bench "$DATA/q30.ftw" $V1_FLAGS 2>&1 | grep -E "q30.ftw \||rror"
  done
}

gpu65() {  # issue 15: the Xeon's topology and features, the kernels' compute ceiling (one
  # thread from L2: dot_speed), and the layer call with its experts in the caches
  # (experts = top-k: the same 8 every call) against 64 and 256 experts
  lscpu | grep -E "Model name|Thread\(s\)|Core\(s\)|Socket|NUMA node\(|L2|L3|MHz"
  grep -o -w 'amx_[a-z0-9]*\|avx512_vnni\|avx512_bf16\|avx512_fp16\|avx512vbmi2\|avx512_vbmi\|hypervisor' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  for c in 0 1 2 8 15; do echo "cpu$c core $(cat /sys/devices/system/cpu/cpu$c/topology/core_id) siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list)"; done
  echo "== dot_speed"; timeout 60 .device/dot_speed 64 2048 400 | grep -v "four tokens"
  for r in 1 2; do
    for n in 8 64 256; do
      echo "== timeline 16 threads, $n experts, round $r"
      timeline .device/call_timeline 16 int4,int8,bf16 8 0 200 on 2048 768 bf16 $n
    done
  done
  for t in 1 4 8; do
    echo "== timeline $t threads, 8 experts"
    timeline .device/call_timeline $t int4,int8,bf16 8 0 50 on 2048 768 bf16 8
  done
  cpu_fused figure --threads 1,16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  cpu_fused core --threads 16 --calls 40 --schemes int4,int8,bf16 --round-hidden on --core
}

gpu66() {  # issue 15: rows computed at once (FLINT_CPU_ROWS), hot and from memory
  for r in 1 2; do
    for rows in 1 2 4; do
      for n in 8 256; do
        echo "== rows $rows, 16 threads, $n experts, round $r"
        FLINT_CPU_ROWS=$rows timeline .device/call_timeline 16 int4,int8,bf16 8 0 200 on 2048 768 bf16 $n
      done
    done
  done
  for rows in 1 2 4; do
    echo "== rows $rows, 1 thread, 8 experts"
    FLINT_CPU_ROWS=$rows timeline .device/call_timeline 1 int4,int8,bf16 8 0 40 on 2048 768 bf16 8
  done
  for rows in 1 2 4; do
    FLINT_CPU_ROWS=$rows cpu_fused "rows-$rows" --threads 16 --calls 40 --schemes int4,int8 --round-hidden on
  done
}

gpu67() {  # issue 15: compute per core with every core busy, scaling by threads, tasks
  # per thread, the figure with four rows at once; then the GPU tests
  for t in 1 8 16; do
    for rows in 1 4; do echo "== dot_speed rows $rows"; FLINT_CPU_ROWS=$rows timeout 60 .device/dot_speed 64 2048 400 $t | grep -v "^x at"; done
  done
  for t in 1 2 4 8 12 16; do
    echo "== timeline $t threads, 8 experts"
    timeline .device/call_timeline $t int4,int8 8 0 100 on 2048 768 bf16 8
  done
  for n in 2 4 8 16; do
    echo "== tasks per thread $n, 256 experts"
    FLINT_CPU_TASKS=$n timeline .device/call_timeline 16 int4,int8 8 0 200 on 2048 768 bf16 256
  done
  cpu_fused figure --threads 1,16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  cpu_fused core --threads 16 --calls 40 --schemes int4,int8,bf16 --round-hidden on --core
  gpu_tests
}

gpu68() {  # issue 15: the figure with four rows at once (the default on Intel) and one
  # at a time, alternating, on one box
  for r in 1 2; do
    for rows in 4 1; do
      FLINT_CPU_ROWS=$rows cpu_fused "rows-$rows-round-$r" --threads 1,16 --calls 40 --schemes int4,int8 --round-hidden on
      FLINT_CPU_ROWS=$rows cpu_fused "rows-$rows-round-$r" --threads 16 --calls 40 --schemes int4,int8 --round-hidden on --core
    done
  done
}

gpu69() {  # issue 15: the clock and AVX-512 FMA rate per core with 1..16 cores busy
  # (a lower clock under load, or vCPUs sharing cores), the rows kernels on 1 and 16
  timeout 200 .device/core_probe 1,2,4,8,12,16 200000000  # (its clock then: adds, see gpu70)
  for t in 1 16; do FLINT_CPU_ROWS=4 timeout 60 .device/dot_speed 64 2048 400 $t | grep -v "^x at"; done
}

gpu70() {  # issue 15: the clock under load and the rate of each kind of instruction
  # the int4 kernels use, 1 and 16 cores busy
  timeout 200 .device/core_probe 1,16 200000000
}

gpu71() {  # issue 15: the int4 step's chain of BF16 dot products (FLINT_CPU_I4_CHAIN, an
  # experiment's setting, removed after: see docs/benchmarks.md, "Fourteenth session")
  for r in 1 2; do
    for chain in 4 2 1; do
      for rows in 1 4; do
        for t in 1 16; do
          echo "== chain $chain rows $rows threads $t: $(FLINT_CPU_I4_CHAIN=$chain FLINT_CPU_ROWS=$rows timeout 60 .device/dot_speed 64 2048 400 $t | grep Int4 | sed 's/.*per thread //')"
        done
      done
    done
  done
  for chain in 4 2 1 4 2 1; do
    for n in 8 256; do
      echo "== chain $chain, 16 threads, $n experts"
      FLINT_CPU_I4_CHAIN=$chain timeline .device/call_timeline 16 int4 8 0 200 on 2048 768 bf16 $n
    done
  done
}

gpu72() {  # issue 15: int4 through the lanes kernel (FMAs) against the AVX-512 BF16 one
  for r in 1 2; do
    for k in bf16 lanes; do
      for t in 1 16; do
        echo "== int4 $k, dot_speed $t threads: $(FLINT_CPU_INT4=$k timeout 60 .device/dot_speed 64 2048 400 $t | grep Int4 | sed 's/.*per thread //')"
      done
      for n in 8 256; do
        echo "== int4 $k, 16 threads, $n experts"
        FLINT_CPU_INT4=$k timeline .device/call_timeline 16 int4 8 0 200 on 2048 768 bf16 $n
      done
      echo "== int4 $k, 1 thread, 8 experts"
      FLINT_CPU_INT4=$k timeline .device/call_timeline 1 int4 8 0 40 on 2048 768 bf16 8
    done
  done
  for r in 1 2; do
    for k in lanes bf16; do
      FLINT_CPU_INT4=$k cpu_fused "int4-$k-round-$r" --threads 1,16 --calls 40 --schemes int4 --round-hidden on
      FLINT_CPU_INT4=$k cpu_fused "int4-$k-round-$r" --threads 16 --calls 40 --schemes int4 --round-hidden on --core
    done
  done
}

gpu73() {  # the session's final wheel: GPU tests, issue 15's figure, V1 against the
  # thirteenth session's last wheel (ac79ba7, in .device/before)
  gpu_tests
  cpu_fused figure --threads 1,16 --calls 40 --schemes int4,int8,bf16 --round-hidden on
  cpu_fused core --threads 16 --calls 40 --schemes int4,int8,bf16 --round-hidden on --core
  v1_ab 2
}

gpu74() {  # issue 15: prefetch distances with four rows at once (int8: 2 KiB rows, so
  # 4 KiB ahead lands inside the block of rows being read)
  for r in 1 2; do
    for d in 4096 8192 16384 0; do
      echo "== int8 row prefetch $d, round $r"
      FLINT_CPU_ROW_PREFETCH=$d timeline .device/call_timeline 16 int8 8 0 200 on 2048 768 bf16 256
    done
    for d in 4096 8192 16384; do
      echo "== int4 prefetch $d, round $r"
      FLINT_CPU_PREFETCH=$d timeline .device/call_timeline 16 int4 8 0 200 on 2048 768 bf16 256
    done
  done
}

gpu75() {  # the session's last commit: the CPU kernels' Rust tests on the Xeon (where the
  # lanes kernel and four rows at once are the defaults; built on the CPU box, carried in
  # .device/rtests), then the GPU tests
  echo "== Rust unit tests"; timeout 120 .device/rtests/unit 2>&1 | grep -E "test result|FAILED|panicked" | head
  echo "== Rust kernel tests"; timeout 200 .device/rtests/kernels 2>&1 | grep -E "test result|FAILED|panicked" | head
  gpu_tests
}

gpu76() {  # the review's mends (2ce86b6): the CPU kernels' Rust tests on the Xeon again,
  # and the int4 call through the lanes kernel at 16 threads
  echo "== Rust unit tests"; timeout 60 .device/rtests/unit 2>&1 | grep -E "test result|FAILED|panicked" | head
  echo "== Rust kernel tests"; timeout 100 .device/rtests/kernels 2>&1 | grep -E "test result|FAILED|panicked" | head
  timeline .device/call_timeline 16 int4 8 0 200 on 2048 768 bf16 256
}

gpu77() {  # prepared for the next session (issue 15): the AMX BF16 tile products' rate on
  # the Xeon beside the AVX-512 instructions' (core_probe's tile probes have not run on an
  # AMX CPU yet: the CPU box has none)
  timeout 200 .device/core_probe 1,16 100000000
}

# Issue 10: the graph step's dense products through one Triton matrix-vector kernel
# (fused.linear, with the residual add and the next norm's add fused): the step's
# kernels by time with it and with torch's F.linear, the kernel's block shapes against
# torch, the graph tests; and the AMX probe prepared for issue 15 (gpu77).
gpu78() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 40 .device/core_probe 1,16 100000000
  flint synth --geometry qwen3-30b-a3b --quant int4 --layers 12 -o "$DATA/q12.ftw" | tail -1
  for d in "" --torch-dense; do
    timeout 130 python3 benches/graph_decode.py "$DATA/q12.ftw" --tokens 64 --reps 2 --modes on --profile $d 2>&1 | tail -45
  done
  timeout 150 python3 benches/linear_tune.py 2>&1 | grep -E "torch|best|error"
  timeout 150 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -8
}

# Issue 10: the step's attention in one Triton kernel (fused.decode_attention), q/k/v
# norm and RoPE in one launch, the matrix-vector kernel's block shapes by shape: the
# graph tests, the step's kernels by time (12 layers), R0 on 48 layers against the step
# with torch's dense products and attention.
gpu79() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_graphs.py tests/models/test_streamed_step.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -8
  flint synth --geometry qwen3-30b-a3b --quant int4 --layers 12 -o "$DATA/q12.ftw" | tail -1
  timeout 100 python3 benches/graph_decode.py "$DATA/q12.ftw" --tokens 64 --reps 2 --modes on --profile 2>&1 | tail -60
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for d in "" "--torch-dense --torch-attention"; do
    timeout 120 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on $d 2>&1 | tail -22
  done
}

# Issue 10: gate and up read in one loop (both tiles' loads issued per step): the GPU
# tests (whole output), the expert kernels' block shapes, the step's kernels by time.
gpu80() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_graphs.py tests/models/test_streamed_step.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -40
  timeout 200 python3 benches/moe_kernel_tune.py --scheme int4 2>&1 | tail -50
  flint synth --geometry qwen3-30b-a3b --quant int4 --layers 12 -o "$DATA/q12.ftw" | tail -1
  timeout 100 python3 benches/graph_decode.py "$DATA/q12.ftw" --tokens 64 --reps 2 --modes on --profile 2>&1 | tail -48
}

# Issue 10, R0 on 48 layers: the step as graphs of 8 layers, of 16, as one graph, and
# with torch's dense products and attention in one graph (the step before this
# session's kernels); flint bench's R0 rows; then every GPU test. Ran on a74b2af's
# wheel; the groups of layers gained nothing and were taken out after (docs/benchmarks.md),
# with graph_decode's --group-layers.
gpu81() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for a in "--group-layers 8" "--group-layers 16" "--group-layers 0" \
      "--group-layers 0 --torch-dense --torch-attention"; do
    echo "== graph_decode $a"
    timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on $a 2>&1 \
      | grep -E "tg_tok|_sd|roofline|group|dense|attention|moe_kernel|Error"
  done
  timeout 150 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 2 --mode resident 2>&1 | tail -6
  gpu_tests
}

# Issue 10: greedy decode one step ahead (the next step queued before the host reads
# the token): the graph tests, R0 on 48 layers with and without it (the first with the
# kernels' profile), flint bench's R0 rows.
gpu82() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_graphs.py tests/models/test_streamed_step.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -15
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for a in "--profile" "--no-ahead"; do
    echo "== graph_decode $a"
    timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on $a 2>&1 \
      | grep -vE "^ +[0-9]+,?$|first_tokens|^ +\],?$"
  done
  timeout 150 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 3 --mode resident 2>&1 | tail -6
}

# Issue 10, the session's last GPU run: every GPU test on 49018ba's wheel (the routed
# experts' per-rank outputs summed inside the next norm's kernel: R0 341.7 tok/s, no
# gain, reverted after), R0 on 48 layers, flint bench's R0 rows (cut by the limit).
gpu83() {
  gpu_tests
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -vE "^ +[0-9]+,?$|first_tokens|^ +\],?$"
  timeout 120 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 3 --mode resident 2>&1 | tail -5
}

# Issue 10, programmatic dependent launch (PDL): the new test (PDL on and off give the
# same bits), R0 with PDL, without, and with again under the profiler; then every GPU test.
gpu84() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 120 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short -rf -m gpu -k dependent 2>&1 | tail -8
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for a in "" "--no-pdl" "--profile"; do
    echo "== graph_decode $a"
    timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on $a 2>&1 \
      | grep -vE "^ +[0-9]+,?$|first_tokens|^ +\],?$"
  done
  gpu_tests
}

# Issue 10, int8/int4 weights to fp32 through float bits: R0 twice, the expert kernels'
# block shapes again (cut at 150 s), the dense products' int8 and bf16 rows.
gpu85() {
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for a in "" ""; do
    echo "== graph_decode $a"
    timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on $a 2>&1 \
      | grep -E "tg_tok|_sd|roofline|moe_kernel|Error"
  done
  (cd benches && timeout 150 python3 moe_kernel_tune.py --scheme int4 2>&1 | tail -45)
  (cd benches && timeout 90 python3 linear_tune.py --shapes qkv,o --quick 2>&1 | grep -E "best|torch")
}

# Issue 10: the q/k RoPE folded into attention (one launch fewer a layer) and int8
# attention matrices (--dense-quant int8) read as stored: the graph tests, R0 on the
# bf16-dense file twice, then on an int8-dense one.
gpu86() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -8
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  for a in "" ""; do
    echo "== graph_decode q30 $a"
    timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on $a 2>&1 \
      | grep -E "tg_tok|_sd|roofline|bytes_per|Error"
  done
  rm -f "$DATA/q30.ftw"
  flint synth --geometry qwen3-30b-a3b --quant int4 --dense-quant int8 -o "$DATA/q30d8.ftw" | tail -1
  echo "== graph_decode q30d8"
  timeout 100 python3 benches/graph_decode.py "$DATA/q30d8.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -E "tg_tok|_sd|roofline|bytes_per|Error"
}

# Issue 10: every GPU test on the folds' wheel; the step's GPU time A/B in one process
# (benches/step_ab.py: base, no PDL, no folds, neither) on the bf16-dense and the
# int8-dense 30B-A3B files; R0 on each.
gpu87() {
  gpu_tests
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" 2>&1 | tail -6
  timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -E "tg_tok|_sd|roofline|bytes_per|Error"
  rm -f "$DATA/q30.ftw"
  flint synth --geometry qwen3-30b-a3b --quant int4 --dense-quant int8 -o "$DATA/q30d8.ftw" | tail -1
  timeout 100 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,serial 2>&1 | tail -4
  timeout 100 python3 benches/graph_decode.py "$DATA/q30d8.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -E "tg_tok|_sd|roofline|bytes_per|Error"
}

# Issue 10, the session's last call: every GPU test on the wheel after the folds' revert
# (gpu87's streamed DeepSeek-V3 failure), then that test twice more.
gpu88() {
  gpu_tests
  for _ in 1 2; do
    timeout 60 python3 -m pytest tests/models/test_streamed_step.py -q -p no:cacheprovider -m gpu \
      -k "captured_and_eager and deepseek_v3" 2>&1 | tail -1
  done
}

# Prepared at the end of the sixteenth session (no device time left), not yet run: every
# GPU test on the wheel with dependent launch confined to the resident step (does the
# streamed DeepSeek-V3 test pass in the full suite now?), that test 3 times more, then
# the step's A/B in one process on the int8-dense file (PDL, int8 attention) and R0.
gpu89() {
  gpu_tests
  for _ in 1 2 3; do
    timeout 60 python3 -m pytest tests/models/test_streamed_step.py -q -p no:cacheprovider -m gpu \
      -k "captured_and_eager and deepseek_v3" 2>&1 | tail -1
  done
  flint synth --geometry qwen3-30b-a3b --quant int4 --dense-quant int8 -o "$DATA/q30d8.ftw" | tail -1
  timeout 150 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,no-pdl,no-int8 2>&1 | tail -4
  timeout 100 python3 benches/graph_decode.py "$DATA/q30d8.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -E "tg_tok|_sd|roofline|bytes_per|Error"
  timeout 60 python3 benches/launch_floor.py 2>&1 | tail -12
  # why the int4 expert kernels stay near 1 TB/s: the hardware counters of gate/up and
  # down at the default blocks (ncu works on the Firecracker runtime: H200.md)
  which ncu && timeout 120 ncu --clock-control none --kernel-name regex:"gate_up|down_kernel" \
    --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats python3 benches/moe_kernel_tune.py --scheme int4 --layers 2 --defaults-only 2>&1 \
    | grep -E "gate_up|down_kernel|Throughput|Duration|Occupancy|Registers|Block Size|Grid Size|Waves|L2 Hit|Mem Busy" | head -60
}

# Session 17: (1) the streamed DeepSeek-V3 capture test with VRAM swap rounds off
# (placement then follows the routing only), 3 runs, and 3 runs of a copy with them on,
# whose placement assertion says whether a failure is a different placement; (2) the
# expert kernels' switches in one process; (3) ncu's stall reasons for gate/up and down.
gpu90() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  T=tests/models/test_streamed_step.py
  for _ in 1 2 3; do
    timeout 60 python3 -m pytest $T -q -p no:cacheprovider -m gpu -k "captured_and_eager and deepseek_v3" \
      2>&1 | tail -1
  done
  sed -e '/monkeypatch.setattr(vram_module/d' -e '/assert stats\["vram_swaps"\] == 0/d' $T > tests/models/test_swaps_on_copy.py
  for _ in 1 2 3; do
    timeout 60 python3 -m pytest tests/models/test_swaps_on_copy.py -q -p no:cacheprovider -m gpu \
      -k "captured_and_eager and deepseek_v3" 2>&1 | grep -E "^E .*assert|passed|failed" | head -3
  done
  rm tests/models/test_swaps_on_copy.py
  timeout 200 python3 benches/moe_kernel_tune.py --scheme int4 --variants --rounds 3 2>&1 | tail -10
  which ncu && timeout 150 ncu --clock-control none --kernel-name regex:"gate_up|down_kernel" \
    --launch-count 2 --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section ComputeWorkloadAnalysis python3 benches/moe_kernel_tune.py --scheme int4 --layers 2 --defaults-only 2>&1 \
    | grep -E "_kernel|Stall|Warp Cycles|Issued|Eligible|Active Warps|No Eligible|Executed Ipc|Pipe|stall|cycles" | head -60
}

# Session 17: int4 experts read as 32-bit words against the vector's eighths
# (moe_kernel.WORDS): the GPU tests, the kernels' variants, the step A/B (words against
# byte tiles) in one process, R0, and the new kernels' counters.
gpu91() {
  gpu_tests
  flint synth --geometry qwen3-30b-a3b --quant int4 --dense-quant int8 -o "$DATA/q30d8.ftw" | tail -1
  timeout 120 python3 benches/moe_kernel_tune.py --scheme int4 --variants --rounds 3 2>&1 | tail -9
  timeout 150 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,bytes,no-pdl 2>&1 | tail -4
  timeout 100 python3 benches/graph_decode.py "$DATA/q30d8.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -E "tg_tok|_sd|roofline|bytes_per|Error"
  which ncu && timeout 120 ncu --clock-control none --kernel-name regex:"gate_up|down_kernel|eighths" \
    --launch-count 3 --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    python3 benches/moe_kernel_tune.py --scheme int4 --layers 2 --defaults-only 2>&1 \
    | grep -E "_kernel|Duration|Throughput|Registers|Achieved Occupancy|Waves|Issued Warp|No Eligible" | head -40
}

# Session 17: the experts' input written by the norm's launch (decode.EIGHTHS_IN_NORM),
# the word kernels pipelined (WORDS_STAGES) and the dense rows whole (fused.WHOLE_ROWS),
# each against the default in one process; R0 on both files; the GPU tests.
gpu92() {
  gpu_tests
  flint synth --geometry qwen3-30b-a3b --quant int4 --dense-quant int8 -o "$DATA/q30d8.ftw" | tail -1
  timeout 100 python3 benches/moe_kernel_tune.py --scheme int4 --variants --rounds 3 2>&1 | tail -5
  timeout 200 python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base,eighths-launch,stages2,stages3,whole-rows,bytes 2>&1 | tail -6
  timeout 100 python3 benches/graph_decode.py "$DATA/q30d8.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -E "tg_tok|_sd|roofline|bytes_per|Error"
  flint synth --geometry qwen3-30b-a3b --quant int4 -o "$DATA/q30.ftw" | tail -1
  timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on 2>&1 \
    | grep -E "tg_tok|_sd|roofline|bytes_per|Error"
}

# Session 17, final: the GPU tests on the kept code, R0 on both files, and flint bench's
# resident rows (last run before PDL and the word kernels).
gpu93() {
  gpu_tests
  synth30 q30d8 --dense-quant int8
  r0 q30d8
  synth30 q30
  r0 q30
  timeout 160 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 2 --mode resident 2>&1 | tail -6
}

# Session 17, last minutes: gate/up word blocks of one warp (each thread more rows, x
# reused across them) against the default, in one process.
gpu94() {
  timeout 150 python3 benches/moe_kernel_tune.py --scheme int4 --variants --rounds 3 2>&1 | tail -6
}

# Session 17, the review's mends: the GPU tests on the final code.
gpu95() {
  gpu_tests
}

# Next session, first call: the GPU tests on the module split (slot_kernels.py,
# `1547b64`, CPU-only so far), the step A/B and R0 on both files.
gpu96() {
  gpu_tests
  synth30 q30d8 --dense-quant int8
  timeout 150 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,bytes,eighths-launch 2>&1 | tail -3
  r0 q30d8
  synth30 q30
  r0 q30
}

# Session 18, first call: the GPU tests on the module split (slot_kernels.py, CPU-only
# so far) and the one-pass router; the step A/B (router one pass against two, with and
# without PDL) with each kernel's time per step without PDL; R0 on both files.
gpu97() {
  gpu_tests
  synth30 q30d8 --dense-quant int8
  timeout 200 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,route-two-pass,no-pdl,no-pdl-two-pass \
    --profile no-pdl 2>&1 | tail -24
  r0 q30d8
  synth30 q30
  r0 q30
}

# (Session 18's fused.LINEAR_AHEAD, linear_tune --ahead and decode.RANKED_SUM_IN_NORM,
# with step_ab's linear-ahead and ranked-in-norm, were measured slower and taken out
# after gpu101, and step_ab's lin-whole* became blocks-whole: gpu98, gpu99 and gpu101
# below record what ran and no longer run as they are.)
# Session 18, second call: the one-token products with two weight tiles in flight
# (fused.LINEAR_AHEAD) block by block, and in the step with the attention's variants;
# the one-pass router's GPU test after its tolerance mend.
gpu98() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 60 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider -m gpu -k one_pass 2>&1 | tail -2
  synth30 q30d8 --dense-quant int8
  timeout 300 python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base,linear-ahead,attn-b128,attn-b128-w8,attn-w8,attn-b32 2>&1 | tail -6
  timeout 150 python3 benches/linear_tune.py --shapes qkv,o --ahead both \
    --blocks "4,512,4;8,512,8;4,1024,4;4,1024,8;8,1024,4;2,2048,4" 2>&1 | grep -v torch | cut -c1-150
}

# Session 18, third call: the one-token products' blocks of whole 2048-column steps
# (gpu98: (2, 2048, 4) the best for q/k/v and o) block by block and in the step.
gpu99() {
  synth30 q30d8 --dense-quant int8
  timeout 300 python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base,lin-whole,lin-whole-ahead,lin-whole-r1,lin-whole-b128,linear-ahead 2>&1 | tail -6
  timeout 200 python3 benches/linear_tune.py --shapes qkv,o,router \
    --blocks "1,2048,2;1,2048,4;2,2048,2;2,2048,4;2,2048,8;4,2048,4;4,2048,8;2,4096,4;4,4096,8;8,512,8;4,1024,4;4,1024,8" \
    2>&1 | grep -v torch | cut -c1-150
}

# Session 18, fourth call: the GPU tests on the one-pass router, the new block shapes
# and the post-attention norm in the router's launch; the step A/B of those; R0 on both
# files and flint bench's resident rows.
gpu100() {
  gpu_tests
  synth30 q30d8 --dense-quant int8
  timeout 240 python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base,norm-launch,blocks-before,blocks-tuned,norm-w8,norm-w2 --profile base 2>&1 | tail -24
  r0 q30d8
  synth30 q30
  r0 q30
  timeout 160 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 2 --mode resident 2>&1 | tail -4
}

# Session 18, fifth call: the step A/B of the small kernels' warps and the ranked sum in
# the next norm's launch (q30d8), and of the block shapes and the router's norm on q30.
gpu101() {
  synth30 q30d8 --dense-quant int8
  timeout 200 python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base,ranked-in-norm,norm-w4,norm-w16,nl-w8,rope-w1,rope-w2 2>&1 | tail -7
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,blocks-before,norm-launch,ranked-in-norm 2>&1 | tail -4
}

# Session 18, last call: the GPU tests on the final code (bf16 products back on their
# earlier blocks, q/k/v RoPE on one warp), R0 on both files.
gpu102() {
  gpu_tests
  synth30 q30d8 --dense-quant int8
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  r0 q30
}

# Session 19, first call: the GPU tests on the session-18 commits that ran on the CPU
# only (the switches taken out, head_rope on one warp, the router's shared _top_k), R0
# on both files (gpu102's lines), then baselines of issue 15's figure, V1 and flint
# bench's resident rows.
gpu103() {
  gpu102
  echo "== issue 15 figure (baseline)"
  timeout 90 python3 benches/cpu_kernels.py --x-bf16 --threads 1,16 --calls 40 --schemes int4,int8 \
    --round-hidden on 2>&1 | tail -12
  echo "== V1"
  timeout 140 flint bench "$DATA/q30.ftw" -p 0 -n 32 --tg-random -r 2 --mode full,naive \
    --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror"
  timeout 120 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 2 --mode resident 2>&1 | tail -4
}

# Session 19, second call: the L2 asked for weights ahead (Hopper's bulk prefetch) in the
# step, A/B on both files, then the GPU tests (gate/up's new arguments). Every l2-*
# configuration was slower; the switches were taken out after it (docs/benchmarks.md).
gpu104() {
  synth30 q30d8 --dense-quant int8
  timeout 220 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
    base,l2-none,l2-next,l2-qkv,l2-down,l2-own,l2-next-down,l2-all,l2-next-c4k,l2-next-c64k 2>&1 | tail -12
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,l2-next,l2-qkv,l2-down,l2-all 2>&1 \
    | tail -6
  gpu_tests
}

# Session 19, third call: the ranked sum made by down's last programs and the router's
# top-k by the router's last program (one launch fewer each per MoE layer), A/B in one
# process, the router's launch on fewer warps; R0 on both files; the GPU tests. Both
# folds were slower (as in the sixteenth session) and were taken out after it.
gpu105() {
  synth30 q30d8 --dense-quant int8
  timeout 200 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
    base,sum-launch,route-launch,both-launch,nl-w1,nl-w2 2>&1 | tail -8
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  timeout 100 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,both-launch 2>&1 | tail -3
  r0 q30
  gpu_tests
}

# Session 19, last call: the VNNI kernels (int8 and int4 rows with the activation
# rounded to 8 bits) on the Xeon: the Rust tests there, issue 15's figure with and
# without them in alternation, one layer call from DRAM, the rows kernels on 16 threads;
# then the GPU tests with the VNNI kernels on.
VNNI_ON="FLINT_CPU_INT8=vnni FLINT_CPU_INT4=vnni"
VNNI_OFF="FLINT_CPU_INT8=f32 FLINT_CPU_INT4=lanes"
vnni_env() {  # on|off -> the environment of that side
  if [ "$1" = on ]; then echo "$VNNI_ON"; else echo "$VNNI_OFF"; fi
}
fig15() {  # label, env, cpu_kernels.py's thread flags
  echo "== figure $1 $3"
  env $2 timeout 80 python3 benches/cpu_kernels.py --x-bf16 $3 --calls 40 --schemes int4,int8 \
    --round-hidden on 2>&1 | grep -E '"scheme"|rror|disagrees' \
    | sed -E 's/"(isa|x_bf16|round_hidden|pinned|date|gap_ms|torch_sum_gb_s|memory_read_gb_s)": [^,}]*,? ?//g'
}
gpu106() {
  echo "== Rust unit tests"; timeout 60 .device/rtests/unit 2>&1 | grep -E "test result|FAILED|panicked" | head
  echo "== Rust kernel tests"; timeout 100 .device/rtests/kernels 2>&1 | grep -E "test result|FAILED|panicked" | head
  fig15 off "$VNNI_OFF" "--threads 1,16"
  fig15 on "$VNNI_ON" "--threads 1,16"
  fig15 off "$VNNI_OFF" "--threads 16 --core"
  fig15 on "$VNNI_ON" "--threads 16 --core"
  fig15 on "$VNNI_ON" "--threads 16"
  fig15 off "$VNNI_OFF" "--threads 16"
  for m in off on off on; do
    for k in int4 int8; do
      echo "== call $m $k"; env $(vnni_env $m) timeout 30 .device/call_timeline 16 $k 8 0 200 on 2048 768 bf16 256 2>&1 | tail -1 | cut -c1-120
    done
  done
  for m in off on; do
    echo "== rows $m"; env $(vnni_env $m) timeout 30 .device/dot_speed 64 2048 400 16 2>&1 | grep -E "Int8|Int4"
  done
  echo "== GPU tests, VNNI on"
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  env $VNNI_ON timeout 150 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf -m gpu \
    --ignore=tests/server --ignore=tests/chat 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
}

# Session 19, V1 with the VNNI kernels (now the defaults on this Xeon) and without,
# alternating on one box.
gpu107() {
  synth30 q30
  for m in off on off on; do
    echo "== V1 $m"; env $(vnni_env $m) timeout 70 flint bench "$DATA/q30.ftw" -p 0 -n 32 --tg-random -r 2 --mode full \
      --ram-budget 20 --vram-budget 4 2>&1 | grep -E "q30.ftw \||rror|kernels"
  done
}

# Next session's first call: the VNNI kernels after the review's mends (`04a240c`, CPU
# box only so far) on the Xeon: the CPU kernels' Rust tests (rebuild .device/rtests
# first: `cargo test --release -p cpu_kernels --no-run`), issue 15's figure with the
# final defaults, the GPU tests.
gpu108() {
  echo "== Rust unit tests"; timeout 60 .device/rtests/unit 2>&1 | grep -E "test result|FAILED|panicked" | head
  echo "== Rust kernel tests"; timeout 100 .device/rtests/kernels 2>&1 | grep -E "test result|FAILED|panicked" | head
  fig15 defaults "" "--threads 1,16"
  fig15 defaults "" "--threads 16 --core"
  gpu_tests
}

# Session 20, first call: what each kernel reads before its wait (moe_kernel.AHEAD),
# all, none and all but one, in one process; int4 down's blocks with its rows read
# ahead; the GPU tests (dependent launch against serial launch, bit for bit, covers the
# early reads); R0 on both files.
gpu109() {
  synth30 q30d8 --dense-quant int8
  timeout 250 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,no-ahead,\
no-ahead-attention,no-ahead-down,no-ahead-linear,no-ahead-norm,no-ahead-rope,down-b8,down-b32-w8 \
    2>&1 | tail -11
  gpu_tests
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  r0 q30
}

# Session 20, second call: the reads ahead as kept (the attention's position only, no
# RoPE), all but one again; int4 down's blocks; the step's kernels; R0 with the step
# replayed alone and with its argmax (graph_decode's replay_us, greedy_us); GPU tests.
gpu110() {
  synth30 q30d8 --dense-quant int8
  timeout 230 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,no-ahead,\
no-ahead-attention,no-ahead-down,no-ahead-linear,no-ahead-norm,down-w8,down-k512 \
    --profile base 2>&1 | tail -24
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  timeout 80 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,no-ahead 2>&1 | tail -2
  r0 q30
  gpu_tests
}

# Session 20, third call: int4 down's blocks on fewer warps (one wave with its rows
# read ahead); what the GPU does between two decode steps of the greedy loop
# (graph_decode --between), R0 with it on q30d8.
gpu111() {
  synth30 q30d8 --dense-quant int8
  timeout 120 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,down-w2,down-b8-w2 \
    2>&1 | tail -3
  timeout 150 python3 benches/graph_decode.py "$DATA/q30d8.ftw" --tokens 128 --reps 2 --modes on \
    --between 2>&1 | grep -E "token|median|tg_tok|_sd|roofline|replay_us|greedy_us|Error"
}

# Session 20, last call: the router's top-k made by the expert kernels against its own
# launch; the GPU tests (a greedy loop that never synchronises among them); R0 on both
# files with the host loop's cache write no longer waiting for the queued step; the
# flint bench R0 row.
gpu112() {
  synth30 q30d8 --dense-quant int8
  timeout 120 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,route-launch,no-ahead \
    2>&1 | tail -3
  gpu_tests
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  r0 q30
  echo "== flint bench R0"; timeout 120 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 2 \
    --mode resident 2>&1 | tail -4
}

# Session 20, after gpu112 (the router's top-k in the expert kernels slower: taken
# out): R0 on the final code, the GPU tests.
gpu113() {
  synth30 q30d8 --dense-quant int8
  r0 q30d8
  gpu_tests
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  r0 q30
}

# Session 21: a --dense-quant int8 file's LM head read as stored (int8_head) and the
# greedy argmax inside the step (fused.argmax): GPU tests, the step's A/B of each,
# the int8 head's block shapes, R0 on q30d8 and q30.
gpu114() {
  gpu_tests
  synth30 q30d8 --dense-quant int8
  timeout 150 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,bf16-head,no-argmax \
    2>&1 | tail -4
  r0 q30d8
  echo "== int8 head blocks"
  timeout 120 python3 benches/linear_tune.py --shapes head \
    --blocks "16,512,8;8,1024,8;16,1024,8;32,512,8;8,2048,8;4,2048,4;32,1024,8;16,2048,8" \
    2>&1 | grep -E '"int8"|best|error'
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  r0 q30
}

# Session 21, after gpu114 (the capture's eager run overwrote the step's input with its
# argmax: the token is now put back): GPU tests, the attention's chunk of positions
# per program, R0 and flint bench's row on q30d8.
gpu115() {
  gpu_tests
  synth30 q30d8 --dense-quant int8
  timeout 150 python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base,attn-chunk64,attn-chunk128,attn-chunk64-b32 2>&1 | tail -5
  r0 q30d8
  echo "== flint bench R0"; timeout 150 flint bench "$DATA/q30d8.ftw" -p 512 -n 128 -r 3 \
    --mode resident 2>&1 | tail -4
}

# Session 21: one token's int4 down and ranked sum in one launch (moe_kernel.DOWN_SUM,
# down_sum_kernel): the step's A/B and blocks, R0 on q30d8 and q30, the GPU tests.
# Slower in every block (docs/benchmarks.md): taken out with its step_ab configurations
# (no-down-sum, down-sum-*), which this call names as it ran at 091e1eb.
gpu116() {
  synth30 q30d8 --dense-quant int8
  timeout 200 python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base,no-down-sum,down-sum-b4,down-sum-w8,down-sum-b2 2>&1 | tail -6
  r0 q30d8
  gpu_tests
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  r0 q30
}

# Session 21, final code (7862968's kernels): flint bench's R0 rows with --warm (one
# model per mode after a warm-up; gpu115's cold runs timed the prompt kernels' compile).
gpu117() {
  synth30 q30d8 --dense-quant int8
  echo "== flint bench q30d8"; timeout 150 flint bench "$DATA/q30d8.ftw" -p 512 -n 128 -r 3 \
    --mode resident --warm 2>&1 | tail -4
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  echo "== flint bench q30"; timeout 150 flint bench "$DATA/q30.ftw" -p 512 -n 128 -r 3 \
    --mode resident --warm 2>&1 | tail -4
}

# Session 21: the layer's input norm made by the q/k/v product's launch
# (decode.NORM_IN_QKV, fused.add_norm_linear): the step's A/B and blocks, the GPU
# tests, R0 on q30d8 and q30 (in order of need: the device time left is short).
# Slower in every block (docs/benchmarks.md): taken out with its step_ab configurations
# (no-norm-qkv, norm-qkv-*), which this call names as it ran at 3576142.
gpu118() {
  synth30 q30d8 --dense-quant int8
  timeout 150 python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base,no-norm-qkv,norm-qkv-r4,norm-qkv-r8-w8,norm-qkv-r16-w8 2>&1 | tail -6
  gpu_tests
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  r0 q30
}

# Session 22's calls as they ran: gpu119's gu-* names meant the loaded-at-once variants
# of that commit (since renamed: the default now loads at once, gu-loop* is the loop),
# gpu120's no-fused and fused-r* and gpu122's no-l2-rest name configurations since
# taken out with their code (docs/benchmarks.md, "Twenty-second session").
# Session 22, first call: int4 gate/up with every tile of its rows loaded at once
# (moe_kernel.WHOLE_GATE_UP) and its blocks, in one process on both files; the GPU
# tests (the new ones: WHOLE against the loop bit for bit, the int8 LM head of a
# 20011-row vocabulary through captured graphs).
gpu119() {
  synth30 q30d8 --dense-quant int8
  timeout 200 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,gu-whole,gu-whole-b4,gu-whole-b2-w2,gu-whole-b4-k1024,gu-b4,gu-k1024 2>&1 | tail -9
  gpu_tests
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,gu-whole,gu-whole-b4 \
    2>&1 | tail -5
}

# Session 22, second call: the experts in one launch (fused_experts; registers capped
# or not) against three launches; int8 products four rows a program; gate/up's blocks
# under the new default; GPU tests (the one launch against the three, bit for bit, and
# every step test through it); R0 on q30d8.
gpu120() {
  synth30 q30d8 --dense-quant int8
  timeout 250 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,no-fused,fused-r72,fused-r64,fused-r56,lin8-b4,lin8-b4-w8,gu-b2,gu-w8 2>&1 | tail -11
  gpu_tests
  r0 q30d8
}

# Session 22, third call (the experts' one launch taken out): the kept default
# against the loop of before; int4 down's blocks beside the new gate/up; GPU tests;
# R0 on both files.
gpu121() {
  synth30 q30d8 --dense-quant int8
  timeout 220 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,gu-loop-b8,down-b8,down-w8,down-b32-w8,down-w2,down-b8-w2 2>&1 | tail -9
  gpu_tests
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  r0 q30
}

# Session 22, fourth call: the one-token products asking the L2 for the rest of their
# rows before the wait (fused.L2_REST, on in this wheel) against not, on both files;
# GPU tests with it on; R0 on both files.
gpu122() {
  synth30 q30d8 --dense-quant int8
  timeout 120 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs base,no-l2-rest 2>&1 | tail -4
  gpu_tests
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,no-l2-rest 2>&1 | tail -4
  r0 q30
}

# Session 22, last call (little device time left): flint bench on q30d8 with the
# session's final code.
gpu123() {
  synth30 q30d8 --dense-quant int8
  echo "== flint bench q30d8"; timeout 150 flint bench "$DATA/q30d8.ftw" -p 512 -n 128 -r 3 \
    --mode resident --warm 2>&1 | tail -4
}

# Session 23, first call: GPU tests (the new CUDA cases of session 22 and this one);
# the one-token products' tiles after the first loaded at once (fused.LINEAR_AT_ONCE)
# and the attention's first blocks of keys and values read before its wait
# (fused.ATTENTION_KV_AHEAD), each against before, on both files.
gpu124() {
  gpu_tests
  synth30 q30
  timeout 170 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,lin-loop,attn-kv0,attn-kv1,attn-kv2-w8,lin-qkv-b8,lin-o-b2 2>&1 | tail -9
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  timeout 130 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,lin-loop,lin-loop-int8,attn-kv0,lin-head 2>&1 | tail -7
}

# Session 23, second call: R0 with bf16 experts (57 GiB file; the disk has 64G free),
# its blocks' A/B (the float pools use blocks tuned on int4 bytes), flint bench. Ran at
# 7bab4a3, whose f-gu-b4* set GATE_UP_BLOCK; (4, 1024, 4) is now FLOAT_GATE_UP_BLOCK's
# default and those names are gone (f-gu-b8 is the block of before).
gpu125() {
  /usr/bin/time -f "synth %e s, max RSS %M KB" flint synth --geometry qwen3-30b-a3b \
    --quant none -o "$DATA/q30bf.ftw" 2>&1 | tail -2
  df -h "$DATA" | tail -1
  r0 q30bf
  timeout 170 python3 benches/step_ab.py "$DATA/q30bf.ftw" --configs \
base,f-gu-b4,f-down-b32-w8,f-gu-b4-down-b32-w8,f-down-b8 2>&1 | tail -7
  echo "== flint bench q30bf"; timeout 150 flint bench "$DATA/q30bf.ftw" -p 512 -n 128 -r 3 \
    --mode resident --warm 2>&1 | tail -4
}

# Session 23, third call: the graph tests on CUDA with float pools' gate/up at four
# rows a program (moe_kernel.FLOAT_GATE_UP_BLOCK); R0 with bf16 experts (gpu125's r0
# printed nothing, no error caught by its grep: a longer limit, and errors shown).
gpu126() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests (graphs)"; timeout 80 python3 -m pytest tests/models/test_graphs.py \
    tests/models/test_read_ahead.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  /usr/bin/time -f "synth %e s" flint synth --geometry qwen3-30b-a3b --quant none \
    -o "$DATA/q30bf.ftw" 2>&1 | tail -2
  /usr/bin/time -f "r0 %e s" timeout 320 python3 benches/graph_decode.py "$DATA/q30bf.ftw" \
    --tokens 128 --reps 2 --modes on 2>&1 | grep -E \
    "tg_tok|_sd|roofline|bytes_per|copy_gb|replay_us|greedy_us|moe_kernel|rror|Killed|r0 "
}

# Session 23, a check: gpu126 ran test_graphs.py and test_read_ahead.py alone and
# test_greedy_ahead_makes_no_synchronising_call raised (sync debug mode), its mode then
# left on for the tests after it. The test alone, with its traceback, with the float
# gate/up block as now and as before; then every GPU test as in the earlier calls.
gpu127() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  local t=tests/models/test_graphs.py::test_greedy_ahead_makes_no_synchronising_call
  echo "== alone, FLOAT_GATE_UP_BLOCK as now"
  timeout 60 python3 -m pytest "$t" -q -p no:cacheprovider --tb=long -m gpu 2>&1 | tail -60
  echo "== alone, FLOAT_GATE_UP_BLOCK (8, 1024, 4)"
  timeout 60 python3 -c "import sys, pytest; from flint.graphs import moe_kernel as m; \
m.FLOAT_GATE_UP_BLOCK = (8, 1024, 4); sys.exit(pytest.main(['$t', '-q', '-p', \
'no:cacheprovider', '--tb=line', '-m', 'gpu']))" 2>&1 | tail -8
  gpu_tests
}

# Session 23, the fix checked: the sync test alone (the once-a-process warning now
# ignored, the mode reset if it fails), then test_read_ahead's CUDA tests after it.
gpu128() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 90 python3 -m pytest tests/models/test_graphs.py::test_greedy_ahead_makes_no_synchronising_call \
    tests/models/test_read_ahead.py -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -15
}

# Session 23, last: float pools' gate/up at 4, 8 and 16 rows a program on CUDA, the
# same bits (the interpreter cannot show a layout's order of sums).
gpu129() {
  timeout 60 python3 -m pytest tests/models/test_graphs.py -k float_pools_rows -q \
    -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -8
}

# Session 24, first call: each kernel's share of the stream under dependent launch
# (step_ab --profile: critical_shares, unrun until now) on q30 and q30d8; the output
# projection's whole rows read before its wait (o-whole*), bf16 q/k/v's alone
# (qkv-whole), L2 eviction policies (evict-w, keep, evict-keep); their CUDA bits test.
gpu130() {
  synth30 q30
  timeout 230 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,o-whole-1,o-whole,qkv-whole,evict-w,keep,evict-keep --profile base 2>&1 | tail -45
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  timeout 180 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,o-whole-2,o-whole,evict-w,evict-keep --profile base 2>&1 | tail -43
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 70 python3 -m pytest tests/models/test_graphs.py -k eviction -q \
    -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -6
}

# Session 24, second call: gate/up picks its pair's expert from the router's logits and
# loads its rows before its wait (moe_kernel.AHEAD "pick"; no-ahead-pick: the router's
# ids read after it), with the stream shares again; bf16 q/k/v's whole rows against the
# tiles of before (qkv-tiles); then every GPU test.
gpu131() {
  synth30 q30
  timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,no-ahead-pick,pick-s8,qkv-tiles --profile base 2>&1 | grep -E '"config"|share_us|busy|profile_us'
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  timeout 130 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,no-ahead-pick,pick-s8 --profile base 2>&1 | grep -E '"config"|share_us|busy|profile_us'
  gpu_tests
}

# Session 24, third call: the router's launch asks the L2 for its picks' gate and up
# rows (moe_kernel.ROUTE_ASKS, route-asks*), R0 on q30 with bf16 q/k/v's whole rows,
# then every GPU test (.device/shared without the trained checkpoint: its two tests
# skip, as in the calls before gpu131).
gpu132() {
  synth30 q30
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,route-asks,route-asks-256k,route-asks-64k 2>&1 | grep -E '"config"|rror'
  r0 q30
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  timeout 100 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,route-asks,route-asks-256k 2>&1 | grep -E '"config"|rror'
  gpu_tests
}

# Session 24, last call: the products' first weight tile read after their wait, the
# output projection's (o-behind) or every product's (lin-behind), against before it
# (base) on q30d8 and q30; and ncu's counters of the step's attention, gate/up, router
# and products inside the graph (stall reasons per issued instruction, raw).
gpu133() {
  synth30 q30d8 --dense-quant int8
  timeout 100 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,o-behind,lin-behind 2>&1 | grep -E '"config"|rror'
  which ncu && timeout 150 ncu --clock-control none --graph-profiling node \
    --kernel-name regex:"decode_attention|gate_up|linear_kernel|route_kernel" \
    --launch-skip 400 --launch-count 10 --section SpeedOfLight --section WarpStateStats \
    --section LaunchStats --page raw python3 benches/step_ab.py "$DATA/q30d8.ftw" \
    --configs base --rounds 1 --replays 2 2>&1 | grep -E "_kernel.*Context|gpu__time_duration.sum|\
issue_stalled_(long_scoreboard|barrier|wait|short_scoreboard|lg_throttle|mio_throttle|\
math_pipe_throttle|no_instruction|membar|branch_resolving|dispatch_stall|drain|not_selected|\
selected|sleeping)_per_issue_active|dram__throughput.avg.pct_of_peak_sustained_elapsed|\
launch__grid_size|launch__registers_per_thread|warps_active.avg.pct|rror" | head -120
  rm -f "$DATA/q30d8.ftw"
  synth30 q30
  timeout 110 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,o-behind,lin-behind 2>&1 | grep -E '"config"|rror'
}

# Session 24, with the device time left: gpu108 without its GPU tests (those ran in
# gpu132): the CPU kernels' Rust tests on the Xeon (built on the CPU box at 1aeb886:
# `cargo test --release -p cpu_kernels --no-run`, carried in .device/rtests) and issue
# 15's figure with the final defaults. The VNNI review's mends had not run there.
gpu134() {
  echo "== Rust unit tests"; timeout 60 .device/rtests/unit 2>&1 | grep -E "test result|FAILED|panicked" | head
  echo "== Rust kernel tests"; timeout 120 .device/rtests/kernels 2>&1 | grep -E "test result|FAILED|panicked" | head
  lscpu | grep -E "Model name|Flags" | sed -E 's/Flags:.*(avx512_vnni|avx_vnni).*/Flags: has VNNI/' | head -2
  fig15 defaults "" "--threads 1,16"
  fig15 defaults "" "--threads 16 --core"
}

# Session 24, last: issue 15's figure at 16 threads lower on gpu134's box than on
# gpu106's; the same box's figure with the wheel of before the VNNI review's mends
# (45da21c, .device/ab/old) and main's (.device/ab/new), alternating.
gpu135() {
  for w in old new old new; do
    python3 -m pip install --no-deps --force-reinstall -q .device/ab/$w/flint-*.whl 2>&1 | tail -1
    fig15 "$w" "" "--threads 16"
  done
}

# Session 25, first call: weights asked of the L2 from a second stream of the graph
# ahead of their kernel (decode.PREFETCH: o beside RoPE and the attention, the next
# layer's q/k/v beside the MoE block; line prefetches a thread, bulk asks, evict-last),
# with the stream shares of pf-both; then the CUDA test of the asks' bits.
gpu136() {
  synth30 q30
  timeout 200 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,pf-o,pf-qkv,pf-both,pf-both-keep,pf-o-l128,pf-o-l2048,pf-o-ask,pf-both-ask,pf-o-ask256k \
    --profile pf-both 2>&1 | grep -E '"config"|share_us|busy|profile_us|rror'
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  timeout 120 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,pf-o,pf-qkv,pf-both,pf-both-keep 2>&1 | grep -E '"config"|rror'
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 90 python3 -m pytest tests/models/test_graphs.py -k l2_asks -q \
    -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -6
}

# Session 25, second call: gate/up's loop and the products' loops software-pipelined
# (tiles copied into shared memory ahead, cp.async: moe_kernel.GATE_UP_STAGES,
# fused.LINEAR_STAGES) against the rows loaded at once, with the stream shares of
# st-both; then the CUDA tests of their bits.
gpu137() {
  synth30 q30
  timeout 200 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,gu-st5,gu-st4,gu-st5-b8,gu-st5-w2,lin-st4,lin-st3,st-both \
    --profile st-both 2>&1 | grep -E '"config"|share_us|busy|profile_us|rror'
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  timeout 120 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,gu-st5,gu-st5-w2,lin-st4,st-both 2>&1 | grep -E '"config"|rror'
  timeout 150 python3 -m pytest tests/models/test_read_ahead.py -k "pipelined or at_once" -q \
    -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -6
}

# Session 25, third call: a thread's registers capped (Triton's maxnreg) so that more
# programs fit an SM at once: gate/up (one wave of 1,536 at 40), down (one wave of
# 1,024 at 64), the products (q/k/v 16 an SM at 32); with the stream shares of r-all;
# then the CUDA test of their bits.
gpu138() {
  synth30 q30
  timeout 200 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,gu-r40,gu-r48,gu-r56,gu-b8-r64,down-r64,down-r56,lin-r32,r-all \
    --profile r-all 2>&1 | grep -E '"config"|share_us|busy|profile_us|rror'
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  timeout 120 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,gu-r40,gu-b8-r64,down-r64,lin-r32,r-all 2>&1 | grep -E '"config"|rror'
  timeout 100 python3 -m pytest tests/models/test_read_ahead.py -k capped -q \
    -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | tail -6
}

# Session 25, fourth call: int4 gate/up on one warp a program (the eighths vector read
# once a program instead of once a warp; fewer instructions a layer, compiled), with
# the stream shares of gu-k1024-w1; then the CUDA test of their bits against the default.
gpu139() {
  synth30 q30
  timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,gu-w1,gu-k1024-w1,gu-k2048-w1,gu-b2-k1024-w1 \
    --profile gu-k1024-w1 2>&1 | grep -E '"config"|share_us|busy|profile_us|rror'
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  timeout 100 python3 benches/step_ab.py "$DATA/q30d8.ftw" --configs \
base,gu-w1,gu-k1024-w1,gu-k2048-w1,gu-b2-k1024-w1 2>&1 | grep -E '"config"|rror'
  timeout 100 python3 -m pytest tests/models/test_read_ahead.py -k gate_up_blocks -q -s \
    -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | grep -E "block|passed|failed|Error" | tail -12
}

# Session 25, last call: the session's final code (int4 gate/up on one warp a program):
# the step against the four warps of before (gu-w4), R0 on q30 and q30d8, then every GPU
# test.
gpu140() {
  synth30 q30
  timeout 90 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,gu-w4 2>&1 \
    | grep -E '"config"|rror'
  r0 q30
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  r0 q30d8
  rm -f "$DATA/q30d8.ftw"
  gpu_tests
}

# Session 25, after the last: gate/up on one warp with eight rows, and down's blocks of
# fewer instructions a layer (two warps, or 32 rows), on q30.
gpu141() {
  synth30 q30
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,gu-b8-k1024-w1,down-b32,down-w2 2>&1 | grep -E '"config"|rror'
}

# Session 25, tests only: gate/up's blocks against the default in bf16 and fp32, and its
# rows at once against the loop at both blocks, compiled.
gpu142() {
  timeout 120 python3 -m pytest tests/models/test_read_ahead.py -k "gate_up_blocks or at_once" \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head
}

gpu143() {
  timeout 120 python3 -m pytest tests/models/test_read_ahead.py -k "gate_up_blocks or at_once" \
    -q -p no:cacheprovider --tb=short -rf -m gpu 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head
  timeout 200 python3 benches/mma_gate_up.py --layers 8 --reps 25 2>&1 | tail -30
}

gpu144() {
  timeout 300 python3 benches/mma_gate_up.py --layers 8 --reps 25 2>&1 | tail -30
}

# Session 26: q/k/v norm and RoPE in the attention's launch (decode.ROPE_IN_ATTENTION):
# its tests on CUDA with the step's exactness tests, the step A/B on q30, R0. Ran at
# 39893c2; the fold, its test and rope-launch were reverted in 6806546.
gpu145() {
  synth30 q30
  timeout 200 python3 -m pytest tests/models/test_graphs.py tests/models/test_streamed_step.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu \
    -k "rope_in_the_attention or captured_and_eager or follows or dependent_launch" 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,rope-launch 2>&1 \
    | grep -E '"config"|share_us|rror'
  r0 q30
}

# Session 26: what the word gate/up kernel's reads cost part by part (the bare reads,
# without the router's ids, with the scales, with the vector's eighths).
gpu146() {
  timeout 300 python3 benches/mma_gate_up.py --layers 8 --reps 25 2>&1 | tail -30
}

# Session 26: gate/up's rows' loads pinned before the first product
# (moe_kernel.PIN_GATE_UP): the CUDA tests, the kernel alone with and without, the step
# A/B on q30, R0. Ran at b0154e7; the pin, its test and no-pin were reverted in ba10b33.
gpu147() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 120 python3 -m pytest tests/models/test_read_ahead.py -q -p no:cacheprovider \
    --tb=short -rf -m gpu -k "pinned or gate_up_blocks or at_once" 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head
  timeout 200 python3 benches/mma_gate_up.py --layers 8 --reps 25 2>&1 | grep -E "word|floor\""
  synth30 q30
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,no-pin 2>&1 \
    | grep -E '"config"|share_us|rror'
  r0 q30
}

# Session 26: ncu's counters of the word gate/up kernel, the tensor-core prototype and
# the bare reads (benches/mma_gate_up.py --once: each once, after the check's three).
gpu148() {
  which ncu && timeout 400 ncu --clock-control none \
    --kernel-name regex:"gate_up_kernel|gate_up_mma_kernel|_floor_kernel" \
    --launch-skip 3 --launch-count 4 --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section LaunchStats --page raw \
    python3 benches/mma_gate_up.py --layers 2 --once 2>&1 | grep -E "Context|\
gpu__time_duration.sum|dram__throughput.avg.pct_of_peak_sustained_elapsed|dram__bytes_read.sum |\
issue_stalled_(long_scoreboard|barrier|wait|short_scoreboard|lg_throttle|mio_throttle|\
math_pipe_throttle|no_instruction|not_selected|selected|dispatch_stall|branch_resolving)\
_per_issue_active|warps_active.avg.pct|smsp__inst_executed.sum |launch__registers|\
launch__occupancy_limit|sm__throughput.avg.pct|rror" | head -150
}

# Session 26: gate/up's whole rows on two and four warps, less work a warp after its
# bytes arrive (gpu148's stalls): the kernel alone, then the step A/B on q30.
gpu149() {
  timeout 200 python3 benches/mma_gate_up.py --layers 8 --reps 25 2>&1 | grep -E "same|word"
  synth30 q30
  timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,gu-k2048-w2,gu-b8-k2048-w4 \
    2>&1 | grep -E '"config"|rror'
}

# Session 26: gate/up's default block (4, 2048, 2) (moe_kernel.WORDS_GATE_UP_BLOCK): the
# GPU tests (without tests/server and tests/chat), the step A/B against the block of
# before on q30, R0 on q30 and q30d8.
gpu150() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 230 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,gu-k1024-w1 2>&1 \
    | grep -E '"config"|rror'
  r0 q30
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  r0 q30d8
}

gpu151() {
  echo "== launch floor: serial, pdl, flag"
  timeout 150 python3 benches/launch_floor.py --launches 100,500 --programs 1,132,1024,2048 \
    --syncs serial,pdl,flag 2>&1 | grep -E 'programs|rror' | head -40
  synth30 q30
  timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base --profile base 2>&1 \
    | grep -vE '^\s*$' | head -60
}

gpu152() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== at-once products, CUDA bits"
  timeout 150 python3 -m pytest tests/models/test_read_ahead.py -q -p no:cacheprovider --tb=short \
    -rf -m gpu -k "products_load" 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  timeout 330 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
    base,o-at-once,late-gate_up,late-route,late-attention,late-ranked_sum,late-rope,late-down,attn-s1,attn-s2,attn-s4 \
    2>&1 | grep -E '"config"|rror'
}

gpu153() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== rope_attention: CUDA tests"
  timeout 200 python3 -m pytest tests/models/test_rope_attention.py tests/models/test_graphs.py \
    -q -p no:cacheprovider --tb=short -rf -m gpu -k "rope_attention or bit_identical" 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  timeout 200 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
    base,rope-attn,rope-attn-w8,rope-attn-w4 --profile rope-attn 2>&1 \
    | grep -E '"config"|"kernel"|stream_busy|rror'
}

gpu154() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== early launches: CUDA bits"
  timeout 200 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short \
    -rf -m gpu -k "dependent_launch_gives" 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  timeout 200 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
    base,early-all,early-small,early-bw --profile early-all 2>&1 \
    | grep -E '"config"|share_us|stream_busy|rror'
}

gpu155() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 230 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,no-early,early-down 2>&1 \
    | grep -E '"config"|rror'
  r0 q30
  rm -f "$DATA/q30.ftw"
  synth30 q30d8 --dense-quant int8
  r0 q30d8
}

# gpu156 ran at f8c76c1, whose graph_decode took --no-early (EARLY on by default then);
# since 0fc6dff the switch is --early.
gpu156() {
  synth30 q30
  for flag in --no-early ""; do
    echo "== R0 q30 $flag"
    timeout 60 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 1 --modes on \
      $flag 2>&1 | grep -E "tg_tok_s_mean|replay_us|early|Error"
  done
}

# Session 28: one layer's kernels one by one (step_ab --timeline) on base and with o's
# whole rows read before its wait; what the products' first tiles read ahead cost.
gpu157() {
  synth30 q30
  timeout 300 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,o-late,qkv-late,o-whole2,early-linear --profile base,o-whole2,o-late \
    --timeline 20 2>&1 | grep -E '"config"|"profile"|"layer"|share_us|busy|rror'
}

# The products' blocks and first tiles, the attention's warps, down's blocks (step_ab).
gpu158() {
  synth30 q30
  timeout 420 python3 benches/step_ab.py "$DATA/q30.ftw" --configs \
base,qkv-late,qkv-late-b4,o-k2048,o-b2-k2048,attn-w1,attn-w2,attn-w2-b128,attn-w1-b128,\
down-b8,down-w2,down-b8-w2,down-k512 --profile attn-w2 --timeline 20 2>&1 \
    | grep -E '"config"|"profile"|"layer"|busy|rror'
}

# bf16 q/k/v read after the wait, four rows a program (fused.QKV_AFTER_WAIT, the default
# since this wheel): every GPU test, the step A/B again, R0 on q30 both ways.
gpu159() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 230 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,qkv-before 2>&1 \
    | grep -E '"config"|rror'
  echo "== R0 q30"; r0 q30
  echo "== R0 q30 --qkv-before"
  timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
    --qkv-before 2>&1 | grep -E "tg_tok|roofline|copy_gb|replay_us|qkv_after|Error"
}

# gpu159 and gpu160 ran while fused.QKV_AFTER_WAIT was on by default: base was q/k/v after
# the wait and graph_decode took --qkv-before; since then it is off and the flag --qkv-after.
# step_ab and graph_decode disagreed (gpu156, gpu159): the A/B in one process, also
# replayed at graph_decode's positions (--sweep); R0 in two processes, the other order.
gpu160() {
  synth30 q30
  timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,qkv-before,early-small \
    --sweep 64-191 2>&1 | grep -E '"config"|rror'
  for flag in --qkv-before ""; do
    echo "== R0 q30 $flag"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $flag 2>&1 | grep -E "tg_tok|roofline|copy_gb|replay_us|qkv_after|Error"
  done
}

# Does the greedy loop's repeated routing explain step_ab against graph_decode? The sweep
# with the step's own tokens (and how many distinct), then with random tokens; R0's.
gpu161() {
  synth30 q30
  for how in "" --sweep-random; do
    echo "== step_ab sweep $how"
    timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,qkv-after,early-small \
      --sweep 64-191 $how 2>&1 | grep -E '"config"|rror'
  done
  echo "== R0 q30 (distinct tokens)"
  timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 1 --modes on \
    2>&1 | grep -E "tg_tok|distinct|replay_us|Error"
}

# Three captures of the defaults in one process: how far do they differ?
gpu162() {
  synth30 q30
  timeout 130 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,base-2,base-3,qkv-after 2>&1 | grep -E '"config"|rror'
}

# Each layer's input norm made by its q/k/v product from the ranked sum's partial sums of
# squares (decode.NORM_IN_QKV, on in this wheel): the step A/B with two captures each and
# layer 20's timeline, R0 on q30 both ways, then the graphs' GPU tests. Slower, and taken
# out: it runs at 240c830 (docs/benchmarks.md, "Twenty-ninth session").
gpu163() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  synth30 q30
  timeout 170 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,input-norm-launch \
    --captures 2 --profile base,input-norm-launch --timeline 20 2>&1 \
    | grep -E '"config"|"layer"|busy|rror'
  for flag in --input-norm-launch "" ; do
    echo "== R0 q30 $flag"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $flag 2>&1 | grep -E "tg_tok|roofline|copy_gb|replay_us|norm_in_qkv|Error"
  done
  echo "== GPU tests (graphs)"; timeout 150 python3 -m pytest tests/models/test_graphs.py -q \
    -p no:cacheprovider --tb=short -rf -m gpu -x 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -20
}

# bf16 q/k/v through shared memory (fused.SMEM_QKV, off in this wheel: a Gluon kernel, one
# SM's rows a program copied with cp.async before the wait): its CUDA test, the step A/B
# with two captures each and layer 20's timeline, R0 both ways, captured against
# uncaptured tokens with it on. Slower, and taken out: it runs at 52fc1f0
# (docs/benchmarks.md, "Twenty-ninth session").
gpu164() {
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== test"; timeout 100 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider \
    --tb=short -rf -m gpu -k shared_memory 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head
  synth30 q30
  timeout 170 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,smem-qkv \
    --captures 2 --profile smem-qkv --timeline 20 2>&1 | grep -E '"config"|"layer"|busy|rror'
  for flag in --smem-qkv "" ; do
    echo "== R0 q30 $flag"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $flag 2>&1 | grep -E "tg_tok|roofline|copy_gb|replay_us|smem_qkv|Error"
  done
  echo "== on and eager, --smem-qkv"
  timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 48 --reps 1 --modes on,eager \
    --smem-qkv 2>&1 | grep -E "tg_tok_s_mean|first_tokens|differ|Error"
}

# The shared-memory q/k/v (gpu164: slower) three programs an SM, or started two kernels
# early (the ranked sum and the norm in moe_kernel.EARLY), and that early start alone.
# Runs at c8059b6 (the shared-memory q/k/v taken out since).
gpu165() {
  synth30 q30
  timeout 330 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,smem-qkv,smem-qkv-3,smem-qkv-early,early-rn --captures 2 \
    --profile smem-qkv-3,smem-qkv-early --timeline 20 2>&1 | grep -E '"config"|"layer"|busy|rror'
  echo "== R0 q30"; r0 q30
}

# The ranked sum and the norm letting the next kernel start before their wait
# (moe_kernel.EARLY = {ranked_sum, norm}; gpu165's step A/B: 1,774.1 us against 1,794.6):
# R0 in four processes, alternating, the default first. Slower in R0 (558.5 and 558.6
# tok/s against 562.4 and 562.6): EARLY stays empty.
gpu166() {
  synth30 q30
  for flag in "" --early-kernels=ranked_sum,norm "" --early-kernels=ranked_sum,norm; do
    echo "== R0 q30 $flag"
    timeout 90 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $flag 2>&1 | grep -E "tg_tok|roofline|copy_gb|replay_us|\"early\"|Error"
  done
}

# Do step_ab's A/Bs depend on the configurations sharing a process? base and early-rn each
# alone in its own process (twice, alternating), then together as in gpu165 (step_ab
# faster with early-rn, greedy decode slower: gpu166).
gpu167() {
  synth30 q30
  for cfg in base early-rn base early-rn; do
    echo "== step_ab alone: $cfg"
    timeout 80 python3 benches/step_ab.py "$DATA/q30.ftw" --configs $cfg 2>&1 | grep -E '"config"|rror'
  done
  echo "== step_ab together"
  timeout 100 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,early-rn 2>&1 \
    | grep -E '"config"|rror'
}

# step_ab --processes on the GPU, and one of the twenty-eighth session's in-process
# losers (down's eight rows on two warps, +16 us in one process, gpu158) alone: 1,804.8
# us against 1,778.8, still slower.
gpu168() {
  synth30 q30
  timeout 150 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,down-b8-w2 --processes 2 \
    2>&1 | grep -E '"config"|rror|failed'
}

gpu169() {
  # Does the step's time depend on how many experts the file holds (the same active
  # bytes a token; 8 experts of 8 means every token reads the same 0.9 GB of experts)?
  # If so, by inference address translation (TLB reach) or DRAM placement costs.
  synth30 q30
  for e in 8 32; do
    python3 -c "from pathlib import Path; from flint import synth as s; \
s.GEOMETRIES['q30e$e'] = dict(s.GEOMETRIES['qwen3-30b-a3b'], num_experts=$e); \
print(s.synth('q30e$e', 'int4', Path('$DATA/q30e$e.ftw')))"
  done
  for m in q30 q30e8 q30e32 q30 q30e8 q30e32; do
    echo "== step $m"
    timeout 60 python3 benches/step_ab.py "$DATA/$m.ftw" --configs base 2>&1 | grep -E '"config"|rror'
  done
  for m in q30 q30e8; do
    echo "== R0 $m"; r0 $m
    echo "== timeline $m"
    timeout 60 python3 benches/step_ab.py "$DATA/$m.ftw" --configs base --profile base --timeline 20 \
      2>&1 | grep -E '"layer"|profile_us|rror'
  done
  echo "== leads alone"
  timeout 170 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,attn-w2,o-late --processes 2 \
    2>&1 | grep -E '"config"|rror|failed'
}

gpu170() {
  # The router's picks without a chain of eight dependent reductions (fused.ROUTE_RANKS):
  # bits on CUDA, each way alone in two processes, then R0 of the fastest against the
  # defaults, alternating.
  python3 -m pytest tests/models/test_graphs.py -q -k one_pass_router -p no:cacheprovider 2>&1 \
    | tail -3
  synth30 q30
  timeout 300 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,route-sort-w1,route-sort-w2,route-sort-w4,route-count-w4 --processes 2 \
    2>&1 | grep -E '"config"|rror|failed' | tee "$OUT/gpu170_ab.txt"
  local best
  best=$(python3 -c "import json, sys
rows = [json.loads(l) for l in open('$OUT/gpu170_ab.txt') if '\"process\"' not in l]
rows = [r for r in rows if r['config'].startswith('route-')]
name = min(rows, key=lambda r: r['us_per_step'])['config']
mode = {'count': 1, 'sort': 2}[name.split('-')[1]]
print(f'{mode},{name.split(\"-w\")[1]}')")
  echo "== fastest route: $best"
  for arg in "" "--route-ranks $best" "--route-ranks $best" ""; do
    echo "== R0 q30 ${arg:-defaults}"
    timeout 100 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $arg 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|route_ranks|Error"
  done
}

gpu171() {
  # The router's bitonic top-k on two warps as the default (fused.ROUTE_RANK_WARPS = 2):
  # the GPU tests, R0 of q30 with it and without (--route-ranks off), R0 of q30d8.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 230 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  for arg in "" "--route-ranks off"; do
    echo "== R0 q30 ${arg:-defaults}"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $arg 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|Error"
  done
  synth30 q30d8 --dense-quant int8
  echo "== R0 q30d8"; r0 q30d8
}

gpu172() {
  # The router's CUDA test with the default (a bitonic top-k on two warps) among its ways.
  python3 -m pytest tests/models/test_graphs.py -q -k one_pass_router -p no:cacheprovider 2>&1 \
    | tail -3
}

gpu173() {
  # gate/up reading guessed experts' rows before its wait (decode.GUESS_EXPERTS): the
  # CUDA tests, then each way alone in two processes on q30e8 (8 experts of 8: the fixed
  # guess 0..7 always right, the gain's bound) and q30 (128 experts: the fixed guess
  # nearly always wrong, the cost's bound; "guess" predicted from the router's rows under
  # q/k/v), then R0 of q30 with predicted guesses and without.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 150 python3 -m pytest tests/models/test_read_ahead.py tests/models/test_guess.py -q \
    -m gpu -k "guess" -p no:cacheprovider --tb=short 2>&1 | tail -4
  synth30 q30
  python3 -c "from pathlib import Path; from flint import synth as s; \
s.GEOMETRIES['q30e8'] = dict(s.GEOMETRIES['qwen3-30b-a3b'], num_experts=8); \
print(s.synth('q30e8', 'int4', Path('$DATA/q30e8.ftw')))"
  echo "== step q30e8"
  timeout 120 python3 benches/step_ab.py "$DATA/q30e8.ftw" --configs base,gu-guess --processes 2 \
    2>&1 | grep -E '"config"|rror|failed'
  echo "== step q30"
  timeout 170 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,guess,gu-guess \
    --processes 2 2>&1 | grep -E '"config"|rror|failed'
  for arg in predicted off; do
    echo "== R0 q30 --guess $arg"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      --guess $arg 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|guess|Error"
  done
}
gpu174() {
  # gate/up's guess with gate/up started earlier (the router's launches letting the next
  # start before their wait), on q30e8 (the fixed guess always right); then in-process
  # decisions re-measured alone on q30: the attention's 128 positions a step and its
  # chunks of 64, the router's norm-and-product and RoPE on two warps.
  python3 -c "from pathlib import Path; from flint import synth as s; \
s.GEOMETRIES['q30e8'] = dict(s.GEOMETRIES['qwen3-30b-a3b'], num_experts=8); \
print(s.synth('q30e8', 'int4', Path('$DATA/q30e8.ftw')))"
  echo "== step q30e8"
  timeout 200 python3 benches/step_ab.py "$DATA/q30e8.ftw" \
    --configs base,early-route,gu-guess-early,gu-guess-early2 --processes 2 \
    2>&1 | grep -E '"config"|rror|failed'
  synth30 q30
  echo "== step q30"
  timeout 200 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,attn-b128,attn-chunk64,nl-w2,rope-w2 --processes 2 \
    2>&1 | grep -E '"config"|rror|failed'
}

gpu175() {
  # The router's top-k letting gate/up start before its wait (moe_kernel.EARLY =
  # {"route"}, the default in this wheel): the GPU tests, then on q30 the step alone in
  # two processes with it and with no kernel early, then R0 alternating.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 230 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  echo "== step q30"
  timeout 120 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,no-early --processes 2 \
    2>&1 | grep -E '"config"|rror|failed'
  for arg in route none route none; do
    echo "== R0 q30 --early-kernels $arg"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      --early-kernels $arg 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|early|Error"
  done
}

gpu176() {
  # The thirty-second session: the attention's earlier keys and values asked of the L2
  # before its wait (fused.KV_ASK, by RoPE's launch or the attention's own, and with bf16
  # o's whole rows ahead), and the step's RoPE rows and mask made only where used (the
  # default in this wheel; rows-every-step is as before): the CUDA test of the asks, then
  # each configuration alone in two processes on q30.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  timeout 100 python3 -m pytest tests/models/test_graphs.py -q -m gpu -k "asking_the_l2" \
    -p no:cacheprovider --tb=short 2>&1 | tail -4
  synth30 q30
  echo "== step q30"
  timeout 330 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,rows-every-step,kv-ask-rope,kv-ask-attn,kv-ask-rope-o-whole2 --processes 2 \
    2>&1 | grep -E '"config"|rror|failed'
}

gpu177() {
  # The GPU tests with the thirty-second session's defaults (the attention's keys and
  # values asked of the L2 by RoPE's launch, the embedding read by the first norm, the
  # greedy token read from pinned memory the step writes, the cache's token record
  # written once), then on q30 each of the new defaults undone alone, two processes each
  # (embed-op undid the embedding read by the first norm: taken out after this call).
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 240 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  echo "== step q30"
  timeout 200 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,no-kv-ask,embed-op \
    --processes 2 2>&1 | grep -E '"config"|rror|failed'
}

gpu178() {
  # R0 with the thirty-second session's defaults against all three undone (the L2 asks,
  # lazy RoPE rows, the greedy token from pinned memory; the cache's token record once
  # has no switch; the embedding read by the first norm, gpu177's, was taken out),
  # alternating, then with the token copied in the stream alone; R0 of q30d8.
  synth30 q30
  local before="--kv-ask none --rows-every-step --tokens-copied"
  for args in "" "$before" "" "$before" "--tokens-copied" "--tokens-copied"; do
    echo "== R0 q30 ${args:-defaults}"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $args 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|greedy_us|Error"
  done
  synth30 q30d8 --dense-quant int8
  echo "== R0 q30d8"; r0 q30d8
}

gpu179() {
  # With the attention's keys and values in the L2 (gpu176), does it still lose to the
  # output projection's reads before its wait, and to its own bigger steps? bf16 o in
  # two tiles of 2048 columns (four or two rows a program: half its bytes read ahead,
  # against a quarter), the attention on 128 positions a step; each alone in two
  # processes on q30.
  synth30 q30
  echo "== step q30"
  timeout 300 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,o-k2048,o-b2-k2048,attn-b128 --processes 2 \
    2>&1 | grep -E '"config"|rror|failed'
}

gpu180() {
  # The MoE block's ranked sum made by the next norm's launch, eight programs in one
  # thread-block cluster adding their sums of squares through each other's shared
  # memory (fused.CLUSTER_NORM, new): its GPU tests, then on q30 the step with and
  # without it alone in two processes each, R0 both ways, alternating, and the
  # layer's timeline.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests (cluster norm)"
  timeout 150 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short \
    -rf -m gpu -k "ranked or bit_identical or serial_launch or greedy" 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  echo "== step q30"
  timeout 200 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base,no-cluster-norm \
    --processes 2 2>&1 | grep -E '"config"|rror|failed'
  for args in "" "--no-cluster-norm" "" "--no-cluster-norm"; do
    echo "== R0 q30 ${args:-defaults}"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $args 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|greedy_us|Error"
  done
  echo "== timeline q30"
  timeout 90 python3 benches/step_ab.py "$DATA/q30.ftw" --configs base --profile base \
    --timeline 20 2>&1 | grep -E 'profile_us|"layer"|rror'
}

gpu181() {
  # The cluster folds: the router's top-k made by its product's launch (eight programs
  # in one cluster, program 0 picking after the barrier: fused.CLUSTER_ROUTE, new) and
  # the ranked sum by the norm's (gpu180), the residual's store now after the exchange.
  # A chain of eight-program cluster launches exchanging one sum through shared memory
  # against plain dependent launches of eight programs; the folds' CUDA tests; on q30
  # the step with each fold undone, both, and q/k/v's programs started once the norm's
  # cluster has the ranks' rows, alone in two processes each.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== launch floor"
  timeout 60 python3 benches/launch_floor.py --programs 8 --launches 100,500 \
    --syncs pdl,cluster 2>&1 | grep -E 'programs|rror'
  echo "== GPU tests (cluster folds)"
  timeout 100 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short \
    -rf -m gpu -k "ranked or top_k or cluster" 2>&1 | grep -E "passed|failed|FAILED|Error|assert" \
    | head -20
  synth30 q30
  echo "== step q30"
  timeout 360 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,no-cluster-route,no-cluster-norm,no-cluster-folds,cluster-norm-late1 \
    --processes 2 2>&1 | grep -E '"config"|rror|failed'
}

gpu182() {
  # The cluster norm alone (the router's fold was 196 us slower in gpu181 and is taken
  # out): the step with it, without it, and with q/k/v's programs started once the
  # cluster has the ranks' rows (late1) or has exchanged (late2), alone in two processes
  # each; then R0 with it, without it and late1, alternating.
  synth30 q30
  echo "== step q30"
  timeout 300 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,no-cluster-norm,cluster-norm-late1,cluster-norm-late2 \
    --processes 2 2>&1 | grep -E '"config"|rror|failed'
  for args in "" "--no-cluster-norm" "--cluster-norm-late 1"; do
    echo "== R0 q30 ${args:-defaults}"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $args 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|greedy_us|Error"
  done
}

gpu183() {
  # The GPU tests on the session's last wheel (the ranked sum in the norm's cluster,
  # q/k/v started once the cluster has the ranks' rows: fused.CLUSTER_NORM_LATE 1),
  # then R0 with it and with q/k/v started at the cluster's wait (late0).
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 240 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  synth30 q30
  for args in "" "--cluster-norm-late 0"; do
    echo "== R0 q30 ${args:-defaults}"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $args 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|greedy_us|Error"
  done
}

gpu184() {
  # Three switches off by default, each letting a kernel's latency-bound part run with
  # less beside it: on q30 the step with the defaults, with gate/up letting down start
  # once its rows are in (gu-late, moe_kernel.GATE_UP_LATE), the attention letting o
  # start once its keys and values are in (attn-late, fused.ATTENTION_LATE) and the
  # cluster norm's sums of squares exchanged through asynchronous stores (cluster-async,
  # fused.CLUSTER_ASYNC), alone in two processes each; before it, a chain of cluster
  # launches with either exchange against plain dependent launches of eight programs.
  echo "== launch floor"
  timeout 60 python3 benches/launch_floor.py --programs 8 --launches 100,500 \
    --syncs pdl,cluster,cluster-async 2>&1 | grep -E 'programs|rror'
  synth30 q30
  echo "== step q30"
  timeout 400 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,gu-late,attn-late,cluster-async --processes 2 2>&1 | grep -E '"config"|rror|failed'
}

# gpu185-187 ran benches/bulk_reads.py, taken out after gpu187 (its bulk and descriptor
# copies faulted or summed wrong; 644cc75 has it).
gpu185() {
  # The GPU tests with the cluster norm's asynchronous exchange on by default
  # (fused.CLUSTER_ASYNC; gu-late and attn-late taken out after gpu184), rows learnt
  # after the wait by ordinary loads against one bulk copy a program (bulk_reads.py,
  # new), then R0 on q30 with the defaults and with the barrier exchange, alternating.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 240 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | head -20
  echo "== bulk reads"
  for w in 2 4; do
    timeout 60 python3 benches/bulk_reads.py --warps $w 2>&1 | grep -E 'mode|rror' | tail -4
  done
  synth30 q30
  for args in "" "--cluster-barrier" "" "--cluster-barrier"; do
    echo "== R0 q30 ${args:-defaults}"
    timeout 80 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $args 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|greedy_us|Error"
  done
}

gpu186() {
  # The GPU tests again (gpu185's lacked shared/templates, carried now), then rows learnt
  # after the wait read by ordinary loads or by a tensor descriptor's copy (Triton's
  # own), and the hand-written bulk copy alone in its process (it faulted in gpu185).
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"; timeout 260 python3 -m pytest tests -q -p no:cacheprovider --tb=short -rf \
    -m gpu --ignore=tests/server --ignore=tests/chat 2>&1 \
    | grep -E "passed|failed|FAILED|Error|assert" | tail -25
  echo "== bulk reads"
  for w in 2 4; do
    timeout 60 python3 benches/bulk_reads.py --warps $w --modes ldg,tma 2>&1 | grep -E 'mode|rror' | tail -4
  done
  timeout 60 python3 benches/bulk_reads.py --modes bulk 2>&1 | grep -E 'mode|rror' | tail -3
}

gpu187() {
  # The cluster norm's next-kernel start (late0/1/2) again with the asynchronous
  # exchange, alone in two processes each; then where bulk_reads' copies fault
  # (gpu185-186): each mode in its own process, with and without dependent launch, a
  # 1 GiB pool.
  synth30 q30
  echo "== step q30"
  timeout 240 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,cluster-norm-late0,cluster-norm-late2 --processes 2 2>&1 | grep -E '"config"|rror|failed'
  echo "== bulk reads"
  for m in ldg tma bulk; do
    for p in "" "--no-pdl"; do
      echo "-- $m $p"
      timeout 40 python3 benches/bulk_reads.py --modes $m --pool-gib 1 $p 2>&1 | grep -E 'mode|Error|line [0-9]' | tail -4
    done
  done
}

gpu188() {
  # q/k/v started at the cluster norm's wait (fused.CLUSTER_NORM_LATE 0, the default now:
  # faster than 1 in gpu187's step A/B with the asynchronous exchange): the cluster and
  # dependent-launch GPU tests, then R0 on q30 with the defaults and with late1,
  # alternating.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests (cluster, dependent launch)"
  timeout 110 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short -rf \
    -m gpu -k "cluster or dependent_launch" 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | tail -8
  synth30 q30
  for args in "" "--cluster-norm-late 1" "" "--cluster-norm-late 1"; do
    echo "== R0 q30 ${args:-defaults}"
    timeout 62 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $args 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|greedy_us|Error"
  done
}

gpu189() {
  # The router's top-k made by its product's launch again (fused.CLUSTER_ROUTE 16 on
  # four warps by default at 1a696b3, off since; the logits sent into program 0's
  # shared memory by asynchronous stores): the cluster, router and dependent-launch GPU tests (the
  # latter with 4fbfdce's late1/late2 parameters, not run on a GPU before), then the
  # step alone in two processes each: the defaults, the top-k's own launch, 16 programs
  # on eight warps.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests (cluster, router, dependent launch)"
  timeout 150 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short -rf \
    -m gpu -k "cluster or routers_top_k or dependent_launch" 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | tail -12
  synth30 q30
  echo "== step q30"
  timeout 230 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,no-cluster-route,cluster-route16-w8 --processes 2 2>&1 | grep -E '"config"|rror|failed'
}

gpu190() {
  # The router's cluster fold off again (gpu189: 11.7 us a step slower): every GPU test,
  # then R0 on q30 with the defaults and with the fold (16 programs), alternating.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"
  timeout 260 python3 -m pytest tests -m gpu --ignore=tests/server --ignore=tests/chat -q \
    -p no:cacheprovider --tb=short -rf 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12
  synth30 q30
  for args in "" "--cluster-route 16" "" "--cluster-route 16"; do
    echo "== R0 q30 ${args:-defaults}"
    timeout 62 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $args 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|greedy_us|Error"
  done
}

gpu191() {
  # q/k/v's norm and RoPE made by the attention's launch, one program a query head
  # (fused.HEAD_ATTENTION, on by default in this wheel): the step alone in two processes
  # each against the two launches, two of that launch's shapes once each, one R0 pair,
  # then the GPU tests of the captured step. Slower (docs/benchmarks.md, "Thirty-sixth
  # session"): the launch, its tests and its configs were taken out by the revert of
  # 699207f and 4193960, so this runs only on a checkout of 4193960.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  synth30 q30
  echo "== step q30"
  timeout 170 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs base,no-head-attention --processes 2 2>&1 | grep -E '"config"|rror|failed'
  timeout 90 python3 benches/step_ab.py "$DATA/q30.ftw" \
    --configs head-attn-w8-b64,head-attn-w4-b128 --processes 1 2>&1 | grep -E '"config"|rror|failed'
  for args in "" "--no-head-attention"; do
    echo "== R0 q30 ${args:-defaults}"
    timeout 62 python3 benches/graph_decode.py "$DATA/q30.ftw" --tokens 128 --reps 2 --modes on \
      $args 2>&1 | grep -E "tg_tok|_sd|roofline|copy_gb|replay_us|greedy_us|Error"
  done
  echo "== GPU tests (graphs)"
  timeout 130 python3 -m pytest tests/models/test_graphs.py -q -p no:cacheprovider --tb=short -rf \
    -m gpu 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | tail -12
}

gpu192() {
  # After the head attention fold was taken out (HEAD's code is 4212965's): every GPU
  # test, then R0 on q30 twice and on q30d8 once, the lines the docs keep.
  [ -e ../shared ] || ln -s "$PWD/.device/shared" ../shared
  echo "== GPU tests"
  timeout 300 python3 -m pytest tests -m gpu --ignore=tests/server --ignore=tests/chat -q \
    -p no:cacheprovider --tb=short -rf 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12
  synth30 q30
  for i in 1 2; do echo "== R0 q30 ($i)"; r0 q30; done
  synth30 q30d8 --dense-quant int8
  echo "== R0 q30d8"; r0 q30d8
}

case $what in
  install) install ;;
  gpu192) install; gpu192 ;;
  gpu191) install; gpu191 ;;
  gpu190) install; gpu190 ;;
  gpu189) install; gpu189 ;;
  gpu188) install; gpu188 ;;
  gpu187) install; gpu187 ;;
  gpu186) install; gpu186 ;;
  gpu185) install; gpu185 ;;
  gpu184) install; gpu184 ;;
  gpu183) install; gpu183 ;;
  gpu182) install; gpu182 ;;
  gpu181) install; gpu181 ;;
  gpu180) install; gpu180 ;;
  gpu179) install; gpu179 ;;
  gpu178) install; gpu178 ;;
  gpu177) install; gpu177 ;;
  gpu176) install; gpu176 ;;
  gpu175) install; gpu175 ;;
  gpu174) install; gpu174 ;;
  gpu173) install; gpu173 ;;
  gpu172) install; gpu172 ;;
  gpu171) install; gpu171 ;;
  gpu170) install; gpu170 ;;
  gpu169) install; gpu169 ;;
  gpu168) install; gpu168 ;;
  gpu167) install; gpu167 ;;
  gpu166) install; gpu166 ;;
  gpu165) install; gpu165 ;;
  gpu164) install; gpu164 ;;
  gpu163) install; gpu163 ;;
  gpu162) install; gpu162 ;;
  gpu161) install; gpu161 ;;
  gpu160) install; gpu160 ;;
  gpu159) install; gpu159 ;;
  gpu158) install; gpu158 ;;
  gpu157) install; gpu157 ;;
  gpu156) install; gpu156 ;;
  gpu155) install; gpu155 ;;
  gpu154) install; gpu154 ;;
  gpu153) install; gpu153 ;;
  gpu152) install; gpu152 ;;
  gpu151) install; gpu151 ;;
  gpu150) install; gpu150 ;;
  gpu149) install; gpu149 ;;
  gpu148) install; gpu148 ;;
  gpu147) install; gpu147 ;;
  gpu146) install; gpu146 ;;
  gpu145) install; gpu145 ;;
  gpu144) install; gpu144 ;;
  gpu143) install; gpu143 ;;
  gpu142) install; gpu142 ;;
  gpu141) install; gpu141 ;;
  gpu140) install; gpu140 ;;
  gpu139) install; gpu139 ;;
  gpu138) install; gpu138 ;;
  gpu137) install; gpu137 ;;
  gpu136) install; gpu136 ;;
  gpu135) install; gpu135 ;;
  gpu134) install; gpu134 ;;
  gpu133) install; gpu133 ;;
  gpu132) install; gpu132 ;;
  gpu131) install; gpu131 ;;
  gpu130) install; gpu130 ;;
  gpu129) install; gpu129 ;;
  gpu128) install; gpu128 ;;
  gpu127) install; gpu127 ;;
  gpu126) install; gpu126 ;;
  gpu125) install; gpu125 ;;
  gpu124) install; gpu124 ;;
  gpu123) install; gpu123 ;;
  gpu122) install; gpu122 ;;
  gpu121) install; gpu121 ;;
  gpu120) install; gpu120 ;;
  gpu119) install; gpu119 ;;
  gpu118) install; gpu118 ;;
  gpu117) install; gpu117 ;;
  gpu116) install; gpu116 ;;
  gpu115) install; gpu115 ;;
  gpu114) install; gpu114 ;;
  gpu113) install; gpu113 ;;
  gpu112) install; gpu112 ;;
  gpu111) install; gpu111 ;;
  gpu110) install; gpu110 ;;
  gpu109) install; gpu109 ;;
  gpu108) install; gpu108 ;;
  gpu107) install; gpu107 ;;
  gpu106) install; gpu106 ;;
  gpu105) install; gpu105 ;;
  gpu104) install; gpu104 ;;
  gpu103) install; gpu103 ;;
  gpu102) install; gpu102 ;;
  gpu101) install; gpu101 ;;
  gpu100) install; gpu100 ;;
  gpu99) install; gpu99 ;;
  gpu98) install; gpu98 ;;
  gpu97) install; gpu97 ;;
  gpu96) install; gpu96 ;;
  gpu95) install; gpu95 ;;
  gpu94) install; gpu94 ;;
  gpu93) install; gpu93 ;;
  gpu92) install; gpu92 ;;
  gpu91) install; gpu91 ;;
  gpu90) install; gpu90 ;;
  gpu89) install; gpu89 ;;
  gpu88) install; gpu88 ;;
  gpu87) install; gpu87 ;;
  gpu86) install; gpu86 ;;
  gpu85) install; gpu85 ;;
  gpu84) install; gpu84 ;;
  format) install; format ;;
  io) io ;;
  tests) tests ;;
  all) install; format; io; tests ;;
  gpu6) install; gpu6 ;;
  stream) install; stream ;;
  vram) install; vram ;;
  gpu7a) install; gpu7a ;;
  gpu7b) gpu7b ;;
  gputests) install; gputests ;;
  gpu14) install; gpu14 ;;
  gpu9) install; gpu9 ;;
  gpu10) install; gpu10 ;;
  gpu10k) install; gpu10k ;;
  gpu10r) install; gpu10r ;;
  gpu11) install; gpu11 ;;
  gpu12) install; gpu12 ;;
  gpu13) install; gpu13 ;;
  gpu15) install; gpu15 ;;
  gpu16) install; gpu16 ;;
  gpu17) install; gpu17 ;;
  gpu18) install; gpu18 ;;
  gpu19) install; gpu19 ;;
  gpu20) install; gpu20 ;;
  gpu21) install; gpu21 ;;
  gpu22) install; gpu22 ;;
  gpu23) install; gpu23 ;;
  gpu24) install; gpu24 ;;
  gpu25) install; gpu25 ;;
  gpu26) install; gpu26 ;;
  gpu27) install; gpu27 ;;
  gpu28) install; gpu28 ;;
  gpu29) install; gpu29 ;;
  gpu30) install; gpu30 ;;
  gpu31) install; gpu31 ;;
  gpu32) install; gpu32 ;;
  gpu33) install; gpu33 ;;
  gpu34) install; gpu34 ;;
  gpu35) install; gpu35 ;;
  gpu36) install; gpu36 ;;
  gpu37) install; gpu37 ;;
  gpu38) install; gpu38 ;;
  gpu39) install; gpu39 ;;
  gpu40) install; gpu40 ;;
  gpu41) install; gpu41 ;;
  gpu42) install; gpu42 ;;
  gpu43) install; gpu43 ;;
  gpu44) install; gpu44 ;;
  gpu45) install; gpu45 ;;
  gpu46) install; gpu46 ;;
  gpu47) install; gpu47 ;;
  gpu48) install; gpu48 ;;
  gpu49) install; gpu49 ;;
  gpu50) install; gpu50 ;;
  gpu51) install; gpu51 ;;
  gpu52) install; gpu52 ;;
  gpu53) install; gpu53 ;;
  gpu54) install; gpu54 ;;
  gpu55) install; gpu55 ;;
  gpu56) install; gpu56 ;;
  gpu57) install; gpu57 ;;
  gpu58) install; gpu58 ;;
  gpu59) install; gpu59 ;;
  gpu60) install; gpu60 ;;
  gpu61) install; gpu61 ;;
  gpu62) install; gpu62 ;;
  gpu63) install; gpu63 ;;
  gpu64) install; gpu64 ;;
  gpu65) install; gpu65 ;;
  gpu66) install; gpu66 ;;
  gpu67) install; gpu67 ;;
  gpu68) install; gpu68 ;;
  gpu69) gpu69 ;;
  gpu70) gpu70 ;;
  gpu71) gpu71 ;;
  gpu72) install; gpu72 ;;
  gpu73) install; gpu73 ;;
  gpu74) gpu74 ;;
  gpu75) install; gpu75 ;;
  gpu76) gpu76 ;;
  gpu77) gpu77 ;;
  gpu78) install; gpu78 ;;
  gpu79) install; gpu79 ;;
  gpu80) install; gpu80 ;;
  gpu81) install; gpu81 ;;
  gpu82) install; gpu82 ;;
  gpu83) install; gpu83 ;;
esac 2>&1 | tee "$OUT/gpu_box_$what.log"

