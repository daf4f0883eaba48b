#include <stdlib.h>
#include <string.h>

/* zlib is required; a source build without lz4, zstd or snappy defines
 * PS_WITHOUT_<NAME> (setup.py) and such sub-batches fail with
 * PS_E_CODEC_MISSING when they come, not before. */
#ifndef PS_WITHOUT_LZ4
#include <lz4frame.h>
#endif
#ifndef PS_WITHOUT_SNAPPY
#include <snappy-c.h>
#endif
#include <zlib.h>
#ifndef PS_WITHOUT_ZSTD
#include <zstd.h>
#include <zstd_errors.h>
#endif

#include "codec.h"
#include "crc.h"

struct ps_codecs {
    z_stream z;
    int z_ready;
    /* compression side */
    z_stream zc;
    int zc_ready;
#ifndef PS_WITHOUT_LZ4
    LZ4F_dctx *lz4;
    LZ4F_cctx *lz4c;
#endif
#ifndef PS_WITHOUT_ZSTD
    ZSTD_DCtx *zstd;
    ZSTD_CCtx *zstdc;
#endif
};

int ps_codec_available(int codec)
{
    switch (codec) {
    case PS_CODEC_NONE:
    case PS_CODEC_GZIP:
        return 1;
#ifndef PS_WITHOUT_SNAPPY
    case PS_CODEC_SNAPPY:
        return 1;
#endif
#ifndef PS_WITHOUT_LZ4
    case PS_CODEC_LZ4:
        return 1;
#endif
#ifndef PS_WITHOUT_ZSTD
    case PS_CODEC_ZSTD:
        return 1;
#endif
    default:
        return 0;
    }
}

/* A known codec this build lacks: the error names it and its library. */
static int codec_missing(int codec, uint64_t pos, ps_error *err)
{
    static const char *const what[PS_CODEC_COUNT] = {
        [PS_CODEC_SNAPPY] = "snappy sub-batch: pystream was built without "
                            "snappy (install libsnappy and rebuild)",
        [PS_CODEC_LZ4] = "lz4 sub-batch: pystream was built without lz4 "
                         "(install liblz4 and rebuild)",
        [PS_CODEC_ZSTD] = "zstd sub-batch: pystream was built without zstd "
                          "(install libzstd and rebuild)",
    };
    return ps_fail(err, PS_E_CODEC_MISSING, pos, what[codec]);
}

static int codec_known_missing(int codec)
{
    return codec > PS_CODEC_NONE && codec < PS_CODEC_COUNT && !ps_codec_available(codec);
}

ps_codecs *ps_codecs_new(void)
{
    return calloc(1, sizeof(ps_codecs));
}

void ps_codecs_free(ps_codecs *c)
{
    if (!c)
        return;
    if (c->z_ready)
        inflateEnd(&c->z);
    if (c->zc_ready)
        deflateEnd(&c->zc);
#ifndef PS_WITHOUT_LZ4
    LZ4F_freeDecompressionContext(c->lz4);
    LZ4F_freeCompressionContext(c->lz4c);
#endif
#ifndef PS_WITHOUT_ZSTD
    ZSTD_freeDCtx(c->zstd);
    ZSTD_freeCCtx(c->zstdc);
#endif
    free(c);
}

/* gzip: RFC 1952 members (every client writes one), one after the other up
 * to the end of src; any other bytes after a member are corrupt. */
static int gunzip(ps_codecs *c, const uint8_t *src, size_t n, uint8_t *dst,
                  size_t cap, size_t *out, uint64_t pos, ps_error *err)
{
    if (!c->z_ready) {
        if (inflateInit2(&c->z, 16 + MAX_WBITS) != Z_OK)
            return ps_fail(err, PS_E_NOMEM, pos, "zlib inflateInit2 failed");
        c->z_ready = 1;
    } else if (inflateReset(&c->z) != Z_OK) {
        return ps_fail(err, PS_E_NOMEM, pos, "zlib inflateReset failed");
    }
    /* zlib counts in uInt; sub-batches are far below 4 GiB (limits) */
    c->z.next_in = (Bytef *)src;
    c->z.avail_in = (uInt)n;
    c->z.next_out = dst;
    c->z.avail_out = (uInt)cap;
    int rc;
    while ((rc = inflate(&c->z, Z_FINISH)) == Z_STREAM_END && c->z.avail_in > 0) {
        if (c->z.avail_in < 2 || c->z.next_in[0] != 0x1f || c->z.next_in[1] != 0x8b)
            return ps_fail(err, PS_E_CHUNK, pos + (n - c->z.avail_in),
                           "bytes after the gzip member are not another member");
        if (inflateReset(&c->z) != Z_OK)
            return ps_fail(err, PS_E_NOMEM, pos, "zlib inflateReset failed");
    }
    *out = cap - c->z.avail_out;
    if (rc == Z_STREAM_END)
        return PS_OK;
    if (rc == Z_BUF_ERROR && c->z.avail_out == 0)
        return ps_fail(err, PS_E_LIMIT, pos,
                       "gzip data decompresses past its announced length");
    return ps_fail(err, PS_E_CHUNK, pos + (n - c->z.avail_in),
                   "invalid or truncated gzip data");
}

