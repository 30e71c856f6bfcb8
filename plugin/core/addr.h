/*
 * addr.h - peer addressing: request_id / zmq_address parsing (SPEC §3),
 * the single trust check (SPEC §4), host of a remote rank (SPEC §4) and the
 * TP rank mapping with its ack quorum (SPEC §4).
 *
 * Every function is pure (no I/O, no DNS) and reports errors with
 * kvc_error(): the text names the field, the value and the rule.
 *
 * Threading: pure functions, any thread.
 */
#ifndef KVC_ADDR_H
#define KVC_ADDR_H

#include "config.h"
#include "error.h"
#include "kvt.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvc_peer_addr {
    char     host[KVC_HOST_MAX];
    uint32_t handshake_port; /* base port of the instance */
    uint32_t notify_port;    /* base port of the instance */
} kvc_peer_addr_t;

/* kvc_zmq_addr_parse parses "host:H,handshake:N,notify:M" (len bytes of s;
 * keys in any order, each segment split on its FIRST colon so IPv6 hosts
 * work; all three keys required; ports decimal 1..65535). field names the
 * source for error text. KVX_ERR_INVALID_PARAM on error. */
kvx_status_t kvc_zmq_addr_parse(const char *s, size_t len, const char *field,
                                kvc_peer_addr_t *out);

/* kvc_zmq_addr_format writes "host:H,handshake:N,notify:M"; returns the
 * snprintf result. */
int kvc_zmq_addr_format(const kvc_peer_addr_t *addr, char *buf, size_t len);

/*
 * kvc_reqid_parse extracts a peer address from a proxy request_id
 * "[prefix]___prefill_addr_<zmq>___decode_addr_<zmq>_<32 hex>[suffix]".
 * want_prefill=1 (the decode side): the text between "___prefill_addr_" and
 * "___decode_addr_". want_prefill=0 (the prefill side): the text after
 * "___decode_addr_" up to the LAST "_" followed by exactly 32 lowercase hex
 * digits (then end of string or any suffix). KVX_ERR_INVALID_PARAM naming
 * field "request_id" when markers are missing or the address is malformed.
 */
kvx_status_t kvc_reqid_parse(const char *request_id, int want_prefill,
                             kvc_peer_addr_t *out);

/* kvc_port_check: 1024..65535, else KVX_ERR_UNTRUSTED_PEER naming field and
 * value. */
kvx_status_t kvc_port_check(uint64_t port, const char *field);

/* A compiled trust list: host names (case-insensitive exact match), IPv4 and
 * IPv6 literals (compared as addresses, so "::1" == "0:0::1") and CIDR
 * ranges "10.0.0.0/8", "fd00::/8". */
typedef struct kvc_trust_entry {
    int      kind;       /* 0 name, 4 IPv4 (cidr), 6 IPv6 (cidr) */
    char     name[KVC_HOST_MAX];
    uint8_t  addr[16];
    uint32_t prefix;     /* bits */
} kvc_trust_entry_t;

typedef struct kvc_trust {
    int                set;      /* trusted_remote_hosts configured */
    kvc_trust_entry_t *entries;  /* owned */
    size_t             num_entries;
} kvc_trust_t;

/* kvc_trust_init compiles the list (set=0: no allow-list). A malformed
 * entry (bad CIDR prefix, empty) is KVX_ERR_CONFIG naming
 * trusted_remote_hosts[i]. kvc_trust_fini frees; zeroed struct is a no-op. */
kvx_status_t kvc_trust_init(kvc_trust_t *trust, char *const *hosts, size_t n,
                            int set);

/* kvc_trust_nets: the address entries of trust (IPv4, IPv6, CIDR; host
 * names match no inbound address and are left out) into out[0..max), for
 * the kernel filter of the data plane's listening sockets
 * (kvt_data_params_t.inbound). Returns how many there are (more than max:
 * only max were written). */
size_t kvc_trust_nets(const kvc_trust_t *trust, kvt_net_t *out, size_t max);
void kvc_trust_fini(kvc_trust_t *trust);

