#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "amqp.h"
#include "wire.h"

/* Nesting bound for described values and compound values inside rendered
 * map values: deeper input is malformed, and the C stack stays small. */
#define MAX_DEPTH 32

static int read_value(const uint8_t *p, const uint8_t *end, ps_value *v,
                      int depth);

/* The part of a value after its constructor byte `c`, at p. */
static int read_payload(uint8_t c, const uint8_t *p, const uint8_t *end,
                        ps_value *v, int depth)
{
    size_t avail = (size_t)(end - p);
    uint32_t size;
    v->code = c;
    v->count = 0;
    v->desc = NULL;
    v->elem_desc = NULL;
    switch (c >> 4) {
    case 0x4: v->len = 0; break;
    case 0x5: v->len = 1; break;
    case 0x6: v->len = 2; break;
    case 0x7: v->len = 4; break;
    case 0x8: v->len = 8; break;
    case 0x9: v->len = 16; break;
    case 0xa:
        if (avail < 1)
            return -1;
        v->len = p[0];
        p += 1;
        avail -= 1;
        break;
    case 0xb:
        if (avail < 4)
            return -1;
        v->len = ps_be32(p);
        p += 4;
        avail -= 4;
        break;
    case 0xc:
    case 0xe:               /* size (counts the count byte), count */
        if (avail < 2 || p[0] < 1)
            return -1;
        size = p[0];
        v->count = p[1];
        v->len = size - 1;
        p += 2;
        avail -= 2;
        break;
    case 0xd:
    case 0xf:
        if (avail < 8 || ps_be32(p) < 4)
            return -1;
        size = ps_be32(p);
        v->count = ps_be32(p + 4);
        v->len = size - 4;
        p += 8;
        avail -= 8;
        break;
    default:
        return -1;
    }
    if (v->len > avail)
        return -1;
    v->p = p;
    v->end = p + v->len;
    /* every list or map item takes at least its constructor byte */
    if ((c >> 4) == 0xc || (c >> 4) == 0xd) {
        if (v->count > v->len)
            return -1;
    }
    if ((c >> 4) >= 0xe) {  /* array: one element constructor for all items */
        const uint8_t *q = p, *e = v->end;
        v->elem = 0x40;
        if (v->count == 0 && v->len == 0)
            return 0;
        if (q >= e)
            return -1;
        if (*q == 0x00) {
            ps_value d;
            if (depth >= MAX_DEPTH || read_value(q + 1, e, &d, depth + 1))
                return -1;
            v->elem_desc = q + 1;
            q = d.end;
            if (q >= e)
                return -1;
        }
        v->elem = *q++;
        v->p = q;
        v->len = (uint32_t)(e - q);
        /* items of a zero-width element type take no bytes: their text is
         * bounded by the record's budget (ps_render), not here */
        if ((v->elem >> 4) != 0x4 && v->count > v->len)
            return -1;
    }
    return 0;
}

static int read_value(const uint8_t *p, const uint8_t *end, ps_value *v,
                      int depth)
{
    if (p >= end)
        return -1;
    const uint8_t *start = p;
    if (*p == 0x00) {       /* described: the value's fields, and where its descriptor is */
        ps_value d;
        if (depth >= MAX_DEPTH || read_value(p + 1, end, &d, depth + 1) ||
            read_value(d.end, end, v, depth + 1))
            return -1;
        v->start = start;
        v->desc = p + 1;
        return 0;
    }
    v->start = start;
    return read_payload(*p, p + 1, end, v, depth);
}

int ps_amqp_next_item(const ps_value *c, const uint8_t **it, uint32_t *i,
                      ps_value *item)
{
    const uint8_t *end = c->p + c->len;
    const uint8_t *q = *it ? *it : c->p;
    if (*i >= c->count)
        return -1;
    if ((c->code >> 4) >= 0xe) {
        if (read_payload(c->elem, q, end, item, 0))
            return -1;
        item->start = q;
        item->desc = c->elem_desc;
    } else if (read_value(q, end, item, 0)) {
        return -1;
    }
    *it = item->end;
    *i += 1;
    return 0;
}

