#include <stdio.h>

#include "batch.h"

/* --- columns --------------------------------------------------------------- */

static int bit_put(ps_buf *bits, size_t i, int v)
{
    size_t need = i / 8 + 1;
    if (need > bits->len) {
        if (ps_buf_reserve(bits, need - bits->len))
            return PS_E_NOMEM;
        memset(bits->p + bits->len, 0, need - bits->len);
        bits->len = need;
    }
    if (v)
        bits->p[i / 8] |= (uint8_t)(1u << (i % 8));
    else
        bits->p[i / 8] &= (uint8_t)~(1u << (i % 8));
    return 0;
}

static int col_init(ps_col *c, int kind, int width)
{
    memset(c, 0, sizeof *c);
    c->kind = (uint8_t)kind;
    c->width = (uint8_t)width;
    if (kind == PS_KIND_BYTES || kind == PS_KIND_LIST) {
        int32_t zero = 0;
        return ps_buf_put(&c->values, &zero, 4);
    }
    return 0;
}

/* Empty again for the next batch, keeping its allocations (a buffer that
 * was handed over is NULL, and allocated anew). */
static int col_clear(ps_col *c)
{
    c->length = c->nulls = 0;
    c->validity.len = c->values.len = c->data.len = 0;
    if (c->kind == PS_KIND_BYTES || c->kind == PS_KIND_LIST) {
        int32_t zero = 0;
        return ps_buf_put(&c->values, &zero, 4);
    }
    return 0;
}

static void col_free(ps_col *c)
{
    ps_buf_free(&c->validity);
    ps_buf_free(&c->values);
    ps_buf_free(&c->data);
}

/* Close the current row: validity, and the end offset for bytes / list kinds
 * (`end` = data length or child length). */
static int col_close(ps_col *c, int valid, size_t end)
{
    if (bit_put(&c->validity, c->length, valid))
        return PS_E_NOMEM;
    if (c->kind == PS_KIND_BYTES || c->kind == PS_KIND_LIST) {
        if (end > INT32_MAX)
            return PS_E_OVERFLOW;
        int32_t o = (int32_t)end;
        if (ps_buf_put(&c->values, &o, 4))
            return PS_E_NOMEM;
    }
    c->length++;
    c->nulls += !valid;
    return 0;
}

static int col_null(ps_col *c)
{
    if (c->kind == PS_KIND_FIXED) {
        if (ps_buf_reserve(&c->values, c->width))
            return PS_E_NOMEM;
        memset(c->values.p + c->values.len, 0, c->width);
        c->values.len += c->width;
    } else if (c->kind == PS_KIND_BOOL && bit_put(&c->values, c->length, 0)) {
        return PS_E_NOMEM;
    }
    size_t end = 0;
    if (c->kind == PS_KIND_BYTES)
        end = c->data.len;
    else if (c->kind == PS_KIND_LIST) {
        int32_t last;
        memcpy(&last, c->values.p + 4 * c->length, 4);
        end = (size_t)last;
    }
    return col_close(c, 0, end);
}

static int col_fixed(ps_col *c, int64_t v)
{
    int32_t v32 = (int32_t)v;
    if (ps_buf_put(&c->values, c->width == 8 ? (void *)&v : (void *)&v32, c->width))
        return PS_E_NOMEM;
    return col_close(c, 1, 0);
}

static int col_bool(ps_col *c, int v)
{
    if (bit_put(&c->values, c->length, v))
        return PS_E_NOMEM;
    return col_close(c, 1, 0);
}

static int col_bytes(ps_col *c, const uint8_t *p, size_t n)
{
    if (ps_buf_put(&c->data, p, n))
        return PS_E_NOMEM;
    return col_close(c, 1, c->data.len);
}

/* Saved lengths, to take back a half-appended row. */
typedef struct { size_t length, nulls, values, data; } col_mark;