/*
 * kvc_trust_check is the one validation every request-derived peer host
 * passes before any connection or send (SPEC §4). Always: the host must be
 * well-formed (non-empty, <= 253 chars, a valid IPv4/IPv6 literal or a host
 * name of [A-Za-z0-9.-] labels) and not a wildcard (0.0.0.0, ::), multicast
 * (224.0.0.0/4, ff00::/8) or broadcast (255.255.255.255) address. With the
 * allow-list set, the host must also match an entry. Rejection is
 * KVX_ERR_UNTRUSTED_PEER with text "peer host '<h>' from <field> rejected:
 * <rule>".
 */
kvx_status_t kvc_trust_check(const kvc_trust_t *trust, const char *host,
                             const char *field);

/*
 * kvc_from_matches: is the sender address `from` ("ip:port", "[v6]:port",
 * as the control plane reports it) the peer host `host`? 1 yes, 0 no, -1
 * cannot tell (either is not an IP literal, e.g. a host name). Loopback
 * addresses match each other (a dial over loopback leaves from 127.0.0.1
 * whichever 127.x the peer listens on).
 */
int kvc_from_matches(const char *from, const char *host);

/*
 * kvc_host_session: the data-plane session of a host under key (a keyed
 * hash, kvc_siphash24, of its address: family and 16 bytes, every loopback
 * address counted as 127.0.0.1, as kvc_from_matches counts them). addr is
 * a sender address ("ip:port", "[v6]:port") when with_port, else a host;
 * never 0 for an IP literal, 0 for anything else (a host name, "", NULL).
 * A session of one host tells nothing of another's without the key.
 */
uint64_t kvc_host_session(const uint64_t key[2], const char *addr,
                          int with_port);

/*
 * kvc_notice_match: which of a WRITE transfer's n P ranks (hosts[i],
 * bound instances insts[i], 0 not bound yet) sent a data-plane completion
 * notice of tag, nonce, instance and xnonce (the use of the transfer id)
 * carrying mac (kvt.h notify). A rank matches when its instance is
 * instance and mac is kvc_req_mac(session of its host under key, tag,
 * nonce, instance, xnonce, KVC_MAC_NOTICE). Returns
 * its index; -1 when no rank can tell (no rank bound to that instance
 * yet, or its host is a name without a session: the control plane's
 * write_done decides); -2 when the notice is refused (instance 0, or a
 * rank of that instance whose session does not authenticate it).
 */
int kvc_notice_match(const uint64_t key[2], const char *const *hosts,
                     const uint64_t *insts, uint32_t n, uint64_t tag,
                     uint64_t nonce, uint64_t instance, uint64_t xnonce,
                     uint64_t mac);
/* kvc_notice_match_n: the same for a notice of count (KVC_COUNT_NONE: a
 * plain one, as kvc_notice_match), whose mac is kvc_notice_mac. */
int kvc_notice_match_n(const uint64_t key[2], const char *const *hosts,
                       const uint64_t *insts, uint32_t n, uint64_t tag,
                       uint64_t nonce, uint64_t instance, uint64_t xnonce,
                       uint64_t count, uint64_t mac);

/*
 * kvc_notice_from_ok: a notice whose sender claims to be at address from
 * ("ip:port" as the handshake responder saw it, its seen_as) is
 * authenticated: mac is kvc_req_mac(kvc_host_session(key, from, 1), tag,
 * nonce, instance, xnonce, KVC_MAC_NOTICE). 1 yes, 0 no (also for a from
 * that is no address).
 */
int kvc_notice_from_ok(const uint64_t key[2], const char *from, uint64_t tag,
                       uint64_t nonce, uint64_t instance, uint64_t xnonce,
                       uint64_t mac);

/*
 * kvc_host_resolve (SPEC §4): n <= 1 → advertised; else world =
 * remote_dp_size*remote_tp_size, world % n != 0 → KVX_ERR_CONFIG ("world W
 * is not a multiple of N remote_hosts"); index = (remote_dp_rank *
 * remote_tp_size + remote_tp_rank) / (world / n). Ranks out of range →
 * KVX_ERR_INVALID_PARAM. *host_p points into advertised or hosts (borrowed).
 * *index_p (may be NULL) gets the index used (-1 for advertised).
 */
