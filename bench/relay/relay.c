/* A TCP relay that adds distance: every byte is held for a one-way delay
 * (plus optional jitter, plus an optional bandwidth cap) in each direction,
 * so a client on this machine sees the broker as if it ran in another zone
 * (tc netem is not available here).
 *
 *   relay [-p PORT] [-d DELAY_US] [-j JITTER_US] [-r BYTES_PER_S]
 *         [-b BUFFER_BYTES] [-s SEED] TARGET_HOST TARGET_PORT
 *
 * Listens on 127.0.0.1:PORT (0, the default: any free port) and prints
 * "PORT n" once listening. Each accepted connection gets its own connection
 * to TARGET; bytes read from one side are written to the other no earlier
 * than DELAY_US microseconds after they were read (the round trip gains
 * twice that). Jitter moves each read's release time by a uniform amount in
 * [-JITTER_US, +JITTER_US], never before the previous read's release time,
 * so TCP's byte order holds. With -r, each direction is a link of that
 * many bytes per second: bytes queue behind the ones before them, then
 * travel for the delay.
 *
 * Memory is bounded: each direction holds at most BUFFER_BYTES (default
 * 64 MiB, three times the bandwidth-delay product of 1 GB/s over 20 ms) in
 * blocks taken on demand and freed once sent; a full direction stops
 * reading from its source until bytes leave, as a router's queue would
 * push back. A half-close passes through once the bytes before it left.
 *
 * SIGUSR1 prints one line "STATS {json}" (connections accepted, bytes
 * relayed each way); SIGTERM or SIGINT prints it too, then exits 0, as
 * does the parent's exit.
 * One thread, epoll, nonblocking sockets; a timerfd wakes the loop when
 * the next held bytes are due. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define BLOCK (256 * 1024)
#define MAX_SEGMENTS 8192      /* release times held per direction */
#define MERGE_NS 20000         /* reads due within 20 us share one release */
#define MAX_EVENTS 64

/* --- options ------------------------------------------------------------- */

static int64_t delay_ns, jitter_ns;
static double rate_bps;            /* bytes per second, 0: no cap */
static size_t buffer_max = 64u << 20;
static struct addrinfo *target;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* --- statistics ---------------------------------------------------------- */

