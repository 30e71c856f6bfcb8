/*
 * proxy.h - proxy-side helpers (SPEC §3), pure functions.
 */
#ifndef KVC_PROXY_H
#define KVC_PROXY_H

#include "addr.h"
#include "config.h"

/* kvc_registration_build: the registration payload of this instance
 * (SPEC §3: type, http_address, zmq_address, dp_size, tp_size,
 * transfer_mode, node_hosts). Malloc'd JSON in *out_p. */
kvx_status_t kvc_registration_build(const kvc_config_t *cfg, char **out_p);

/* kvc_params_build_prefill: from D's registration payload (type, zmq_address
 * "host:H,handshake:N,notify:M", dp_size, tp_size, node_hosts) build the
 * kv_transfer_params a proxy sends to P: do_remote_decode true, the
 * transfer_id, D's address, remote_tp_size / remote_dp_size = D's sizes and
 * remote_hosts = D's node_hosts. Malloc'd JSON in *out_p. */
kvx_status_t kvc_params_build_prefill(const char *decode_registration_json,
                                      const char *transfer_id, char **out_p);

#endif
