#!/bin/bash
# check_layers.sh - every layer includes only its own headers and those of
# the layers below it (meson's include paths enforce the same; this catches
# a path written out, e.g. "../engine/engine.h").
#   plugin/common   <- nothing of kvxfer but include/
#   plugin/core     <- common
#   transports/     <- common
#   plugin/engine   <- core, common  (transports only through its seam)
#   plugin/api      <- everything
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A allowed=(
    [plugin/common]="plugin/common"
    [plugin/core]="plugin/core plugin/common"
    [transports/ucx]="transports/ucx plugin/common"
    [transports/nng]="transports/nng plugin/common"
    [plugin/engine]="plugin/engine plugin/core plugin/common"
)
# header name -> the folder that holds it
declare -A home=()
for d in plugin/common plugin/core plugin/engine plugin/api transports/ucx \
         transports/nng; do
    for h in "$d"/*.h; do
        [ -e "$h" ] && home[$(basename "$h")]=$d
    done
done

bad=0
for d in "${!allowed[@]}"; do
    for f in "$d"/*.c "$d"/*.h; do
        [ -e "$f" ] || continue
        while IFS= read -r inc; do
            name=$(basename "$inc")
            src=${home[$name]:-}
            [ -n "$src" ] || continue   # system or public header
            ok=0
            for a in ${allowed[$d]}; do
                [ "$a" = "$src" ] && ok=1
            done
            if [ $ok = 0 ]; then
                echo "check_layers: $f includes \"$inc\" from $src;" \
                     "$d may use only: ${allowed[$d]}" >&2
                bad=1
            fi
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done
done
[ $bad = 0 ] && echo "check_layers: every include follows the layers"
exit $bad
