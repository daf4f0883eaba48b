/* Publish frames, the producer's side: Arrow columns of messages become
 * size-prefixed Publish frames in one buffer, ready for the socket.
 * Big-endian:
 *
 *   u32 size (excludes itself) | u16 key 0x0002 | u16 version |
 *   u8 publisher id | i32 entries | entries:
 *     version 1:  u64 publishing id | u32 size | message
 *     version 2:  u64 publishing id | i16 filter length (-1: null) | filter |
 *                 u32 size | message
 *     sub-batch (version 1 only): u64 publishing id | u8 1ccc0000 (codec c) |
 *                 u16 records | u32 uncompressed | u32 compressed | data
 *
 * The broker stores each entry as it came (chunk.h: the sub-batch header is
 * the same) and confirms one publishing id per entry.  It closes the
 * connection when a frame's size prefix exceeds frame_max - 4, so frames
 * here are bounded with their prefix counted.
 *
 * An AMQP 1.0 message is written as [message-annotations] [properties]
 * [application-properties] data, in the order of the AMQP specification:
 * annotation keys as symbols, application-property keys and all map values
 * as strings (null values as null), properties as a list truncated after its
 * last non-null field. */
#ifndef PS_ENCODE_H
#define PS_ENCODE_H

#include "batch.h"

/* Arrow layouts of a column of byte strings (binary/string and their large
 * and view variants), read in place. */
enum { PS_STRS_ABSENT = 0, PS_STRS_OFFSETS32, PS_STRS_OFFSETS64, PS_STRS_VIEWS };

typedef struct ps_strs {
    int layout;
    int binary;                 /* Arrow binary, not string: ids become AMQP binary */
    const uint8_t *validity;    /* NULL: no nulls */
    size_t offset;              /* first row in the buffers (sliced arrays) */
    const void *offsets;        /* int32 or int64 offsets, or 16-byte views */
    const uint8_t *data;        /* offsets layouts: the bytes */
    const uint8_t *const *buffers;  /* views layout: the data buffers */
} ps_strs;

/* An int64 column; a row's AMQP value is floor(v * mul / div), which turns
 * Arrow timestamps of any unit into AMQP milliseconds. */
typedef struct ps_ints {
    const int64_t *values;      /* NULL: absent */
    const uint8_t *validity;
    size_t offset;
    int64_t mul, div;
} ps_ints;

/* The properties struct: a child per field in the order of the AMQP list
 * (batch.h's column order); fields 8, 9 (timestamps) and 11 (group
 * sequence) are ps_ints, the others ps_strs. */
typedef struct ps_props {
    int present;
    const uint8_t *validity;    /* of the struct: a null row has no section */
    size_t offset;
    ps_strs text[PS_PROP_FIELDS];
    ps_ints num[PS_PROP_FIELDS];
} ps_props;

/* A map<string, string> column: the entries of row i are the rows
 * offsets[offset + i] .. offsets[offset + i + 1] of keys and values. */
typedef struct ps_map {
    const int32_t *offsets;     /* NULL: absent */
    const uint8_t *validity;    /* a null row has no section */
    size_t offset;
    ps_strs keys, values;
} ps_map;

typedef struct ps_publish {
    uint8_t publisher_id;
    uint64_t first_id;          /* publishing ids count up from here */
    size_t count;               /* messages (rows of every column) */
    int amqp;                   /* else the body is the message as is */
    int codec;                  /* -1: an entry per message; else sub-batches */
    uint32_t sub_batch;         /* most records per sub-batch, 1..65535 */
    uint64_t max_frame;         /* most bytes of a frame, prefix included, < 4 GiB */
    ps_strs body;
    ps_strs filter;             /* present: version 2, one filter value per message */
    ps_props properties;
    ps_map application_properties, message_annotations;
} ps_publish;

/* Append the Publish frames of all messages to *frames and, per entry
 * (publishing id) in order, its number of messages as int64 to *counts.
 * Errors, with err->position the index of the message at fault:
 * PS_E_FRAME_TOO_LARGE (it cannot fit a frame), PS_E_PROTOCOL (a value the
 * formats cannot carry: null body, filter value above 32767 bytes, group
 * sequence outside uint, timestamp outside int64 ms, null map key, a
 * symbol (annotation key, content type or encoding) that is not ASCII,
 * message of 2 GiB), PS_E_NOMEM. */
int ps_encode_publish(const ps_publish *p, ps_codecs *codecs, ps_buf *frames,
                      ps_buf *counts, ps_error *err);

/* MurmurHash3 x86_32 of each of the n strings (a null hashes as empty):
 * the stream clients route super stream messages by it. */
void ps_murmur3_32(const ps_strs *keys, size_t n, uint32_t seed, uint32_t *out);

#endif
