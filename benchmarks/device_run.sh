#!/usr/bin/env bash
# One full call on the GPU machine (the `device` tool's H200): install jax_mla, run the GPU tests,
# the benchmark (its table), then optionally compute-sanitizer on small cases.
#
#   bash benchmarks/device_run.sh [all|tests|bench|fp8|sanitize|ncu|ab|ncusrc|xladump|tmabw|gatherprobe|raceprobe|stats|peers|peersncu|sparse|multigpu]...   (default: tests bench; run in that order)
# Environment: AB_WHEELS (other wheels to install for A/B variants, below), TESTS_TIMEOUT, BENCH_TIMEOUT (default 420 s: the full benchmark with --xla took more than
# 240 s on an H200; its JSON is written after every config, so a cut keeps the finished rows), BENCH_ARGS (default --xla), SANITIZE_TIMEOUT,
# SANITIZE_TOOLS (default "memcheck racecheck"), TESTS_ARGS (extra pytest arguments, split on
# spaces, given beside the tests/ folder: a file named here adds to it, it does not narrow the run; --ignore=PATH drops one; a -k expression must be one word; TESTS_K is passed whole as one -k expression), BENCH_TAG (results file bench-TAG.json, for several
# benchmark runs in one call), NCU_CONFIGS (benchmark configs to profile, default: the two low-latency ones and b128/4K).
# fp8: the FP8 cache against the bf16 one, in turn in one process (bench_decode.py --cache both,
# issue #36); FP8_ARGS (e.g. "--only b64_sq1_h16,b1_"), FP8_TIMEOUT (default 420 s).
# sparse: jax_mla.mla_decode_sparse against FlashMLA's SM90 sparse FP8 decode (issue #37,
# benchmarks/bench_sparse.py; carry .peers/lib/flashmla_sparse.so and .peers/lib/PINS, or .peers/src
# to build it here); SPARSE_ARGS (e.g. "--only h128 --attn-sink"), SPARSE_TIMEOUT (default 540 s).
#
# Install: a wheel carried in .whl-dist/ (built on the CPU machine, see docs/performance.md) when it
# imports there; otherwise a build on the spot with --no-build-isolation (the GPU machine has no
# network; it has nvcc, cmake, ninja, nanobind, scikit-build-core and jax with the CUDA plugin).
# Logs go to $OUT (or ./device-out) so they come back even when a step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The device tool returns at most 8 files: the logs and result JSONs (bench*.json, ab-N.json) travel
# as one archive per invocation (logs.tgz, logs-2.tgz, ...), so several invocations fit in one call.
pack_logs() {
  (cd "$OUT" && ls *.log >/dev/null 2>&1 || exit 0
   name=logs.tgz; n=2; while [ -e "$name" ]; do name="logs-$n.tgz"; n=$((n + 1)); done
   extra=$(ls *.csv *.json 2>/dev/null)
   tar czf "$name" *.log $extra && rm -f *.log $extra) || true
}
trap pack_logs EXIT
# -P everywhere: the checkout's jax_mla/ (no compiled module) must not shadow the installed one.
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests bench)
status=0

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
python3 -P -c "import jax; print('jax', jax.__version__, jax.devices())"

echo "== install"
SITE=/tmp/jax_mla_site
rm -rf "$SITE"; mkdir -p "$SITE"
installed=0
if ls .whl-dist/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target "$SITE" .whl-dist/jax_mla-*.whl &&
    PYTHONPATH="$SITE" python3 -P -c "import jax_mla._ext as e; assert e.has_cuda(); print('prebuilt wheel ok, sms', e.cuda_sm_count())" &&
    installed=1
