/*
 * kvp_report.c - reduce the per-pair records of a point to one row and
 * print rows as nixlbench's table, CSV or JSON (stdout and/or files).
 */
#define _GNU_SOURCE
#include "kvp_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double s, e;
} kvp_iv_t;

static int kvp_iv_cmp(const void *a, const void *b)
{
    const kvp_iv_t *x = a, *y = b;

    return x->s < y->s ? -1 : x->s > y->s ? 1 : 0;
}

/* Length of the union of the intervals (time with a transfer in flight). */
static double kvp_union(kvp_iv_t *v, size_t n)
{
    double total = 0, cs, ce;

    if (n == 0) {
        return 0;
    }
    qsort(v, n, sizeof(*v), kvp_iv_cmp);
    cs = v[0].s;
    ce = v[0].e;
    for (size_t i = 1; i < n; i++) {
        if (v[i].s > ce) {
            total += ce - cs;
            cs = v[i].s;
            ce = v[i].e;
        } else if (v[i].e > ce) {
            ce = v[i].e;
        }
    }
    return total + (ce - cs);
}

static void kvp_stats(double *v, size_t n, double *avg, double *p99)
{
    qsort(v, n, sizeof(double), kvp_cmp_double);
    *avg = kvp_mean(v, n);
    *p99 = kvp_pctl(v, n, 99.0);
}

