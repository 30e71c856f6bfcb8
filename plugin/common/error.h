/*
 * error.h - status names, thread-local error text and logging.
 *
 * The function that first detects an error calls kvc_error() with the
 * status and a message naming the field, the value and the rule; callers
 * that merely pass the status on do not log again. The message is kept per
 * thread and returned by the public last_error().
 *
 * Threading: all functions here are safe from any thread.
 */
#ifndef KVC_ERROR_H
#define KVC_ERROR_H

#include <kvxfer/kvxfer.h>
#include <stdarg.h>

#define KVC_ERR_MAX 1024

#define KVC_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* kvc_status_name returns the constant name of a status code. */
const char *kvc_status_name(kvx_status_t status);
/* kvc_status_string returns the constant description of a status code. */
const char *kvc_status_string(kvx_status_t status);

/* kvc_error sets the thread's last error text and returns status. */
kvx_status_t kvc_error(kvx_status_t status, const char *fmt, ...)
    KVC_PRINTF(2, 3);
/* kvc_last_error returns the thread's last error text (never NULL). */
const char *kvc_last_error(void);
/* kvc_error_clear empties the thread's last error text. */
void kvc_error_clear(void);

enum { KVC_LOG_ERROR = 0, KVC_LOG_WARN, KVC_LOG_INFO, KVC_LOG_DEBUG };

extern int kvc_log_level;

/* kvc_log_set installs the process-wide log sink (NULL: stderr). */
void kvc_log_set(kvx_log_fn_t fn, void *arg, int max_level);
void kvc_log_emit(int level, const char *id, const char *fmt, ...)
    KVC_PRINTF(3, 4);

#define kvc_log(level, id, ...)                                                \
    do {                                                                       \
        if ((level) <= kvc_log_level) {                                        \
            kvc_log_emit((level), (id), __VA_ARGS__);                          \
        }                                                                      \
    } while (0)

#define kvc_log_error(id, ...) kvc_log(KVC_LOG_ERROR, id, __VA_ARGS__)
#define kvc_log_warn(id, ...)  kvc_log(KVC_LOG_WARN, id, __VA_ARGS__)
#define kvc_log_info(id, ...)  kvc_log(KVC_LOG_INFO, id, __VA_ARGS__)
#define kvc_log_debug(id, ...) kvc_log(KVC_LOG_DEBUG, id, __VA_ARGS__)

#endif
