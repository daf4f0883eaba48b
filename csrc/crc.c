#include <string.h>

#ifdef PS_WITHOUT_ISAL
#include <pthread.h>
#include <zlib.h>
#else
#include <isa-l/crc.h>
#endif

#include "crc.h"

/* CRC-32 with zlib's pre- and post-inversion, by whichever library the
 * build has: the 256-bit folding below finishes with it too. */
static uint32_t crc32_lib(uint32_t crc, const uint8_t *p, size_t n)
{
#ifdef PS_WITHOUT_ISAL
    /* crc32_z takes a size_t: no 4 GiB split needed */
    return (uint32_t)crc32_z(crc, p, n);
#else
    /* ISA-L's gzip variant applies zlib's pre/post inversion itself */
    return crc32_gzip_refl(crc, p, (uint64_t)n);
#endif
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PS_CRC_FOLD256 1
#elif defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

/* cpu_crc() bits: VPCLMULQDQ with AVX2 (crc32_fold256 can run) and the
 * AVX-512 subsets ISA-L's wide variant asks for (it then folds 512 bits at
 * a time, about twice the speed of crc32_fold256). */
enum { FOLD256_RUNS = 1, ISAL_WIDE = 2 };

#ifdef PS_CRC_FOLD256
/* ISA-L folds 16 bytes per carry-less multiply but its wider variant needs
 * AVX-512; CPUs with VPCLMULQDQ and only AVX2 (AMD Zen 3) fold 32 here.
 * Four 256-bit accumulators take 128 bytes a round, each 128-bit lane
 * folded 1024 bits on: low half times x^(1024+32) mod P, high half times
 * x^(1024-32) mod P (both bit-reflected, as the CRC is).  The folded 128
 * bytes are congruent modulo P to everything before the tail and end where
 * it did, so ISA-L finishes over them and the tail (register started at 0:
 * the caller's initial value goes into the first 4 bytes instead). */
enum { FOLD_MIN = 512 };

__attribute__((target("avx2,vpclmulqdq")))
static uint32_t crc32_fold256(uint32_t crc, const uint8_t *p, size_t n)
{
    const __m256i k = _mm256_set_epi64x(0x14a7fe880, 0x1e88ef372,
                                        0x14a7fe880, 0x1e88ef372);
    __m256i a[4];
    for (int i = 0; i < 4; i++)
        a[i] = _mm256_loadu_si256((const __m256i *)(p + 32 * i));
    a[0] = _mm256_xor_si256(a[0], _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, (int)~crc));
    p += 128;
    n -= 128;
    while (n >= 128) {
        for (int i = 0; i < 4; i++) {
            __m256i lo = _mm256_clmulepi64_epi128(a[i], k, 0x00);
            __m256i hi = _mm256_clmulepi64_epi128(a[i], k, 0x11);
            a[i] = _mm256_xor_si256(_mm256_xor_si256(lo, hi),
                                    _mm256_loadu_si256((const __m256i *)(p + 32 * i)));
        }
        p += 128;
        n -= 128;
    }
    uint8_t rest[256];
    for (int i = 0; i < 4; i++)
        _mm256_storeu_si256((__m256i *)(rest + 32 * i), a[i]);
    memcpy(rest + 128, p, n);
    return crc32_lib(0xFFFFFFFFu, rest, 128 + n);
}

static int cpu_crc(void)
{
    static int cpu = -1;
    if (cpu < 0) {
        __builtin_cpu_init();
        int clmul = __builtin_cpu_supports("vpclmulqdq");
        cpu = (clmul && __builtin_cpu_supports("avx2") ? FOLD256_RUNS : 0)
            | (clmul && __builtin_cpu_supports("avx512f")
               && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")
               && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd")
               ? ISAL_WIDE : 0);
    }
    return cpu;
}
#else
static int cpu_crc(void)
{
    return 0;
}
#endif

/* CRC-32 by the 256-bit folding if fold (and it can run), else the
 * library's. */
static uint32_t crc32_by(int fold, uint32_t crc, const uint8_t *p, size_t n)
{
#ifdef PS_CRC_FOLD256
    if (fold && n >= FOLD_MIN)
        return crc32_fold256(crc, p, n);
#else
    (void)fold;
#endif
    return crc32_lib(crc, p, n);
}

