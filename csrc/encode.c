#include "encode.h"

enum {
    KEY_PUBLISH = 0x0002,
    FRAME_HEADER = 13,          /* size, key, version, publisher id, count */
    SUB_BATCH_HEADER = 19,      /* publishing id, then 11 bytes as in chunk.h */
    MAX_FILTER = 0x7fff,        /* an i16-length string */
};

/* AMQP 1.0 constructors (the 8-bit forms; +0x10 is the 32-bit one) */
enum {
    NULL_ = 0x40, LIST0 = 0x45, UINT0 = 0x43, SMALLUINT = 0x52, UINT_ = 0x70,
    TIMESTAMP = 0x83, VBIN8 = 0xa0, STR8 = 0xa1, SYM8 = 0xa3, LIST8 = 0xc0,
    MAP8 = 0xc1,
};

/* Properties fields by position (amqp.h's list), how each is written: the
 * specification makes content-type/-encoding symbols, user-id binary,
 * group-sequence a uint; message-id and correlation-id follow their Arrow
 * type (string or binary). */
enum { MESSAGE_ID = 0, CORRELATION_ID = 5 };

static const uint8_t prop_code[PS_PROP_FIELDS] = {
    STR8, VBIN8, STR8, STR8, STR8, STR8, SYM8, SYM8, TIMESTAMP, TIMESTAMP,
    STR8, UINT_, STR8,
};

static inline uint8_t *put16(uint8_t *w, uint16_t v)
{
    v = __builtin_bswap16(v);
    memcpy(w, &v, 2);
    return w + 2;
}

static inline uint8_t *put32(uint8_t *w, uint32_t v)
{
    v = __builtin_bswap32(v);
    memcpy(w, &v, 4);
    return w + 4;
}

static inline uint8_t *put64(uint8_t *w, uint64_t v)
{
    v = __builtin_bswap64(v);
    memcpy(w, &v, 8);
    return w + 8;
}

/* --- Arrow columns ---------------------------------------------------------- */

static inline int valid(const uint8_t *validity, size_t i)
{
    return !validity || (validity[i >> 3] >> (i & 7) & 1);
}

/* Row i of a column: 1 and its bytes, or 0 if null.  Arrow is little-endian
 * and so is every host this builds on (views hold native int32s). */
static inline int strs_get(const ps_strs *s, size_t i, const uint8_t **p, size_t *n)
{
    i += s->offset;
    if (!valid(s->validity, i))
        return 0;
    if (s->layout == PS_STRS_OFFSETS32) {
        const int32_t *o = s->offsets;
        *p = s->data + o[i];
        *n = (size_t)(o[i + 1] - o[i]);
    } else if (s->layout == PS_STRS_OFFSETS64) {
        const int64_t *o = s->offsets;
        *p = s->data + o[i];
        *n = (size_t)(o[i + 1] - o[i]);
    } else {
        /* 16 bytes: i32 length, then <= 12 bytes inline or a 4-byte prefix,
         * i32 buffer index, i32 offset */
        const uint8_t *v = (const uint8_t *)s->offsets + 16 * i;
        int32_t len, buf, off;
        memcpy(&len, v, 4);
        if (len <= 12) {
            *p = v + 4;
        } else {
            memcpy(&buf, v + 8, 4);
            memcpy(&off, v + 12, 4);
            *p = s->buffers[buf] + off;
        }
        *n = (size_t)len;
    }
    return 1;
}

static inline int ints_get(const ps_ints *c, size_t i, int64_t *v)
{
    i += c->offset;
    if (!valid(c->validity, i))
        return 0;
    *v = c->values[i];
    return 1;
}

/* --- AMQP 1.0 messages -------------------------------------------------------- */

static inline size_t bytes_size(size_t n)
{
    return n <= 255 ? 2 + n : 5 + n;
}

static inline uint8_t *put_bytes(uint8_t *w, uint8_t code8, const uint8_t *p, size_t n)
{
    if (n <= 255) {
        *w++ = code8;
        *w++ = (uint8_t)n;
    } else {
        *w++ = code8 + 0x10;
        w = put32(w, (uint32_t)n);
    }
    memcpy(w, p, n);
    return w + n;
}

