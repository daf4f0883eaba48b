/* libFuzzer harness of the producer's encoder (ps_encode_publish).
 *
 * The input describes a batch of messages: a header of options (codec or
 * one entry per message, AMQP or raw, filter values, which optional columns,
 * the body's Arrow layout, max_frame, publishing ids), then per message its
 * fields, each a length byte (255: null) and that many bytes.  The encoder
 * must either fail with a reason naming a message, or write Publish frames
 * that a reader takes back to the same messages: every frame within
 * max_frame and well formed, publishing ids counting up from the first, the
 * counts adding up, every sub-batch decompressing to its announced length,
 * every AMQP message scanning, with the body, map entries and property
 * strings as given. */
#include <stdio.h>
#include <stdlib.h>

#include "amqp.h"
#include "codec.h"
#include "encode.h"

#define MAX_ROWS 48
#define MAX_ENTRIES 4       /* map entries per message */
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "check failed: %s (line %d)\n", #c, __LINE__); abort(); } } while (0)

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static uint8_t byte(reader *r)
{
    return r->p < r->end ? *r->p++ : 0;
}

/* A column of byte strings being built: offsets32 (or offsets64, or views
 * into data) with a validity bitmap. */
typedef struct col {
    int32_t off[MAX_ROWS * MAX_ENTRIES + 1];
    int64_t off64[MAX_ROWS * MAX_ENTRIES + 1];
    uint8_t views[16 * MAX_ROWS * MAX_ENTRIES];
    uint8_t valid[(MAX_ROWS * MAX_ENTRIES + 7) / 8];
    const uint8_t *buffers[1];
    ps_buf data;
    size_t n;
} col;

/* Append one field of the input to c: 1 if it is valid, 0 if null. */
static int field(reader *r, col *c)
{
    uint8_t len = byte(r);
    int ok = len != 255;
    size_t have = (size_t)(r->end - r->p);
    size_t n = ok ? (len < have ? len : have) : 0;
    if (ps_buf_put(&c->data, r->p, n))
        abort();
    r->p += n;
    if (ok)
        c->valid[c->n / 8] |= (uint8_t)(1 << (c->n % 8));
    c->n++;
    c->off[c->n] = (int32_t)c->data.len;
    c->off64[c->n] = (int64_t)c->data.len;
    return ok;
}

static void as_strs(col *c, ps_strs *s, int layout)
{
    s->layout = layout;
    s->binary = 0;
    s->validity = c->valid;
    s->offset = 0;
    s->data = c->data.p ? c->data.p : (const uint8_t *)"";
    c->buffers[0] = s->data;
    s->buffers = c->buffers;
    if (layout == PS_STRS_OFFSETS32) {
        s->offsets = c->off;
    } else if (layout == PS_STRS_OFFSETS64) {
        s->offsets = c->off64;
    } else {
        for (size_t i = 0; i < c->n; i++) {
            uint8_t *v = c->views + 16 * i;
            int32_t len = c->off[i + 1] - c->off[i], zero = 0;
            memset(v, 0, 16);
            memcpy(v, &len, 4);
            if (len <= 12) {
                memcpy(v + 4, s->data + c->off[i], (size_t)len);
            } else {
                memcpy(v + 4, s->data + c->off[i], 4);
                memcpy(v + 8, &zero, 4);
                memcpy(v + 12, &c->off[i], 4);
            }
        }
        s->offsets = c->views;
    }
}

/* Row i of c as given: 1 and its bytes, or 0 if null. */
static int given(const col *c, size_t i, const uint8_t **p, size_t *n)
{
    if (!(c->valid[i / 8] >> (i % 8) & 1))
        return 0;
    *p = c->data.p + c->off[i];
    *n = (size_t)(c->off[i + 1] - c->off[i]);
    return 1;
}

static void same_bytes(const ps_value *v, const col *c, size_t i)
{
    const uint8_t *want, *got;
    size_t n;
    uint32_t len;
    if (!given(c, i, &want, &n)) {
        CHECK(v->code == 0x40);
        return;
    }
    CHECK(ps_amqp_bytes(v, &got, &len) == 0 && len == n && memcmp(got, want, n) == 0);
}

