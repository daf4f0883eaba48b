#include "buf.h"

int ps_buf_grow(ps_buf *b, size_t extra)
{
    size_t need = b->len + extra;
    if (need < b->len)
        return PS_E_NOMEM;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return PS_E_NOMEM;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return PS_E_NOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}
