// layout_run.h - what the layout tests through engines share
// (hnd_procs.cc in real processes, test_layout_engines.cc on the
// simulator): a rank's options and the kv_transfer_params of one transfer.
#ifndef KVT_LAYOUT_RUN_H
#define KVT_LAYOUT_RUN_H

#include "harness.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvt {

// LayoutRankOpts: P or D rank `rank` of tp; ranks of a side listen on
// port + rank (notify + 20000).
inline RankOpts LayoutRankOpts(bool producer, uint32_t rank, uint32_t tp,
                               uint16_t port, bool write, double timeout_s)
{
    RankOpts o;
    o.producer          = producer;
    o.tp_rank           = rank;
    o.tp_size           = tp;
    o.hs_port           = port;
    o.notify_port       = (uint16_t)(port + 20000);
    o.read_mode         = !write;
    o.handshake_timeout = timeout_s / 2;
    o.transfer_timeout  = timeout_s;
    return o;
}

// LayoutParams: the params of transfer tid for P (for_p) or D, naming the
// peer instance at port with rtp ranks (READ D: the P blocks remote_ids).
inline std::string LayoutParams(const std::string &tid, bool write,
                                bool for_p, uint16_t port, uint32_t rtp,
                                const std::vector<uint64_t> &remote_ids)
{
    if (!write && !for_p) {
        return Params(tid, "127.0.0.1", port, (uint16_t)(port + 20000),
                      remote_ids, rtp);
    }
    if (!write) {
        return "{\"transfer_id\":\"" + tid + "\",\"do_remote_decode\":true}";
    }
    return "{\"transfer_id\":\"" + tid + "\",\"" +
           (for_p ? "do_remote_decode" : "do_remote_prefill") +
           "\":true,\"remote_host\":\"127.0.0.1\",\"remote_handshake_port\":" +
           std::to_string(port) + ",\"remote_notify_port\":" +
           std::to_string(port + 20000) + ",\"remote_tp_size\":" +
           std::to_string(rtp) + "}";
}

} // namespace kvt

#endif
