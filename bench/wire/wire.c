/* The wire limits of the benchmarks: a RabbitMQ stream client in C that
 * does the least a client can do, so the broker and loopback TCP are all
 * that is left to measure.
 *
 *   wire consume HOST PORT USER PASS VHOST STREAM COUNT [WINDOW]
 *       Connect, then subscribe at "first" (credit 1 in Subscribe, WINDOW - 1
 *       in a Credit right after it, as pystream's consumer does; WINDOW 64,
 *       pystream's most), recv into one large buffer (a chunk's records in
 *       reads of up to 1 MiB that wait for all of it), walk frame sizes and
 *       chunk headers, count records, grant one credit per chunk once all
 *       of it is in (sent once per recv), never look at the entries. Stops
 *       at offset COUNT. With "crc" after WINDOW, also check each chunk's
 *       CRC-32 (ISA-L's crc32_gzip_refl, loaded at run time) over its
 *       entries as they arrive, as pystream does: what a checking reader
 *       costs. With "crc,keep", also receive each chunk whole into one of
 *       three blocks taken in turn, as a client whose records point into
 *       the bytes received (pystream's batches) must keep them: what a
 *       checking reader that hands its records out uncopied costs.
 *   wire publish HOST PORT USER PASS VHOST STREAM COUNT BODY [IN_FLIGHT]
 *       Pre-encoded Publish frames (~1 MiB) of AMQP 1.0 messages (one data
 *       section of BODY bytes whose first 8 are a big-endian counter), only
 *       the publishing ids and counters patched; every confirm awaited, at
 *       most IN_FLIGHT messages unconfirmed.
 *   wire latency HOST PORT USER PASS VHOST STREAM BODY OUTFILE
 *       Subscribe at "next", print "READY" once subscribed; for each record
 *       write (receive time, first 16 body bytes) as three int64 to
 *       OUTFILE, the receive time being CLOCK_MONOTONIC when the recv that
 *       completed its chunk returned. Stops after the end marker (a body
 *       whose first int64, little-endian, is -1).
 *
 * Each prints one line "RESULT {json}" with its own wall and CPU time over
 * the measured window (consume: and "first_data", when the first chunk
 * arrived in it) and, with the environment variable
 * WIRE_BROKER_PID, the broker process's CPU time over the same window.
 * Every frame goes out in one write: RabbitMQ 4.0.5 sometimes closes a
 * connection whose handshake frame arrives split in two TCP segments. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define K_PUBLISH 0x0002
#define K_CONFIRM 0x0003
#define K_PUBLISH_ERROR 0x0004
#define K_DECLARE_PUBLISHER 0x0001
#define K_SUBSCRIBE 0x0007
#define K_DELIVER 0x0008
#define K_CREDIT 0x0009
#define K_PEER_PROPERTIES 0x0011
#define K_SASL_HANDSHAKE 0x0012
#define K_SASL_AUTHENTICATE 0x0013
#define K_TUNE 0x0014
#define K_OPEN 0x0015
#define K_CLOSE 0x0016
#define RESPONSE 0x8000
#define CHUNK_HEADER 48
#define READ_SLICE ((size_t)1 << 20)   /* the most one read of a chunk's records takes */

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "wire: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* --- big-endian helpers ---------------------------------------------------- */

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }
static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }

/* A frame under construction: the size prefix is filled by send_frame. */
typedef struct { uint8_t b[4096]; size_t n; } out_t;

static void o_start(out_t *o, uint16_t key) { o->n = 4; put16(o->b + 4, key); put16(o->b + 6, 1); o->n = 8; }
static void o_u8(out_t *o, uint8_t v) { o->b[o->n++] = v; }
static void o_u16(out_t *o, uint16_t v) { put16(o->b + o->n, v); o->n += 2; }
static void o_u32(out_t *o, uint32_t v) { put32(o->b + o->n, v); o->n += 4; }
static void o_str(out_t *o, const char *s) {
    size_t len = strlen(s);
    if (o->n + 2 + len > sizeof o->b) die("string too long");
    o_u16(o, (uint16_t)len);
    memcpy(o->b + o->n, s, len);
    o->n += len;
}