static uint64_t accepted, bytes_up, bytes_down, open_conns;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t rng(void) {   /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

/* --- one direction: blocks of bytes and their release times -------------- */

struct block {
    struct block *next;
    size_t start, end;             /* unsent bytes are [start, end) */
    char data[BLOCK];
};

struct segment {
    uint64_t until;                /* stream offset after the segment's bytes */
    int64_t release;               /* monotonic ns */
};

struct pipe {
    struct block *head, *tail;
    uint64_t read_total, sent_total;   /* stream offsets */
    struct segment seg[MAX_SEGMENTS];
    unsigned seg_head, seg_count;
    int64_t last_release, link_free;
    int eof, shut;                 /* source closed; shutdown sent on sink */
    int blocked;                   /* due bytes wait for the sink (EPOLLOUT) */
    uint64_t *counter;
};

static size_t held(const struct pipe *p) { return (size_t)(p->read_total - p->sent_total); }

static int pipe_room(const struct pipe *p) {
    return held(p) < buffer_max && p->seg_count < MAX_SEGMENTS && !p->eof;
}

static void pipe_free(struct pipe *p) {
    while (p->head) {
        struct block *b = p->head;
        p->head = b->next;
        free(b);
    }
    p->tail = NULL;
}

/* Bytes just read become due at the release time of this model. */
static void pipe_mark(struct pipe *p, size_t n, int64_t now) {
    int64_t start = now;
    if (rate_bps > 0) {            /* queue behind earlier bytes on the link */
        if (p->link_free > start) start = p->link_free;
        start += (int64_t)((double)n * 1e9 / rate_bps);
        p->link_free = start;
    }
    int64_t release = start + delay_ns;
    if (jitter_ns > 0)
        release += (int64_t)(rng() % (uint64_t)(2 * jitter_ns + 1)) - jitter_ns;
    if (release < p->last_release) release = p->last_release;
    p->last_release = release;
    p->read_total += n;
    if (p->seg_count) {
        struct segment *last = &p->seg[(p->seg_head + p->seg_count - 1) % MAX_SEGMENTS];
        if (release - last->release < MERGE_NS) {
            /* Held up to 20 us longer than due: fewer release times to keep. */
            last->until = p->read_total;
            last->release = release;
            return;
        }
    }
    struct segment *s = &p->seg[(p->seg_head + p->seg_count) % MAX_SEGMENTS];
    s->until = p->read_total;
    s->release = release;
    p->seg_count++;
}

/* Read what the source has (as far as there is room). 0, or -1 when the
 * source failed. */
static int pipe_fill(struct pipe *p, int fd) {
    while (pipe_room(p)) {
        if (!p->tail || p->tail->end == BLOCK) {
            struct block *b = malloc(sizeof *b);
            if (!b) return 0;      /* no memory now: read again later */
            b->next = NULL;
            b->start = b->end = 0;
            if (p->tail) p->tail->next = b; else p->head = b;
            p->tail = b;
        }
        size_t want = BLOCK - p->tail->end;
        if (want > buffer_max - held(p)) want = buffer_max - held(p);
        ssize_t n = recv(fd, p->tail->data + p->tail->end, want, 0);
        if (n > 0) {
            p->tail->end += (size_t)n;
            pipe_mark(p, (size_t)n, now_ns());
            if ((size_t)n < want) return 0;
        } else if (n == 0) {
            p->eof = 1;
            return 0;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return 0;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Stream offset up to which bytes are due now. */
static uint64_t pipe_due(struct pipe *p, int64_t now) {
    while (p->seg_count && p->seg[p->seg_head].until <= p->sent_total) {
        p->seg_head = (p->seg_head + 1) % MAX_SEGMENTS;
        p->seg_count--;
    }
    uint64_t due = p->sent_total;
    for (unsigned i = 0; i < p->seg_count; i++) {
        struct segment *s = &p->seg[(p->seg_head + i) % MAX_SEGMENTS];
        if (s->release > now) break;
        due = s->until;
    }
    return due;
}

/* The release time of the next bytes held, or -1 when none are held. */
static int64_t pipe_next(const struct pipe *p) {
    for (unsigned i = 0; i < p->seg_count; i++) {
        const struct segment *s = &p->seg[(p->seg_head + i) % MAX_SEGMENTS];
        if (s->until > p->sent_total) return s->release;
    }
    return -1;
}

/* Send the bytes that are due. 1 when the sink would block, 0 when all due
 * bytes left, -1 when the sink failed. */
static int pipe_drain(struct pipe *p, int fd, int64_t now) {
    uint64_t due = pipe_due(p, now);
    while (p->sent_total < due) {
        struct block *b = p->head;
        size_t n = b->end - b->start;
        if (n > due - p->sent_total) n = (size_t)(due - p->sent_total);
        ssize_t w = send(fd, b->data + b->start, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 1;
            return -1;
        }
        b->start += (size_t)w;
        p->sent_total += (uint64_t)w;
        *p->counter += (uint64_t)w;
        if (b->start == b->end && (b->end == BLOCK || b->next)) {
            p->head = b->next;
            if (!p->head) p->tail = NULL;
            free(b);
        }
        if ((size_t)w < n) return 1;
    }
    if (p->eof && !p->shut && held(p) == 0) {
        shutdown(fd, SHUT_WR);
        p->shut = 1;
    }
    return 0;
}

/* --- connections ------------------------------------------------------------ */

struct end {                       /* what an epoll event points at */
    struct conn *conn;
    int fd, side;                  /* side 0: client, 1: broker */
    uint32_t events;               /* the interest registered */
    int hung;                      /* peer gone both ways: out of epoll */
};

struct conn {
    struct end end[2];
    struct pipe up, down;          /* up: client -> broker */
    int connecting, dead;
    struct conn *prev, *next;
};

static int epfd, timerfd_, sigfd, listenfd;
static struct conn *conns, *graveyard;
static struct end listen_end, timer_end, signal_end;

static void die(const char *what) {
    perror(what);
    exit(2);
}

/* Events already returned by epoll may still name a closed connection:
 * it is freed once the batch is handled (bury). */
static void conn_close(struct conn *c) {
    for (int i = 0; i < 2; i++) {
        epoll_ctl(epfd, EPOLL_CTL_DEL, c->end[i].fd, NULL);
        close(c->end[i].fd);
    }
    pipe_free(&c->up);
    pipe_free(&c->down);
    if (c->prev) c->prev->next = c->next; else conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->dead = 1;
    c->next = graveyard;
    graveyard = c;
    open_conns--;
}

static void bury(void) {
    while (graveyard) {
        struct conn *c = graveyard;
        graveyard = c->next;
        free(c);
    }
}

/* The pipe that reads from side s, and the one that writes to it. */
static struct pipe *from(struct conn *c, int s) { return s == 0 ? &c->up : &c->down; }
static struct pipe *to(struct conn *c, int s) { return s == 0 ? &c->down : &c->up; }

static void set_interest(struct end *e, uint32_t want) {
    if (want == e->events || e->hung) return;
    struct epoll_event ev = {.events = want, .data.ptr = e};
    if (epoll_ctl(epfd, EPOLL_CTL_MOD, e->fd, &ev) < 0) die("epoll_ctl");
    e->events = want;
}

/* Send what is due both ways, then register what each socket waits for.
 * -1 when the connection is over. */
static int conn_step(struct conn *c, int64_t now) {
    if (c->connecting) {
        set_interest(&c->end[1], EPOLLOUT);
        set_interest(&c->end[0], pipe_room(&c->up) ? EPOLLIN : 0);
        return 0;
    }
    int blocked[2];
    for (int s = 0; s < 2; s++) {
        int r = pipe_drain(to(c, s), c->end[s].fd, now);
        if (r < 0) return -1;
        blocked[s] = to(c, s)->blocked = r;
    }
    for (int s = 0; s < 2; s++)
        set_interest(&c->end[s], (pipe_room(from(c, s)) ? EPOLLIN : 0)
                                     | (blocked[s] ? EPOLLOUT : 0));
    if (c->up.shut && c->down.shut) return -1;
    return 0;
}

static void add_fd(int fd, struct end *e, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = e};
    e->events = events;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
}

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void on_accept(void) {
    for (;;) {
        int cfd = accept4(listenfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno == EINTR) continue;
            return;                /* EAGAIN, or out of descriptors for now */
        }
        int bfd = socket(target->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (bfd < 0) { close(cfd); continue; }
        nodelay(cfd);
        nodelay(bfd);
        int rc = connect(bfd, target->ai_addr, target->ai_addrlen);
        if (rc < 0 && errno != EINPROGRESS) { close(cfd); close(bfd); continue; }
        struct conn *c = calloc(1, sizeof *c);
        if (!c) { close(cfd); close(bfd); continue; }
        c->connecting = rc < 0;
        c->up.counter = &bytes_up;
        c->down.counter = &bytes_down;
        for (int s = 0; s < 2; s++) {
            c->end[s].conn = c;
            c->end[s].side = s;
            c->end[s].fd = s == 0 ? cfd : bfd;
        }
        add_fd(cfd, &c->end[0], EPOLLIN);
        add_fd(bfd, &c->end[1], c->connecting ? EPOLLOUT : EPOLLIN);
        c->next = conns;
        if (conns) conns->prev = c;
        conns = c;
        accepted++;
        open_conns++;
    }
}

static void on_socket(struct end *e, uint32_t events, int64_t now) {
    struct conn *c = e->conn;
    if (c->dead) return;
    if (c->connecting && e->side == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) { conn_close(c); return; }
        c->connecting = 0;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        struct pipe *p = from(c, e->side);
        if (pipe_room(p) && pipe_fill(p, e->fd) < 0) { conn_close(c); return; }
        if ((events & (EPOLLHUP | EPOLLERR)) && p->eof && !e->hung) {
            /* epoll reports a hang-up on every wait: stop listening to this
             * socket; the bytes held for it still go (or fail) on time. */
            epoll_ctl(epfd, EPOLL_CTL_DEL, e->fd, NULL);
            e->hung = 1;
        }
    }
    if (conn_step(c, now) < 0) conn_close(c);
}

/* Arm the timer for the earliest bytes held anywhere (disarm when none);
 * a sink that would block wakes the loop through EPOLLOUT instead. */
static void arm_timer(void) {
    int64_t next = -1;
    for (struct conn *c = conns; c; c = c->next) {
        if (c->connecting) continue;
        int64_t a = c->up.blocked ? -1 : pipe_next(&c->up);
        int64_t b = c->down.blocked ? -1 : pipe_next(&c->down);
        if (a >= 0 && (next < 0 || a < next)) next = a;
        if (b >= 0 && (next < 0 || b < next)) next = b;
    }
    struct itimerspec its = {0};
    if (next >= 0) {
        if (next < 1) next = 1;
        its.it_value.tv_sec = next / 1000000000;
        its.it_value.tv_nsec = next % 1000000000;
    }
    if (timerfd_settime(timerfd_, TFD_TIMER_ABSTIME, &its, NULL) < 0) die("timerfd_settime");
}

static void print_stats(void) {
    printf("STATS {\"accepted\": %llu, \"open\": %llu, \"bytes_up\": %llu, "
           "\"bytes_down\": %llu}\n",
           (unsigned long long)accepted, (unsigned long long)open_conns,
           (unsigned long long)bytes_up, (unsigned long long)bytes_down);
    fflush(stdout);
}

static void usage(void) {
    fprintf(stderr, "usage: relay [-p PORT] [-d DELAY_US] [-j JITTER_US] "
                    "[-r BYTES_PER_S] [-b BUFFER_BYTES] [-s SEED] HOST PORT\n");
    exit(2);
}

static long long number(const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < 0) usage();
    return v;
}

int main(int argc, char **argv) {
    int port = 0, opt;
    while ((opt = getopt(argc, argv, "p:d:j:r:b:s:")) != -1) {
        switch (opt) {
        case 'p': port = (int)number(optarg); break;
        case 'd': delay_ns = number(optarg) * 1000; break;
        case 'j': jitter_ns = number(optarg) * 1000; break;
        case 'r': rate_bps = (double)number(optarg); break;
        case 'b': buffer_max = (size_t)number(optarg); break;
        case 's': rng_state = (uint64_t)number(optarg) | 1; break;
        default: usage();
        }
    }
    if (argc - optind != 2 || port > 65535 || buffer_max < 1) usage();
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    int rc = getaddrinfo(argv[optind], argv[optind + 1], &hints, &target);
    if (rc) {
        fprintf(stderr, "relay: %s: %s\n", argv[optind], gai_strerror(rc));
        return 2;
    }

    /* The relay ends with the process that started it (a benchmark that was
     * killed leaves no relay behind). */
    pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) return 0;

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGUSR1);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);

    if ((epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) die("epoll_create1");
    if ((sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) die("signalfd");
    timerfd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timerfd_ < 0) die("timerfd_create");
    listenfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listenfd < 0) die("socket");
    int one = 1;
    setsockopt(listenfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listenfd, (struct sockaddr *)&sa, sizeof sa) < 0) die("bind");
    if (listen(listenfd, 128) < 0) die("listen");
    socklen_t salen = sizeof sa;
    getsockname(listenfd, (struct sockaddr *)&sa, &salen);
    add_fd(listenfd, &listen_end, EPOLLIN);
    add_fd(timerfd_, &timer_end, EPOLLIN);
    add_fd(sigfd, &signal_end, EPOLLIN);
    printf("PORT %d\n", ntohs(sa.sin_port));
    fflush(stdout);

    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(epfd, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        int64_t now = now_ns();
        int timer = 0;
        for (int i = 0; i < n; i++) {
            struct end *e = events[i].data.ptr;
            if (e == &listen_end) {
                on_accept();
            } else if (e == &timer_end) {
                uint64_t ticks;
                if (read(timerfd_, &ticks, sizeof ticks) < 0 && errno != EAGAIN)
                    die("read timerfd");
                timer = 1;
            } else if (e == &signal_end) {
                struct signalfd_siginfo si;
                while (read(sigfd, &si, sizeof si) == sizeof si) {
                    print_stats();
                    if (si.ssi_signo != SIGUSR1) {
                        while (conns) conn_close(conns);
                        bury();
                        return 0;
                    }
                }
            } else {
                on_socket(e, events[i].events, now);
            }
        }
        if (timer) {
            struct conn *next;
            for (struct conn *c = conns; c; c = next) {
                next = c->next;
                if (conn_step(c, now_ns()) < 0) conn_close(c);
            }
        }
        bury();
        arm_timer();
    }
}
