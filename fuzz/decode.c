/* libFuzzer harness over the C core's byte entry points.
 *
 * The first input byte picks the options and the entry point; the rest is
 *   - size-prefixed Deliver frames for ps_decode_buffer (frame, chunk,
 *     entries, codecs, AMQP), or
 *   - with bit 7 set, one AMQP 1.0 message for ps_batch_add directly.
 * The same bytes also go through the frame reader (small frame limits, so
 * the Deliver exception is exercised), fed in pieces of 1 to 64 bytes.
 * After a successful decode every binary view must lie inside its buffer.
 * The CRC-32 of the input, split where its first byte says, must combine
 * from its two halves (the stream decoder's two-core check), and a Deliver
 * frame's CRC begun piece by piece as the reader got them must finish as
 * its entries' CRC.
 *
 * A single message (bit 7) is also rendered directly: every section and
 * every item of it as text, within the record's budget or, with bit 4
 * clear, a tight one picked by the low bits; the text must never pass the
 * budget, every byte written must be taken from it, and the renderer's
 * steps must stay within a constant of the bytes read and written (a
 * bomb, which renders more than the budget, must stop at it).  The text
 * columns ps_batch_add filled stay within the budget too. */
#include <stdio.h>
#include <stdlib.h>

#include "amqp.h"
#include "chunk.h"
#include "crc.h"
#include "export.h"

/* Steps per byte read or written, and per value rendered, that the renderer
 * may take: each step writes a run of text or starts a value. */
#define STEPS_PER_BYTE 16

/* Render v into out against r: what ps_amqp_render returned. */
static int check_text(const ps_value *v, ps_buf *out, ps_render *r, size_t budget,
                      size_t n)
{
    int rc = ps_amqp_render(v, out, r);
    if (out->len > budget || out->len != budget - r->left) {
        fprintf(stderr, "rendered %zu bytes, budget %zu, left %zu\n", out->len,
                budget, r->left);
        abort();
    }
    if ((rc == PS_RENDER_OVER && !r->over) || (rc == PS_RENDER_MALFORMED && r->over))
        abort();            /* the budget's error, and only it, says it ran out */
    if (r->steps > STEPS_PER_BYTE * ((uint64_t)n + out->len) + 64) {
        fprintf(stderr, "%llu steps for %zu bytes read, %zu written\n",
                (unsigned long long)r->steps, n, out->len);
        abort();
    }
    return rc;
}

static void check_render(const uint8_t *msg, size_t n, uint8_t mode)
{
    ps_amqp_msg m;
    ps_error err;
    if (ps_amqp_scan(msg, n, &m, &err) != PS_OK)
        return;
    const ps_value *sections[] = {&m.header, &m.message_annotations, &m.properties,
                                  &m.application_properties, &m.footer, &m.value};
    size_t budget = (mode & 0x10) ? ps_render_budget(n) : (size_t)(mode & 0x0f) * 37;
    ps_buf out = {0};
    ps_render whole = {budget, 0, 0}, items = {budget, 0, 0};
    for (size_t s = 0; s < sizeof sections / sizeof *sections; s++) {
        const ps_value *v = sections[s];
        if (v->start && check_text(v, &out, &whole, budget, n) == PS_RENDER_OVER)
            break;
    }
    ps_buf_free(&out);
    /* each item on its own, as the columns render them (they stop at the
     * first that fails) */
    for (size_t s = 0; s < sizeof sections / sizeof *sections && !items.over; s++) {
        const ps_value *c = sections[s];
        const uint8_t *it = NULL;
        uint32_t i = 0;
        ps_value item;
        if (!c->start || c->code < 0xc0)
            continue;
        while (ps_amqp_next_item(c, &it, &i, &item) == 0 &&
               check_text(&item, &out, &items, budget, n) == 0) {
        }
    }
    ps_buf_free(&out);
}

/* The text ps_batch_add wrote for one message's optional columns. */
static size_t text_written(const ps_batch *b)
{
    const ps_col *cols[] = {&b->app_keys, &b->app_values, &b->ann_keys, &b->ann_values,
                            &b->foot_keys, &b->foot_values};
    size_t total = 0;
    for (int f = 0; f < PS_PROP_FIELDS; f++)
        if (f != 1)         /* user-id: bytes as they are, not rendered */
            total += b->prop[f].data.len;
    for (size_t i = 0; i < sizeof cols / sizeof *cols; i++)
        total += cols[i]->data.len;
    return total;
}

static void check_crc_combine(const uint8_t *data, size_t size, uint8_t mode)
{
    size_t split = size * mode / 255;
    uint32_t whole = ps_crc32(0, data, size);
    if (ps_crc32_combine(ps_crc32(0, data, split), ps_crc32(0, data + split, size - split),
                         size - split) != whole)
        abort();
}

/* A Deliver frame's CRC begun as its pieces came in (ps_crc_ahead), then
 * finished, is the CRC of its entries; its walk of the entry headers gives
 * the size the walk in one go gives. */
static void check_crc_ahead(ps_crc_ahead *a, const uint8_t *frame, uint32_t len,
                            uint64_t pos)
{
    ps_chunk c;
    ps_error err;
    uint32_t done;
    if (len < 2 || ps_frame_key(frame) != PS_KEY_DELIVER ||
        ps_deliver_parse(frame, len, pos, &c, &err) != PS_OK)
        return;
    ps_size_walk walk;
    uint32_t crc = ps_crc_ahead_take(a, &c, &done, &walk);
    if (ps_crc32(crc, c.data + done, c.data_len - done) != ps_crc32(0, c.data, c.data_len))
        abort();
    /* the walk of the headers as they came, finished, is the walk in one go */
    ps_size_walk_step(&walk, &c, c.data_len);
    if (walk.size != ps_chunk_inflated_size(&c))
        abort();
}

