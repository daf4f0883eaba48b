/* Stream protocol framing: `u32 size | size bytes` (big-endian), the size
 * excluding itself.  A frame starts with u16 key and u16 version, so a size
 * below 4 cannot be a frame.
 *
 * ps_reader splits frames out of a receive buffer that the caller owns and
 * fills (hiredis read.c style, but without allocation: the caller decides
 * when to compact in place and when to move to a fresh buffer, because only
 * it knows whether decoded columns still point into the old one). */
#ifndef PS_FRAME_H
#define PS_FRAME_H

#include "status.h"

/* Deliver (broker to client, a chunk of a subscription). */
enum { PS_KEY_DELIVER = 0x0008 };

typedef struct ps_reader {
    uint8_t *buf;
    size_t cap;
    size_t rpos;            /* first byte not yet returned */
    size_t wpos;            /* end of the received bytes */
    uint64_t consumed;      /* stream position of buf[rpos], for error positions */
    uint32_t max_frame;     /* largest accepted size prefix; 0 = unlimited */
    /* The broker sends each chunk whole in one Deliver frame, whatever
     * frame_max was negotiated: Deliver frames may be up to max_deliver
     * (when it is larger than max_frame). */
    uint32_t max_deliver;
} ps_reader;

/* Next complete frame (without its size prefix) into *frame / *len.
 * Returns PS_OK, PS_NEED_MORE, or an error (the reader does not advance
 * past a bad size prefix, so the error repeats). */
int ps_reader_next(ps_reader *r, const uint8_t **frame, uint32_t *len,
                   ps_error *err);

/* Bytes still needed to complete the frame that starts at rpos (at least the
 * 4 bytes of a size prefix); 0 if a whole frame is buffered. */
size_t ps_reader_missing(const ps_reader *r);

/* Move the unread bytes to the start of the same buffer. */
void ps_reader_compact(ps_reader *r);

/* Copy the unread bytes to the start of a new buffer of ncap bytes
 * (ncap >= wpos - rpos) and use it from now on; the old one is left intact. */
void ps_reader_rebase(ps_reader *r, uint8_t *nbuf, size_t ncap);

#endif
