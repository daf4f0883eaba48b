#include <string.h>

#include "frame.h"
#include "wire.h"

/* Why a frame of `size` bytes starting at p (avail bytes buffered) is
 * refused: NULL when it is within the limits. A size between max_frame and
 * max_deliver needs the key to tell; *need_key asks for it. */
static const char *size_refused(const ps_reader *r, const uint8_t *p,
                                size_t avail, uint32_t size, int *need_key)
{
    *need_key = 0;
    if (!r->max_frame || size <= r->max_frame)
        return NULL;
    if (size > r->max_deliver)
        return r->max_deliver > r->max_frame
                   ? "frame size prefix exceeds max_deliver_size"
                   : "frame size prefix exceeds max_frame_size";
    if (avail < 6) {
        *need_key = 1;
        return NULL;
    }
    return ps_be16(p + 4) == PS_KEY_DELIVER
               ? NULL
               : "frame size prefix exceeds max_frame_size (only Deliver "
                 "frames may be larger)";
}

int ps_reader_next(ps_reader *r, const uint8_t **frame, uint32_t *len,
                   ps_error *err)
{
    size_t avail = r->wpos - r->rpos;
    if (avail < 4)
        return PS_NEED_MORE;
    const uint8_t *p = r->buf + r->rpos;
    uint32_t size = ps_be32(p);
    int need_key;
    const char *refused = size_refused(r, p, avail, size, &need_key);
    if (need_key)
        return PS_NEED_MORE;
    if (refused)
        return ps_fail(err, PS_E_FRAME_TOO_LARGE, r->consumed, refused);
    if (size < 4)
        return ps_fail(err, PS_E_TRUNCATED_FRAME, r->consumed,
                       "frame size below 4 cannot hold key and version");
    if (avail - 4 < size)
        return PS_NEED_MORE;
    *frame = p + 4;
    *len = size;
    r->rpos += 4 + (size_t)size;
    r->consumed += 4 + (uint64_t)size;
    return PS_OK;
}

size_t ps_reader_missing(const ps_reader *r)
{
    size_t avail = r->wpos - r->rpos;
    if (avail < 4)
        return 4 - avail;
    uint32_t size = ps_be32(r->buf + r->rpos);
    int need_key;
    if (size_refused(r, r->buf + r->rpos, avail, size, &need_key))
        return 0;           /* ps_reader_next reports it; do not grow for it */
    if (need_key)
        return 6 - avail;   /* the key decides */
    uint64_t want = 4 + (uint64_t)size;
    return want > avail ? (size_t)(want - avail) : 0;
}

void ps_reader_compact(ps_reader *r)
{
    size_t n = r->wpos - r->rpos;
    if (r->rpos && n)
        memmove(r->buf, r->buf + r->rpos, n);
    r->rpos = 0;
    r->wpos = n;
}

void ps_reader_rebase(ps_reader *r, uint8_t *nbuf, size_t ncap)
{
    size_t n = r->wpos - r->rpos;
    if (n)
        memcpy(nbuf, r->buf + r->rpos, n);
    r->buf = nbuf;
    r->cap = ncap;
    r->rpos = 0;
    r->wpos = n;
}
