#include "chunk.h"
#include "crc.h"
#include "frame.h"
#include "wire.h"

enum { CHUNK_HEADER = 48, MAGIC = 0x50, SUB_BATCH_HEADER = 11,
       DATA_LEN_AT = 36 /* in the chunk header */ };

/* Bytes of a Deliver frame before its chunk header: key, version,
 * subscription id and, in version 2, the committed chunk id. */
static size_t deliver_header(unsigned version)
{
    return version == 2 ? 13 : 5;
}

uint16_t ps_frame_key(const uint8_t *frame)
{
    return ps_be16(frame);
}

int ps_deliver_parse(const uint8_t *f, size_t len, uint64_t pos, ps_chunk *c,
                     ps_error *err)
{
    if (len < 5)
        return ps_fail(err, PS_E_TRUNCATED_FRAME, pos, "Deliver frame shorter than its header");
    if (ps_be16(f) != PS_KEY_DELIVER)
        return ps_fail(err, PS_E_PROTOCOL, pos, "not a Deliver frame");
    c->version = (uint8_t)ps_be16(f + 2);
    if (ps_be16(f + 2) != 1 && ps_be16(f + 2) != 2)
        return ps_fail(err, PS_E_PROTOCOL, pos + 2, "unknown Deliver version");
    c->subscription_id = f[4];
    size_t h = deliver_header(c->version);
    if (len < h)
        return ps_fail(err, PS_E_TRUNCATED_FRAME, pos, "Deliver frame shorter than its header");
    c->committed_chunk_id = c->version == 2 ? ps_be64(f + 5) : 0;
    if (len - h < CHUNK_HEADER)
        return ps_fail(err, PS_E_TRUNCATED_FRAME, pos + h, "Deliver frame ends inside the chunk header");
    const uint8_t *k = f + h;
    if (k[0] != MAGIC)
        return ps_fail(err, PS_E_CHUNK, pos + h, "bad chunk magic (expected 0x50)");
    c->type = k[1];
    if (c->type > 2)
        return ps_fail(err, PS_E_CHUNK, pos + h + 1, "unknown chunk type");
    c->num_entries = ps_be16(k + 2);
    c->num_records = ps_be32(k + 4);
    c->timestamp = (int64_t)ps_be64(k + 8);
    if (c->timestamp > INT64_MAX / 1000 || c->timestamp < INT64_MIN / 1000)
        return ps_fail(err, PS_E_CHUNK, pos + h + 8,
                       "chunk timestamp out of range for microseconds");
    c->epoch = ps_be64(k + 16);
    c->first_offset = ps_be64(k + 24);
    c->crc = ps_be32(k + 32);
    c->data_len = ps_be32(k + DATA_LEN_AT);
    /* trailer and bloom filter are not sent to consumers: the entries fill
     * the rest of the frame exactly */
    if (c->data_len != len - h - CHUNK_HEADER)
        return ps_fail(err, PS_E_CHUNK, pos + h + DATA_LEN_AT,
                       c->data_len > len - h - CHUNK_HEADER
                           ? "chunk data length exceeds the frame"
                           : "chunk data length is shorter than the frame");
    c->data = k + CHUNK_HEADER;
    c->pos = pos;
    return PS_OK;
}

void ps_crc_ahead_advance(ps_crc_ahead *a, const uint8_t *f, size_t have, uint64_t pos)
{
    if (have < 5 || ps_be16(f) != PS_KEY_DELIVER)
        return;
    size_t h = deliver_header(ps_be16(f + 2));
    if (have < h + CHUNK_HEADER)
        return;
    if (a->pos != pos) {
        a->pos = pos;
        a->done = 0;
        a->crc = 0;
        a->walk = (ps_size_walk){0};
    }
    uint32_t data_len = ps_be32(f + h + DATA_LEN_AT);
    size_t in = have - h - CHUNK_HEADER;
    if (in > data_len)          /* a frame longer than its header says */
        in = data_len;
    if (in > a->done) {
        a->crc = ps_crc32(a->crc, f + h + CHUNK_HEADER + a->done, in - a->done);
        a->done = (uint32_t)in;
        /* the headers too, while the bytes are in the cache: walked once
         * the chunk is whole, they are some 8 000 cache misses at 1 KiB */
        const uint8_t *k = f + h;
        ps_chunk c = {.version = (uint8_t)ps_be16(f + 2), .type = k[1],
                      .num_entries = ps_be16(k + 2), .data_len = data_len,
                      .data = k + CHUNK_HEADER, .pos = pos};
        ps_size_walk_step(&a->walk, &c, in);
    }
}