fi
if [ $installed = 0 ]; then
  ls .whl-dist/*.whl >/dev/null 2>&1 || echo "no .whl-dist/*.whl here (the device tool carries it only when the run names it in carry)"
  echo "building on the device (no usable prebuilt wheel)"
  rm -rf "$SITE"; mkdir -p "$SITE"
  t0=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL=16 JAX_MLA_CUDA=ON python3 -m pip install -q --no-deps --no-build-isolation \
      --target "$SITE" . > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export JAX_MLA_REQUIRE_GPU=1

# Other builds for A/B variants: each folder of AB_WHEELS (e.g. ".whl-pf .whl-zero", carried by the
# run) is installed at /tmp/site-NAME (NAME = the folder without ".whl-"), for variants such as
# AB_VARIANTS="X=main PYTHONPATH=/tmp/site-pf".
for d in ${AB_WHEELS:-}; do
  n=${d#.whl-}; rm -rf "/tmp/site-$n"
  if python3 -m pip install -q --no-deps --no-index --target "/tmp/site-$n" "$d"/jax_mla-*.whl; then
    echo "installed $d at /tmp/site-$n"
  else
    echo "could not install $d (carried?)"; status=1
  fi
done

# A hung kernel must not eat the whole lease: every step runs under a timeout, and a failed
# smoke test stops the run.
echo "== smoke"
timeout 120 python3 tests/gpu/gpu_sanitize_cases.py || { echo "smoke test failed or hung (exit $?)"; exit 1; }

run_tests() {
  echo "== GPU tests"
  timeout "${TESTS_TIMEOUT:-540}" python3 -P -m pytest -q -m gpu -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} ${TESTS_ARGS:-} tests 2>&1 | tee "$OUT/tests.log" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}

# The SM clock and power during a step: nvidia-smi every 100 ms in the background
# (clock_probe_start), then (clock_probe_report) the median and lowest SM clock, the highest power
# and the clock-event (throttle) reasons seen, over all samples and over those drawing more than
# 300 W, so the clocks of a loop are measured rather than assumed (ncu's cycle counts are SM
# clocks). On 2026-12-03 no sample exceeded 300 W: nvidia-smi's power reading is
# averaged, so short bursts of work do not show as busy samples.
clock_probe_start() {
  (nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader,nounits -lms 100 \
     > "$OUT/clocks-$1.log" 2>&1 &)
}
clock_probe_report() {
  pkill -f "nvidia-smi --query-gpu=clocks.sm" || true
  python3 - "$OUT/clocks-$1.log" "$1" <<'PYEOF'
import collections, sys
rows = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    try:
        rows.append((int(f[0]), float(f[1]), f[2] if len(f) > 2 else "?"))
    except (ValueError, IndexError):
        pass
def summary(sel):
    clk = sorted(r[0] for r in sel)
    why = collections.Counter(r[2] for r in sel).most_common(3)
    return (f"{len(sel)} samples: SM clock median {clk[len(clk) // 2]} MHz (min {clk[0]}), "
            f"power max {max(r[1] for r in sel):.0f} W; clock-event reasons {why}")
if not rows:
    print(f"# clocks ({sys.argv[2]}): no samples (see {sys.argv[1]})")
else:
    busy = [r for r in rows if r[1] > 300]
    print(f"# clocks ({sys.argv[2]}): all {summary(rows)}")
    print(f"# clocks ({sys.argv[2]}): above 300 W, " + (summary(busy) if busy else "no samples"))
PYEOF
}

# fresh_name BASE: BASE, or BASE-2, BASE-3, ... whichever has no .json or .log in $OUT yet, so a step
# named twice in one call (bench peers bench peers) keeps both runs' results.
fresh_name() {
  local name="$1" n=2
  while [ -e "$OUT/$name.json" ] || [ -e "$OUT/$name.log" ]; do name="$1-$n"; n=$((n + 1)); done
  echo "$name"
}

run_bench() {
  echo "== benchmark"
  local name; name=$(fresh_name "bench${BENCH_TAG:+-$BENCH_TAG}")
  clock_probe_start bench
  timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/bench_decode.py ${BENCH_ARGS:---xla} --json "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log" | grep -v "^#" | tail -20
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  clock_probe_report bench
}

# FlashMLA and FlashAttention-3 against jax_mla in one process (benchmarks/bench_peers.py). The
# peers come from benchmarks/peers/build.sh: carried in .peers/lib (built on the CPU machine against
# torch 2.11.0+cu130, the device's), else built here from a carried .peers/src (~2 min on 16 cores).
# PEERS_ARGS: extra bench_peers.py arguments (e.g. --only b16,b1_).
run_peers() {
  echo "== jax_mla against FlashMLA and FlashAttention-3 (one process)"
  if ! ls .peers/lib/flashmla_dense.so .peers/lib/fa3_mla.so >/dev/null 2>&1; then
    [ -f .peers/src/PINS ] || { echo "carry .peers/lib or .peers/src (benchmarks/peers/README.md)"; status=1; return; }
    PEERS="dense fa3" JOBS=16 bash benchmarks/peers/build.sh > "$OUT/peers-build.log" 2>&1 ||
      { tail -30 "$OUT/peers-build.log"; status=1; return; }
  fi
  if [ -z "${PEERS_VARIANTS:-}" ]; then
    local name; name=$(fresh_name peers)
    timeout "${PEERS_TIMEOUT:-540}" python3 -P benchmarks/bench_peers.py ${PEERS_ARGS:-} --json "$OUT/$name.json" 2>&1 |
      tee "$OUT/$name.log" | tail -30
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    return
  fi
  # A/B of jax_mla builds against the same peers: one process per variant, in the order given
  # (A B A B shows the drift between processes); e.g. PEERS_VARIANTS="PYTHONPATH=/tmp/site-base X=new"
  # with AB_WHEELS=.whl-base. The table compares each variant's jax_mla / FlashMLA ratio, which the
  # peers in the same process anchor.
  local i=0 tags=()
  for v in $PEERS_VARIANTS; do
    i=$((i + 1)); tags+=("$v")
    with_variant "$v" timeout "${PEERS_TIMEOUT:-540}" python3 -P benchmarks/bench_peers.py ${PEERS_ARGS:-} \
      --label "$v" --json "$OUT/peers-ab-$i.json" > "$OUT/peers-ab-$i.log" 2>&1 ||
      { echo "variant $v failed (exit $?)"; tail -5 "$OUT/peers-ab-$i.log"; status=1; }
  done
  python3 - "$OUT" "${tags[@]}" <<'PYEOF'
import json, os, sys
out, tags = sys.argv[1], sys.argv[2:]
runs = [json.load(open(os.path.join(out, f"peers-ab-{i}.json"))) if os.path.exists(os.path.join(out, f"peers-ab-{i}.json"))
        else None for i in range(1, len(tags) + 1)]
for i, tag in enumerate(tags, 1):
    print(f"# variant {i}: {tag}")
print("jax_mla us (jax_mla / FlashMLA) per variant")
names = [r["name"] for r in next(r for r in runs if r)["rows"]]
for name in names:
    cells = []
    for run in runs:
        row = next((r for r in run["rows"] if r["name"] == name), None) if run else None
        cells.append(f"{row['us']['jax_mla']:8.1f} ({row['us']['jax_mla'] / row['us']['flashmla']:.3f})" if row else " " * 16)
    print(f"{name:<26} " + "  ".join(cells))
PYEOF
}

# The FP8 cache against the bf16 cache of the same rows, in turn in one process (issue #36).
run_fp8() {
  echo "== FP8 cache against bf16 (bench_decode.py --cache both)"
  local name; name=$(fresh_name fp8)
  clock_probe_start fp8
  timeout "${FP8_TIMEOUT:-420}" python3 benchmarks/bench_decode.py --cache both ${FP8_ARGS:-} --json "$OUT/$name.json" 2>&1 |
    tee "$OUT/$name.log" | grep -v "^#" | tail -26
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  clock_probe_report fp8
}

# jax_mla's sparse decode against FlashMLA's SM90 sparse FP8 decode in one process
# (benchmarks/bench_sparse.py: b128, h_q 128 / 64, s_q 1 / 2, topk 2048, contexts 32K / 64K). The peer
# comes from PEERS=sparse benchmarks/peers/build.sh: carried in .peers/lib (with PINS), else built here
# from a carried .peers/src (two heavy compiles). SPARSE_ARGS: extra bench_sparse.py arguments.
# SPARSE_VARIANTS (as AB_VARIANTS, e.g. "X=main PYTHONPATH=/tmp/site-exp JAX_MLA_KERNEL=portable"):
# the benchmark once per variant, each a process of its own (FlashMLA in every one: the yardstick
# between processes).
run_sparse() {
  echo "== jax_mla.mla_decode_sparse against FlashMLA's sparse FP8 decode (one process)"
  if ! ls .peers/lib/flashmla_sparse.so .peers/lib/PINS >/dev/null 2>&1; then
    [ -f .peers/src/PINS ] || { echo "carry .peers/lib/flashmla_sparse.so and PINS, or .peers/src (benchmarks/peers/README.md)"; status=1; return; }
    PEERS=sparse JOBS=16 bash benchmarks/peers/build.sh > "$OUT/sparse-build.log" 2>&1 ||
      { tail -30 "$OUT/sparse-build.log"; status=1; return; }
  fi
  local name v
  clock_probe_start sparse
  for v in ${SPARSE_VARIANTS:-X=default}; do
    name=$(fresh_name sparse)
    echo "-- variant $v ($name)"
    with_variant "$v" timeout "${SPARSE_TIMEOUT:-540}" python3 -P benchmarks/bench_sparse.py ${SPARSE_ARGS:-} \
      --json "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log" | tail -${SPARSE_TAIL:-24}
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  clock_probe_report sparse
}

# ncu of one call of each kernel (FlashMLA, FA3, jax_mla: every kernel they launch) on the same
# config in one process, side by side (bench_peers.py --profile): NCU_CONFIGS (default b16/1K,
# b1/32K and b128/4K). Reports ncu_peers_CFG.ncu-rep come back as files; the log has a line a kernel.
run_peersncu() {
  echo "== ncu: jax_mla and its peers, one call each"
  for cfg in ${NCU_CONFIGS:-b16_sq1_h128_1k b1_sq1_h128_32k b128_sq1_h128_4k}; do
    timeout 240 ncu --profile-from-start off --clock-control none --section SpeedOfLight --section LaunchStats \
      --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section ComputeWorkloadAnalysis -f -o "$OUT/ncu_peers_$cfg" \
      python3 -P benchmarks/bench_peers.py --only "$cfg" --profile > "$OUT/ncu_peers_$cfg.log" 2>&1
    echo "-- $cfg (exit $?)"
    ncu -i "$OUT/ncu_peers_$cfg.ncu-rep" --page raw --csv --metrics \
      gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_issued.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
      > "$OUT/ncu_peers_$cfg.csv" 2>&1
    python3 - "$OUT/ncu_peers_$cfg.csv" <<'PYEOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    print("".join(",".join(r) for r in rows[:5])); sys.exit()
h = rows[head]
col = lambda r, name: r[h.index(name)] if name in h else "?"
for r in rows[head + 2:]:
    print(f"  {col(r, 'Kernel Name')[:60]:<60} {col(r, 'gpu__time_duration.sum'):>9} ns  grid {col(r, 'launch__grid_size'):>5}"
          f" blk {col(r, 'launch__block_size'):>4} regs {col(r, 'launch__registers_per_thread'):>4}"
          f" dram% {col(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):>6}"
          f" sm% {col(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):>6}"
          f" issue% {col(r, 'sm__inst_issued.avg.pct_of_peak_sustained_active'):>6}"
          f" gmma% {col(r, 'sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active'):>6}")
PYEOF
  done
}

# Issue #8, on a machine with several GPUs: the sharding checks of tests/api/sharding_worker.py on the
# GPUs (data and tensor parallel, 2-D mesh, schedules, export, the KV-cache update: results against
# one device and the reference, no collective in the compiled HLO), then benchmarks/bench_sharded.py
# (per-device throughput of the large configs against one GPU; bit-identity with one GPU).
# NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the device notes ask.
run_multigpu() {
  local n; n=$(nvidia-smi -L | wc -l)
  echo "== multi-GPU ($n GPUs)"
  [ "$n" -ge 2 ] || { echo "needs two or more GPUs"; status=1; return; }
  NCCL_NVLS_ENABLE=0 JAX_MLA_SHARDING_DEVICES=$n timeout "${MULTIGPU_TIMEOUT:-300}" python3 -P tests/api/sharding_worker.py \
    "$OUT/sharding_gpu.json" 2>&1 | tee "$OUT/sharding_gpu.log" | tail -20
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  NCCL_NVLS_ENABLE=0 timeout "${MULTIGPU_TIMEOUT:-300}" python3 -P benchmarks/bench_sharded.py --devices "$n" \
    ${SHARDED_ARGS:-} --json "$OUT/sharded.json" 2>&1 | tee "$OUT/sharded.log" | tail -12
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}

run_sanitize() {
  echo "== compute-sanitizer (small cases)"
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool $tool --target-processes all --error-exitcode 99 \
      python3 tests/gpu/gpu_sanitize_cases.py > "$OUT/sanitize_$tool.log" 2>&1
    rc=$?
    echo "$tool: exit $rc"; tail -5 "$OUT/sanitize_$tool.log"
    [ $rc = 0 ] || status=1
  done
}

# Per-kernel GPU time (scheduler, decode, combine) of one call per config, and the decode kernel's
# speed-of-light and stall summary for the first config. ncu serialises the kernels (no PDL
# overlap), so the durations add up to more than a back-to-back call costs.
# NCU_VARIANTS (as AB_VARIANTS, e.g. "PROFILE_NUM_PARTS=16"): the kernel times once
# per variant; NCU_SOL=0 skips the speed-of-light sections of the first config.
run_ncu() {
  echo "== ncu"
  local first=${NCU_SOL:-1}
  for cfg in ${NCU_CONFIGS:-b128_sq1_h128_4k b1_sq1_h128_32k b16_sq1_h128_1k}; do
    local i=0
    for v in ${NCU_VARIANTS:-PROFILE_NUM_PARTS=0}; do
      i=$((i + 1))
      with_variant "$v" timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum \
        -k 'regex:decode|combine|schedule' python3 benchmarks/profile_one.py "$cfg" > "$OUT/ncu_${cfg}_$i.log" 2>&1
      echo "-- $cfg $v (exit $?)"
      grep -E "^\s+[a-z_:0-9<>, ]*(kernel|Kernel)|gpu__time_duration" "$OUT/ncu_${cfg}_$i.log" | sed 's/(int,.*//' | tail -12
    done
    if [ "$first" = 1 ]; then
      timeout 150 ncu --clock-control none -k regex:decode_kernel -s 2 -c 1 --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 benchmarks/profile_one.py "$cfg" > "$OUT/ncu_sol_$cfg.log" 2>&1
      grep -E "Duration|Frequency|Elapsed Cycles|Throughput|Pipe|Issue|Stall|Warp Cycles|L2 Hit|Busy|Eligible" "$OUT/ncu_sol_$cfg.log" | head -34
      first=0
    fi
  done
}

