/* CRC-32 (IEEE 802.3, zlib's crc32) for chunk entries and CRC-32C
 * (Castagnoli) for snappy's framing format.  Both come from ISA-L, whose
 * PCLMULQDQ / VPCLMULQDQ folding runs at tens of GB/s and which dispatches
 * to a portable table version on CPUs without them; CRC-32 of 512 bytes and
 * more folds 256 bits at a time here on CPUs with VPCLMULQDQ but no AVX-512
 * (ISA-L's wide variant needs AVX-512, and is twice as fast).
 *
 * Built with PS_WITHOUT_ISAL (a source build where ISA-L is missing), CRC-32
 * is zlib's crc32 and CRC-32C a table; the results are the same. */
#ifndef PS_CRC_H
#define PS_CRC_H

#include <stddef.h>
#include <stdint.h>

/* zlib-compatible: ps_crc32(ps_crc32(0, a), b) == crc32 of a + b. */
uint32_t ps_crc32(uint32_t crc, const uint8_t *p, size_t n);

/* ps_crc32 computed by the 256-bit folding wherever the CPU can run it,
 * even where ps_crc32 prefers ISA-L's wider one (so tests check it on
 * any such CPU); ISA-L elsewhere. */
uint32_t ps_crc32_fold256(uint32_t crc, const uint8_t *p, size_t n);

/* The CRC-32 of a + b from crc_a = ps_crc32(0, a) and crc_b = ps_crc32(0, b),
 * len_b the length of b: halves of a buffer checked on two cores combine
 * into the CRC of the whole. */
uint32_t ps_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* Plain CRC-32C of p (initial value all ones, final xor), as snappy uses. */
uint32_t ps_crc32c(const uint8_t *p, size_t n);

/* Which code computes ps_crc32 on this build and CPU, in words ("ISA-L
 * crc32_gzip_refl by16_10 (AVX-512+VPCLMULQDQ)", "zlib crc32", ...).
 * ISA-L does not say which variant its dispatcher chose: for its share this
 * names the variant the dispatcher picks from the CPU features it keys on. */
const char *ps_crc32_implementation(void);

#endif