static col_mark col_mark_of(const ps_col *c)
{
    return (col_mark){c->length, c->nulls, c->values.len, c->data.len};
}

static void col_rewind(ps_col *c, col_mark m)
{
    c->length = m.length;
    c->nulls = m.nulls;
    c->values.len = m.values;
    c->data.len = m.data;
}

/* --- batch ----------------------------------------------------------------- */

/* No row and no region in use: what init and reset share. */
static void no_rows(ps_batch *b)
{
    b->rows = 0;
    b->offset.len = b->timestamp.len = b->views.len = 0;
    b->input_region = b->concat_region = -1;
}

static int cols_init(ps_batch *b)
{
    int rc = 0;
    no_rows(b);
    rc |= col_init(&b->body, PS_KIND_BYTES, 0);
    rc |= col_init(&b->error, PS_KIND_BYTES, 0);
    rc |= col_init(&b->properties, PS_KIND_STRUCT, 0);
    for (int i = 0; i < PS_PROP_FIELDS; i++) {
        int fixed = i == 8 || i == 9 || i == 11;  /* times, group-sequence */
        rc |= col_init(&b->prop[i], fixed ? PS_KIND_FIXED : PS_KIND_BYTES, 8);
    }
    rc |= col_init(&b->header, PS_KIND_STRUCT, 0);
    rc |= col_init(&b->hdr[0], PS_KIND_BOOL, 0);
    rc |= col_init(&b->hdr[1], PS_KIND_FIXED, 4);
    rc |= col_init(&b->hdr[2], PS_KIND_FIXED, 8);
    rc |= col_init(&b->hdr[3], PS_KIND_BOOL, 0);
    rc |= col_init(&b->hdr[4], PS_KIND_FIXED, 8);
    rc |= col_init(&b->app, PS_KIND_LIST, 0);
    rc |= col_init(&b->app_keys, PS_KIND_BYTES, 0);
    rc |= col_init(&b->app_values, PS_KIND_BYTES, 0);
    rc |= col_init(&b->ann, PS_KIND_LIST, 0);
    rc |= col_init(&b->ann_keys, PS_KIND_BYTES, 0);
    rc |= col_init(&b->ann_values, PS_KIND_BYTES, 0);
    rc |= col_init(&b->foot, PS_KIND_LIST, 0);
    rc |= col_init(&b->foot_keys, PS_KIND_BYTES, 0);
    rc |= col_init(&b->foot_values, PS_KIND_BYTES, 0);
    b->nregions = 0;
    return rc ? PS_E_NOMEM : PS_OK;
}

#define EACH_COL(b, X) do { \
    X(&(b)->body); X(&(b)->error); X(&(b)->properties); X(&(b)->header); \
    for (int i_ = 0; i_ < PS_PROP_FIELDS; i_++) X(&(b)->prop[i_]); \
    for (int i_ = 0; i_ < PS_HEADER_FIELDS; i_++) X(&(b)->hdr[i_]); \
    X(&(b)->app); X(&(b)->app_keys); X(&(b)->app_values); \
    X(&(b)->ann); X(&(b)->ann_keys); X(&(b)->ann_values); \
    X(&(b)->foot); X(&(b)->foot_keys); X(&(b)->foot_values); } while (0)

int ps_batch_init(ps_batch *b, const ps_options *opt)
{
    memset(b, 0, sizeof *b);
    b->opt = *opt;
    if (!(b->codecs = ps_codecs_new()))
        return PS_E_NOMEM;
    return cols_init(b);
}

static void free_regions(ps_batch *b)
{
    for (size_t i = 0; i < b->nregions; i++)
        ps_buf_free(&b->regions[i].own);
    b->nregions = 0;
}

void ps_batch_free(ps_batch *b)
{
    ps_buf_free(&b->offset);
    ps_buf_free(&b->timestamp);
    ps_buf_free(&b->views);
    EACH_COL(b, col_free);
    free_regions(b);
    free(b->regions);
    ps_buf_free(&b->scratch);
    ps_codecs_free(b->codecs);
    memset(b, 0, sizeof *b);
}

