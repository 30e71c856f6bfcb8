/*
 * proxy.c - what a proxy does with registrations (SPEC §3): build the
 * kv_transfer_params it sends to P from D's registration payload, so that
 * P knows D's address, sizes and host list (WRITE mode pushes to it).
 * kvc_params_build_decode (addr.c) is the other direction.
 */
#include "proxy.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvx_status_t kvc_reg_parse(json_object *reg, kvc_peer_addr_t *addr,
                                  uint32_t *tp, uint32_t *dp,
                                  json_object **hosts_p);

kvx_status_t kvc_registration_build(const kvc_config_t *c, char **out_p)
{
    kvc_peer_addr_t addr;
    uint32_t        tp, dp;
    json_object    *reg_hosts;
    kvx_status_t    st;

    json_object *o     = json_object_new_object();
    json_object *hosts = json_object_new_array();
    char         buf[KVC_HOST_MAX + 64];

    if (o == NULL || hosts == NULL) {
        json_object_put(o);
        json_object_put(hosts);
        return kvc_error(KVX_ERR_NO_MEMORY, "registration: out of memory");
    }
    json_object_object_add(o, "type",
                           json_object_new_string(c->is_producer ? "P" : "D"));
    snprintf(buf, sizeof(buf), "%s:%u", c->host_ip, c->http_port);
    json_object_object_add(o, "http_address", json_object_new_string(buf));
    snprintf(buf, sizeof(buf), "host:%s,handshake:%u,notify:%u", c->host_ip,
             c->handshake_port, c->notify_port);
    json_object_object_add(o, "zmq_address", json_object_new_string(buf));
    json_object_object_add(o, "dp_size", json_object_new_int((int)c->dp_size));
    json_object_object_add(o, "tp_size", json_object_new_int((int)c->tp_size));
    json_object_object_add(o, "transfer_mode",
                           json_object_new_string(c->read_mode ? "READ"
                                                               : "WRITE"));
    for (size_t i = 0; i < c->num_node_hosts; i++) {
        json_object_array_add(hosts, json_object_new_string(c->node_hosts[i]));
    }
    json_object_object_add(o, "node_hosts", hosts);
    /* what the proxy helper cannot read is not sent: a host_ip that the
     * zmq_address cannot carry (a ',' in it), a node_hosts entry too long
     * for the params (the config does not check these) */
    st = kvc_reg_parse(o, &addr, &tp, &dp, &reg_hosts);
    if (st != KVX_OK) {
        json_object_put(o);
        return kvc_error(KVX_ERR_CONFIG, "registration of this instance "
                         "would not be readable by the proxy: %s",
                         kvc_last_error());
    }
    *out_p = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return *out_p != NULL ? KVX_OK
                          : kvc_error(KVX_ERR_NO_MEMORY,
                                      "registration: out of memory");
}

static kvx_status_t kvc_reg_int(json_object *reg, const char *key,
                                uint32_t *out)
{
    json_object *v;
    int64_t      n;

    if (!json_object_object_get_ex(reg, key, &v) ||
        !json_object_is_type(v, json_type_int)) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "registration.%s: missing or "
                         "not an integer", key);
    }
    n = json_object_get_int64(v);
    if (n < 1 || n > 65535) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "registration.%s: value %lld: "
                         "must be in 1..65535", key, (long long)n);
    }
    *out = (uint32_t)n;
    return KVX_OK;
}

static kvx_status_t kvc_reg_port(uint32_t port, const char *key)
{
    if (port < 1024) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "registration.zmq_address: "
                         "%s port %u: must be in 1024..65535", key,
                         (unsigned)port);
    }
    return KVX_OK;
}

