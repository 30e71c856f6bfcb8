#!/bin/bash
# run_security.sh - attacks on real engines while a legitimate transfer
# runs (issue 11). P and D are kvxfer_demo processes (one prefill, one
# decode, READ mode, tiny model); the attacker is tests/security/attack.c, a
# separate process with its own nng code. Source addresses on loopback stand
# for hosts: 127.0.0.1 is the trusted host, 127.0.0.2 an untrusted one
# (trusted_remote_hosts = 127.0.0.1/32).
#
#   plain   no TLS: forged handshake request and forged release /
#           write_done / remote_blocks / bare transfer id from the untrusted
#           host are refused (no metadata leaves); a connection that sends
#           thousands of handshake requests and never reads is dropped
#           while D's handshake and transfer complete; a 9 MiB message is
#           dropped; D verifies every byte and P sees its release.
#   fake    fake handshake responders (another engine's metadata replayed
#           on another port; worker address, rkey or layer length that the
#           local side must not accept): D refuses each with the rule.
#   rma     UCX's software RMA over tcp: a P allowing shared memory and tcp
#           (like UCX's default) publishes its worker addresses and rkeys;
#           the attacker's own UCP worker (tcp) gets nothing served through
#           any of them, while D's transfer is byte-exact; control: the
#           same get against a P on UCX's own emulation is served.
#   tls     mutual TLS (certificates made here with openssl): plain TCP,
#           a certificate of the right CA with the wrong name and one of
#           another CA with the right name all get no answer, while the
#           legitimate TLS transfer is byte-exact; a TLS D refuses a plain
#           responder.
#
# Usage: run_security.sh ATTACK DEMO. Prints "N passed, M failed".
set -uo pipefail
ATTACK=$1
DEMO=$2
WORK=$(mktemp -d /tmp/kvx-security.XXXXXX)
PIDS=()
pass=0
failed=0

