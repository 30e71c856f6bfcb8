/*
 * tlsname.h - UCX transport names as UCX compares them (shared services).
 *
 * One rule for every reader of a UCX_TLS list: the core's "auto" decision
 * (kvc_tls_local_only) and the data plane's feature choice (kvu.c).
 */
#ifndef KVC_TLSNAME_H
#define KVC_TLSNAME_H

#include <stddef.h>

/* kvc_tl_is: is the UCX_TLS entry tok (n bytes, not NUL-terminated) the
 * transport name? Exactly as UCX compares (no case folding, no trimming),
 * with its "\name" (that name only, no alias) and "name:aux" (auxiliary
 * use) forms. An empty entry is no name. */
int kvc_tl_is(const char *tok, size_t n, const char *name);

#endif
