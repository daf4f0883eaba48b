#include "export.h"

enum { KIDS = 3 };          /* offset, chunk_timestamp, body */

/* Everything an exported batch holds, freed by the root's release. The
 * buffer lists of the body and what to free follow it in one allocation. */
typedef struct export_priv {
    struct ArrowArray kids[KIDS];
    struct ArrowArray *kid_ptrs[KIDS];
    const void *root_bufs[1];
    const void *offset_bufs[2];
    const void *timestamp_bufs[2];
    const void **body_bufs;     /* validity, views, regions, their sizes;
                                 * or validity, offsets, data */
    int64_t *sizes;
    void **owned;
    size_t nowned;
    ps_drop_fn drop;
    void *owner;
} export_priv;

/* What a buffer of no rows points at: importers want a pointer. */
static const int64_t NOTHING[2];

static void release_kid(struct ArrowArray *a)
{
    a->release = NULL;          /* its buffers are the root's to free */
}

static void release_root(struct ArrowArray *a)
{
    export_priv *p = a->private_data;
    for (int i = 0; i < KIDS; i++)
        if (p->kids[i].release)
            p->kids[i].release(&p->kids[i]);
    for (size_t i = 0; i < p->nowned; i++)
        free(p->owned[i]);
    if (p->drop)
        p->drop(p->owner);
    free(p);
    a->release = NULL;
}

static void kid(struct ArrowArray *k, int64_t rows, int64_t nbufs, const void **bufs)
{
    *k = (struct ArrowArray){.length = rows, .n_buffers = nbufs, .buffers = bufs,
                             .release = release_kid};
}

/* The buffer's memory, now the export's (b keeps an empty buffer). */
static const void *move(export_priv *p, ps_buf *b)
{
    const void *m = b->p ? (const void *)b->p : (const void *)NOTHING;
    if (b->p)
        p->owned[p->nowned++] = b->p;
    b->p = NULL;
    b->len = b->cap = 0;
    return m;
}

int ps_batch_export(ps_batch *b, struct ArrowArray *out, ps_drop_fn drop,
                    void *owner)
{
    int binary = b->opt.body_binary;
    size_t n = binary ? 0 : b->nregions;
    size_t body_bufs = 3 + n;   /* validity, views, n regions, sizes */
    size_t owned = 4 + n;       /* offset, timestamp, views or offsets and
                                 * data, owned regions, a validity bitmap */
    export_priv *p = malloc(sizeof *p + (body_bufs + owned) * sizeof(void *)
                            + n * sizeof(int64_t));
    if (!p)
        return PS_E_NOMEM;
    p->body_bufs = (const void **)(p + 1);
    p->owned = (void **)(p->body_bufs + body_bufs);
    p->sizes = (int64_t *)(p->owned + owned);
    p->nowned = 0;
    p->drop = drop;
    p->owner = owner;
    int64_t rows = (int64_t)b->rows;

    p->offset_bufs[0] = NULL;
    p->offset_bufs[1] = move(p, &b->offset);
    p->timestamp_bufs[0] = NULL;
    p->timestamp_bufs[1] = move(p, &b->timestamp);
    p->body_bufs[0] = NULL;
    if (binary) {               /* no nulls: the bitmap is not handed over */
        p->body_bufs[1] = move(p, &b->body.values);
        p->body_bufs[2] = move(p, &b->body.data);
        if (b->body.validity.p)
            p->owned[p->nowned++] = b->body.validity.p;
        b->body.validity.p = NULL;
        b->body.validity.len = b->body.validity.cap = 0;
    } else {
        p->body_bufs[1] = move(p, &b->views);
    }
    for (size_t i = 0; i < n; i++) {
        ps_region *r = &b->regions[i];
        if (r->own.p) {         /* decompressed or joined: ours to hand over */
            p->body_bufs[2 + i] = r->own.p;
            p->sizes[i] = (int64_t)r->own.len;
            p->owned[p->nowned++] = r->own.p;
            r->own.p = NULL;
            r->own.len = r->own.cap = 0;
        } else {                /* the input: the owner's */
            p->body_bufs[2 + i] = r->base ? (const void *)r->base : (const void *)NOTHING;
            p->sizes[i] = (int64_t)r->len;
        }
    }
    if (!binary)
        p->body_bufs[2 + n] = n ? (const void *)p->sizes : (const void *)NOTHING;

    kid(&p->kids[0], rows, 2, p->offset_bufs);
    kid(&p->kids[1], rows, 2, p->timestamp_bufs);
    kid(&p->kids[2], rows, binary ? 3 : (int64_t)body_bufs, p->body_bufs);
    for (int i = 0; i < KIDS; i++)
        p->kid_ptrs[i] = &p->kids[i];
    p->root_bufs[0] = NULL;
    *out = (struct ArrowArray){.length = rows, .n_buffers = 1, .n_children = KIDS,
                               .buffers = p->root_bufs, .children = p->kid_ptrs,
                               .release = release_root, .private_data = p};
    return PS_OK;
}