int kvp_rows_from_blobs(void **bufs, size_t *lens, int n, kvp_row_t *row,
                        char *err, size_t errlen)
{
    size_t    total = 0, nm = 0, k = 0, km = 0;
    int       pairs = 0;
    double   *prep = NULL, *post = NULL, *tx = NULL, *ntfy = NULL;
    kvp_iv_t *mine = NULL;
    double    bw_sum = 0, lat_sum = 0, mc_bytes = 0, mc_time = 0, mc_tx = 0;
    double    rate_sum = 0, wall_sum = 0;
    const kvp_blob_hdr_t *first = NULL;
    int       rc = -1;

    memset(row, 0, sizeof(*row));
    for (int i = 0; i < n; i++) {
        const kvp_blob_hdr_t *h = bufs[i];

        if (lens[i] == 0) {
            continue;
        }
        if (lens[i] < sizeof(*h) ||
            lens[i] != sizeof(*h) + h->n * sizeof(kvp_rec_t) +
                           h->n_memcpy * sizeof(double)) {
            snprintf(err, errlen, "malformed result blob from rank %d", i);
            return -1;
        }
        total += h->n;
        nm += h->n_memcpy;
        pairs++;
        first = first ? first : h;
    }
    if (first == NULL) {
        snprintf(err, errlen, "no results");
        return -1;
    }
    prep = malloc((total + 1) * sizeof(double));
    post = malloc((total + 1) * sizeof(double));
    tx   = malloc((total + 1) * sizeof(double));
    ntfy = malloc((total + 1) * sizeof(double));
    mine = malloc((total + 1) * sizeof(kvp_iv_t));
    if (!prep || !post || !tx || !ntfy || !mine) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    row->setup         = first->setup;
    row->point         = first->point;
    row->mode          = (kvp_mode_t)first->mode;
    row->mem           = (kvp_mem_t)first->mem;
    row->block_bytes   = first->block_bytes;
    row->xfer_bytes    = first->xfer_bytes;
    row->batch         = first->batch;
    row->iters         = first->n;
    row->pairs         = (uint32_t)pairs;
    row->runs_per_xfer = first->runs_per_xfer;
    row->rma_emulated  = first->rma_emulated;
    row->hold          = first->hold;
    row->p_xfers_end   = first->p_xfers_end;
    row->hold_create_s = first->hold_create_s;
    row->hold_rss_kb   = first->hold_rss_kb;
    row->handshake_us  = -1;
    row->first_xfer_us = -1;
    for (int k = 0; k < 3; k++) {
        row->ctl_rtt[k] = row->hs_parts[k] = -1;
    }
    snprintf(row->transports, sizeof(row->transports), "%s",
             first->transports);
    snprintf(row->rma_mode, sizeof(row->rma_mode), "%s", first->rma_mode);
    snprintf(row->geom_desc, sizeof(row->geom_desc), "%s", first->geom_desc);
    for (int i = 0; i < n; i++) {
        const kvp_blob_hdr_t *h = bufs[i];
        const kvp_rec_t      *r;
        const double         *m;
        double                u, t_first = 0, t_last = 0;

        if (lens[i] == 0) {
            continue;
        }
        r = (const kvp_rec_t *)(h + 1);
        m = (const double *)(r + h->n);
        for (uint32_t j = 0; j < h->n; j++) {
            prep[k] = r[j].prep_us;
            post[k] = r[j].post_us;
            tx[k]   = r[j].tx_us;
            ntfy[k] = r[j].notify_us;
            mine[j].s = r[j].start_us;
            mine[j].e = r[j].end_us;
            if (j == 0 || r[j].start_us < t_first) {
                t_first = r[j].start_us;
            }
            if (j == 0 || r[j].end_us > t_last) {
                t_last = r[j].end_us;
            }
            k++;
        }
        /* Completion rate: timed transfers over the wall time from the
         * first start to the last end (gaps between transfers count). */
        if (t_last > t_first) {
            rate_sum += (double)h->n * 1e6 / (t_last - t_first);
            wall_sum += (double)h->n * (double)h->xfer_bytes /
                        (t_last - t_first) / 1e3;
        }
        u = kvp_union(mine, h->n);
        if (u > 0) {
            bw_sum += (double)h->n * (double)h->xfer_bytes / u / 1e3;
            lat_sum += u / ((double)h->n * h->batch);
        }
        for (uint32_t j = 0; j < h->n_memcpy; j++) {
            mc_time += m[j];
            mc_bytes += (double)h->xfer_bytes;
            km++;
        }
        row->handshake_us = h->handshake_us > row->handshake_us
                                ? h->handshake_us : row->handshake_us;
        row->first_xfer_us = h->first_xfer_us > row->first_xfer_us
                                 ? h->first_xfer_us : row->first_xfer_us;
        for (int k = 0; k < 3; k++) { /* worst pair */
            row->ctl_rtt[k]  = h->ctl_rtt[k] > row->ctl_rtt[k]
                                   ? h->ctl_rtt[k] : row->ctl_rtt[k];
            row->hs_parts[k] = h->hs_parts[k] > row->hs_parts[k]
                                   ? h->hs_parts[k] : row->hs_parts[k];
        }
        for (int side = 0; side < 2; side++) {
            for (int c = 0; c < 3; c++) {
                if (h->rss_kb[side][c] > row->rss_kb[side][c]) {
                    row->rss_kb[side][c] = h->rss_kb[side][c];
                }
            }
            if (h->hwm_kb[side] > row->hwm_kb[side]) {
                row->hwm_kb[side] = h->hwm_kb[side];
            }
        }
        if (h->xfers_done > row->xfers_done) {
            row->xfers_done = h->xfers_done;
        }
        if (h->p_xfers_end < row->p_xfers_end) { /* fewest held */
            row->p_xfers_end = h->p_xfers_end;
        }
        if (h->hold_create_s > row->hold_create_s) { /* slowest pair */
            row->hold_create_s = h->hold_create_s;
        }
        if (h->hold_rss_kb > row->hold_rss_kb) {
            row->hold_rss_kb = h->hold_rss_kb;
        }
    }
    mc_tx = km ? mc_time / (double)km : 0;
    row->bw_gbs      = bw_sum / pairs;
    row->aggr_bw_gbs = bw_sum; /* nixlbench: sum of the ranks' B/W */
    row->avg_lat_us  = lat_sum / pairs;
    row->xfer_rate      = rate_sum / pairs;
    row->aggr_xfer_rate = rate_sum;
    row->wall_bw_gbs    = wall_sum / pairs;
    kvp_stats(prep, total, &row->prep_avg, &row->prep_p99);
    kvp_stats(post, total, &row->post_avg, &row->post_p99);
    kvp_stats(tx, total, &row->tx_avg, &row->tx_p99);
    kvp_stats(ntfy, total, &row->ntfy_avg, &row->ntfy_p99);
    row->post_per_run_us = row->runs_per_xfer > 0
                               ? row->post_avg / row->runs_per_xfer
                               : 0;
    row->memcpy_bw_gbs = nm && mc_time > 0 ? mc_bytes / mc_time / 1e3 : -1;
    row->memcpy_tx_avg = nm ? mc_tx : -1;
    rc                 = 0;
out:
    free(prep);
    free(post);
    free(tx);
    free(ntfy);
    free(mine);
    return rc;
}