static void write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            die("write: %s", strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
}

static void send_frame(int fd, out_t *o) {
    put32(o->b, (uint32_t)(o->n - 4));
    write_all(fd, o->b, o->n);
}

/* --- the receive buffer ------------------------------------------------------ */

typedef struct {
    int fd;
    uint8_t *buf;
    size_t cap, pos, end;   /* unread bytes are buf[pos:end] */
} conn_t;

/* Make buf[pos:end] hold at least need bytes (blocking). */
static void fill(conn_t *c, size_t need) {
    if (need > c->cap) die("frame of %zu bytes exceeds the buffer", need);
    if (c->pos + need > c->cap) {
        memmove(c->buf, c->buf + c->pos, c->end - c->pos);
        c->end -= c->pos;
        c->pos = 0;
    }
    while (c->end - c->pos < need) {
        ssize_t got = recv(c->fd, c->buf + c->end, c->cap - c->end, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) die("the broker closed the socket");
        c->end += (size_t)got;
    }
}

/* The next whole frame (after its size prefix); its size in *size. */
static uint8_t *next_frame(conn_t *c, uint32_t *size) {
    fill(c, 4);
    *size = get32(c->buf + c->pos);
    fill(c, 4 + (size_t)*size);
    uint8_t *f = c->buf + c->pos + 4;
    c->pos += 4 + (size_t)*size;
    return f;
}

/* Wait for the response to key, checking its code; other frames before it
 * (heartbeats, Tune) are returned through *tune when they are Tune. */
static uint8_t *await_response(conn_t *c, uint16_t key, uint32_t *tune_frame_max) {
    for (;;) {
        uint32_t size;
        uint8_t *f = next_frame(c, &size);
        uint16_t k = get16(f);
        if (k == (RESPONSE | key)) {
            uint16_t code = get16(f + 8);
            if (code != 1) die("command %#x: response code %#x", key, code);
            return f;
        }
        if (k == K_TUNE && tune_frame_max) *tune_frame_max = get32(f + 4);
        if (k == K_CLOSE) die("the broker closed the connection (code %#x)", get16(f + 8));
    }
}

static int connect_to(const char *host, const char *port) {
    struct addrinfo hints = {0}, *res, *ai;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) die("%s: %s", host, gai_strerror(rc));
    int fd = -1;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) die("cannot connect to %s:%s", host, port);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Connect and open: PeerProperties, SASL PLAIN, Tune, Open. Returns the
 * broker's frame_max. */
static uint32_t handshake(conn_t *c, char **a) {
    const char *host = a[0], *port = a[1], *user = a[2], *pass = a[3], *vhost = a[4];
    c->fd = connect_to(host, port);
    out_t o;
    uint32_t corr = 0, frame_max = 0;

    o_start(&o, K_PEER_PROPERTIES);
    o_u32(&o, ++corr);
    o_u32(&o, 1);
    o_str(&o, "product");
    o_str(&o, "pystream-bench-wire");
    send_frame(c->fd, &o);
    await_response(c, K_PEER_PROPERTIES, NULL);

    o_start(&o, K_SASL_HANDSHAKE);
    o_u32(&o, ++corr);
    send_frame(c->fd, &o);
    await_response(c, K_SASL_HANDSHAKE, NULL);

    o_start(&o, K_SASL_AUTHENTICATE);
    o_u32(&o, ++corr);
    o_str(&o, "PLAIN");
    size_t ul = strlen(user), pl = strlen(pass);
    o_u32(&o, (uint32_t)(2 + ul + pl));
    o_u8(&o, 0);
    memcpy(o.b + o.n, user, ul); o.n += ul;
    o_u8(&o, 0);
    memcpy(o.b + o.n, pass, pl); o.n += pl;
    send_frame(c->fd, &o);
    await_response(c, K_SASL_AUTHENTICATE, &frame_max);
    while (!frame_max) {
        uint32_t size;
        uint8_t *f = next_frame(c, &size);
        if (get16(f) == K_TUNE) frame_max = get32(f + 4);
    }
    o_start(&o, RESPONSE | K_TUNE);
    o_u32(&o, frame_max);
    o_u32(&o, 0);   /* no heartbeats */
    send_frame(c->fd, &o);

    o_start(&o, K_OPEN);
    o_u32(&o, ++corr);
    o_str(&o, vhost);
    send_frame(c->fd, &o);
    await_response(c, K_OPEN, NULL);
    return frame_max;
}