typedef struct batch {
    ps_publish pub;
    col body, filter, app_k, app_v, ann_k, ann_v, text[PS_PROP_FIELDS];
    int32_t app_off[MAX_ROWS + 1], ann_off[MAX_ROWS + 1];
    int64_t num[PS_PROP_FIELDS][MAX_ROWS];
    uint8_t num_valid[PS_PROP_FIELDS][(MAX_ROWS + 7) / 8];
    uint8_t app_valid[(MAX_ROWS + 7) / 8], ann_valid[(MAX_ROWS + 7) / 8];
    uint8_t props_valid[(MAX_ROWS + 7) / 8];
} batch;

static int is_num(int f)
{
    return f == 8 || f == 9 || f == 11;
}

/* The map of row i: its entries given against the map value read back. */
static void same_map(const ps_value *m, const col *k, const col *v, const int32_t *off,
                     size_t i)
{
    const uint8_t *it = NULL;
    uint32_t n = 0;
    ps_value key, value;
    CHECK(m->code == 0xc1 || m->code == 0xd1);
    CHECK(m->count == 2 * (uint32_t)(off[i + 1] - off[i]));
    for (int32_t j = off[i]; j < off[i + 1]; j++) {
        CHECK(ps_amqp_next_item(m, &it, &n, &key) == 0);
        CHECK(ps_amqp_next_item(m, &it, &n, &value) == 0);
        same_bytes(&key, k, (size_t)j);
        same_bytes(&value, v, (size_t)j);
    }
}

static void check_message(const batch *b, size_t i, const uint8_t *msg, size_t n)
{
    const ps_publish *pub = &b->pub;
    const uint8_t *body;
    size_t blen;
    CHECK(given(&b->body, i, &body, &blen));
    if (!pub->amqp) {
        CHECK(n == blen && memcmp(msg, body, n) == 0);
        return;
    }
    ps_amqp_msg m;
    ps_error err;
    CHECK(ps_amqp_scan(msg, n, &m, &err) == PS_OK);
    CHECK(m.data_sections == 1 && m.data_len == blen && memcmp(m.data, body, blen) == 0);
    int app = pub->application_properties.offsets && (b->app_valid[i / 8] >> (i % 8) & 1);
    int ann = pub->message_annotations.offsets && (b->ann_valid[i / 8] >> (i % 8) & 1);
    CHECK(!m.application_properties.start == !app);
    CHECK(!m.message_annotations.start == !ann);
    if (app)
        same_map(&m.application_properties, &b->app_k, &b->app_v, b->app_off, i);
    if (ann)
        same_map(&m.message_annotations, &b->ann_k, &b->ann_v, b->ann_off, i);
    int props = pub->properties.present && (b->props_valid[i / 8] >> (i % 8) & 1);
    CHECK(!m.properties.start == !props);
    if (!props)
        return;
    const uint8_t *it = NULL;
    uint32_t k = 0;
    ps_value v;
    for (int f = 0; f < PS_PROP_FIELDS; f++) {
        if (k < m.properties.count)
            CHECK(ps_amqp_next_item(&m.properties, &it, &k, &v) == 0);
        else
            v.code = 0x40, v.desc = NULL;       /* a list cut after its last field */
        if (!is_num(f)) {
            same_bytes(&v, &b->text[f], i);
            continue;
        }
        int64_t x;
        if (!(b->num_valid[f][i / 8] >> (i % 8) & 1)) {
            CHECK(v.code == 0x40);
        } else if (f == 11) {
            CHECK(ps_amqp_int(&v, &x) == 0 && x == b->num[f][i]);
        } else {    /* microseconds in, milliseconds out, rounded down */
            int64_t us = b->num[f][i];
            CHECK(ps_amqp_timestamp(&v, &x) == 0 && x == us / 1000 - (us % 1000 < 0));
        }
    }
}

static uint32_t be32(const uint8_t *p)
{
    return ps_be32(p);
}