/* --- output ------------------------------------------------------------- */

struct kvp_report {
    const kvp_opts_t *o;
    FILE   *csv, *json;   /* files (may be NULL) */
    int     csv_head_done[2];
    int     json_rows[2]; /* rows written to stdout json / file json */
    kvp_row_t last;
    int     have_last;
    kvp_row_t setup;      /* probe row of the current setup */
    int     hold_line_done; /* --hold line printed for this setup */
};

static const char *kvp_mode_name(kvp_mode_t m)
{
    return m == KVP_READ ? "READ" : "WRITE";
}

static const char *kvp_mem_name(kvp_mem_t m)
{
    return m == KVP_MEM_APP ? "app" : "ucx";
}

static void kvp_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') {
            fprintf(f, "\\%c", *s);
        } else if ((unsigned char)*s < 0x20) {
            fprintf(f, "\\u%04x", *s);
        } else {
            fputc(*s, f);
        }
    }
    fputc('"', f);
}

/* kvp_ids_name: how block ids are chosen (--contiguous, --resident). */
static const char *kvp_ids_name(const kvp_opts_t *o)
{
    if (o->resident) {
        return o->contiguous ? "resident-contiguous" : "resident";
    }
    return o->contiguous ? "contiguous" : "scattered";
}

static const char *kvp_csv_header =
    "mode,mem,model,tls,ids,depth,pairs,block_size_B,batch,iters,"
    "xfer_bytes,bw_GBs,aggr_bw_GBs,avg_lat_us,avg_prep_us,p99_prep_us,"
    "avg_post_us,p99_post_us,avg_tx_us,p99_tx_us,runs_per_xfer,"
    "post_per_run_us,avg_ntfy_us,p99_ntfy_us,memcpy_bw_GBs,memcpy_avg_tx_us,"
    "handshake_us,first_xfer_us,ctl_ntfy_avg_us,ctl_ntfy_p99_us,"
    "ctl_tx_avg_us,transports,rma_mode,rma_emulated,rss_p_kb,rss_d_kb,"
    "hwm_p_kb,hwm_d_kb,rss_growth_p_kb,rss_growth_d_kb,xfers_done,"
    "ctl_rtt_avg_us,ctl_rtt_p50_us,ctl_rtt_p99_us,hs_metadata_us,"
    "hs_endpoint_us,hs_rkeys_us,xfers_per_s,aggr_xfers_per_s,hold,"
    "hold_create_s,hold_rss_p_kb,p_transfers_end,wall_bw_GBs,wait\n";

