/*
 * siphash.h - SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit
 * pseudorandom function. kvxfer uses it where a value handed to a peer must
 * not let that peer compute the value of another input (the data-plane
 * session of a host, plugin/engine/expose.c), for the macs under it, and
 * where no one may find a second input of a given value (a transfer id's
 * tag, kvc_xfer_tag).
 *
 * Threading: pure, any thread.
 */
#ifndef KVC_SIPHASH_H
#define KVC_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* kvc_siphash24: SipHash-2-4 of len bytes at data under the 128-bit key
 * (key[0] the first eight key bytes read little-endian, key[1] the last). */
uint64_t kvc_siphash24(const uint64_t key[2], const void *data, size_t len);

/* kvc_xfer_tag: the 64-bit tag of a transfer id (never 0) that ops and
 * notices carry to the peer (kvt_op_t.tag) and that their macs cover in
 * place of the id: SipHash-2-4 of the id's bytes under a fixed, public key.
 * Not secret; what matters is that no one can find another id with the
 * tag of a given one (a second preimage) faster than by trying about 2^64
 * ids, so a mac'd request or notice names one transfer id. */
uint64_t kvc_xfer_tag(const char *transfer_id);

/* kvc_req_mac: the authenticator a data-plane request carries instead of
 * its endpoint's session (kvt.h authorize): SipHash-2-4 under the session
 * of the request's tag, nonce, target address, length and direction, so
 * the session itself never travels with data-plane traffic and a captured
 * request authenticates only itself. 0 when session is 0 (none set).
 * is_put: 0 get, 1 put, KVC_MAC_NOTICE a completion notice (kvt.h notify:
 * addr is the sender's instance, len the transfer's xnonce). */
#define KVC_MAC_NOTICE 2
uint64_t kvc_req_mac(uint64_t session, uint64_t tag, uint64_t nonce,
                     uint64_t addr, uint64_t len, int is_put);

/* kvc_count_mac: the authenticator of a counted completion notice (kvt.h
 * notify_queued): SipHash-2-4 under the session (a key domain of its own)
 * of tag, nonce, instance, xnonce and count, so no request or plain
 * notice mac authenticates one and its count cannot be changed. 0 when
 * session is 0. */
uint64_t kvc_count_mac(uint64_t session, uint64_t tag, uint64_t nonce,
                       uint64_t instance, uint64_t xnonce, uint64_t count);

/* kvc_notice_mac: a notice's authenticator by its count: kvc_req_mac(...,
 * KVC_MAC_NOTICE) for a plain notice (count KVC_COUNT_NONE), else
 * kvc_count_mac. */
#define KVC_COUNT_NONE UINT64_MAX
uint64_t kvc_notice_mac(uint64_t session, uint64_t tag, uint64_t nonce,
                        uint64_t instance, uint64_t xnonce, uint64_t count);

/* kvc_msg_mac: the authenticator of a control message sent on the data
 * plane (kvt.h ctl_send): SipHash-2-4 under the session (a key domain of
 * its own: no request or notice mac authenticates a message) of the nonce
 * and the len bytes of msg (hashed in place, no copy). 0 when session is
 * 0. */
uint64_t kvc_msg_mac(uint64_t session, uint64_t nonce, const void *msg,
                     size_t len);

#endif
