/*
 * listen.c - kvt_listen_lock (kvt.h): one lock around the creation of every
 * listening socket kvxfer's transports open.
 */
#include "kvt.h"

#include <pthread.h>

static pthread_mutex_t kvt_listen_mu = PTHREAD_MUTEX_INITIALIZER;

void kvt_listen_lock(void)
{
    pthread_mutex_lock(&kvt_listen_mu);
}

void kvt_listen_unlock(void)
{
    pthread_mutex_unlock(&kvt_listen_mu);
}
