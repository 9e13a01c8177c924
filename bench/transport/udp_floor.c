/* The kernel-UDP floor: plain kernel UDP on 127.0.0.1, as fast as it goes, and the CPU
 * it costs each side (bench/transport/floor.py builds and runs it).
 *
 *   udp_floor both [OPTIONS]           a receiver and a sender, two forked processes
 *   udp_floor recv --port P [OPTIONS]  a receiver alone (port 0: any, named on stderr)
 *   udp_floor send --port P [OPTIONS]  a sender alone, to 127.0.0.1:P
 *
 * Options: --size S (UDP payload bytes, default 1452), --count N (datagrams) and/or
 * --duration SECONDS (the sender stops at whichever comes first), --batch B (messages
 * per sendmmsg/recvmmsg, default 64), --gso (the sender hands the kernel super-buffers
 * of up to 64 KiB cut into S-byte datagrams, UDP_SEGMENT), --gro (the receiver takes
 * coalesced super-buffers, UDP_GRO), --rcvbuf BYTES (default 64 MiB; SO_RCVBUFFORCE as
 * root, else SO_RCVBUF, which the kernel caps at net.core.rmem_max), --idle SECONDS
 * (recv only: stop this long after the last datagram, default 2; 0: only on a signal).
 *
 * The sender sends flat out on a connected socket; nothing is paced. Each side prints
 * one JSON line on stdout: datagrams, bytes, its syscalls, its wall time and its user
 * and system CPU seconds (getrusage RUSAGE_SELF, from the start of its loop: socket
 * set-up is left out). The sender's wall time is its first send to its last; the
 * receiver's is from its first datagram to its last. In `both` the parent signals the
 * receiver (SIGUSR1) once the sender has exited; the receiver then reads what is left
 * until 100 ms pass without a datagram. Drops are the sender's datagrams minus the
 * receiver's. Every syscall and every length is checked; on error the program prints
 * the reason on stderr and exits 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define MAX_UDP_PAYLOAD 65507 /* IPv4: 65535 - 20 (IP) - 8 (UDP) */
#define MAX_GSO_SEGMENTS 64   /* UDP_MAX_SEGMENTS of older kernels; newer allow 128 */
#define GRO_BUFFER 65536
#define MAX_BATCH 1024

struct options {
    const char *role;
    long size;
    long long count; /* 0: no limit */
    double duration; /* 0: no limit */
    long batch;
    int gso;
    int gro;
    long port;
    long long rcvbuf;
    double idle;
};

struct report {
    long long datagrams;
    long long bytes;
    long long calls;
    double wall_s;
    double user_s;
    double sys_s;
};

static volatile sig_atomic_t stop_requested;

static void die(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("udp_floor: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

static void die_errno(const char *what) { die("%s: %s", what, strerror(errno)); }

static double now_s(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        die_errno("clock_gettime");
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cpu_now(double *user, double *sys) {
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0)
        die_errno("getrusage");
    *user = (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec * 1e-6;
    *sys = (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec * 1e-6;
}

static long long parse_int(const char *name, const char *text, long long low, long long high) {
    char *end;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < low || value > high)
        die("%s: expected an integer in [%lld, %lld], got '%s'", name, low, high, text);
    return value;
}

static double parse_seconds(const char *name, const char *text) {
    char *end;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(value >= 0.0) || value > 86400.0)
        die("%s: expected seconds in [0, 86400], got '%s'", name, text);
    return value;
}

static void usage_exit(void) {
    fputs("usage: udp_floor both|send|recv [--size S] [--count N] [--duration SECONDS]\n"
          "       [--batch B] [--gso] [--gro] [--port P] [--rcvbuf BYTES] [--idle SECONDS]\n",
          stderr);
    exit(2);
}

static struct options parse_options(int argc, char **argv) {
    struct options o = {.size = 1452, .batch = 64, .rcvbuf = 64LL << 20, .idle = 2.0};
    if (argc < 2)
        usage_exit();
    o.role = argv[1];
    if (strcmp(o.role, "both") != 0 && strcmp(o.role, "send") != 0 && strcmp(o.role, "recv") != 0)
        usage_exit();
    int have_port = 0;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--gso") == 0) {
            o.gso = 1;
            continue;
        }
        if (strcmp(arg, "--gro") == 0) {
            o.gro = 1;
            continue;
        }
        if (value == NULL)
            die("%s: missing its value", arg);
        i++;
        if (strcmp(arg, "--size") == 0)
            o.size = (long)parse_int(arg, value, 1, MAX_UDP_PAYLOAD);
        else if (strcmp(arg, "--count") == 0)
            o.count = parse_int(arg, value, 1, 1LL << 50);
        else if (strcmp(arg, "--duration") == 0)
            o.duration = parse_seconds(arg, value);
        else if (strcmp(arg, "--batch") == 0)
            o.batch = (long)parse_int(arg, value, 1, MAX_BATCH);
        else if (strcmp(arg, "--port") == 0) {
            o.port = (long)parse_int(arg, value, 0, 65535);
            have_port = 1;
        } else if (strcmp(arg, "--rcvbuf") == 0)
            o.rcvbuf = parse_int(arg, value, 4096, 1LL << 30);
        else if (strcmp(arg, "--idle") == 0)
            o.idle = parse_seconds(arg, value);
        else
            die("unknown option '%s'", arg);
    }
    if (strcmp(o.role, "recv") != 0 && o.count == 0 && o.duration == 0.0)
        die("the sender needs --count or --duration");
    if (strcmp(o.role, "both") != 0 && !have_port)
        die("%s needs --port", o.role);
    if (strcmp(o.role, "send") == 0 && o.port == 0)
        die("send needs a --port other than 0");
    return o;
}

