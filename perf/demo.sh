#!/bin/bash
# demo.sh - install dependencies, build, and run the main job: a prefill
# process and a decode process moving a llama-8b-like KV cache over real UCX
# and nng, verifying every byte. Extra arguments go to kvxfer_demo.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/setup.sh build >/dev/null
exec build/perf/kvxfer_demo "$@"
