/* Received UDP datagrams in batches (wg_reader.h). */
#include "wg_reader.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int wg_reader_init(wg_reader *r) {
    memset(r, 0, sizeof(*r));
    r->mem = malloc((size_t)WG_READ_BATCH * WG_READ_BUFFER_BYTES);
    return r->mem == NULL ? -1 : 0;
}

void wg_reader_free(wg_reader *r) {
    free(r->mem);
    r->mem = NULL;
}

int wg_reader_read(wg_reader *r, int fd) {
    for (int i = 0; i < WG_READ_BATCH; i++) {
        r->iov[i].iov_base = wg_reader_data(r, i);
        r->iov[i].iov_len = WG_READ_BUFFER_BYTES;
        memset(&r->msgs[i].msg_hdr, 0, sizeof(r->msgs[i].msg_hdr));
        r->msgs[i].msg_hdr.msg_iov = &r->iov[i];
        r->msgs[i].msg_hdr.msg_iovlen = 1;
        r->msgs[i].msg_hdr.msg_name = &r->addr[i];
        r->msgs[i].msg_hdr.msg_namelen = sizeof(r->addr[i]);
        r->msgs[i].msg_len = 0;
    }
    int n;
    do {
        n = recvmmsg(fd, r->msgs, WG_READ_BATCH, MSG_DONTWAIT, NULL);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return n;
}
