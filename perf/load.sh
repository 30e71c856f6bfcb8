# load.sh - sourced by the perf scripts (compare.sh, nixl.sh, pair_builds.sh,
# secure_cost.sh, overhead.sh, depth.sh): the quiet-window gate every series
# starts behind, and wait_listen.

# load1: the 1-minute load average
load1() { cut -d' ' -f1 /proc/loadavg; }

# loaded MAX: the 1-minute load is MAX or more
loaded() { awk -v l="$(load1)" -v m="$1" 'BEGIN{exit !(l >= m)}'; }

# wait_quiet MAX SECONDS: wait (5 s steps) until the 1-minute load is below
# MAX, at most SECONDS; returns 1 when it never was.
wait_quiet() {
    local left=$2
    while loaded "$1"; do
        [ "$left" -gt 0 ] || return 1
        sleep 5
        left=$((left - 5))
    done
    return 0
}

# quiet: wait for a quiet window (wait_quiet LOAD_MAX QUIET_WAIT) and print
# the load the run starts at, "LOADED:" before it when the machine never got
# quiet in time.
quiet() {
    if wait_quiet "$LOAD_MAX" "$QUIET_WAIT"; then
        load1
    else
        echo "LOADED:$(load1)"
    fi
}

# wait_listen PORT: until something listens on PORT (10 s at most)
wait_listen() {
    local i
    for i in $(seq 1 100); do
        ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
        sleep 0.1 # polls for the listener; bounded (10 s)
    done
    echo "${0##*/}: nothing listens on port $1" >&2
    return 1
}
