// sim_internal.h - the simulated transports' objects, shared by
// sim_data.cc, sim_deliver.cc and sim_ctl.cc (not for scenarios).
#ifndef KVX_SIM_INTERNAL_H
#define KVX_SIM_INTERNAL_H

#include "simnet.h"

#include <string>
#include <vector>

namespace sim {

static const uint64_t kTickUs = 10000; // 10 ms virtual

struct SimCtx {
    uint64_t          id;
    int               node;
    kvt_data_params_t p;
    std::string       name;
    uint8_t           addr[12];
    bool              destroyed = false;
    uint64_t          tick_at   = 0; // the kTickAt queued for then (0: none)
};

struct SimMem {
    uint64_t id, ctx;
    uint8_t *base;
    size_t   len;
    bool     owned;
    uint8_t  rkey[20];
};

struct SimEp {
    uint64_t      id, ctx, peer_ctx;
    int           node;
    std::string   peer_name;
    kvt_ep_err_fn cb;
    void         *arg;
    bool          failed       = false;
    bool          err_reported = false;
    int           nrkeys       = 0;
    uint64_t      session      = 0; // carried to the target's authorize
};

struct SimRkey {
    uint64_t id, ep, ctx, mem;
};

struct SimOp {
    uint64_t             id, ep, ctx;
    uint64_t             session; // the endpoint's, for the authorize
    int                  node;
    int                  is_put;
    bool                 flush;
    uint64_t             local_mem, local_base;
    uint64_t             rkey_ctx, rkey_mem, remote_base;
    const kvc_run_t     *runs;
    size_t               n;
    std::vector<uint8_t> state; // 0 queued, 1 copied, 2 canceled
    size_t               pending;
    kvx_status_t         status = KVX_OK;
    bool                 done_queued = false;
    kvt_op_t            *op;
};

struct SimServer {
    uint64_t       id;
    int            node;
    std::string    key; // "host:port"
    size_t         max_msg;
    kvt_handler_fn fn;
    void          *arg;
};

struct SimClient {
    uint64_t    id;
    int         node;
    std::string to;   // "host:port"
    std::string from; // "host:ephemeral port"
    int         nctx;
    int         inflight = 0;
    kvt_conn_fn watch_fn  = nullptr; // client_watch (conn_events only)
    void       *watch_arg = nullptr;
    int         watch_up  = -1; // what it was told last (-1: nothing:
                                // never connected)
};

struct SimRequest {
    uint64_t     id;
    uint64_t     client; // 0: a stranger (reply discarded)
    int          node;   // the client's node (-1: stranger)
    std::string  from, to;
    kvt_reply_fn fn   = nullptr;
    void        *arg  = nullptr;
    bool         done = false;
    int          srv_node = -1; // the server's node, once delivered
    std::string  data;          // the request, sent at a heal if a cut
                                // held it (parked)
    bool         parked = false;
};

World *W();
void   QueueDone(SimOp *op);
void   CheckFlushes(uint64_t ep);
void   CancelEpOps(SimEp *ep, kvx_status_t st);
void   ScheduleEpError(SimEp *ep, kvx_status_t st, const char *why,
                       uint64_t delay_us);
void   DeliverPendingOps(uint64_t ctx);

} // namespace sim

#endif