#ifndef PS_WITHOUT_SNAPPY
/* snappy framing format: chunks of `u8 type | u24le length | data`, the
 * first one the stream identifier.  Data chunks carry the masked CRC-32C of
 * their uncompressed bytes. */
static const uint8_t snappy_ident[10] = {0xff, 6, 0, 0, 's', 'N', 'a', 'P', 'p', 'Y'};

static uint32_t snappy_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static int unsnappy(const uint8_t *src, size_t n, uint8_t *dst, size_t cap,
                    size_t *out, uint64_t pos, ps_error *err)
{
    size_t i = 0, o = 0;
    if (n < sizeof snappy_ident || memcmp(src, snappy_ident, sizeof snappy_ident) != 0)
        return ps_fail(err, PS_E_CHUNK, pos, "snappy frame lacks its stream identifier");
    i = sizeof snappy_ident;
    while (i < n) {
        if (n - i < 4)
            return ps_fail(err, PS_E_CHUNK, pos + i, "truncated snappy chunk header");
        uint8_t type = src[i];
        size_t len = src[i + 1] | (size_t)src[i + 2] << 8 | (size_t)src[i + 3] << 16;
        uint64_t at = pos + i;
        i += 4;
        if (len > n - i)
            return ps_fail(err, PS_E_CHUNK, at, "snappy chunk exceeds the sub-batch");
        const uint8_t *d = src + i;
        i += len;
        if (type == 0xff) {
            if (len != 6 || memcmp(d, snappy_ident + 4, 6) != 0)
                return ps_fail(err, PS_E_CHUNK, at, "bad snappy stream identifier");
            continue;
        }
        if (type >= 0x80)        /* padding and skippable chunks */
            continue;
        if (type > 0x01)
            return ps_fail(err, PS_E_CHUNK, at, "reserved unskippable snappy chunk type");
        if (len < 4)
            return ps_fail(err, PS_E_CHUNK, at, "snappy data chunk too short for its CRC");
        uint32_t want = d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 |
                        (uint32_t)d[3] << 24;
        d += 4;
        len -= 4;
        size_t got;
        if (type == 0x00) {
            if (snappy_uncompressed_length((const char *)d, len, &got) != SNAPPY_OK)
                return ps_fail(err, PS_E_CHUNK, at, "invalid snappy block");
            if (got > cap - o)
                return ps_fail(err, PS_E_LIMIT, at,
                               "snappy data decompresses past its announced length");
            if (snappy_uncompress((const char *)d, len, (char *)dst + o, &got) != SNAPPY_OK)
                return ps_fail(err, PS_E_CHUNK, at, "invalid snappy block");
        } else {
            got = len;
            if (got > cap - o)
                return ps_fail(err, PS_E_LIMIT, at,
                               "snappy data decompresses past its announced length");
            memcpy(dst + o, d, got);
        }
        if (snappy_mask(ps_crc32c(dst + o, got)) != want)
            return ps_fail(err, PS_E_CHUNK, at, "snappy chunk CRC-32C mismatch");
        o += got;
    }
    *out = o;
    return PS_OK;
}

#endif

#ifndef PS_WITHOUT_LZ4
/* lz4 frame format: one or more frames until src is used up. */
static int unlz4(ps_codecs *c, const uint8_t *src, size_t n, uint8_t *dst,
                 size_t cap, size_t *out, uint64_t pos, ps_error *err)
{
    if (!c->lz4 && LZ4F_isError(LZ4F_createDecompressionContext(&c->lz4, LZ4F_VERSION)))
        return ps_fail(err, PS_E_NOMEM, pos, "lz4 context allocation failed");
    LZ4F_resetDecompressionContext(c->lz4);
    size_t i = 0, o = 0;
    for (;;) {
        size_t in = n - i, outn = cap - o;
        size_t hint = LZ4F_decompress(c->lz4, dst + o, &outn, src + i, &in, NULL);
        if (LZ4F_isError(hint))
            return ps_fail(err, PS_E_CHUNK, pos + i, "invalid lz4 frame data");
        i += in;
        o += outn;
        if (hint == 0 && i == n)
            break;
        if (hint != 0 && o == cap)
            return ps_fail(err, PS_E_LIMIT, pos + i,
                           "lz4 data does not end at its announced length");
        if (in == 0 && outn == 0)
            return ps_fail(err, PS_E_CHUNK, pos + i, "truncated lz4 frame");
    }
    *out = o;
    return PS_OK;
}

