/* error.c - status table, thread-local error text, log sink. */
#include "error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char kvc_err_buf[KVC_ERR_MAX];

int kvc_log_level = KVC_LOG_WARN;

static kvx_log_fn_t    kvc_log_fn;
static void           *kvc_log_arg;
static pthread_mutex_t kvc_log_lock = PTHREAD_MUTEX_INITIALIZER;

const char *kvc_status_name(kvx_status_t status)
{
    switch (status) {
#define KVC_NAME_CASE(name, value, msg)                                        \
    case name:                                                                 \
        return #name;
        KVX_STATUS_MAP(KVC_NAME_CASE)
#undef KVC_NAME_CASE
    }
    return "unknown status";
}

const char *kvc_status_string(kvx_status_t status)
{
    switch (status) {
#define KVC_MSG_CASE(name, value, msg)                                         \
    case name:                                                                 \
        return msg;
        KVX_STATUS_MAP(KVC_MSG_CASE)
#undef KVC_MSG_CASE
    }
    return "unknown status";
}

kvx_status_t kvc_error(kvx_status_t status, const char *fmt, ...)
{
    char    tmp[KVC_ERR_MAX];
    va_list ap;

    /* Format into a temporary first: callers often wrap the previous
     * message ("...: %s", kvc_last_error()). */
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    memcpy(kvc_err_buf, tmp, sizeof(tmp));
    return status;
}

const char *kvc_last_error(void)
{
    return kvc_err_buf;
}

void kvc_error_clear(void)
{
    kvc_err_buf[0] = '\0';
}

void kvc_log_set(kvx_log_fn_t fn, void *arg, int max_level)
{
    pthread_mutex_lock(&kvc_log_lock);
    kvc_log_fn    = fn;
    kvc_log_arg   = arg;
    kvc_log_level = max_level;
    pthread_mutex_unlock(&kvc_log_lock);
}

void kvc_log_emit(int level, const char *id, const char *fmt, ...)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    char    msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&kvc_log_lock);
    if (kvc_log_fn != NULL) {
        kvc_log_fn(kvc_log_arg, level, id, msg);
    } else {
        fprintf(stderr, "kvxfer %s [%s] %s\n",
                names[level < 0 ? 0 : (level > 3 ? 3 : level)], id, msg);
    }
    pthread_mutex_unlock(&kvc_log_lock);
}