/* --- the measured window: wall, own CPU, broker CPU ---------------------- */

static double now_s(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* utime + stime of a process from /proc (seconds); -1 when unknown. */
static double proc_cpu(long pid) {
    if (pid <= 0) return -1;
    char path[64], text[2048];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *p = strrchr(text, ')');
    if (!p) return -1;
    unsigned long utime = 0, stime = 0;
    /* after ")": state(3) ... utime is field 14, stime 15 */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
               &utime, &stime) != 2)
        return -1;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

typedef struct { double t0, cpu0, broker0; long broker; } window_t;

static void window_start(window_t *w) {
    const char *pid = getenv("WIRE_BROKER_PID");
    w->broker = pid ? atol(pid) : 0;
    w->broker0 = proc_cpu(w->broker);
    w->cpu0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    w->t0 = now_s(CLOCK_MONOTONIC);
}

/* Prints the window's fields into a JSON object under construction. */
static void window_stop(window_t *w, FILE *out) {
    double t1 = now_s(CLOCK_MONOTONIC), cpu1 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    double b1 = proc_cpu(w->broker);
    fprintf(out, "\"seconds\": %.6f, \"cpu\": %.6f", t1 - w->t0, cpu1 - w->cpu0);
    if (w->broker0 >= 0 && b1 >= 0)
        fprintf(out, ", \"broker_cpu\": %.3f", b1 - w->broker0);
}

static void subscribe(conn_t *c, const char *stream, uint16_t offset_type, int window) {
    out_t o;
    o_start(&o, K_SUBSCRIBE);
    o_u32(&o, 100);
    o_u8(&o, 1);
    o_str(&o, stream);
    o_u16(&o, offset_type);
    o_u16(&o, 1);
    send_frame(c->fd, &o);
    if (window > 1) {
        o_start(&o, K_CREDIT);
        o_u8(&o, 1);
        o_u16(&o, (uint16_t)(window - 1));
        send_frame(c->fd, &o);
    }
}

static void send_credit(int fd, unsigned n) {
    while (n) {
        unsigned k = n > 0xFFFF ? 0xFFFF : n;
        out_t o;
        o_start(&o, K_CREDIT);
        o_u8(&o, 1);
        o_u16(&o, (uint16_t)k);
        send_frame(fd, &o);
        n -= k;
    }
}

/* --- consume: the wire limit of a reader ---------------------------------- */

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, uint64_t);

/* ISA-L's CRC-32 as the process resolves it: a preloaded one (a benchmark's
 * emulated CPU class) comes first. */
static crc_fn load_crc(void) {
    if (!dlopen("libisal.so.2", RTLD_NOW | RTLD_GLOBAL)) die("crc: %s", dlerror());
    crc_fn f = (crc_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "crc32_gzip_refl");
    if (!f) die("crc: %s", dlerror());
    return f;
}

/* The CRC of the entries among k bytes of a Deliver frame, the first
 * *head bytes of which are its size, command and chunk headers. */
static void crc_feed(crc_fn fn, const uint8_t *p, size_t k, size_t *head, uint32_t *crc) {
    size_t drop = k < *head ? k : *head;
    *head -= drop;
    if (k > drop) *crc = fn(*crc, p + drop, k - drop);
}