/* A list or map whose items take `items` bytes: the 8-bit form when its
 * size (which counts the count byte) and count fit a byte. */
static inline size_t compound_size(size_t items, size_t count)
{
    return items < 255 && count < 256 ? 3 + items : 9 + items;
}

static inline uint8_t *put_compound(uint8_t *w, uint8_t code8, size_t items, size_t count)
{
    if (items < 255 && count < 256) {
        w[0] = code8;
        w[1] = (uint8_t)(items + 1);
        w[2] = (uint8_t)count;
        return w + 3;
    }
    *w++ = code8 + 0x10;
    w = put32(w, (uint32_t)(items + 4));
    return put32(w, (uint32_t)count);
}

static inline uint8_t *put_section(uint8_t *w, uint8_t code)
{
    w[0] = 0x00;
    w[1] = 0x53;            /* smallulong descriptor */
    w[2] = code;
    return w + 3;
}

/* What one message will take, worked out before it is written (the list
 * and map headers depend on the sizes of their items). */
typedef struct plan {
    const uint8_t *body;
    size_t body_len;
    size_t size;            /* the whole message */
    size_t ann_items, app_items, prop_items;
    uint32_t ann_count, app_count, prop_count;
    uint8_t has_ann, has_app, has_props;
} plan;

/* AMQP symbols are ASCII (AMQP 1.0, 1.6.20): strict decoders such as
 * qpid-proton refuse a message holding any other byte in one. */
static int is_ascii(const uint8_t *p, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (p[k] & 0x80)
            return 0;
    return 1;
}

/* Items of row i of a map; PS_E_PROTOCOL for a null key, PS_E_AMQP for a
 * key that is not ASCII when keys are symbols. */
static int map_items(const ps_map *m, size_t i, int symbol_keys, size_t *items,
                     uint32_t *count)
{
    const uint8_t *p;
    size_t n, total = 0;
    int32_t a = m->offsets[m->offset + i], b = m->offsets[m->offset + i + 1];
    for (int32_t j = a; j < b; j++) {
        if (!strs_get(&m->keys, (size_t)j, &p, &n))
            return PS_E_PROTOCOL;
        if (symbol_keys && !is_ascii(p, n))
            return PS_E_AMQP;
        total += bytes_size(n);
        total += strs_get(&m->values, (size_t)j, &p, &n) ? bytes_size(n) : 1;
    }
    *items = total;
    *count = 2 * (uint32_t)(b - a);
    return PS_OK;
}

static uint8_t *put_map(uint8_t *w, const ps_map *m, size_t i, size_t items,
                        uint32_t count, uint8_t key_code)
{
    /* map_items found every key set; the compiler cannot see that */
    const uint8_t *p = NULL;
    size_t n = 0;
    int32_t a = m->offsets[m->offset + i], b = m->offsets[m->offset + i + 1];
    w = put_compound(w, MAP8, items, count);
    for (int32_t j = a; j < b; j++) {
        strs_get(&m->keys, (size_t)j, &p, &n);
        w = put_bytes(w, key_code, p, n);
        if (strs_get(&m->values, (size_t)j, &p, &n))
            w = put_bytes(w, STR8, p, n);
        else
            *w++ = NULL_;
    }
    return w;
}

/* Floor of v * mul / div (AMQP milliseconds from an Arrow unit); -1 when
 * it leaves int64. */
static int scale(const ps_ints *c, int64_t v, int64_t *out)
{
    if (c->mul > 1) {
        if (v > INT64_MAX / c->mul || v < INT64_MIN / c->mul)
            return -1;
        v *= c->mul;
    }
    if (c->div > 1) {
        int64_t q = v / c->div;
        *out = q - (v % c->div < 0);
        return 0;
    }
    *out = v;
    return 0;
}

/* Encoded size of property field f of row i (0 if null); -1 if the value
 * cannot be written. */