kvx_status_t kvc_host_resolve(const char *advertised, char *const *hosts,
                              size_t n, uint32_t remote_dp_size,
                              uint32_t remote_tp_size, uint32_t remote_dp_rank,
                              uint32_t remote_tp_rank, const char **host_p,
                              int *index_p);

#define KVC_RANKMAP_MAX 64

/*
 * kvc_notice_ranks: of a WRITE transfer's n P ranks (hosts[i]), those in
 * candidates (a mask, bit i: rank i, i < 64) whose host's session under
 * key gives a notice of tag, nonce, instance and xnonce the mac it
 * carries, as if each were bound to that instance: the ranks a completion
 * that overtook the reply binding its sender may belong to. *checked_p
 * (may be NULL) tells whether any candidate's host has a session (an
 * address); 0 with it set is a notice none of them sent.
 */
uint64_t kvc_notice_ranks(const uint64_t key[2], const char *const *hosts,
                          uint32_t n, uint64_t candidates, uint64_t tag,
                          uint64_t nonce, uint64_t instance, uint64_t xnonce,
                          uint64_t mac, int *checked_p);
/* kvc_notice_ranks_n: the same for a notice of count (kvc_notice_match_n). */
uint64_t kvc_notice_ranks_n(const uint64_t key[2], const char *const *hosts,
                            uint32_t n, uint64_t candidates, uint64_t tag,
                            uint64_t nonce, uint64_t instance,
                            uint64_t xnonce, uint64_t count, uint64_t mac,
                            int *checked_p);

/*
 * kvc_early_done_t: completions (write_done or notice) of a D WRITE
 * transfer from P instances no rank is bound to yet, each with the mask of
 * the ranks it may complete (those of the host it came from). keep merges
 * a repeat of an instance and reuses taken slots; it drops (returns 0)
 * instance 0, an empty mask and a completion when every slot is in use.
 * take consumes the entry of inst when it names rank k (returns 1): a
 * completion from one P host never finishes the rank of another host by
 * naming that rank's instance.
 */
typedef struct kvc_early_done {
    uint64_t inst[KVC_RANKMAP_MAX];
    uint64_t ranks[KVC_RANKMAP_MAX];
} kvc_early_done_t;

int kvc_early_done_keep(kvc_early_done_t *s, uint64_t inst, uint64_t ranks);
int kvc_early_done_take(kvc_early_done_t *s, uint64_t inst, uint32_t k);

/*
 * kvc_replay_t: a P engine's memory of the data-plane control messages it
 * took (kvt.h ctl), so that one captured on the unencrypted data plane
 * cannot be replayed (from any host: the data plane carries no sender
 * address, only the claim under the mac). A message's nonce is its
 * sender's stamp (kvt_clock_t.stamp: microseconds << shift), strictly
 * increasing per sender, a sender being one engine instance (inst) of one
 * host (host: its session). kvc_replay_check refuses (returns a reason,
 * else NULL and records it) a nonce more than window_us from now either
 * way (the hosts' clocks must agree that well), one already taken from
 * that sender, and one older than the oldest of the KVC_REPLAY_DEPTH last
 * taken from it (reordered that far, or replayed after them). A new
 * sender takes the least recently heard slot, of its own host once that
 * host holds KVC_REPLAY_PER_HOST (so one host, which can name any
 * instance, forgets mostly its own senders). A forgotten sender leaves a
 * floor, its newest stamp, kept with its host and instance: when it is
 * heard again its slot refuses anything not above the floor (its replays,
 * or its own messages reordered past its forgetting). KVC_REPLAY_FLOORS
 * floors are kept, at most KVC_REPLAY_FLOORS_PER_HOST of one host (its
 * lowest goes first), else the lowest of all: so a replay within the
 * window of a forgotten sender's message passes only once its floor was
 * dropped, which needs KVC_REPLAY_FLOORS / KVC_REPLAY_FLOORS_PER_HOST hosts
 * with sessions forgetting senders within the window. Other instances of
 * the same host are not affected by a floor. Zeroed: empty.
 */