static int cmd_consume(char **a, int n) {
    if (n < 7) die("consume HOST PORT USER PASS VHOST STREAM COUNT [WINDOW]");
    const char *stream = a[5];
    uint64_t count = strtoull(a[6], NULL, 10);
    int window = n > 7 ? atoi(a[7]) : 64;
    const char *opts = n > 8 ? a[8] : "";
    crc_fn check = strstr(opts, "crc") ? load_crc() : NULL;
    /* keep: each chunk lands whole in one of KEEP_BLOCKS blocks, taken in
     * turn, as a client that hands out its records uncopied must keep it */
    int keep = strstr(opts, "keep") != NULL;
    enum { KEEP_BLOCKS = 3 };
    uint8_t *kblock[KEEP_BLOCKS] = {0};
    size_t kcap = 16u << 20, koff = 0;
    int kturn = 0;
    if (keep)
        for (int i = 0; i < KEEP_BLOCKS; i++) {
            kblock[i] = malloc(kcap);
            if (!kblock[i]) die("out of memory");
            memset(kblock[i], 0, kcap);
        }
    size_t head_left = 0;   /* of the frame being skipped: not entries */
    uint32_t crc = 0, crc_want = 0;
    conn_t c = {0};
    c.cap = 64u << 20;
    c.buf = malloc(c.cap);
    if (!c.buf) die("out of memory");
    memset(c.buf, 0, c.cap);   /* fault the buffer in before the clock starts */

    /* the window holds a connection and handshake, as pystream's consumer
     * opens its own connection to the stream's node inside its window */
    window_t w;
    window_start(&w);
    handshake(&c, a);
    subscribe(&c, stream, 1 /* first */, window);
    uint64_t records = 0, chunks = 0, chunk_bytes = 0, next_offset = 0;
    uint64_t rec_min = UINT64_MAX, rec_max = 0, recvs = 0;
    size_t skip = 0;   /* bytes of the current frame still to drop */
    /* A chunk's credit goes back once all of it is in, as pystream's does:
     * granted at its header, 1 M x 1 KiB read at 2.3-2.5 M msg/s against
     * 2.7-2.9 here (interleaved, with the reads below). */
    unsigned owed = 0;
    int subscribed = 0;
    double first_data = -1;   /* when the first chunk arrived, in the window */
    while (next_offset < count) {
        unsigned credit = 0;
        for (;;) {
            size_t avail = c.end - c.pos;
            if (skip) {
                size_t k = avail < skip ? avail : skip;
                if (keep) {
                    if (koff + k > kcap) die("chunk larger than a keep block");
                    memcpy(kblock[kturn] + koff, c.buf + c.pos, k);
                    koff += k;
                }
                if (check)
                    crc_feed(check, c.buf + c.pos, k, &head_left, &crc);
                if (avail < skip) { skip -= avail; c.pos = c.end; break; }
                c.pos += skip;
                skip = 0;
                if (check && crc != crc_want) die("chunk CRC-32 mismatch");
                credit += owed;     /* the chunk is all in */
                owed = 0;
                continue;
            }
            if (avail < 8) break;
            const uint8_t *f = c.buf + c.pos;
            uint32_t size = get32(f);
            uint16_t key = get16(f + 4), version = get16(f + 6);
            if (key == K_DELIVER) {
                size_t head = 9 + (version >= 2 ? 8 : 0);
                if (avail < head + CHUNK_HEADER) break;
                const uint8_t *h = f + head;
                if (h[0] != 0x50) die("bad chunk magic %#x", h[0]);
                if (first_data < 0) first_data = now_s(CLOCK_MONOTONIC) - w.t0;
                owed++;
                if (h[1] == 0) {
                    uint32_t recs = get32(h + 4);
                    records += recs;
                    chunks++;
                    chunk_bytes += get32(h + 36);
                    if (recs < rec_min) rec_min = recs;
                    if (recs > rec_max) rec_max = recs;
                    next_offset = get64(h + 24) + recs;
                }
                skip = 4 + (size_t)size;
                if (keep) { kturn = (kturn + 1) % KEEP_BLOCKS; koff = 0; }
                head_left = head + CHUNK_HEADER;
                crc = 0;
                crc_want = get32(h + 32);
                continue;
            }
            if (avail < 4 + (size_t)size) break;
            if (key == (RESPONSE | K_SUBSCRIBE)) {
                if (get16(f + 12) != 1) die("subscribe: response code %#x", get16(f + 12));
                subscribed = 1;
            } else if (key == K_CLOSE || key == (RESPONSE | K_CREDIT)) {
                die("the broker sent command %#x", key);
            }
            c.pos += 4 + (size_t)size;
        }
        if (credit) send_credit(c.fd, credit);
        if (next_offset >= count) break;
        if (c.pos == c.end) {
            c.pos = c.end = 0;
        } else if (c.cap - c.end < (256u << 10)) {
            memmove(c.buf, c.buf + c.pos, c.end - c.pos);
            c.end -= c.pos;
            c.pos = 0;
        }
        /* Inside a chunk's records (the broker sendfile()s them right after
         * the header): wait for up to 1 MiB of them in one read, as pystream
         * does, not a wake-up and a read per segment train; else take
         * whatever is there. */
        size_t want = c.cap - c.end;
        int flags = 0;
        if (skip && c.pos == c.end) {
            want = skip < READ_SLICE ? skip : READ_SLICE;
            flags = MSG_WAITALL;
            if (keep) {
                /* straight into the chunk's block, as pystream reads */
                if (koff + want > kcap) die("chunk larger than a keep block");
                ssize_t got = recv(c.fd, kblock[kturn] + koff, want, flags);
                if (got < 0 && errno == EINTR) continue;
                if (got <= 0) die("the broker closed the socket");
                if (check)
                    crc_feed(check, kblock[kturn] + koff, (size_t)got, &head_left, &crc);
                koff += (size_t)got;
                skip -= (size_t)got;
                recvs++;
                if (!skip) {
                    if (check && crc != crc_want) die("chunk CRC-32 mismatch");
                    if (owed) { send_credit(c.fd, owed); owed = 0; }
                }
                continue;
            }
        }
        ssize_t got = recv(c.fd, c.buf + c.end, want, flags);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) die("the broker closed the socket");
        c.end += (size_t)got;
        recvs++;
    }
    (void)subscribed;
    printf("RESULT {\"messages\": %llu, \"records_received\": %llu, ",
           (unsigned long long)count, (unsigned long long)records);
    window_stop(&w, stdout);
    printf(", \"chunks\": %llu, \"chunk_records_min\": %llu, \"chunk_records_max\": %llu, "
           "\"chunk_bytes_mean\": %.0f, \"recvs\": %llu, \"window\": %d, "
           "\"first_data\": %.6f, \"crc\": %s}\n",
           (unsigned long long)chunks, (unsigned long long)(chunks ? rec_min : 0),
           (unsigned long long)rec_max, chunks ? (double)chunk_bytes / (double)chunks : 0.0,
           (unsigned long long)recvs, window, first_data, check ? "true" : "false");
    return 0;
}