/* --- sections ------------------------------------------------------------ */

static const char *const section_names[9] = {
    "amqp:header:list", "amqp:delivery-annotations:map",
    "amqp:message-annotations:map", "amqp:properties:list",
    "amqp:application-properties:map", "amqp:data:binary",
    "amqp:amqp-sequence:list", "amqp:amqp-value:*", "amqp:footer:map",
};

/* Section code of the descriptor at p, or -1; *next is set past it. */
static int section_code(const uint8_t *p, const uint8_t *end,
                        const uint8_t **next)
{
    if (end - p >= 2 && p[0] == 0x53) {
        *next = p + 2;
        return p[1];
    }
    ps_value d;
    if (read_value(p, end, &d, MAX_DEPTH - 1))
        return -1;
    *next = d.end;
    if (d.code == 0x80)
        return ps_be64(d.p) <= 0xff ? (int)ps_be64(d.p) : -1;
    if (d.code == 0xa3 || d.code == 0xb3) {
        for (int i = 0; i < 9; i++)
            if (strlen(section_names[i]) == d.len &&
                memcmp(section_names[i], d.p, d.len) == 0)
                return PS_SEC_HEADER + i;
    }
    return -1;
}

/* The .NET stream client 1.0.0 wrote list and map sizes without the count
 * field, 4 bytes short: when a section's declared end is not followed by
 * another section, find its end by walking its items instead. */
static int fit_items(ps_value *v, const uint8_t *end)
{
    ps_value item;
    const uint8_t *q = v->p;
    for (uint32_t i = 0; i < v->count; i++) {
        if (read_value(q, end, &item, 0))
            return -1;
        q = item.end;
    }
    v->len = (uint32_t)(q - v->p);
    v->end = q;
    return 0;
}

static int is_list(uint8_t c) { return c == 0x45 || c == 0xc0 || c == 0xd0; }
static int is_map(uint8_t c) { return c == 0xc1 || c == 0xd1; }

/* The section at *q: its code and value; *q moves past it.  NULL, or the
 * text of what is malformed with *q at the offending byte. */
static const char *next_section(const uint8_t **q, const uint8_t *end,
                                int *code, ps_value *v)
{
    const uint8_t *p = *q;
    if (*p != 0x00)
        return "AMQP section is not a described value";
    /* the common case: 00 53 75 a0/b0 (data section) */
    if (end - p >= 5 && p[1] == 0x53 && p[2] == PS_SEC_DATA &&
        (p[3] == 0xa0 || p[3] == 0xb0)) {
        *code = PS_SEC_DATA;
        p += 3;
    } else if ((*code = section_code(p + 1, end, &p)) < PS_SEC_HEADER ||
               *code > PS_SEC_FOOTER) {
        return "unknown AMQP section descriptor";
    }
    *q = p;
    if (read_value(p, end, v, 0))
        return "AMQP section value runs past the message";
    if (v->end < end && *v->end != 0x00 && (v->code & 0xf0) >= 0xc0 &&
        (v->code & 0xf0) <= 0xd0 && fit_items(v, end))
        return "AMQP list or map items overrun its size";
    *q = v->end;
    return NULL;
}

