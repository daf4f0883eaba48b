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
 * its entries' CRC. */
#include <stdio.h>
#include <stdlib.h>

#include "chunk.h"
#include "crc.h"

static void check_crc_combine(const uint8_t *data, size_t size, uint8_t mode)
{
    size_t split = size * mode / 255;
    uint32_t whole = ps_crc32(0, data, size);
    if (ps_crc32_combine(ps_crc32(0, data, split), ps_crc32(0, data + split, size - split),
                         size - split) != whole)
        abort();
}

/* A Deliver frame's CRC begun as its pieces came in (ps_crc_ahead), then
 * finished, is the CRC of its entries. */
static void check_crc_ahead(ps_crc_ahead *a, const uint8_t *frame, uint32_t len,
                            uint64_t pos)
{
    ps_chunk c;
    ps_error err;
    uint32_t done;
    if (len < 2 || ps_frame_key(frame) != PS_KEY_DELIVER ||
        ps_deliver_parse(frame, len, pos, &c, &err) != PS_OK)
        return;
    uint32_t crc = ps_crc_ahead_take(a, &c, &done);
    if (ps_crc32(crc, c.data + done, c.data_len - done) != ps_crc32(0, c.data, c.data_len))
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
    } else {
        rc = ps_decode_buffer(copy, size, &b, &err);
    }
    if (rc == PS_OK)
        check_views(&b);
    else if (!err.what)
        abort();            /* every error names what was wrong */
    ps_batch_free(&b);
    free(copy);
    read_frames(data, size, mode);
    check_crc_combine(data, size, mode);
    return 0;
}