static int prop_size(const ps_props *pr, int f, size_t i, size_t *size)
{
    const uint8_t *p;
    size_t n;
    int64_t v;
    *size = 0;
    if (pr->text[f].layout != PS_STRS_ABSENT) {
        if (strs_get(&pr->text[f], i, &p, &n)) {
            if (prop_code[f] == SYM8 && !is_ascii(p, n))
                return -1;
            *size = bytes_size(n);
        }
        return 0;
    }
    if (!pr->num[f].values || !ints_get(&pr->num[f], i, &v))
        return 0;
    if (prop_code[f] == TIMESTAMP) {
        if (scale(&pr->num[f], v, &v))
            return -1;
        *size = 9;
        return 0;
    }
    /* group-sequence is an AMQP sequence-no: uint */
    if (v < 0 || v > UINT32_MAX)
        return -1;
    *size = v == 0 ? 1 : v < 256 ? 2 : 5;
    return 0;
}

static uint8_t *put_prop(uint8_t *w, const ps_props *pr, int f, size_t i)
{
    const uint8_t *p;
    size_t n;
    int64_t v;
    const ps_strs *s = &pr->text[f];
    if (s->layout != PS_STRS_ABSENT) {
        if (!strs_get(s, i, &p, &n)) {
            *w++ = NULL_;
            return w;
        }
        uint8_t code = prop_code[f];
        if ((f == MESSAGE_ID || f == CORRELATION_ID) && s->binary)
            code = VBIN8;
        return put_bytes(w, code, p, n);
    }
    if (!pr->num[f].values || !ints_get(&pr->num[f], i, &v)) {
        *w++ = NULL_;
        return w;
    }
    if (prop_code[f] == TIMESTAMP) {
        scale(&pr->num[f], v, &v);
        *w++ = TIMESTAMP;
        return put64(w, (uint64_t)v);
    }
    if (v == 0) {
        *w++ = UINT0;
    } else if (v < 256) {
        *w++ = SMALLUINT;
        *w++ = (uint8_t)v;
    } else {
        *w++ = UINT_;
        w = put32(w, (uint32_t)v);
    }
    return w;
}

static int plan_message(const ps_publish *pub, size_t i, plan *m, ps_error *err)
{
    if (!strs_get(&pub->body, i, &m->body, &m->body_len))
        return ps_fail(err, PS_E_PROTOCOL, i, "null body");
    if (!pub->amqp) {
        m->size = m->body_len;
        m->has_ann = m->has_app = m->has_props = 0;
    } else {
        m->size = 3 + bytes_size(m->body_len);
        const ps_map *ann = &pub->message_annotations, *app = &pub->application_properties;
        const ps_props *pr = &pub->properties;
        m->has_ann = ann->offsets && valid(ann->validity, ann->offset + i);
        if (m->has_ann) {
            int rc = map_items(ann, i, 1, &m->ann_items, &m->ann_count);
            if (rc)
                return ps_fail(err, PS_E_PROTOCOL, i, rc == PS_E_AMQP
                               ? "message_annotations: a key is not ASCII (keys are AMQP symbols)"
                               : "null message annotation key");
            m->size += 3 + compound_size(m->ann_items, m->ann_count);
        }
        m->has_app = app->offsets && valid(app->validity, app->offset + i);
        if (m->has_app) {
            if (map_items(app, i, 0, &m->app_items, &m->app_count))
                return ps_fail(err, PS_E_PROTOCOL, i, "null application property key");
            m->size += 3 + compound_size(m->app_items, m->app_count);
        }
        m->has_props = pr->present && valid(pr->validity, pr->offset + i);
        if (m->has_props) {
            /* nulls count as 1 byte until the last non-null field */
            size_t total = 0, size;
            m->prop_items = 0;
            m->prop_count = 0;
            for (int f = 0; f < PS_PROP_FIELDS; f++) {
                if (prop_size(pr, f, i, &size))
                    return ps_fail(err, PS_E_PROTOCOL, i, prop_code[f] == UINT_
                                   ? "group_sequence outside the AMQP uint range"
                                   : prop_code[f] != SYM8
                                   ? "timestamp outside the int64 milliseconds range"
                                   : f == 6 ? "content_type is not ASCII (an AMQP symbol)"
                                   : "content_encoding is not ASCII (an AMQP symbol)");
                total += size ? size : 1;
                if (size) {
                    m->prop_items = total;
                    m->prop_count = (uint32_t)f + 1;
                }
            }
            m->size += 3 + (m->prop_count ? compound_size(m->prop_items, m->prop_count) : 1);
        }
    }
    /* a simple entry's size has bit 31 clear */
    if (m->size > INT32_MAX)
        return ps_fail(err, PS_E_PROTOCOL, i, "message of 2 GiB or more");
    return PS_OK;
}