uint32_t ps_crc_ahead_take(ps_crc_ahead *a, const ps_chunk *c, uint32_t *n,
                           ps_size_walk *walk)
{
    int ours = a->pos == c->pos && a->done <= c->data_len;
    *n = ours ? a->done : 0;
    *walk = ours ? a->walk : (ps_size_walk){0};
    uint32_t crc = ours ? a->crc : 0;
    a->pos = 0;                 /* no frame's: they start after a size */
    a->done = 0;
    a->crc = 0;
    a->walk = (ps_size_walk){0};
    return crc;
}

/* Stream position of byte p of the chunk's entries. */
static uint64_t at(const ps_chunk *c, const uint8_t *p)
{
    return c->pos + (uint64_t)(p - c->data) + deliver_header(c->version) + CHUNK_HEADER;
}

typedef struct entry {
    const uint8_t *p;       /* first byte of the entry */
    const uint8_t *body;    /* simple: the record; sub-batch: compressed bytes */
    uint32_t len;           /* of body */
    uint32_t records;
    uint32_t uncompressed;
    int codec;              /* -1: simple entry */
} entry;

static inline int next_entry(const ps_chunk *c, const uint8_t **q, entry *e, ps_error *err)
{
    const uint8_t *p = *q, *end = c->data + c->data_len;
    size_t left = (size_t)(end - p);
    e->p = p;
    if (left < 4)
        return ps_fail(err, PS_E_CHUNK, at(c, p), "truncated entry header");
    if (!(p[0] & 0x80)) {
        e->codec = -1;
        e->len = ps_be32(p);
        e->records = 1;
        e->body = p + 4;
        if (e->len > left - 4)
            return ps_fail(err, PS_E_CHUNK, at(c, p), "entry size exceeds the chunk data");
    } else {
        if (left < SUB_BATCH_HEADER)
            return ps_fail(err, PS_E_CHUNK, at(c, p), "truncated sub-batch header");
        e->codec = (p[0] >> 4) & 7;
        e->records = ps_be16(p + 1);
        e->uncompressed = ps_be32(p + 3);
        e->len = ps_be32(p + 7);
        e->body = p + SUB_BATCH_HEADER;
        if (e->codec >= PS_CODEC_COUNT)
            return ps_fail(err, PS_E_CHUNK, at(c, p), "unknown sub-batch codec");
        if (e->len > left - SUB_BATCH_HEADER)
            return ps_fail(err, PS_E_CHUNK, at(c, p), "sub-batch size exceeds the chunk data");
        if (e->codec == PS_CODEC_NONE && e->uncompressed != e->len)
            return ps_fail(err, PS_E_LIMIT, at(c, p),
                           "uncompressed sub-batch length differs from the announced one");
        /* each record takes at least its 4-byte size */
        if (e->records > e->uncompressed / 4)
            return ps_fail(err, PS_E_CHUNK, at(c, p),
                           "sub-batch record count exceeds its size");
    }
    *q = e->body + e->len;
    return PS_OK;
}

void ps_size_walk_step(ps_size_walk *w, const ps_chunk *c, size_t have)
{
    entry e;
    ps_error ignored;
    if (have > c->data_len)
        have = c->data_len;
    if (c->type != 0)
        w->stopped = 1;         /* tracking chunks decode to nothing */
    while (!w->stopped) {
        if (w->entries >= c->num_entries) {
            w->stopped = 1;
            break;
        }
        const uint8_t *p = c->data + w->next;
        if (have < c->data_len) {   /* more to come: wait for a whole header */
            if (w->next >= have)
                break;
            size_t need = (p[0] & 0x80) ? SUB_BATCH_HEADER : 4;
            if (have - w->next < need)
                break;
        }
        if (next_entry(c, &p, &e, &ignored)) {
            w->stopped = 1;
            break;
        }
        if (e.codec > PS_CODEC_NONE)
            w->size += e.uncompressed;
        w->size += (uint64_t)e.records * PS_ROW_BYTES;
        w->entries++;
        w->next = (uint32_t)(p - c->data);
    }
}

uint64_t ps_chunk_inflated_size(const ps_chunk *c)
{
    ps_size_walk w = {0};
    ps_size_walk_step(&w, c, c->data_len);
    return w.size;
}

/* Append the records of decompressed (or codec 0) sub-batch bytes; *wp
 * is the caller's cursor, copied to a local for the loop. */
