/* Big-endian loads: the stream protocol and AMQP 1.0 are big-endian. */
#ifndef PS_WIRE_H
#define PS_WIRE_H

#include <stdint.h>
#include <string.h>

static inline uint16_t ps_be16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return __builtin_bswap16(v);
}

static inline uint32_t ps_be32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}

static inline uint64_t ps_be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

#endif
