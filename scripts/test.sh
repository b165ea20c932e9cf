#!/usr/bin/env bash
# Sets up a fresh machine and runs every test. This is the README's test command and exactly what CI runs.
#   1. scripts/setup.sh            Debian packages + Python test venv (idempotent)
#   2. release build (CPU) + the real models fetched (stoke model fetch, sha256-checked)
#   3. ctest (unit + golden C++ tests) and pytest (golden, integration: real servers, real clients; in parallel)
#   4. unit tests again under ASan + UBSan (debug-asan preset), less the few labelled `real` (see the stage);
#      the ASan and fuzz trees build in the background while steps 2-3 run (docs/testing.md)
#   5. each libFuzzer target for a short while (fuzz preset, clang)
#   6. the CUDA targets compiled for sm_90a when nvcc exists (nothing runs them here: no GPU)
# Env: STOKE_TEST_STAGES="build ctest pytest asan fuzz cuda" to pick stages; FUZZ_SECONDS (default 30, per
#      fuzzer; JOBS fuzzers run at a time, one core each); PYTEST_WORKERS (default 4: pytest-xdist processes,
#      one test file per worker at a time; most tests wait on servers and fixed delays, not the CPU; 0 = serial).
#      Opt-in stage "tsan": the unit tests under ThreadSanitizer (tsan preset; ~11 min to build on 2 cores, so
#      not in CI's default set): STOKE_TEST_STAGES="build tsan" scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES=${STOKE_TEST_STAGES:-"build ctest pytest asan fuzz cuda"}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
JOBS=${JOBS:-$(nproc)}
PYTEST_WORKERS=${PYTEST_WORKERS:-4}
has() { [[ " $STAGES " == *" $1 "* ]]; }
# Each stage's wall time, printed at the end (a warm re-run should spend its time testing, not building).
stage_names=(); stage_secs=(); stage_t0=$SECONDS
step() {
  end_stage
  echo; echo "=== $* ==="
  stage_names+=("$*"); stage_t0=$SECONDS
}
end_stage() { ((${#stage_names[@]})) && ((${#stage_secs[@]} < ${#stage_names[@]})) && stage_secs+=($((SECONDS - stage_t0))); true; }
failures=()
# The names of failed tests, printed again at the very end: CI keeps only the tail of a long log.
failed_tests=$ROOT/build/failed-tests.txt
mkdir -p build && : >"$failed_tests"
# Runs a test command with its output also in a log, then copies its failure lines (ctest's list, pytest's short
# summary) into $failed_tests. Returns the command's status.
run_logged() {
  local log=$1 rc=0; shift
  "$@" 2>&1 | tee "$log" || rc=$?
  { sed -n '/The following tests FAILED:/,$p' "$log" | grep -E '^[[:space:]]+[0-9]+ - ' || true
    grep -E '^(FAILED|ERROR) ' "$log" || true; } >>"$failed_tests"
  return "$rc"
}

# ccache (CMakeLists.txt uses it when installed): paths under the clone are hashed relative to it, so another
# clone of the same commit hits the same cache (~/.cache/ccache unless CCACHE_DIR says otherwise).
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-10G}

step "setup"
# A full disk fails tests far from the cause (a CI run died of ENOSPC in pytest's temporary directories):
# say so up front. A cold run writes ~8 GiB (three build trees, the venv, models); tests write ~1 GiB at a time.
for dir in "$ROOT" "${TMPDIR:-/tmp}"; do
  free_kib=$(df -Pk "$dir" | awk 'NR==2 {print $4}')
  if ((free_kib < 10 * 1024 * 1024)); then
    echo "warning: only $((free_kib / 1024)) MiB free under $dir; the suite needs ~10 GiB (build trees, models," \
         "test temporaries) and fails with 'No space left on device' when it runs out" >&2
  fi
done
bash scripts/setup.sh

step "build (release)"
cmake --preset release >/dev/null
cmake --build build/release -j"$JOBS"
export STOKE_BIN=$ROOT/build/release/apps/stoke/stoke STOKE_BUILD_DIR=$ROOT/build/release

# The ASan and fuzz trees build in the background, at a lower priority, while the models download and the
# release tests run: those tests mostly wait (servers starting, fixture delays, measuring windows), and the
# suite holds under a CPU hog per core (docs/testing.md), so on a cold machine the two builds fill the idle
# cores instead of running after the tests. On a warm machine they finish at once. The asan and fuzz stages
# wait for them; prebuild.log holds their output, and its time is printed at the end.
prebuild_pid=""
prebuild_log=$ROOT/build/prebuild.log
if has asan || has fuzz; then
  (
    t0=$SECONDS rc=0
    if has asan; then
      # Only the unit-labelled test binaries (target stoke_unit_tests): the CLI, benches and tools that no unit
      # test links are not needed for `ctest -L unit` (about a fifth of the compiling, and the heaviest files).
      { cmake --preset debug-asan >/dev/null &&
        nice -n 10 cmake --build build/debug-asan -j"$JOBS" --target stoke_unit_tests; } || rc=1
      echo "prebuild: debug-asan done at $((SECONDS - t0)) s"
      echo "$rc" >"$prebuild_log.asan-rc"  # the asan stage starts on this, while the fuzz tree still builds
    fi
    if has fuzz; then
      { cmake --preset fuzz >/dev/null &&
        nice -n 10 cmake --build build/fuzz -j"$JOBS" --target stoke_fuzzers; } || rc=$((rc | 2))
      echo "prebuild: fuzz done at $((SECONDS - t0)) s"
    fi
    exit "$rc"
  ) >"$prebuild_log" 2>&1 &
  prebuild_pid=$!
fi
rm -f "$prebuild_log.asan-rc"
prebuild_rc=""
# The ASan tree alone: returns when the background build has written its status (or ended without one).
wait_asan_prebuild() {
  [ -n "$prebuild_pid" ] || return 0
  while [ ! -e "$prebuild_log.asan-rc" ] && kill -0 "$prebuild_pid" 2>/dev/null; do sleep 2; done
  if [ "$(cat "$prebuild_log.asan-rc" 2>/dev/null)" != 0 ]; then
    echo "background build of the ASan tree failed; its log:"
    tail -n 60 "$prebuild_log"
    return 1
  fi
  grep "debug-asan done" "$prebuild_log" || true
}
wait_prebuild() {
  [ -n "$prebuild_pid" ] && [ -z "$prebuild_rc" ] || return 0
  prebuild_rc=0
  wait "$prebuild_pid" || prebuild_rc=$?
  tail -n 3 "$prebuild_log"
  if [ "$prebuild_rc" != 0 ]; then
    echo "background build failed (exit $prebuild_rc: 1 = debug-asan, 2 = fuzz, 3 = both); its log:"
    tail -n 60 "$prebuild_log"
  fi
}

step "models"
for m in smollm2-135m-instruct all-minilm-l6-v2 ppocr-mobile-v2-cls; do "$STOKE_BIN" model fetch "$m"; done

if has ctest; then
  step "ctest (release)"
  run_logged build/ctest-release.log ctest --test-dir build/release --output-on-failure -j"$JOBS" -LE gpu \
    || failures+=(ctest)
fi

if has pytest; then
  step "pytest"
  # --dist loadfile: a file's tests run in order in one worker, so a module's server fixtures start once. Every
  # server listens on port 0 and every test writes under its own tmp_path, so workers share nothing mutable.
  # Tests marked `serial` (pytest.ini) compare measurements taken at different moments; they run alone after.
  run_logged build/pytest.log .venv/bin/python -m pytest -q tests -n "$PYTEST_WORKERS" --dist loadfile -m "not serial" \
    || failures+=(pytest)
  run_logged build/pytest-serial.log .venv/bin/python -m pytest -q tests -m serial || failures+=(pytest-serial)
fi

if has asan; then
  step "unit tests under ASan + UBSan"
  wait_asan_prebuild || failures+=(asan-build)
  # -LE real: the few tests labelled `real` (REAL_TESTS in src/serve and src/tools/precision CMakeLists.txt:
  # LlmLoopRealModelTest.BatchedGreedyMatchesSingleSequenceRunner, SmolLm2Gate.*,
  # SmolLm2ServeGate.FailingPrecisionIsRefusedUnlessAllowed) run long loops of the real SmolLM2 model, 1-5 min
  # each at -O0 under ASan (1367 of 1920 test-seconds here). They run in the release ctest above; here the
  # tiny-model tests of the same code run instead (llm_loop_test.cc, DecoderGateTest, ServeGateTest), as do the
  # other real-model tests (loaders, tokenizers, one decode step). docs/testing.md has the list and the why.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_logged build/ctest-asan.log ctest --test-dir build/debug-asan --output-on-failure -j"$JOBS" -L unit -LE real \
    || failures+=(asan)
fi

if has tsan; then
  step "unit tests under ThreadSanitizer"
  cmake --preset tsan >/dev/null
  cmake --build build/tsan -j"$JOBS"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build/tsan --output-on-failure -j"$JOBS" -L unit || failures+=(tsan)
fi

if has fuzz; then
  step "fuzzers (${FUZZ_SECONDS}s each)"
  wait_prebuild
  (((prebuild_rc & 2) != 0)) && failures+=(fuzz-build)
  # libFuzzer runs on one core, so JOBS fuzzers run side by side, each for the full FUZZ_SECONDS.
  fuzz_logs=$(mktemp -d)
  fuzz_one() {
    local f=$1 name corpus work rc=0
    name=$(basename "$f"); corpus=tests/fuzz/${name%_fuzz}_corpus
    work=$(mktemp -d); [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
    "$f" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -max_len=65536 "$work" >"$fuzz_logs/$name.log" 2>&1 || rc=$?
    rm -rf "$work"
    return "$rc"
  }
  fuzz_pids=(); fuzz_names=()
  for f in build/fuzz/src/*/*_fuzz build/fuzz/src/*/*/*_fuzz; do
    [ -x "$f" ] || continue
    while (($(jobs -rp | wc -l) >= JOBS)); do sleep 1; done
    fuzz_one "$f" & fuzz_pids+=($!); fuzz_names+=("$(basename "$f")")
  done
  for i in "${!fuzz_pids[@]}"; do
    wait "${fuzz_pids[$i]}" || failures+=("${fuzz_names[$i]}")
    echo "--- ${fuzz_names[$i]}"; tail -n 3 "$fuzz_logs/${fuzz_names[$i]}.log"
  done
  rm -rf "$fuzz_logs"
fi

if has cuda && command -v nvcc >/dev/null 2>&1; then
  step "CUDA targets compile (sm_90a + PTX); they run on the GPU machine only"
  cmake --preset release-cuda >/dev/null
  # Only the CUDA targets: the CPU tree is already built and tested above.
  cmake --build build/release-cuda -j"$JOBS" --target stoke_kernels_cuda stoke_kernels_cuda_test stoke_device_test cuda_bench \
    || failures+=(cuda-build)
fi

end_stage
echo
echo "stage times (s):"
for i in "${!stage_names[@]}"; do printf '  %5d  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"; done
printf '  %5d  total\n' "$SECONDS"
if [ -f "$prebuild_log" ]; then
  grep '^prebuild:' "$prebuild_log" | sed 's/^/  background build (from the end of the release build): /' || true
fi
command -v ccache >/dev/null && ccache --show-stats 2>/dev/null | grep -Ei '^ *(hits|misses|cacheable)' | head -3 || true
echo
if ((${#failures[@]})); then
  if [ -s "$failed_tests" ]; then
    echo "failed tests (build/failed-tests.txt; their output is above and in build/*.log):"
    head -n 40 "$failed_tests" | cut -c1-300
  fi
  echo "FAILED stages: ${failures[*]}"
  exit 1
fi
echo "all test stages passed: $STAGES"
