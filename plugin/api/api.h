/*
 * api.h - the function table behind the single exported entry point.
 */
#ifndef KVC_API_H
#define KVC_API_H

#include <kvxfer/kvxfer.h>

#include "kvt.h"

/* kvc_api_table returns the process-wide constant function table. */
const kvx_api_t *kvc_api_table(void);

/* kvc_engine_create_env: engine_create with the given transports and clock
 * instead of UCX, nng and the host clock (the simulator's seam). The engine
 * is then driven through kvc_api_table() like any other. */
kvx_status_t kvc_engine_create_env(const kvt_env_t *env, const char *json,
                                   kvx_engine_t **eng_p);

#endif
