/*
 * fuzz_config.c - the engine configuration (kvc_config_parse,
 * kvc_config_dump).
 *
 * Invariants:
 *  - an accepted configuration obeys the documented bounds (tp_rank <
 *    tp_size, dp_rank < dp_size, the highest rank's ports <= 65535, timeouts
 *    in (0, 3600], list entries non-empty);
 *  - its dump parses, to a configuration whose dump is the same text (the
 *    dump is a fixed point), with the same identity, ports and lists.
 */
#include "fuzz.h"

#include "config.h"

static void fz_no_warn(void *arg, const char *msg)
{
    (void)arg;
    (void)msg;
}

static void fz_same_list(char **a, size_t na, char **b, size_t nb,
                         const char *what)
{
    FZ_CHECK(na == nb, "%s: %zu vs %zu", what, na, nb);
    for (size_t i = 0; i < na; i++) {
        FZ_CHECK(strcmp(a[i], b[i]) == 0, "%s[%zu]: '%s' vs '%s'", what, i,
                 a[i], b[i]);
    }
}

static void fz_bounds(const kvc_config_t *c)
{
    uint32_t world = kvc_config_world(c);

    FZ_CHECK(c->tp_size >= 1 && c->tp_rank < c->tp_size, "tp");
    FZ_CHECK(c->dp_size >= 1 && c->dp_rank < c->dp_size, "dp");
    FZ_CHECK(c->log_level >= 0 && c->log_level <= 3, "log_level");
    FZ_CHECK(c->handshake_port >= 1024 &&
                 (uint64_t)c->handshake_port + world - 1 <= 65535,
             "handshake_port %u world %u", c->handshake_port, world);
    FZ_CHECK(c->notify_port >= 1024 &&
                 (uint64_t)c->notify_port + world - 1 <= 65535,
             "notify_port %u world %u", c->notify_port, world);
    FZ_CHECK(c->handshake_timeout > 0 && c->handshake_timeout <= 3600 &&
                 c->transfer_timeout > 0 && c->transfer_timeout <= 3600,
             "timeouts");
    FZ_CHECK(c->num_node_hosts >= 1, "node_hosts empty");
    for (size_t i = 0; i < c->num_node_hosts; i++) {
        FZ_CHECK(c->node_hosts[i][0] != '\0', "node_hosts[%zu] empty", i);
    }
    FZ_CHECK(c->qp_per_transfer >= 1 && c->qp_per_transfer <= 64, "qp");
    FZ_CHECK(c->num_workers >= 1 && c->num_workers <= 64, "workers");
    FZ_CHECK(c->post_batch_size == -1 ||
                 (c->post_batch_size >= 1 && c->post_batch_size <= 4096),
             "post_batch_size");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char        *json = fz_cstr(data, size), *dump, *dump2;
    kvc_config_t cfg, back;

    if (kvc_config_parse(json, &cfg, fz_no_warn, NULL) != KVX_OK) {
        FZ_CHECK(kvc_last_error()[0] != '\0', "no error text");
        free(json);
        return 0;
    }
    fz_bounds(&cfg);
    dump = kvc_config_dump(&cfg);
    FZ_CHECK(dump != NULL, "dump");
    FZ_CHECK(kvc_config_parse(dump, &back, fz_no_warn, NULL) == KVX_OK,
             "dump '%.400s' rejected: %s", dump, kvc_last_error());
    fz_bounds(&back);
    dump2 = kvc_config_dump(&back);
    FZ_CHECK(dump2 != NULL && strcmp(dump, dump2) == 0,
             "dump not a fixed point:\n%s\n%s", dump,
             dump2 ? dump2 : "(null)");
    FZ_CHECK(cfg.is_producer == back.is_producer &&
                 cfg.tp_rank == back.tp_rank && cfg.tp_size == back.tp_size &&
                 cfg.dp_rank == back.dp_rank && cfg.dp_size == back.dp_size &&
                 cfg.handshake_port == back.handshake_port &&
                 cfg.notify_port == back.notify_port &&
                 cfg.read_mode == back.read_mode &&
                 cfg.trusted_set == back.trusted_set &&
                 strcmp(cfg.host_ip, back.host_ip) == 0,
             "identity changed through the dump");
    fz_same_list(cfg.node_hosts, cfg.num_node_hosts, back.node_hosts,
                 back.num_node_hosts, "node_hosts");
    fz_same_list(cfg.trusted_remote_hosts, cfg.num_trusted_remote_hosts,
                 back.trusted_remote_hosts, back.num_trusted_remote_hosts,
                 "trusted_remote_hosts");
    free(dump2);
    free(dump);
    kvc_config_fini(&back);
    kvc_config_fini(&cfg);
    free(json);
    return 0;
}