int ps_batch_reset(ps_batch *b)
{
    int rc = 0;
    free_regions(b);
    no_rows(b);
#define CLEAR(c) (rc |= col_clear(c))
    EACH_COL(b, CLEAR);
#undef CLEAR
    return rc ? PS_E_NOMEM : PS_OK;
}

int ps_batch_reserve(ps_batch *b, size_t rows, size_t bytes)
{
    if (ps_buf_reserve(&b->offset, rows * 8) ||
        ps_buf_reserve(&b->timestamp, rows * 8))
        return PS_E_NOMEM;
    if (b->opt.body_binary)
        return ps_buf_reserve(&b->body.values, rows * 4) ||
               ps_buf_reserve(&b->body.data, bytes) ? PS_E_NOMEM : 0;
    return ps_buf_reserve(&b->views, rows * 16) ? PS_E_NOMEM : 0;
}

static int new_region(ps_batch *b)
{
    if (b->nregions == b->cap_regions) {
        size_t cap = b->cap_regions ? 2 * b->cap_regions : 8;
        ps_region *r = realloc(b->regions, cap * sizeof *r);
        if (!r)
            return -1;
        b->regions = r;
        b->cap_regions = cap;
    }
    memset(&b->regions[b->nregions], 0, sizeof(ps_region));
    return (int)b->nregions++;
}

int ps_batch_input_region(ps_batch *b, const uint8_t *p, size_t n)
{
    if (b->input_region >= 0) {
        ps_region *r = &b->regions[b->input_region];
        if (p >= r->base && (size_t)(p - r->base) + n <= INT32_MAX) {
            if ((size_t)(p - r->base) + n > r->len)
                r->len = (size_t)(p - r->base) + n;
            return b->input_region;
        }
    }
    int i = new_region(b);
    if (i >= 0) {
        b->regions[i].base = p;
        b->regions[i].len = n;
        b->input_region = i;
    }
    return i;
}

int ps_batch_owned_region(ps_batch *b, size_t n)
{
    int i = new_region(b);
    if (i < 0 || ps_buf_reserve(&b->regions[i].own, n ? n : 1))
        return -1;
    b->regions[i].base = b->regions[i].own.p;
    b->regions[i].len = b->regions[i].own.len = n;
    return i;
}

/* --- AMQP columns ------------------------------------------------------------ */

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

/* Text of an AMQP value into a string column (null stays null). */
static int text_field(ps_col *c, const ps_value *v, ps_render *r)
{
    if (!v || v->code == 0x40)
        return col_null(c);
    int rc = ps_amqp_render(v, &c->data, r);
    if (rc)
        return rc == PS_RENDER_NOMEM ? PS_E_NOMEM : PS_E_AMQP;
    return col_close(c, 1, c->data.len);
}

static int fill_properties(ps_batch *b, const ps_value *list, ps_render *r)
{
    const uint8_t *it = NULL;
    uint32_t i = 0;
    ps_value items[PS_PROP_FIELDS];
    int have = 0;
    if (!list->start) {
        for (int f = 0; f < PS_PROP_FIELDS; f++)
            TRY(col_null(&b->prop[f]));
        return col_close(&b->properties, 0, 0);
    }
    while (i < list->count && have < PS_PROP_FIELDS) {
        if (ps_amqp_next_item(list, &it, &i, &items[have]))
            return PS_E_AMQP;
        have++;
    }
    for (int f = 0; f < PS_PROP_FIELDS; f++) {
        const ps_value *v = f < have && items[f].code != 0x40 ? &items[f] : NULL;
        ps_col *c = &b->prop[f];
        int64_t x;
        const uint8_t *p;
        uint32_t n;
        switch (f) {
        case 1:         /* user-id: binary */
            if (!v)
                TRY(col_null(c));
            else if (ps_amqp_bytes(v, &p, &n))
                return PS_E_AMQP;
            else
                TRY(col_bytes(c, p, n));
            break;
        case 8:         /* absolute-expiry-time, creation-time: ms -> us */
        case 9:
            if (!v)
                TRY(col_null(c));
            else if (ps_amqp_timestamp(v, &x) || x > INT64_MAX / 1000 ||
                     x < INT64_MIN / 1000)
                return PS_E_AMQP;
            else
                TRY(col_fixed(c, x * 1000));
            break;
        case 11:        /* group-sequence */
            if (!v)
                TRY(col_null(c));
            else if (ps_amqp_int(v, &x))
                return PS_E_AMQP;
            else
                TRY(col_fixed(c, x));
            break;
        default:
            TRY(text_field(c, v, r));
        }
    }
    return col_close(&b->properties, 1, 0);
}

