#include <isa-l/crc.h>

#include "crc.h"

uint32_t ps_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
    /* ISA-L's gzip variant applies zlib's pre/post inversion itself */
    return crc32_gzip_refl(crc, p, (uint64_t)n);
}

uint32_t ps_crc32c(const uint8_t *p, size_t n)
{
    /* ISA-L's iSCSI variant leaves the inversion to the caller */
    return ~crc32_iscsi((unsigned char *)p, (int)n, 0xFFFFFFFFu);
}