static int add_sub_batch(const ps_chunk *c, ps_batch *b, ps_cursor *wp, const entry *e,
                         const uint8_t *p, size_t n, int region,
                         uint64_t offset, int64_t ts, ps_error *err)
{
    const uint8_t *end = p + n;
    const uint8_t *base = region >= 0 ? b->regions[region].base : NULL;
    uint64_t pos = at(c, e->p);
    int amqp = b->opt.amqp, rc = PS_OK;
    uint64_t start = b->opt.start_offset;
    ps_cursor w = *wp;
    for (uint32_t i = 0; i < e->records; i++, offset++) {
        if (end - p < 4 || ps_be32(p) > (size_t)(end - p) - 4) {
            rc = ps_fail(err, PS_E_CHUNK, pos, "record exceeds its sub-batch");
            break;
        }
        uint32_t len = ps_be32(p);
        if (offset >= start && !(region >= 0 &&
                ps_cursor_add(&w, amqp, p + 4, len, region, base, offset, ts))) {
            /* records decompressed out of the stream report the entry's position */
            uint64_t rpos = e->codec == PS_CODEC_NONE ? at(c, p + 4) : pos;
            ps_cursor_store(&w, b);
            rc = ps_batch_add(b, p + 4, len, region, offset, ts, rpos, err);
            ps_cursor_load(&w, b);
            if (rc)
                break;
        }
        p += 4 + len;
    }
    *wp = w;
    if (rc == PS_OK && p != end)
        rc = ps_fail(err, PS_E_CHUNK, pos, "bytes after the last record of a sub-batch");
    return rc;
}

/* A decompressed sub-batch: in view mode its own owned region (columns
 * point into it), in binary mode the reused scratch buffer. */
static int decompress(const ps_chunk *c, ps_batch *b, const entry *e,
                      const uint8_t **out, int *region, ps_error *err)
{
    uint8_t *dst;
    size_t got;
    if (b->opt.body_binary) {
        b->scratch.len = 0;
        if (ps_buf_reserve(&b->scratch, e->uncompressed))
            return ps_fail(err, PS_E_NOMEM, at(c, e->p), "out of memory");
        dst = b->scratch.p;
        *region = -1;
    } else {
        if ((*region = ps_batch_owned_region(b, e->uncompressed)) < 0)
            return ps_fail(err, PS_E_NOMEM, at(c, e->p), "out of memory");
        dst = b->regions[*region].own.p;
    }
    int rc = ps_decompress(b->codecs, e->codec, e->body, e->len, dst,
                           e->uncompressed, &got, at(c, e->body), err);
    if (rc == PS_OK && got != e->uncompressed)
        rc = ps_fail(err, PS_E_LIMIT, at(c, e->p),
                     "sub-batch decompresses to less than its announced length");
    *out = dst;
    return rc;
}

/* Each entry's header is a load the next one's address depends on: once a
 * chunk has left the cache, that chain waits on memory at every record, and
 * with records of many cache lines the hardware's prefetcher, following the
 * reads, falls behind.  Records of one chunk are mostly of one size, so the
 * header PREFETCH_ENTRIES on is asked for now, at the address it has if they
 * are (a guess that is wrong costs one useless load; a prefetch never
 * faults).  Small records come in order anyway, and the check would cost
 * more than it saves. */
enum { PREFETCH_ENTRIES = 16, PREFETCH_MIN_ENTRY = 512 };

static inline void prefetch_ahead(const uint8_t *q, const uint8_t *end, size_t entry_size)
{
#if defined(__GNUC__) || defined(__clang__)
    if (entry_size >= PREFETCH_MIN_ENTRY &&
        (uint64_t)entry_size * PREFETCH_ENTRIES < (uint64_t)(end - q))
        __builtin_prefetch(q + PREFETCH_ENTRIES * entry_size);
#else
    (void)q;
    (void)end;
    (void)entry_size;
#endif
}

/* The entries of a type-0 chunk, rows reserved; the fast path appends
 * through the cursor *w, everything else through the batch. */
