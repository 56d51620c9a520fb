#!/usr/bin/env bash
# The README's main job: installs what is missing, shows a trainer publishing a short run
# to the embedded default store (a directory) while two regions follow it, then benchmarks
# arc_v3 against the published codecs on the built-in generator's realistic RL deltas (0.2%, 2% and 10%
# changed), with the entropy bounds and the memcpy ceiling. Writes bench_out/arc_bench.{json,csv,png}.
# Extra arguments go to arc_bench (see `bazel-bin/bench/arc_bench --help`), e.g.
#   bench/main_job.sh --dir /path/to/run_with_step_NNN.safetensors
set -euo pipefail
cd "$(dirname "$0")/.."
third_party/install_deps.sh
bazel build //bench:arc_bench //tools/cli:arc_v3_cli
# The product first: a trainer publishing a short run, regions following it.
bench/sync_demo.sh
mkdir -p bench_out
bazel-bin/bench/arc_bench --generated --quick --json bench_out/arc_bench.json \
  --csv bench_out/arc_bench.csv --chart bench_out/arc_bench.png "$@"