#define KVC_REPLAY_DEPTH    32
#define KVC_REPLAY_SENDERS  256
#define KVC_REPLAY_PER_HOST 16
#define KVC_REPLAY_FLOORS   1024 /* floors of forgotten senders */
#define KVC_REPLAY_FLOORS_PER_HOST 64
typedef struct kvc_replay {
    struct {
        uint64_t host, inst, last_heard; /* last_heard 0: free */
        uint64_t floor; /* nonces up to it are refused (0: none) */
        uint64_t seen[KVC_REPLAY_DEPTH];
        uint32_t n;
    } s[KVC_REPLAY_SENDERS];
    struct {
        uint64_t host, inst, floor; /* floor 0: free */
    } f[KVC_REPLAY_FLOORS];
    uint64_t heard; /* counter for last_heard */
} kvc_replay_t;

const char *kvc_replay_check(kvc_replay_t *r, uint64_t host, uint64_t inst,
                             uint64_t nonce, uint64_t now, unsigned shift,
                             uint64_t window_us);

/* kvc_rankmap_t: what one consumer (D) rank does against a producer (P)
 * instance. */
typedef struct kvc_rankmap {
    uint32_t read_rank;      /* P TP rank whose blocks D reads */
    uint32_t head_slice;     /* slice index within read_rank's heads
                                (sharded hetero TP only; else 0) */
    uint32_t num_slices;     /* 1 unless sharded hetero TP */
    uint32_t gather;         /* sharded, D tp < P tp: D assembles its heads
                                from the num_release ranks (part k from
                                release[k]); num_slices = that count */
    uint32_t num_release;    /* P ranks D must release */
    uint32_t release[KVC_RANKMAP_MAX];
} kvc_rankmap_t;

/*
 * kvc_rankmap (SPEC §4). Equal TP: read = release = d. Sizes must divide
 * (else KVX_ERR_CONFIG). replicated (MLA/key-only, or heads replicated):
 * d_tp > p_tp → read d / (d_tp/p_tp), release {that}; d_tp < p_tp → read d*r
 * (r = p_tp/d_tp), release d*r .. d*r+r-1. Sharded heads (not
 * replicated): d_tp > p_tp → read d / q (q = d_tp/p_tp), head slice d % q of
 * q, release {that} (so each P rank's quorum is q); d_tp < p_tp → gather: D
 * reads part k of its heads from P rank d*r+k and releases all r (quorum
 * 1). d_rank >= d_tp → KVX_ERR_INVALID_PARAM.
 */
kvx_status_t kvc_rankmap(uint32_t d_tp, uint32_t p_tp, int replicated,
                         uint32_t d_rank, kvc_rankmap_t *map);

/* KVC_HEADS_SHARDED: heads per rank "as many as the other side needs"
 * (kvc_rankmap's sharded reading, no side replicating heads). */
#define KVC_HEADS_SHARDED UINT32_MAX

/*
 * kvc_rankmap_heads is the rank map with the KV heads each rank holds
 * (d_heads on D, p_heads on P; of the layers that are not key-only; 0 for
 * a model of key-only layers only, held whole by every rank). Release sets
 * are those of kvc_rankmap (they do not depend on heads). D tp = q x P tp:
 * P's p_heads are cut into num_slices = min(p_heads, q) slices, D rank d
 * reads slice (d % q) / (q / num_slices): with p_heads < q the heads are
 * replicated on D (vLLM: KV heads < TP). P tp = r x D tp: D's heads come
 * in num_slices = min(d_heads, r) parts (gather when > 1) from
 * release[0..num_slices-1] (part k from P rank d*r + k*r/num_slices); the
 * other release ranks hold replicas and are only released. A count that
 * does not divide the other → KVX_ERR_PEER_INCOMPATIBLE naming it. The
 * heads that matter are known before the handshake on the side that needs
 * them most: d_heads for the gather direction, p_heads only for the slice
 * index (one source either way).
 */
kvx_status_t kvc_rankmap_heads(uint32_t d_tp, uint32_t p_tp, uint32_t d_heads,
                               uint32_t p_heads, uint32_t d_rank,
                               kvc_rankmap_t *map);