int ps_amqp_scan(const uint8_t *p, size_t n, ps_amqp_msg *m, ps_error *err)
{
    const uint8_t *q = p, *end = p + n;
    memset(m, 0, sizeof *m);
    while (q < end) {
        ps_value v;
        int code;
        const char *what = next_section(&q, end, &code, &v);
        if (what)
            return ps_fail(err, PS_E_AMQP, (uint64_t)(q - p), what);
        if (v.code == 0x40 && code != PS_SEC_VALUE)
            continue;       /* a null section is an absent one */
        switch (code) {
        case PS_SEC_HEADER:
        case PS_SEC_PROPERTIES:
            if (!is_list(v.code))
                return ps_fail(err, PS_E_AMQP, (uint64_t)(v.start - p),
                               "AMQP header/properties section is not a list");
            if (code == PS_SEC_HEADER)
                m->header = v;
            else
                m->properties = v;
            break;
        case PS_SEC_DELIVERY_ANNOTATIONS:
        case PS_SEC_MESSAGE_ANNOTATIONS:
        case PS_SEC_APPLICATION_PROPERTIES:
        case PS_SEC_FOOTER:
            if (!is_map(v.code))
                return ps_fail(err, PS_E_AMQP, (uint64_t)(v.start - p),
                               "AMQP annotations/properties section is not a map");
            if (code == PS_SEC_MESSAGE_ANNOTATIONS)
                m->message_annotations = v;
            else if (code == PS_SEC_APPLICATION_PROPERTIES)
                m->application_properties = v;
            else if (code == PS_SEC_FOOTER)
                m->footer = v;
            break;
        case PS_SEC_DATA:
            if (v.code != 0xa0 && v.code != 0xb0)
                return ps_fail(err, PS_E_AMQP, (uint64_t)(v.start - p),
                               "AMQP data section is not binary");
            if (m->data_sections++ == 0) {
                m->data = v.p;
                m->data_len = v.len;
            }
            m->data_total += v.len;
            break;
        case PS_SEC_SEQUENCE:
            if (!is_list(v.code))
                return ps_fail(err, PS_E_AMQP, (uint64_t)(v.start - p),
                               "AMQP sequence section is not a list");
            m->seq_sections++;
            m->seq_total += (uint64_t)(v.end - v.start);
            /* fall through */
        default:            /* amqp-value */
            if (!m->value.start)
                m->value = v;
            break;
        }
    }
    return 0;
}

void ps_amqp_concat(const uint8_t *p, size_t n, int want, uint8_t *dst)
{
    const uint8_t *q = p, *end = p + n;
    ps_value v;
    int code;
    /* the message was scanned: every section reads */
    while (q < end && !next_section(&q, end, &code, &v)) {
        if (code != want || v.code == 0x40)
            continue;
        const uint8_t *from = code == PS_SEC_DATA ? v.p : v.start;
        size_t len = (size_t)(v.end - from);
        memcpy(dst, from, len);
        dst += len;
    }
}

void ps_amqp_value_body(const ps_amqp_msg *m, const uint8_t **p, uint32_t *n)
{
    const ps_value *v = &m->value;
    if (!v->start) {
        *p = NULL;
        *n = 0;
    } else if (ps_amqp_bytes(v, p, n) != 0) {
        *p = v->start;
        *n = (uint32_t)(v->end - v->start);
    }
}

/* --- typed readers --------------------------------------------------------- */

int ps_amqp_int(const ps_value *v, int64_t *out)
{
    const uint8_t *p = v->p;
    if (v->desc)
        return -1;
    switch (v->code) {
    case 0x43: case 0x44: *out = 0; return 0;
    case 0x50: case 0x52: case 0x53: *out = p[0]; return 0;
    case 0x51: case 0x54: case 0x55: *out = (int8_t)p[0]; return 0;
    case 0x60: *out = ps_be16(p); return 0;
    case 0x61: *out = (int16_t)ps_be16(p); return 0;
    case 0x70: *out = ps_be32(p); return 0;
    case 0x71: *out = (int32_t)ps_be32(p); return 0;
    case 0x80:
        if (ps_be64(p) > INT64_MAX)
            return -1;
        /* fall through */
    case 0x81: *out = (int64_t)ps_be64(p); return 0;
    default: return -1;
    }
}

int ps_amqp_bool(const ps_value *v, int *out)
{
    if (v->desc)
        return -1;
    switch (v->code) {
    case 0x41: *out = 1; return 0;
    case 0x42: *out = 0; return 0;
    case 0x56: *out = v->p[0] != 0; return 0;
    default: return -1;
    }
}

int ps_amqp_timestamp(const ps_value *v, int64_t *ms)
{
    if (v->code == 0x83 && !v->desc) {
        *ms = (int64_t)ps_be64(v->p);
        return 0;
    }
    return ps_amqp_int(v, ms);  /* lenient: a plain integer of milliseconds */
}