static void print_report(const char *role, const struct options *o, const struct report *r,
                         long long rcvbuf_bytes) {
    printf("{\"role\": \"%s\", \"size\": %ld, \"batch\": %ld, \"gso\": %s, \"gro\": %s, "
           "\"datagrams\": %lld, \"bytes\": %lld, \"calls\": %lld, \"wall_s\": %.6f, "
           "\"user_s\": %.6f, \"sys_s\": %.6f, \"cpu_s\": %.6f",
           role, o->size, o->batch, o->gso ? "true" : "false", o->gro ? "true" : "false",
           r->datagrams, r->bytes, r->calls, r->wall_s, r->user_s, r->sys_s,
           r->user_s + r->sys_s);
    if (rcvbuf_bytes >= 0)
        printf(", \"rcvbuf_bytes\": %lld", rcvbuf_bytes);
    printf("}\n");
    if (fflush(stdout) != 0 || ferror(stdout))
        die_errno("writing the report");
}

static void *checked_calloc(size_t count, size_t size) {
    void *p = calloc(count, size);
    if (p == NULL)
        die("out of memory (%zu x %zu bytes)", count, size);
    return p;
}

static struct sockaddr_in loopback(long port) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
}

/* ---- receiver ---------------------------------------------------------------------- */

static void on_stop(int sig) {
    (void)sig;
    stop_requested = 1;
}

static int open_receiver(const struct options *o, long *port, long long *rcvbuf_bytes) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0)
        die_errno("socket");
    if (o->rcvbuf > 0x7fffffffLL)
        die("--rcvbuf: at most 2147483647 bytes");
    int want = (int)o->rcvbuf;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof want) != 0) {
        if (errno != EPERM)
            die_errno("setsockopt SO_RCVBUFFORCE");
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof want) != 0)
            die_errno("setsockopt SO_RCVBUF");
    }
    int got = 0;
    socklen_t len = sizeof got;
    if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &got, &len) != 0 || len != sizeof got)
        die_errno("getsockopt SO_RCVBUF");
    *rcvbuf_bytes = got;
    if (o->gro) {
        int on = 1;
        if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof on) != 0)
            die("setsockopt UDP_GRO: %s (UDP GRO unavailable on this kernel?)", strerror(errno));
    }
    /* wake up every 100 ms to look at the stop flag and the idle limit */
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        die_errno("setsockopt SO_RCVTIMEO");
    struct sockaddr_in addr = loopback(*port);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        die_errno("bind");
    socklen_t alen = sizeof addr;
    if (getsockname(fd, (struct sockaddr *)&addr, &alen) != 0 || alen != sizeof addr)
        die_errno("getsockname");
    *port = ntohs(addr.sin_port);
    return fd;
}

static void install_stop_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop; /* no SA_RESTART: a blocked recvmmsg returns EINTR */
    if (sigemptyset(&sa.sa_mask) != 0)
        die_errno("sigemptyset");
    if (sigaction(SIGUSR1, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 ||
        sigaction(SIGTERM, &sa, NULL) != 0)
        die_errno("sigaction");
}

