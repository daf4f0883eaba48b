/* Preloaded (LD_PRELOAD) into a benchmark's client process on a CPU with
 * VPCLMULQDQ: ISA-L's crc32_gzip_refl as its dispatcher picks it on an
 * x86-64 CPU with AVX2 and PCLMULQDQ only (AMD Zen 2, Intel Skylake and
 * Cascade Lake): the by8_02 fold. Only pystream's CRC path changes; it
 * links ISA-L dynamically in the development build this is used with. */
#include <stdint.h>

uint32_t crc32_gzip_refl_by8_02(uint32_t crc, const unsigned char *buf, uint64_t len);

uint32_t crc32_gzip_refl(uint32_t crc, const unsigned char *buf, uint64_t len)
{
    return crc32_gzip_refl_by8_02(crc, buf, len);
}