int ps_amqp_bytes(const ps_value *v, const uint8_t **p, uint32_t *n)
{
    if (v->desc)
        return -1;
    switch (v->code) {
    case 0xa0: case 0xb0: case 0xa1: case 0xb1: case 0xa3: case 0xb3:
        *p = v->p;
        *n = v->len;
        return 0;
    default:
        return -1;
    }
}

/* --- text rendering -------------------------------------------------------
 *
 * Map values (application properties, message annotations) and ids become
 * text, one rule per type:
 *   string, symbol        as is (must be UTF-8)
 *   boolean               true / false
 *   integers              decimal
 *   float, double         shortest %g form that reads back to the same value
 *                         (inf, -inf, nan)
 *   timestamp             ISO 8601 UTC with milliseconds, 2024-03-14T18:24:12.000Z
 *   uuid                  canonical 8-4-4-4-12 lowercase hex
 *   binary, decimal32/64/128   lowercase hex
 *   char                  the character, UTF-8
 *   list, array, map      JSON: [..], {"key": ..}, nested values as JSON
 *                         (text types quoted, numbers and booleans bare, null)
 *   described value       JSON {"descriptor": d, "value": v}, both as JSON
 *                         (so a symbolic descriptor is quoted, a ulong bare)
 * A map key inside JSON is always a JSON string: the text of a key that is
 * not a string or symbol, quoted.  A null value is a null entry, not text:
 * callers check for code 0x40.  Everything written counts against the
 * record's budget (ps_render) before it is written.
 */

/* Where text goes: the record's buffer and budget, and how many JSON
 * strings the text being written is inside (a key that is not text is
 * quoted, and a key inside it quoted again: each level escapes the text
 * once more, as it is written, never by copying what was written). */
typedef struct out {
    ps_buf *buf;
    ps_render *r;
    int esc;
} out;

/* Append n bytes as they read inside `esc` levels of JSON string quoting. */
static int put_esc(out *o, const uint8_t *p, size_t n, int esc)
{
    o->r->steps++;
    if (esc == 0) {
        if (n > o->r->left)
            return o->r->over = 1, PS_RENDER_OVER;
        o->r->left -= n;
        return ps_buf_put(o->buf, p, n) ? PS_RENDER_NOMEM : 0;
    }
    size_t run = 0;
    int rc;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i], e[8];
        size_t k;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;       /* the same text at every level */
        if ((rc = put_esc(o, p + run, i - run, 0)))
            return rc;
        run = i + 1;
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = c;
            k = 2;
        } else {
            k = (size_t)snprintf((char *)e, sizeof e, "\\u%04x", c);
        }
        if ((rc = put_esc(o, e, k, esc - 1)))
            return rc;
    }
    return put_esc(o, p + run, n - run, 0);
}

static int put(out *o, const void *p, size_t n)
{
    return put_esc(o, p, n, o->esc);
}

static int putf(out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int putf(out *o, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return n < 0 ? PS_RENDER_MALFORMED : put(o, tmp, (size_t)n);
}

/* Hex digits read the same at every quoting level. */
static int put_hex(out *o, const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    ps_buf *b = o->buf;
    o->r->steps++;
    if (n > o->r->left / 2)
        return o->r->over = 1, PS_RENDER_OVER;
    if (ps_buf_reserve(b, 2 * n))
        return PS_RENDER_NOMEM;
    o->r->left -= 2 * n;
    uint8_t *d = b->p + b->len;
    for (size_t i = 0; i < n; i++) {
        d[2 * i] = (uint8_t)digits[p[i] >> 4];
        d[2 * i + 1] = (uint8_t)digits[p[i] & 15];
    }
    b->len += 2 * n;
    return 0;
}

static int put_double(out *o, double d, int is_float)
{
    char tmp[40];
    if (isnan(d))
        return put(o, "nan", 3);
    if (isinf(d))
        return d > 0 ? put(o, "inf", 3) : put(o, "-inf", 4);
    /* The fewest significant digits that read back to the same value... */
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        double back = strtod(tmp, NULL);
        if (is_float ? (float)back == (float)d : back == d)
            break;
    }
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
    /* ...written without an exponent when it is moderate: 100, 0.001. */
    int exp10 = atoi(strchr(tmp, 'e') + 1);
    if (exp10 >= -5 && exp10 < 17) {
        int decimals = prec - 1 - exp10;
        snprintf(tmp, sizeof tmp, "%.*f", decimals > 0 ? decimals : 0, d);
    }
    return put(o, tmp, strlen(tmp));
}

