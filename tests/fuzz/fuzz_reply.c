/*
 * fuzz_reply.c - control replies (kvc_reply_decode / kvc_reply_encode) and
 * the path a decoder error takes to the peer: the error text of every
 * control-plane decoder, sent in a reply, must arrive intact.
 *
 * Invariants:
 *  - a decoded reason is valid UTF-8 without control bytes, shorter than
 *    the buffer; encoded again it decodes to the same ok flag and reason;
 *  - the input as a reason (up to its first NUL): its reply decodes, and
 *    when the text is valid UTF-8 without control bytes the reason is that
 *    text (up to the buffer);
 *  - the input through kvc_msg_decode (both roles), kvc_hs_request_decode
 *    and kvc_hs_decode: each error text is valid UTF-8 and its reply
 *    decodes to that text (control bytes shown as '?').
 */
#include "fuzz.h"
#include "fuzz_utf8.h"

#include "ctlmsg.h"

#define FZ_REASON_MAX KVX_REASON_MAX

static int fz_plain(const char *s)
{
    for (; *s != '\0'; s++) {
        if ((unsigned char)*s < 0x20 || *s == 0x7f) {
            return 0;
        }
    }
    return 1;
}

/* fz_send_reason: reason in a reply, decoded; returns the decoded reason in
 * out (FZ_REASON_MAX). */
static void fz_send_reason(const char *reason, char *out)
{
    size_t len = 0;
    char  *reply = kvc_reply_encode(0, reason, &len);
    int    ok = -1;

    FZ_CHECK(reply != NULL, "encode: %s", kvc_last_error());
    FZ_CHECK(len == strlen(reply), "len");
    FZ_CHECK(kvc_reply_decode(reply, len, &ok, out, FZ_REASON_MAX) == KVX_OK,
             "reply of reason '%.200s' does not decode: %s", reason,
             kvc_last_error());
    FZ_CHECK(ok == 0, "ok %d", ok);
    free(reply);
}

/* fz_error_arrives: the current error text sent in a reply arrives intact. */
static void fz_error_arrives(void)
{
    char        err[FZ_REASON_MAX * 2], got[FZ_REASON_MAX];
    size_t      len;

    snprintf(err, sizeof(err), "%s", kvc_last_error());
    len = strlen(err);
    FZ_CHECK(len > 0, "no error text");
    FZ_CHECK(fz_utf8_valid(err, len), "error text not UTF-8: %s", err);
    fz_send_reason(err, got);
    /* what arrives: the text, control bytes shown as '?' (kvc_reply_decode),
     * cut to the buffer on a character boundary */
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)err[i] < 0x20 || err[i] == 0x7f) {
            err[i] = '?';
        }
    }
    FZ_CHECK(strncmp(got, err, strlen(got)) == 0 &&
                 (strlen(got) == len ||
                  (len > FZ_REASON_MAX - 1 && strlen(got) + 4 > FZ_REASON_MAX - 1)),
             "sent '%s' got '%s'", err, got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char   *buf = (const char *)data;
    char          reason[FZ_REASON_MAX], again[FZ_REASON_MAX];
    char         *s;
    int           ok = -1;
    kvc_msg_t     msg;
    kvc_hs_meta_t meta;
    uint32_t      version;

    /* a peer's reply */
    kvc_reply_info_t info, info2;

    if (kvc_reply_decode_info(buf, size, &info, reason, sizeof(reason)) ==
        KVX_OK) {
        size_t rlen = strlen(reason);

        ok = info.ok;
        /* instance, fence and an ok reply's hold survive re-encoding */
        s = kvc_reply_encode_info(&info, reason, NULL);
        FZ_CHECK(s != NULL && kvc_reply_decode_info(s, strlen(s), &info2,
                                                    again, sizeof(again)) ==
                                  KVX_OK,
                 "re-encoded reply");
        FZ_CHECK(info2.ok == info.ok && info2.instance == info.instance &&
                     info2.fenced == info.fenced &&
                     info2.has_hold == (info.ok && info.has_hold) &&
                     (!info2.has_hold || info2.hold_ms == info.hold_ms),
                 "info changed");
        free(s);

        FZ_CHECK(ok == 0 || ok == 1, "ok %d", ok);
        FZ_CHECK(rlen < sizeof(reason), "len");
        FZ_CHECK(fz_utf8_valid(reason, rlen), "reason not UTF-8");
        FZ_CHECK(fz_plain(reason), "control byte in reason");
        if (ok) {
            FZ_CHECK(rlen == 0, "reason on ok");
            s = kvc_reply_encode(1, NULL, NULL);
            FZ_CHECK(s != NULL && kvc_reply_decode(s, strlen(s), &ok, again,
                                                   sizeof(again)) == KVX_OK &&
                         ok == 1,
                     "ok reply");
            free(s);
        } else {
            fz_send_reason(reason, again);
            FZ_CHECK(strcmp(reason, again) == 0, "'%s' vs '%s'", reason,
                     again);
        }
    } else {
        fz_error_arrives();
    }

    /* the input as our own reason */
    s = fz_cstr(data, size);
    fz_send_reason(s, reason);
    if (fz_utf8_valid(s, strlen(s)) && fz_plain(s)) {
        size_t rlen = strlen(reason), slen = strlen(s);

        /* all of it, or cut to the buffer on a character boundary */
        FZ_CHECK(strncmp(reason, s, rlen) == 0 &&
                     (rlen == slen ||
                      (slen > sizeof(reason) - 1 &&
                       rlen + 4 > sizeof(reason) - 1)),
                 "sent '%.200s' got '%.200s'", s, reason);
    }
    free(s);

    /* errors of the other control-plane decoders */
    for (int prod = 0; prod <= 1; prod++) {
        if (kvc_msg_decode(buf, size, prod, &msg) == KVX_OK) {
            kvc_msg_fini(&msg);
        } else {
            fz_error_arrives();
        }
    }
    if (kvc_hs_request_decode(buf, size, &version) != KVX_OK) {
        fz_error_arrives();
    }
    if (kvc_hs_decode(buf, size, &meta) == KVX_OK) {
        kvc_hs_fini(&meta);
    } else {
        fz_error_arrives();
    }
    return 0;
}