static uint8_t *put_message(uint8_t *w, const ps_publish *pub, size_t i, const plan *m)
{
    if (!pub->amqp) {
        memcpy(w, m->body, m->body_len);
        return w + m->body_len;
    }
    if (m->has_ann) {
        w = put_section(w, PS_SEC_MESSAGE_ANNOTATIONS);
        w = put_map(w, &pub->message_annotations, i, m->ann_items, m->ann_count, SYM8);
    }
    if (m->has_props) {
        w = put_section(w, PS_SEC_PROPERTIES);
        if (!m->prop_count) {
            *w++ = LIST0;
        } else {
            w = put_compound(w, LIST8, m->prop_items, m->prop_count);
            for (uint32_t f = 0; f < m->prop_count; f++)
                w = put_prop(w, &pub->properties, (int)f, i);
        }
    }
    if (m->has_app) {
        w = put_section(w, PS_SEC_APPLICATION_PROPERTIES);
        w = put_map(w, &pub->application_properties, i, m->app_items, m->app_count, STR8);
    }
    w = put_section(w, PS_SEC_DATA);
    return put_bytes(w, VBIN8, m->body, m->body_len);
}

/* --- frames --------------------------------------------------------------------- */

typedef struct encoder {
    const ps_publish *pub;
    ps_buf *out, *counts;
    size_t frame;           /* start of the open frame in out */
    uint32_t entries;       /* in the open frame; 0: none open */
    uint64_t next_id;
    ps_error *err;
} encoder;

static void frame_header(encoder *e, size_t at)
{
    uint8_t *w = e->out->p + at + 4;        /* size and count come at the close */
    w = put16(w, KEY_PUBLISH);
    w = put16(w, e->pub->filter.layout != PS_STRS_ABSENT ? 2 : 1);
    *w = e->pub->publisher_id;
    e->frame = at;
}

static void close_frame(encoder *e)
{
    uint8_t *w = e->out->p + e->frame;
    put32(w, (uint32_t)(e->out->len - e->frame - 4));
    put32(w + 9, e->entries);
    e->entries = 0;
}

/* Room for an entry of `size` bytes and a frame header, and a frame open
 * for it (the caller has closed a full one). */
static int open_frame(encoder *e, size_t size)
{
    ps_buf *out = e->out;
    if (ps_buf_reserve(out, FRAME_HEADER + size))
        return PS_E_NOMEM;
    if (!e->entries) {
        frame_header(e, out->len);
        out->len += FRAME_HEADER;
    }
    return PS_OK;
}

static int encode_messages(encoder *e)
{
    const ps_publish *pub = e->pub;
    int v2 = pub->filter.layout != PS_STRS_ABSENT;
    plan m;
    int rc;
    for (size_t i = 0; i < pub->count; i++) {
        const uint8_t *f = NULL;
        size_t flen = 0;
        int has_filter = v2 && strs_get(&pub->filter, i, &f, &flen);
        if ((rc = plan_message(pub, i, &m, e->err)))
            return rc;
        if (flen > MAX_FILTER)
            return ps_fail(e->err, PS_E_PROTOCOL, i, "filter value above 32767 bytes");
        size_t size = 8 + (v2 ? 2 + flen : 0) + 4 + m.size;
        if (FRAME_HEADER + size > pub->max_frame)
            return ps_fail(e->err, PS_E_FRAME_TOO_LARGE, i,
                           "message does not fit in a frame of max_frame_size");
        if (e->entries && e->out->len - e->frame + size > pub->max_frame)
            close_frame(e);
        if (open_frame(e, size))
            return ps_fail(e->err, PS_E_NOMEM, i, "out of memory");
        uint8_t *w = put64(e->out->p + e->out->len, e->next_id++);
        if (v2) {
            w = put16(w, has_filter ? (uint16_t)flen : 0xffff);
            if (flen)
                memcpy(w, f, flen);
            w += flen;
        }
        w = put32(w, (uint32_t)m.size);
        w = put_message(w, pub, i, &m);
        e->out->len = (size_t)(w - e->out->p);
        e->entries++;
    }
    if (ps_buf_reserve(e->counts, pub->count * 8))
        return ps_fail(e->err, PS_E_NOMEM, 0, "out of memory");
    int64_t one = 1;
    for (size_t i = 0; i < pub->count; i++)
        memcpy(e->counts->p + 8 * i, &one, 8);
    e->counts->len = pub->count * 8;
    return PS_OK;
}