# A/B of launch-time variants in one call: the benchmark once per variant (a fresh process each, since
# the CUDA handler reads its environment once), on the configs of AB_ONLY, then one table of us per
# call, config x variant. AB_VARIANTS: space-separated variants, each a comma-separated list of
# VAR=value (e.g. "PYTHONPATH=/tmp/site-main PYTHONPATH=/tmp/site-branch").
# AB_ARGS: extra benchmark arguments for every variant (e.g. "--num-parts 0,16": a row per part count).
# The clock probe (clock_probe_start) samples the SM clock and power meanwhile.
# with_variant VARIANT CMD...: runs CMD with the variant's VAR=value pairs in its environment.
with_variant() {
  local v="$1"; shift
  env $(echo "$v" | tr ',' ' ') "$@"
}

run_ab() {
  echo "== A/B: ${AB_VARIANTS:-}"
  local i=0 tags=()
  clock_probe_start ab
  for v in ${AB_VARIANTS:-}; do
    i=$((i + 1)); tags+=("$v")
    with_variant "$v" timeout "${AB_TIMEOUT:-200}" python3 benchmarks/bench_decode.py --no-ceilings \
      --repeats "${AB_REPEATS:-7}" --only "${AB_ONLY:-b128_sq1_h128_4k,b64_sq1_h16_8k}" ${AB_ARGS:-} --json "$OUT/ab-$i.json" \
      > "$OUT/ab-$i.log" 2>&1 || { echo "variant $v failed (exit $?)"; tail -5 "$OUT/ab-$i.log"; status=1; }
  done
  clock_probe_report ab
  python3 - "$OUT" "${tags[@]}" <<'PYEOF'
import json, os, sys
out, tags = sys.argv[1], sys.argv[2:]
# Columns by position: the same variant may run twice (A B A B) to expose drift between runs.
table = {}
for i, tag in enumerate(tags, 1):
    path = os.path.join(out, f"ab-{i}.json")
    if not os.path.exists(path):
        continue
    for r in json.load(open(path))["rows"]:
        # One row per config, or per config and part count with AB_ARGS="--num-parts ...".
        key = r["name"] + r["impl"][len("jax_mla"):] if r["impl"].startswith("jax_mla") else r["name"] + " " + r["impl"]
        table.setdefault(key, {})[i] = (r["us"], r.get("rel_err", float("nan")))
for i, tag in enumerate(tags, 1):
    print(f"# variant {i}: {tag}")
print(f"{'config':<26}" + "".join(f" {'variant ' + str(i):>22}" for i in range(1, len(tags) + 1)))
for name, cols in table.items():
    print(f"{name:<26}" + "".join(f" {cols[i][0]:11.1f} (e {cols[i][1]:.0e})" if i in cols else f" {'-':>22}"
                                  for i in range(1, len(tags) + 1)))
PYEOF
}