static void kvp_csv_row(FILE *f, const kvp_opts_t *o, const kvp_row_t *r,
                        const kvp_row_t *su)
{
    /* tls is a list ("sm,cma"): quoted, as transports */
    fprintf(f, "%s,%s,%s,\"%s\",%s,%u,%u,%" PRIu64 ",%u,%u,%" PRIu64 ","
               "%.6f,%.6f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f,%.4f,"
               "%.3f,%.3f,%.6f,%.3f,%.1f,%.1f,%.1f,%.1f,%.1f,\"%s\",%s,%d,"
               "%" PRId64 ",%" PRId64
               ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRIu64
               ",%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%u,%.3f,%" PRId64
               ",%" PRId64 ",%.6f,%s\n",
            kvp_mode_name(r->mode), kvp_mem_name(r->mem), o->model.name,
            o->tls[0] ? o->tls : "default", kvp_ids_name(o), o->depth, r->pairs,
            r->block_bytes, r->batch, r->iters, r->xfer_bytes, r->bw_gbs,
            r->aggr_bw_gbs, r->avg_lat_us, r->prep_avg, r->prep_p99,
            r->post_avg, r->post_p99, r->tx_avg, r->tx_p99, r->runs_per_xfer,
            r->post_per_run_us, r->ntfy_avg, r->ntfy_p99, r->memcpy_bw_gbs,
            r->memcpy_tx_avg, su->handshake_us, su->first_xfer_us,
            su->ntfy_avg, su->ntfy_p99, su->tx_avg, su->transports,
            su->rma_mode, su->rma_emulated, r->rss_kb[0][2],
            r->rss_kb[1][2], r->hwm_kb[0], r->hwm_kb[1],
            r->rss_kb[0][2] - r->rss_kb[0][1],
            r->rss_kb[1][2] - r->rss_kb[1][1], r->xfers_done, su->ctl_rtt[0],
            su->ctl_rtt[1], su->ctl_rtt[2], su->hs_parts[0], su->hs_parts[1],
            su->hs_parts[2], r->xfer_rate, r->aggr_xfer_rate, r->hold,
            r->hold_create_s, r->hold_rss_kb, r->p_xfers_end, r->wall_bw_gbs,
            o->busy_poll ? "spin" : "sleep");
    fflush(f);
}

