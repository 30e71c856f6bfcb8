#!/bin/sh
# Fails unless the only defined dynamic symbol of the library is kvx_get_api.
set -eu
so="$1"
syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort -u)
echo "defined dynamic symbols: $syms"
[ "$syms" = "kvx_get_api" ] || { echo "FAIL: expected only kvx_get_api"; exit 1; }
echo "1 passed, 0 failed"