#endif

#ifndef PS_WITHOUT_ZSTD
static int unzstd(ps_codecs *c, const uint8_t *src, size_t n, uint8_t *dst,
                  size_t cap, size_t *out, uint64_t pos, ps_error *err)
{
    if (!c->zstd && !(c->zstd = ZSTD_createDCtx()))
        return ps_fail(err, PS_E_NOMEM, pos, "zstd context allocation failed");
    size_t rc = ZSTD_decompressDCtx(c->zstd, dst, cap, src, n);
    if (ZSTD_isError(rc)) {
        if (ZSTD_getErrorCode(rc) == ZSTD_error_dstSize_tooSmall)
            return ps_fail(err, PS_E_LIMIT, pos,
                           "zstd data decompresses past its announced length");
        return ps_fail(err, PS_E_CHUNK, pos, "invalid zstd data");
    }
    *out = rc;
    return PS_OK;
}

#endif

int ps_decompress(ps_codecs *c, int codec, const uint8_t *src, size_t n,
                  uint8_t *dst, size_t cap, size_t *out_len, uint64_t pos,
                  ps_error *err)
{
    if (codec_known_missing(codec))
        return codec_missing(codec, pos, err);
    switch (codec) {
    case PS_CODEC_GZIP:
        return gunzip(c, src, n, dst, cap, out_len, pos, err);
#ifndef PS_WITHOUT_SNAPPY
    case PS_CODEC_SNAPPY:
        return unsnappy(src, n, dst, cap, out_len, pos, err);
#endif
#ifndef PS_WITHOUT_LZ4
    case PS_CODEC_LZ4:
        return unlz4(c, src, n, dst, cap, out_len, pos, err);
#endif
#ifndef PS_WITHOUT_ZSTD
    case PS_CODEC_ZSTD:
        return unzstd(c, src, n, dst, cap, out_len, pos, err);
#endif
    default:
        return ps_fail(err, PS_E_CHUNK, pos, "unknown sub-batch codec");
    }
}

/* --- compression ---------------------------------------------------------- */

/* The framing format caps a chunk at 64 KiB of uncompressed data. */
enum { SNAPPY_BLOCK = 65536 };

#ifndef PS_WITHOUT_LZ4
/* lz4: default block size and level, no checksums (the chunk CRC covers the
 * entries); autoFlush makes one update call write every block, so the
 * bound below holds for it. */
static const LZ4F_preferences_t lz4_prefs = {.autoFlush = 1};
#endif

size_t ps_compress_bound(int codec, size_t n)
{
    switch (codec) {
    case PS_CODEC_GZIP:     /* compressBound counts zlib's 6-byte wrapper, gzip's is 18 */
        return compressBound((uLong)n) + 18;
#ifndef PS_WITHOUT_SNAPPY
    case PS_CODEC_SNAPPY: { /* identifier, then per block a header, a CRC and
                               snappy's worst case (32 + b + b/6) */
        size_t blocks = (n + SNAPPY_BLOCK - 1) / SNAPPY_BLOCK;
        return sizeof snappy_ident + blocks * (8 + 32) + n + n / 6;
    }
#endif
#ifndef PS_WITHOUT_LZ4
    case PS_CODEC_LZ4:
        return LZ4F_HEADER_SIZE_MAX + LZ4F_compressBound(n, &lz4_prefs) +
               LZ4F_compressBound(0, &lz4_prefs);
#endif
#ifndef PS_WITHOUT_ZSTD
    case PS_CODEC_ZSTD:
        return ZSTD_compressBound(n);
#endif
    default:
        return n;
    }
}

static int gzip(ps_codecs *c, const uint8_t *src, size_t n, uint8_t *dst,
                size_t *out, ps_error *err)
{
    if (!c->zc_ready) {
        if (deflateInit2(&c->zc, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS,
                         8, Z_DEFAULT_STRATEGY) != Z_OK)
            return ps_fail(err, PS_E_NOMEM, 0, "zlib deflateInit2 failed");
        c->zc_ready = 1;
    } else if (deflateReset(&c->zc) != Z_OK) {
        return ps_fail(err, PS_E_NOMEM, 0, "zlib deflateReset failed");
    }
    c->zc.next_in = (Bytef *)src;
    c->zc.avail_in = (uInt)n;
    c->zc.next_out = dst;
    c->zc.avail_out = (uInt)ps_compress_bound(PS_CODEC_GZIP, n);
    /* with room for the bound, one Z_FINISH call writes the whole member */
    if (deflate(&c->zc, Z_FINISH) != Z_STREAM_END)
        return ps_fail(err, PS_E_NOMEM, 0, "zlib deflate failed");
    *out = c->zc.total_out;
    return PS_OK;
}

