#!/usr/bin/env bash
# One check of a machine with an NVIDIA GPU, sized for a short loan (under 10 minutes, one device call, on 16 cores): benchmarks/gpu.py with
# --profile (each case against torch on the same GPU, then its kernels and its driver calls), the test suite on cuda
# (each failure named as it happens, so a run cut short still says which; then up to 20 of them again, alone, with
# their tracebacks), and 45 seconds of fuzzing against the numpy reference. Logs go to $OUT (or /tmp/gpu-check).
#
#     bash benchmarks/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
export PYTHONPATH="$PWD" XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" PYTHONUNBUFFERED=1
export EMBER_CACHE_DIR="${EMBER_CACHE_DIR:-/tmp/ember-gpu-check-cache}"
python="${PYTHON:-python3}"
nvidia-smi -L 2>&1 | head -4
echo "=== benchmarks/gpu.py --profile"
timeout 150 "$python" benchmarks/gpu.py --runs 10 --budget 2 --profile > "$out/gpu.log" 2>&1
echo "exit status $?"
cat "$out/gpu.log"
echo "=== tests on cuda"
workers=$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))
EMBER_TEST_DEVICES=cuda timeout 230 "$python" -m pytest -v -n "$workers" --dist loadgroup -p no:cacheprovider \
    tests > "$out/tests.log" 2>&1
echo "exit status $? (124: cut short at 230 s)"
grep -E " (FAILED|ERROR) " "$out/tests.log" | sed -E 's/.* (FAILED|ERROR) //; s/ - .*//' | sort -u > "$out/failed.txt"
grep -E "passed|failed" "$out/tests.log" | tail -1
echo "$(grep -c " PASSED " "$out/tests.log") passed as they ran; failed: $(wc -l < "$out/failed.txt")"
if [ -s "$out/failed.txt" ]; then
    cat "$out/failed.txt"
    # shellcheck disable=SC2046
    EMBER_TEST_DEVICES=cuda timeout 60 "$python" -m pytest -q -p no:cacheprovider --tb=short \
        $(head -20 "$out/failed.txt") \
        > "$out/rerun.log" 2>&1
    grep -E "^(E |FAILED|ERROR|tests/)" "$out/rerun.log" | head -120
fi
echo "=== flash attention's tile choices"
timeout 60 "$python" benchmarks/attention_tiles.py --runs 5 --budget 0.5 2>&1 | tail -6
echo "=== fuzz cuda"
timeout 60 "$python" -m ember fuzz --device cuda --minutes 0.75 --seed 20240611 2>&1 | tail -2