static void kvp_json_row(FILE *f, const kvp_opts_t *o, const kvp_row_t *r,
                         const kvp_row_t *su, int first)
{
    fprintf(f, "%s\n    {\"mode\": \"%s\", \"mem\": \"%s\", \"model\": ",
            first ? "" : ",", kvp_mode_name(r->mode), kvp_mem_name(r->mem));
    kvp_json_str(f, o->model.name);
    fprintf(f, ", \"geometry\": ");
    kvp_json_str(f, su->geom_desc);
    fprintf(f, ", \"tls\": ");
    kvp_json_str(f, o->tls[0] ? o->tls : "default");
    fprintf(f, ", \"ids\": \"%s\", \"depth\": %u, \"pairs\": %u, "
               "\"block_size_B\": %" PRIu64 ", \"batch\": %u, \"iters\": %u, "
               "\"xfer_bytes\": %" PRIu64 ", \"bw_GBs\": %.6f, "
               "\"aggr_bw_GBs\": %.6f, \"avg_lat_us\": %.3f, "
               "\"avg_prep_us\": %.3f, \"p99_prep_us\": %.3f, "
               "\"avg_post_us\": %.3f, \"p99_post_us\": %.3f, "
               "\"avg_tx_us\": %.3f, \"p99_tx_us\": %.3f, "
               "\"runs_per_xfer\": %.1f, \"post_per_run_us\": %.4f, "
               "\"avg_ntfy_us\": %.3f, \"p99_ntfy_us\": %.3f, "
               "\"memcpy_bw_GBs\": %.6f, \"memcpy_avg_tx_us\": %.3f, "
               "\"handshake_us\": %.1f, \"first_xfer_us\": %.1f, "
               "\"ctl_ntfy_avg_us\": %.1f, \"ctl_ntfy_p99_us\": %.1f, "
               "\"ctl_tx_avg_us\": %.1f, \"rma_emulated\": %s, "
               "\"rma_mode\": \"%s\", \"transports\": ",
            kvp_ids_name(o), o->depth, r->pairs,
            r->block_bytes, r->batch, r->iters, r->xfer_bytes, r->bw_gbs,
            r->aggr_bw_gbs, r->avg_lat_us, r->prep_avg, r->prep_p99,
            r->post_avg, r->post_p99, r->tx_avg, r->tx_p99, r->runs_per_xfer,
            r->post_per_run_us, r->ntfy_avg, r->ntfy_p99, r->memcpy_bw_gbs,
            r->memcpy_tx_avg, su->handshake_us, su->first_xfer_us,
            su->ntfy_avg, su->ntfy_p99, su->tx_avg,
            su->rma_emulated ? "true" : "false", su->rma_mode);
    kvp_json_str(f, su->transports);
    fprintf(f, ", \"rss_kb\": {\"p\": [%" PRId64 ", %" PRId64 ", %" PRId64
               "], \"d\": [%" PRId64 ", %" PRId64 ", %" PRId64 "]}, "
               "\"hwm_kb\": {\"p\": %" PRId64 ", \"d\": %" PRId64 "}, "
               "\"xfers_done\": %" PRIu64 ", \"ctl_rtt_us\": [%.1f, %.1f, "
               "%.1f], \"hs_parts_us\": [%.1f, %.1f, %.1f], "
               "\"xfers_per_s\": %.1f, \"aggr_xfers_per_s\": %.1f, "
               "\"hold\": %u, \"hold_create_s\": %.3f, "
               "\"hold_rss_p_kb\": %" PRId64 ", \"p_transfers_end\": %"
               PRId64 ", \"wall_bw_GBs\": %.6f, \"wait\": \"%s\"}",
            r->rss_kb[0][0], r->rss_kb[0][1], r->rss_kb[0][2], r->rss_kb[1][0],
            r->rss_kb[1][1], r->rss_kb[1][2], r->hwm_kb[0], r->hwm_kb[1],
            r->xfers_done, su->ctl_rtt[0], su->ctl_rtt[1], su->ctl_rtt[2],
            su->hs_parts[0], su->hs_parts[1], su->hs_parts[2], r->xfer_rate,
            r->aggr_xfer_rate, r->hold, r->hold_create_s, r->hold_rss_kb,
            r->p_xfers_end, r->wall_bw_gbs, o->busy_poll ? "spin" : "sleep");
    fflush(f);
}

static void kvp_json_open(FILE *f, const kvp_opts_t *o)
{
    fprintf(f, "{\"tool\": \"kvxfer_perf\", \"model\": ");
    kvp_json_str(f, o->model.name);
    fprintf(f, ", \"rows\": [");
}

static void kvp_json_close(FILE *f, const kvp_report_t *r, int failed)
{
    fprintf(f, "\n  ], \"failed\": %s", failed ? "true" : "false");
    if (r->have_last) {
        fprintf(f, ", \"rss_after_kb\": {\"p\": %" PRId64 ", \"d\": %" PRId64
                   "}, \"peak_rss_kb\": {\"p\": %" PRId64 ", \"d\": %" PRId64
                   "}, \"xfers_done\": %" PRIu64,
                r->last.rss_kb[0][2], r->last.rss_kb[1][2], r->last.hwm_kb[0],
                r->last.hwm_kb[1], r->last.xfers_done);
    }
    fprintf(f, "}\n");
    fflush(f);
}

kvp_report_t *kvp_report_open(const kvp_opts_t *o)
{
    kvp_report_t *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        return NULL;
    }
    r->o = o;
    if (o->csv_path[0] != '\0') {
        r->csv = fopen(o->csv_path, "w");
        if (r->csv == NULL) {
            kvp_err("--csv %s: cannot open", o->csv_path);
            free(r);
            return NULL;
        }
    }
    if (o->json_path[0] != '\0') {
        r->json = fopen(o->json_path, "w");
        if (r->json == NULL) {
            kvp_err("--json %s: cannot open", o->json_path);
            if (r->csv) {
                fclose(r->csv);
            }
            free(r);
            return NULL;
        }
        kvp_json_open(r->json, o);
    }
    if (o->format == KVP_FMT_JSON) {
        kvp_json_open(stdout, o);
    }
    return r;
}

