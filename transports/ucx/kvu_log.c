/*
 * kvu_log.c - UCX's own log messages (warnings such as "failed to connect",
 * "memory is not registered") go through kvxfer's logger instead of UCX's
 * default handler, which prints to stdout.
 *
 * UCX's handler stack is process-wide (ucs_log_push_handler); kvxfer pushes
 * one handler while at least one UCX context of any engine exists and pops it
 * when the last one goes, so no UCX message can call into an unloaded
 * libkvxfer after dlclose. Caveat: ucs_log_pop_handler pops the top of the
 * stack; a host that pushes its own UCX handler while kvxfer engines exist
 * and keeps it past their destruction loses its handler instead of ours.
 * Fatal messages are passed on to UCX's default handling (it aborts).
 *
 * Threading: any thread; UCX calls the handler on the thread that logs.
 */
#include "kvu.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <ucs/debug/log_def.h>

static pthread_mutex_t kvu_log_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned        kvu_log_users;
static __thread int    kvu_log_quiet_on;

void kvu_log_quiet(int on)
{
    kvu_log_quiet_on = on;
}

static ucs_log_func_rc_t kvu_log_handler(const char *file, unsigned line,
                                         const char *function,
                                         ucs_log_level_t level,
                                         const ucs_log_component_config_t *cc,
                                         const char *fmt, va_list ap)
{
    char msg[512];
    int  kl;

    (void)function;
    (void)cc;
    if (level <= UCS_LOG_LEVEL_FATAL) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    kl = kvu_log_quiet_on                 ? KVC_LOG_DEBUG
         : level <= UCS_LOG_LEVEL_ERROR ? KVC_LOG_ERROR
         : level <= UCS_LOG_LEVEL_WARN ? KVC_LOG_WARN
         : level <= UCS_LOG_LEVEL_INFO ? KVC_LOG_INFO
                                        : KVC_LOG_DEBUG;
    if (kl <= kvc_log_level) {
        va_list aq;

        va_copy(aq, ap);
        vsnprintf(msg, sizeof(msg), fmt, aq);
        va_end(aq);
        kvc_log_emit(kl, "KVX-UCX", "ucx %s:%u: %s", file, line, msg);
    }
    return UCS_LOG_FUNC_RC_STOP;
}

void kvu_log_hold(void)
{
    pthread_mutex_lock(&kvu_log_lock);
    if (kvu_log_users++ == 0) {
        ucs_log_push_handler(kvu_log_handler);
    }
    pthread_mutex_unlock(&kvu_log_lock);
}

void kvu_log_release(void)
{
    pthread_mutex_lock(&kvu_log_lock);
    if (kvu_log_users > 0 && --kvu_log_users == 0) {
        ucs_log_pop_handler();
    }
    pthread_mutex_unlock(&kvu_log_lock);
}
