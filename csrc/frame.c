#include <string.h>

#include "frame.h"
#include "wire.h"

int ps_reader_next(ps_reader *r, const uint8_t **frame, uint32_t *len,
                   ps_error *err)
{
    size_t avail = r->wpos - r->rpos;
    if (avail < 4)
        return PS_NEED_MORE;
    const uint8_t *p = r->buf + r->rpos;
    uint32_t size = ps_be32(p);
    if (r->max_frame && size > r->max_frame)
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
    uint64_t want = 4 + (uint64_t)ps_be32(r->buf + r->rpos);
    if (r->max_frame && want > 4 + (uint64_t)r->max_frame)
        return 0;           /* ps_reader_next reports it; do not grow for it */
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
