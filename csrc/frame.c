#include <string.h>

#include "frame.h"
#include "wire.h"

/* Whether a frame of `size` bytes starting at p (avail bytes buffered) is
 * within the limits: 1 yes, 0 no, -1 the key is needed to tell. */
static int size_allowed(const ps_reader *r, const uint8_t *p, size_t avail,
                        uint32_t size)
{
    if (!r->max_frame || size <= r->max_frame)
        return 1;
    if (size > r->max_deliver)
        return 0;
    if (avail < 6)
        return -1;
    return ps_be16(p + 4) == PS_KEY_DELIVER;
}

int ps_reader_next(ps_reader *r, const uint8_t **frame, uint32_t *len,
                   ps_error *err)
{
    size_t avail = r->wpos - r->rpos;
    if (avail < 4)
        return PS_NEED_MORE;
    const uint8_t *p = r->buf + r->rpos;
    uint32_t size = ps_be32(p);
    int allowed = size_allowed(r, p, avail, size);
    if (allowed < 0)
        return PS_NEED_MORE;
    if (!allowed)
        return ps_fail(err, PS_E_FRAME_TOO_LARGE, r->consumed,
                       "frame size prefix exceeds max_frame_size");
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
    int allowed = size_allowed(r, r->buf + r->rpos, avail, size);
    if (allowed < 0)
        return 6 - avail;   /* the key decides */
    if (!allowed)
        return 0;           /* ps_reader_next reports it; do not grow for it */
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
