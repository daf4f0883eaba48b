/* Sub-batch codecs of the stream protocol, same numbering in every client:
 * 0 none, 1 gzip (RFC 1952), 2 snappy framing format, 3 lz4 frame format,
 * 4 zstd frame.  The broker never decompresses, so the compressed bytes come
 * straight from a publisher: every decoder here writes at most `cap` bytes
 * and reports how many it produced, so the caller can enforce the announced
 * length. */
#ifndef PS_CODEC_H
#define PS_CODEC_H

#include "status.h"

enum { PS_CODEC_NONE = 0, PS_CODEC_GZIP, PS_CODEC_SNAPPY, PS_CODEC_LZ4,
       PS_CODEC_ZSTD, PS_CODEC_COUNT };

/* Reusable (de)compression contexts, made on first use (one per decoder or
 * encoder: not thread-safe). */
typedef struct ps_codecs ps_codecs;

ps_codecs *ps_codecs_new(void);

/* Whether this build can (de)compress the codec; a known codec it lacks
 * (a source build without the library) makes ps_decompress and ps_compress
 * fail with PS_E_CODEC_MISSING, naming the codec and its library. */
int ps_codec_available(int codec);
void ps_codecs_free(ps_codecs *c);

/* Decompress src into dst[0..cap) (codecs 1-4; codec 0 needs no copy).  On success *out_len is the number of
 * bytes produced; PS_E_LIMIT if the data would produce more than cap bytes,
 * PS_E_CHUNK if it is not valid for the codec.  `pos` is the stream position
 * of src, for errors. */
int ps_decompress(ps_codecs *c, int codec, const uint8_t *src, size_t n,
                  uint8_t *dst, size_t cap, size_t *out_len, uint64_t pos,
                  ps_error *err);

/* Compression, the producer side: the formats above as every client reads
 * them (gzip one member, snappy framing with a masked CRC-32C per chunk, lz4
 * frame, zstd frame), at each library's default level. */

/* Most bytes ps_compress produces from n input bytes (codecs 1-4; n for 0). */
size_t ps_compress_bound(int codec, size_t n);

/* Compress src[0..n) (n < 4 GiB) into dst, which has room for
 * ps_compress_bound(codec, n) bytes; *out_len is the size produced.
 * PS_E_NOMEM if a context cannot be made or the library fails. */
int ps_compress(ps_codecs *c, int codec, const uint8_t *src, size_t n,
                uint8_t *dst, size_t *out_len, ps_error *err);

#endif