static void run_receiver(const struct options *o, int fd, long long rcvbuf_bytes) {
    size_t bufsize = o->gro ? GRO_BUFFER : (size_t)o->size + 1; /* + 1: an overlong one shows */
    size_t n = (size_t)o->batch;
    char *buffers = checked_calloc(n, bufsize);
    struct iovec *iov = checked_calloc(n, sizeof *iov);
    struct mmsghdr *msgs = checked_calloc(n, sizeof *msgs);
    size_t cmsg_space = CMSG_SPACE(sizeof(int));
    char *control = checked_calloc(n, cmsg_space);
    struct report r = {0};
    double user0, sys0, first = 0.0, last = 0.0;
    cpu_now(&user0, &sys0);
    for (;;) {
        for (size_t i = 0; i < n; i++) {
            iov[i].iov_base = buffers + i * bufsize;
            iov[i].iov_len = bufsize;
            memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            if (o->gro) {
                msgs[i].msg_hdr.msg_control = control + i * cmsg_space;
                msgs[i].msg_hdr.msg_controllen = cmsg_space;
            }
        }
        int got = recvmmsg(fd, msgs, (unsigned)n, MSG_WAITFORONE, NULL);
        if (got < 0) {
            if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
                die_errno("recvmmsg");
            r.calls++;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (stop_requested)
                    break; /* stopped, and 100 ms without a datagram: all read */
                if (o->idle > 0.0 && r.datagrams > 0 && now_s() - last >= o->idle)
                    break;
            }
            continue;
        }
        r.calls++;
        if (got == 0 || (size_t)got > n)
            die("recvmmsg returned %d of %zu messages", got, n);
        double t = now_s();
        if (r.datagrams == 0)
            first = t;
        last = t;
        for (int i = 0; i < got; i++) {
            struct msghdr *h = &msgs[i].msg_hdr;
            size_t len = msgs[i].msg_len;
            if (h->msg_flags & (MSG_TRUNC | MSG_CTRUNC))
                die("a datagram (or its control data) was truncated: %zu bytes, flags 0x%x",
                    len, (unsigned)h->msg_flags);
            long long segments = 1;
            size_t segment = len;
            if (o->gro) {
                for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c != NULL; c = CMSG_NXTHDR(h, c)) {
                    if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
                        int gso_size;
                        if (c->cmsg_len != CMSG_LEN(sizeof gso_size))
                            die("UDP_GRO control message of %zu bytes", (size_t)c->cmsg_len);
                        memcpy(&gso_size, CMSG_DATA(c), sizeof gso_size);
                        if (gso_size <= 0)
                            die("UDP_GRO segment size %d", gso_size);
                        segment = (size_t)gso_size;
                    }
                }
                if (segment != (size_t)o->size || len % segment != 0)
                    die("received %zu bytes in segments of %zu, expected segments of %ld", len,
                        segment, o->size);
                segments = (long long)(len / segment);
            } else if (len != (size_t)o->size) {
                die("received a datagram of %zu bytes, expected %ld", len, o->size);
            }
            r.datagrams += segments;
            r.bytes += (long long)len;
        }
    }
    double user1, sys1;
    cpu_now(&user1, &sys1);
    r.wall_s = r.datagrams > 0 ? last - first : 0.0;
    r.user_s = user1 - user0;
    r.sys_s = sys1 - sys0;
    print_report("recv", o, &r, rcvbuf_bytes);
    free(buffers);
    free(iov);
    free(msgs);
    free(control);
}

/* ---- sender ------------------------------------------------------------------------ */

/* sendmmsg drops the error of a message after the first (it returns the count sent):
 * ask the socket. ECONNREFUSED: an ICMP port unreachable, nothing is listening. */
static void check_socket_error(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || len != sizeof err)
        die_errno("getsockopt SO_ERROR");
    if (err != 0)
        die("sending to 127.0.0.1: %s", strerror(err));
}