/* --- publish: the wire limit of a publisher --------------------------------- */

static int cmd_publish(char **a, int n) {
    if (n < 8) die("publish HOST PORT USER PASS VHOST STREAM COUNT BODY [IN_FLIGHT]");
    const char *stream = a[5];
    uint64_t count = strtoull(a[6], NULL, 10);
    size_t body = (size_t)atol(a[7]);
    uint64_t in_flight = n > 8 ? strtoull(a[8], NULL, 10) : (1u << 20);
    if (body < 8) die("BODY must be at least 8 bytes");
    conn_t c = {0};
    c.cap = 1u << 20;
    c.buf = malloc(c.cap);
    uint32_t frame_max = handshake(&c, a);
    if (!frame_max) frame_max = 1u << 20;

    /* one frame's worth of messages: id (8), size (4), 00 53 75 b0 len body */
    size_t msg = 8 + body, rec = 12 + msg;
    size_t per_frame = (frame_max - 13) / rec;
    if (per_frame == 0) die("a message does not fit in frame_max %u", frame_max);
    size_t frame_len = 13 + per_frame * rec;
    uint8_t *frame = malloc(frame_len);
    if (!frame) die("out of memory");
    for (size_t i = 0; i < per_frame; i++) {
        uint8_t *r = frame + 13 + i * rec;
        put32(r + 8, (uint32_t)msg);
        r[12] = 0x00; r[13] = 0x53; r[14] = 0x75; r[15] = 0xb0;
        put32(r + 16, (uint32_t)body);
        for (size_t j = 0; j < body; j++) r[20 + j] = (uint8_t)j;
    }

    window_t w;
    window_start(&w);
    out_t o;
    o_start(&o, K_DECLARE_PUBLISHER);
    o_u32(&o, 7);
    o_u8(&o, 1);
    o_str(&o, "");
    o_str(&o, stream);
    send_frame(c.fd, &o);
    await_response(&c, K_DECLARE_PUBLISHER, NULL);

    uint64_t sent = 0, confirmed = 0, frames = 0;
    size_t out_pos = 0, out_len = 0;   /* the frame being written */
    while (confirmed < count) {
        if (out_pos == out_len && sent < count && sent - confirmed < in_flight) {
            uint64_t k = count - sent < per_frame ? count - sent : per_frame;
            put32(frame, (uint32_t)(9 + k * rec));
            put16(frame + 4, K_PUBLISH);
            put16(frame + 6, 1);
            frame[8] = 1;
            put32(frame + 9, (uint32_t)k);
            for (uint64_t i = 0; i < k; i++) {
                uint8_t *r = frame + 13 + i * rec;
                put64(r, sent + i + 1);        /* publishing id */
                put64(r + 20, sent + i);       /* the body's counter */
            }
            out_pos = 0;
            out_len = 13 + k * rec;
            sent += k;
            frames++;
        }
        struct pollfd p = {c.fd, POLLIN | (out_pos < out_len ? POLLOUT : 0), 0};
        if (poll(&p, 1, 60000) <= 0) die("no progress for 60 s (%llu confirmed)",
                                         (unsigned long long)confirmed);
        if (p.revents & POLLOUT) {
            ssize_t wr = send(c.fd, frame + out_pos, out_len - out_pos, MSG_DONTWAIT);
            if (wr > 0) out_pos += (size_t)wr;
            else if (wr < 0 && errno != EAGAIN && errno != EINTR) die("send: %s", strerror(errno));
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            if (c.pos == c.end) c.pos = c.end = 0;
            else if (c.cap - c.end < 4096) {
                memmove(c.buf, c.buf + c.pos, c.end - c.pos);
                c.end -= c.pos;
                c.pos = 0;
            }
            ssize_t got = recv(c.fd, c.buf + c.end, c.cap - c.end, MSG_DONTWAIT);
            if (got == 0) die("the broker closed the socket");
            if (got < 0 && errno != EAGAIN && errno != EINTR) die("recv: %s", strerror(errno));
            if (got > 0) c.end += (size_t)got;
            while (c.end - c.pos >= 4) {
                uint32_t size = get32(c.buf + c.pos);
                if (c.end - c.pos < 4 + (size_t)size) break;
                const uint8_t *f = c.buf + c.pos + 4;
                uint16_t key = get16(f);
                if (key == K_CONFIRM) confirmed += get32(f + 5);
                else if (key == K_PUBLISH_ERROR) die("the broker refused a message");
                else if (key == K_CLOSE) die("the broker closed the connection");
                c.pos += 4 + (size_t)size;
            }
        }
    }
    printf("RESULT {\"messages\": %llu, ", (unsigned long long)count);
    window_stop(&w, stdout);
    printf(", \"frames\": %llu, \"per_frame\": %zu, \"max_in_flight\": %llu}\n",
           (unsigned long long)frames, per_frame, (unsigned long long)in_flight);
    return 0;
}

