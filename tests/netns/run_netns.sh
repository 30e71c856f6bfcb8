#!/bin/bash
# run_netns.sh - multi-host instances end to end (SPEC §4 "Host of a remote
# rank" and "Trust"). Four hosts are four network namespaces, each with a
# veth link to a Linux bridge in a fifth namespace (addresses 192.0.2.1-4,
# TEST-NET-1, only inside these namespaces). Each host runs one rankhost
# process whose ranks are engines (threads) of that process.
#
#   tp16       P TP16: ranks 0-7 on A, 8-15 on B; D TP16: 0-7 on C, 8-15 on D.
#   dp2tp8     P DP2xTP8: dp0 on A, dp1 on B; D DP2xTP8: dp0 on C, dp1 on D;
#              decode DP rank d sends remote_dp_rank d and reads P DP rank d.
#   thief      READ with read_bind_decode_host: P on A holds a transfer whose
#              request id names decode host C; a decode instance on B (a
#              trusted host, same transfer id, same block ids) is refused
#              by P's data plane (session of B, not C): FAILED naming the
#              reason, its blocks untouched, P counts data_wrong_peer,
#              while the decode instance on C reads every byte and releases
#              P. Control: against a P without the option the same thief
#              reads every byte and its release ends P's hold, so C's gets
#              are refused (what the option is for).
#   write_thief WRITE: D on C holds a transfer for P on A (its blocks
#              remote-writable while it waits); an attacker process on B
#              (tests/security/attack.c: its own UCP worker, kvxfer's
#              active-message put protocol, the session D's handshake gave
#              B) puts into every block of layer 0 with the transfer's tag
#              and token: every put in the transfer's blocks is refused as
#              bound to another peer, none served. Control: the same
#              attacker on A (P's host) is served. Then P pushes and D
#              verifies every byte. Needs ATTACK (the second argument).
#   notice_thief READ release notices forged by an attacker process on B
#              (its own UCP endpoint): claiming decode host C, and as B
#              itself against a P bound to C; both refused, D on C
#              byte-exact. Control: unbound, B's own notice releases P.
#   blocks_thief WRITE remote_blocks forged on the data plane by an attacker
#              process on B (its own UCP endpoint, KVU_AM_CTL) for P on
#              A's transfer to decode host C, before C's own: claiming C
#              (mac under B's session: not authenticated) and as B (bound
#              to C: wrong peer); both refused, D on C byte-exact.
#   ucx_guard  WRITE D on C with trusted_remote_hosts = {A}: every UCX tcp
#              listener of D takes a connection from A and none from B (its
#              SYN dropped by the kernel filter: the connect times out); P
#              on A then pushes and D verifies every byte.
#   untrusted  D with trusted_remote_hosts = {A, C, D} (not B): decode ranks
#              8-15 fail synchronously with KVX_ERR_UNTRUSTED_PEER naming B
#              and remote_hosts[1]; a plain TCP listener on B, on every port
#              those ranks would dial, records that no connection arrived
#              (and that the one probe connection of this script did).
# Every decode rank verifies every byte against a pattern keyed by (P host,
# P global rank, layer, block), and every P rank must be released.
#
# Two more cases show library defects found with this rig (opt-in, run by
# the meson test netns_teardown): peer_gone (D destroyed while its
# endpoints to a vanished P fail) and release_on_destroy (D destroyed right
# after its transfer completed must still release P). Both are races: each
# runs KVX_NETNS_ROUNDS rounds (default 3) pinned to one CPU.
#
# Usage (root): tests/netns/run_netns.sh path/to/rankhost [path/to/attack]
# Prints "N passed, M failed"; exit 0 only if nothing failed. Without
# permission to create namespaces it prints "SKIP: ..." and exits 77, unless
# $CI is set (CI has root): then that is a failure.
#
# Environment:
#   KVX_NETNS_SCENARIOS   cases to run [tp16 dp2tp8 untrusted hetero thief
#                         write_thief notice_thief blocks_thief
#                         ucx_guard];
#                         also
#                         peer_gone, release_on_destroy
#   KVX_NETNS_TRUST_SCOPE what "untrusted" expects of decode ranks 0-7,
#                         whose own P rank is on the trusted host A:
#       rank (default)    the host a rank resolves to must be trusted (what
#                         kvxfer does): ranks 0-7 read from a real P on A,
#                         ranks 8-15 are refused and B sees no connection;
#       request           the stricter reading (every remote_hosts entry of a
#                         request must be trusted): every rank is refused.
#   KVX_NETNS_LOG_LEVEL   engine log_level [1]
#   KVX_NETNS_KEEP_LOGS=1 keep the log directory
set -u

RANKHOST=${1:-}
if [ -z "$RANKHOST" ] || [ ! -x "$RANKHOST" ]; then
    echo "usage: $0 path/to/rankhost" >&2
    exit 2