static void kvp_table_setup(const kvp_report_t *r, const kvp_row_t *su)
{
    const kvp_opts_t *o = r->o;

    printf("\n# kvxfer_perf %s | %s | mem %s | tls %s | %s ids | depth %u | "
           "pairs %u (TP%u -> TP%u) | hold %u\n",
           kvp_mode_name(su->mode), su->geom_desc, kvp_mem_name(su->mem),
           o->tls[0] ? o->tls : "default",
           kvp_ids_name(o), o->depth, su->pairs,
           su->pairs, su->pairs, o->hold);
    printf("# transports (%s): %s  [RMA: %s]\n",
           su->mode == KVP_READ ? "D gets from P" : "P puts to D",
           su->transports[0] ? su->transports : "?",
           strcmp(su->rma_mode, "?") != 0
               ? su->rma_mode
               : su->rma_emulated ? "emulated over active messages" : "?");
    if (o->connect_ahead) {
        printf("# connect: connect_peer (handshake ahead) %.1f us, first "
               "transfer (1 block, connected) %.1f us\n", su->handshake_us,
               su->first_xfer_us);
    } else {
        printf("# connect: handshake %.1f us, first transfer (handshake + "
               "1 block) %.1f us\n", su->handshake_us, su->first_xfer_us);
    }
    printf("# control plane, %u one-block transfers (after the first 5): %s "
           "%.1f us avg, %.1f us p99; transfer (Tx) %.1f us avg, %.1f us "
           "p99\n", su->iters,
           su->mode == KVP_READ ? "release (D done -> P freed)"
                                : "write_done (P flushed -> D notified)",
           su->ntfy_avg, su->ntfy_p99, su->tx_avg, su->tx_p99);
    printf("# control round trip (%s, library: queued -> reply): %.1f us "
           "avg, %.1f us p50, %.1f us p99; handshake parts: metadata %.0f, "
           "endpoint %.0f, rkeys %.0f us\n",
           su->mode == KVP_READ ? "release" : "write_done", su->ctl_rtt[0],
           su->ctl_rtt[1], su->ctl_rtt[2], su->hs_parts[0], su->hs_parts[1],
           su->hs_parts[2]);
    printf("%-16s%-12s%-14s", "Block Size (B)", "Batch Size", "B/W (GB/Sec)");
    if (su->pairs > 1) {
        printf("%-16s", "Aggr B/W (GB/s)");
    }
    printf("%-15s%-15s%-15s%-15s%-15s%-13s%-13s%-11s%-15s%-15s%-15s",
           "Avg Lat. (us)", "Avg Prep (us)", "P99 Prep (us)", "Avg Post (us)",
           "P99 Post (us)", "Avg Tx (us)", "P99 Tx (us)", "Runs/Xfer",
           "Post/Run (us)", "Avg Ntfy (us)", "P99 Ntfy (us)");
    printf("%-12s%-16s", "Xfer/s", "Wall B/W (GB/s)");
    if (o->memcpy_rows) {
        printf("%-16s", "memcpy (GB/s)");
    }
    printf("\n");
    fflush(stdout);
}

/* --hold: the idle transfers next to which the rows of this setup ran. */
static void kvp_table_hold(const kvp_row_t *x)
{
    printf("# hold: %u idle transfers on P (producer_request, 1 block each, "
           "%s), created after the probe in %.2f s (%.1f us each), P RSS "
           "%+.1f MiB; P engine transfers after the point: %" PRId64 "\n",
           x->hold, x->mode == KVP_READ ? "never read by D"
                                        : "no remote_blocks from D",
           x->hold_create_s, x->hold_create_s * 1e6 / x->hold,
           (double)x->hold_rss_kb / 1024, x->p_xfers_end);
}