/* --- latency: the floor of a reader ------------------------------------------ */

static int cmd_latency(char **a, int n) {
    if (n < 8) die("latency HOST PORT USER PASS VHOST STREAM BODY OUTFILE");
    const char *stream = a[5];
    size_t body = (size_t)atol(a[6]);
    FILE *out = fopen(a[7], "wb");
    if (!out) die("%s: %s", a[7], strerror(errno));
    if (body < 16) die("BODY must be at least 16 bytes");
    conn_t c = {0};
    c.cap = 64u << 20;
    c.buf = malloc(c.cap);
    handshake(&c, a);
    subscribe(&c, stream, 3 /* next */, 64);
    window_t w;
    uint64_t records = 0, chunks = 0;
    int done = 0, started = 0;
    while (!done) {
        /* frames wholly in the buffer; the receive time is when the recv
         * that completed them returned */
        fill(&c, 4);
        uint32_t size = get32(c.buf + c.pos);
        size_t have = c.end - c.pos;
        if (have < 4 + (size_t)size) { fill(&c, 4 + (size_t)size); }
        int64_t t = mono_ns();
        while (!done && c.end - c.pos >= 4) {
            size = get32(c.buf + c.pos);
            if (c.end - c.pos < 4 + (size_t)size) break;
            const uint8_t *f = c.buf + c.pos + 4;
            uint16_t key = get16(f), version = get16(f + 2);
            if (key == (RESPONSE | K_SUBSCRIBE)) {
                if (get16(f + 8) != 1) die("subscribe: response code %#x", get16(f + 8));
                printf("READY\n");
                fflush(stdout);
                window_start(&w);
                started = 1;
            } else if (key == K_DELIVER) {
                const uint8_t *h = f + 5 + (version >= 2 ? 8 : 0);
                if (h[1] == 0) {
                    uint16_t entries = get16(h + 2);
                    const uint8_t *e = h + CHUNK_HEADER, *stop = h + CHUNK_HEADER + get32(h + 36);
                    if (stop > f + size) die("chunk longer than its frame");
                    for (uint16_t i = 0; i < entries && e + 4 <= stop; i++) {
                        uint32_t len = get32(e);
                        if (len & 0x80000000u) die("sub-batch entries are not read here");
                        if (len < body || e + 4 + len > stop) die("entry of %u bytes", len);
                        const uint8_t *b = e + 4 + len - body;   /* the data section is last */
                        int64_t rec[3];
                        rec[0] = t;
                        memcpy(&rec[1], b, 16);   /* little-endian on this machine */
                        fwrite(rec, sizeof rec, 1, out);
                        records++;
                        if (rec[1] == -1) { done = 1; break; }
                        e += 4 + len;
                    }
                    chunks++;
                }
                send_credit(c.fd, 1);
            } else if (key == K_CLOSE) {
                die("the broker closed the connection");
            }
            c.pos += 4 + (size_t)size;
        }
    }
    fclose(out);
    if (!started) die("no answer to subscribe");
    printf("RESULT {\"received\": %llu, \"chunks\": %llu, ",
           (unsigned long long)records, (unsigned long long)chunks);
    window_stop(&w, stdout);
    printf("}\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage: wire consume|publish|latency ...");
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(argv[1], "consume")) return cmd_consume(argv + 2, argc - 2);
    if (!strcmp(argv[1], "publish")) return cmd_publish(argv + 2, argc - 2);
    if (!strcmp(argv[1], "latency")) return cmd_latency(argv + 2, argc - 2);
    die("unknown command %s", argv[1]);
    return 2;
}
