/* Column builders: the records of one or more chunks become the buffers of
 * one Arrow record batch (layouts of the Arrow columnar format):
 *
 *   offset            int64
 *   chunk_timestamp   timestamp[us, UTC] (int64)
 *   body              binary_view: 16 bytes per row, the length then either
 *                     the bytes inline (<= 12) or a 4-byte prefix, a data
 *                     buffer index and an offset into that buffer; or
 *                     binary: int32 offsets + contiguous bytes
 *   properties, header           struct (validity + one child per field)
 *   application_properties, message_annotations, footer   map<string, string>
 *   error             string, only with the "raw" error policy
 *
 * Data buffers of the views ("regions") are the caller's input (the receive
 * buffer), decompressed sub-batches and concatenated data sections; the
 * latter two are owned here and handed over with the batch. */
#ifndef PS_BATCH_H
#define PS_BATCH_H

#include "amqp.h"
#include "buf.h"
#include "codec.h"

/* Optional columns, decoded only when asked for. */
enum {
    PS_COL_PROPERTIES = 1,
    PS_COL_APPLICATION_PROPERTIES = 2,
    PS_COL_MESSAGE_ANNOTATIONS = 4,
    PS_COL_HEADER = 8,
    PS_COL_FOOTER = 16,
};

/* What happens to a message that is not valid AMQP 1.0. */
enum {
    PS_POLICY_RAISE = 0,    /* fail the whole decode (MalformedMessage) */
    PS_POLICY_SKIP,         /* drop the record */
    PS_POLICY_RAW,          /* keep the entry bytes as body, text in `error` */
};

typedef struct ps_options {
    int crc;                /* verify each chunk's CRC-32 */
    int amqp;               /* entries are AMQP 1.0 messages; else raw bodies */
    int body_binary;        /* contiguous binary instead of binary_view */
    int error_policy;
    unsigned columns;       /* PS_COL_* */
    uint64_t start_offset;  /* records below it are dropped */
    uint64_t max_subbatch;  /* uncompressed bytes of one sub-batch */
    uint64_t max_chunk;     /* uncompressed bytes of one chunk (< 2 GiB) */
} ps_options;

enum { PS_KIND_FIXED, PS_KIND_BOOL, PS_KIND_BYTES, PS_KIND_LIST, PS_KIND_STRUCT };

/* One Arrow array: validity bitmap (always kept; bit set = valid), values
 * (fixed width, bits, or int32 offsets for bytes and list kinds), data. */
typedef struct ps_col {
    ps_buf validity, values, data;
    size_t length, nulls;
    uint8_t kind, width;
} ps_col;

typedef struct ps_region {
    const uint8_t *base;    /* caller's memory, or own.p */
    size_t len;
    ps_buf own;             /* owned memory (own.p != NULL) */
} ps_region;

enum { PS_PROP_FIELDS = 13, PS_HEADER_FIELDS = 5 };

typedef struct ps_batch {
    ps_options opt;
    size_t rows;
    ps_buf offset, timestamp, views;
    ps_col body;            /* body="binary" */
    ps_col error;           /* error policy "raw" */
    ps_col properties, prop[PS_PROP_FIELDS];
    ps_col header, hdr[PS_HEADER_FIELDS];
    ps_col app, app_keys, app_values;
    ps_col ann, ann_keys, ann_values;
    ps_col foot, foot_keys, foot_values;
    ps_region *regions;
    size_t nregions, cap_regions;
    int input_region;       /* region of the latest input bytes, or -1 */
    int concat_region;      /* region of concatenated data sections, or -1 */
    ps_buf scratch;         /* decompression target in binary mode */
    ps_codecs *codecs;
} ps_batch;

/* Empty batch for these options (PS_OK or PS_E_NOMEM). */
int ps_batch_init(ps_batch *b, const ps_options *opt);
/* Free everything still owned (what was not handed over). */
void ps_batch_free(ps_batch *b);
/* Start a new batch with the same options, keeping contexts, scratch and
 * the allocations of buffers not handed over;
 * buffers already handed over must have been detached (p = NULL). */
int ps_batch_reset(ps_batch *b);

/* Room for `rows` more records and `bytes` more binary body bytes. */
int ps_batch_reserve(ps_batch *b, size_t rows, size_t bytes);

