/* Received UDP datagrams in batches: one recvmmsg(2) for up to WG_READ_BATCH, into
 * buffers allocated once, each as large as a UDP payload can be (so nothing is ever
 * truncated; the pages a small datagram does not touch stay unbacked).
 *
 * With UDP GRO on (wg_reader_set_gro), the kernel may hand over several datagrams of
 * one sender as one buffer: equal segments, the last possibly shorter, the segment size
 * in a control message.  wg_reader_segment_bytes says how to cut buffer i. */
#ifndef WG_READER_H
#define WG_READER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define WG_READ_BATCH 64
#define WG_READ_BUFFER_BYTES 65536

typedef union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
} wg_reader_control;

typedef struct wg_reader {
    uint8_t *mem; /* WG_READ_BATCH buffers of WG_READ_BUFFER_BYTES */
    int gro;      /* the socket coalesces: read each buffer's segment size */
    struct mmsghdr msgs[WG_READ_BATCH];
    struct iovec iov[WG_READ_BATCH];
    struct sockaddr_storage addr[WG_READ_BATCH];
    wg_reader_control control[WG_READ_BATCH];
} wg_reader;

/* 0, or -1 out of memory */
int wg_reader_init(wg_reader *r);
void wg_reader_free(wg_reader *r);

/* Ask the kernel to coalesce what `fd` receives (UDP_GRO, Linux 5.0), or to stop: 0,
 * or -1 with errno set where it cannot (the reader then reads plain datagrams). */
int wg_reader_set_gro(wg_reader *r, int fd, int on);

/* Read what `fd` holds, up to WG_READ_BATCH buffers, never blocking: how many were
 * read (0: none waiting), or -1 with errno set (an ICMP error reported on the socket,
 * say).  Buffer i is r->msgs[i].msg_len bytes at wg_reader_data(r, i), from
 * r->addr[i]. */
int wg_reader_read(wg_reader *r, int fd);

/* The size of the datagrams buffer i holds one after another (the last may be
 * shorter): its whole length unless the kernel coalesced it. */
size_t wg_reader_segment_bytes(const wg_reader *r, int i);

static inline uint8_t *wg_reader_data(wg_reader *r, int i) {
    return r->mem + (size_t)i * WG_READ_BUFFER_BYTES;
}

#endif