#ifndef PS_WITHOUT_SNAPPY
/* `u8 type | u24le length | u32le masked CRC-32C` */
static void snappy_chunk_header(uint8_t *p, uint8_t type, size_t len, uint32_t crc)
{
    p[0] = type;
    p[1] = (uint8_t)len;
    p[2] = (uint8_t)(len >> 8);
    p[3] = (uint8_t)(len >> 16);
    p[4] = (uint8_t)crc;
    p[5] = (uint8_t)(crc >> 8);
    p[6] = (uint8_t)(crc >> 16);
    p[7] = (uint8_t)(crc >> 24);
}

static int snappy(const uint8_t *src, size_t n, uint8_t *dst, size_t *out,
                  ps_error *err)
{
    size_t o = sizeof snappy_ident;
    memcpy(dst, snappy_ident, sizeof snappy_ident);
    for (size_t i = 0; i < n;) {
        size_t b = n - i < SNAPPY_BLOCK ? n - i : SNAPPY_BLOCK;
        size_t len = snappy_max_compressed_length(b);
        uint8_t type = 0x00;
        if (snappy_compress((const char *)src + i, b, (char *)dst + o + 8, &len) != SNAPPY_OK)
            return ps_fail(err, PS_E_NOMEM, 0, "snappy compression failed");
        if (len >= b) {     /* incompressible: an uncompressed chunk is smaller */
            type = 0x01;
            len = b;
            memcpy(dst + o + 8, src + i, b);
        }
        snappy_chunk_header(dst + o, type, len + 4, snappy_mask(ps_crc32c(src + i, b)));
        o += 8 + len;
        i += b;
    }
    *out = o;
    return PS_OK;
}

#endif

#ifndef PS_WITHOUT_LZ4
static int lz4(ps_codecs *c, const uint8_t *src, size_t n, uint8_t *dst,
               size_t *out, ps_error *err)
{
    if (!c->lz4c && LZ4F_isError(LZ4F_createCompressionContext(&c->lz4c, LZ4F_VERSION)))
        return ps_fail(err, PS_E_NOMEM, 0, "lz4 context allocation failed");
    size_t cap = ps_compress_bound(PS_CODEC_LZ4, n), o, r;
    o = LZ4F_compressBegin(c->lz4c, dst, cap, &lz4_prefs);
    if (LZ4F_isError(o))
        return ps_fail(err, PS_E_NOMEM, 0, "lz4 compression failed");
    r = LZ4F_compressUpdate(c->lz4c, dst + o, cap - o, src, n, NULL);
    if (LZ4F_isError(r))
        return ps_fail(err, PS_E_NOMEM, 0, "lz4 compression failed");
    o += r;
    r = LZ4F_compressEnd(c->lz4c, dst + o, cap - o, NULL);
    if (LZ4F_isError(r))
        return ps_fail(err, PS_E_NOMEM, 0, "lz4 compression failed");
    *out = o + r;
    return PS_OK;
}

#endif

#ifndef PS_WITHOUT_ZSTD
static int zstd(ps_codecs *c, const uint8_t *src, size_t n, uint8_t *dst,
                size_t *out, ps_error *err)
{
    if (!c->zstdc && !(c->zstdc = ZSTD_createCCtx()))
        return ps_fail(err, PS_E_NOMEM, 0, "zstd context allocation failed");
    size_t r = ZSTD_compressCCtx(c->zstdc, dst, ZSTD_compressBound(n), src, n,
                                 ZSTD_CLEVEL_DEFAULT);
    if (ZSTD_isError(r))
        return ps_fail(err, PS_E_NOMEM, 0, "zstd compression failed");
    *out = r;
    return PS_OK;
}

#endif

int ps_compress(ps_codecs *c, int codec, const uint8_t *src, size_t n,
                uint8_t *dst, size_t *out_len, ps_error *err)
{
    if (codec_known_missing(codec))
        return codec_missing(codec, 0, err);
    switch (codec) {
    case PS_CODEC_GZIP:
        return gzip(c, src, n, dst, out_len, err);
#ifndef PS_WITHOUT_SNAPPY
    case PS_CODEC_SNAPPY:
        return snappy(src, n, dst, out_len, err);
#endif
#ifndef PS_WITHOUT_LZ4
    case PS_CODEC_LZ4:
        return lz4(c, src, n, dst, out_len, err);
#endif
#ifndef PS_WITHOUT_ZSTD
    case PS_CODEC_ZSTD:
        return zstd(c, src, n, dst, out_len, err);
#endif
    default:
        return ps_fail(err, PS_E_PROTOCOL, 0, "unknown sub-batch codec");
    }
}