cleanup() {
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null
    done
    wait 2>/dev/null
    [ -n "${KVX_SECURITY_KEEP:-}" ] && echo "kept $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT

ok() { echo "PASS: $*"; pass=$((pass + 1)); }
# sanitizer_clean FILE...: no ASan/UBSan report in the processes' output
# (an expected failure must not hide a crash).
sanitizer_clean() {
    ! grep -l "ERROR: AddressSanitizer\|runtime error:\|ERROR: LeakSanitizer" "$@" 2>/dev/null
}
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
# att: the attacker, every run bounded (a hang fails the step, not the suite).
att() { timeout -k 5 120 "$ATTACK" "$@"; }

# Under LeakSanitizer the prefill process that faced the stalled reader
# reports a few lost reply messages (~1.8 KB each, allocated in libnng for
# kvn's reply path) after connections with queued replies were closed: a
# reply handed to a pipe whose send aio the closing pipe already stopped is
# never freed by libnng 1.5.2's transport (nng issue #1713, "SP pipe_send
# leaks message if aio is canceled", fixed in 1.6.0). The stalled-reader
# attack closes such connections on purpose. Suppressed here, for this test
# only, by the library's name.
printf 'leak:libnng.so.1\n' >"$WORK/lsan.supp"
export LSAN_OPTIONS="suppressions=$WORK/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# Ports: a base chosen per run; the demo binds P at B, B+1 and D at B+2, B+3.
BASE=$((21000 + ($$ % 1000) * 8))
H=127.0.0.1
U=127.0.0.2
RIDP() { # request id naming P at handshake port $1
    echo "___prefill_addr_host:$H,handshake:$1,notify:$(($1 + 1))___decode_addr_host:$H,handshake:$((BASE + 2)),notify:$((BASE + 3))_0123456789abcdef0123456789abcdef"
}

# --- certificates ---------------------------------------------------------
cert() { # dir name cn ca_dir
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$1/$2.key" -out "$1/$2.csr" -subj "/CN=$3" 2>/dev/null &&
    openssl x509 -req -in "$1/$2.csr" -CA "$4/ca.crt" -CAkey "$4/ca.key" \
        -CAcreateserial -out "$1/$2.crt" -days 2 2>/dev/null
}
ca() { # dir cn
    mkdir -p "$1" &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
        -nodes -keyout "$1/ca.key" -out "$1/ca.crt" -subj "/CN=$2" \
        -days 2 2>/dev/null
}
if ! ca "$WORK/pki" kvxfer-test-ca || ! cert "$WORK/pki" peer kvxfer-peer "$WORK/pki" ||
   ! cert "$WORK/pki" intruder intruder "$WORK/pki" ||
   ! ca "$WORK/rogue" kvxfer-rogue-ca || ! cert "$WORK/rogue" peer kvxfer-peer "$WORK/rogue"; then
    echo "cannot make certificates with openssl"
    exit 1
fi

# start_p PORT EXTRA...: a prefill process holding tx-1 for D.
start_p() {
    local port=$1
    shift
    "$DEMO" --model tiny --role prefill --hs-port "$port" \
        --notify-port $((port + 1)) --transfer-id tx-1 \
        --request-id "$(RIDP "$port")" --trusted $H/32 --timeout 60 "$@" \
        >"$WORK/p.out" 2>>"$WORK/p.err" &
    P_PID=$!
    PIDS+=("$P_PID")
    att wait $H "$port" 30 || return 1
    for _ in $(seq 1 300); do
        grep -q '^PARAMS' "$WORK/p.out" && return 0
        sleep 0.1 # polls a file the process writes; bounded (30 s)
    done
    return 1
}

# run_d HSPORT OUT EXTRA...: the decode process reading tx-1 from a P whose
# handshake port is HSPORT (the real one or a fake). Against a fake, P's
# remote_hold_ms is left out (as from a P that does not say it): the fakes
# are tried one after the other against one P, and D must get to their
# handshake even when the real P's hold of tx-1 ended meanwhile.
run_d() {
    local hs=$1 out=$2 hold=
    shift 2
    [ "$hs" = "$BASE" ] || hold='s/,"remote_hold_ms":[0-9]*//'
    grep -m1 '^PARAMS' "$WORK/p.out" |
        sed -e "s/\"remote_handshake_port\":[0-9]*/\"remote_handshake_port\":$hs/" \
            -e "s/\"remote_notify_port\":[0-9]*/\"remote_notify_port\":$((hs + 1))/" \
            -e "${hold:-s/^//}" |
        timeout -k 5 60 "$DEMO" --model tiny --role decode --hs-port $((BASE + 2)) \
            --notify-port $((BASE + 3)) --transfer-id tx-1 \
            --request-id "$(RIDP "$hs")" --trusted $H/32 --timeout 30 "$@" \
            >"$out" 2>&1
    local rc=$?
    cat "$out" >>"$WORK/all-d.out"
    return $rc
}

# dump_p WHY: what P's threads are doing (a hang must leave its stacks in
# the log: gdb when installed, else each thread's kernel wait channel), and
# the tail of P's output.
dump_p() {
    echo "--- P (pid $P_PID): $1"
    if command -v gdb >/dev/null; then
        timeout -k 5 60 gdb -batch -nx -p "$P_PID" -ex "thread apply all bt" \
            2>&1 | grep -v "^\[New LWP\|^$" | head -400
    else
        for t in /proc/"$P_PID"/task/*; do
            echo "$(cat "$t/comm" 2>/dev/null) $(cat "$t/wchan" 2>/dev/null)"
        done
    fi
    echo "--- P stdout (tail)"
    tail -5 "$WORK/p.out"
    echo "--- P stderr (tail)"
    tail -15 "$WORK/p.err"
}

# wait_p: P's exit status, or failure when it is still running after 60 s
# (a hang is a defect to report, not a test to wait out).
wait_p() {
    local end=$((SECONDS + 60))
    while kill -0 "$P_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do
        sleep 0.2 # polls the condition (P exited); bounded by the deadline
    done
    if kill -0 "$P_PID" 2>/dev/null; then
        echo "P (pid $P_PID) still running after 60 s"
        dump_p "still running after 60 s"
        kill -9 "$P_PID"
        return 1
    fi
    wait "$P_PID"
}

# --- plain: forged messages, stalled reader, big message -------------------
echo "== plain"
if start_p "$BASE"; then
    timeout -k 5 120 "$ATTACK" stall $H "$BASE" 20000 8 >"$WORK/stall.out" 2>&1 &
    STALL=$!
    PIDS+=("$STALL")
    att forge $U $H "$BASE" $((BASE + 1)) && ok "forged messages from an untrusted host refused" ||
        bad "forged messages from an untrusted host"
    att big $H $((BASE + 1)) 9 && ok "9 MiB message dropped" || bad "big message answered"
    if run_d "$BASE" "$WORK/d.out"; then
        grep -q "verified" "$WORK/d.out" && ok "D byte-exact during the attacks" ||
            bad "D did not verify"
    else
        bad "legitimate transfer failed during the attacks: $(tail -3 "$WORK/d.out")"
    fi
    if wait "$STALL"; then
        ok "stalled reader dropped ($(tail -1 "$WORK/stall.out"))"
    else
        bad "stalled reader: $(cat "$WORK/stall.out")"
        kill -0 "$P_PID" 2>/dev/null && dump_p "a stalled reader was not dropped"
    fi
    wait_p && ok "P released by D" || bad "P failed: $(tail -3 "$WORK/p.err")"
else
    bad "prefill did not start: $(tail -3 "$WORK/p.err")"
fi

# --- fake handshake responders --------------------------------------------
echo "== fake responders"
declare -A RULE=(
    [other_engine]="must be the engine dialled"
    [bad_addr]="worker_addr: 300000 bytes: must be 1..65536"
    [bad_rkey]="layers\[0\].rkey: 30000 bytes: must be 1..16384"
    [bad_layer]="must be non-empty, not wrap and fit the length"
)
if start_p "$BASE" && att fetch $H "$BASE" "$WORK/meta.json"; then
    F=$((BASE + 4))
    for mode in other_engine bad_addr bad_rkey bad_layer; do
        timeout -k 5 120 "$ATTACK" respond $H $F $mode 20 "$WORK/meta.json" >"$WORK/resp.out" 2>&1 &
        R=$!
        PIDS+=("$R")
        att wait $H $F 10 >/dev/null
        if run_d $F "$WORK/d-$mode.out"; then
            bad "$mode: D accepted the fake reply"
        elif grep -q "${RULE[$mode]}" "$WORK/d-$mode.out"; then
            ok "$mode: D refused the reply (${RULE[$mode]})"
        else
            bad "$mode: D failed without the rule: $(grep -m1 HANDSHAKE "$WORK/d-$mode.out"); responder: $(cat "$WORK/resp.out"); P: $(tail -2 "$WORK/p.err")"
        fi
        kill "$R" 2>/dev/null
        wait "$R" 2>/dev/null
    done
    kill "$P_PID" 2>/dev/null
    wait "$P_PID" 2>/dev/null
else
    bad "prefill did not start: $(tail -3 "$WORK/p.err")"
fi

# --- data plane: UCX's software RMA over tcp --------------------------------
echo "== rma"
if start_p "$BASE" --tls sm,tcp && att fetch $H "$BASE" "$WORK/meta-rma.json"; then
    if att rma "$WORK/meta-rma.json" 2 >"$WORK/rma.out" 2>&1 &&
       grep -q " 1 reachable over tcp, 0 served" "$WORK/rma.out"; then
        ok "foreign UCP get over tcp not served ($(tail -1 "$WORK/rma.out"))"
    else
        bad "foreign UCP get over tcp: $(tail -3 "$WORK/rma.out")"
    fi
    if run_d "$BASE" "$WORK/d-rma.out"; then
        grep -q "verified" "$WORK/d-rma.out" &&
            ok "D (tcp) byte-exact from a P with a tcp plane" || bad "D did not verify"
    else
        bad "transfer from a P with a tcp plane failed: $(tail -3 "$WORK/d-rma.out")"
    fi
    wait_p && ok "P (sm,tcp) released by D" || bad "P failed: $(tail -3 "$WORK/p.err")"
else
    bad "prefill (sm,tcp) did not start: $(tail -3 "$WORK/p.err")"
fi
export KVX_UCX_AM_RMA=0 # control: UCX's own emulation serves anyone
if start_p "$BASE" --tls sm,tcp && att fetch $H "$BASE" "$WORK/meta-emu.json"; then
    att rma "$WORK/meta-emu.json" 10 >"$WORK/rma-emu.out" 2>&1
    rc=$?
    [ $rc = 1 ] && ok "control: the same get is served by UCX's emulation ($(tail -1 "$WORK/rma-emu.out"))" ||
        bad "control attack not served (rc $rc): $(tail -3 "$WORK/rma-emu.out")"
    kill "$P_PID" 2>/dev/null
    wait "$P_PID" 2>/dev/null
else
    bad "prefill (KVX_UCX_AM_RMA=0) did not start: $(tail -3 "$WORK/p.err")"
fi
unset KVX_UCX_AM_RMA

# --- TLS: wrong identities --------------------------------------------------
echo "== tls"
T="--tls-dir $WORK/pki"
if start_p "$BASE" $T; then
    att plain $H "$BASE" && att plain $H $((BASE + 1)) &&
        ok "plain TCP to TLS ports: no answer" || bad "plain TCP answered"
    att tlsid $H "$BASE" "$WORK/pki/intruder.crt" "$WORK/pki/intruder.key" \
        "$WORK/pki/ca.crt" kvxfer-peer &&
        ok "right CA, wrong name: no answer" || bad "wrong-name certificate answered"
    att tlsid $H $((BASE + 1)) "$WORK/rogue/peer.crt" "$WORK/rogue/peer.key" \
        "$WORK/pki/ca.crt" kvxfer-peer &&
        ok "other CA, right name: no answer" || bad "rogue-CA certificate answered"
    if run_d "$BASE" "$WORK/d.out" $T && grep -q verified "$WORK/d.out"; then
        ok "TLS transfer byte-exact during the attacks"
    else
        bad "TLS transfer failed: $(tail -3 "$WORK/d.out")"
    fi
    wait_p && ok "TLS P released by D" || bad "TLS P failed: $(tail -3 "$WORK/p.err")"
else
    bad "TLS prefill did not start: $(tail -3 "$WORK/p.err")"
fi
# A TLS D refuses a plain responder (plain refused both ways).
if start_p "$BASE" $T; then
    F=$((BASE + 4))
    timeout -k 5 120 "$ATTACK" respond $H $F other_engine 20 "$WORK/meta.json" >/dev/null 2>&1 &
    R=$!
    PIDS+=("$R")
    att wait $H $F 10 >/dev/null
    if run_d $F "$WORK/d-plain.out" $T; then
        bad "TLS D accepted a plain responder"
    elif grep -q "tls+tcp" "$WORK/d-plain.out" && ! grep -q "HANDSHAKE-OK" "$WORK/d-plain.out"; then
        ok "TLS D got nothing from a plain responder"
    else
        bad "TLS D vs plain responder: $(grep -m1 -i handshake "$WORK/d-plain.out")"
    fi
    kill "$R" "$P_PID" 2>/dev/null
    wait "$R" "$P_PID" 2>/dev/null
fi

if sanitizer_clean "$WORK"/*.out "$WORK"/*.err; then
    ok "no sanitizer report from any process"
else
    bad "sanitizer reports (above)"
fi
echo "$pass passed, $failed failed"
[ "$failed" = 0 ]