/* Walk the frames: every entry back to its messages. */
static void check_frames(const batch *b, const ps_buf *frames, const ps_buf *counts,
                         ps_codecs *codecs)
{
    const ps_publish *pub = &b->pub;
    const uint8_t *p = frames->p, *end = frames->p + frames->len;
    uint64_t id = pub->first_id;
    size_t row = 0, entry = 0;
    int v2 = pub->filter.layout != PS_STRS_ABSENT;
    while (p < end) {
        CHECK(end - p >= 13);
        uint32_t size = be32(p);
        CHECK(size + 4 <= pub->max_frame && size <= (size_t)(end - p) - 4);
        const uint8_t *q = p + 4, *fend = p + 4 + size;
        CHECK(ps_be16(q) == 0x0002 && ps_be16(q + 2) == (v2 ? 2 : 1) &&
              q[4] == pub->publisher_id);
        uint32_t entries = be32(q + 5);
        CHECK(entries > 0);
        q += 9;
        for (uint32_t e = 0; e < entries; e++) {
            CHECK(fend - q >= 12);
            CHECK(ps_be64(q) == id++);
            q += 8;
            int64_t count;
            CHECK(entry < counts->len / 8);
            memcpy(&count, counts->p + 8 * entry++, 8);
            if (v2) {
                const uint8_t *f;
                size_t flen;
                int16_t len = (int16_t)ps_be16(q);
                q += 2;
                if (given(&b->filter, row, &f, &flen)) {
                    CHECK(len == (int16_t)flen && memcmp(q, f, flen) == 0);
                    q += flen;
                } else {
                    CHECK(len == -1);
                }
            }
            if (pub->codec < 0) {
                uint32_t n = be32(q);
                CHECK(count == 1 && n <= (size_t)(fend - q) - 4);
                check_message(b, row++, q + 4, n);
                q += 4 + n;
                continue;
            }
            CHECK(fend - q >= 11 && q[0] == (0x80 | pub->codec << 4));
            uint16_t records = ps_be16(q + 1);
            uint32_t plain = be32(q + 3), len = be32(q + 7);
            CHECK(records == count && records > 0 && records <= pub->sub_batch);
            CHECK(len <= (size_t)(fend - q) - 11);
            const uint8_t *data = q + 11;
            uint8_t *copy = NULL;
            if (pub->codec != PS_CODEC_NONE) {
                size_t got;
                ps_error err;
                copy = malloc(plain ? plain : 1);
                CHECK(ps_decompress(codecs, pub->codec, data, len, copy, plain, &got, 0,
                                    &err) == PS_OK && got == plain);
                data = copy;
            } else {
                CHECK(plain == len);
            }
            const uint8_t *r = data, *rend = data + plain;
            for (uint16_t k = 0; k < records; k++) {
                CHECK(rend - r >= 4);
                uint32_t n = be32(r);
                CHECK(n <= (size_t)(rend - r) - 4);
                check_message(b, row++, r + 4, n);
                r += 4 + n;
            }
            CHECK(r == rend);
            free(copy);
            q += 11 + len;
        }
        CHECK(q == fend);
        p = fend;
    }
    CHECK(row == pub->count && entry == counts->len / 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, data + size};
    static const int layouts[3] = {PS_STRS_OFFSETS32, PS_STRS_OFFSETS64, PS_STRS_VIEWS};
    uint8_t opt = byte(&r), opt2 = byte(&r);
    batch *b = calloc(1, sizeof *b);
    ps_publish *pub = &b->pub;
    pub->publisher_id = byte(&r);
    pub->first_id = (uint64_t)byte(&r) << 56 | byte(&r);
    pub->count = byte(&r) % (MAX_ROWS + 1);
    pub->amqp = !(opt & 1);
    pub->codec = (opt >> 1) % 6 - 1;        /* -1: an entry per message */
    pub->sub_batch = 1 + opt2 % 16;
    /* frames from tight to roomy: a message too big for one must fail */
    pub->max_frame = 64 + (uint64_t)byte(&r) * 16;
    /* Publish v2 has no sub-batches: the Python layer refuses the two together */
    int filter = (opt & 0x10) && pub->codec < 0, props = pub->amqp && (opt & 0x20);
    int app = pub->amqp && (opt & 0x40), ann = pub->amqp && (opt & 0x80);
    int body_layout = layouts[opt2 / 16 % 3];
    for (size_t i = 0; i < pub->count; i++) {
        field(&r, &b->body);
        if (filter)
            field(&r, &b->filter);
        uint8_t which = byte(&r);
        b->app_off[i + 1] = b->app_off[i];
        b->ann_off[i + 1] = b->ann_off[i];
        if (app && (which & 1)) {
            b->app_valid[i / 8] |= (uint8_t)(1 << (i % 8));
            for (int e = 0; e < (which >> 1) % MAX_ENTRIES; e++, b->app_off[i + 1]++)
                field(&r, &b->app_k), field(&r, &b->app_v);
        }
        if (ann && (which & 8)) {
            b->ann_valid[i / 8] |= (uint8_t)(1 << (i % 8));
            for (int e = 0; e < (which >> 4) % MAX_ENTRIES; e++, b->ann_off[i + 1]++)
                field(&r, &b->ann_k), field(&r, &b->ann_v);
        }
        if (props && !(which & 0x80)) {
            b->props_valid[i / 8] |= (uint8_t)(1 << (i % 8));
            uint16_t present = (uint16_t)(byte(&r) << 8 | byte(&r));
            for (int f = 0; f < PS_PROP_FIELDS; f++) {
                int on = present >> f & 1;
                if (!is_num(f)) {
                    if (on) {
                        field(&r, &b->text[f]);
                    } else {
                        b->text[f].n++;
                        b->text[f].off[b->text[f].n] = (int32_t)b->text[f].data.len;
                    }
                } else if (on) {
                    uint64_t u = 0;
                    for (int k = 0; k < 8; k++)
                        u = u << 8 | byte(&r);
                    int64_t v = (int64_t)u;
                    b->num[f][i] = f == 11 ? v >> (byte(&r) % 64) : v;
                    b->num_valid[f][i / 8] |= (uint8_t)(1 << (i % 8));
                }
            }
        } else {
            for (int f = 0; f < PS_PROP_FIELDS; f++) {
                b->text[f].n++;
                b->text[f].off[b->text[f].n] = (int32_t)b->text[f].data.len;
            }
        }
    }
    as_strs(&b->body, &pub->body, body_layout);
    if (filter)
        as_strs(&b->filter, &pub->filter, PS_STRS_OFFSETS32);
    if (app) {
        pub->application_properties.offsets = b->app_off;
        pub->application_properties.validity = b->app_valid;
        as_strs(&b->app_k, &pub->application_properties.keys, PS_STRS_OFFSETS32);
        as_strs(&b->app_v, &pub->application_properties.values, PS_STRS_OFFSETS32);
    }
    if (ann) {
        pub->message_annotations.offsets = b->ann_off;
        pub->message_annotations.validity = b->ann_valid;
        as_strs(&b->ann_k, &pub->message_annotations.keys, PS_STRS_OFFSETS32);
        as_strs(&b->ann_v, &pub->message_annotations.values, PS_STRS_OFFSETS32);
    }
    if (props) {
        pub->properties.present = 1;
        pub->properties.validity = b->props_valid;
        for (int f = 0; f < PS_PROP_FIELDS; f++) {
            if (!is_num(f)) {
                as_strs(&b->text[f], &pub->properties.text[f], PS_STRS_OFFSETS32);
            } else {
                pub->properties.num[f] = (ps_ints){b->num[f], b->num_valid[f], 0,
                                                   1, f == 11 ? 1 : 1000};
            }
        }
    }
    ps_codecs *codecs = ps_codecs_new();
    ps_buf frames = {0}, counts = {0};
    ps_error err = {0};
    int rc = ps_encode_publish(pub, codecs, &frames, &counts, &err);
    if (rc == PS_OK) {
        check_frames(b, &frames, &counts, codecs);
    } else {
        CHECK(err.what != NULL && rc != PS_E_NOMEM);
        CHECK(err.position < pub->count || pub->count == 0);
    }
    ps_buf_free(&frames);
    ps_buf_free(&counts);
    ps_codecs_free(codecs);
    ps_buf_free(&b->body.data);
    ps_buf_free(&b->filter.data);
    ps_buf_free(&b->app_k.data);
    ps_buf_free(&b->app_v.data);
    ps_buf_free(&b->ann_k.data);
    ps_buf_free(&b->ann_v.data);
    for (int f = 0; f < PS_PROP_FIELDS; f++)
        ps_buf_free(&b->text[f].data);
    free(b);
    return 0;
}