# Where the decode kernel's warps stall, per SASS instruction: ncu's source counters (warp-state
# sampling) of one call of NCUSRC_CONFIG, once per variant of NCUSRC_VARIANTS (as AB_VARIANTS), as
# CSV (src-N.csv, in the log archive) plus the speed-of-light and warp-state summaries. The
# details page is printed with --print-details all (details-N.log), which adds the breakdown of
# each speed-of-light throughput into its sub-metrics (which L2 unit is the 85%).
# NCUSRC_SECTIONS replaces the sections (e.g. "SpeedOfLight MemoryWorkloadAnalysis" for a quick
# memory-only look without the per-instruction sampling passes).
run_ncusrc() {
  local cfg="${NCUSRC_CONFIG:-b128_sq1_h128_4k}" i=0
  for v in ${NCUSRC_VARIANTS:-PROFILE_NUM_PARTS=0}; do
    i=$((i + 1))
    echo "== ncu source counters: $cfg, $v"
    with_variant "$v" timeout 180 ncu --clock-control none -k regex:decode_kernel -s 2 -c 1 \
      $(for sec in ${NCUSRC_SECTIONS:-SourceCounters WarpStateStats SpeedOfLight MemoryWorkloadAnalysis}; do echo --section $sec; done) \
      -o "$OUT/prof-$i" python3 benchmarks/profile_one.py "$cfg" > "$OUT/ncusrc-$i.log" 2>&1 || { echo "ncu failed"; tail -5 "$OUT/ncusrc-$i.log"; continue; }
    case " ${NCUSRC_SECTIONS:-SourceCounters} " in
      *" SourceCounters "*) ncu -i "$OUT/prof-$i.ncu-rep" --page source --csv --print-source sass > "$OUT/src-$i.csv" 2>&1 ;;
    esac
    ncu -i "$OUT/prof-$i.ncu-rep" --page details --print-details all > "$OUT/details-$i.log" 2>&1 ||
      ncu -i "$OUT/prof-$i.ncu-rep" --page details > "$OUT/details-$i.log" 2>&1
    grep -E "Duration|Frequency|Elapsed Cycles|Throughput|Hit Rate|Warp Cycles Per Issued|Issue Slots|Stall" "$OUT/details-$i.log" | head -28
    rm -f "$OUT/prof-$i.ncu-rep"
  done
}

