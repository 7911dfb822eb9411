#!/usr/bin/env bash
# CPU box A/B of two builds of flint, two rounds alternating: the tiny-code-moe int4
# prompt, T0 and C1 (docs/benchmarks.md, "Thirteenth session").
# Usage: bash benches/cpu_ab.sh BEFORE_DIR AFTER_DIR MODEL_DIR
#   *_DIR: a wheel installed with `pip install --no-deps --target DIR flint-*.whl`
#   MODEL_DIR: holds tcm-int4.ftw and tcm.ftw (`flint convert` of tiny-code-moe with
#   `--quant int4` and without) and c1.ftw (`flint synth --geometry demo --quant int4`).
set -uo pipefail
before=$1 after=$2
cd "$3" || exit 1
for r in 1 2; do
  for w in before after; do
    dir=$before; [ $w = after ] && dir=$after
    echo "== round $r $w pp512 tcm-int4"
    PYTHONPATH=$dir python3 -m flint bench tcm-int4.ftw --mode resident -p 512 -n 0 -r 3 -t 2 \
      --device cpu 2>&1 | grep -E "tcm-int4.ftw \||rror"
    echo "== round $r $w T0 tcm"
    PYTHONPATH=$dir python3 -m flint bench tcm.ftw --mode resident -t 2 2>&1 | grep -E "tcm.ftw \||rror"
    echo "== round $r $w C1"
    PYTHONPATH=$dir python3 -m flint bench c1.ftw --mode resident,full,naive -p 0 -n 32 -r 3 \
      --tg-random --ram-budget 0.422 -t 2 2>&1 | grep -E "c1.ftw \||rror"
  done
done