fi
RANKHOST=$(cd "$(dirname "$RANKHOST")" && pwd)/$(basename "$RANKHOST")
ATTACK=${2:-}
TRUST_SCOPE=${KVX_NETNS_TRUST_SCOPE:-rank}
case "$TRUST_SCOPE" in request|rank) ;; *)
    echo "KVX_NETNS_TRUST_SCOPE must be request or rank" >&2; exit 2 ;;
esac

# Names unique to this run; only these namespaces are ever deleted.
RUN=kvx$$
NS_BR=${RUN}br
NS_A=${RUN}a NS_B=${RUN}b NS_C=${RUN}c NS_D=${RUN}d
# TEST-NET-1 (RFC 5737), only inside the namespaces created here.
IP_A=192.0.2.1 IP_B=192.0.2.2 IP_C=192.0.2.3 IP_D=192.0.2.4
DEV=eth0
P_HS=21000 P_NT=23000 D_HS=25000 D_NT=27000 PROBE=29000

CREATED=()
PIN=()   # command prefix of rankhost (taskset for the teardown cases)
LOGDIR=$(mktemp -d /tmp/kvx-netns.XXXXXX)

cleanup() {
    local pid ns
    # Only children of this shell that are still running (reaped ids are
    # never signalled: they may belong to someone else by now).
    for pid in $(jobs -rp); do
        kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    done
    # Deleting a namespace removes the veth ends and the bridge inside it.
    for ns in "${CREATED[@]}"; do
        ip netns del "$ns" 2>/dev/null
    done
    if [ "${KVX_NETNS_KEEP_LOGS:-0}" = 1 ]; then
        echo "logs kept in $LOGDIR"
    else
        rm -rf "$LOGDIR"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

skip_or_fail() {
    if [ -n "${CI:-}" ] && [ "${CI}" != "false" ] && [ "${CI}" != "0" ]; then
        echo "FAIL: cannot create network namespaces in CI: $1" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
    echo "SKIP: cannot create network namespaces: $1"
    exit 77
}

die() {
    echo "FAIL: $*" >&2
    echo "0 passed, 1 failed"
    exit 1
}

# --- topology -----------------------------------------------------------

if ! command -v ip >/dev/null 2>&1; then
    skip_or_fail "the ip command (iproute2) is missing"
fi
if ! err=$(ip netns add "$NS_BR" 2>&1); then
    skip_or_fail "ip netns add: ${err:-failed} (uid $(id -u))"
fi
CREATED+=("$NS_BR")
setup_topology() {
    ip -n "$NS_BR" link set lo up &&
    ip -n "$NS_BR" link add br0 type bridge &&
    ip -n "$NS_BR" link set br0 type bridge stp_state 0 &&
    ip -n "$NS_BR" link set br0 up || return 1
    local ns ip port
    for h in A B C D; do
        eval "ns=\$NS_$h ip=\$IP_$h"
        port=p$h
        ip netns add "$ns" || return 1
        CREATED+=("$ns")
        # Both ends are created inside namespaces of this run.
        ip -n "$NS_BR" link add "$port" type veth peer name "$DEV" \
            netns "$ns" &&
        ip -n "$NS_BR" link set "$port" master br0 &&
        ip -n "$NS_BR" link set "$port" up &&
        ip -n "$ns" link set lo up &&
        ip -n "$ns" addr add "$ip/24" dev "$DEV" &&
        ip -n "$ns" link set "$DEV" up || return 1
    done
}
setup_topology || die "cannot build the namespace topology"

# --- process helpers ----------------------------------------------------

# start NAME NS ARGS...: run rankhost in NS in the background, log to NAME.
start() {
    local name=$1 ns=$2
    shift 2
    : >"$LOGDIR/$name.log"   # exists before anyone polls it
    ip netns exec "$ns" "${PIN[@]}" "$RANKHOST" "$@" \
        >>"$LOGDIR/$name.log" 2>&1 &
    eval "PID_$name=$!"
}

# wait_line NAME REGEX SECONDS: poll NAME's log for a line; fail if the
# process exits first or the deadline passes.
wait_line() {
    local name=$1 re=$2 deadline=$((SECONDS + $3)) pid
    eval "pid=\$PID_$name"
    while ! grep -q "$re" "$LOGDIR/$name.log"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            grep -q "$re" "$LOGDIR/$name.log" && return 0
            echo "$name exited before printing $re" >&2
            return 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "$name did not print $re within $3 s" >&2
            return 1
        fi
        sleep 0.05
    done
}
wait_ready() { wait_line "$1" '^READY' "$2"; }

# finish NAME: wait for the process (each has its own --timeout) and
# return its exit status.
finish() {
    local pid
    eval "pid=\$PID_$1"
    wait "$pid"
}

# stop NAME: ask a listener or a holding rankhost to finish; return its
# status.
stop() {
    local pid
    eval "pid=\$PID_$1"
    if jobs -rp | grep -qx "$pid"; then
        kill -TERM "$pid" 2>/dev/null
    fi
    wait "$pid"
}

show_logs() {
    local f
    for f in "$@"; do
        [ -f "$LOGDIR/$f.log" ] || continue # a process never started
        echo "---- $f" >&2
        cat "$LOGDIR/$f.log" >&2
    done
}

# stop_started NAME SUFFIX...: stop NAME_SUFFIX for each one that was
# started; 1 when any of them failed.
stop_started() {
    local name=$1 n rc=0
    shift
    for n in "$@"; do
        [ -n "$(eval "echo \${PID_${name}_$n:-}")" ] || continue
        stop ${name}_$n || rc=1
    done
    return $rc
}

PASSED=0 FAILED=0
verdict() { # NAME RC LOGS...
    local name=$1 rc=$2
    shift 2
    if [ "$rc" = 0 ]; then
        echo "PASS $name"
        PASSED=$((PASSED + 1))
    else
        echo "FAIL $name"
        show_logs "$@"
        FAILED=$((FAILED + 1))
    fi
}

TIMEOUT=40
WAIT=$((TIMEOUT + 30))   # deadline of the script's own waits
COMMON=(--tls tcp --net-dev "$DEV" --timeout "$TIMEOUT"
        --log-level "${KVX_NETNS_LOG_LEVEL:-1}")
DEFAULT_SCENARIOS="tp16 dp2tp8 untrusted hetero thief write_thief notice_thief"
DEFAULT_SCENARIOS+=" blocks_thief ucx_guard"
SCENARIOS=" ${KVX_NETNS_SCENARIOS:-$DEFAULT_SCENARIOS} "
want() { [[ "$SCENARIOS" == *" $1 "* ]]; }
P_ARGS=(--role prefill --hs-port "$P_HS" --notify-port "$P_NT"
        --node-hosts "$IP_A,$IP_B")
D_ARGS=(--role decode --hs-port "$D_HS" --notify-port "$D_NT"
        --node-hosts "$IP_C,$IP_D" --peer-host "$IP_A"
        --peer-hosts "$IP_A,$IP_B" --peer-hs-port "$P_HS"
        --peer-notify-port "$P_NT")

# start_p NAME TP DP TRANSFER EXTRA...: prefill ranks 0-7 on A, 8-15 on B.
start_p() {
    local name=$1 sz=(--tp "$2" --dp "$3" --transfer "$4")
    shift 4
    start ${name}_pA "$NS_A" "${P_ARGS[@]}" "${sz[@]}" "${COMMON[@]}" \
        --host-ip $IP_A --ranks 0-7 "$@"
    start ${name}_pB "$NS_B" "${P_ARGS[@]}" "${sz[@]}" "${COMMON[@]}" \
        --host-ip $IP_B --ranks 8-15 "$@"
}

# start_d NAME TP DP TRANSFER C-EXTRA... -- D-EXTRA...: decode ranks 0-7 on
# C, 8-15 on D; each host's own options after its name.
start_d() {
    local name=$1 sz=(--tp "$2" --dp "$3" --transfer "$4") c=() d=()
    shift 4
    while [ $# -gt 0 ] && [ "$1" != -- ]; do c+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    d=("$@")
    start ${name}_dC "$NS_C" "${D_ARGS[@]}" "${sz[@]}" "${COMMON[@]}" \
        --host-ip $IP_C --ranks 0-7 "${c[@]}"
    start ${name}_dD "$NS_D" "${D_ARGS[@]}" "${sz[@]}" "${COMMON[@]}" \
        --host-ip $IP_D --ranks 8-15 "${d[@]}"
}

# run_pd NAME TP DP: P over A+B, D over C+D; every D rank must read every
# byte of its own P rank on the right host and every P rank must be
# released. Both sides hold their engines until the other side is done, so
# teardown order cannot lose a release (see the release_on_destroy case).
run_pd() {
    local name=$1 tp=$2 dp=$3 rc=0 n
    start_p $name $tp $dp tx-$name --hold 1
    if wait_ready ${name}_pA 60 && wait_ready ${name}_pB 60; then
        start_d $name $tp $dp tx-$name --hold 1 -- --hold 1
        for n in dC dD pA pB; do
            wait_line ${name}_$n '^HOLD' $WAIT || rc=1
        done
    else
        rc=1
    fi
    for n in dC dD pA pB; do
        [ -n "$(eval "echo \${PID_${name}_$n:-}")" ] || continue
        stop ${name}_$n || rc=1
    done
    verdict "$name" $rc ${name}_pA ${name}_pB ${name}_dC ${name}_dD
}

# (a) TP16: P ranks 0-7 on A, 8-15 on B; D ranks 0-7 on C, 8-15 on D.
want tp16 && run_pd tp16 16 1

# (b) DP2xTP8: P dp0 on A, dp1 on B; decode DP rank d (remote_dp_rank d)
# reads P DP rank d, which lives on host d.
want dp2tp8 && run_pd dp2tp8 8 2

# (c) trusted_remote_hosts on the decode hosts excludes B.
run_untrusted() {
    local name=untrusted rc=0 pa=untrusted_pA n c_expect=()
    local trust=(--trusted "$IP_A,$IP_C,$IP_D"
                 --expect-error "'$IP_B'" --expect-error "remote_hosts[1]")
    # B: a plain listener on every port decode ranks 8-15 would dial
    # (handshake and notify of P ranks 8-15), plus a probe port this script
    # connects to once, so a listener that sees nothing cannot pass.
    start ${name}_lB "$NS_B" --role listener --host-ip $IP_B \
        --ports "$((P_HS + 8))-$((P_HS + 15)),$((P_NT + 8))-$((P_NT + 15))" \
        --probe-port $PROBE --timeout $((WAIT * 2))
    if [ "$TRUST_SCOPE" = request ]; then
        # The whole request is refused: nothing may reach A either.
        pa=${name}_lA
        start $pa "$NS_A" --role listener --host-ip $IP_A \
            --ports "$P_HS-$((P_HS + 7)),$P_NT-$((P_NT + 7))" \
            --probe-port $PROBE --timeout $((WAIT * 2))
        c_expect=(--expect-fail-ranks 0-7)
    else
        start $pa "$NS_A" "${P_ARGS[@]}" --tp 16 --dp 1 \
            --transfer tx-$name "${COMMON[@]}" --host-ip $IP_A --ranks 0-7 \
            --hold 1
    fi
    if wait_ready ${name}_lB 60 && wait_ready $pa 60; then
        start_d $name 16 1 tx-$name "${trust[@]}" "${c_expect[@]}" --hold 1 \
            -- "${trust[@]}" --expect-fail-ranks 8-15 --hold 1
        for n in ${name}_dC ${name}_dD; do
            wait_line $n '^HOLD' $WAIT || rc=1
        done
        [ "$TRUST_SCOPE" = rank ] && { wait_line $pa '^HOLD' $WAIT || rc=1; }
        # The probe: one connection from C to each listener.
        ip netns exec "$NS_C" bash -c "exec 3<>/dev/tcp/$IP_B/$PROBE" || rc=1
        if [ "$TRUST_SCOPE" = request ]; then
            ip netns exec "$NS_C" bash -c "exec 3<>/dev/tcp/$IP_A/$PROBE" ||
                rc=1
        fi
    else
        rc=1
    fi
    for n in ${name}_dC ${name}_dD ${name}_lB $pa; do
        [ -n "$(eval "echo \${PID_$n:-}")" ] || continue
        stop $n || rc=1
    done
    verdict "$name($TRUST_SCOPE)" $rc ${name}_lB $pa ${name}_dC ${name}_dD
}
want untrusted && run_untrusted

# (d) Sharded heterogeneous TP across hosts (SPEC §4), both directions:
# run_hetero NAME P_TP P_HEADS D_TP D_HEADS: P's ranks split over A+B, D's
# over C+D (heads x tp equal on both sides). D tp > P tp: every D rank reads
# a head slice of one P rank; D tp < P tp: every D rank gathers its heads
# from several P ranks, each on the host its rank resolves to.
run_hetero() {
    local name=$1 ptp=$2 ph=$3 dtp=$4 dh=$5 rc=0 n
    local pa=$((ptp / 2)) da=$((dtp / 2))
    local p=(--role prefill --hs-port "$P_HS" --notify-port "$P_NT"
             --node-hosts "$IP_A,$IP_B" --tp "$ptp" --dp 1 --heads "$ph"
             --transfer tx-$name "${COMMON[@]}" --hold 1)
    local d=("${D_ARGS[@]}" --tp "$dtp" --dp 1 --heads "$dh" --peer-tp "$ptp"
             --peer-heads "$ph" --transfer tx-$name "${COMMON[@]}" --hold 1)
    start ${name}_pA "$NS_A" "${p[@]}" --host-ip $IP_A --ranks 0-$((pa - 1))
    start ${name}_pB "$NS_B" "${p[@]}" --host-ip $IP_B \
        --ranks $pa-$((ptp - 1))
    if wait_ready ${name}_pA 60 && wait_ready ${name}_pB 60; then
        start ${name}_dC "$NS_C" "${d[@]}" --host-ip $IP_C \
            --ranks 0-$((da - 1))
        start ${name}_dD "$NS_D" "${d[@]}" --host-ip $IP_D \
            --ranks $da-$((dtp - 1))
        for n in dC dD pA pB; do
            wait_line ${name}_$n '^HOLD' $WAIT || rc=1
        done
    else
        rc=1
    fi
    for n in dC dD pA pB; do
        [ -n "$(eval "echo \${PID_${name}_$n:-}")" ] || continue
        stop ${name}_$n || rc=1
    done
    verdict "$name" $rc ${name}_pA ${name}_pB ${name}_dC ${name}_dD
}
want hetero && run_hetero hetero_slice 8 4 16 2
want hetero && run_hetero hetero_gather 16 2 8 4

# (e) thief: run_thief NAME BIND. P (tp 4, ranks on A) holds tx-NAME for
# the decode host its request id names (C). First a decode instance on B
# reads the same transfer id and block ids; BIND=1 (P with
# read_bind_decode_host): every get is refused, FAILED names the reason and
# B's blocks stay untouched; then the decode instance on C reads every byte
# and releases P. BIND=0 (the control, P without the option): B reads every
# byte and releases P (P's HOLD), and C's gets are then refused.
run_thief() {
    local name=$1 bind=$2 rc=0 n p_extra=() b_expect=()
    local c_expect=(--expect-refused "outside what the source holds")
    local rid="___prefill_addr_host:$IP_A,handshake:$P_HS,notify:$P_NT"
    rid+="___decode_addr_host:$IP_C,handshake:$D_HS,notify:$D_NT"
    rid+="_0123456789abcdef0123456789abcdef"
    local p=(--role prefill --hs-port "$P_HS" --notify-port "$P_NT"
             --tp 4 --dp 1 --ranks 0-3 --transfer tx-$name
             --request-id "$rid" "${COMMON[@]}" --host-ip $IP_A --hold 1)
    local d=(--role decode --hs-port "$D_HS" --notify-port "$D_NT"
             --tp 4 --dp 1 --ranks 0-3 --peer-host "$IP_A"
             --peer-hs-port "$P_HS" --peer-notify-port "$P_NT"
             --transfer tx-$name --request-id "$rid" "${COMMON[@]}")
    if [ "$bind" = 1 ]; then
        p_extra=(--config-extra '"read_bind_decode_host":true'
                 --expect-stat data_wrong_peer)
        b_expect=(--expect-refused "another decode host")
        c_expect=()
    fi
    start ${name}_pA "$NS_A" "${p[@]}" "${p_extra[@]}"
    if wait_ready ${name}_pA 60; then
        start ${name}_dB "$NS_B" "${d[@]}" --host-ip $IP_B "${b_expect[@]}"
        finish ${name}_dB || rc=1
        # The control: P was released by the thief before C starts.
        [ "$bind" = 1 ] || wait_line ${name}_pA '^HOLD' $WAIT || rc=1
        start ${name}_dC "$NS_C" "${d[@]}" --host-ip $IP_C "${c_expect[@]}"
        finish ${name}_dC || rc=1
        wait_line ${name}_pA '^HOLD' $WAIT || rc=1
    else
        rc=1
    fi
    stop_started $name dB dC pA || rc=1
    verdict "$name" $rc ${name}_pA ${name}_dB ${name}_dC
}
want thief && run_thief thief 1
want thief && run_thief thief_control 0

# write_args NAME: WRITE_D and WRITE_P, the arguments of a WRITE decode
# rank on C and of its prefill rank on A (tp 1, holding) for tx-NAME.
write_args() {
    WRITE_D=(--role decode --write 1 --hs-port "$D_HS" --notify-port "$D_NT"
             --tp 1 --dp 1 --ranks 0-0 --peer-host "$IP_A"
             --peer-hs-port "$P_HS" --peer-notify-port "$P_NT"
             --transfer tx-$1 "${COMMON[@]}" --host-ip $IP_C)
    WRITE_P=(--role prefill --write 1 --hs-port "$P_HS" --notify-port "$P_NT"
             --tp 1 --dp 1 --ranks 0-0 --peer-host "$IP_C"
             --peer-hs-port "$D_HS" --peer-notify-port "$D_NT"
             --transfer tx-$1 "${COMMON[@]}" --host-ip $IP_A --hold 1)
}

# write_push NAME: P on A (WRITE_P) pushes tx-NAME to the D on C waiting
# for it; 1 when D did not verify every byte or P did not finish.
write_push() {
    local rc=0
    start ${1}_pA "$NS_A" "${WRITE_P[@]}"
    finish ${1}_dC || rc=1
    wait_line ${1}_pA '^HOLD' $WAIT || rc=1
    return $rc
}

# (f) write_thief: D (WRITE, tp 1) on C waits for P on A; the attacker
# fetches D's handshake from B and puts with B's session (refused), then
# from A with A's session (served: the control); then P pushes.
run_write_thief() {
    local name=write_thief rc=0 n out
    write_args $name
    local d=("${WRITE_D[@]}")
    start ${name}_dC "$NS_C" "${d[@]}"
    if wait_ready ${name}_dC 60; then
        for n in B A; do
            out=$LOGDIR/${name}_att$n.log
            if ! timeout -k 5 60 ip netns exec "${RUN}${n,}" "$ATTACK" fetch \
                     $IP_C "$D_HS" "$LOGDIR/meta$n.json" >"$out" 2>&1; then
                echo "attacker on $n: no metadata from D" >>"$out"
                rc=1
                continue
            fi
            timeout -k 5 60 ip netns exec "${RUN}${n,}" "$ATTACK" amput \
                "$LOGDIR/meta$n.json" tx-$name 10 >>"$out" 2>&1
            local arc=$?
            echo "exit $arc" >>"$out"
            # B: refused (0); A, P's own host: served (1).
            if { [ $n = B ] && [ $arc != 0 ]; } ||
               { [ $n = A ] && [ $arc != 1 ]; }; then
                rc=1
            fi
        done
        write_push $name || rc=1
    else
        rc=1
    fi
    stop_started $name dC pA || rc=1
    verdict "$name" $rc ${name}_attB ${name}_attA ${name}_dC ${name}_pA
}

# (f2) ucx_guard: D (WRITE, tp 1) on C trusts only A, its UCX tcp ports
# pinned to a small range. A connects to each of D's UCX listeners (the
# ports of the range that answer from A); from B, which reaches D's
# handshake port, every one of them stays silent (the kernel filter drops
# B's SYN: the connect times out, where a closed port would refuse at
# once). Then P on A pushes and D verifies every byte.
run_ucx_guard() {
    local name=ucx_guard rc=0 port open=()
    local lo=31000 hi=31009
    write_args $name
    local d=("${WRITE_D[@]}" --trusted "$IP_A"
             --config-extra "\"ucx_tcp_port_range\":\"$lo-$hi\"")
    start ${name}_dC "$NS_C" "${d[@]}"
    if wait_ready ${name}_dC 60; then
        for port in $(seq $lo $hi); do
            if timeout -k 1 5 ip netns exec "$NS_A" bash -c \
                   "exec 3<>/dev/tcp/$IP_C/$port" 2>/dev/null; then
                open+=("$port")
            fi
        done
        echo "D's UCX tcp listeners (connect from A): ${open[*]:-none}" \
            >>"$LOGDIR/${name}_dC.log"
        [ ${#open[@]} -gt 0 ] || rc=1
        # B reaches C at all: D's handshake port (nng) takes its connection.
        timeout -k 1 5 ip netns exec "$NS_B" bash -c \
            "exec 3<>/dev/tcp/$IP_C/$D_HS" 2>/dev/null || rc=1
        for port in "${open[@]}"; do
            timeout -k 1 3 ip netns exec "$NS_B" bash -c \
                "exec 3<>/dev/tcp/$IP_C/$port" 2>/dev/null
            local brc=$?
            echo "connect from B to $IP_C:$port: exit $brc (124: timed out)" \
                >>"$LOGDIR/${name}_dC.log"
            [ $brc = 124 ] || rc=1
        done
        write_push $name || rc=1
    else
        rc=1
    fi
    stop_started $name dC pA || rc=1
    verdict "$name" $rc ${name}_dC ${name}_pA
}
want ucx_guard && run_ucx_guard

if want write_thief; then
    if [ -n "$ATTACK" ]; then
        run_write_thief
    else
        echo "FAIL write_thief: no attack program (second argument)"
        FAILED=$((FAILED + 1))
    fi
fi

# (g) notice_thief: READ P on A (tp 1) holds a transfer whose request id
# names decode host C. An attacker on B (a trusted host: P's handshake gave
# it B's session) sends READ release notices from its own UCP endpoint
# (tests/security/attack.c notice): first one claiming to come from C, its
# mac under B's session, so not authenticated; then, with
# read_bind_decode_host, one as itself (authenticated, but C is the decode
# host). P counts each refused (STAT lines) and keeps its hold; D on C then
# reads every byte and releases P. Control (no bind): the claim of C is
# refused the same and releases nothing, and the attacker's notice as
# itself is taken: P is released with no decode instance at all, so the
# notices did reach P's release path.
run_notice_thief() {
    local name=$1 bind=$2 rc=0 meta=$LOGDIR/${1}_meta.json
    local out=$LOGDIR/${1}_attB.log
    local rid="___prefill_addr_host:$IP_A,handshake:$P_HS,notify:$P_NT"
    rid+="___decode_addr_host:$IP_C,handshake:$D_HS,notify:$D_NT"
    rid+="_0123456789abcdef0123456789abcdef"
    local p=(--role prefill --hs-port "$P_HS" --notify-port "$P_NT"
             --tp 1 --dp 1 --ranks 0-0 --transfer tx-$name
             --request-id "$rid" "${COMMON[@]}" --host-ip $IP_A --hold 1
             --expect-stat notices_refused)
    local d=(--role decode --hs-port "$D_HS" --notify-port "$D_NT"
             --tp 1 --dp 1 --ranks 0-0 --peer-host "$IP_A"
             --peer-hs-port "$P_HS" --peer-notify-port "$P_NT"
             --transfer tx-$name --request-id "$rid" "${COMMON[@]}"
             --host-ip $IP_C)
    att_b() { timeout -k 5 60 ip netns exec "$NS_B" "$ATTACK" "$@" >>"$out" 2>&1; }
    [ "$bind" = 1 ] && p+=(--config-extra '"read_bind_decode_host":true')
    start ${name}_pA "$NS_A" "${p[@]}"
    if wait_ready ${name}_pA 60 && att_b fetch $IP_A "$P_HS" "$meta"; then
        att_b notice "$meta" tx-$name "$IP_C:40000" 1 0 || rc=1
        wait_line ${name}_pA '^STAT 0 notices_refused=1$' $WAIT || rc=1
        if grep -q '^RANK' "$LOGDIR/${name}_pA.log"; then
            echo "the notice claiming C ended P's hold" >>"$out"
            rc=1
        fi
        att_b notice "$meta" tx-$name "$IP_B:40000" 1 0 || rc=1
        if [ "$bind" = 1 ]; then
            wait_line ${name}_pA '^STAT 0 notices_refused=2$' $WAIT || rc=1
            if grep -q '^RANK' "$LOGDIR/${name}_pA.log"; then
                echo "B's own notice ended P's hold" >>"$out"
                rc=1
            fi
            start ${name}_dC "$NS_C" "${d[@]}"
            finish ${name}_dC || rc=1
        fi
        wait_line ${name}_pA '^RANK 0 OK released' $WAIT || rc=1
        wait_line ${name}_pA '^HOLD' $WAIT || rc=1
    else
        rc=1
    fi
    stop_started $name dC pA || rc=1
    verdict "$name" $rc ${name}_pA ${name}_attB ${name}_dC
}
if want notice_thief; then
    if [ -n "$ATTACK" ]; then
        run_notice_thief notice_thief 1
        run_notice_thief notice_thief_control 0
    else
        echo "FAIL notice_thief: no attack program (second argument)"
        FAILED=$((FAILED + 1))
    fi
fi

# (h) blocks_thief: WRITE P on A (tp 1) holds a sealed transfer for decode
# host C (its remote_host) and waits for D's remote_blocks, the message
# that names the blocks P writes into (the first one P takes wins). Before
# D on C starts, an attacker on B (a trusted host: P's handshake gave it
# B's session) sends P remote_blocks for that transfer naming blocks of
# its own choosing, on the data plane from its own UCP endpoint
# (tests/security/attack.c blocks, KVU_AM_CTL): first one claiming to come
# from C, its mac under B's session, so not authenticated: counted in
# dp_msgs_refused and never dispatched (rx.remote_blocks stays 0); then
# one as itself, authenticated, decoded and dispatched (rx.remote_blocks
# 1) but refused because the transfer's decode host is C (rx_refused,
# refused.notify.wrong_peer). Either one taken would have bound the
# transfer to the attacker's blocks, and C's own remote_blocks would be a
# duplicate: D on C then sends it, P pushes, D checks every byte of its
# blocks and P is released.
run_blocks_thief() {
    local name=blocks_thief rc=0 meta=$LOGDIR/blocks_thief_meta.json
    local out=$LOGDIR/blocks_thief_attB.log log=$LOGDIR/blocks_thief_pA.log
    # D's blocks are 3,8,1,6,4 (rankhost kLocal): the forgeries name others.
    local steal=0,2,5,7,9
    # StatCount takes one level of nesting: the first object named notify
    # in the stats is refused.notify. P's handshake timeout outlasts the
    # attack: a forgery P took has it dial C before D runs there, and P
    # then pushes to the attacker's blocks (which D, exposing only its
    # transfer's blocks, refuses: P's transfer fails, D's times out) instead
    # of failing on a handshake timeout.
    local p=(--role prefill --write 1 --hs-port "$P_HS" --notify-port "$P_NT"
             --tp 1 --dp 1 --ranks 0-0 --peer-host "$IP_C"
             --peer-hs-port "$D_HS" --peer-notify-port "$D_NT"
             --transfer tx-$name "${COMMON[@]}" --host-ip $IP_A --hold 1
             --handshake-timeout 30
             --expect-stat dp_msgs_refused --expect-stat rx.remote_blocks
             --expect-stat rx_refused --expect-stat notify.wrong_peer)
    local d=(--role decode --write 1 --hs-port "$D_HS" --notify-port "$D_NT"
             --tp 1 --dp 1 --ranks 0-0 --peer-host "$IP_A"
             --peer-hs-port "$P_HS" --peer-notify-port "$P_NT"
             --transfer tx-$name "${COMMON[@]}" --host-ip $IP_C)
    att_b() {
        timeout -k 5 60 ip netns exec "$NS_B" "$ATTACK" "$@" >>"$out" 2>&1
    }
    start ${name}_pA "$NS_A" "${p[@]}"
    if wait_ready ${name}_pA 60 && att_b fetch $IP_A "$P_HS" "$meta"; then
        att_b blocks "$meta" tx-$name req-netns "$IP_C:40000" $steal || rc=1
        # Refused before decoding, or dispatched: whichever P counts first.
        wait_line ${name}_pA \
            '^STAT 0 \(dp_msgs_refused\|rx\.remote_blocks\)=1$' $WAIT || rc=1
        if grep -q '^STAT 0 rx\.remote_blocks=1$' "$log"; then
            # Taken: the transfer is bound to the attacker's blocks, and
            # B's own would be a duplicate (ignored), so it is not sent.
            echo "the remote_blocks claiming C was dispatched" >>"$out"
            rc=1
        else
            att_b blocks "$meta" tx-$name req-netns "$IP_B:40000" $steal ||
                rc=1
            wait_line ${name}_pA '^STAT 0 notify\.wrong_peer=1$' $WAIT ||
                rc=1
            wait_line ${name}_pA '^STAT 0 rx_refused=1$' $WAIT || rc=1
            if grep -q '^STAT 0 dp_msgs_refused=2$' "$log"; then
                echo "B's own remote_blocks was not authenticated" >>"$out"
                rc=1
            fi
        fi
        if grep -q '^RANK' "$log"; then
            echo "a forged remote_blocks ended P's transfer" >>"$out"
            rc=1
        fi
        start ${name}_dC "$NS_C" "${d[@]}"
        finish ${name}_dC || rc=1
        wait_line ${name}_pA '^RANK 0 OK released' $WAIT || rc=1
        wait_line ${name}_pA '^HOLD' $WAIT || rc=1
    else
        rc=1
    fi
    stop_started $name dC pA || rc=1
    verdict "$name" $rc ${name}_pA ${name}_attB ${name}_dC
}
if want blocks_thief; then
    if [ -n "$ATTACK" ]; then
        run_blocks_thief
    else
        echo "FAIL blocks_thief: no attack program (second argument)"
        FAILED=$((FAILED + 1))
    fi
fi

# The two cases below show library defects found while writing this test
# (see the report); they are registered as a separate meson test.
#
# (d) peer_gone: after a good transfer P and D are told to exit at the same
# moment, so D's UCX endpoints to P fail (error callbacks on D's progress
# threads) while D destroys its engines. Every engine must be destroyed
# cleanly: the process prints "TEARDOWN clean" and exits 0.
run_peer_gone() {
    local name=peer_gone_$1 rc=0 n pids=()
    local all=("${name}_pA" "${name}_pB" "${name}_dC" "${name}_dD")
    start_p $name 16 1 tx-$name --hold 1 --destroy-threads 1
    if wait_ready ${name}_pA 60 && wait_ready ${name}_pB 60; then
        start_d $name 16 1 tx-$name --hold 1 --destroy-threads 1 \
            -- --hold 1 --destroy-threads 1
        for n in "${all[@]}"; do
            wait_line $n '^HOLD' $WAIT || rc=1
        done
    else
        rc=1
    fi
    for n in "${all[@]}"; do
        eval "pids+=(\${PID_$n:-})"
    done
    # One kill for all four (only those of our children still running).
    local live=()
    mapfile -t live < <(jobs -rp | grep -xF "$(printf '%s\n' "${pids[@]}")")
    [ ${#live[@]} -gt 0 ] && kill -TERM "${live[@]}" 2>/dev/null
    for n in "${all[@]}"; do
        [ -n "$(eval "echo \${PID_$n:-}")" ] || continue
        finish $n || rc=1
    done
    verdict "$name" $rc "${all[@]}"
}

# (e) release_on_destroy: each D engine is destroyed as soon as its transfer
# completed (wait_transfer returned KVX_OK, FINISHED_RECVING polled). The
# release it owes its P rank must still reach P: every P rank must report
# FINISHED_SENDING well before defer_timeout.
run_release_on_destroy() {
    local name=release_on_destroy_$1 rc=0 n
    # A release normally arrives within milliseconds: P waits 15 s for it.
    start_p $name 16 1 tx-$name --hold 1 --timeout 15
    if wait_ready ${name}_pA 60 && wait_ready ${name}_pB 60; then
        start_d $name 16 1 tx-$name --destroy-on-done 1 \
            -- --destroy-on-done 1
        finish ${name}_dC || rc=1
        finish ${name}_dD || rc=1
        for n in pA pB; do
            wait_line ${name}_$n '^HOLD' $WAIT || rc=1
        done
    else
        rc=1
    fi
    for n in pA pB; do
        [ -n "$(eval "echo \${PID_${name}_$n:-}")" ] || continue
        stop ${name}_$n || rc=1
    done
    verdict "$name" $rc ${name}_pA ${name}_pB ${name}_dC ${name}_dD
}

ROUNDS=${KVX_NETNS_ROUNDS:-3}
# One CPU for every process widens the races these cases look for.
if command -v taskset >/dev/null 2>&1; then
    PIN=(taskset -c 0)
fi
if want peer_gone; then
    for round in $(seq 1 "$ROUNDS"); do run_peer_gone $round; done
fi
if want release_on_destroy; then
    for round in $(seq 1 "$ROUNDS"); do run_release_on_destroy $round; done
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
