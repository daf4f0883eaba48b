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

/* Decode every size-prefixed Deliver frame in [p, p+n) into the batch;
 * positions in errors are offsets into p. */
int ps_decode_buffer(const uint8_t *p, size_t n, ps_batch *b, ps_error *err);

#endif