/* One sub-batch entry holding messages [first, first + records) whose
 * records are in plain: compressed straight into the open frame, and moved
 * behind a new frame header if it turns out not to fit there. */
static int add_sub_batch(encoder *e, ps_codecs *codecs, const ps_buf *plain,
                         size_t first, uint32_t records)
{
    const ps_publish *pub = e->pub;
    ps_buf *out = e->out;
    size_t bound = SUB_BATCH_HEADER + ps_compress_bound(pub->codec, plain->len), len;
    int rc;
    if (open_frame(e, bound))
        return ps_fail(e->err, PS_E_NOMEM, first, "out of memory");
    size_t at = out->len;
    uint8_t *data = out->p + at + SUB_BATCH_HEADER;
    if (pub->codec == PS_CODEC_NONE) {
        memcpy(data, plain->p, plain->len);
        len = plain->len;
    } else if ((rc = ps_compress(codecs, pub->codec, plain->p, plain->len, data, &len,
                                 e->err))) {
        e->err->position = first;
        return rc;
    }
    size_t size = SUB_BATCH_HEADER + len;
    if (FRAME_HEADER + size > pub->max_frame)
        return ps_fail(e->err, PS_E_FRAME_TOO_LARGE, first,
                       "message does not fit in a frame of max_frame_size");
    if (e->entries && at + size - e->frame > pub->max_frame) {
        close_frame(e);
        memmove(data + FRAME_HEADER, data, len);
        frame_header(e, at);
        at += FRAME_HEADER;
    }
    uint8_t *w = put64(out->p + at, e->next_id++);
    *w++ = (uint8_t)(0x80 | pub->codec << 4);
    w = put16(w, (uint16_t)records);
    w = put32(w, (uint32_t)plain->len);
    put32(w, (uint32_t)len);
    out->len = at + size;
    e->entries++;
    int64_t n = records;
    return ps_buf_put(e->counts, &n, 8)
        ? ps_fail(e->err, PS_E_NOMEM, first, "out of memory") : PS_OK;
}

/* Sub-batches of up to pub->sub_batch records, each small enough that even
 * the codec's worst case fits a frame of its own (one record may pass that:
 * it is compressed and then checked). */
static int encode_sub_batches(encoder *e, ps_codecs *codecs)
{
    const ps_publish *pub = e->pub;
    ps_buf plain = {0};
    plan m;
    int rc = PS_OK;
    size_t i = 0;
    while (i < pub->count && rc == PS_OK) {
        size_t first = i;
        uint32_t records = 0;
        plain.len = 0;
        while (i < pub->count && records < pub->sub_batch) {
            if ((rc = plan_message(pub, i, &m, e->err)))
                goto done;
            size_t grown = plain.len + 4 + m.size;
            if (records && FRAME_HEADER + SUB_BATCH_HEADER +
                ps_compress_bound(pub->codec, grown) > pub->max_frame)
                break;
            if (ps_buf_reserve(&plain, 4 + m.size)) {
                rc = ps_fail(e->err, PS_E_NOMEM, i, "out of memory");
                goto done;
            }
            uint8_t *w = put32(plain.p + plain.len, (uint32_t)m.size);
            plain.len = (size_t)(put_message(w, pub, i, &m) - plain.p);
            records++;
            i++;
        }
        rc = add_sub_batch(e, codecs, &plain, first, records);
    }
done:
    ps_buf_free(&plain);
    return rc;
}