/* The region that holds [p, p+n) of the caller's input (created or
 * extended as needed so that view offsets fit in int32), or -1. */
int ps_batch_input_region(ps_batch *b, const uint8_t *p, size_t n);

/* A new owned region of n bytes for decompressed data, or -1. */
int ps_batch_owned_region(ps_batch *b, size_t n);

/* Append one record: its bytes [p, p+n) inside region `region`.  `pos` is
 * the stream position reported in errors.  Applies the error policy. */
int ps_batch_add(ps_batch *b, const uint8_t *p, uint32_t n, int region,
                 uint64_t offset, int64_t timestamp_us, uint64_t pos,
                 ps_error *err);

/* The 16-byte binary_view of [p, p+n), at offset `off` of data buffer
 * `region` when it is not inline. */
static inline void ps_put_view(uint8_t *v, const uint8_t *p, uint32_t n,
                               int32_t region, int32_t off)
{
    memcpy(v, &n, 4);
    if (n <= 12) {
        memset(v + 4, 0, 12);
        memcpy(v + 4, p, n);
    } else {
        /* every byte written once: no zeroing first */
        memcpy(v + 4, p, 4);
        memcpy(v + 8, &region, 4);
        memcpy(v + 12, &off, 4);
    }
}

/* Whether ps_cursor_add may take this batch's records: binary_view
 * bodies and no column but offset, timestamp and body. */
static inline int ps_batch_fast(const ps_batch *b)
{
    return !b->opt.body_binary && !b->opt.columns &&
           b->opt.error_policy != PS_POLICY_RAW;
}

/* Where the fast path appends: the next row's view, offset and timestamp
 * and the rows that still fit.  A chunk's loop keeps it in locals, so the
 * compiler holds it in registers instead of storing and reloading the
 * buffers' lengths per record; ps_cursor_store writes it back, and must
 * come before anything else touches the batch (ps_cursor_load after). */
typedef struct ps_cursor {
    uint8_t *view, *offset, *timestamp;
    size_t rows;            /* appended since ps_cursor_load */
    size_t room;            /* rows that fit; 0 if not ps_batch_fast */
} ps_cursor;

static inline void ps_cursor_load(ps_cursor *w, const ps_batch *b)
{
    size_t v = (b->views.cap - b->views.len) / 16;
    size_t o = (b->offset.cap - b->offset.len) / 8;
    size_t t = (b->timestamp.cap - b->timestamp.len) / 8;
    w->rows = 0;
    w->room = !ps_batch_fast(b) ? 0 : v < o ? (v < t ? v : t) : (o < t ? o : t);
    /* buffers not yet allocated (room 0) have no address to add to */
    w->view = w->room ? b->views.p + b->views.len : NULL;
    w->offset = w->room ? b->offset.p + b->offset.len : NULL;
    w->timestamp = w->room ? b->timestamp.p + b->timestamp.len : NULL;
}

static inline void ps_cursor_store(ps_cursor *w, ps_batch *b)
{
    b->views.len += 16 * w->rows;
    b->offset.len += 8 * w->rows;
    b->timestamp.len += 8 * w->rows;
    b->rows += w->rows;
    ps_cursor_load(w, b);
}

/* ps_batch_add for the common record of a ps_batch_fast batch, without
 * calls or growth: the record [p, p+n) lies in the region whose data
 * starts at `base`.  1 if appended; 0 (nothing appended: store the
 * cursor, call ps_batch_add) when the room is used up or, with amqp, the
 * message is not one data section. */
static inline int ps_cursor_add(ps_cursor *w, int amqp, const uint8_t *p, uint32_t n,
                                int region, const uint8_t *base, uint64_t offset,
                                int64_t timestamp_us)
{
    const uint8_t *body = p;
    uint32_t len = n;
    if (w->rows == w->room)
        return 0;
    if (amqp && !ps_amqp_data_only(p, n, &body, &len))
        return 0;
    ps_put_view(w->view + 16 * w->rows, body, len, region, (int32_t)(body - base));
    memcpy(w->offset + 8 * w->rows, &offset, 8);
    memcpy(w->timestamp + 8 * w->rows, &timestamp_us, 8);
    w->rows++;
    return 1;
}

#endif
