/* A growable byte buffer: the storage of every column the C core builds.
 * The Cython layer takes ownership of `p` (malloc'd) when it exports a
 * column to Arrow. */
#ifndef PS_BUF_H
#define PS_BUF_H

#include <stdlib.h>
#include <string.h>

#include "status.h"

typedef struct ps_buf {
    uint8_t *p;
    size_t len;
    size_t cap;
} ps_buf;

int ps_buf_grow(ps_buf *b, size_t extra);

/* Ask for 2 MiB pages over the whole ones in [p, p+cap): one page fault
 * where there were 512, for memory written soon after it is allocated. */
void ps_advise_huge(uint8_t *p, size_t cap);

/* Room for `extra` more bytes (and p != NULL); 0 on success, PS_E_NOMEM
 * otherwise. */
static inline int ps_buf_reserve(ps_buf *b, size_t extra)
{
    return b->p && extra <= b->cap - b->len ? 0 : ps_buf_grow(b, extra);
}

static inline int ps_buf_put(ps_buf *b, const void *p, size_t n)
{
    if (ps_buf_reserve(b, n))
        return PS_E_NOMEM;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static inline void ps_buf_free(ps_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

#endif