static void run_sender(const struct options *o) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0)
        die_errno("socket");
    struct sockaddr_in addr = loopback(o->port);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        die_errno("connect");
    long per_buffer = 1; /* datagrams per message handed to the kernel */
    if (o->gso) {
        per_buffer = MAX_UDP_PAYLOAD / o->size;
        if (per_buffer > MAX_GSO_SEGMENTS)
            per_buffer = MAX_GSO_SEGMENTS;
        if (per_buffer < 1)
            per_buffer = 1;
        int segment = (int)o->size;
        if (setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &segment, sizeof segment) != 0)
            die("setsockopt UDP_SEGMENT: %s (UDP GSO unavailable on this kernel?)",
                strerror(errno));
    }
    size_t n = (size_t)o->batch;
    size_t bufsize = (size_t)(per_buffer * o->size);
    unsigned char *payload = checked_calloc(1, bufsize);
    for (size_t i = 0; i < bufsize; i++)
        payload[i] = (unsigned char)(i * 131u + 7u);
    struct iovec *iov = checked_calloc(n, sizeof *iov);
    struct mmsghdr *msgs = checked_calloc(n, sizeof *msgs);
    struct report r = {0};
    double user0, sys0;
    cpu_now(&user0, &sys0);
    double start = now_s(), t = start;
    for (;;) {
        if (o->count > 0 && r.datagrams >= o->count)
            break;
        if (o->duration > 0.0 && t - start >= o->duration)
            break;
        /* one batch: n messages of per_buffer datagrams, fewer at the --count limit */
        long long left = o->count > 0 ? o->count - r.datagrams : (long long)n * per_buffer;
        size_t k = 0;
        for (; k < n && left > 0; k++) {
            long long d = left < per_buffer ? left : per_buffer;
            iov[k].iov_base = payload;
            iov[k].iov_len = (size_t)(d * o->size);
            memset(&msgs[k], 0, sizeof msgs[k]);
            msgs[k].msg_hdr.msg_iov = &iov[k];
            msgs[k].msg_hdr.msg_iovlen = 1;
            left -= d;
        }
        size_t done = 0;
        while (done < k) {
            int sent = sendmmsg(fd, msgs + done, (unsigned)(k - done), 0);
            r.calls++;
            if (sent < 0) {
                if (errno == EINTR)
                    continue;
                die_errno("sendmmsg");
            }
            if (sent == 0 || (size_t)sent > k - done)
                die("sendmmsg sent %d of %zu messages", sent, k - done);
            if ((size_t)sent < k - done)
                check_socket_error(fd); /* a blocking sendmmsg stops short on an error */
            for (int i = 0; i < sent; i++) {
                size_t len = msgs[done + (size_t)i].msg_len;
                size_t want = iov[done + (size_t)i].iov_len;
                if (len != want)
                    die("sendmmsg sent %zu of a message's %zu bytes", len, want);
                r.datagrams += (long long)(want / (size_t)o->size);
                r.bytes += (long long)want;
            }
            done += (size_t)sent;
        }
        t = now_s();
    }
    double user1, sys1;
    cpu_now(&user1, &sys1);
    r.wall_s = t - start;
    r.user_s = user1 - user0;
    r.sys_s = sys1 - sys0;
    check_socket_error(fd);
    print_report("send", o, &r, -1);
    if (close(fd) != 0)
        die_errno("close");
    free(payload);
    free(iov);
    free(msgs);
}

/* ---- both: two forked processes ------------------------------------------------------ */

static int wait_child(pid_t pid, const char *name) {
    int status;
    for (;;) {
        if (waitpid(pid, &status, 0) == pid)
            break;
        if (errno != EINTR)
            die_errno("waitpid");
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFEXITED(status))
        fprintf(stderr, "udp_floor: the %s exited with status %d\n", name, WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        fprintf(stderr, "udp_floor: the %s was killed by signal %d\n", name, WTERMSIG(status));
    return 1;
}

static int run_both(struct options o) {
    int ready[2];
    if (pipe(ready) != 0)
        die_errno("pipe");
    if (fflush(stdout) != 0)
        die_errno("fflush");
    pid_t receiver = fork();
    if (receiver < 0)
        die_errno("fork");
    if (receiver == 0) {
        if (close(ready[0]) != 0)
            die_errno("close");
        install_stop_handler();
        long port = 0;
        long long rcvbuf_bytes;
        int fd = open_receiver(&o, &port, &rcvbuf_bytes);
        uint16_t p = (uint16_t)port;
        if (write(ready[1], &p, sizeof p) != (ssize_t)sizeof p)
            die_errno("write to the parent");
        if (close(ready[1]) != 0)
            die_errno("close");
        o.idle = 0.0; /* the parent says when */
        run_receiver(&o, fd, rcvbuf_bytes);
        exit(0);
    }
    if (close(ready[1]) != 0)
        die_errno("close");
    uint16_t p;
    ssize_t got = read(ready[0], &p, sizeof p);
    if (got != (ssize_t)sizeof p) {
        if (got < 0)
            die_errno("read from the receiver");
        wait_child(receiver, "receiver");
        die("the receiver did not start");
    }
    if (close(ready[0]) != 0)
        die_errno("close");
    o.port = p;
    pid_t sender = fork();
    if (sender < 0) {
        int e = errno;
        kill(receiver, SIGKILL);
        errno = e;
        die_errno("fork");
    }
    if (sender == 0) {
        run_sender(&o);
        exit(0);
    }
    int failed = wait_child(sender, "sender");
    if (kill(receiver, SIGUSR1) != 0)
        die_errno("kill (signalling the receiver)");
    failed |= wait_child(receiver, "receiver");
    return failed;
}

int main(int argc, char **argv) {
    struct options o = parse_options(argc, argv);
    if (strcmp(o.role, "both") == 0)
        return run_both(o);
    if (strcmp(o.role, "send") == 0) {
        run_sender(&o);
        return 0;
    }
    install_stop_handler();
    long port = o.port;
    long long rcvbuf_bytes;
    int fd = open_receiver(&o, &port, &rcvbuf_bytes);
    fprintf(stderr, "udp_floor: receiving on 127.0.0.1:%ld\n", port);
    run_receiver(&o, fd, rcvbuf_bytes);
    return 0;
}