# Which decode calls XLA captures into CUDA graphs: an XLA dump (optimized HLO) of one benchmark
# config and of the CUDA-graph test's worker, with XLA's command-buffer passes logging at VLOG 3;
# benchmarks/xla_command_buffers.py prints, per module, the jax_mla calls and those wrapped in
# dynamic-slice fusions, and, from the logs, the decode thunks inside the command buffers XLA
# created and the thunk kinds it left out. The step modules' HLO come back as logs. (It found why
# the benchmark was never captured until 2026-12-03: DYNAMIC_SLICE_FUSION was not enabled.)
run_xladump() {
  local cfg="${XLADUMP_CONFIG:-b16_sq1_h128_1k}"
  echo "== XLA dump: benchmark $cfg and the CUDA-graph worker"
  rm -rf /tmp/xladump-bench /tmp/xladump-graphs
  local vlog=(TF_CPP_MIN_LOG_LEVEL=0
              TF_CPP_VMODULE=command_buffer_scheduling=3,command_buffer_conversion_pass=3,command_buffer_thunk=2)
  env "${vlog[@]}" XLA_FLAGS="--xla_dump_to=/tmp/xladump-bench --xla_dump_hlo_as_text" timeout 150 \
    python3 benchmarks/bench_decode.py --only "$cfg" --repeats 3 --no-ceilings > "$OUT/xladump-bench.log" 2>&1
  echo "benchmark exit $?"
  env "${vlog[@]}" XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1 --xla_dump_to=/tmp/xladump-graphs --xla_dump_hlo_as_text" \
    timeout 120 python3 -P tests/gpu/gpu_graphs_worker.py /tmp/graphs.pkl > "$OUT/xladump-graphs.log" 2>&1
  echo "graphs worker exit $?"
  for d in bench graphs; do
    echo "-- $d"; python3 benchmarks/xla_command_buffers.py /tmp/xladump-$d "$OUT/xladump-$d.log" | tail -5
    f=$(ls -S /tmp/xladump-$d/*after_optimizations.txt 2>/dev/null | head -1)
    [ -n "$f" ] && cp "$f" "$OUT/xladump-$d-hlo.log"
  done
  grep -hiE "command.buffer" "$OUT"/xladump-*.log | grep -viE "^\s*%|ROOT" | sort | uniq -c | sort -rn | head -12
}

# The ceiling of the KV load path without compute (benchmarks/tma_bandwidth.cu): TMA tiles into
# every SM's shared memory, L2-resident and from DRAM, 1-3 tiles in flight per SM, each tile read by
# 1 or 2 CTAs. Built here with nvcc (seconds); TMABW_ARGS runs one configuration instead of the
# sweep ("WS_MB STAGES SHARE [TILES_PER_CTA] [REPS]").
run_tmabw() {
  echo "== TMA load ceiling (benchmarks/tma_bandwidth.cu)"
  nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I cuda benchmarks/tma_bandwidth.cu cuda/common/tensor_map.cu \
    -o /tmp/tma_bandwidth > "$OUT/tmabw-build.log" 2>&1 || { echo "build failed"; tail -5 "$OUT/tmabw-build.log"; status=1; return; }
  timeout 120 /tmp/tma_bandwidth ${TMABW_ARGS:-} 2>&1 | tee "$OUT/tmabw.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}

# The ceiling of the sparse decode's gather without the MMAs (benchmarks/gather_probe.cu): one-token
# FP8 rows at random slots by cp.async into every SM's ring, with and without the dequantizing
# warps, with more gathering warps, a third tile in flight, the .L2::256B hint, L2 prefetch ahead.
# GATHERPROBE_ARGS runs one configuration instead of the sweep (the probe's usage line).
run_gatherprobe() {
  echo "== gather ceiling (benchmarks/gather_probe.cu)"
  nvcc -std=c++17 -O2 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -I cuda benchmarks/gather_probe.cu \
    -o /tmp/gather_probe > "$OUT/gatherprobe-build.log" 2>&1 || { echo "build failed"; tail -5 "$OUT/gatherprobe-build.log"; status=1; return; }
  timeout 180 /tmp/gather_probe ${GATHERPROBE_ARGS:-} 2>&1 | tee "$OUT/gatherprobe.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}

# Racecheck probes, modes 0 1 2 each under racecheck:
#   racecheck_probe.cu      whether racecheck honours a named barrier over part of a CTA (the SM90
#                           epilogue's row-sum exchange alone; mode 2 is the racy control);
#   racecheck_tma_probe.cu  whether it follows an ordering through a bulk copy's transaction count
#                           (the FP8 path's slot reuse; 0 the kernel's order, 1 a real race, 2 no copy engine).
run_raceprobe() {
  local probe
  for probe in racecheck_probe racecheck_tma_probe; do
    echo "== $probe (benchmarks/$probe.cu)"
    nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a "benchmarks/$probe.cu" -o "/tmp/$probe" \
      > "$OUT/$probe-build.log" 2>&1 || { echo "build failed"; tail -5 "$OUT/$probe-build.log"; status=1; continue; }
    local modes="0 1 2"
    [ "$probe" = racecheck_probe ] && modes="0 1 2 3"  # 3: the mainloop's P hand-off
    for m in $modes; do
      timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 2 "/tmp/$probe" $m \
        > "$OUT/$probe-$m.log" 2>&1
      echo "mode $m: exit $?"; grep -E "^mode|SUMMARY" "$OUT/$probe-$m.log"
    done
  done
}

# The device's kernel choice as the extension sees it (kernel_info, then cuda_call_stats: decode
# calls, those captured into CUDA graphs, SM90 fused-merge launches).
run_stats() {
  echo "== stats"
  timeout 60 python3 -P -c "import jax_mla; print(jax_mla.kernel_info()); print(jax_mla._ext.testing.cuda_call_stats())"
}

# Steps run in the order given on the command line.
for step in "${steps[@]}"; do
  case "$step" in
    tests) run_tests ;;
    bench) run_bench ;;
    sanitize) run_sanitize ;;
    ncu) run_ncu ;;
    ab) run_ab ;;
    ncusrc) run_ncusrc ;;
    xladump) run_xladump ;;
    tmabw) run_tmabw ;;
    gatherprobe) run_gatherprobe ;;
    stats) run_stats ;;
    raceprobe) run_raceprobe ;;
    peers) run_peers ;;
    peersncu) run_peersncu ;;
    sparse) run_sparse ;;
    fp8) run_fp8 ;;
    multigpu) run_multigpu ;;
    all) run_tests; run_bench; run_sanitize ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status
