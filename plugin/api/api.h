/*
 * api.h - the function table behind the single exported entry point.
 */
#ifndef KVC_API_H
#define KVC_API_H

#include <kvxfer/kvxfer.h>

/* kvc_api_table returns the process-wide constant function table. */
const kvx_api_t *kvc_api_table(void);

#endif