/* Civil date from days since 1970-01-01 (proleptic Gregorian). */
static void civil(int64_t days, int64_t *y, int *m, int *d)
{
    days += 719468;
    int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    int64_t doe = days - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

static int put_timestamp(out *o, int64_t ms)
{
    int64_t days = ms / 86400000, rem = ms % 86400000;
    if (rem < 0) {
        rem += 86400000;
        days -= 1;
    }
    int64_t y;
    int mo, d;
    civil(days, &y, &mo, &d);
    return putf(o, "%04lld-%02d-%02dT%02d:%02d:%02d.%03dZ", (long long)y, mo, d,
                (int)(rem / 3600000), (int)(rem / 60000 % 60),
                (int)(rem / 1000 % 60), (int)(rem % 1000));
}

static int put_uuid(out *o, const uint8_t *u)
{
    int rc;
    (void)((rc = put_hex(o, u, 4)) || (rc = put(o, "-", 1)) ||
           (rc = put_hex(o, u + 4, 2)) || (rc = put(o, "-", 1)) ||
           (rc = put_hex(o, u + 6, 2)) || (rc = put(o, "-", 1)) ||
           (rc = put_hex(o, u + 8, 2)) || (rc = put(o, "-", 1)) ||
           (rc = put_hex(o, u + 10, 6)));
    return rc;
}

static int put_utf8_char(out *o, uint32_t c)
{
    uint8_t b[4];
    size_t n;
    if (c < 0x80) {
        b[0] = (uint8_t)c; n = 1;
    } else if (c < 0x800) {
        b[0] = (uint8_t)(0xc0 | c >> 6); b[1] = (uint8_t)(0x80 | (c & 63)); n = 2;
    } else if (c < 0x10000) {
        if (c >= 0xd800 && c < 0xe000)
            return PS_RENDER_MALFORMED;
        b[0] = (uint8_t)(0xe0 | c >> 12); b[1] = (uint8_t)(0x80 | (c >> 6 & 63));
        b[2] = (uint8_t)(0x80 | (c & 63)); n = 3;
    } else if (c < 0x110000) {
        b[0] = (uint8_t)(0xf0 | c >> 18); b[1] = (uint8_t)(0x80 | (c >> 12 & 63));
        b[2] = (uint8_t)(0x80 | (c >> 6 & 63)); b[3] = (uint8_t)(0x80 | (c & 63)); n = 4;
    } else {
        return PS_RENDER_MALFORMED;
    }
    return put(o, b, n);
}

static int render(const ps_value *v, out *o, int json, int depth);

/* A JSON string holding the text of v (rendered as at the top level, the
 * text of a string as is): one more level of quoting while it is written. */
static int render_quoted(const ps_value *v, out *o, int depth)
{
    int rc;
    if ((rc = put(o, "\"", 1)))
        return rc;
    o->esc++;
    rc = render(v, o, 0, depth);
    o->esc--;
    return rc ? rc : put(o, "\"", 1);
}

/* {"descriptor": d, "value": v}.  A described value's fields are those of
 * its value, read again after the descriptor; an array item's descriptor is
 * the array's, and the item is the value. */
static int render_described(const ps_value *v, out *o, int depth)
{
    ps_value d, inner;
    int rc;
    if (depth >= MAX_DEPTH || read_value(v->desc, v->end, &d, depth + 1))
        return PS_RENDER_MALFORMED;
    if (v->start + 1 == v->desc) {
        if (read_value(d.end, v->end, &inner, depth + 1))
            return PS_RENDER_MALFORMED;
    } else {
        inner = *v;
        inner.desc = NULL;
    }
    (void)((rc = put(o, "{\"descriptor\": ", 15)) ||
           (rc = render(&d, o, 1, depth + 1)) ||
           (rc = put(o, ", \"value\": ", 11)) ||
           (rc = render(&inner, o, 1, depth + 1)) || (rc = put(o, "}", 1)));
    return rc;
}

static int render_compound(const ps_value *v, out *o, int depth)
{
    int map = v->code == 0xc1 || v->code == 0xd1;
    const uint8_t *it = NULL;
    uint32_t i = 0;
    ps_value item;
    int rc;
    if (depth >= MAX_DEPTH || (map && v->count % 2))
        return PS_RENDER_MALFORMED;
    if ((rc = put(o, map ? "{" : "[", 1)))
        return rc;
    while (i < v->count) {
        if (i && (rc = put(o, map && i % 2 ? ": " : ", ", 2)))
            return rc;
        if (ps_amqp_next_item(v, &it, &i, &item))
            return PS_RENDER_MALFORMED;
        if (map && i % 2) {         /* a key: always a JSON string */
            int text = !item.desc && (item.code >> 4 == 0xa || item.code >> 4 == 0xb);
            if (text && item.code != 0xa0 && item.code != 0xb0)
                rc = render(&item, o, 1, depth + 1);
            else
                rc = render_quoted(&item, o, depth + 1);
        } else {
            rc = render(&item, o, 1, depth + 1);
        }
        if (rc)
            return rc;
    }
    return put(o, map ? "}" : "]", 1);
}

static int render(const ps_value *v, out *o, int json, int depth)
{
    const uint8_t *p = v->p;
    int64_t i;
    int b;
    o->r->steps++;
    if (v->desc)            /* the same text at the top as inside JSON */
        return render_described(v, o, depth);
    switch (v->code) {
    case 0x40:
        return put(o, "null", 4);
    case 0x41: case 0x42: case 0x56:
        ps_amqp_bool(v, &b);
        return b ? put(o, "true", 4) : put(o, "false", 5);
    case 0x80:
        return putf(o, "%llu", (unsigned long long)ps_be64(p));
    case 0x72: {
        uint32_t bits = ps_be32(p);
        float f;
        memcpy(&f, &bits, 4);
        return json && !isfinite(f) ? render_quoted(v, o, depth)
                                    : put_double(o, f, 1);
    }
    case 0x82: {
        uint64_t bits = ps_be64(p);
        double d;
        memcpy(&d, &bits, 8);
        return json && !isfinite(d) ? render_quoted(v, o, depth)
                                    : put_double(o, d, 0);
    }
    case 0xa1: case 0xb1: case 0xa3: case 0xb3:
        if (json)               /* its text, checked there, in quotes */
            return render_quoted(v, o, depth);
        if (!ps_utf8_valid(p, v->len))
            return PS_RENDER_MALFORMED;
        return put(o, p, v->len);
    case 0x45: case 0xc0: case 0xd0: case 0xc1: case 0xd1: case 0xe0: case 0xf0:
        return render_compound(v, o, depth);
    }
    if (ps_amqp_int(v, &i) == 0)
        return putf(o, "%lld", (long long)i);
    if (json)
        return render_quoted(v, o, depth);
    switch (v->code) {
    case 0x83:
        return put_timestamp(o, (int64_t)ps_be64(p));
    case 0x98:
        return put_uuid(o, p);
    case 0x73:
        return put_utf8_char(o, ps_be32(p));
    case 0xa0: case 0xb0: case 0x74: case 0x84: case 0x94:
        return put_hex(o, p, v->len);
    default:
        return PS_RENDER_MALFORMED;
    }
}

int ps_amqp_render(const ps_value *v, ps_buf *buf, ps_render *r)
{
    out o = {buf, r, 0};
    return render(v, &o, 0, 0);
}

int ps_utf8_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {       /* ASCII fast path */
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) { k = 1; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { k = 2; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { k = 3; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
            return 0;
        i += k + 1;
    }
    return 1;
}
