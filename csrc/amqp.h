/* AMQP 1.0 message format (the bytes of one stream entry).
 *
 * A message is a sequence of sections, each a described value
 * `00 <descriptor> <value>`; the descriptor is a small ulong 0x70..0x78
 * (`00 53 xx`), a ulong (`00 80 <u64>`) or its symbolic name.  Every value
 * starts with a constructor byte whose high nibble gives the width of what
 * follows, so anything can be skipped without being understood.
 *
 * The scanner records where each section's value lies without allocating;
 * the readers below decode single values on demand for the columns. */
#ifndef PS_AMQP_H
#define PS_AMQP_H

#include "buf.h"
#include "wire.h"

enum {
    PS_SEC_HEADER = 0x70,
    PS_SEC_DELIVERY_ANNOTATIONS = 0x71,
    PS_SEC_MESSAGE_ANNOTATIONS = 0x72,
    PS_SEC_PROPERTIES = 0x73,
    PS_SEC_APPLICATION_PROPERTIES = 0x74,
    PS_SEC_DATA = 0x75,
    PS_SEC_SEQUENCE = 0x76,
    PS_SEC_VALUE = 0x77,
    PS_SEC_FOOTER = 0x78,
};

/* One encoded value.  For a described value `code` and the payload are the
 * underlying value's and `desc` points at the descriptor: no reader drops
 * it silently (the typed readers refuse described values, the text of one
 * keeps its descriptor, a body that is one is its whole encoding). */
typedef struct ps_value {
    const uint8_t *start;   /* first byte of the encoding (constructor, or
                               the 0x00 of a described value) */
    const uint8_t *end;     /* first byte after the value */
    const uint8_t *p;       /* payload: fixed bytes, variable bytes, or the
                               items of a list/map/array */
    const uint8_t *desc;    /* described: the descriptor's encoding; else NULL */
    const uint8_t *elem_desc;   /* array of described elements: their
                                   descriptor; else NULL */
    uint32_t len;           /* payload length in bytes */
    uint32_t count;         /* list/map/array: number of items */
    uint8_t code;           /* constructor (0x40 null, 0xa1 str8, ...) */
    uint8_t elem;           /* array: element constructor */
} ps_value;

/* Sections found in one message (start == NULL: absent). */
typedef struct ps_amqp_msg {
    ps_value header, message_annotations, properties, application_properties;
    ps_value footer;
    ps_value value;             /* first amqp-value or amqp-sequence */
    const uint8_t *data;        /* payload of the first data section */
    uint32_t data_len;
    uint32_t data_sections;     /* > 1: the body is their concatenation */
    uint64_t data_total;
    uint32_t seq_sections;      /* > 1: the body is their lists' encodings */
    uint64_t seq_total;
} ps_amqp_msg;

/* The common message, nothing but one data section (00 53 75, vbin8 or
 * vbin32, filling the message exactly): 1 with its payload, else 0 (any
 * other message, which ps_amqp_scan reads). */
static inline int ps_amqp_data_only(const uint8_t *p, uint32_t n,
                                    const uint8_t **body, uint32_t *len)
{
    if (n < 5 || p[0] != 0x00 || p[1] != 0x53 || p[2] != PS_SEC_DATA)
        return 0;
    if (p[3] == 0xa0 && p[4] == n - 5) {
        *body = p + 5;
        *len = n - 5;
        return 1;
    }
    if (p[3] == 0xb0 && n >= 8 && ps_be32(p + 4) == n - 8) {
        *body = p + 8;
        *len = n - 8;
        return 1;
    }
    return 0;
}

/* Iterate the items of a list, map or array value: *it starts at NULL. */
int ps_amqp_next_item(const ps_value *c, const uint8_t **it, uint32_t *i,
                      ps_value *item);

/* Find the sections of the message in [p, p+n).  0, or PS_E_AMQP with
 * err->position relative to p. */
int ps_amqp_scan(const uint8_t *p, size_t n, ps_amqp_msg *m, ps_error *err);

/* Append, for every section `code` of a scanned message, the payload of a
 * data section (PS_SEC_DATA) or the encoding of a sequence's list
 * (PS_SEC_SEQUENCE). */
void ps_amqp_concat(const uint8_t *p, size_t n, int code, uint8_t *dst);

/* The body bytes of a message without data sections and with at most one
 * amqp-sequence: the payload of an amqp-value that is a string, symbol or
 * binary (not described), else the encoding of the value or the sequence's
 * list, a described value's descriptor included. */
void ps_amqp_value_body(const ps_amqp_msg *m, const uint8_t **p, uint32_t *n);

/* The text budget of one record: the text of all its rendered values
 * together may take PS_RENDER_FACTOR bytes per message byte plus
 * PS_RENDER_SLACK, and never more than PS_RENDER_CAP.  Every rule of the
 * rendering stays below that factor except an array's described items (each
 * repeats the array's descriptor), items of zero width, and keys quoted
 * inside quoted keys (each level escapes the one inside it again): without
 * a budget a few hundred bytes could render into gigabytes.  Rendering
 * stops as soon as the budget is used up, never after the fact. */
#define PS_RENDER_FACTOR 16
#define PS_RENDER_SLACK 1024
#define PS_RENDER_CAP ((size_t)256 << 20)

static inline size_t ps_render_budget(size_t message_size)
{
    if (message_size >= (PS_RENDER_CAP - PS_RENDER_SLACK) / PS_RENDER_FACTOR)
        return PS_RENDER_CAP;
    return PS_RENDER_FACTOR * message_size + PS_RENDER_SLACK;
}

/* One record's rendering: what it may still write, shared by its values,
 * and the work done (every step writes or reads something; the fuzzer
 * bounds it by the bytes read and written). */
typedef struct ps_render {
    size_t left;            /* bytes of text the record may still take */
    uint64_t steps;
    int over;               /* set when the budget ran out */
} ps_render;

enum {
    PS_RENDER_MALFORMED = -1,   /* the value is malformed (strings that are
                                   not UTF-8 included) */
    PS_RENDER_OVER = -2,        /* the budget ran out: nothing more written */
    PS_RENDER_NOMEM = -3,
};

/* Append the value as text (see the rendering in amqp.c), taking what it
 * writes from r->left: 0 or a PS_RENDER_ code; on failure `out` may hold
 * part of the text (the caller rewinds it). */
int ps_amqp_render(const ps_value *v, ps_buf *out, ps_render *r);

/* Integer, boolean and timestamp readers for typed columns: 0 if the value
 * has a matching type (null and described values excluded), -1 otherwise. */
int ps_amqp_int(const ps_value *v, int64_t *out);
int ps_amqp_bool(const ps_value *v, int *out);
int ps_amqp_timestamp(const ps_value *v, int64_t *ms);

/* The bytes of a string, symbol or binary value (not described): 0 or -1. */
int ps_amqp_bytes(const ps_value *v, const uint8_t **p, uint32_t *n);

/* Whether [p, p+n) is valid UTF-8. */
int ps_utf8_valid(const uint8_t *p, size_t n);

#endif
