/* Result codes of the pystream C core.
 *
 * Every function that can fail returns one of these and fills a ps_error with
 * the byte position where it stopped; the Cython layer maps each code to one
 * exception class of pystream.errors.  Nothing here allocates or prints. */
#ifndef PS_STATUS_H
#define PS_STATUS_H

#include <stddef.h>
#include <stdint.h>

typedef enum ps_status {
    PS_OK = 0,
    PS_NEED_MORE,           /* not an error: the frame is not complete yet */
    /* ProtocolError */
    PS_E_TRUNCATED_FRAME,   /* a frame ends before the fields its layout requires */
    PS_E_FRAME_TOO_LARGE,   /* size prefix above the negotiated frame_max */
    /* CorruptChunk */
    PS_E_CHUNK,             /* magic, lengths, entry framing, codec */
    PS_E_CRC,               /* CRC-32 of the entries does not match */
    /* DecompressionLimit (a CorruptChunk) */
    PS_E_LIMIT,
    /* MalformedMessage */
    PS_E_AMQP,
    /* ProtocolError: a frame that is not what its place requires */
    PS_E_PROTOCOL,
    /* MemoryError */
    PS_E_NOMEM,
    /* OverflowError: a column passes Arrow's 2 GiB (int32 offsets) */
    PS_E_OVERFLOW,
    /* CodecUnavailable: a sub-batch's codec, built without its library */
    PS_E_CODEC_MISSING,
} ps_status;

typedef struct ps_error {
    int code;               /* a ps_status */
    uint64_t position;      /* byte position in the caller's input */
    const char *what;       /* static text naming what was wrong */
} ps_error;

static inline int ps_fail(ps_error *err, int code, uint64_t position,
                          const char *what)
{
    err->code = code;
    err->position = position;
    err->what = what;
    return code;
}

#endif
