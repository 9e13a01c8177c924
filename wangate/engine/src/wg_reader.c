/* Received UDP datagrams in batches (wg_reader.h). */
#include "wg_reader.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <string.h>

#ifndef UDP_GRO
#define UDP_GRO 104 /* Linux 5.0 */
#endif

int wg_reader_init(wg_reader *r) {
    memset(r, 0, sizeof(*r));
    r->mem = malloc((size_t)WG_READ_BATCH * WG_READ_BUFFER_BYTES);
    return r->mem == NULL ? -1 : 0;
}

void wg_reader_free(wg_reader *r) {
    free(r->mem);
    r->mem = NULL;
}

int wg_reader_set_gro(wg_reader *r, int fd, int on) {
    if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof(on)) < 0) return -1;
    r->gro = on;
    return 0;
}

int wg_reader_read(wg_reader *r, int fd) {
    for (int i = 0; i < WG_READ_BATCH; i++) {
        r->iov[i].iov_base = wg_reader_data(r, i);
        r->iov[i].iov_len = WG_READ_BUFFER_BYTES;
        struct msghdr *hdr = &r->msgs[i].msg_hdr;
        memset(hdr, 0, sizeof(*hdr));
        hdr->msg_iov = &r->iov[i];
        hdr->msg_iovlen = 1;
        hdr->msg_name = &r->addr[i];
        hdr->msg_namelen = sizeof(r->addr[i]);
        if (r->gro) {
            hdr->msg_control = r->control[i].buf;
            hdr->msg_controllen = sizeof(r->control[i].buf);
        }
        r->msgs[i].msg_len = 0;
    }
    int n;
    do {
        n = recvmmsg(fd, r->msgs, WG_READ_BATCH, MSG_DONTWAIT, NULL);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return n;
}

size_t wg_reader_segment_bytes(const wg_reader *r, int i) {
    size_t len = r->msgs[i].msg_len;
    if (!r->gro) return len;
    struct msghdr *hdr = (struct msghdr *)&r->msgs[i].msg_hdr;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(hdr); c != NULL; c = CMSG_NXTHDR(hdr, c)) {
        if (c->cmsg_level != IPPROTO_UDP || c->cmsg_type != UDP_GRO ||
            c->cmsg_len < CMSG_LEN(sizeof(int)))
            continue;
        int size;
        memcpy(&size, CMSG_DATA(c), sizeof(size));
        if (size > 0 && (size_t)size < len) return (size_t)size;
    }
    return len;
}
