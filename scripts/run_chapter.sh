#!/usr/bin/env bash
# Train the chapter's four runs (residual / no residual, 4 and 8 blocks; 10 epochs each), then draw the
# chapter's loss figure and table from their TensorBoard logs, the book's values beside ours.
#   bash scripts/run_chapter.sh                 # all four, then the comparison
#   bash scripts/run_chapter.sh residual        # just some of them
# Extra arguments after `--` go to every `fit`, e.g. `-- --trainer.precision bf16-mixed`.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do runs+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#runs[@]} -gt 0 ] || runs=(residual no_residual residual_8 no_residual_8)
i=0
for run in "${runs[@]}"; do
  i=$((i + 1))
  echo "=== [$i/${#runs[@]}] python -m gpt_lit fit --config configs/$run.yaml $*"
  start=$(date +%s)
  python -m gpt_lit fit --config "configs/$run.yaml" "$@"
  echo "=== $run finished in $(( $(date +%s) - start )) s"
done
python scripts/compare_runs.py "${runs[@]/#/lightning_logs/}" --out lightning_logs/chapter_losses.png