static void read_frames(const uint8_t *data, size_t size, uint8_t mode)
{
    uint8_t *buf = malloc(size ? size : 1);
    ps_reader r = {.buf = buf, .cap = size, .max_frame = 64,
                   .max_deliver = (mode & 1) ? 4096 : 0};
    ps_crc_ahead ahead = {0};
    size_t fed = 0, step = 1 + mode % 64;
    while (fed < size) {
        size_t n = size - fed < step ? size - fed : step;
        if (ps_reader_missing(&r) > 4 + 4096)
            abort();        /* never more than the largest allowed frame */
        memcpy(buf + r.wpos, data + fed, n);
        r.wpos += n;
        fed += n;
        const uint8_t *frame;
        uint32_t len;
        ps_error err;
        int rc;
        while ((rc = ps_reader_next(&r, &frame, &len, &err)) == PS_OK) {
            if (frame < buf || frame + len > buf + r.wpos)
                abort();
            check_crc_ahead(&ahead, frame, len, r.consumed - len);
        }
        if (rc != PS_NEED_MORE)
            break;
        if (r.wpos - r.rpos > 4)    /* a frame begun: as the stream decoder does */
            ps_crc_ahead_advance(&ahead, buf + r.rpos + 4, r.wpos - r.rpos - 4,
                                 r.consumed + 4);
    }
    free(buf);
}

static void check_views(const ps_batch *b)
{
    for (size_t i = 0; i < b->rows && !b->opt.body_binary; i++) {
        const uint8_t *v = b->views.p + 16 * i;
        int32_t len, idx, off;
        memcpy(&len, v, 4);
        memcpy(&idx, v + 8, 4);
        memcpy(&off, v + 12, 4);
        if (len <= 12)
            continue;
        if (idx < 0 || (size_t)idx >= b->nregions || off < 0 ||
            (size_t)off + (size_t)len > b->regions[idx].len) {
            fprintf(stderr, "view %zu out of bounds\n", i);
            abort();
        }
    }
}

static int drops;

static void drop(void *owner)
{
    (void)owner;
    drops++;
}

/* Export the batch (ps_batch_export): the array's views stay within its own
 * data buffers (their sizes in its last buffer), binary offsets rise from 0,
 * and one release frees everything and drops the owner once. The batch is
 * reset meanwhile, as the Cython layer does, before the array is gone. */
static void check_export(ps_batch *b)
{
    struct ArrowArray a;
    size_t rows = b->rows;
    if (!ps_batch_exportable(b))
        return;
    drops = 0;
    if (ps_batch_export(b, &a, drop, b) != PS_OK)
        return;
    if (a.length != (int64_t)rows || a.n_children != 3 || !a.release)
        abort();
    struct ArrowArray *body = a.children[2];
    if (b->opt.body_binary) {
        const int32_t *offs = body->buffers[1];
        for (size_t i = 0; i < rows; i++)
            if (offs[0] != 0 || offs[i + 1] < offs[i])
                abort();
    } else {
        int64_t regions = body->n_buffers - 3;
        const int64_t *sizes = body->buffers[body->n_buffers - 1];
        const uint8_t *views = body->buffers[1];
        for (size_t i = 0; i < rows; i++) {
            int32_t len, idx, off;
            memcpy(&len, views + 16 * i, 4);
            memcpy(&idx, views + 16 * i + 8, 4);
            memcpy(&off, views + 16 * i + 12, 4);
            if (len > 12 && (idx < 0 || idx >= regions || off < 0 ||
                             (int64_t)off + len > sizes[idx]))
                abort();
        }
    }
    if (ps_batch_reset(b) != PS_OK)
        abort();
    a.release(&a);
    if (a.release || drops != 1)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    ps_options o = {
        .crc = mode & 1,
        .amqp = !(mode & 2) || (mode & 0x20),
        .body_binary = (mode & 4) != 0,
        .error_policy = (mode >> 3) % 3,
        .columns = (mode & 0x20) ? 31 : 0,  /* every optional column */
        .start_offset = (mode & 0x40) ? 5 : 0,
        .max_subbatch = 1 << 20,
        .max_chunk = 4 << 20,
    };
    ps_batch b;
    ps_error err;
    if (ps_batch_init(&b, &o))
        return 0;
    /* a copy, so that ASan sees reads past the end of the input */
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    int rc;
    if (mode & 0x80) {
        int region = ps_batch_input_region(&b, copy, size);
        rc = ps_batch_add(&b, copy, (uint32_t)size, region, 0, 0, 0, &err);
        if (text_written(&b) > ps_render_budget(size))
            abort();
        check_render(copy, size, mode);
    } else {
        rc = ps_decode_buffer(copy, size, &b, &err);
    }
    if (rc == PS_OK) {
        check_views(&b);
        check_export(&b);
        /* the reset batch, its allocations kept, decodes alike again */
        if (!(mode & 0x80) && ps_batch_reset(&b) == PS_OK &&
            ps_decode_buffer(copy, size, &b, &err) == PS_OK)
            check_views(&b);
    } else if (!err.what) {
        abort();            /* every error names what was wrong */
    }
    ps_batch_free(&b);
    free(copy);
    read_frames(data, size, mode);
    check_crc_combine(data, size, mode);
    return 0;
}