/* kvc_ack_quorum: number of D ranks whose kvc_rankmap().release contains
 * p_rank, computed by calling kvc_rankmap for every d (the same function,
 * SPEC §4). */
kvx_status_t kvc_ack_quorum(uint32_t d_tp, uint32_t p_tp, int replicated,
                            uint32_t p_rank, uint32_t *quorum_p);

/* kvc_xfer_params_t: the kv_transfer_params fields the engines read
 * (SPEC §3). Absent numeric fields are 0; absent strings empty. */
typedef struct kvc_xfer_params {
    char      transfer_id[KVX_ID_MAX];
    int       has_remote_addr;   /* remote_host + both ports present */
    kvc_peer_addr_t remote;      /* valid if has_remote_addr */
    char    **remote_hosts;      /* owned; list or comma string */
    size_t    num_remote_hosts;
    int       has_remote_block_ids;
    uint64_t *remote_block_ids;  /* owned */
    size_t    num_remote_block_ids;
    char      remote_engine_id[KVX_ID_MAX];
    uint32_t  remote_tp_size;    /* remote_tp_size, else tp_size, else 0 */
    uint32_t  remote_dp_size;
    uint32_t  remote_dp_rank;
    /* The producer rank that answered the request and its instance: D
     * fails the transfer if another instance of that rank answers its
     * handshake (0 / has_remote_instance 0: not bound, legacy P). */
    uint64_t  remote_instance;
    uint32_t  remote_tp_rank;
    int       has_remote_instance;
    /* When that rank accepted it, on the instance-id scale: D fails the
     * transfer if another P rank it reads from started later. */
    uint64_t  remote_accepted;
    int       has_remote_accepted;
    /* How long after remote_accepted that rank holds the blocks (its
     * defer_timeout), milliseconds; 0: not said (legacy P). */
    uint32_t  remote_hold_ms;
    int       do_remote_prefill;
    int       do_remote_decode;
} kvc_xfer_params_t;

/* kvc_params_parse: NULL or "" json = all defaults. A string holding a NUL
 * (\u0000) is refused. Wrong types → 
 * KVX_ERR_INVALID_PARAM naming the field (e.g. "kv_transfer_params.
 * remote_block_ids[3]: value -1: must be a non-negative integer"). Ports in
 * explicit addresses are range-checked with kvc_port_check. On error nothing
 * to free. */
kvx_status_t kvc_params_parse(const char *json, kvc_xfer_params_t *p);
/* kvc_params_parse_json_c: the same, always through json-c. Params in the
 * flat reader's subset (pval.h) skip json-c in kvc_params_parse; tests and
 * fuzz_params check that both ways give the same fields and errors. */
kvx_status_t kvc_params_parse_json_c(const char *json, kvc_xfer_params_t *p);
void kvc_params_fini(kvc_xfer_params_t *p);

/*
 * kvc_params_peer_addr picks the peer instance address: the explicit
 * remote_host/remote_handshake_port/remote_notify_port when all three were
 * present, else parsed from request_id (want_prefill as kvc_reqid_parse).
 * *field_p (may be NULL) gets the source name: "remote_host" or
 * "request_id".
 */
kvx_status_t kvc_params_peer_addr(const kvc_xfer_params_t *p,
                                  const char *request_id, int want_prefill,
                                  kvc_peer_addr_t *out, const char **field_p);

/*
 * kvc_params_build_decode (proxy helper, SPEC §3): from P's response params
 * JSON build D's kv_transfer_params: do_remote_prefill true,
 * do_remote_decode false, transfer_id (argument wins; else P's), and copies
 * remote_block_ids, remote_engine_id, remote_host, remote_handshake_port,
 * remote_notify_port, remote_hosts; remote_tp_size from P's tp_size (or
 * remote_tp_size); remote_dp_size; remote_dp_rank if present. Returns a
 * malloc'd JSON string in *out_p.
 */
kvx_status_t kvc_params_build_decode(const char *prefill_response_json,
                                     const char *transfer_id, char **out_p);

#endif