static void kvp_table_row(const kvp_report_t *r, const kvp_row_t *x)
{
    printf("%-16" PRIu64 "%-12u%-14.6f", x->block_bytes, x->batch, x->bw_gbs);
    if (x->pairs > 1) {
        printf("%-16.6f", x->aggr_bw_gbs);
    }
    printf("%-15.1f%-15.1f%-15.1f%-15.1f%-15.1f%-13.1f%-13.1f%-11.0f"
           "%-15.3f%-15.1f%-15.1f",
           x->avg_lat_us, x->prep_avg, x->prep_p99, x->post_avg, x->post_p99,
           x->tx_avg, x->tx_p99, x->runs_per_xfer, x->post_per_run_us,
           x->ntfy_avg, x->ntfy_p99);
    printf("%-12.1f%-16.6f", x->xfer_rate, x->wall_bw_gbs);
    if (r->o->memcpy_rows) {
        printf("%-16.6f", x->memcpy_bw_gbs);
    }
    printf("\n");
    fflush(stdout);
}

void kvp_report_row(kvp_report_t *r, const kvp_row_t *row)
{
    const kvp_opts_t *o = r->o;

    if (row->point == UINT32_MAX) { /* probe: setup header */
        r->setup          = *row;
        r->hold_line_done = 0;
        if (o->format == KVP_FMT_TABLE) {
            kvp_table_setup(r, row);
        }
        return;
    }
    r->last      = *row;
    r->have_last = 1;
    switch (o->format) {
    case KVP_FMT_TABLE:
        if (row->hold > 0 && !r->hold_line_done) {
            kvp_table_hold(row);
            r->hold_line_done = 1;
        }
        kvp_table_row(r, row);
        break;
    case KVP_FMT_CSV:
        if (!r->csv_head_done[0]) {
            fputs(kvp_csv_header, stdout);
            r->csv_head_done[0] = 1;
        }
        kvp_csv_row(stdout, o, row, &r->setup);
        break;
    case KVP_FMT_JSON:
        kvp_json_row(stdout, o, row, &r->setup, r->json_rows[0]++ == 0);
        break;
    }
    if (r->csv != NULL) {
        if (!r->csv_head_done[1]) {
            fputs(kvp_csv_header, r->csv);
            r->csv_head_done[1] = 1;
        }
        kvp_csv_row(r->csv, o, row, &r->setup);
    }
    if (r->json != NULL) {
        kvp_json_row(r->json, o, row, &r->setup, r->json_rows[1]++ == 0);
    }
}

void kvp_report_close(kvp_report_t *r, int failed)
{
    if (r->o->format == KVP_FMT_TABLE && r->have_last) {
        const kvp_row_t *x = &r->last;

        printf("\n# memory after %" PRIu64 " transfers per pair: RSS P %.1f "
               "MiB (peak %.1f), D %.1f MiB (peak %.1f); growth over the "
               "second half of the last point: P %+" PRId64 " KiB, D %+"
               PRId64 " KiB\n",
               x->xfers_done, (double)x->rss_kb[0][2] / 1024,
               (double)x->hwm_kb[0] / 1024, (double)x->rss_kb[1][2] / 1024,
               (double)x->hwm_kb[1] / 1024, x->rss_kb[0][2] - x->rss_kb[0][1],
               x->rss_kb[1][2] - x->rss_kb[1][1]);
    }
    if (r->o->format == KVP_FMT_JSON) {
        kvp_json_close(stdout, r, failed);
    }
    if (failed && r->o->format == KVP_FMT_TABLE) {
        printf("# FAILED\n");
    }
    fflush(stdout);
    if (r->csv != NULL) {
        fclose(r->csv);
    }
    if (r->json != NULL) {
        kvp_json_close(r->json, r, failed);
        fclose(r->json);
    }
    free(r);
}