static int fill_header(ps_batch *b, const ps_value *list)
{
    /* AMQP defaults for absent or null fields; ttl has none */
    int durable = 0, first = 0, has_ttl = 0;
    int64_t priority = 4, ttl = 0, count = 0;
    if (list->start) {
        const uint8_t *it = NULL;
        uint32_t i = 0;
        ps_value v;
        while (i < list->count && i < PS_HEADER_FIELDS) {
            uint32_t f = i;
            if (ps_amqp_next_item(list, &it, &i, &v))
                return PS_E_AMQP;
            if (v.code == 0x40)
                continue;
            int bad = 0;
            switch (f) {
            case 0: bad = ps_amqp_bool(&v, &durable); break;
            case 1: bad = ps_amqp_int(&v, &priority) || priority > INT32_MAX ||
                          priority < INT32_MIN; break;
            case 2: bad = ps_amqp_int(&v, &ttl); has_ttl = 1; break;
            case 3: bad = ps_amqp_bool(&v, &first); break;
            case 4: bad = ps_amqp_int(&v, &count); break;
            }
            if (bad)
                return PS_E_AMQP;
        }
    }
    if (!list->start) {
        for (int f = 0; f < PS_HEADER_FIELDS; f++)
            TRY(col_null(&b->hdr[f]));
        return col_close(&b->header, 0, 0);
    }
    TRY(col_bool(&b->hdr[0], durable));
    TRY(col_fixed(&b->hdr[1], priority));
    TRY(has_ttl ? col_fixed(&b->hdr[2], ttl) : col_null(&b->hdr[2]));
    TRY(col_bool(&b->hdr[3], first));
    TRY(col_fixed(&b->hdr[4], count));
    return col_close(&b->header, 1, 0);
}

static int fill_map(ps_col *map, ps_col *keys, ps_col *values, const ps_value *m,
                    ps_render *r)
{
    if (!m->start)
        return col_null(map);
    if (m->count % 2)
        return PS_E_AMQP;
    const uint8_t *it = NULL;
    uint32_t i = 0;
    ps_value k, v;
    while (i < m->count) {
        if (ps_amqp_next_item(m, &it, &i, &k) || ps_amqp_next_item(m, &it, &i, &v))
            return PS_E_AMQP;
        if (k.code == 0x40)
            return PS_E_AMQP;   /* Arrow map keys cannot be null */
        TRY(text_field(keys, &k, r));
        TRY(text_field(values, &v, r));
    }
    return col_close(map, 1, keys->length);
}

