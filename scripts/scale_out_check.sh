#!/usr/bin/env bash
# One sweep in one process against the same sweep as shards (harness launch): wall time of each and
# whether the merged outputs are byte-identical. Model: a random Qwen2 checkpoint built here
# (tests/helpers/tiny_lm.py; no download); text: pydoc's topics. Everything goes under a temporary folder.
#
#   bash scripts/scale_out_check.sh                      # 2 GPUs: harness launch --gpus 0,1
#   LAUNCH="--procs 2" bash scripts/scale_out_check.sh   # 2 CPU processes
# Sizes: L layers, H hidden, N prompts, CTX tokens per prompt (defaults 16, 512, 8, 2048).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.
PY=${PY:-python3}; L=${L:-16}; H=${H:-512}; N=${N:-8}; CTX=${CTX:-2048}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
$PY - "$W" <<EOF || exit 1
import sys
from pathlib import Path
import pydoc_data.topics as t
from helpers.tiny_lm import save_tiny_checkpoint
w = Path(sys.argv[1])
save_tiny_checkpoint(w / "ck", layers=$L, hidden=$H, heads=8, kv_heads=2, head_dim=64)
(w / "t.txt").write_text("\n\n".join(t.topics[k] for k in sorted(t.topics)))
EOF
ARGS="--model hf --model-path $W/ck --task perplexity --prompts $W/t.txt --limit $N --codec octopus turboquant-mse --bits 2 3 --codec-seeds 0 1 --residual 8 --task-opt perplexity.context=$CTX --task-opt perplexity.prefix=256 --quiet"
s=$(date +%s%N); $PY -m harness.cli run $ARGS --out "$W/one" || exit 1; e=$(date +%s%N)
echo "one process: $(( (e - s) / 1000000 )) ms"
s=$(date +%s%N); $PY -m harness.cli launch ${LAUNCH:---gpus 0,1} -- $ARGS --out "$W/shards" || exit 1; e=$(date +%s%N)
echo "shards (${LAUNCH:---gpus 0,1}): $(( (e - s) / 1000000 )) ms"
rc=0
# report.md's speed section is measured (harness/report/speed.py): compared without it
shared_part() { $PY -c "import sys; from harness.report.speed import without_speed; sys.stdout.write(without_speed(open(sys.argv[1]).read()))" "$1"; }
for f in rows.jsonl summary.json report.md config.json; do
  if cmp -s <(shared_part "$W/one/$f") <(shared_part "$W/shards/$f"); then echo "$f identical"; else echo "$f DIFFERS"; rc=1; fi
done
echo "rows: $(wc -l < "$W/one/rows.jsonl")"
exit $rc
