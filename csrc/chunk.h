/* Deliver frames and the chunks they carry: the one place that knows their
 * layout (see PROTOCOL-NOTES.md).  Big-endian:
 *
 *   u16 key 0x0008 | u16 version | u8 subscription id
 *   [version 2: u64 committed chunk id]
 *   chunk header, 48 bytes:
 *     u8 magic 0x50 | u8 type (0 user, 1/2 tracking) | u16 entries |
 *     u32 records | i64 timestamp ms | u64 epoch | u64 first offset |
 *     u32 CRC-32 of the entries | u32 data length | u32 trailer length |
 *     u8 bloom size | 3 reserved     (trailer and bloom are never sent)
 *   entries, data length bytes:
 *     simple:    u32 size (bit 31 clear) | size bytes
 *     sub-batch: u8 1ccc0000 (codec c) | u16 records | u32 uncompressed |
 *                u32 compressed | compressed bytes, which decompress to
 *                `records` x (u32 size | size bytes)
 */
#ifndef PS_CHUNK_H
#define PS_CHUNK_H

#include "batch.h"
#include "frame.h"

typedef struct ps_chunk {
    uint8_t version;            /* Deliver version, 1 or 2 */
    uint8_t subscription_id;
    uint64_t committed_chunk_id;  /* version 2 only, else 0 */
    uint8_t type;
    uint16_t num_entries;
    uint32_t num_records;
    int64_t timestamp;          /* ms since the epoch */
    uint64_t epoch;
    uint64_t first_offset;
    uint32_t crc;
    uint32_t data_len;
    const uint8_t *data;        /* the entries */
    uint64_t pos;               /* stream position of the frame (after its size) */
} ps_chunk;

/* Key of a frame (without its size prefix) of at least 2 bytes. */
uint16_t ps_frame_key(const uint8_t *frame);

/* Parse and check the Deliver frame [frame, frame+len) whose first byte is
 * at stream position pos: header fields, magic, lengths. */
int ps_deliver_parse(const uint8_t *frame, size_t len, uint64_t pos,
                     ps_chunk *c, ps_error *err);

/* Verify the CRC (if asked), then append the chunk's records at or above
 * the start offset to the batch.  Tracking chunks add nothing. */
int ps_chunk_decode(const ps_chunk *c, ps_batch *b, ps_error *err);

/* The two halves of ps_chunk_decode, for a caller that computes the CRC-32
 * of the chunk's data itself: the check against the header's, and the
 * decode (which never looks at the option crc). */
int ps_chunk_check_crc(const ps_chunk *c, uint32_t crc, ps_error *err);
int ps_chunk_decode_records(const ps_chunk *c, ps_batch *b, ps_error *err);

/* Bytes a decoded chunk's batch holds beyond its Deliver frame, from the
 * entry headers alone (nothing is decompressed or allocated): the
 * uncompressed length each compressed sub-batch declares, and
 * PS_ROW_BYTES for each record (offset, timestamp and body view). The
 * walk stops at the first entry it cannot read: decoding reports it. */
enum { PS_ROW_BYTES = 32 };
uint64_t ps_chunk_inflated_size(const ps_chunk *c);

/* The same walk in steps, over the entry headers as they arrive: each
 * step reads the headers that lie wholly within the first `have` bytes of
 * c's entries (all of them once have reaches data_len). Offsets only, so
 * the bytes may move between steps. Zeroed: nothing walked. */
typedef struct ps_size_walk {
    uint32_t next;              /* offset in the entries of the next header */
    uint32_t entries;           /* entries walked */
    uint64_t size;              /* what they add */
    uint8_t stopped;            /* every entry walked, or one unreadable */
} ps_size_walk;
void ps_size_walk_step(ps_size_walk *w, const ps_chunk *c, size_t have);

/* The CRC-32 of a chunk's entries, begun while its Deliver frame is still
 * arriving: a reader that checks each newly received piece at once reads
 * it from the cache (1 KiB records come in chunks of some 8 MB, which by
 * their end have left it, and the CRC runs at half the speed from memory). */
typedef struct ps_crc_ahead {
    uint64_t pos;               /* stream position of the frame followed;
                                 * 0 (no frame's, they follow a size): none */
    uint32_t done;              /* bytes of its entries in crc */
    uint32_t crc;
    ps_size_walk walk;          /* its entry headers among those bytes */
} ps_crc_ahead;

/* Continue a's CRC, and its walk of the entry headers, over the entries in
 * [frame, frame+have), the beginning of a Deliver frame at stream position
 * pos (a different frame than the one followed starts afresh). A header
 * not yet whole, or not a Deliver header, leaves it as it is:
 * ps_deliver_parse reports what is wrong. */
void ps_crc_ahead_advance(ps_crc_ahead *a, const uint8_t *frame, size_t have,
                          uint64_t pos);

/* Of the complete chunk c, the first n bytes of the entries (n = 0 when a
 * followed another frame) and their CRC-32 from a, and the walk of their
 * entry headers (zeroed when a followed another frame); a then follows
 * none. */
uint32_t ps_crc_ahead_take(ps_crc_ahead *a, const ps_chunk *c, uint32_t *n,
                           ps_size_walk *walk);

/* Decode every size-prefixed Deliver frame in [p, p+n) into the batch;
 * positions in errors are offsets into p. */
int ps_decode_buffer(const uint8_t *p, size_t n, ps_batch *b, ps_error *err);

#endif