/* Optional columns of one message; on failure the caller rewinds them. */
static int fill_columns(ps_batch *b, const ps_amqp_msg *m, ps_render *r)
{
    unsigned cols = b->opt.columns;
    if (cols & PS_COL_PROPERTIES)
        TRY(fill_properties(b, &m->properties, r));
    if (cols & PS_COL_APPLICATION_PROPERTIES)
        TRY(fill_map(&b->app, &b->app_keys, &b->app_values, &m->application_properties, r));
    if (cols & PS_COL_MESSAGE_ANNOTATIONS)
        TRY(fill_map(&b->ann, &b->ann_keys, &b->ann_values, &m->message_annotations, r));
    if (cols & PS_COL_HEADER)
        TRY(fill_header(b, &m->header));
    if (cols & PS_COL_FOOTER)
        TRY(fill_map(&b->foot, &b->foot_keys, &b->foot_values, &m->footer, r));
    return 0;
}

#define OPTIONAL_COLS(b, X) do { \
    X(&(b)->properties); X(&(b)->header); \
    for (int i_ = 0; i_ < PS_PROP_FIELDS; i_++) X(&(b)->prop[i_]); \
    for (int i_ = 0; i_ < PS_HEADER_FIELDS; i_++) X(&(b)->hdr[i_]); \
    X(&(b)->app); X(&(b)->app_keys); X(&(b)->app_values); \
    X(&(b)->ann); X(&(b)->ann_keys); X(&(b)->ann_values); \
    X(&(b)->foot); X(&(b)->foot_keys); X(&(b)->foot_values); } while (0)

typedef struct { col_mark m[2 + PS_PROP_FIELDS + PS_HEADER_FIELDS + 9]; } marks;

static void mark_all(ps_batch *b, marks *s)
{
    col_mark *m = s->m;
#define MARK(c) (*m++ = col_mark_of(c))
    OPTIONAL_COLS(b, MARK);
#undef MARK
}

static void rewind_all(ps_batch *b, const marks *s)
{
    const col_mark *m = s->m;
#define REWIND(c) col_rewind((c), *m++)
    OPTIONAL_COLS(b, REWIND);
#undef REWIND
}

static int null_columns(ps_batch *b)
{
    ps_amqp_msg none;
    ps_render r = {0, 0, 0};    /* nothing to render */
    memset(&none, 0, sizeof none);
    return fill_columns(b, &none, &r);
}

/* --- records ------------------------------------------------------------------ */

/* The body of the row: bytes [p, p+n) of region `region`. */
static int add_body(ps_batch *b, const uint8_t *p, uint32_t n, int region)
{
    if (b->opt.body_binary) {   /* never null: no validity bits */
        ps_col *c = &b->body;
        if (ps_buf_reserve(&c->values, 4) || ps_buf_reserve(&c->data, n))
            return PS_E_NOMEM;
        if (c->data.len + n > INT32_MAX)
            return PS_E_OVERFLOW;
        memcpy(c->data.p + c->data.len, p, n);
        c->data.len += n;
        int32_t end = (int32_t)c->data.len;
        memcpy(c->values.p + c->values.len, &end, 4);
        c->values.len += 4;
        c->length++;
        return 0;
    }
    if (ps_buf_reserve(&b->views, 16))
        return PS_E_NOMEM;
    const ps_region *r = &b->regions[region];
    ps_put_view(b->views.p + b->views.len, p, n, region, (int32_t)(p - r->base));
    b->views.len += 16;
    return 0;
}

/* Body made of several data sections (the payloads) or sequences (the
 * lists' encodings): concatenated into an owned region. */
static int add_concat_body(ps_batch *b, const uint8_t *msg, uint32_t n,
                           int code, uint64_t total)
{
    if (b->concat_region < 0 && (b->concat_region = ps_batch_owned_region(b, 0)) < 0)
        return PS_E_NOMEM;
    ps_region *r = &b->regions[b->concat_region];
    size_t at = r->own.len;
    if (at + total > INT32_MAX)
        return PS_E_OVERFLOW;
    if (ps_buf_reserve(&r->own, total))
        return PS_E_NOMEM;
    ps_amqp_concat(msg, n, code, r->own.p + at);
    r->own.len += total;
    r->base = r->own.p;
    r->len = r->own.len;
    return add_body(b, r->own.p + at, (uint32_t)total, b->concat_region);
}

