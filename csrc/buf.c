#define _DEFAULT_SOURCE     /* madvise */
#include <stdint.h>
#include <sys/mman.h>

#include "buf.h"

/* Columns of a large batch are fresh memory each time (Arrow takes them), so
 * page faults cost more than the copying: ask for 2 MiB pages on the big
 * ones (glibc serves them with mmap), one fault where there were 512. */
enum { HUGE_PAGE = 2u << 20 };

void ps_advise_huge(uint8_t *p, size_t cap)
{
#ifdef MADV_HUGEPAGE
    uintptr_t start = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    uintptr_t end = ((uintptr_t)p + cap) & ~(uintptr_t)(HUGE_PAGE - 1);
    if (end > start)
        madvise((void *)start, end - start, MADV_HUGEPAGE);
#else
    (void)p;
    (void)cap;
#endif
}

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
    if (cap >= 2 * (size_t)HUGE_PAGE)
        ps_advise_huge(p, cap);
    b->p = p;
    b->cap = cap;
    return 0;
}