static kvx_status_t kvc_reg_parse(json_object *reg, kvc_peer_addr_t *addr,
                                  uint32_t *tp, uint32_t *dp,
                                  json_object **hosts_p)
{
    json_object *v;
    const char  *z;
    kvx_status_t st;

    if (!json_object_object_get_ex(reg, "zmq_address", &v) ||
        !json_object_is_type(v, json_type_string)) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "registration.zmq_address: missing or not a string");
    }
    z  = json_object_get_string(v);
    st = kvc_zmq_addr_parse(z, (size_t)json_object_get_string_len(v),
                            "registration.zmq_address", addr);
    if (st == KVX_OK) {
        /* the params built here must pass kvc_params_parse, whose ports
         * are 1024..65535 (kvc_port_check) */
        st = kvc_reg_port(addr->handshake_port, "handshake");
    }
    if (st == KVX_OK) {
        st = kvc_reg_port(addr->notify_port, "notify");
    }
    if (st == KVX_OK) {
        st = kvc_reg_int(reg, "tp_size", tp);
    }
    if (st == KVX_OK) {
        st = kvc_reg_int(reg, "dp_size", dp);
    }
    *hosts_p = NULL;
    if (st == KVX_OK && json_object_object_get_ex(reg, "node_hosts", &v)) {
        if (!json_object_is_type(v, json_type_array)) {
            return kvc_error(KVX_ERR_INVALID_PARAM,
                             "registration.node_hosts: not a list");
        }
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            json_object *e = json_object_array_get_idx(v, i);

            if (!json_object_is_type(e, json_type_string)) {
                return kvc_error(KVX_ERR_INVALID_PARAM,
                                 "registration.node_hosts[%zu]: not a string",
                                 i);
            }
            /* copied into remote_hosts, whose entries kvc_params_parse
             * limits to KVC_HOST_MAX - 1 */
            if (json_object_get_string_len(e) >= KVC_HOST_MAX) {
                return kvc_error(KVX_ERR_INVALID_PARAM,
                                 "registration.node_hosts[%zu]: length %d: "
                                 "must be below %d", i,
                                 json_object_get_string_len(e), KVC_HOST_MAX);
            }
        }
        *hosts_p = v;
    }
    return st;
}

kvx_status_t kvc_params_build_prefill(const char *decode_registration_json,
                                      const char *transfer_id, char **out_p)
{
    json_object    *reg, *o, *hosts;
    kvc_peer_addr_t addr;
    uint32_t        tp = 0, dp = 0;
    kvx_status_t    st;

    if (transfer_id == NULL || transfer_id[0] == '\0' ||
        strlen(transfer_id) >= KVX_ID_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "transfer_id: must be 1..%d "
                         "characters", KVX_ID_MAX - 1);
    }
    reg = decode_registration_json ? json_tokener_parse(decode_registration_json)
                                   : NULL;
    if (reg == NULL || !json_object_is_type(reg, json_type_object)) {
        json_object_put(reg);
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "registration: not a JSON object");
    }
    st = kvc_reg_parse(reg, &addr, &tp, &dp, &hosts);
    if (st != KVX_OK) {
        json_object_put(reg);
        return st;
    }
    o = json_object_new_object();
    json_object_object_add(o, "do_remote_decode", json_object_new_boolean(1));
    json_object_object_add(o, "do_remote_prefill", json_object_new_boolean(0));
    json_object_object_add(o, "transfer_id", json_object_new_string(transfer_id));
    json_object_object_add(o, "remote_host", json_object_new_string(addr.host));
    json_object_object_add(o, "remote_handshake_port",
                           json_object_new_int((int)addr.handshake_port));
    json_object_object_add(o, "remote_notify_port",
                           json_object_new_int((int)addr.notify_port));
    json_object_object_add(o, "remote_tp_size", json_object_new_int((int)tp));
    json_object_object_add(o, "remote_dp_size", json_object_new_int((int)dp));
    json_object_object_add(o, "remote_engine_id", NULL);
    json_object_object_add(o, "remote_block_ids", NULL);
    if (hosts != NULL) {
        json_object_object_add(o, "remote_hosts", json_object_get(hosts));
    }
    *out_p = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    json_object_put(reg);
    return *out_p ? KVX_OK : kvc_error(KVX_ERR_NO_MEMORY, "out of memory");
}