static int add_row(ps_batch *b, uint64_t offset, int64_t ts)
{
    if (ps_buf_put(&b->offset, &offset, 8) || ps_buf_put(&b->timestamp, &ts, 8))
        return PS_E_NOMEM;
    b->rows++;
    return 0;
}

static int add_error_text(ps_batch *b, const ps_error *e)
{
    char text[200];
    int k = snprintf(text, sizeof text, "%s (at byte %llu)", e->what,
                     (unsigned long long)e->position);
    return col_bytes(&b->error, (const uint8_t *)text, (size_t)k);
}

#define STR_(x) #x
#define STR(x) STR_(x)
#define RENDER_OVER "AMQP properties, annotations and footer render past their text " \
    "budget (" STR(PS_RENDER_FACTOR) " bytes per message byte + " STR(PS_RENDER_SLACK) \
    " bytes, at most 256 MiB)"

static int add_record(ps_batch *b, const uint8_t *p, uint32_t n, int region,
                      uint64_t offset, int64_t timestamp_us, uint64_t pos,
                      ps_error *err)
{
    ps_amqp_msg m;
    marks saved;
    int rc;
    if (!b->opt.amqp) {
        TRY(add_body(b, p, n, region));
        return add_row(b, offset, timestamp_us);
    }
    /* the common message: nothing but one data section */
    const uint8_t *body;
    uint32_t len;
    if (!b->opt.columns && b->opt.error_policy != PS_POLICY_RAW &&
        ps_amqp_data_only(p, n, &body, &len)) {
        TRY(add_body(b, body, len, region));
        return add_row(b, offset, timestamp_us);
    }
    rc = ps_amqp_scan(p, n, &m, err);
    if (rc == 0 && b->opt.columns) {
        ps_render r = {ps_render_budget(n), 0, 0};
        mark_all(b, &saved);
        rc = fill_columns(b, &m, &r);
        if (rc == PS_E_AMQP) {
            rewind_all(b, &saved);
            ps_fail(err, PS_E_AMQP, 0, r.over ? RENDER_OVER
                    : "AMQP property or annotation value of a wrong type");
        }
    }
    if (rc == PS_E_AMQP) {
        err->position += pos;
        if (b->opt.error_policy == PS_POLICY_RAISE)
            return rc;
        if (b->opt.error_policy == PS_POLICY_SKIP)
            return 0;
        TRY(null_columns(b));
        TRY(add_error_text(b, err));
        TRY(add_body(b, p, n, region));
        return add_row(b, offset, timestamp_us);
    }
    if (rc)
        return rc;
    if (m.data_sections > 1) {
        TRY(add_concat_body(b, p, n, PS_SEC_DATA, m.data_total));
    } else if (m.data_sections == 1) {
        TRY(add_body(b, m.data, m.data_len, region));
    } else if (m.seq_sections > 1) {
        TRY(add_concat_body(b, p, n, PS_SEC_SEQUENCE, m.seq_total));
    } else {
        const uint8_t *vp;
        uint32_t vn;
        ps_amqp_value_body(&m, &vp, &vn);
        TRY(add_body(b, vp ? vp : p, vn, region));
    }
    if (b->opt.error_policy == PS_POLICY_RAW)
        TRY(col_null(&b->error));
    return add_row(b, offset, timestamp_us);
}

int ps_batch_add(ps_batch *b, const uint8_t *p, uint32_t n, int region,
                 uint64_t offset, int64_t timestamp_us, uint64_t pos,
                 ps_error *err)
{
    int rc = add_record(b, p, n, region, offset, timestamp_us, pos, err);
    if (rc == PS_E_NOMEM)
        return ps_fail(err, rc, pos, "out of memory");
    if (rc == PS_E_OVERFLOW)
        return ps_fail(err, rc, pos, "a column passes 2 GiB; decode fewer frames at once");
    return rc;
}