/* Bytes of rows [from, to) of a column (0 when absent). */
static size_t strs_bytes(const ps_strs *s, size_t from, size_t to)
{
    const uint8_t *p;
    size_t len, total = 0;
    if (s->layout == PS_STRS_ABSENT || from >= to)
        return 0;
    if (s->layout == PS_STRS_OFFSETS32) {
        const int32_t *o = s->offsets;
        return (size_t)(o[s->offset + to] - o[s->offset + from]);
    }
    if (s->layout == PS_STRS_OFFSETS64) {
        const int64_t *o = s->offsets;
        return (size_t)(o[s->offset + to] - o[s->offset + from]);
    }
    for (size_t i = from; i < to; i++)
        if (strs_get(s, i, &p, &len))
            total += len;
    return total;
}

static size_t map_estimate(const ps_map *m, size_t n)
{
    if (!m->offsets || !n)
        return 0;
    size_t a = (size_t)m->offsets[m->offset], b = (size_t)m->offsets[m->offset + n];
    return n * 12 + (b - a) * 10 + strs_bytes(&m->keys, a, b) + strs_bytes(&m->values, a, b);
}

/* More than all frames take, from the bytes of every string and an
 * allowance for each header: reserved at once, it spares the copies and
 * small page faults of growing by doubling (pages never touched cost
 * nothing, and the rest is given back at the end). */
static size_t estimate(const ps_publish *pub)
{
    size_t n = pub->count;
    size_t total = strs_bytes(&pub->body, 0, n) + strs_bytes(&pub->filter, 0, n) + n * 32;
    if (pub->properties.present) {
        total += n * (12 + PS_PROP_FIELDS * 9);
        for (int f = 0; f < PS_PROP_FIELDS; f++)
            total += strs_bytes(&pub->properties.text[f], 0, n);
    }
    total += map_estimate(&pub->application_properties, n);
    total += map_estimate(&pub->message_annotations, n);
    /* incompressible sub-batches grow a little */
    return total + total / 64 + 4096;
}

int ps_encode_publish(const ps_publish *pub, ps_codecs *codecs, ps_buf *frames,
                      ps_buf *counts, ps_error *err)
{
    encoder e = {.pub = pub, .out = frames, .counts = counts,
                 .next_id = pub->first_id, .err = err};
    int rc;
    if (ps_buf_reserve(frames, estimate(pub)))
        return ps_fail(err, PS_E_NOMEM, 0, "out of memory");
    rc = pub->codec < 0 ? encode_messages(&e) : encode_sub_batches(&e, codecs);
    if (rc != PS_OK)
        return rc;
    if (e.entries)
        close_frame(&e);
    /* the frames are kept until confirmed: return what they do not use
     * (large buffers are mapped, so this is an mremap, not a copy) */
    if (frames->cap - frames->len > 65536) {
        uint8_t *p = realloc(frames->p, frames->len + 1);
        if (p) {
            frames->p = p;
            frames->cap = frames->len + 1;
        }
    }
    return PS_OK;
}

/* --- super stream routing ----------------------------------------------------- */

static inline uint32_t rotl32(uint32_t x, int r)
{
    return x << r | x >> (32 - r);
}

static uint32_t murmur3_32(const uint8_t *p, size_t n, uint32_t seed)
{
    const uint32_t c1 = 0xcc9e2d51u, c2 = 0x1b873593u;
    uint32_t h = seed, k;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        memcpy(&k, p + i, 4);       /* little-endian blocks, as the host's */
        k = rotl32(k * c1, 15) * c2;
        h = rotl32(h ^ k, 13) * 5 + 0xe6546b64u;
    }
    k = 0;
    switch (n & 3) {
    case 3: k ^= (uint32_t)p[i + 2] << 16; /* fall through */
    case 2: k ^= (uint32_t)p[i + 1] << 8;  /* fall through */
    case 1: k ^= p[i];
        h ^= rotl32(k * c1, 15) * c2;
    }
    h ^= (uint32_t)n;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    return h ^ h >> 16;
}

void ps_murmur3_32(const ps_strs *keys, size_t n, uint32_t seed, uint32_t *out)
{
    const uint8_t *p;
    size_t len;
    for (size_t i = 0; i < n; i++)
        out[i] = strs_get(keys, i, &p, &len) ? murmur3_32(p, len, seed)
                                             : murmur3_32(NULL, 0, seed);
}