static inline int decode_entries(const ps_chunk *c, ps_batch *b, ps_cursor *w,
                                 int input, ps_error *err)
{
    const ps_options *o = &b->opt;
    const uint8_t *q = c->data, *end = c->data + c->data_len;
    const uint8_t *base = b->regions[input].base;
    uint64_t offset = c->first_offset, total = 0;
    int64_t ts = c->timestamp * 1000;
    entry e;
    int rc, amqp = o->amqp;
    for (uint32_t i = 0; i < c->num_entries; i++) {
        if ((rc = next_entry(c, &q, &e, err)))
            return rc;
        prefetch_ahead(q, end, (size_t)(q - e.p));
        if (e.codec > PS_CODEC_NONE) {
            /* bomb limits apply to every sub-batch, even skipped ones */
            total += e.uncompressed;
            if (e.uncompressed > o->max_subbatch)
                return ps_fail(err, PS_E_LIMIT, at(c, e.p),
                               "sub-batch uncompressed size exceeds max_subbatch_size");
            if (total > o->max_chunk)
                return ps_fail(err, PS_E_LIMIT, at(c, e.p),
                               "chunk uncompressed size exceeds max_chunk_size");
        }
        if (offset + e.records <= o->start_offset) {
            offset += e.records;
            continue;
        }
        if (e.codec < 0) {
            rc = PS_OK;
            if (!ps_cursor_add(w, amqp, e.body, e.len, input, base, offset, ts)) {
                ps_cursor_store(w, b);
                rc = ps_batch_add(b, e.body, e.len, input, offset, ts, at(c, e.body), err);
                ps_cursor_load(w, b);
            }
        } else if (e.codec == PS_CODEC_NONE) {
            /* through a copy: a cursor whose address escapes lives in memory */
            ps_cursor t = *w;
            rc = add_sub_batch(c, b, &t, &e, e.body, e.len, input, offset, ts, err);
            *w = t;
        } else {
            const uint8_t *plain;
            int region;
            ps_cursor_store(w, b);
            rc = decompress(c, b, &e, &plain, &region, err);
            ps_cursor t = *w;
            if (rc == PS_OK)
                rc = add_sub_batch(c, b, &t, &e, plain, e.uncompressed, region,
                                   offset, ts, err);
            *w = t;
        }
        if (rc)
            return rc;
        offset += e.records;
    }
    if (q != end)
        return ps_fail(err, PS_E_CHUNK, at(c, q), "bytes after the last entry of the chunk");
    if (offset - c->first_offset != c->num_records)
        return ps_fail(err, PS_E_CHUNK, at(c, c->data) - 44,
                       "chunk record count differs from its entries");
    return PS_OK;
}

int ps_chunk_check_crc(const ps_chunk *c, uint32_t crc, ps_error *err)
{
    if (crc != c->crc)
        return ps_fail(err, PS_E_CRC, at(c, c->data) - 16, "chunk CRC-32 mismatch");
    return PS_OK;
}

int ps_chunk_decode_records(const ps_chunk *c, ps_batch *b, ps_error *err)
{
    ps_cursor w;
    int rc;
    if (c->type != 0)
        return PS_OK;       /* tracking data: uses offsets, holds no records */

    /* one pass: the chunk is in cache after the CRC; the header's record
     * count is only a size hint until it is checked at the end */
    int input = ps_batch_input_region(b, c->data, c->data_len);
    size_t hint = c->num_records < c->data_len / 4 ? c->num_records : c->data_len / 4;
    if (input < 0 || ps_batch_reserve(b, hint, c->data_len))
        return ps_fail(err, PS_E_NOMEM, c->pos, "out of memory");
    ps_cursor_load(&w, b);
    rc = decode_entries(c, b, &w, input, err);
    ps_cursor_store(&w, b);
    return rc;
}

int ps_chunk_decode(const ps_chunk *c, ps_batch *b, ps_error *err)
{
    int rc;
    if (b->opt.crc && (rc = ps_chunk_check_crc(c, ps_crc32(0, c->data, c->data_len), err)))
        return rc;
    return ps_chunk_decode_records(c, b, err);
}

int ps_decode_buffer(const uint8_t *p, size_t n, ps_batch *b, ps_error *err)
{
    ps_reader r = {.buf = (uint8_t *)p, .cap = n, .wpos = n};
    const uint8_t *frame;
    uint32_t len;
    ps_chunk c;
    int rc;
    /* reserve the rows of all frames at once (headers only) */
    size_t rows = 0, bytes = 0;
    while (ps_reader_next(&r, &frame, &len, err) == PS_OK)
        if (ps_deliver_parse(frame, len, 0, &c, err) == PS_OK) {
            rows += c.num_records < c.data_len / 4 ? c.num_records : c.data_len / 4;
            bytes += c.data_len;
        }
    if (ps_batch_reserve(b, rows, bytes))
        return ps_fail(err, PS_E_NOMEM, 0, "out of memory");
    r.rpos = 0;
    r.consumed = 0;
    while ((rc = ps_reader_next(&r, &frame, &len, err)) == PS_OK) {
        if ((rc = ps_deliver_parse(frame, len, (uint64_t)(frame - p), &c, err)) ||
            (rc = ps_chunk_decode(&c, b, err)))
            return rc;
    }
    if (rc == PS_NEED_MORE && r.rpos != r.wpos)
        return ps_fail(err, PS_E_TRUNCATED_FRAME, r.rpos, "buffer ends inside a frame");
    return rc == PS_NEED_MORE ? PS_OK : rc;
}
