#!/usr/bin/env bash
# Run the test suite's binaries under valgrind memcheck (leaks, invalid reads
# and writes, uninitialised values). Needs valgrind (apt-get install valgrind).
# usage: scripts/valgrind.sh [test-name ...]   (default: the unsafe-heavy ones)
set -euo pipefail
cd "$(dirname "$0")/.."
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=(lib seed_behaviour memory_behaviour relocation faults bad_input service trace_replay)
cargo test --no-run --message-format=json 2>/dev/null >target/valgrind-build.json
status=0
for name in "${tests[@]}"; do
    if [ "$name" = lib ]; then
        pattern='"target":{[^}]*"kind":\["lib"\]'
    else
        pattern="\"target\":{[^}]*\"name\":\"$name\""
    fi
    bin=$(grep -E "$pattern" target/valgrind-build.json | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | head -1)
    [ -n "$bin" ] || { echo "no test binary for $name" >&2; status=1; continue; }
    echo "== $name"
    # Tests that spawn the CLI are skipped: valgrind follows only this process.
    valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
        "$bin" --test-threads 1 --skip cli_ 2>&1 \
        | grep -E "test result|ERROR SUMMARY|definitely lost|Invalid|uninitialised" || status=$?
done
exit $status