uint32_t ps_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
    return crc32_by(cpu_crc() == FOLD256_RUNS, crc, p, n);
}

uint32_t ps_crc32_fold256(uint32_t crc, const uint8_t *p, size_t n)
{
    return crc32_by(cpu_crc() & FOLD256_RUNS, crc, p, n);
}

/* Polynomials over GF(2) modulo the CRC-32 polynomial, bit-reflected as the
 * CRC is: bit 31 holds the coefficient of x^0, bit 0 that of x^31. */
enum { REFLECTED_POLY = 0xEDB88320u, X0 = 0x80000000u };

static uint32_t mulmod(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    /* b times x^i for i = 0, 1, ...: times x is a shift towards bit 0,
     * reducing by P when x^31's coefficient leaves */
    for (uint32_t term = X0; term; term >>= 1) {
        if (a & term)
            product ^= b;
        b = (b >> 1) ^ ((b & 1) ? REFLECTED_POLY : 0);
    }
    return product;
}

uint32_t ps_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    /* crc(a + b) = crc_a * x^(8 len_b) + crc_b: the pre- and post-inversions
     * of the two CRCs cancel out.  x^(8 len_b) by squaring. */
    uint32_t shift = X0, power = X0 >> 8;     /* x^0, x^8 */
    for (; len_b; len_b >>= 1) {
        if (len_b & 1)
            shift = mulmod(shift, power);
        power = mulmod(power, power);
    }
    return mulmod(crc_a, shift) ^ crc_b;
}

const char *ps_crc32_implementation(void)
{
#ifdef PS_WITHOUT_ISAL
    static const char *const name[2] = {
        "zlib crc32", "pystream fold256 (VPCLMULQDQ+AVX2), zlib crc32 below 512 bytes"};
    return name[cpu_crc() == FOLD256_RUNS];
#elif defined(PS_CRC_FOLD256)
    /* ISA-L's x86-64 dispatcher for crc32_gzip_refl: AVX-512 (F, VL, BW, DQ,
     * CD) with VPCLMULQDQ, else AVX with PCLMULQDQ, else SSE4.1 with
     * PCLMULQDQ, else tables (GCC's checks include the OS's register
     * support, as ISA-L's xgetbv test does). */
    int cpu = cpu_crc();
    if (cpu == FOLD256_RUNS)
        return "pystream fold256 (VPCLMULQDQ+AVX2), ISA-L below 512 bytes";
    if (cpu & ISAL_WIDE)
        return "ISA-L crc32_gzip_refl by16_10 (AVX-512+VPCLMULQDQ)";
    if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx"))
        return "ISA-L crc32_gzip_refl by8_02 (AVX+PCLMULQDQ)";
    if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1"))
        return "ISA-L crc32_gzip_refl by8 (SSE4.1+PCLMULQDQ)";
    return "ISA-L crc32_gzip_refl base (tables)";
#elif defined(__aarch64__) && defined(__linux__)
    /* ISA-L's aarch64 dispatcher keys on the PMULL hardware capability */
    return (getauxval(AT_HWCAP) & HWCAP_PMULL)
        ? "ISA-L crc32_gzip_refl PMULL folding" : "ISA-L crc32_gzip_refl base (tables)";
#else
    return "ISA-L crc32_gzip_refl (its own dispatch, not known here)";
#endif
}

#ifdef PS_WITHOUT_ISAL
/* CRC-32C a byte at a time from a table made on first use: snappy's
 * framing is the only user, on 64 KiB blocks at most. */
static uint32_t crc32c_table[256];
static pthread_once_t crc32c_table_made = PTHREAD_ONCE_INIT;

static void make_crc32c_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0);
        crc32c_table[i] = c;
    }
}

uint32_t ps_crc32c(const uint8_t *p, size_t n)
{
    pthread_once(&crc32c_table_made, make_crc32c_table);
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        crc = (crc >> 8) ^ crc32c_table[(crc ^ p[i]) & 0xFF];
    return ~crc;
}
#else
uint32_t ps_crc32c(const uint8_t *p, size_t n)
{
    /* ISA-L's iSCSI variant leaves the inversion to the caller */
    return ~crc32_iscsi((unsigned char *)p, (int)n, 0xFFFFFFFFu);
}
#endif
